"""The answer to ``saga.read_steps``: an allocation's sagas and when each step ran. A read: nothing is
changed, locked or published."""
from __future__ import annotations

from shared.runtime import Runtime

from ..adapters import timeline as store
from ..contracts import AllocationSagas, ReadSteps
from ..domain.timeline import saga_steps


async def read_steps(rt: Runtime, req: ReadSteps) -> AllocationSagas:
    """Every saga of ``req.allocation_id``, oldest first (none: an empty list, the caller decides whether the
    allocation exists)."""
    async with rt.pool.acquire() as conn:
        sagas = await store.read(conn, req.allocation_id)
    return AllocationSagas.model_validate({"items": [saga_steps(saga, records) for saga, records in sagas]})
