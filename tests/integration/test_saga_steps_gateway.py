"""GET /v1/allocations/{id}/steps on a gateway in-process: who may read it, and what it says while the saga
coordinator is away, then once it answers (its real bootstrap, the suite's NATS and PostgreSQL)."""
from __future__ import annotations

from services.saga.bootstrap import build
from tests.support.gateway import assert_problem


async def test_steps_are_a_503_while_no_coordinator_answers_then_the_allocations_sagas(api, run_service):
    alice, _ = await api.tenant_user()
    bob, _ = await api.tenant_user("tenant_admin")
    a = (await alice.post("/v1/allocations", {"name": "timed", "shape": "vm.1gpu"})).body
    path = f"/v1/allocations/{a['id']}/steps"
    problem = assert_problem(await alice.get(path), 503)
    assert problem["type"].endswith("/saga-unavailable")
    assert (await alice.get(path)).headers.get("Retry-After") == "5"
    assert_problem(await bob.get(path), 404)        # another tenant: not found, before the coordinator is asked
    await run_service("saga", build)
    r = await alice.get(path)
    assert r.status == 200 and r.body == {"items": []}   # requested, no saga yet (no allocation service here)
    assert (await (await api.admin()).get(path)).body == {"items": []}   # a provider admin reads any
    assert_problem(await bob.get(path), 404)
