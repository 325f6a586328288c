"""Allocation commands the service can never apply (sent on the bus directly, bypassing the gateway's
validation): data PostgreSQL refuses, such as a NUL in an allocation's name. The command is answered
``allocation.command_rejected`` at once (acknowledged on its first delivery) and creates nothing."""
from __future__ import annotations

import uuid

from services.allocation.bootstrap import build
from shared.settings import BusSettings
from tests.integration.test_allocation import request_cmd, row
from tests.support.bus import caused_by, wait_acked
from tests.support.bus import send_command as send

SLOW_RETRIES = BusSettings(ack_wait_s=5, max_deliver=3, retry_backoff_s=[60.0])   # a retry: a minute later


async def test_a_request_named_with_a_nul_is_rejected_at_once_and_creates_nothing(run_service, nc, watch):
    rt = await run_service("allocation", build, bus=SLOW_RETRIES)
    js, events = nc.jetstream(), await watch("allocation.evt.>")
    alloc, tenant = uuid.uuid4(), uuid.uuid4()
    cmd, seq = await send(js, "allocation.request", request_cmd(alloc, tenant, name="train\x00"))
    [hit] = await events.wait_for(caused_by(cmd), 15)
    assert hit[1]["type"] == "allocation.command_rejected"
    assert (hit[1]["data"]["allocation_id"], hit[1]["data"]["command"]) == (str(alloc), "allocation.request")
    assert "CharacterNotInRepertoireError" in hit[1]["data"]["reason"]
    await wait_acked(js, "TESSERA_ALLOCATION", "allocation__allocation_request", seq, timeout=15)
    assert await row(rt, alloc) is None
