"""The node's health without I/O: the sim probe's faults and the alerts they mean, the alert book's start times,
the heartbeat composed over in-memory records and the sim driver, injected faults on the agent itself, fencing,
and the NVML probe over a fake NVML."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from services.node_agent import contracts as c
from services.node_agent import handlers
from services.node_agent.adapters.discovery import discover_sim
from services.node_agent.adapters.health import FaultError, NvmlProbe, SimHealthProbe, build_probe
from services.node_agent.domain.health import AlertBook, Finding, Limits, findings
from services.node_agent.entrypoints.loops import watch_xid_events
from services.node_agent.handlers.health import DCGM, apply_fault
from services.scheduler.contracts import SlotDetail
from shared.refusals import PermanentError
from shared.wire import step_key
from tests.support.fakes import FakeUnitOfWork
from tests.support.node_agent import FakeNodeRecords, sim_node

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def probe() -> SimHealthProbe:
    return SimHealthProbe.from_topology(discover_sim("node-1"), seed=1)


DEFAULT_LIMITS = Limits()


def conditions(p: SimHealthProbe, limits: Limits = DEFAULT_LIMITS) -> set[tuple[str, str]]:
    return {(f.target, f.condition) for s in p.sample() for f in findings(s, limits)}


# --- the sim probe -----------------------------------------------------------------------------------------------
def test_the_sim_models_the_topologys_gpus_healthy_and_within_their_ranges():
    p = probe()
    for _ in range(50):
        samples = p.sample()
    assert [s.gpu for s in samples] == list(range(8)) and samples[3].pci == discover_sim("node-1")["gpus"][3]["pci"]
    assert all(35 <= s.temp_c <= 70 and 0 <= s.util_pct <= 100 and s.power_w > 0 for s in samples)
    assert conditions(p) == set()


def test_an_injected_xid_raises_its_alert_on_its_gpu_until_cleared():
    p = probe()
    p.inject("xid", gpu=3, code=79, now=T0)
    [s] = [s for s in p.sample() if s.gpu == 3]
    assert s.xid == 79
    [found] = findings(s, Limits())
    assert (found.target, found.condition, found.since) == ("gpu:3", "xid:79", T0)
    p.inject("clear")
    assert conditions(p) == set() and all(s.xid == 0 for s in p.sample())


def test_each_gpu_fault_means_its_condition():
    p = probe()
    p.inject("ecc_dbe", gpu=0)
    p.inject("retired_pages", gpu=1)
    p.inject("nvlink", gpu=2)
    p.inject("temperature", gpu=4, value=95)
    p.inject("power", gpu=5, value=750)
    assert conditions(p) == {("gpu:0", "ecc_dbe"), ("gpu:1", "retired_pages_pending"), ("gpu:2", "nvlink"),
                             ("gpu:4", "temperature"), ("gpu:5", "power")}
    assert conditions(p, Limits(temperature_c=99, power_w=800)) == {
        ("gpu:0", "ecc_dbe"), ("gpu:1", "retired_pages_pending"), ("gpu:2", "nvlink")}


def test_a_fault_the_model_cannot_apply_is_refused():
    p = probe()
    for kind, kw, match in [("xid", {}, "needs its code"), ("xid", {"gpu": 8, "code": 79}, "no GPU 8"),
                            ("temperature", {}, "needs its value"), ("slow_agent", {}, "not a GPU fault")]:
        with pytest.raises(FaultError, match=match):
            p.inject(kind, **kw)


def test_the_alert_book_keeps_a_findings_start_and_forgets_what_cleared():
    book, hot = AlertBook(), Finding("gpu:0", "temperature", "hot", "hot")
    assert [since for _, since in book.current([hot], T0)] == [T0]
    assert [since for _, since in book.current([hot], T0 + timedelta(seconds=4))] == [T0]
    assert book.current([], T0 + timedelta(seconds=6)) == []
    assert [since for _, since in book.current([hot], T0 + timedelta(seconds=8))] == [T0 + timedelta(seconds=8)]


def test_auto_simulates_only_where_the_drivers_devices_are_simulated():
    topology = lambda: discover_sim("n")   # noqa: E731
    assert isinstance(build_probe("auto", devices_simulated=True, topology=topology), SimHealthProbe)
    assert build_probe("auto", devices_simulated=False, topology=topology) is None
    assert build_probe("none", devices_simulated=True, topology=topology) is None


# --- the heartbeat -----------------------------------------------------------------------------------------------
class OnePool:
    """A pool whose every connection is nobody's (the fake records ignore it)."""

    @contextlib.asynccontextmanager
    async def acquire(self):
        yield None


def provision_cmd(node, slots, slot_details=()) -> c.ProvisionNode:
    saga = uuid.uuid4()
    return c.ProvisionNode(saga_id=saga, step="provision", idempotency_key=step_key(saga, "provision"),
                           allocation_id=uuid.uuid4(), tenant_id=uuid.uuid4(), node_id=node.id, slots=list(slots),
                           slot_details=list(slot_details))


def health_node(tmp_path, records=None):
    return dataclasses.replace(sim_node(tmp_path, records=records), probe=probe())


