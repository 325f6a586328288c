"""A node's BMC through the gateway (bare metal through Redfish): registered by a provider admin with its password
sealed (never stored, returned or sent in clear), removed, and checked live by the node's agent (the tests play the
agent: they watch node_agent.set_bmc and answer node_agent.validate_bmc with shared.rpc.serve). Also the bare-metal
members of an allocation's instance (phases, redfish_calls)."""
from __future__ import annotations

import asyncio
import uuid

import pytest

from services.gateway.settings import GatewaySettings
from services.node_agent.contracts import BmcReport, ValidateBmc
from shared.contract import load_catalog
from shared.rpc import serve
from shared.secrets import new_key, parse_key, unseal
from shared.settings import SettingError
from tests.support.gateway import (
    PROJECTED_WITHIN_S,
    SECRET_KEY,
    TOKEN_SECRET,
    assert_problem,
    gateway_config,
    outbox_count,
    publish,
)
from tests.support.polling import eventually

AT = "2030-01-01T00:00:00Z"
PEM = ("-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ0FUZXN0Q0FUZXN0Q0FUZXN0Q0FUZXN0MAoGCCqGSM49\n"
       "BAMCMBIxEDAOBgNVBAMMB3Rlc3QtY2E=\n-----END CERTIFICATE-----\n")


def bmc_body(**over) -> dict:
    body = {"url": "https://10.20.0.5", "system_id": "/redfish/v1/Systems/System.Embedded.1", "username": "root",
            "password": f"calvin {uuid.uuid4().hex}", "verify_tls": True, "ca_bundle": PEM}
    body.update(over)
    return body


async def new_node(admin) -> str:
    r = await admin.post("/v1/nodes", {"name": f"bm-{uuid.uuid4().hex[:8]}", "gpu_model": "H100", "gpu_count": 8})
    assert r.status == 202, r.body
    return r.body["id"]


async def rows_holding(api, needle: str) -> list[str]:
    """Every row of the gateway's schema whose text (bytea decoded) holds ``needle``: 'table: row'."""
    found = []
    async with api.rt.pool.acquire() as conn:
        tables = await conn.fetch("SELECT table_name FROM information_schema.tables WHERE table_schema = "
                                  "current_schema() AND table_type = 'BASE TABLE'")
        for t in tables:
            for row in await conn.fetch(f'SELECT * FROM "{t["table_name"]}"'):
                text = " ".join(v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in row.values())
                if needle in text:
                    found.append(f"{t['table_name']}: {text[:200]}")
    return found


# --- registration ---------------------------------------------------------------------------------------------

