from __future__ import annotations

import asyncio
import contextlib
from functools import partial

import aiohttp
import nats
import pytest

from shared.bus_identity import identity
from shared.settings import BusSettings, ServiceSettings


@pytest.fixture
async def run_service(infra, provision):
    """Start a service in this process (its real bootstrap) against the suite's NATS and PostgreSQL."""
    started = []

    async def _run(name: str, build, **overrides):
        bus = overrides.pop("bus", BusSettings(ack_wait_s=5, max_deliver=3, retry_backoff_s=[0.05, 0.1, 0.2]))
        seed = infra.nkey_file(identity(name, overrides.get("instance", "0")))
        settings = ServiceSettings(service=name, nats_url=infra.nats_url, nats_nkey_file=seed,
                                   db_dsn=await provision(overrides.pop("schema", name)), bus=bus, **overrides)
        rt = build(settings)
        await rt.start()
        started.append(rt)
        return rt

    yield _run
    for rt in reversed(started):
        await rt.stop()


@pytest.fixture(scope="module", autouse=True)
async def clean_streams(nc):
    """Each module starts with empty service streams: a command another module left unconsumed (its
    test played the participant) must not reach a service this module starts under the same durable."""
    from shared.contract import SERVICES, stream_name
    from shared.streams import declare_streams

    js = nc.jetstream()
    await declare_streams(js)
    for service in SERVICES:
        await js.purge_stream(stream_name(service))
    yield


@pytest.fixture
async def gateway(run_service):
    """gateway(**settings_overrides) -> Api on a freshly started gateway (its real bootstrap, in-process;
    stopped after the test). Tests talk HTTP to it."""
    from services.gateway.bootstrap import build  # here: only the gateway's tests need the gateway importable
    from tests.support.gateway import Api, gateway_config

    sessions = []

    async def _start(**overrides) -> Api:
        rt = await run_service("gateway", partial(build, config=gateway_config(**overrides)))
        http = aiohttp.ClientSession(base_url=f"http://127.0.0.1:{rt.port}")
        sessions.append(http)
        return Api(rt, http)

    yield _start
    for http in sessions:
        await http.close()


@pytest.fixture
async def api(gateway):
    """The gateway with the suite's settings (token secret, bootstrap admin key)."""
    return await gateway()


@pytest.fixture(scope="session")
def btrfs_pool(tmp_path_factory):
    """A btrfs file system with quotas on a sparse loop file, for the whole session (the storage service's
    ``standard`` class in its tests); unmounted at the end. Needs root and btrfs-progs: fails without them."""
    from tests.support.volumes import loop_pool

    with loop_pool(tmp_path_factory.mktemp("btrfs-pool")) as pool:
        yield pool

class Refusals:
    """What the server refused on one connection: nats-py hands the server's ``-ERR 'Permissions Violation ...'``
    to the error callback only."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self._changed = asyncio.Event()

    async def error_cb(self, exc: Exception) -> None:
        self.errors.append(str(exc))
        self._changed.set()

    async def wait_for(self, *fragments: str, timeout: float = 10.0) -> str:
        """The first error naming every one of ``fragments`` (case-insensitive), waiting for it."""
        async with asyncio.timeout(timeout):
            while True:
                for e in self.errors:
                    if all(f.lower() in e.lower() for f in fragments):
                        return e
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
async def connect(infra):
    """connect(identity) -> (client, refusals): a connection as ``identity`` (closed after the test)."""
    clients = []

    async def _connect(identity: str):
        infra.nkey_file(identity)    # a node-agent's identity is made (and the server reloaded) on first use
        refusals = Refusals()
        nc = await nats.connect(infra.nats_url, error_cb=refusals.error_cb, **infra.connect_options(identity))
        clients.append(nc)
        return nc, refusals

    yield _connect
    for nc in clients:
        with contextlib.suppress(Exception):
            await nc.close()
