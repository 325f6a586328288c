"""node_bmcs: each node's BMC, its password only sealed (asyncpg; the caller owns the transaction), and the
live check of a BMC by the node's agent (``node_agent.validate_bmc``: core NATS request/reply, nothing stored).

A removed BMC keeps its row, the BMC columns NULL, so the version (what the node-agent orders
``node_agent.set_bmc`` by) only grows."""
from __future__ import annotations

import uuid

import asyncpg
from nats.aio.client import Client

from services.node_agent.contracts import Bmc, BmcReport, ValidateBmc
from shared import rpc
from shared.contract import Catalog

_COLS = "node_id, url, system_id, username, password_sealed, verify_tls, ca_bundle, version, set_by, updated_at"


async def put(conn: asyncpg.Connection, node_id: uuid.UUID, bmc: Bmc, set_by: uuid.UUID) -> asyncpg.Record:
    """Register or replace the node's BMC; returns the row (its version raised)."""
    return await conn.fetchrow(
        "INSERT INTO node_bmcs (node_id, url, system_id, username, password_sealed, verify_tls, ca_bundle, version, "
        "set_by) VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8) ON CONFLICT (node_id) DO UPDATE SET url=EXCLUDED.url, "
        "system_id=EXCLUDED.system_id, username=EXCLUDED.username, password_sealed=EXCLUDED.password_sealed, "
        "verify_tls=EXCLUDED.verify_tls, ca_bundle=EXCLUDED.ca_bundle, version=node_bmcs.version + 1, "
        f"set_by=EXCLUDED.set_by, updated_at=now() RETURNING {_COLS}",
        node_id, bmc.url, bmc.system_id, bmc.username, bmc.password_sealed, bmc.verify_tls, bmc.ca_bundle, set_by)


async def get(conn: asyncpg.Connection, node_id: uuid.UUID) -> asyncpg.Record | None:
    """The node's registered BMC (None: none, or removed)."""
    return await conn.fetchrow(f"SELECT {_COLS} FROM node_bmcs WHERE node_id=$1 AND url IS NOT NULL", node_id)


async def remove(conn: asyncpg.Connection, node_id: uuid.UUID, set_by: uuid.UUID) -> int | None:
    """Forget the node's BMC; returns the new version (None: there was none)."""
    return await conn.fetchval(
        "UPDATE node_bmcs SET url=NULL, system_id=NULL, username=NULL, password_sealed=NULL, verify_tls=NULL, "
        "ca_bundle=NULL, version=version + 1, set_by=$2, updated_at=now() WHERE node_id=$1 AND url IS NOT NULL "
        "RETURNING version", node_id, set_by)


def wire(row: asyncpg.Record) -> Bmc:
    """The stored BMC as the node-agent takes it (the password still sealed)."""
    return Bmc(url=row["url"], system_id=row["system_id"], username=row["username"],
               password_sealed=row["password_sealed"], verify_tls=row["verify_tls"], ca_bundle=row["ca_bundle"])


async def validate(nc: Client, catalog: Catalog, node_id: uuid.UUID, bmc: Bmc, timeout_s: float) -> BmcReport:
    """Ask the node's agent to check ``bmc``. May wait ``timeout_s``; raises rpc.RpcNoResponders (no agent
    connected), rpc.RpcTimeout (no answer in time) or rpc.RpcError (the agent failed)."""
    return await rpc.request(nc, catalog, "gateway", "node_agent.validate_bmc", ValidateBmc(node_id=node_id, bmc=bmc),
                             timeout=timeout_s, node_id=str(node_id))
