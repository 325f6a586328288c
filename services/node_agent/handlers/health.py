"""The node's health: the heartbeat it sends every few seconds (its alerts, its instances, its GPUs' metrics), the
faults a provider injects into a simulated node, and the fencing of instances whose allocation moved elsewhere.

The heartbeat is composed here and published live by the loop (``entrypoints.loops``); the GPUs' metrics are also
exported on /metrics under DCGM's names, labelled node, gpu and allocation. Each GPU is labelled with the
allocation whose slot holds it: by its PCI address in the slot's details when the provision command carried
them, otherwise by slot number = GPU index (how the proposed slot map numbers them).
"""
from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import structlog
from prometheus_client import Gauge

from shared.refusals import PermanentError
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.drivers import SimDriver
from ..adapters.health import FaultError, SimHealthProbe
from ..domain.health import GpuSample, findings
from ..domain.model import KeptInstance
from .node import Node
from .provisioning import refresh_gauge, remove_allocation

log = structlog.get_logger()

LABELS = ["node", "gpu", "allocation"]
# DCGM's field names, so dashboards made for dcgm-exporter read the agent as they read DCGM
DCGM = {
    "util_pct": Gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilisation (%)", LABELS),
    "fb_used_mib": Gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (MiB)", LABELS),
    "temp_c": Gauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (°C)", LABELS),
    "power_w": Gauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (W)", LABELS),
    "xid_errors": Gauge("DCGM_FI_DEV_XID_ERRORS", "The last XID error seen (0: none)", LABELS),
    "ecc_dbe": Gauge("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Volatile double-bit ECC errors", LABELS),
    "retired_pending": Gauge("DCGM_FI_DEV_RETIRED_PENDING", "Pages pending retirement (1: yes)", LABELS),
}
# what only /metrics shows (the heartbeat does not carry it): the rest of DCGM's dashboard, read from the sample
SAMPLED = {
    "sm_clock_mhz": Gauge("DCGM_FI_DEV_SM_CLOCK", "SM clock (MHz)", LABELS),
    "tensor_active": Gauge("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Share of cycles the tensor pipes were active (0..1)",
                           LABELS),
}
_exported: dict[uuid.UUID, set[tuple[str, str, str]]] = {}   # per node: the label sets its gauges hold


def _holders(kept: dict[uuid.UUID, KeptInstance]) -> tuple[dict[str, uuid.UUID], dict[int, uuid.UUID]]:
    """(GPU PCI address -> allocation, slot -> allocation) from the node's instance records."""
    by_pci, by_slot = {}, {}
    for allocation_id, instance in kept.items():
        by_slot.update(dict.fromkeys(instance.slots, allocation_id))
        if instance.command is not None:
            for detail in c.ProvisionNode.model_validate_json(instance.command).slot_details:
                by_pci[detail.gpu_pci.lower()] = allocation_id
    return by_pci, by_slot


def gpu_metrics(samples: list[GpuSample], kept: dict[uuid.UUID, KeptInstance]) -> list[c.GpuMetrics]:
    """Each GPU's metrics, labelled with the allocation holding its slot (None: free)."""
    by_pci, by_slot = _holders(kept)
    return [c.GpuMetrics(gpu=s.gpu, uuid=s.uuid, allocation_id=by_pci.get(s.pci.lower()) or by_slot.get(s.gpu),
                         util_pct=s.util_pct, fb_used_mib=s.fb_used_mib, temp_c=s.temp_c, power_w=s.power_w,
                         xid_errors=s.xid, ecc_dbe=s.ecc_dbe, retired_pending=s.retired_pending) for s in samples]


def export_metrics(node_id: uuid.UUID, metrics: list[c.GpuMetrics], samples: list[GpuSample] = ()) -> None:
    """Set the DCGM gauges from ``metrics`` and, for the fields only a sample has, from ``samples`` (the same GPUs;
    a reading the probe cannot take, None, is left out); a label set this node no longer has (a GPU freed) is
    removed."""
    now, sampled = set(), {s.gpu: s for s in samples}
    for m in metrics:
        labels = (str(node_id), str(m.gpu), str(m.allocation_id or ""))
        now.add(labels)
        for name, gauge in DCGM.items():
            gauge.labels(*labels).set(float(getattr(m, name)))
        for name, gauge in SAMPLED.items():
            value = getattr(sampled[m.gpu], name) if m.gpu in sampled else None
            if value is not None:
                gauge.labels(*labels).set(float(value))
    for gone in _exported.get(node_id, set()) - now:
        for gauge in (*DCGM.values(), *SAMPLED.values()):
            gauge.remove(*gone)
    _exported[node_id] = now


