"""Capacity shapes: anyone signed in lists them; provider admins define and delete them (through the scheduler)."""
from __future__ import annotations

from aiohttp import web

from services.scheduler.contracts import DefineShape

from ...adapters import inventory
from ...adapters.audit_state import StateReader, plain, select_object
from ...adapters.catalog import known_shapes
from ...domain.scheduling import ShapeInfo, shape_definition_errors
from ...http.auth import require_provider_admin
from ...http.endpoint import Endpoint, Param, respond
from ...http.inputs import path_value, read_body
from ...http.problems import ProblemError, not_found, validation_problem
from ...http.schema_base import FieldError, ShapeName
from ...http.state import gateway_of
from .shape_schemas import ShapeConflictProblem, ShapeDefinition, ShapeList, ShapeOut

SHAPE_NAME = Param("name", "path", "The shape's name (lower case, digits, '.' and '-').", ShapeName, required=True)


def shape_out(s: ShapeInfo, last_rejection: dict | None = None) -> ShapeOut:
    return ShapeOut(name=s.name, kind=s.kind, gpu_count=s.gpu_count, gpu_model=s.gpu_model, mig_profile=s.mig_profile,
                    deleted=s.deleted, version=s.version, last_rejection=last_rejection)


async def list_shapes(request: web.Request) -> web.Response:
    async with gateway_of(request).pool.acquire() as conn:
        known = await known_shapes(conn)
        rejections = await inventory.shape_rejections(conn)
    return respond(ShapeList(items=[shape_out(s, rejections.get(s.name)) for s in known.values()]))


async def define_shape(request: web.Request) -> web.Response:
    require_provider_admin(request)
    name = path_value(request, SHAPE_NAME)
    body = await read_body(request, ShapeDefinition)
    errors = shape_definition_errors(body.kind, body.gpu_count, body.mig_profile)
    if errors:
        raise validation_problem([FieldError(field=f, message=m, code="shape_rule") for f, m in errors])
    command = DefineShape(name=name, **body.model_dump())
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.define_shape") as uow:
        await uow.emit("scheduler.define_shape", command, correlation_id=f"shape:{name}")
    return respond(shape_out(ShapeInfo(name, body.kind, body.gpu_count, body.gpu_model, body.mig_profile)), 202)


class ShapeConflict(ProblemError):
    """409 naming how many live allocations use the shape (0: it is the platform's last shape)."""

    def __init__(self, detail: str, allocations: int, slug: str):
        super().__init__(409, detail, slug=slug)
        self.allocations = allocations

    def to_problem(self, instance: str | None = None) -> ShapeConflictProblem:
        return ShapeConflictProblem(**super().to_problem(instance).model_dump(), allocations=self.allocations)


def deletion_conflict(name: str, live: set[str], users: int) -> ShapeConflict | None:
    """Why shape ``name`` may not be deleted, given the live shapes and how many live allocations use it."""
    if users:
        return ShapeConflict(f"shape {name!r} is used by {users} allocation(s); delete it once they are released",
                             users, "shape-in-use")
    if live <= {name}:
        return ShapeConflict(f"shape {name!r} is the platform's last shape; define another before deleting it", 0,
                             "last-shape")
    return None


async def delete_shape(request: web.Request) -> web.Response:
    """202 and a define_shape(deleted) for a live shape; 404 for one that is unknown or already deleted.

    A shape in use cannot be deleted, nor the platform's last shape: 409 (``ShapeConflictProblem``, naming
    how many live allocations use it, i.e. any not RELEASED or FAILED, of any tenant). This answer comes
    from the gateway's read models, at once; the scheduler decides for good when it executes the command:
    an allocation placed or queued meanwhile makes it refuse (``scheduler.admin_command_rejected``, shown
    as the shape's ``last_rejection``), and a request for the shape after the deletion fails
    ``unknown-shape``. Running allocations are never touched: once they are released, the deletion works.
    """
    require_provider_admin(request)
    name = path_value(request, SHAPE_NAME)
    gw = gateway_of(request)
    async with gw.unit_of_work("gateway.delete_shape") as uow:
        conn = uow.conn
        known = await known_shapes(conn)
        shape = known.get(name)
        if shape is None:
            raise not_found("shape")
        conflict = deletion_conflict(name, set(known), await inventory.shape_users(conn, name))
        if conflict is not None:
            raise conflict
        await uow.emit("scheduler.define_shape", DefineShape(
            name=name, kind=shape.kind, gpu_count=shape.gpu_count, gpu_model=shape.gpu_model,
            mig_profile=shape.mig_profile, deleted=True), correlation_id=f"shape:{name}")
    return respond(shape_out(ShapeInfo(name, shape.kind, shape.gpu_count, shape.gpu_model, shape.mig_profile,
                                       deleted=True, version=shape.version)), 202)


_SHAPE = StateReader(select_object("shapes_view", "name = $1", "kind", "gpu_count", "gpu_model", "mig_profile",
                                   "deleted", "version"), plain("name"))


ENDPOINTS = [
    Endpoint("GET", "/v1/shapes", list_shapes, "listShapes", "List the capacity shapes a tenant may ask for", "shapes",
             {200: ShapeList}, errors=(401,),
             description="Any signed-in caller. While the scheduler has published no shape, the built-in defaults."),
    Endpoint("PUT", "/v1/shapes/{name}", define_shape, "defineShape", "Define a capacity shape (provider admin)",
             "shapes", {202: ShapeOut}, body=ShapeDefinition, params=(SHAPE_NAME,),
             errors=(400, 401, 403, 413, 415, 422),
             description="Sent to the scheduler; GET /v1/shapes shows it once applied (a refusal is kept as "
                         "last_rejection).",
             audit_state=_SHAPE),
    Endpoint("DELETE", "/v1/shapes/{name}", delete_shape, "deleteShape", "Delete a capacity shape (provider admin)",
             "shapes", {202: ShapeOut}, params=(SHAPE_NAME,), errors=(401, 403, 404, 409, 422),
             problems={409: (ShapeConflictProblem,)},
             description="New requests for it are refused. 409 (naming how many live allocations use it) while "
                         "allocations use it, or when it is the platform's last shape; the scheduler checks "
                         "again when it applies the deletion (a refusal is kept as last_rejection).",
             audit_state=_SHAPE),
]
