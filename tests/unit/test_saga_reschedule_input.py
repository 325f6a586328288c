"""What start_reschedule gives the reschedule saga: a bare-metal placement (its instance made by the redfish
driver) is marked ``bare_metal``, so the move powers the old server off first; any other placement is not."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from services.allocation.contracts import AllocationInterrupted
from services.saga.domain.model import Policy, Saga, StepRecord
from services.saga.handlers import sagas

NODE = uuid.uuid4()


def _placed(driver: str) -> Saga:
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    saga = Saga(uuid.uuid4(), "allocate", alloc, tenant,
                {"allocation_id": str(alloc), "tenant_id": str(tenant), "shape": "bm.8gpu", "gpu_count": 8,
                 "volume_gb": 0, "labels": {}, "node_id": None}, status="completed")
    saga.steps[("reserve_slots", "invoke")] = StepRecord("succeeded", 1, result={"node_id": str(NODE), "slots": [0]})
    saga.steps[("provision_node", "invoke")] = StepRecord("succeeded", 1, result={"instance": {"driver": driver}})
    return saga


async def _started_input(monkeypatch, placed: Saga) -> dict:
    started: list[Saga] = []

    async def placed_saga(_conn, _allocation_id):
        return placed

    async def start(_ctx, saga, _policy):
        started.append(saga)
        return True
    monkeypatch.setattr(sagas.repository, "placed", placed_saga)
    monkeypatch.setattr(sagas, "_start", start)
    evt = AllocationInterrupted(allocation_id=placed.allocation_id, tenant_id=placed.tenant_id,
                                at=datetime.now(UTC), node_id=NODE, category="node_lost", reason="lost",
                                interrupted_at=datetime.now(UTC), next="moved", attempt=1, user_id=uuid.uuid4(),
                                shape="bm.8gpu", gpu_count=8, volume_gb=0)

    class Ctx:
        conn = None
    await sagas.start_reschedule(Ctx(), evt, policy=Policy())
    [saga] = started
    return saga.input


@pytest.mark.parametrize(("driver", "bare_metal"), [("redfish", True), ("sim", None), ("libvirt", None)])
async def test_only_a_placement_the_redfish_driver_made_is_moved_as_bare_metal(monkeypatch, driver, bare_metal):
    saga_input = await _started_input(monkeypatch, _placed(driver))
    assert saga_input.get("bare_metal") is bare_metal
    assert saga_input["from_node_id"] == str(NODE)
