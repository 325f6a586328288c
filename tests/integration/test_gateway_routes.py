"""The route table as HTTP sees it: a method a path does not serve is a 405 (problem+json) whose Allow header lists
exactly the methods the document declares for that path, for every path of the route table (a literal path such as
/v1/policies/evaluate is not answered with the methods of a templated one, /v1/policies/{policy_id}, it also
matches)."""
from __future__ import annotations

import re
from collections import defaultdict

from services.gateway.entrypoints.http import ENDPOINTS

SOME_ID = "00000000-0000-4000-8000-000000000001"


def declared() -> dict[str, set[str]]:
    """Each path of the route table, its parameters filled in, and the methods declared for it."""
    out: dict[str, set[str]] = defaultdict(set)
    for e in ENDPOINTS:
        out[re.sub(r"\{[^}]+\}", SOME_ID, e.path)].add(e.method)
    return out


def allow(reply) -> set[str]:
    return {m.strip() for m in reply.headers.get("Allow", "").split(",") if m.strip()}


async def test_options_on_every_path_is_a_405_allowing_exactly_its_declared_methods(api):
    admin = await api.admin()
    wrong = []
    for path, methods in declared().items():
        r = await admin.call("OPTIONS", path)
        if r.status != 405 or r.content_type != "application/problem+json" or allow(r) != methods:
            wrong.append(f"{path}: {r.status} Allow={sorted(allow(r))}, declared {sorted(methods)}")
    assert wrong == []


async def test_a_method_a_literal_path_does_not_serve_is_not_answered_by_a_templated_path_matching_it(api):
    admin = await api.admin()
    for method in ("GET", "PUT", "DELETE"):
        r = await admin.call(method, "/v1/policies/evaluate")
        assert r.status == 405 and allow(r) == {"POST"}, (method, r.status, r.headers)
    r = await admin.call("OPTIONS", f"/v1/policies/{SOME_ID}")
    assert r.status == 405 and allow(r) == {m for e in ENDPOINTS if e.path == "/v1/policies/{policy_id}"
                                            for m in [e.method]}
