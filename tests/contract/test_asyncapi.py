"""The committed AsyncAPI documents are the generated ones, valid for the real AsyncAPI parser,
describe the envelopes the code really sends, and the service code uses only what the contracts declare."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from shared.contract import SERVICES, load_catalog
from tooling import asyncapi

from .code_scan import scan_services, scan_source
from .examples import example, example_envelope

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "contracts" / "asyncapi"
PARSER_DIR = Path(__file__).parent / "asyncapi_parser"
CATALOG = load_catalog()
REGENERATE = "run `python -m tooling.asyncapi` and commit contracts/asyncapi/"


def _documents() -> dict[str, dict]:
    return {s: yaml.safe_load((DOCS / f"{s}.yaml").read_text()) for s in SERVICES}


# --- (1) committed == generated -------------------------------------------------------------------

def test_committed_asyncapi_documents_equal_the_generated_ones():
    problems = asyncapi.differences(DOCS)
    assert not problems, f"AsyncAPI documents are out of date; {REGENERATE}:\n" + "\n".join(problems)


def test_check_mode_reports_an_edited_and_a_stale_document(tmp_path, capsys):
    asyncapi.write(tmp_path)
    assert asyncapi.main(["--check", "--dir", str(tmp_path)]) == 0
    edited = tmp_path / "billing.yaml"
    edited.write_text(edited.read_text().replace("billing.meter_started", "billing.meter_begun", 1))
    (tmp_path / "ghost.yaml").write_text("asyncapi: 3.0.0\n")
    assert asyncapi.main(["--check", "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "billing.yaml" in out and "ghost.yaml" in out and "python -m tooling.asyncapi" in out


def test_generation_is_deterministic():
    assert asyncapi.generate() == asyncapi.generate()


def test_document_has_a_channel_and_operation_for_everything_the_service_owns_receives_and_sends():
    for service, doc in _documents().items():
        contract = CATALOG.contracts[service]
        expected = {m.type for m in contract.messages} | set(contract.receives) | set(contract.sends)
        replies = {f"{t}.reply" for t in expected if CATALOG.message(t).kind == "request"}   # the requester's inbox
        assert set(doc["channels"]) == expected | replies
        assert set(doc["components"]["messages"]) == expected | replies
        ops = {(op["action"], op["channel"]["$ref"].rsplit("/", 1)[1]) for op in doc["operations"].values()}
        owned_events = {("send", m.type) for m in contract.messages if m.kind == "event"}
        assert ops == owned_events | {("send", t) for t in contract.sends} | {("receive", t) for t in contract.receives}
        for type_, ch in doc["channels"].items():
            if type_ in replies:
                assert ch["address"] is None
                continue
            msg = CATALOG.message(type_)
            assert ch["address"] == msg.subject
            assert sorted(ch.get("parameters", {})) == sorted(msg.params)
        assert doc["servers"]["nats"]["protocol"] == "nats"


# --- (2) the real AsyncAPI parser -----------------------------------------------------------------

def _node_parser() -> list[str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.fail("Node.js 20+ and npm are required to run the AsyncAPI parser "
                    "(Debian: `apt-get install nodejs npm`); this test is not skipped on purpose.")
    if not (PARSER_DIR / "node_modules" / "@asyncapi" / "parser").is_dir():
        done = subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=PARSER_DIR,
                              check=False, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"npm ci failed in {PARSER_DIR}:\n{done.stdout}\n{done.stderr}"
    return [node, str(PARSER_DIR / "validate.mjs")]


def _parse(files: list[Path]) -> tuple[int, list[dict]]:
    done = subprocess.run(_node_parser() + [str(f) for f in files], check=False, capture_output=True, text=True, timeout=300)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"validate.mjs printed no JSON (rc={done.returncode}):\n{done.stdout}\n{done.stderr}")


def test_every_document_passes_the_real_asyncapi_parser_without_errors_or_warnings():
    rc, results = _parse([DOCS / f"{s}.yaml" for s in SERVICES])
    complaints = [(r["file"], d) for r in results for d in r["diagnostics"] if d["severity"] in ("error", "warning")]
    assert rc == 0 and not complaints, json.dumps(complaints, indent=1)
    assert len(results) == len(SERVICES) and all(r["valid"] for r in results)


def test_the_asyncapi_parser_rejects_an_operation_on_an_undeclared_channel(tmp_path):
    doc = yaml.safe_load((DOCS / "billing.yaml").read_text())
    next(iter(doc["operations"].values()))["channel"] = {"$ref": "#/channels/billing.nowhere"}
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(doc))
    rc, results = _parse([broken])
    assert rc != 0
    assert not results[0]["valid"] and any(d["severity"] == "error" for d in results[0]["diagnostics"])


# --- (3) message schemas accept real envelopes ----------------------------------------------------

def _payload_validator(service: str, doc: dict, type_: str, part: str = "payload") -> jsonschema.Validator:
    uri = f"urn:tessera:asyncapi:{service}"
    registry = Registry().with_resource(uri, Resource(contents=doc, specification=DRAFT7))
    schema = {"$ref": f"{uri}#/components/messages/{type_}/{part}"}
    return jsonschema.Draft7Validator(schema, registry=registry, format_checker=jsonschema.FormatChecker())


CASES = [(s, t) for s in SERVICES for t in sorted(
    {m.type for m in CATALOG.contracts[s].messages} | set(CATALOG.contracts[s].receives) | set(CATALOG.contracts[s].sends))]


@pytest.fixture(scope="module")
def documents() -> dict[str, dict]:
    return _documents()


@pytest.mark.parametrize(("service", "type_"), CASES, ids=[f"{s}:{t}" for s, t in CASES])
def test_message_schema_accepts_the_envelope_the_outbox_builds(documents, service, type_):
    msg = CATALOG.message(type_)
    if msg.kind == "request":   # no envelope: the bare request, and its reply
        for part, model, suffix in (("payload", msg.model, ""), ("payload", msg.reply, ".reply")):
            validator = _payload_validator(service, documents[service], type_ + suffix, part)
            assert not list(validator.iter_errors(example(model).model_dump(mode="json")))
        return
    env = example_envelope(CATALOG, type_)
    payload = _payload_validator(service, documents[service], type_)
    errors = [e.message for e in payload.iter_errors(env.model_dump(mode="json"))]
    assert not errors, f"{service} document rejects a real {type_} envelope: {errors}"
    headers = _payload_validator(service, documents[service], type_, "headers")
    assert not list(headers.iter_errors(env.headers()))


@pytest.mark.parametrize(("service", "type_"), CASES, ids=[f"{s}:{t}" for s, t in CASES])
def test_message_schema_rejects_a_broken_envelope(documents, service, type_):
    if CATALOG.message(type_).kind == "request":
        good = example(CATALOG.message(type_).model).model_dump(mode="json")
        payload = _payload_validator(service, documents[service], type_)
        assert not payload.is_valid({**good, "unexpected_field": 1})
        required = CATALOG.message(type_).model.model_json_schema().get("required", [])
        assert not payload.is_valid({k: v for k, v in good.items() if k != required[0]})
        return
    good = example_envelope(CATALOG, type_).model_dump(mode="json")
    payload = _payload_validator(service, documents[service], type_)
    first_required = documents[service]["components"]["messages"][type_]["payload"]["properties"]["data"]["required"][0]
    missing = {**good, "data": {k: v for k, v in good["data"].items() if k != first_required}}
    extra = {**good, "data": {**good["data"], "unexpected_field": 1}}
    other_type = {**good, "type": "billing.not_a_type"}
    bad_id = {**good, "id": "not-a-uuid"}
    for broken in (missing, extra, other_type, bad_id):
        assert not payload.is_valid(broken), f"{type_} schema accepted {broken}"


# --- (4) the code uses only what the contracts declare --------------------------------------------

USES = scan_services(ROOT)


def test_every_message_type_named_in_service_code_exists_in_the_catalog():
    unknown = [f"{u.where()}: {u.type}" for u in USES if u.type not in CATALOG.by_type]
    assert not unknown, "message types used in code but defined by no contract:\n" + "\n".join(unknown)


def test_every_message_type_a_service_handles_is_in_its_receives():
    undeclared = [f"{u.where()}: {u.service} handles {u.type}" for u in USES
                  if u.role == "handles" and u.type not in CATALOG.contracts[u.service].receives]
    assert not undeclared, "handled but not in the service's receives:\n" + "\n".join(undeclared)


def test_every_message_type_a_service_emits_is_owned_by_it_or_a_command_in_its_sends():
    def allowed(service: str, type_: str) -> bool:
        if type_ not in CATALOG.by_type:
            return True  # reported by the catalog test above
        owner, msg = CATALOG.owner(type_), CATALOG.message(type_)
        return owner.service == service or (msg.kind == "command" and type_ in CATALOG.contracts[service].sends)
    refused = [f"{u.where()}: {u.service} emits {u.type}" for u in USES if u.role == "emits" and not allowed(u.service, u.type)]
    assert not refused, "emitted outside the service's contract:\n" + "\n".join(refused)


def test_code_scan_finds_the_billing_template_call_sites():
    billing = {(u.role, u.type) for u in USES if u.service == "billing"}
    assert {("handles", "billing.start_meter"), ("handles", "billing.stop_meter"), ("emits", "billing.meter_started"),
            ("emits", "billing.meter_start_failed"), ("emits", "billing.meter_stopped")} <= billing


def test_code_scan_sees_every_call_shape_that_takes_a_message_type():
    source = '''
rt.consumers.subscribe("a.handled", handler)
await ctx.emit("a.emitted", model)
await outbox.add(conn, "a.added", model, correlation_id="c")
seen.add("not.a.message")
'''
    uses = {(u.role, u.type) for u in scan_source(source, service="a", path="x.py")}
    assert uses == {("handles", "a.handled"), ("emits", "a.emitted"), ("emits", "a.added")}


def test_code_scan_reads_the_steps_a_call_names_from_their_declarations():
    source = '''
rt.consumers.participate(c.RESERVE_SLOTS, invoke=reserve, undo=release)
await participant.defer(ctx, c.RESERVE_SLOTS, cmd, progress)
await participant.finish(ctx, RESERVE_SLOTS, cmd, "done", result)
await undo(ctx, cmd, act, step=c.RESERVE_SLOTS)
'''
    uses = {(u.role, u.type) for u in scan_source(source, service="scheduler", path="x.py")}
    assert uses == {("handles", "scheduler.reserve_slots"), ("handles", "scheduler.release_slots"),
                    ("emits", "scheduler.reservation_queued"), ("emits", "scheduler.slots_reserved"),
                    ("emits", "scheduler.slot_reservation_failed"), ("emits", "scheduler.slots_released")}


# --- (5) each contract stays in its own namespace -------------------------------------------------

@pytest.mark.parametrize("service", SERVICES)
def test_contract_declares_only_its_own_subjects_and_known_receives_and_sends(service):
    contract = CATALOG.contracts[service]
    assert contract.service == service
    for m in contract.messages:
        assert m.type.startswith(f"{service}."), f"{m.type} is declared by {service}"
        assert m.subject.startswith(f"{service}."), f"{m.type}: subject {m.subject} is outside {service}.>"
        infix = {"command": ".cmd.", "event": ".evt.", "request": ".rpc."}[m.kind]
        assert m.subject.startswith(service + infix), f"{m.type}: a {m.kind} subject should start {service}{infix}"
    unknown = [t for t in contract.receives + contract.sends if t not in CATALOG.by_type]
    assert not unknown, f"{service} names undefined message types: {unknown}"
    foreign_sends = [t for t in contract.sends
                     if CATALOG.message(t).kind not in ("command", "request") or CATALOG.owner(t).service == service]
    assert not foreign_sends, f"{service}.sends must list other services' commands and requests only: {foreign_sends}"
    assert len(set(contract.receives)) == len(contract.receives) and len(set(contract.sends)) == len(contract.sends)

