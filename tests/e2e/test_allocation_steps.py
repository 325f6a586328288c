"""GET /v1/allocations/{id}/steps through the gateway: the saga coordinator's timeline of an allocation."""
from __future__ import annotations

import pytest

from shared.participant import FAULT_LABEL
from tests.support.polling import eventually
from tooling.client import ApiError

ALLOCATE_STEPS = ["reserve_slots", "attach_network", "provision_volume", "provision_node", "bind_port", "activate"]
SKIPPED = {"bind_port"}   # a VM has no switch port to move: skipped (succeeded, attempt 0, 0 s)


async def steps_of(client, allocation_id: str) -> dict:
    return (await client.request("GET", f"/v1/allocations/{allocation_id}/steps"))[1]


async def settled(client, allocation_id: str) -> dict:
    """The timeline once its allocate saga has ended (ACTIVE comes at its last step, before the coordinator has
    read that step's reply)."""
    return await eventually(lambda: steps_of(client, allocation_id), timeout=30,
                            until=lambda d: d["items"] and d["items"][0]["state"] in ("completed", "failed"),
                            what="the allocate saga ended")


async def test_an_active_allocation_lists_every_allocate_step_succeeded_with_its_duration(tenant, admin):
    a = await tenant.user.create_allocation("timed", shape="vm.1gpu", volume_gb=10)
    await tenant.user.wait_state(a["id"], "ACTIVE", timeout=60)
    [saga] = (await settled(tenant.user, a["id"]))["items"]
    assert (saga["kind"], saga["state"]) == ("allocate", "completed") and saga["finished_at"]
    invoked = [s for s in saga["steps"] if s["phase"] == "invoke"]
    assert [s["step"] for s in invoked] == ALLOCATE_STEPS
    for s in invoked:
        assert s["status"] == "succeeded" and s["attempt"] == (0 if s["step"] in SKIPPED else 1), s
        assert s["duration_s"] >= 0, s
        assert s["started_at"] <= s["finished_at"] <= saga["finished_at"], s
    assert [s["started_at"] for s in invoked] == sorted(s["started_at"] for s in invoked)
    assert await steps_of(admin, a["id"]) == await steps_of(tenant.admin, a["id"])   # provider admins see any


@pytest.mark.parametrize("step", ["provision_volume"])
async def test_a_failed_allocation_shows_its_failed_step_and_the_compensations(tenant, step):
    a = await tenant.user.create_allocation("doomed", shape="vm.1gpu", volume_gb=10, labels={FAULT_LABEL: f"{step}=fail"})
    await tenant.user.wait_state(a["id"], {"FAILED", "ACTIVE"}, timeout=60)
    [saga] = (await settled(tenant.user, a["id"]))["items"]
    assert saga["state"] == "failed"
    rows = {(s["step"], s["phase"]): s for s in saga["steps"]}
    failed = rows[(step, "invoke")]
    assert failed["status"] == "failed" and "injected fault" in failed["error"] and failed["duration_s"] >= 0
    undone = [(s["step"], s["status"]) for s in saga["steps"] if s["phase"] == "compensate" and s["started_at"]]
    assert undone == [("reserve_slots", "compensated"), ("attach_network", "compensated")]
    assert all(s["finished_at"] >= failed["finished_at"] for s in saga["steps"]
               if s["phase"] == "compensate" and s["started_at"])
    assert not any(s["step"] in ("provision_node", "bind_port", "activate") for s in saga["steps"])


async def test_another_tenants_allocation_is_not_found(tenant, make_tenant):
    a = await tenant.user.create_allocation("mine", shape="vm.1gpu", volume_gb=10)
    other = await make_tenant()
    with pytest.raises(ApiError) as exc:
        await steps_of(other.user, a["id"])
    assert exc.value.status == 404 and exc.value.problem["status"] == 404
    with pytest.raises(ApiError) as exc:
        await steps_of(other.user, "00000000-0000-4000-8000-000000000000")
    assert exc.value.status == 404