async def test_a_bmc_is_sealed_sent_to_its_node_shown_without_its_password_and_removed(api, watch):
    admin = await api.admin()
    node = await new_node(admin)
    commands = await watch(f"node_agent.cmd.set_bmc.{node}")
    body = bmc_body()
    password = body["password"]
    r = await admin.call("PUT", f"/v1/nodes/{node}/bmc", json_body=body)
    assert r.status == 200, r.body
    assert "password" not in r.body and "password_sealed" not in r.body
    assert {k: r.body[k] for k in ("node_id", "url", "system_id", "username", "verify_tls", "ca_bundle")} == {
        "node_id": node, **{k: body[k] for k in ("url", "system_id", "username", "verify_tls", "ca_bundle")}}
    assert r.body["password_set"] is True and r.body["version"] == 1 and r.body["updated_at"]
    # the command carries the password sealed with the platform's key, bound to the node
    [(_, env, _)] = await commands.wait_for(lambda i: i[1]["data"]["version"] == 1)
    sent = env["data"]
    assert env["type"] == "node_agent.set_bmc" and sent["node_id"] == node and sent["set_by"] == r.body["updated_by"]
    sealed = sent["bmc"]["password_sealed"]
    assert password not in sealed and unseal(sealed, parse_key(SECRET_KEY), f"bmc:{node}") == password
    with pytest.raises(ValueError):
        unseal(sealed, parse_key(SECRET_KEY), f"bmc:{uuid.uuid4()}")     # not another node's
    assert {k: sent["bmc"][k] for k in ("url", "system_id", "username", "verify_tls", "ca_bundle")} == {
        k: body[k] for k in ("url", "system_id", "username", "verify_tls", "ca_bundle")}
    # the plaintext is nowhere in the gateway's database (the outbox included); the sealed value only in node_bmcs
    # and the outbox
    assert await rows_holding(api, password) == []
    assert {"node_bmcs"} <= {h.split(":")[0] for h in await rows_holding(api, sealed)} <= {"node_bmcs", "outbox"}
    # reads never show it, sealed or not
    for path in (f"/v1/nodes/{node}/bmc", f"/v1/nodes/{node}"):
        shown = await admin.get(path)
        assert shown.status == 200 and password not in str(shown.body) and sealed not in str(shown.body)
    assert (await admin.get(f"/v1/nodes/{node}/bmc")).body == r.body
    assert (await admin.get(f"/v1/nodes/{node}")).body["bmc"] == {
        "url": body["url"], "system_id": body["system_id"], "username": "root", "password_set": True}
    # replaced: a new version; removed: one more, the command without a BMC
    r2 = await admin.call("PUT", f"/v1/nodes/{node}/bmc", json_body=bmc_body(system_id="1", ca_bundle=None,
                                                                             verify_tls=False))
    assert r2.status == 200 and r2.body["version"] == 2 and r2.body["ca_bundle"] is None
    gone = await admin.delete(f"/v1/nodes/{node}/bmc")
    assert gone.status == 204
    [(_, removed, _)] = await commands.wait_for(lambda i: i[1]["data"]["version"] == 3)
    assert removed["data"]["bmc"] is None
    assert_problem(await admin.get(f"/v1/nodes/{node}/bmc"), 404)
    assert (await admin.get(f"/v1/nodes/{node}")).body["bmc"] is None
    assert_problem(await admin.delete(f"/v1/nodes/{node}/bmc"), 404)
    assert_problem(await admin.post(f"/v1/nodes/{node}/bmc/validate"), 409)
    # registered again: the version keeps growing (the node-agent keeps the highest)
    assert (await admin.call("PUT", f"/v1/nodes/{node}/bmc", json_body=bmc_body())).body["version"] == 4
    assert await outbox_count(api, "node_agent.set_bmc", "node_id", node) == 4


BAD_FIELDS = [
    ("url", "ftp://10.0.0.5"), ("url", "10.0.0.5"), ("url", "https://"), ("url", "https://bmc .lab"),
    ("url", "https://root:calvin@10.0.0.5"), ("url", "https://bmc\u0000.lab"), ("url", "https://" + "b" * 1017),
    ("url", None), ("url", 5),
    ("system_id", "/redfish/v1/Chassis/1"), ("system_id", "1/../2"), ("system_id", ""), ("system_id", "x" * 513),
    ("system_id", "Sys\u0000tem"),
    ("username", ""), ("username", " root"), ("username", "r" * 256), ("username", "ro\u0000ot"),
    ("username", "röot"),
    ("password", ""), ("password", "p" * 1025), ("password", "pass\u0000word"), ("password", "pässword"),
    ("password", "line\nbreak"), ("password", 1234),
    ("verify_tls", "yes"), ("verify_tls", None),
    ("ca_bundle", "not a certificate"), ("ca_bundle", PEM.replace("MIIB", "MI\u0000B")),
    ("ca_bundle", "-----BEGIN CERTIFICATE-----\n" + "A" * 77 + "\n-----END CERTIFICATE-----\n"),
    ("ca_bundle", PEM * 300), ("ca_bundle", ""),
]


async def test_every_bmc_field_is_validated_and_nothing_is_stored_or_sent(api):
    admin = await api.admin()
    node = await new_node(admin)
    for name, value in BAD_FIELDS:
        r = await admin.call("PUT", f"/v1/nodes/{node}/bmc", json_body=bmc_body(**{name: value}))
        assert_problem(r, 422, name)
    for extra in ({"password_sealed": "v1.x"}, {"version": 3}, {"password_set": True}, {"node_id": node},
                  {"color": "blue"}):
        assert_problem(await admin.call("PUT", f"/v1/nodes/{node}/bmc", json_body=bmc_body(**extra)), 422,
                       next(iter(extra)))
    missing = bmc_body()
    del missing["password"]
    assert_problem(await admin.call("PUT", f"/v1/nodes/{node}/bmc", json_body=missing), 422, "password")
    assert (await admin.call("PUT", f"/v1/nodes/{node}/bmc", data=b"{", headers={"Content-Type": "application/json"})
            ).status == 400
    assert await api.scalar("SELECT count(*) FROM node_bmcs WHERE node_id=$1", uuid.UUID(node)) == 0
    assert await outbox_count(api, "node_agent.set_bmc", "node_id", node) == 0
    # the longest values of every field fit in a body
    longest = bmc_body(url="https://" + "b" * 1016, system_id="x" * 512, username="u" * 255, password="p" * 1024,
                       ca_bundle=_bundle_of(32 * 1024))
    assert (await admin.call("PUT", f"/v1/nodes/{node}/bmc", json_body=longest)).status == 200


