"""The node-agent's GPU gauges on /metrics: what the GPU health dashboard (deploy/grafana) reads, exported by a
heartbeat of a simulated node, with values a GPU could have."""
from __future__ import annotations

import contextlib
import dataclasses
import uuid

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.node_agent import handlers
from services.node_agent.adapters.discovery import discover_sim
from services.node_agent.adapters.health import SimHealthProbe
from services.node_agent.handlers.health import export_metrics, gpu_metrics
from tests.support.node_agent import sim_node

# each gauge and the range the sim's model keeps it in (an idle GPU at the bottom, a busy one at the top)
PLAUSIBLE = {
    "DCGM_FI_DEV_GPU_TEMP": (35, 70),                # °C
    "DCGM_FI_DEV_POWER_USAGE": (70, 700),            # W
    "DCGM_FI_DEV_SM_CLOCK": (345, 1980),             # MHz
    "DCGM_FI_DEV_GPU_UTIL": (0, 100),                # %
    "DCGM_FI_DEV_FB_USED": (0, 80 * 1024),           # MiB of an 80 GB H100
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (0, 1),       # ratio
}


class _Pool:
    """A pool whose connections are nobody's (the fake records ignore them)."""

    @contextlib.asynccontextmanager
    async def acquire(self):
        yield None


def _exported(node_id: uuid.UUID) -> dict[str, dict[str, float]]:
    """name -> {gpu: value} of this node's samples, read back from the text /metrics serves."""
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(generate_latest().decode()):
        for s in family.samples:
            if s.labels.get("node") == str(node_id):
                out.setdefault(s.name, {})[s.labels["gpu"]] = s.value
    return out


async def test_a_simulated_nodes_heartbeat_exports_every_gpu_gauge_of_the_dashboard_with_plausible_values(tmp_path):
    probe = SimHealthProbe.from_topology(discover_sim("node-gpu-metrics"), seed=7)
    node = dataclasses.replace(sim_node(tmp_path), probe=probe)
    for seq in range(20):   # let the model drift away from idle
        await handlers.heartbeat(node, _Pool(), seq)
    exported = _exported(node.id)
    for name, (low, high) in PLAUSIBLE.items():
        assert set(exported.get(name, {})) == {str(i) for i in range(8)}, name
        assert all(low <= v <= high for v in exported[name].values()), (name, exported[name])
    assert any(v > 345 for v in exported["DCGM_FI_DEV_SM_CLOCK"].values())   # not stuck at idle


def test_a_reading_the_probe_cannot_take_is_left_out_and_a_freed_gpu_leaves_every_gauge():
    node_id = uuid.uuid4()
    samples = SimHealthProbe.from_topology(discover_sim("node-nvml-like"), seed=1).sample()[:2]
    nvml_like = [dataclasses.replace(samples[0], tensor_active=None), samples[1]]
    export_metrics(node_id, gpu_metrics(nvml_like, {}), nvml_like)
    exported = _exported(node_id)
    assert set(exported["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]) == {"1"}
    assert set(exported["DCGM_FI_DEV_SM_CLOCK"]) == {"0", "1"}
    export_metrics(node_id, gpu_metrics(samples[:1], {}), samples[:1])
    assert all(set(gpus) == {"0"} for gpus in _exported(node_id).values())
