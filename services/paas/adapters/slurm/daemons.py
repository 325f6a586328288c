"""One cluster's daemons and files: its munged, slurmctld, a slurmd per node and slurmrestd.

Every daemon is started only when its recorded pid is not alive, so starting a started (or half-started,
after a crash) cluster starts what is missing and keeps the rest, and the StateSaveLocation keeps the
queue across a controller restart. Pids are recorded in ``run/pids.json``.
"""
from __future__ import annotations

import json
import os
import pwd
import secrets
from pathlib import Path

from ...domain.runtime import ClusterError, ClusterNode, ClusterSpec
from .config import ClusterFiles, gres_conf, slurm_conf
from .processes import Children, carrying_conf, in_node, kill_all, start_time
from .processes import alive as pid_alive
from .processes import run as run_command

REST_USER = "nobody"   # slurmrestd refuses to run as root or SlurmUser


class ClusterDaemons:
    """The daemons of the cluster whose files are ``files``; ``children`` reaps what this process started."""

    def __init__(self, files: ClusterFiles, children: Children) -> None:
        self.files, self.children = files, children

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.files.slurm_conf)}

    # -- files ------------------------------------------------------------------------------------------
    def prepare(self, spec: ClusterSpec) -> bool:
        """Directories, keys (made once: a restart keeps them) and the configuration of ``spec``; True when the
        configuration changed."""
        f = self.files
        for d in f.dirs():
            d.mkdir(parents=True, exist_ok=True)
        _check_traversable(f.root.parent)
        f.root.chmod(0o755)          # slurmrestd (nobody) reads slurm.conf; the keys' own folders are closed
        f.munge_key.parent.chmod(0o711)
        f.state_save.chmod(0o700)
        f.jobs.chmod(0o1777)
        rest_dir = f.rest_socket.parent
        rest_dir.mkdir(exist_ok=True)
        os.chown(rest_dir, pwd.getpwnam(REST_USER).pw_uid, -1)   # slurmrestd binds its socket after setuid
        rest_dir.chmod(0o700)
        _secret(f.munge_key, 1024, 0o400)
        _secret(f.jwt_key, 32, 0o600)
        return self.write_config(spec)

    def write_config(self, spec: ClusterSpec) -> bool:
        """Write the cluster's configuration; True when it differs from what was there."""
        for node in spec.nodes:
            (self.files.spool / node.name).mkdir(parents=True, exist_ok=True)
        link = self.files.spool_link
        if not (link.is_symlink() and link.readlink() == self.files.spool):
            link.unlink(missing_ok=True)
            link.symlink_to(self.files.spool, target_is_directory=True)
        changed = False
        for path, text in ((self.files.gres_conf, gres_conf(spec)), (self.files.slurm_conf, slurm_conf(spec, self.files))):
            if not path.exists() or path.read_text() != text:
                _atomic(path, text)
                changed = True
        return changed

    # -- pids -------------------------------------------------------------------------------------------
    @property
    def _pid_file(self) -> Path:
        return self.files.run / "pids.json"

    def _records(self) -> dict[str, list[int]]:
        """name -> [pid, start time]."""
        try:
            return json.loads(self._pid_file.read_text())
        except (OSError, ValueError):
            return {}

    def pids(self) -> dict[str, int]:
        return {name: pid for name, (pid, _) in self._records().items()}

    def _record(self, name: str, pid: int | None) -> None:
        records = self._records()
        if pid is None:
            records.pop(name, None)
        else:
            records[name] = [pid, start_time(pid) or 0]
        _atomic(self._pid_file, json.dumps(records, sort_keys=True))

    def alive(self, name: str) -> bool:
        pid, started = self._records().get(name, (None, None))
        return pid_alive(pid, started)

    async def _ensure(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        pid = self.pids().get(name)
        if self.alive(name):
            return pid
        pid = await self.children.spawn(argv, self.files.logs / f"{name}.out", {**self.env, **(env or {})})
        self._record(name, pid)
        return pid

    # -- daemons ----------------------------------------------------------------------------------------
    async def ensure_munged(self) -> int:
        f = self.files
        return await self._ensure("munged", [
            "munged", "--foreground", "--force", f"--socket={f.munge_socket}", f"--key-file={f.munge_key}",
            f"--pid-file={f.run / 'munged.pid'}", f"--log-file={f.daemon_log('munged')}",
            f"--seed-file={f.munge_key.parent / 'munged.seed'}"])

    async def ensure_slurmctld(self, ctl: ClusterNode) -> int:
        # always "slurmctld", never Debian's "slurmctld-wlm": under that name it ignores AuthAltTypes and Gres
        started_with = self.files.slurm_conf.read_text()
        if self.alive("slurmctld"):
            return self.pids()["slurmctld"]
        pid = await self._ensure("slurmctld", in_node(["slurmctld", "-D"], ctl.netns, ctl.name))
        _atomic(self._ctld_conf, started_with)
        return pid

    @property
    def _ctld_conf(self) -> Path:
        return self.files.run / "slurmctld.conf"

    def controller_current(self) -> bool:
        """Whether the running slurmctld started with the slurm.conf there now (22.05 reads nodes only at start)."""
        try:
            return self.alive("slurmctld") and self._ctld_conf.read_text() == self.files.slurm_conf.read_text()
        except OSError:
            return False

    async def ensure_slurmd(self, node: ClusterNode) -> int:
        return await self._ensure(f"slurmd:{node.name}",
                                  in_node(["slurmd", "-D", "-N", node.name], node.netns, node.name))

    async def ensure_slurmrestd(self, ctl: ClusterNode) -> int:
        argv = ["slurmrestd", "-a", "rest_auth/jwt", "-s", "openapi/v0.0.38", "-u", REST_USER,
                f"unix:{self.files.rest_socket}"]
        return await self._ensure("slurmrestd", in_node(argv, ctl.netns), {"SLURM_JWT": "daemon"})

    async def stop(self, name: str) -> None:
        pid = self.pids().get(name)
        if pid:
            await self.children.kill_groups([pid])
        self._record(name, None)

    async def stop_all(self) -> None:
        """Every recorded daemon's group, then whatever still carries the cluster's SLURM_CONF (step daemons,
        tasks), then munged. All with SIGKILL: the cluster's state is removed next, so nothing needs saving
        (a graceful slurmctld waits seconds on its nodes)."""
        pids = {n: p for n, p in self.pids().items() if self.alive(n)}
        await self.children.kill_groups([p for n, p in pids.items() if n != "munged"], hard=True)
        kill_all(carrying_conf(self.files.slurm_conf))
        if "munged" in pids:
            await self.children.kill_groups([pids["munged"]], hard=True)

    async def scontrol(self, netns: str | None, *args: str) -> str:
        """``scontrol`` with the cluster's configuration, from the controller's namespace (its tenant network)."""
        return await run_command(in_node(["scontrol", *args], netns), self.env)

    async def token(self, netns: str | None, lifespan_s: int) -> str:
        out = await self.scontrol(netns, "token", "username=root", f"lifespan={lifespan_s}")
        for line in out.splitlines():
            if line.startswith("SLURM_JWT="):
                return line.split("=", 1)[1].strip()
        raise ClusterError(f"scontrol token gave no token: {out.strip()[:200]}")


def _check_traversable(path: Path) -> None:
    """slurmrestd runs as nobody and reads slurm.conf: every folder above it must let others through."""
    for folder in [path, *path.parents]:
        if folder.exists() and not folder.stat().st_mode & 0o001:
            raise ClusterError(f"{folder} is closed to other users (mode {folder.stat().st_mode & 0o777:o}): "
                               "slurmrestd, which runs as nobody, could not read the cluster's slurm.conf",
                               permanent=True)


def _secret(path: Path, size: int, mode: int) -> None:
    if path.exists():
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(secrets.token_bytes(size))


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(0o644)
    os.replace(tmp, path)
