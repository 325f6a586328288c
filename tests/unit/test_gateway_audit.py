"""The audit trail's pure rules: secrets are redacted wherever they sit, bodies are bounded, targets come from the
route template, and a record renders as CADF and as a Kubernetes audit event."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime

from services.gateway.domain.audit import REDACTED, bounded_body, cadf, k8s, redact, target_of


def test_secret_members_and_api_key_strings_are_redacted_at_any_depth():
    body = {"url": "https://10.0.0.5", "password": "pw", "nested": {"BMC_Password": "x", "api_key": "k",
            "list": [{"token": "t"}, "tsk_abc"]}, "note": "my key is tsk_secret", "verify_tls": True, "n": 1.5}
    clean = redact(body)
    assert clean["password"] == REDACTED and clean["nested"]["BMC_Password"] == REDACTED
    assert clean["nested"]["api_key"] == REDACTED and clean["nested"]["list"] == [{"token": REDACTED}, REDACTED]
    assert clean["note"] == REDACTED and clean["url"] == "https://10.0.0.5" and clean["verify_tls"] is True
    assert clean["n"] == "1.5"   # the chain hashes no floats


def test_an_oversized_body_keeps_only_its_member_names():
    out = bounded_body({f"k{i}": "v" * 500 for i in range(40)})
    assert out["truncated"] is True and out["members"][0] == "k0"


def test_target_is_the_innermost_id_param_or_the_created_object():
    t = target_of("/v1/allocations/{allocation_id}/actions/{action}", {"allocation_id": "a", "action": "reboot"},
                  "POST", 404, None)
    assert (t.type, t.id) == ("allocations.actions", "a")
    assert target_of("/v1/pools/{name}", {"name": "gpu"}, "PUT", 202, None).id == "gpu"
    created = target_of("/v1/tenants/{tenant_id}/users", {"tenant_id": "t"}, "POST", 201, "u")
    assert (created.type, created.id) == ("tenants.users", "u")
    assert target_of("/v1/nodes/{node_id}/cordon", {"node_id": "n"}, "POST", 202, "n").id == "n"


def test_renderings_carry_the_required_members():
    now = datetime.now(UTC)
    row = {"audit_id": uuid.uuid4(), "event_time": now, "created_at": now, "tenant_id": None, "action": "setNodeBmc",
           "method": "PUT", "path": "/v1/nodes/n/bmc", "target_type": "nodes.bmc", "target_id": "n",
           "outcome": "failure", "status": 404, "request_id": "0" * 32,
           "record": {"actor": {"id": None, "role": None, "tenant_id": None, "ip": "10.0.0.1", "user_agent": "ua"},
                      "target": {"id": "n"}, "outcome": {"reason": "https://tessera.io/problems/not-found"},
                      "request": {"body": {"password": REDACTED}}}}
    c = cadf(row)
    assert {"id", "eventType", "eventTime", "action", "outcome", "initiator", "target", "observer"} <= c.keys()
    assert c["action"] == "update" and c["outcome"] == "failure"
    e = k8s(row)
    assert {"level", "auditID", "stage", "requestURI", "verb", "user"} <= e.keys()
    assert e["level"] == "Request" and e["verb"] == "update" and e["user"]["groups"] == ["system:unauthenticated"]
    assert e["objectRef"] == {"resource": "nodes", "subresource": "bmc", "name": "n", "namespace": None,
                              "apiVersion": "v1"}


def test_what_postgresql_cannot_store_is_escaped_not_refused():
    assert redact({"name\x00": "a\x00b\ud800"}) == {"name\\u0000": "a\\u0000b\\ud800"}


def test_every_update_and_delete_of_the_contract_has_a_state_reader():
    """So a new PUT, PATCH or DELETE route cannot skip before/after: give it a reader in adapters/audit_state.py."""
    import json
    from pathlib import Path

    from services.gateway.entrypoints.http import STATE_READERS
    doc = json.loads((Path(__file__).resolve().parents[2] / "contracts" / "openapi.json").read_text())
    updates = {op["operationId"] for ops in doc["paths"].values() for m, op in ops.items()
               if m in ("put", "patch", "delete")}
    assert len(updates) >= 23
    missing = sorted(updates - set(STATE_READERS))
    assert not missing, f"updates and deletes without a state reader: {missing}"
    assert not set(STATE_READERS) - updates, "a state reader for an operation the contract does not have"


def test_a_change_is_redacted_and_rendered_as_a_cadf_attachment_and_a_k8s_response_object():
    from services.gateway.domain.audit import change_failed, change_of
    change = change_of({"url": "https://bmc", "password_sealed": "s", "note": "tsk_x", "ratio": 0.5}, None)
    assert change == {"before": {"url": "https://bmc", "password_sealed": REDACTED, "note": REDACTED, "ratio": "0.5"},
                      "after": None}
    assert change_failed(TimeoutError("slow")) == {"error": "TimeoutError"}
    now = datetime.now(UTC)
    row = {"audit_id": uuid.uuid4(), "event_time": now, "created_at": now, "tenant_id": None, "action": "deleteSpendCap",
           "method": "DELETE", "path": "/v1/tenants/t/spend-cap", "target_type": "tenants.spend-cap", "target_id": "t",
           "outcome": "success", "status": 204, "request_id": "0" * 32,
           "record": {"actor": {"id": "u", "role": "provider_admin", "tenant_id": None, "ip": None, "user_agent": ""},
                      "target": {"id": "t"}, "outcome": {"reason": None}, "request": {"body": None},
                      "change": {"before": {"amount_minor": 1}, "after": None}}}
    assert cadf(row)["attachments"] == [{"name": "change", "typeURI": "application/json",
                                         "content": {"before": {"amount_minor": 1}, "after": None}}]
    e = k8s(row)
    assert e["level"] == "RequestResponse" and e["responseObject"] == {"before": {"amount_minor": 1}, "after": None}
    assert "requestObject" not in e


async def test_a_path_value_that_names_no_row_is_answered_none_without_a_query():
    """A malformed uuid, a NUL (hostile input PostgreSQL refuses) or a key read without a caller names nothing."""
    from services.gateway.entrypoints.http import STATE_READERS

    class NoQuery:
        async def fetchval(self, *args):
            raise AssertionError("queried")
    assert await STATE_READERS["updateNode"](NoQuery(), {"node_id": "not-a-uuid"}, None) is None
    assert await STATE_READERS["definePool"](NoQuery(), {"name": "gpu\x00"}, None) is None
    assert await STATE_READERS["deleteSshKey"](NoQuery(), {"name": "laptop"}, None) is None
