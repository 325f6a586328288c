"""The node's health messages: the heartbeat is a live event its service's stream never stores, while every other
node-agent subject is stored as before; an alert's condition is checked on the wire."""
from __future__ import annotations

import re
import uuid

import pytest
from pydantic import ValidationError

from services.node_agent.contracts import Alert, FenceInstances
from shared.contract import Catalog, ContractViolation, Message, ServiceContract, load_catalog
from shared.envelope import utcnow
from shared.streams import stream_subjects


def _captured(subjects: list[str], subject: str) -> bool:
    def pattern(s: str) -> str:
        return "^" + re.escape(s).replace(r"\*", r"[^.]+").replace(">", r".+") + "$"
    return any(re.match(pattern(s), subject) for s in subjects)


def test_the_node_agents_stream_stores_everything_but_its_heartbeats():
    subjects, node = stream_subjects("node_agent"), str(uuid.uuid4())
    catalog = load_catalog()
    assert catalog.message("node_agent.heartbeat").live
    assert not _captured(subjects, f"node_agent.evt.heartbeat.{node}")
    for msg in catalog.contracts["node_agent"].messages:
        if msg.kind != "request" and not msg.live:
            assert _captured(subjects, msg.render_subject(node_id=node)), msg.type


def test_a_service_without_live_events_keeps_its_two_wildcards():
    assert stream_subjects("billing") == ["billing.cmd.>", "billing.evt.>"]


def test_only_an_event_is_published_live():
    live_command = Message("x.go", "x.cmd.go", Alert, "command", "", live=True)
    with pytest.raises(ContractViolation, match="only an event"):
        Catalog([ServiceContract("x", "x", "x", [live_command])])


def test_an_alerts_condition_and_a_fences_allocations_are_checked():
    fields = dict(source="sim", target="gpu:0", since=utcnow(), message="m", tenant_message="t")
    assert Alert(condition="xid:79", **fields).classifications == []
    for bad in ("XID:79", "xid:", "xid:7a", "ecc dbe"):
        with pytest.raises(ValidationError):
            Alert(condition=bad, **fields)
    with pytest.raises(ValidationError):
        FenceInstances(node_id=uuid.uuid4(), allocation_ids=[], reason="moved")
