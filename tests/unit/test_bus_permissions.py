"""The NATS permissions generated from the contract catalog (tooling.bus_permissions): exact, least, deterministic."""
from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from shared.bus_identity import connect_options, inbox_prefix
from shared.contract import SERVICES, Catalog, Message, ServiceContract, durable_name, load_catalog
from tooling import bus_permissions as bp

CATALOG = load_catalog()
PERMS = bp.permissions(CATALOG)


class Payload(BaseModel):
    x: int = 0


def _toy_catalog() -> Catalog:
    """Two services: ``a`` owns an event, a command (with a parameter) and a request; ``b`` sends a's command and
    request and receives a's event."""
    a = ServiceContract("a", "A", "", [
        Message("a.done", "a.evt.done.{node}", Payload, "event", "done"),
        Message("a.do", "a.cmd.do.{node}", Payload, "command", "do"),
        Message("a.ask", "a.rpc.ask", Payload, "request", "ask", reply=Payload),
    ], receives=["a.do"])
    b = ServiceContract("b", "B", "", [Message("b.seen", "b.evt.seen", Payload, "event", "seen")],
                        receives=["a.done"], sends=["a.do", "a.ask"])
    return Catalog([a, b])


def test_a_service_publishes_its_events_and_the_commands_and_requests_it_sends_nothing_else():
    toy = _toy_catalog()
    a, b = bp.service_permissions(toy, "a"), bp.service_permissions(toy, "b")
    plain = lambda p: {s for s in p["publish"]["allow"] if not s.startswith("$")}   # noqa: E731
    assert plain(a) == {"a.evt.done.*", "deadletter.a.>"}         # not its own command, not its request
    assert plain(b) == {"b.evt.seen", "a.cmd.do.*", "a.rpc.ask", "deadletter.b.>"}
    assert a["allow_responses"] is True and b["allow_responses"] is False   # only the owner of a request answers


def test_a_service_subscribes_to_what_it_receives_its_requests_and_its_own_inboxes():
    toy = _toy_catalog()
    assert bp.service_permissions(toy, "a")["subscribe"]["allow"] == ["_INBOX_a.>", "a.cmd.do.*", "a.rpc.ask"]
    assert bp.service_permissions(toy, "b")["subscribe"]["allow"] == ["_INBOX_b.>", "a.evt.done.*"]


def test_a_durable_consumer_gets_exactly_the_jetstream_calls_it_makes():
    b = bp.service_permissions(_toy_catalog(), "b")["publish"]["allow"]
    durable = durable_name("b", "a.done")
    assert durable == "b__a_done"
    js = {s for s in b if s.startswith("$")}
    assert js == {
        "$JS.API.INFO",
        "$JS.API.STREAM.INFO.TESSERA_B", "$JS.API.STREAM.CREATE.TESSERA_B", "$JS.API.STREAM.UPDATE.TESSERA_B",
        "$JS.API.STREAM.INFO.TESSERA_DEADLETTER", "$JS.API.STREAM.CREATE.TESSERA_DEADLETTER",
        "$JS.API.STREAM.UPDATE.TESSERA_DEADLETTER",
        "$JS.API.STREAM.INFO.TESSERA_A", "$JS.API.STREAM.CREATE.TESSERA_A",   # created if missing, never updated
        f"$JS.API.CONSUMER.INFO.TESSERA_A.{durable}",
        f"$JS.API.CONSUMER.CREATE.TESSERA_A.{durable}.a.evt.done.*",            # the filter is in the subject
        f"$JS.API.CONSUMER.MSG.NEXT.TESSERA_A.{durable}",
        f"$JS.ACK.TESSERA_A.{durable}.>",
    }