async def heartbeat(node: Node, pool: asyncpg.Pool, seq: int) -> c.Heartbeat:
    """The node's heartbeat now: its current alerts, the instances it holds (its records and its driver's), and
    its GPUs' metrics (exported on /metrics as well)."""
    samples = await asyncio.to_thread(node.probe.sample) if node.probe is not None else []
    async with pool.acquire() as conn:
        kept = await node.records(conn).instances()
    running = {i.allocation_id for i in await node.driver.list_instances()}
    now = datetime.now(UTC)
    found = [f for s in samples for f in findings(s, node.limits)]
    source = node.probe.source if node.probe is not None else "agent"
    alerts = [c.Alert(source=source if f.target != "node" else "agent", target=f.target, condition=f.condition,
                      since=since, message=f.message, tenant_message=f.tenant_message)
              for f, since in node.alerts.current(found + node.faults.findings(), now)]
    metrics = gpu_metrics(samples, kept)
    export_metrics(node.id, metrics, samples)
    return c.Heartbeat(node_id=node.id, seq=seq, sent_at=now, started_at=node.started_at, alerts=alerts,
                       instances=sorted(set(kept) | running, key=str), gpus=metrics)


def _addressed_here(node: Node, node_id: uuid.UUID, what: str) -> None:
    if node_id != node.id:
        raise PermanentError(f"{what} for node {node_id} arrived at node {node.id}")


def apply_fault(node: Node, cmd: c.InjectFault, now: datetime) -> str:
    """Apply ``cmd`` to the node; the reason it is refused ("" when accepted)."""
    probe = node.probe
    if not isinstance(probe, SimHealthProbe):
        return "this node's health probe is not simulated: faults are injected into simulated nodes only"
    faults = node.faults
    if cmd.kind == "heartbeat_loss":
        faults.silent_until = now + timedelta(seconds=cmd.duration_s) if cmd.duration_s else None
        faults.silent_until_cleared = cmd.duration_s is None
    elif cmd.kind == "slow_agent":
        if cmd.value is None or not 0 < cmd.value <= 600:
            return "slow_agent needs its delay in seconds (value, above 0 and at most 600)"
        faults.slow_since = faults.slow_since or now
        faults.slow_s = cmd.value
    elif cmd.kind == "node_down":
        if not isinstance(node.driver, SimDriver):
            return "node_down is simulated by the sim driver only"
        lost = node.driver.lose_everything()
        faults.node_down = True
        log.warning("node_agent.node_down_injected", node_id=str(node.id), lost=[str(a) for a in lost])
    else:
        try:
            probe.inject(cmd.kind, gpu=cmd.gpu, code=cmd.code, value=cmd.value, now=now)
        except FaultError as exc:
            return str(exc)
        if cmd.kind == "clear":
            faults.clear()
    return ""


async def inject_fault(ctx: UnitOfWork, cmd: c.InjectFault, *, node: Node) -> None:
    """Apply an injected fault, or refuse it (a node whose probe is not simulated refuses every one); answer
    node_agent.fault_injected either way."""
    _addressed_here(node, cmd.node_id, "an injected fault")
    await node.slowed()
    reason = apply_fault(node, cmd, datetime.now(UTC))
    log.info("node_agent.fault_injected", node_id=str(node.id), kind=cmd.kind, gpu=cmd.gpu, accepted=not reason,
             reason=reason or None)
    await ctx.emit("node_agent.fault_injected", c.FaultInjected(
        node_id=node.id, request_id=cmd.request_id, kind=cmd.kind, accepted=not reason, reason=reason),
        subject_params=node.subject_params, correlation_id=str(cmd.request_id))


async def fence_instances(ctx: UnitOfWork, cmd: c.FenceInstances, *, node: Node) -> None:
    """Destroy the allocations' instances here for good (they run elsewhere now): instance, network, records and
    kept command gone, so no reconcile makes them again. Idempotent; a driver error propagates (retried)."""
    _addressed_here(node, cmd.node_id, "a fence")
    await node.slowed()
    records = node.records(ctx.conn)
    for allocation_id in cmd.allocation_ids:
        await records.lock_allocation(allocation_id)
        gone = await remove_allocation(records, allocation_id, node=node)
        log.warning("node_agent.instance_fenced", node_id=str(node.id), allocation_id=str(allocation_id),
                    instance_id=gone, reason=cmd.reason)
    await ctx.emit("node_agent.instances_fenced", c.InstancesFenced(
        node_id=node.id, allocation_ids=cmd.allocation_ids, at=datetime.now(UTC)), subject_params=node.subject_params)
    ctx.on_commit(lambda: refresh_gauge(node))
