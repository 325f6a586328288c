"""Unit tests of shared.contract: what the catalog lets a service send and receive (no I/O)."""
from __future__ import annotations

import pytest
from pydantic import BaseModel

from shared.contract import Catalog, ContractViolation, Message, ServiceContract, stream_name


class Ping(BaseModel):
    n: int


class Pong(BaseModel):
    n: int


def _catalog() -> Catalog:
    """Two services: 'alpha' owns a command and an event; 'beta' owns a node-addressed command and an event."""
    alpha = ServiceContract(
        service="alpha", title="Alpha", description="test",
        messages=[
            Message("alpha.ping", "alpha.cmd.ping", Ping, "command", "ping alpha"),
            Message("alpha.pinged", "alpha.evt.pinged", Pong, "event", "alpha was pinged"),
        ],
        receives=["alpha.ping", "beta.ponged"],
        sends=["beta.poke"],
    )
    beta = ServiceContract(
        service="beta", title="Beta", description="test",
        messages=[
            Message("beta.poke", "beta.cmd.poke.{node_id}", Ping, "command", "poke a node"),
            Message("beta.ponged", "beta.evt.ponged.{node_id}", Pong, "event", "a node answered"),
        ],
        receives=["beta.poke"],
    )
    return Catalog([alpha, beta])


def test_owner_may_send_its_own_event_and_command():
    cat = _catalog()
    assert cat.check_send("alpha", "alpha.pinged", "alpha.evt.pinged").type == "alpha.pinged"
    assert cat.check_send("alpha", "alpha.ping", "alpha.cmd.ping").type == "alpha.ping"


def test_service_may_send_another_services_command_listed_in_its_sends():
    assert _catalog().check_send("alpha", "beta.poke", "beta.cmd.poke.n1").type == "beta.poke"


def test_check_send_refuses_an_event_owned_by_another_service():
    with pytest.raises(ContractViolation, match="alpha may not send beta.ponged"):
        _catalog().check_send("alpha", "beta.ponged", "beta.evt.ponged.n1")


def test_check_send_refuses_a_command_not_declared_in_sends():
    with pytest.raises(ContractViolation, match="beta may not send alpha.ping"):
        _catalog().check_send("beta", "alpha.ping", "alpha.cmd.ping")


def test_check_send_refuses_a_subject_other_than_the_contracts():
    cat = _catalog()
    with pytest.raises(ContractViolation, match="not published on alpha.evt.other"):
        cat.check_send("alpha", "alpha.pinged", "alpha.evt.other")
    with pytest.raises(ContractViolation, match="not published on beta.cmd.poke"):
        cat.check_send("alpha", "beta.poke", "beta.cmd.poke")        # parameter missing
    with pytest.raises(ContractViolation, match="not published on"):
        cat.check_send("alpha", "beta.poke", "beta.cmd.poke.n1.extra")  # one token too many


def test_check_send_refuses_an_unknown_type():
    with pytest.raises(ContractViolation, match="no contract defines message type 'alpha.nope'"):
        _catalog().check_send("alpha", "alpha.nope", "alpha.evt.nope")


def test_check_receive_accepts_declared_types_and_refuses_undeclared_ones():
    cat = _catalog()
    assert cat.check_receive("alpha", "beta.ponged").type == "beta.ponged"
    with pytest.raises(ContractViolation, match="beta does not declare that it receives alpha.pinged"):
        cat.check_receive("beta", "alpha.pinged")
    with pytest.raises(ContractViolation, match="no contract defines"):
        cat.check_receive("alpha", "alpha.unknown")


def test_message_matches_its_subject_with_any_single_token_per_param():
    poke = _catalog().message("beta.poke")
    assert poke.params == ["node_id"]
    assert poke.matches("beta.cmd.poke.7f1c")
    assert not poke.matches("beta.cmd.poke")
    assert not poke.matches("beta.cmd.poke.a.b")
    assert not poke.matches("beta.cmd.pokeX7f1c")
    assert poke.wildcard() == "beta.cmd.poke.*"


def test_message_without_params_matches_only_its_exact_subject():
    ping = _catalog().message("alpha.ping")
    assert ping.params == [] and ping.matches("alpha.cmd.ping")
    assert not ping.matches("alpha.cmdXping")   # the dots are literal, not regex wildcards
    assert not ping.matches("alpha.cmd.ping.x")


def test_render_subject_fills_params_and_refuses_a_missing_one():
    poke = _catalog().message("beta.poke")
    assert poke.render_subject(node_id="n1") == "beta.cmd.poke.n1"
    with pytest.raises(ContractViolation, match="subject parameter 'node_id' missing"):
        poke.render_subject()


def test_catalog_refuses_a_duplicate_type_and_a_subject_outside_the_service():
    dup = ServiceContract("gamma", "G", "t", [Message("alpha.ping", "gamma.cmd.ping", Ping, "command", "x")])
    with pytest.raises(ContractViolation, match="duplicate message type alpha.ping"):
        Catalog([_catalog().contracts["alpha"], dup])
    stray = ServiceContract("gamma", "G", "t", [Message("gamma.ping", "alpha.cmd.ping", Ping, "command", "x")])
    with pytest.raises(ContractViolation, match="outside gamma"):
        Catalog([stray])


def test_owner_and_stream_name_follow_the_owning_service():
    cat = _catalog()
    assert cat.owner("beta.ponged").service == "beta"
    assert cat.contracts["beta"].stream == "TESSERA_BETA"
    assert stream_name("node_agent") == "TESSERA_NODE_AGENT"