def test_no_service_may_create_an_unfiltered_durable_nor_update_delete_or_purge_another_services_stream():
    for service in bp.SERVICE_IDENTITIES:
        allow = PERMS[service]["publish"]["allow"]
        own = f"TESSERA_{service.upper()}"
        for subject in allow:
            assert not subject.startswith("$JS.API.CONSUMER.DURABLE."), (service, subject)
            assert not subject.startswith(("$JS.API.STREAM.DELETE", "$JS.API.STREAM.PURGE", "$JS.API.CONSUMER.DELETE",
                                           "$JS.API.STREAM.MSG.DELETE")), (service, subject)
            if subject.startswith("$JS.API.STREAM.UPDATE."):
                assert subject.rsplit(".", 1)[1] in (own, "TESSERA_DEADLETTER"), (service, subject)
            if subject.startswith("$JS.API.CONSUMER.CREATE.") and service != "gateway":
                assert len(subject.split(".")) > 6, (service, subject)     # stream, durable and filter
        assert ">" not in allow and "_INBOX.>" not in PERMS[service]["subscribe"]["allow"]


def test_every_received_type_has_its_consumer_and_every_sent_type_its_publish_in_the_real_catalog():
    for service, contract in CATALOG.contracts.items():
        if service == "node_agent":
            continue   # a node-agent's identity is its node's: test_a_node_agent_speaks_and_listens_for_its_node_only
        allow = set(PERMS[service]["publish"]["allow"])
        for type_ in contract.receives:
            msg, stream = CATALOG.message(type_), CATALOG.owner(type_).stream
            durable = durable_name(service, type_)
            # a live event is never stored: heard through a plain subscription, never a durable
            consumer = f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.{msg.wildcard()}"
            assert (consumer in allow) != msg.live, (service, type_)
            assert msg.wildcard() in PERMS[service]["subscribe"]["allow"]
        for type_ in contract.sends:
            assert CATALOG.message(type_).wildcard() in allow, (service, type_)


def test_the_saga_sends_step_commands_and_participants_reply_on_their_own_subjects():
    saga = set(PERMS["saga"]["publish"]["allow"])
    assert {"scheduler.cmd.reserve_slots", "node_agent.cmd.provision.*"} <= saga
    assert "scheduler.evt.slots_reserved" not in saga
    assert "scheduler.evt.slots_reserved" in PERMS["scheduler"]["publish"]["allow"]
    assert "scheduler.evt.slots_reserved" not in PERMS["network"]["publish"]["allow"]


def test_the_gateway_reads_every_stream_for_the_operators_feed_and_the_dead_letters():
    allow = set(PERMS["gateway"]["publish"]["allow"])
    for stream in bp.all_streams():
        assert {f"$JS.API.CONSUMER.CREATE.{stream}", f"$JS.FC.{stream}.>"} <= allow
    assert {"$JS.API.STREAM.INFO.TESSERA_DEADLETTER", "$JS.API.STREAM.MSG.GET.TESSERA_DEADLETTER",
            "$JS.API.DIRECT.GET.TESSERA_DEADLETTER"} <= allow
    assert not any(s.startswith("$JS.API.STREAM.UPDATE.") and "GATEWAY" not in s and "DEADLETTER" not in s for s in allow)


def test_ops_reads_everything_and_publishes_no_message_and_no_ack():
    ops = PERMS["ops"]
    for subject in ops["publish"]["allow"]:
        assert subject.startswith(("$JS.API.INFO", "$JS.API.STREAM.INFO.", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
                                   "$JS.API.STREAM.MSG.GET.", "$JS.API.DIRECT.GET.", "$JS.API.CONSUMER.CREATE.",
                                   "$JS.API.CONSUMER.INFO.", "$JS.API.CONSUMER.NAMES.", "$JS.API.CONSUMER.LIST.",
                                   "$JS.FC.")), subject
        if subject.startswith("$JS.API.CONSUMER.CREATE."):
            assert len(subject.split(".")) == 5, subject      # only ephemeral: the server refuses a durable name there
    assert set(ops["subscribe"]["allow"]) == {"_INBOX_ops.>", *(f"{s}.evt.>" for s in SERVICES)}
    assert ops["allow_responses"] is False
    assert PERMS["admin"] is None


