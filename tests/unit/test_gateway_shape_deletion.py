"""The gateway's early answer to DELETE /v1/shapes/{name} (no I/O): a shape live allocations use, or the platform's
last shape, is a 409 problem naming how many allocations use it. (With I/O: tests/integration/test_gateway_scheduling.py;
the scheduler's authoritative refusal: tests/integration/test_scheduler_shapes.py.)"""
from __future__ import annotations

from services.gateway.api.inventory.shape_schemas import ShapeConflictProblem
from services.gateway.api.inventory.shapes import deletion_conflict


def test_a_shape_in_use_is_a_409_naming_the_count():
    conflict = deletion_conflict("vm.2gpu", {"vm.1gpu", "vm.2gpu"}, 3)
    problem = conflict.to_problem("/v1/shapes/vm.2gpu")
    assert conflict.status == 409 and isinstance(problem, ShapeConflictProblem)
    assert problem.type.endswith("/shape-in-use") and problem.allocations == 3 and "3 allocation(s)" in problem.detail


def test_the_last_shape_is_a_409_even_unused():
    problem = deletion_conflict("vm.1gpu", {"vm.1gpu"}, 0).to_problem()
    assert problem.type.endswith("/last-shape") and problem.allocations == 0 and "last shape" in problem.detail


def test_an_unused_shape_among_others_may_go():
    assert deletion_conflict("vm.2gpu", {"vm.1gpu", "vm.2gpu"}, 0) is None
