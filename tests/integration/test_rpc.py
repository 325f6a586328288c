"""Request/reply over the real nats-server (shared.rpc): a request nobody serves is told at once (no responders),
one whose responder stays silent waits out its timeout; both are RpcUnavailable, each as its own kind."""
from __future__ import annotations

import uuid

import nats
import pytest

from services.node_agent.contracts import ReadConsole
from shared import rpc
from shared.contract import load_catalog


@pytest.fixture
async def gateway_nc(infra):
    """A connection as the gateway (its identity and inbox prefix), the requester of node_agent.read_console."""
    client = await nats.connect(infra.nats_url, **infra.connect_options("gateway"))
    yield client
    await client.close()


def _read() -> ReadConsole:
    return ReadConsole(allocation_id=uuid.uuid4(), tenant_id=uuid.uuid4())


async def test_a_request_nobody_serves_is_no_responders_not_a_timeout(gateway_nc):
    # a long timeout: were "no responders" not reported, the request would wait it out and raise RpcTimeout
    with pytest.raises(rpc.RpcNoResponders) as err:
        await rpc.request(gateway_nc, load_catalog(), "gateway", "node_agent.read_console", _read(), timeout=30,
                          node_id=str(uuid.uuid4()))
    assert isinstance(err.value, rpc.RpcUnavailable) and not isinstance(err.value, rpc.RpcTimeout)


async def _never_answer(_msg) -> None:
    """A responder that hears the request and never answers (an agent whose driver is wedged)."""


async def test_a_responder_that_stays_silent_is_a_timeout(gateway_nc, nc):
    node = str(uuid.uuid4())
    subject = load_catalog().message("node_agent.read_console").render_subject(node_id=node)
    sub = await nc.subscribe(subject, queue="node_agent", cb=_never_answer)
    await nc.flush()
    try:
        # right after a reload of the server's identities (another test's node-agent) it may answer "no
        # responders" for a moment although the subscription is there: ask until it routes to the responder
        for _ in range(50):
            try:
                await rpc.request(gateway_nc, load_catalog(), "gateway", "node_agent.read_console", _read(),
                                  timeout=0.5, node_id=node)
            except rpc.RpcNoResponders:
                await nc.flush()
                continue
            except rpc.RpcTimeout as exc:
                err = exc
                break
        else:
            pytest.fail("the server never routed the request to the silent responder")
        assert isinstance(err, rpc.RpcUnavailable) and not isinstance(err, rpc.RpcNoResponders)
    finally:
        await sub.unsubscribe()