def _bundle_of(chars: int) -> str:
    """A PEM bundle of exactly ``chars`` characters (64-character base64 lines)."""
    head, tail = "-----BEGIN CERTIFICATE-----\n", "-----END CERTIFICATE-----\n"
    lines, left = [], chars - len(head) - len(tail)
    while left > 66:
        lines.append("A" * 64 + "\n")
        left -= 65
    lines.append("A" * (left - 1) + "\n")     # the last line: 1 to 65 characters
    bundle = head + "".join(lines) + tail
    assert len(bundle) == chars, len(bundle)
    return bundle


async def test_the_bmc_routes_are_the_provider_admins(api):
    admin, (user, _) = await api.admin(), await api.tenant_user("tenant_admin")
    node = await new_node(admin)
    assert (await admin.call("PUT", f"/v1/nodes/{node}/bmc", json_body=bmc_body())).status == 200
    for method, path in (("PUT", "/bmc"), ("GET", "/bmc"), ("DELETE", "/bmc"), ("POST", "/bmc/validate")):
        json_body = bmc_body() if method == "PUT" else None
        assert_problem(await user.call(method, f"/v1/nodes/{node}{path}", json_body=json_body), 403)
        assert_problem(await api.anonymous().call(method, f"/v1/nodes/{node}{path}", json_body=json_body), 401)
        assert_problem(await admin.call(method, f"/v1/nodes/{uuid.uuid4()}{path}", json_body=json_body), 404)
        assert_problem(await admin.call(method, f"/v1/nodes/not-a-node{path}", json_body=json_body), 404)
    assert await outbox_count(api, "node_agent.set_bmc", "node_id", node) == 1


async def test_without_a_platform_key_a_bmc_is_a_503_naming_the_variable_and_a_bad_key_stops_the_gateway(
        gateway, tmp_path):
    api = await gateway(secret_key=None)
    admin = await api.admin()
    node = await new_node(admin)
    problem = assert_problem(await admin.call("PUT", f"/v1/nodes/{node}/bmc", json_body=bmc_body()), 503)
    assert "TESSERA_SECRET_KEY" in problem["detail"] and problem["type"].endswith("/no-secret-key")
    assert await api.scalar("SELECT count(*) FROM node_bmcs WHERE node_id=$1", uuid.UUID(node)) == 0
    assert await outbox_count(api, "node_agent.set_bmc", "node_id", node) == 0
    # the key may come from a file (read once, at start); a bad key or an unreadable file is refused at start
    key_file = tmp_path / "secret.key"
    key_file.write_text(new_key())
    assert gateway_config(secret_key=None, secret_key_file=str(key_file)).platform_key() == parse_key(
        key_file.read_text())
    for bad in ({"secret_key": "too-short"}, {"secret_key": None, "secret_key_file": str(tmp_path / "missing")}):
        with pytest.raises(SettingError) as err:
            GatewaySettings(token_secret=TOKEN_SECRET, **bad)
        assert "TESSERA_SECRET_KEY" in str(err.value) and "too-short" not in str(err.value)


# --- validation by the node's agent ----------------------------------------------------------------------------

@pytest.fixture
async def node_agent(nc):
    """node_agent(node_id, answer) answers node_agent.validate_bmc on that node until the test ends."""
    subs = []

    async def _serve(node_id: str, answer):
        subs.append(await serve(nc, load_catalog(), "node_agent", "node_agent.validate_bmc", answer,
                                node_id=node_id))
    yield _serve
    for sub in subs:
        await sub.unsubscribe()


