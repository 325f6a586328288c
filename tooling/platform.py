"""The whole platform on one machine: embedded (or given) NATS and PostgreSQL, every service as
its own process, node-agents per registered node. Used by `./taskw up`, the demo, the benchmark
and the end-to-end and crash tests (which kill and restart single processes). A process that exits while the
platform did not ask it to is started again, with backoff (``tooling.supervision``)."""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
from pathlib import Path

import asyncpg

from shared.bus_identity import connect_options
from shared.bus_identity import identity as bus_identity
from shared.db import provision_service, service_dsn
from shared.secrets import ensure_key_file

from . import paas_state
from .client import TesseraClient
from .embedded import REPO, EmbeddedNats, EmbeddedPostgres, NatsIdentities
from .embedded_cluster import EmbeddedNatsCluster
from .storage_lab import StorageLab
from .storage_lab import wanted as storage_lab_wanted
from .supervision import RestartPolicy, ServiceProcess, Supervisor
from .supervision import wanted as restart_wanted

CORE_SERVICES = ("allocation", "scheduler", "network", "storage", "billing", "paas", "saga", "gateway")
NODE_AGENTS_FILE = "node-agents.json"   # each node-agent's own settings (its identity), by node id


class Platform:
    """``nats_creds``: with a given ``nats_url``, the folder of that server's identities (``NatsIdentities``,
    e.g. ``EmbeddedNats.identities``, or its path); each service connects with its own, each node-agent with its
    node's (created when it first starts: only an ``EmbeddedNats.identities`` reloads its server then). Without
    it the services connect without credentials (a server without authorization). An embedded NATS brings its own.

    ``supervise``: a service or node-agent that exits unasked is started again, with backoff (``tooling.supervision``;
    ``restart_policy`` its delays); None (the default) reads TESSERA_RUNNER_RESTART: on unless it says ``no``.

    ``nats_servers``: with an embedded NATS, 3 starts a JetStream cluster of three servers
    (``EmbeddedNatsCluster``, ``platform.nats.kill(i)`` / ``restart(i)``) whose streams the services declare with
    as many replicas (TESSERA_STREAM_REPLICAS). Each service is given the first server's URL (its setting holds
    one) and learns the others from the cluster, so it reconnects to a survivor when its server dies."""

    def __init__(self, workdir: Path, *, nats_url: str | None = None, database_url: str | None = None,
                 env: dict[str, str] | None = None, durable: bool = True, gateway_port: int | None = None,
                 nats_creds: NatsIdentities | Path | str | None = None, supervise: bool | None = None,
                 restart_policy: RestartPolicy | None = None, nats_servers: int = 1):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.nats_url, self.database_url = nats_url, database_url
        self.nats_creds = nats_creds if isinstance(nats_creds, NatsIdentities) or nats_creds is None \
            else NatsIdentities(Path(nats_creds))
        self.extra_env = env or {}
        self.durable = durable
        self.gateway_port = gateway_port   # None: the gateway binds any free port and reports it
        self.nats: EmbeddedNats | EmbeddedNatsCluster | None = None
        self.nats_servers = nats_servers
        self.pg: EmbeddedPostgres | None = None
        self.procs: dict[str, ServiceProcess] = {}
        self.secrets = self._load_secrets()
        self.on_stop: list = []   # blocking callables run last by stop() (e.g. the demo lab's teardown)
        # the storage host: a btrfs file system in the data folder (unless the caller configured the classes)
        self.storage = StorageLab(self.workdir) if storage_lab_wanted(self.extra_env) else None
        self.supervise = restart_wanted() if supervise is None else supervise
        self.supervisor = Supervisor(lambda: self.procs, restart_policy, self.workdir / "logs" / "runner.log")
        self._supervising: asyncio.Task | None = None

    def _load_secrets(self) -> dict[str, str]:
        path = self.workdir / "secrets.json"
        if path.exists():
            return json.loads(path.read_text())
        values = {"db": secrets.token_hex(16), "token": secrets.token_hex(32), "admin_key": "tsk_admin_" + secrets.token_hex(20)}
        path.write_text(json.dumps(values))
        path.chmod(0o600)
        return values

    @property
    def gateway_url(self) -> str:
        p = self.procs["gateway"]   # while the gateway restarts: the port it keeps (ServiceProcess.respawn)
        port = self.gateway_port or p.port or p.env.get("TESSERA_HTTP_PORT")
        return f"http://127.0.0.1:{port}"

    @property
    def admin_key(self) -> str:
        return self.secrets["admin_key"]

    def admin(self) -> TesseraClient:
        return TesseraClient(self.gateway_url, self.admin_key)

    def connect_options(self, identity: str = "admin") -> dict:
        """Keyword arguments for ``nats.connect(self.nats_url, ...)`` as ``identity`` (``admin``: everything;
        ``ops``: read-only; a service's name: that service)."""
        return connect_options(identity, self.nats_creds.seed_file(identity) if self.nats_creds else None)

    async def start(self) -> Platform:
        """Start NATS and PostgreSQL (unless given) and every core service, and wait until each is ready.
        When anything fails (a service exits at once, a timeout, the caller is cancelled or interrupted),
        what was started is stopped before the error propagates: a failed start leaves nothing running."""
        try:
            if not self.nats_url and self.nats_servers > 1:
                self.nats = EmbeddedNatsCluster(self.workdir / "nats", self.nats_servers, sync_always=self.durable)
                self.nats.start()
                self.nats_url, self.nats_creds = self.nats.url, self.nats.identities
            if not self.nats_url:
                self.nats = EmbeddedNats(self.workdir / "nats", port=None)   # set before start: stop() sees it
                self.nats.start()   # blocking on purpose: a cancellation cannot land half-way (it stops itself on errors)
                self.nats_url, self.nats_creds = self.nats.url, self.nats.identities
            if not self.database_url:
                self.pg = EmbeddedPostgres(self.workdir / "pg", durable=self.durable)
                self.pg.start()
                self.database_url = self.pg.admin_dsn
            await self._provision()
            if isinstance(self.nats, EmbeddedNatsCluster):
                await self._declare_replicated_streams()
            if self.storage:
                await asyncio.to_thread(self.storage.start)
            for name in CORE_SERVICES:
                self._spawn(name)
            await _all_ready(p.wait_ready() for p in self.procs.values())
            for p in self.procs.values():
                p.supervised = self.supervise
            if self.supervise:
                self._supervising = asyncio.create_task(self.supervisor.run(), name="tessera-runner-supervisor")
        except BaseException:
            await self.stop()
            raise
        return self

    async def _provision(self) -> None:
        from shared.contract import SERVICES
        admin = await asyncpg.connect(self.database_url)
        try:
            for s in SERVICES:
                await provision_service(admin, s, self.secrets["db"])
        finally:
            await admin.close()

    async def _declare_replicated_streams(self) -> None:
        """Every stream declared once, with the cluster's replicas, before any service starts: a replicated
        stream takes a round of the cluster's consensus to create, and eight services creating theirs at once on a
        busy machine can outlast their request timeout (they exit before they are ready); found existing, theirs
        is quick."""
        import nats

        from shared.streams import declare_streams
        nc = await nats.connect(self.nats.urls, **self.connect_options("admin"))
        try:
            await declare_streams(nc.jetstream(timeout=60), replicas=len(self.nats.members))
        finally:
            await nc.close()

    def service_env(self, name: str, instance: str = "0") -> dict[str, str]:
        service = name.split(":")[0]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
        env.update({
            "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
            "TESSERA_NATS_URL": ",".join(getattr(self.nats, "urls", None) or [self.nats_url]),
            "TESSERA_INSTANCE": instance,
            "TESSERA_DB_DSN": service_dsn(self.database_url, service, self.secrets["db"]),
            "TESSERA_HTTP_PORT": str(self.gateway_port or 0) if service == "gateway" else "0",
        })
        if self.nats_creds:   # its own identity on the bus; a node-agent its node's, created (server reloaded) if new
            env["TESSERA_NATS_NKEY_FILE"] = str(self.nats_creds.add(bus_identity(service, instance)))
        if isinstance(self.nats, EmbeddedNatsCluster):
            env["TESSERA_STREAM_REPLICAS"] = str(len(self.nats.members))
        if service in ("gateway", "node_agent"):   # they seal and open the BMC passwords
            env["TESSERA_SECRET_KEY_FILE"] = str(ensure_key_file(self.workdir / "secret.key"))
        if service == "gateway":
            env["TESSERA_TOKEN_SECRET"] = self.secrets["token"]
            env["TESSERA_BOOTSTRAP_ADMIN_KEY"] = self.admin_key
        if service == "node_agent":
            env["TESSERA_NODE_ID"] = instance
        if service == "paas":   # its tenant clusters' state (configuration, keys, sockets, logs): tooling.paas_state
            env[paas_state.VARIABLE] = str(paas_state.state_dir(self.workdir))
            # its nodes' GPUs are simulated: their metrics are a random walk, so the autoscaler reads the clusters'
            # own schedulers instead (the environment may say otherwise)
            env["TESSERA_PAAS_UTILISATION"] = os.environ.get("TESSERA_PAAS_UTILISATION", "scheduler")
        if self.storage:
            env.update(self.storage.env(service))
        env.update(self.extra_env)
        return env

    def _spawn(self, name: str, instance: str = "0", env: dict[str, str] | None = None) -> ServiceProcess:
        p = ServiceProcess(name, {**self.service_env(name, instance), **(env or {})},
                           self.workdir / "logs" / f"{name.replace(':', '-')}.log")
        self.procs[name] = p
        p.start()
        return p

    async def _spawn_ready(self, name: str, instance: str = "0", env: dict[str, str] | None = None) -> None:
        """Spawn, wait until ready, then supervise (a process that cannot start at all is the caller's error)."""
        p = self._spawn(name, instance, env)
        await p.wait_ready()
        p.supervised = self.supervise

    async def add_node(self, name: str, gpu_model: str = "H100", gpu_count: int = 8,
                       env: dict[str, str] | None = None, *, approve: bool = True, pool: str | None = None,
                       wipe_policy: str | None = None) -> str:
        """Register a node through the gateway, wait for the scheduler to confirm it, start its node-agent
        (``env`` adds settings for that node-agent only, e.g. the sim driver's latency or topology kind),
        which reports the hardware it discovers; with ``approve`` the proposed slot map is approved as a
        provider admin would (``wipe_policy`` for every slot, when given), and the node is schedulable (burnt in)
        when this returns."""
        async with self.admin() as admin:
            node = await admin.register_node(name, gpu_model, gpu_count, pool=pool)
            await admin.wait_node_registered(node["id"])
            await self.start_node_agent(node["id"], {"TESSERA_NODE_NAME": name, **(env or {})})
            if approve:
                await admin.onboard_node(node["id"], wipe_policy=wipe_policy)
        return node["id"]

    async def start_node_agent(self, node_id: str, env: dict[str, str] | None = None) -> None:
        """Start the node-agent of an already registered node and wait until it is ready.

        A node-agent's settings are its identity: its name (the sim discovery derives the hardware from it) and
        ``env`` are recorded in the work folder, and a later start of the same node (a restart of the runner on
        the same data folder) reuses them, so the node reports the hardware that was approved. ``env`` changes
        recorded settings. A node with no record (a data folder from before the record) gets its registered name."""
        records = self._node_agent_records()
        settings = {**records.get(node_id, {}), **(env or {})}
        if not settings.get("TESSERA_NODE_NAME"):
            async with self.admin() as admin:
                settings["TESSERA_NODE_NAME"] = (await admin.node(node_id))["name"]
        records[node_id] = settings
        if self.nats_creds:   # the node's identity on the bus, made (and the server reloaded) off the event loop
            await asyncio.to_thread(self.nats_creds.add, bus_identity("node_agent", node_id))
        path = self.workdir / NODE_AGENTS_FILE
        path.write_text(json.dumps(records, indent=1, sort_keys=True))
        await self._spawn_ready(f"node_agent:{node_id}", instance=node_id, env=settings)

    def _node_agent_records(self) -> dict[str, dict[str, str]]:
        path = self.workdir / NODE_AGENTS_FILE
        return json.loads(path.read_text()) if path.exists() else {}

    async def add_replica(self, service: str, instance: str) -> str:
        """Start one more replica of a core service (named ``service:instance``): the same schema and the
        same durable consumers, so the replicas share its messages. Returns its name in ``procs``."""
        name = f"{service}:{instance}"
        await self._spawn_ready(name, instance=instance)
        return name

    def kill(self, name: str, sig: int = signal.SIGKILL, *, restart: bool = False) -> None:
        """Send ``sig`` to a process and wait until it has exited. It stays down (until ``restart``), unless
        ``restart``: then it is a crash as the supervisor sees one, and it is started again after its backoff
        (with supervision on)."""
        p = self.procs[name]
        if not restart:
            p.supervised = False
        p.signal(sig)
        p.wait_exit()

    async def restart(self, name: str, env: dict[str, str] | None = None) -> None:
        """Stop (if running) and start a service again; ``env`` changes some of its settings. Supervised again
        once it is ready."""
        p = self.procs[name]
        p.supervised = False   # this restart, not the supervisor's, starts it
        if p.proc and p.proc.poll() is None:
            self.kill(name, signal.SIGTERM)
        p.respawn(env)   # the gateway keeps its port: clients keep their URL
        await p.wait_ready()
        p.supervised = self.supervise

    async def _stop_supervising(self) -> None:
        """No process is started again from here on (stop() is stopping them all)."""
        for p in self.procs.values():
            p.supervised = False
        task, self._supervising = self._supervising, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def node_agents(self) -> list[str]:
        return [n for n in self.procs if n.startswith("node_agent:")]

    async def stop(self) -> None:
        """Stop every service (SIGTERM, then SIGKILL after 20 s), then the embedded NATS and PostgreSQL;
        each step runs even when an earlier one fails. Safe to call again, or after a failed start."""
        try:
            await self._stop_supervising()
            for p in self.procs.values():
                p.signal(signal.SIGTERM)
            await asyncio.gather(*(asyncio.to_thread(p.wait_exit, 20) for p in self.procs.values()))
        finally:   # blocking on purpose: a cancellation cannot leave a server running
            try:
                if self.nats:
                    self.nats.stop()
            finally:
                try:
                    if self.pg:
                        self.pg.stop()
                finally:
                    try:
                        paas_state.reap(paas_state.state_dir(self.workdir))   # clusters nobody deleted
                        for hook in self.on_stop:
                            hook()
                    finally:   # last: the lab's domains (their virtiofs shares) are gone by now
                        if self.storage:
                            self.storage.stop()


async def _all_ready(waits) -> None:
    """Await every readiness wait; at the first failure cancel the others (no wait is left running) and raise it."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
