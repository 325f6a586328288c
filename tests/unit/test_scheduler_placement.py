"""First-fit placement and node registration rules (pure domain, no I/O)."""
from __future__ import annotations

import uuid

import pytest

from services.scheduler.domain.model import (
    NodeConflict,
    NodeSpec,
    NodeView,
    Placement,
    check_reregistration,
    first_fit,
    shortfall,
)


def node(name: str, free, *, cordoned: bool = False, model: str = "H100") -> NodeView:
    return NodeView(uuid.uuid4(), name, model, tuple(free), cordoned)


def test_first_fit_takes_the_first_node_by_name_not_by_list_order():
    b, a = node("node-b", range(8)), node("node-a", range(8))
    assert first_fit([b, a], 2) == Placement(a.id, "H100", (0, 1))


def test_first_fit_takes_the_lowest_free_indices_of_the_node():
    n = node("n1", [7, 3, 5, 1])
    assert first_fit([n], 3).slots == (1, 3, 5)


def test_first_fit_skips_nodes_without_enough_free_slots_and_never_splits_across_nodes():
    small1, small2, big = node("a", [0]), node("b", [4]), node("c", [0, 1])
    p = first_fit([small1, small2, big], 2)
    assert p.node_id == big.id and p.slots == (0, 1)


def test_first_fit_skips_cordoned_nodes():
    cordoned, open_ = node("a", range(8), cordoned=True), node("b", range(8), model="A100")
    assert first_fit([cordoned, open_], 8) == Placement(open_.id, "A100", tuple(range(8)))


def test_first_fit_returns_none_when_no_single_node_has_enough():
    assert first_fit([node("a", [0, 1]), node("b", [2, 3])], 3) is None
    assert first_fit([], 1) is None


def test_first_fit_after_a_name_only_considers_later_nodes():
    a, b = node("a", range(4)), node("b", range(4))
    assert first_fit([a, b], 1, after="a").node_id == b.id
    assert first_fit([a, b], 1, after="b") is None


def test_first_fit_rejects_a_non_positive_gpu_count():
    with pytest.raises(ValueError):
        first_fit([node("a", [0])], 0)


def test_shortfall_names_what_was_asked_and_the_best_available():
    reason = shortfall([node("a", [0, 1]), node("b", range(8), cordoned=True)], 4, "vm.4gpu")
    assert reason.startswith("no capacity:")
    assert "4 free GPU slot(s)" in reason and "vm.4gpu" in reason
    assert "1 schedulable node(s), at most 2 free" in reason


def test_reregistering_the_same_spec_is_accepted():
    spec = NodeSpec(uuid.uuid4(), "n1", "H100", 8, {"rack": "r1"})
    check_reregistration(spec, NodeSpec(spec.id, "n1", "H100", 8, {"rack": "r1"}))


def test_reregistering_with_another_spec_names_the_differences():
    spec = NodeSpec(uuid.uuid4(), "n1", "H100", 8)
    with pytest.raises(NodeConflict) as err:
        check_reregistration(spec, NodeSpec(spec.id, "n1", "H100", 4))
    assert "gpu_count: 8 != 4" in str(err.value)
