"""GPU health: the eight panels of NVIDIA's DCGM exporter dashboard (grafana.com 12239), with their titles, over the
gauges the node agents export under DCGM's names (from NVML on a real node, from the model of a simulated one),
and a row of the faults the health monitor acts on.

Variables: datasource, instance (the agent's scrape target), node (the node's id) and gpu (its index).
Differences from 12239: utilisation reads DCGM_FI_DEV_GPU_UTIL (percent, as NVML reports it) where 12239 reads
the profiling field DCGM_FI_PROF_GR_ENGINE_ACTIVE, which NVML cannot; tensor activity exists only where the probe
can read it (the sim models it; NVML cannot, so that panel stays empty on an NVML node).
"""
from __future__ import annotations

from .panels import dashboard, gauge, query_variable, row, table, timeseries

SEL = 'instance=~"$instance", node=~"$node", gpu=~"$gpu"'
LEGEND = "{{node}} GPU {{gpu}}"
# the eight titles of 12239, in its order (test_grafana checks they are all here)
DCGM_PANELS = ("GPU Temperature", "GPU Avg. Temp", "GPU Power Usage", "GPU Power Total", "GPU SM Clocks",
               "GPU Utilization", "Tensor Core Utilization", "GPU Framebuffer Mem Used")


def per_gpu(metric: str, scale: str = "") -> str:
    return f"max by (node, gpu) ({metric}{{{SEL}}}){scale}"


def gpu_health() -> dict:
    return dashboard("tessera-gpu-health", "Tessera / GPU health",
                     "Per-GPU telemetry as NVIDIA's DCGM exporter dashboard shows it (temperature, power, SM clock, "
                     "utilisation, tensor activity, framebuffer), from the node agents' /metrics.", [
        timeseries("GPU Temperature", [(per_gpu("DCGM_FI_DEV_GPU_TEMP"), LEGEND)], "celsius", w=18,
                   thresholds=[(None, "green"), (80, "red")]),
        gauge("GPU Avg. Temp", [(f"avg(DCGM_FI_DEV_GPU_TEMP{{{SEL}}})", "average")], "celsius", min_=0, max_=100,
              thresholds=[(None, "green"), (83, "#EAB839"), (87, "red")]),
        timeseries("GPU Power Usage", [(per_gpu("DCGM_FI_DEV_POWER_USAGE"), LEGEND)], "watt", w=18),
        gauge("GPU Power Total", [(f"sum({per_gpu('DCGM_FI_DEV_POWER_USAGE')})", "total")], "watt", min_=0,
              max_=5600, thresholds=[(None, "green"), (4200, "#EAB839"), (5100, "red")],
              description="Sum over the selected GPUs (8 × 700 W: one HGX H100 node at its limit)."),
        timeseries("GPU SM Clocks", [(per_gpu("DCGM_FI_DEV_SM_CLOCK", " * 1000000"), LEGEND)], "hertz", w=24),
        timeseries("GPU Utilization", [(per_gpu("DCGM_FI_DEV_GPU_UTIL", " / 100"), LEGEND)], "percentunit", w=24,
                   min_=0, max_=1),
        timeseries("Tensor Core Utilization", [(per_gpu("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), LEGEND)], "percentunit",
                   w=24, min_=0, max_=1, description="Share of cycles the tensor pipes were active."),
        timeseries("GPU Framebuffer Mem Used", [(per_gpu("DCGM_FI_DEV_FB_USED"), LEGEND)], "mbytes", w=24,
                   description="Framebuffer memory used, MiB."),
        row("Faults"),
        table("XID, ECC and retired pages", [
            (per_gpu("DCGM_FI_DEV_XID_ERRORS"), "last XID"),
            (per_gpu("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), "ECC DBE"),
            (per_gpu("DCGM_FI_DEV_RETIRED_PENDING"), "retired pending")], w=24,
              description="Per GPU: the last XID error (0: none), volatile double-bit ECC errors, pages pending "
                          "retirement (1: yes). Non-zero values raise the node's alerts."),
    ], [query_variable("instance", "label_values(DCGM_FI_DEV_GPU_TEMP, instance)"),
        query_variable("node", 'label_values(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance"}, node)'),
        query_variable("gpu", 'label_values(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", node=~"$node"}, gpu)')],
        refresh="10s")
