"""`tessera tenant create --weight` and `tessera tenant set-weight`: the bodies they send, the range they check."""
from __future__ import annotations

from typer.testing import CliRunner

from cli.commands import ops


class FakeClient:
    def __init__(self):
        self.calls: list[tuple] = []

    def request(self, method, path, body=None, **_):
        self.calls.append((method, path, body))
        return {"id": "t1", "name": "acme", "weight": (body or {}).get("weight", 1)}


def _install(monkeypatch) -> FakeClient:
    c = FakeClient()
    monkeypatch.setattr(ops, "client", lambda: c)
    return c


def test_create_sends_the_weight_only_when_given_and_set_weight_patches_it(monkeypatch):
    api, runner = _install(monkeypatch), CliRunner()
    assert runner.invoke(ops.tenant_app, ["create", "acme"]).exit_code == 0
    assert runner.invoke(ops.tenant_app, ["create", "big", "--weight", "4"]).exit_code == 0
    r = runner.invoke(ops.tenant_app, ["set-weight", "t1", "3"])
    assert r.exit_code == 0, r.output
    assert "weight 3" in r.output
    assert api.calls == [("POST", "/v1/tenants", {"name": "acme"}), ("POST", "/v1/tenants", {"name": "big", "weight": 4}),
                         ("PATCH", "/v1/tenants/t1", {"weight": 3})]


def test_a_weight_outside_1_to_100_is_refused_before_anything_is_sent(monkeypatch):
    api, runner = _install(monkeypatch), CliRunner()
    for args in (["set-weight", "t1", "0"], ["set-weight", "t1", "101"], ["create", "x", "--weight", "0"]):
        r = runner.invoke(ops.tenant_app, args)
        assert r.exit_code == 2, (args, r.output)
    assert api.calls == []
