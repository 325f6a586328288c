"""Pure parts of the shared kit: envelope, fault labels, DSNs, stream declarations."""
from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError

from shared.db import role_name, service_dsn
from shared.envelope import Envelope, utcnow
from shared.participant import FAULT_LABEL, injected_fault
from shared.streams import DEAD_LETTER_STREAM, stream_configs
from shared.wire import StepCommand, step_key


def cmd(step: str, labels: dict[str, str]) -> StepCommand:
    s = uuid.uuid4()
    return StepCommand(saga_id=s, step=step, idempotency_key=step_key(s, step), allocation_id=uuid.uuid4(),
                       tenant_id=uuid.uuid4(), labels=labels)


def test_envelope_headers_carry_message_id_type_and_trace_context():
    env = Envelope(id=uuid.uuid4(), type="billing.meter_started", schema_version=1, occurred_at=utcnow(),
                   correlation_id="a", traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01", data={})
    h = env.headers()
    assert h["Nats-Msg-Id"] == str(env.id) and h["Tessera-Type"] == env.type and h["traceparent"] == env.traceparent


def test_envelope_rejects_unknown_fields():
    with pytest.raises(ValidationError):
        Envelope.model_validate({"id": str(uuid.uuid4()), "type": "x", "schema_version": 1, "occurred_at": "2026-01-01T00:00:00Z",
                                 "correlation_id": "c", "data": {}, "sneaky": 1})


def test_fault_label_applies_only_to_its_step_and_only_when_enabled():
    labels = {FAULT_LABEL: "attach_network=fail, provision_node=timeout"}
    assert injected_fault(cmd("attach_network", labels), enabled=True) == "fail"
    assert injected_fault(cmd("provision_node", labels), enabled=True) == "timeout"
    assert injected_fault(cmd("reserve_slots", labels), enabled=True) is None
    assert injected_fault(cmd("attach_network", labels), enabled=False) is None
    assert injected_fault(cmd("attach_network", {FAULT_LABEL: "attach_network=explode"}), enabled=True) is None


def test_service_dsn_swaps_in_the_services_own_role():
    dsn = service_dsn("postgresql://postgres:pw@127.0.0.1:5432/tessera", "billing", "s3cret")
    assert dsn.startswith(f"postgresql://{role_name('billing')}:") and dsn.endswith("@127.0.0.1:5432/tessera")
    assert "pw@" not in dsn


def test_every_stream_is_file_backed_with_a_duplicate_window():
    configs = stream_configs()
    assert DEAD_LETTER_STREAM in {c.name for c in configs}
    for c in configs:
        assert c.storage.value == "file" and c.duplicate_window >= 60


def test_a_bad_setting_is_refused_naming_the_variable(monkeypatch):
    from shared.settings import ServiceSettings

    for name, value in [("TESSERA_HTTP_PORT", "eighty"), ("TESSERA_MAX_DELIVER", "0"),
                        ("TESSERA_RETRY_BACKOFF_S", "1,-2"), ("TESSERA_ACK_WAIT_S", "soon")]:
        with monkeypatch.context() as m:
            m.setenv(name, value)
            with pytest.raises(ValueError, match=name):
                ServiceSettings.from_env("billing")
