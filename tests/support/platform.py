"""The whole platform as the e2e and chaos tests run it: its settings, and what a test checks in every
service's schema once an allocation is gone."""
from __future__ import annotations

import uuid

import asyncpg

E2E_ENV = {
    "TESSERA_SIM_FAULTS": "1",                 # honour the sim fault label (never set in production)
    "TESSERA_SAGA_STEP_TIMEOUT_S": "4",
    "TESSERA_SAGA_STEP_TIMEOUTS": "provision_node=4",   # sim nodes: no VM boots here (tests/e2e/test_vm_slices.py)
    "TESSERA_SAGA_COMPENSATION_TIMEOUT_S": "3",
    "TESSERA_SAGA_BACKOFF_S": "0.2,0.5,1",
    "TESSERA_ACK_WAIT_S": "10",
    "TESSERA_RETRY_BACKOFF_S": "0.1,0.3,1",
    "TESSERA_LOG_LEVEL": "INFO",
    "TESSERA_SCHEDULER_PREEMPTION_GRACE_S": "1",   # the preemption notice's grace period
    "TESSERA_SCHEDULER_STATS_S": "2",              # the figures a spot offering follows, every 2 s
    "TESSERA_STORAGE_USAGE_INTERVAL_S": "1",       # volumes' usage read from the storage systems every second
    "TESSERA_BILLING_CUT_S": "1",                  # running meters cut into usage records every second
    "TESSERA_BILLING_INVOICE_TICK_S": "0.5",       # changed invoices published twice a second
}


# what leftovers() answers once nothing is held
NOTHING_LEFT = {"slots": 0, "attachments": 0, "volumes": 0, "volume_attachments": 0, "instances": 0, "running_meters": 0}


async def leftovers(db: asyncpg.Connection, allocation_id: str) -> dict[str, int]:
    """What any service still holds for an allocation (all zero after release or compensation)."""
    aid = uuid.UUID(allocation_id)
    return {
        "slots": await db.fetchval("SELECT count(*) FROM scheduler.slots WHERE allocation_id=$1", aid),
        "attachments": await db.fetchval("SELECT count(*) FROM network.attachments WHERE allocation_id=$1", aid),
        "volumes": await db.fetchval("SELECT count(*) FROM storage.volumes WHERE allocation_id=$1 "
                                     "AND state NOT IN ('deleted', 'rejected')", aid),
        "volume_attachments": await db.fetchval("SELECT count(*) FROM storage.attachments WHERE allocation_id=$1",
                                                aid),
        "instances": await db.fetchval("SELECT count(*) FROM node_agent.instances WHERE allocation_id=$1", aid),
        "running_meters": await db.fetchval("SELECT count(*) FROM billing.meters WHERE allocation_id=$1 "
                                            "AND stopped_at IS NULL", aid),
    }
