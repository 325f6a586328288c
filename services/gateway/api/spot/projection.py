"""Spot offerings as the paas service publishes them: spot_offerings_view, fed by paas.spot_offering_changed (in
the consumer's transaction, inbox-deduped; the highest version wins)."""
from __future__ import annotations

from services.paas import contracts as pc
from shared.unit_of_work import UnitOfWork

from ...adapters import spot as repo


async def on_spot_offering_changed(ctx: UnitOfWork, data: pc.SpotOfferingChanged) -> None:
    await repo.store_newer(ctx.conn, data.pool, data.model_dump_json(), data.version)
