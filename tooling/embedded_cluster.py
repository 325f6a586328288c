"""An embedded three-server NATS JetStream cluster (``EmbeddedNatsCluster``): the chaos harness's bus, every
stream replicated three times, one server killed and restarted while the others keep serving. Each server has
``tooling.embedded.EmbeddedNats``'s configuration and identities, plus its name, a monitoring port and the
cluster's routes."""
from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

from .embedded import EmbeddedNats, NatsIdentities, free_port


class _ClusterMember(EmbeddedNats):
    """One server of an ``EmbeddedNatsCluster``: EmbeddedNats's configuration under its own server name, with
    a monitoring port (its /healthz says when JetStream is current) and the cluster's routes."""

    def __init__(self, data_dir: Path, index: int, cluster_port: int, routes: list[int], identities: NatsIdentities,
                 sync_always: bool):
        super().__init__(data_dir, sync_always=sync_always)
        self.index, self.cluster_port, self.routes = index, cluster_port, routes
        self.http_port = free_port()
        self.identities = identities   # one set of keys for the whole cluster

    def config_file(self) -> Path:
        conf = super().config_file()
        text = conf.read_text().replace("server_name: tessera-nats", f"server_name: tessera-nats-{self.index}")
        routes = "\n".join(f"    nats://127.0.0.1:{p}" for p in self.routes)
        text += (f"\nhttp: 127.0.0.1:{self.http_port}\n"
                 f"cluster {{\n  name: tessera\n  listen: 127.0.0.1:{self.cluster_port}\n  connect_retries: 120\n"
                 f"  routes: [\n{routes}\n  ]\n}}\n")
        conf.write_text(text)
        return conf

    def healthy(self) -> bool:
        """Whether the server says JetStream is current (its meta leader known, its streams caught up)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False


class EmbeddedNatsCluster:
    """Three (``size``) nats-servers in one JetStream cluster on this machine, each with its own store, all with
    the configuration and identities EmbeddedNats gives one server (a new identity reloads every server).

    ``url`` is the first server's (what a client given one URL connects to; it learns the others from the
    cluster's INFO), ``urls`` all of them. ``kill(i)`` SIGKILLs one server, ``restart(i)`` starts it again on the
    same ports and store; the others keep serving while a quorum (2 of 3) stands."""

    def __init__(self, data_dir: Path, size: int = 3, sync_always: bool = True):
        self.data_dir = Path(data_dir)
        self.identities = NatsIdentities(self.data_dir / "identities", reload=self.reload)
        cluster_ports = [free_port() for _ in range(size)]
        self.members = [_ClusterMember(self.data_dir / f"n{i}", i, cluster_ports[i], cluster_ports, self.identities,
                                       sync_always) for i in range(size)]

    @property
    def url(self) -> str:
        return self.members[0].url

    @property
    def urls(self) -> list[str]:
        return [m.url for m in self.members]

    def connect_options(self, identity: str = "admin") -> dict[str, Any]:
        return self.identities.connect_options(identity)

    def start(self, timeout: float = 60.0) -> EmbeddedNatsCluster:
        """Start every server and wait until each says JetStream is current (a meta leader is elected only once
        a quorum has found each other); on any failure every server is stopped before the error propagates."""
        try:
            for m in self.members:
                m.start()
            self.wait_healthy(timeout=timeout)
        except BaseException:
            self.stop(kill=True)
            raise
        return self

    def wait_healthy(self, indexes=None, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for i in (range(len(self.members)) if indexes is None else indexes):
            while not self.members[i].healthy():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nats-server {i} not healthy after {timeout}s (see {self.members[i].data_dir})")
                time.sleep(0.1)

    def kill(self, index: int) -> None:
        self.members[index].stop(kill=True)

    def restart(self, index: int, timeout: float = 60.0) -> None:
        """Start a killed server again (same ports, same store) and wait until it has caught up."""
        self.members[index].start()
        self.wait_healthy([index], timeout=timeout)

    def reload(self, identity: str | None = None, timeout: float = 15.0) -> None:
        """Render every server's configuration again and reload the running ones (see ``EmbeddedNats.reload``)."""
        for m in self.members:
            m.reload(identity, timeout=timeout)

    def stop(self, kill: bool = False) -> None:
        for m in self.members:
            m.stop(kill=kill)
