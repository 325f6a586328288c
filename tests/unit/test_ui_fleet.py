"""The fleet map's cells and the dashboard's HTML escaping."""
from __future__ import annotations

import uuid

from services.gateway.ui import fleet
from services.gateway.ui.render import CSP, render

T1, T2 = uuid.uuid4(), uuid.uuid4()


def node(**over) -> dict:
    n = {"id": uuid.uuid4(), "gpu_count": 8, "cordoned": False, "health": "healthy", "draining": False,
         "status": "schedulable"}
    n.update(over)
    return n


def alloc(tenant, gpus: int, state: str = "ACTIVE") -> dict:
    return {"id": uuid.uuid4(), "tenant_id": tenant, "gpu_count": gpus, "state": state}


def kinds(cells) -> list[str]:
    return [c.kind for c in cells]


def test_allocated_slots_take_their_tenants_colour_then_wiping_quarantined_and_free_fill_the_node():
    cells = fleet.cells(node(), [alloc(T1, 2), alloc(T2, 1, "RELEASING")], 1, {T1: "acme"})
    assert kinds(cells) == [fleet.tenant_colour(T1)] * 2 + ["wiping", "quarantined"] + ["free"] * 4
    assert "acme" in cells[0].title


def test_idle_slots_show_why_they_are_not_free():
    assert set(kinds(fleet.cells(node(cordoned=True), [], 0, {}))) == {"cordoned"}
    assert set(kinds(fleet.cells(node(health="unreachable"), [], 0, {}))) == {"unhealthy"}
    assert set(kinds(fleet.cells(node(draining=True), [], 0, {}))) == {"unhealthy"}
    assert set(kinds(fleet.cells(node(status="pending_approval"), [], 0, {}))) == {"offline"}


def test_a_node_never_shows_more_cells_than_it_has_gpus():
    assert len(fleet.cells(node(gpu_count=4), [alloc(T1, 8)], 2, {})) == 4


def test_a_tenants_colour_is_stable_and_in_the_palette():
    assert fleet.tenant_colour(T1) == fleet.tenant_colour(uuid.UUID(str(T1)))
    assert fleet.tenant_colour(T1) in {f"t{i}" for i in range(fleet.PALETTE)}


def test_values_are_escaped_in_every_template():
    html = render("error.html", title="<b>x</b>", detail='"><script>alert(1)</script>', nav=[], who=None)
    assert "<script>alert" not in html and "&lt;script&gt;" in html and "<b>x</b>" not in html


def test_the_csp_allows_no_inline_code_and_nothing_from_elsewhere():
    assert "'unsafe-inline'" not in CSP and "default-src 'none'" in CSP and "frame-ancestors 'none'" in CSP


def test_no_template_needs_unsafe_inline():
    import re

    from services.gateway.ui.render import TEMPLATES
    for path in TEMPLATES.glob("*.html"):
        text = path.read_text()
        assert " style=" not in text, path
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), path
        assert not re.search(r"\son[a-z]+=", text), path