async def test_validation_answers_what_the_node_agent_found_ok_or_not(api, node_agent):
    admin = await api.admin()
    node = await new_node(admin)
    good = bmc_body()
    asked: list[ValidateBmc] = []

    async def agent(req: ValidateBmc) -> BmcReport:
        """A BMC whose password is ``good``'s: the agent opens the sealed one as the real agent does."""
        asked.append(req)
        if unseal(req.bmc.password_sealed, parse_key(SECRET_KEY), f"bmc:{req.node_id}") != good["password"]:
            return BmcReport(ok=False, error_kind="unauthorized", error="401 from the BMC", elapsed_s=0.2)
        return BmcReport(ok=True, power_state="On", model="PowerEdge XE9680", manufacturer="Dell Inc.",
                         serial="ABC1234", elapsed_s=0.4)
    await node_agent(node, agent)
    assert (await admin.call("PUT", f"/v1/nodes/{node}/bmc", json_body=good)).status == 200
    r = await admin.post(f"/v1/nodes/{node}/bmc/validate")
    assert r.status == 200, r.body
    assert r.body == {"ok": True, "error_kind": None, "error": None, "power_state": "On", "model": "PowerEdge XE9680",
                      "manufacturer": "Dell Inc.", "serial": "ABC1234", "elapsed_s": 0.4}
    assert str(asked[0].node_id) == node and asked[0].bmc.url == good["url"] and asked[0].bmc.ca_bundle == PEM
    # a wrong password: the check ran, it is a 200 saying so
    assert (await admin.call("PUT", f"/v1/nodes/{node}/bmc", json_body=bmc_body(password="wrong"))).status == 200
    r = await admin.post(f"/v1/nodes/{node}/bmc/validate")
    assert r.status == 200 and r.body["ok"] is False and r.body["error_kind"] == "unauthorized"
    assert r.body["error"] == "401 from the BMC"


async def test_validation_is_a_503_at_once_without_an_agent_a_504_when_it_is_silent_a_502_when_it_fails(
        gateway, node_agent):
    api = await gateway(bmc_validate_timeout_s=1.0)
    admin = await api.admin()
    absent, silent, failing = await new_node(admin), await new_node(admin), await new_node(admin)
    assert_problem(await admin.post(f"/v1/nodes/{absent}/bmc/validate"), 409)          # no BMC yet
    for node in (absent, silent, failing):
        assert (await admin.call("PUT", f"/v1/nodes/{node}/bmc", json_body=bmc_body())).status == 200
    # no agent connected: the bus says so at once (no responders), a 503 to retry later, not a wait
    r = await admin.post(f"/v1/nodes/{absent}/bmc/validate")
    problem = assert_problem(r, 503)
    assert absent in problem["detail"] and problem["type"].endswith("/node-unavailable") and r.headers["Retry-After"]

    unwedge = asyncio.Event()

    async def wedged(_req: ValidateBmc) -> BmcReport:
        await unwedge.wait()          # held until the gateway has given up on it
        raise RuntimeError("never answers in time")
    await node_agent(silent, wedged)
    problem = assert_problem(await admin.post(f"/v1/nodes/{silent}/bmc/validate"), 504)
    unwedge.set()
    assert silent in problem["detail"] and problem["type"].endswith("/node-timeout")

    async def broken(_req: ValidateBmc) -> BmcReport:
        raise RuntimeError("the redfish driver is not loaded")
    await node_agent(failing, broken)
    assert_problem(await admin.post(f"/v1/nodes/{failing}/bmc/validate"), 502)


# --- the instance of a bare-metal allocation --------------------------------------------------------------------

async def test_an_instance_shows_its_bare_metal_phases_and_redfish_calls(api, nc):
    client, tenant_id = await api.tenant_user()
    node = uuid.uuid4()
    a = (await client.post("/v1/allocations", {"name": "metal", "shape": "vm.1gpu"})).body
    saga = uuid.uuid4()
    phases = [{"name": "power_off", "seconds": 4.5}, {"name": "virtual_media", "seconds": 12.0},
              {"name": "boot", "seconds": 95.25}]
    instance = {"instance_id": f"bm-{node}", "driver": "redfish", "dataplane": "none", "node_id": str(node),
                "passthrough": "real", "booted_at": AT, "power_state": "running", "phases": phases,
                "redfish_calls": 37}
    await publish(nc, "allocation.activated", {
        "allocation_id": a["id"], "tenant_id": tenant_id, "state": "ACTIVE", "at": AT, "saga_id": saga,
        "step": "activate", "idempotency_key": f"{saga}:activate", "node_id": node, "instance": instance}, tenant_id)
    shown = await eventually(lambda: client.get(f"/v1/allocations/{a['id']}"), timeout=PROJECTED_WITHIN_S,
                             until=lambda r: r.body["state"] == "ACTIVE", what="the allocation to be ACTIVE")
    assert shown.body["instance"]["phases"] == phases and shown.body["instance"]["redfish_calls"] == 37
    assert shown.body["instance"]["driver"] == "redfish"
