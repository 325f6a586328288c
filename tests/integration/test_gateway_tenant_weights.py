"""A tenant's weight (its share of each consumer's service while its messages wait with other tenants',
shared.fairness): a provider admin sets it at creation or later, and the gateway stamps it on the messages it
sends for the tenant (the envelope's ``weight``, the ``Tessera-Weight`` header) from then on."""
from __future__ import annotations

import uuid

from shared.fairness import TENANT_HEADER, WEIGHT_HEADER


async def new_user_event(api, watcher, tenant_id: str) -> tuple[dict, dict]:
    """Create a user of the tenant; the envelope and headers of the gateway's user_created event."""
    _, user = await api.new_user(tenant_id)
    [(_, env, headers)] = await watcher.wait_for(lambda i: i[1]["data"]["user_id"] == user["id"])
    return env, headers


async def test_a_provider_admin_sets_a_weight_and_the_tenants_messages_carry_it(api, watch):
    admin, users = await api.admin(), await watch("gateway.evt.user_created")
    created = await admin.post("/v1/tenants", {"name": f"weighty-{uuid.uuid4().hex[:8]}", "weight": 4})
    assert created.status == 201 and created.body["weight"] == 4, created.body
    tenant_id = created.body["id"]
    env, headers = await new_user_event(api, users, tenant_id)
    assert (env["weight"], headers[WEIGHT_HEADER], headers[TENANT_HEADER]) == (4, "4", tenant_id)

    changed = await admin.call("PATCH", f"/v1/tenants/{tenant_id}", json_body={"weight": 1})
    assert changed.status == 200 and changed.body == {**created.body, "weight": 1}
    listed = await admin.get("/v1/tenants")
    assert [t["weight"] for t in listed.body["items"] if t["id"] == tenant_id] == [1]
    env, headers = await new_user_event(api, users, tenant_id)
    assert env["weight"] is None and WEIGHT_HEADER not in headers   # the default is stamped as nothing


async def test_a_weight_is_the_provider_admins_to_set_within_1_to_100(api):
    admin, tenant_id = await api.admin(), await api.new_tenant()
    for weight in (0, 101, "3", None):
        r = await admin.call("PATCH", f"/v1/tenants/{tenant_id}", json_body={"weight": weight})
        assert r.status == 422 and r.content_type == "application/problem+json", (weight, r.body)
    missing = await admin.call("PATCH", f"/v1/tenants/{uuid.uuid4()}", json_body={"weight": 2})
    assert missing.status == 404 and missing.content_type == "application/problem+json"
    for role in ("tenant_admin", "tenant_user"):
        client, own = await api.tenant_user(role)
        r = await client.call("PATCH", f"/v1/tenants/{own}", json_body={"weight": 100})
        assert r.status == 403 and r.content_type == "application/problem+json", (role, r.body)