def test_the_document_is_deterministic_and_lists_every_identity():
    text = bp.render(CATALOG)
    assert text == bp.render(CATALOG)
    doc = json.loads(text)
    assert set(bp.IDENTITIES) == {*SERVICES, "ops", "admin"} - {"node_agent"}
    assert set(doc["identities"]) == {*bp.IDENTITIES, "node_agent_{node_hex}"}   # every node's, as a template
    assert doc["inbox_prefixes"]["billing"] == inbox_prefix("billing") == "_INBOX_billing"
    for perms in doc["identities"].values():
        if perms:
            assert perms["publish"]["allow"] == sorted(perms["publish"]["allow"])


def test_the_server_block_names_public_keys_and_never_a_user_without_credentials():
    keys = {i: f"U{i.upper()}" for i in bp.IDENTITIES}
    users = bp.server_users(keys, CATALOG)
    assert [u["nkey"] for u in users] == [keys[i] for i in bp.IDENTITIES]
    admin = next(u for u in users if u["nkey"] == "UADMIN")
    assert "permissions" not in admin
    billing = next(u for u in users if u["nkey"] == "UBILLING")
    assert billing["permissions"]["allow_responses"] is True
    network = next(u for u in users if u["nkey"] == "UNETWORK")
    assert "allow_responses" not in network["permissions"]
    block = bp.authorization_block(keys, CATALOG)
    assert block.startswith("authorization {") and "no_auth_user" not in block


def test_check_mode_reports_an_edited_file(tmp_path, capsys):
    path = tmp_path / "nats-permissions.json"
    assert bp.main(["--file", str(path)]) == 0
    assert bp.main(["--check", "--file", str(path)]) == 0
    path.write_text(path.read_text().replace('"billing.evt.meter_started",\n', ""))
    assert bp.main(["--check", "--file", str(path)]) == 1
    assert "billing.evt.meter_started" in capsys.readouterr().out


@pytest.mark.parametrize("seed", [None, "/run/tessera/billing.nk"])
def test_connect_options_carry_the_identitys_inbox_prefix_and_seed(seed):
    options = connect_options("billing", seed)
    assert options["inbox_prefix"] == "_INBOX_billing"
    assert options.get("nkeys_seed") == seed


def test_identities_are_created_once_private_and_kept(tmp_path):
    import nkeys

    from tooling.embedded import NatsIdentities

    ids = NatsIdentities(tmp_path / "identities").ensure(["billing", "admin"])
    seed = (tmp_path / "identities" / "billing.nk").read_bytes()
    assert (tmp_path / "identities").stat().st_mode & 0o777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in (tmp_path / "identities").iterdir()} == {0o600}
    assert ids.public_key("billing") == nkeys.from_seed(bytearray(seed.strip())).public_key.decode()
    assert ids.public_key("billing").startswith("U") and ids.public_key("billing") != ids.public_key("admin")
    NatsIdentities(tmp_path / "identities").ensure(["billing", "admin", "ops"])    # a later start
    assert (tmp_path / "identities" / "billing.nk").read_bytes() == seed
    assert set(ids.public_keys()) == {"billing", "admin", "ops"}
    assert ids.connect_options("ops") == {"inbox_prefix": "_INBOX_ops", "nkeys_seed": str(tmp_path / "identities" / "ops.nk")}
    with pytest.raises(FileNotFoundError):
        ids.seed_file("stranger")


NODE_A, NODE_B = "4f1c2b9e-0000-4000-8000-00000000000a", "4f1c2b9e-0000-4000-8000-00000000000b"


