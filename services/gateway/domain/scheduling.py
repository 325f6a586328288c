"""The gateway's pure scheduling rules: priority classes, usable shapes, taints and the quota fast-fail (no I/O).

The fast-fail is only an early answer: the scheduler charges quotas atomically with the
reservation and remains the judge. The gateway refuses a request only when its read model
proves it cannot fit (every GPU model it could land on is over quota), never on a guess.
"""
from __future__ import annotations

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from services.scheduler.contracts import SHAPES

PRIORITY_CLASSES: dict[str, int] = {"low": -100, "normal": 0, "high": 100}
DEFAULT_POOL = "shared"
NIL = uuid.UUID(int=0)
# "key=value:NoSchedule" (a toleration) and "value:NoSchedule" (the value of a taint under its key)
TOLERATION = r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,126}[A-Za-z0-9])?=[A-Za-z0-9._-]{0,63}:NoSchedule$"
TAINT_VALUE = r"^[A-Za-z0-9._-]{0,63}:NoSchedule$"
VM_GPU_COUNTS = (1, 2, 4, 8)


def priority_class_of(priority: int) -> str | None:
    """The class name a priority came from; None for a value no class maps to."""
    return next((name for name, value in PRIORITY_CLASSES.items() if value == priority), None)


@dataclass(frozen=True)
class ShapeInfo:
    name: str
    kind: str
    gpu_count: int
    gpu_model: str | None = None
    mig_profile: str | None = None
    deleted: bool = False
    version: int | None = None   # None: a built-in default, not (yet) a scheduler document


BUILTIN_SHAPES: dict[str, ShapeInfo] = {
    name: ShapeInfo(name, "bare_metal" if name.startswith("bm.") else "vm", count) for name, count in SHAPES.items()}


def usable_shapes(catalog: Iterable[ShapeInfo]) -> dict[str, ShapeInfo]:
    """The shapes a tenant may ask for: the catalog's live ones; the built-in defaults while the
    catalog holds no document at all (a deleted shape is a document: it is not resurrected)."""
    catalog = list(catalog)
    if not catalog:
        return dict(BUILTIN_SHAPES)
    return {s.name: s for s in sorted(catalog, key=lambda s: s.name) if not s.deleted}


def shape_definition_errors(kind: str, gpu_count: int, mig_profile: str | None) -> list[tuple[str, str]]:
    """(field, message) for a shape definition the scheduler would refuse; empty when it is plausible."""
    errors = []
    if kind == "mig":
        if gpu_count != 1:
            errors.append(("gpu_count", "a mig shape is one instance on one GPU: gpu_count must be 1"))
        if not mig_profile:
            errors.append(("mig_profile", "a mig shape needs a mig_profile (e.g. 1g.10gb)"))
    elif mig_profile:
        errors.append(("mig_profile", "only a mig shape has a mig_profile"))
    if kind == "vm" and gpu_count not in VM_GPU_COUNTS:
        errors.append(("gpu_count", "a vm slice has 1, 2, 4 or 8 GPUs"))
    return errors


def valid_toleration(value: str) -> bool:
    return re.match(TOLERATION, value) is not None


@dataclass(frozen=True)
class QuotaRow:
    gpu_model: str
    user_id: uuid.UUID          # NIL for the tenant's own quota
    limit: int
    used: int


@dataclass(frozen=True)
class QuotaBreach:
    quota: str
    limit: int
    used: int
    requested: int


def quota_name(tenant_id: uuid.UUID, gpu_model: str, pool: str, user_id: uuid.UUID | None = None) -> str:
    """The scheduler's name for a quota (the same text its quota-exceeded failures carry)."""
    base = f"tenant {tenant_id} {gpu_model} in pool {pool}"
    return base if user_id in (None, NIL) else f"{base} for user {user_id}"


def _breach_for_model(rows: list[QuotaRow], tenant_id: uuid.UUID, user_id: uuid.UUID, pool: str, model: str,
                      requested: int) -> QuotaBreach | None:
    # the tenant's own quota is charged first, then the user's split, as the scheduler does
    for who in (NIL, user_id):
        row = next((r for r in rows if r.gpu_model == model and r.user_id == who), None)
        if row is not None and row.limit - row.used < requested:
            return QuotaBreach(quota_name(tenant_id, model, pool, who), row.limit, row.used, requested)
    return None


def quota_breach(rows: Iterable[QuotaRow], *, tenant_id: uuid.UUID, user_id: uuid.UUID, pool: str,
                 gpu_model: str | None, pool_models: Iterable[str], requested: int) -> QuotaBreach | None:
    """The quota that certainly refuses the request, or None when it may fit.

    ``rows``: the tenant's quota rows in ``pool`` (its own and the caller's split); no row means
    not limited. A shape naming a GPU model is checked against that model; a shape that fits any
    model is refused only when every model the pool has (``pool_models``) is over quota — and
    never when the pool's models are unknown. The first breach (by model name) is reported.
    """
    rows = list(rows)
    models = [gpu_model] if gpu_model else sorted(set(pool_models))
    if not models:
        return None
    breaches = []
    for model in models:
        breach = _breach_for_model(rows, tenant_id, user_id, pool, model, requested)
        if breach is None:
            return None
        breaches.append(breach)
    return breaches[0]