async def test_a_heartbeat_carries_the_nodes_instances_alerts_and_gpus_labelled_with_their_allocation(tmp_path):
    records = FakeNodeRecords()
    node = health_node(tmp_path, records)
    by_slot = provision_cmd(node, (0, 1))
    topology = discover_sim("node-1")   # slot 2 holds GPU 5 (its devices, in the slot's details)
    gpu, nvme, vf = (topology[kind][5] for kind in ("gpus", "nvmes", "ib_vfs"))
    by_pci = provision_cmd(node, (2,), [SlotDetail(index=2, gpu_pci=gpu["pci"], nvme_pci=nvme["pci"],
                                                    ib_vf_pci=vf["pci"], ib_guid=vf["guid"], numa=1, nvlink_domain=0)])
    for cmd in (by_slot, by_pci):
        await handlers.provision_step(records, cmd, node=node)
    node.probe.inject("xid", gpu=1, code=48, now=T0)
    beat = await handlers.heartbeat(node, OnePool(), 7)
    assert (beat.node_id, beat.seq, beat.started_at) == (node.id, 7, node.started_at)
    assert set(beat.instances) == {by_slot.allocation_id, by_pci.allocation_id}
    holders = {m.gpu: m.allocation_id for m in beat.gpus}
    assert holders[0] == holders[1] == by_slot.allocation_id and holders[5] == by_pci.allocation_id
    assert holders[3] is None
    [alert] = beat.alerts
    assert (alert.source, alert.target, alert.condition, alert.since) == ("sim", "gpu:1", "xid:48", T0)
    assert alert.classifications == []
    labels = (str(node.id), "1", str(by_slot.allocation_id))
    assert DCGM["xid_errors"].labels(*labels)._value.get() == 48


async def test_a_freed_gpus_allocation_label_leaves_the_metrics(tmp_path):
    records = FakeNodeRecords()
    node = health_node(tmp_path, records)
    cmd = provision_cmd(node, (0,))
    await handlers.provision_step(records, cmd, node=node)
    await handlers.heartbeat(node, OnePool(), 0)
    await handlers.deprovision_step(records, c.DeprovisionNode(
        saga_id=cmd.saga_id, step="provision", idempotency_key="k", allocation_id=cmd.allocation_id,
        tenant_id=cmd.tenant_id, node_id=node.id), node=node)
    beat = await handlers.heartbeat(node, OnePool(), 1)
    assert beat.instances == [] and beat.gpus[0].allocation_id is None
    samples = {tuple(s.labels.values()) for m in DCGM["temp_c"].collect() for s in m.samples}
    assert (str(node.id), "0", str(cmd.allocation_id)) not in samples and (str(node.id), "0", "") in samples


# --- faults on the agent -----------------------------------------------------------------------------------------
def fault(node, kind: str, **kw) -> c.InjectFault:
    return c.InjectFault(node_id=node.id, kind=kind, request_id=uuid.uuid4(), **kw)


async def test_a_node_whose_probe_is_not_simulated_refuses_every_fault(tmp_path):
    node = sim_node(tmp_path)   # no probe
    uow = FakeUnitOfWork("node_agent", "node_agent.inject_fault", cmd := fault(node, "xid", code=79))
    await handlers.inject_fault(uow, cmd, node=node)
    answer = uow.only("node_agent.fault_injected").data
    assert answer["accepted"] is False and "not simulated" in answer["reason"]
    with pytest.raises(PermanentError, match="arrived at node"):
        await handlers.inject_fault(uow, fault(sim_node(tmp_path), "clear"), node=node)


async def test_heartbeat_loss_silences_the_agent_for_its_duration_or_until_cleared(tmp_path):
    node = health_node(tmp_path)
    assert apply_fault(node, fault(node, "heartbeat_loss", duration_s=10), T0) == ""
    assert node.faults.silent(T0 + timedelta(seconds=9)) and not node.faults.silent(T0 + timedelta(seconds=10))
    apply_fault(node, fault(node, "heartbeat_loss"), T0)
    assert node.faults.silent(T0 + timedelta(days=2))
    apply_fault(node, fault(node, "clear"), T0)
    assert not node.faults.silent(T0)


async def test_a_slow_agent_reports_itself_and_node_down_loses_every_sim_instance(tmp_path):
    records = FakeNodeRecords()
    node = health_node(tmp_path, records)
    await handlers.provision_step(records, provision_cmd(node, (0,)), node=node)
    assert apply_fault(node, fault(node, "slow_agent", value=0.01), T0) == ""
    beat = await handlers.heartbeat(node, OnePool(), 0)
    assert [(a.source, a.target, a.condition, a.since) for a in beat.alerts] == [("agent", "node", "agent_slow", T0)]
    assert "value" in apply_fault(node, fault(node, "slow_agent"), T0)
    assert apply_fault(node, fault(node, "node_down"), T0) == ""
    assert await node.driver.list_instances() == [] and node.faults.silent(T0 + timedelta(days=1))
    apply_fault(node, fault(node, "clear"), T0)
    assert not node.faults.silent(T0) and node.faults.slow_s == 0


