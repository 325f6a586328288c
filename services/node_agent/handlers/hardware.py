"""The node's hardware lifecycle besides the wipe (``wipe``): the burn-in before hand-off, and the node's BMC
(register, validate, and the one the redfish driver drives).

The BMC password arrives sealed and is unsealed only to call the BMC; it is never logged.
"""
from __future__ import annotations

import asyncio
import time

import asyncpg
import structlog

from shared.envelope import utcnow
from shared.refusals import PermanentError
from shared.secrets import SecretError, unseal
from shared.unit_of_work import UnitOfWork

from .. import contracts as c
from ..adapters.drivers.redfish.bmc import BmcConfig, BmcError
from ..adapters.drivers.redfish.bmc import validate as validate_bmc_call
from .node import Node

log = structlog.get_logger()


async def burn_in(ctx: UnitOfWork, cmd: c.RunBurnIn, *, node: Node) -> None:
    """Run the node's burn-in checks (blocking: in a thread) and answer burn_in_finished."""
    if cmd.node_id != node.id:
        raise PermanentError(f"burn-in for node {cmd.node_id} arrived at node {node.id}")
    started = time.perf_counter()
    checks = await asyncio.to_thread(node.burn_in.run)
    passed = all(ch.ok for ch in checks)
    (log.info if passed else log.warning)("node_agent.burn_in", run_id=str(cmd.run_id), checker=node.burn_in.name,
                                          passed=passed, failed=[ch.name for ch in checks if not ch.ok])
    await ctx.emit("node_agent.burn_in_finished", c.BurnInFinished(
        node_id=node.id, run_id=cmd.run_id, passed=passed, duration_s=round(time.perf_counter() - started, 3),
        checks=[c.BurnInCheck(name=ch.name, ok=ch.ok, detail=ch.detail[:2000]) for ch in checks], at=utcnow()),
        subject_params=node.subject_params)


async def set_bmc(ctx: UnitOfWork, cmd: c.SetBmc, *, node: Node) -> None:
    """Keep the node's BMC (the highest version wins)."""
    if cmd.node_id != node.id:
        raise PermanentError(f"BMC for node {cmd.node_id} arrived at node {node.id}")
    kept = await node.records(ctx.conn).keep_bmc(cmd)
    log.info("node_agent.bmc_set", version=cmd.version, kept=kept, removed=cmd.bmc is None,
             url=cmd.bmc.url if cmd.bmc else None)


def bmc_config(node: Node, bmc: c.Bmc) -> BmcConfig:
    """The BMC with its password unsealed; raises SecretError (no key, or a value sealed with another)."""
    if node.secret_key is None:
        raise SecretError("no platform key on this node (TESSERA_SECRET_KEY or TESSERA_SECRET_KEY_FILE)")
    return BmcConfig(bmc.url, bmc.system_id, bmc.username, unseal(bmc.password_sealed, node.secret_key, f"bmc:{node.id}"),
                     bmc.verify_tls, bmc.ca_bundle)


async def stored_bmc(node: Node, pool: asyncpg.Pool) -> BmcConfig | None:
    """The redfish driver's BMC: the one registered for this node (None: none)."""
    async with pool.acquire() as conn:
        bmc = await node.records(conn).bmc()
    return bmc_config(node, bmc) if bmc is not None else None


async def validate_bmc(node: Node, req: c.ValidateBmc) -> c.BmcReport:
    """Reach the BMC with the given credentials: its power state, model and serial, or what it answered."""
    started = time.perf_counter()
    try:
        if req.node_id != node.id:
            raise BmcError("refused", f"validation for node {req.node_id} arrived at node {node.id}")
        facts = await asyncio.to_thread(validate_bmc_call, bmc_config(node, req.bmc))
    except SecretError as exc:
        return c.BmcReport(ok=False, error_kind="refused", error=str(exc), elapsed_s=_since(started))
    except BmcError as exc:
        return c.BmcReport(ok=False, error_kind=exc.kind, error=str(exc)[:2000], elapsed_s=_since(started))
    return c.BmcReport(ok=True, power_state=facts.get("power_state"), model=facts.get("model"),
                       manufacturer=facts.get("manufacturer"), serial=facts.get("serial"), elapsed_s=_since(started))


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)


__all__ = ["bmc_config", "burn_in", "set_bmc", "stored_bmc", "validate_bmc"]