def test_a_node_agent_speaks_and_listens_for_its_node_only():
    from shared.bus_identity import node_durable, node_identity

    ident = node_identity(NODE_A)
    assert ident == "node_agent_4f1c2b9e000040008000" + "00000000000a"
    perms = bp.identity_permissions(ident, CATALOG)
    publish, subscribe = perms["publish"]["allow"], perms["subscribe"]["allow"]
    assert perms == bp.node_permissions(CATALOG, NODE_A)
    for subject in (*publish, *subscribe):
        assert NODE_B not in subject and node_identity(NODE_B) not in subject
        assert not subject.startswith("node_agent.evt.") or subject.endswith(f".{NODE_A}"), subject
        assert not subject.startswith(("node_agent.cmd.", "node_agent.rpc.")) or subject.endswith(f".{NODE_A}"), subject
        assert not subject.startswith("deadletter.") or subject.startswith(f"deadletter.node_agent.{ident}__"), subject
        if subject.startswith(("$JS.API.CONSUMER.", "$JS.ACK.")):
            assert f".{ident}__" in subject, subject
    assert f"node_agent.evt.power_changed.{NODE_A}" in publish
    assert f"node_agent.cmd.provision.{NODE_A}" in subscribe and f"node_agent.rpc.console.{NODE_A}" in subscribe
    assert "network.evt.tenant_networks_changed" in subscribe          # every node's dataplane follows the tenants
    assert subscribe[0] == f"_INBOX_{ident}.>" and perms["allow_responses"] is True
    durable = node_durable(NODE_A, "node_agent.provision")
    assert f"$JS.API.CONSUMER.CREATE.TESSERA_NODE_AGENT.{durable}.node_agent.cmd.provision.{NODE_A}" in publish
    # the committed template is the same thing with placeholders
    template = json.dumps(PERMS["node_agent_{node_hex}"])
    assert json.loads(template.replace("{node_hex}", ident.rsplit("_", 1)[1]).replace("{node_id}", NODE_A)) == perms


def test_the_server_block_gives_each_node_its_own_permissions():
    from shared.bus_identity import node_identity

    keys = {"admin": "UADMIN", node_identity(NODE_B): "UNODEB", node_identity(NODE_A): "UNODEA"}
    users = bp.server_users(keys, CATALOG)
    assert [u["nkey"] for u in users] == ["UADMIN", "UNODEA", "UNODEB"]
    assert f"node_agent.evt.node_provisioned.{NODE_A}" in users[1]["permissions"]["publish"]["allow"]
    assert f"node_agent.evt.node_provisioned.{NODE_A}" not in users[2]["permissions"]["publish"]["allow"]
    with pytest.raises(KeyError):
        bp.identity_permissions("node_agent", CATALOG)      # no shared node-agent identity any more


def test_a_process_connects_as_its_service_or_as_its_node():
    from shared.bus_identity import identity, node_durable

    assert identity("billing", "billing-7f9c") == "billing"
    assert identity("node_agent", NODE_A) == "node_agent_4f1c2b9e00004000800000000000000a"
    assert identity("node_agent", "0") == "node_agent"          # no node id: the agent refuses to start anyway
    assert node_durable(NODE_A, "network.tenant_networks_changed").endswith("__tenant_networks")   # kept as it was
    assert node_durable(NODE_A, "node_agent.provision") == identity("node_agent", NODE_A) + "__provision"


def test_a_node_agents_outbox_relay_publishes_its_own_nodes_subjects_only():
    from shared.bus_identity import publish_scope

    assert publish_scope("billing", "billing-7f9c") is None
    assert publish_scope("node_agent", NODE_A.upper()) == ("", f".{NODE_A}")   # as its subjects spell it


def test_adding_and_rotating_an_identity_reloads_the_server_once_each(tmp_path):
    from tooling.embedded import NatsIdentities

    reloads: list[str] = []
    ids = NatsIdentities(tmp_path / "identities", reload=reloads.append).ensure(["billing"])
    first = ids.add("node_agent_" + "a" * 32)
    assert ids.add("node_agent_" + "a" * 32) == first and reloads == ["node_agent_" + "a" * 32]   # once
    old = ids.seed_file("billing").read_bytes()
    ids.rotate("billing")
    assert ids.seed_file("billing").read_bytes() != old and reloads[-1] == "billing"
    assert ids.seed_file("billing").stat().st_mode & 0o777 == 0o600