# --- fencing -----------------------------------------------------------------------------------------------------
async def test_fencing_destroys_the_instances_and_forgets_them_and_is_idempotent(tmp_path):
    records = FakeNodeRecords()
    node = health_node(tmp_path, records)
    cmd = provision_cmd(node, (0,))
    await handlers.provision_step(records, cmd, node=node)
    never_here = uuid.uuid4()
    fence = c.FenceInstances(node_id=node.id, allocation_ids=[cmd.allocation_id, never_here], reason="moved")
    for _ in range(2):
        uow = FakeUnitOfWork("node_agent", "node_agent.fence_instances", fence)
        await handlers.fence_instances(uow, fence, node=node)
        fenced = uow.only("node_agent.instances_fenced").data
        assert fenced["allocation_ids"] == [str(cmd.allocation_id), str(never_here)]
    assert await node.driver.list_instances() == [] and records.kept == {}
    assert records.locks[:2] == [cmd.allocation_id, never_here]


# --- NVML --------------------------------------------------------------------------------------------------------
def test_nvidia_ml_py_is_not_imported_with_the_node_agent():
    code = ("import sys, services.node_agent.bootstrap, services.node_agent.adapters.health; "
            "assert 'pynvml' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


class FakeNvml(SimpleNamespace):
    """Two GPUs: the second supports no ECC nor row remapping; an XID 79 waits for the first."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):   # noqa: N801 -- pynvml's name
        pass

    class NVMLError_Timeout(NVMLError):   # noqa: N801
        pass

    NVML_TEMPERATURE_GPU, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, NVML_CLOCK_SM = 0, 1, 0, 1
    nvmlEventTypeXidCriticalError = 8

    def __init__(self):
        super().__init__(pending=[SimpleNamespace(eventType=8, eventData=79, device="h0")], shut=False)

    def nvmlInit(self): pass                                   # noqa: E704
    def nvmlShutdown(self): self.shut = True                   # noqa: E704
    def nvmlDeviceGetCount(self): return 2                     # noqa: E704
    def nvmlDeviceGetHandleByIndex(self, i): return f"h{i}"    # noqa: E704
    def nvmlDeviceGetUUID(self, h): return f"GPU-{h}"          # noqa: E704
    def nvmlEventSetCreate(self): return "events"              # noqa: E704
    def nvmlEventSetFree(self, es): pass                       # noqa: E704
    def nvmlDeviceRegisterEvents(self, h, kind, es): pass      # noqa: E704
    def nvmlDeviceGetUtilizationRates(self, h): return SimpleNamespace(gpu=42, memory=10)          # noqa: E704
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(used=2 * 2**30, total=80 * 2**30)  # noqa: E704
    def nvmlDeviceGetPowerUsage(self, h): return 250_000       # noqa: E704
    def nvmlDeviceGetTemperature(self, h, sensor): return 61   # noqa: E704
    def nvmlDeviceGetClockInfo(self, h, clock): return 1980    # noqa: E704
    def nvmlDeviceGetPciInfo(self, h): return SimpleNamespace(busId=f"00000000:1{h[1]}:00.0".upper())  # noqa: E704

    def _ecc_less(self, h, value):
        if h == "h1":
            raise self.NVMLError_NotSupported()
        return value

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter): return self._ecc_less(h, 2)               # noqa: E704
    def nvmlDeviceGetRetiredPagesPendingStatus(self, h): return self._ecc_less(h, 0)                  # noqa: E704
    def nvmlDeviceGetRemappedRows(self, h): return self._ecc_less(h, (0, 1, 1, 0))                    # noqa: E704

    def nvmlEventSetWait(self, es, timeout_ms):
        if not self.pending:
            raise self.NVMLError_Timeout()
        return self.pending.pop()


def test_the_nvml_probe_reads_each_gpu_skipping_what_it_does_not_support_and_keeps_the_last_xid():
    nvml = FakeNvml()
    p = NvmlProbe(nvml)
    [event] = p.events(100)
    assert (event.gpu, event.code) == (0, 79) and p.events(0) == []
    first, second = p.sample()
    assert (first.util_pct, first.fb_used_mib, first.temp_c, first.power_w) == (42, 2048, 61, 250)
    assert (first.sm_clock_mhz, first.tensor_active) == (1980, None)   # NVML has no tensor-pipe counter
    assert (first.xid, first.ecc_dbe, first.remapped_pending, first.pci) == (79, 2, True, "0000:10:00.0")
    assert (second.xid, second.ecc_dbe, second.retired_pending, second.remapped_pending) == (0, 0, False, False)
    assert {f.condition for f in findings(first, Limits())} == {"xid:79", "ecc_dbe", "remapped_rows_pending"}
    p.close()
    p.close()
    assert nvml.shut


async def test_the_agent_waits_for_nvmls_xid_events_and_the_samples_then_carry_the_last():
    p = NvmlProbe(FakeNvml())
    watching = asyncio.create_task(watch_xid_events(uuid.uuid4(), p, wait_ms=10))
    try:
        async with asyncio.timeout(5):
            while p.sample()[0].xid != 79:
                await asyncio.sleep(0.01)
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
