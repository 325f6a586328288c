"""A Slurm cluster's files, rendered from its spec: pure functions, no I/O.

Every path a daemon writes lives under the cluster's own state directory (``ClusterFiles``), so clusters of
several tenants share one host without sharing a file: their own munge socket (``AuthInfo``), their own jwt key,
spool, state and pid files. ``%n`` (the node's name) keeps the per-node files of one cluster apart.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...domain.runtime import ClusterNode, ClusterSpec

CTLD_PORT = 6817
SLURMD_PORT = 6818
PARTITION = "tessera"
# Character devices that stand in for GPUs on a node that has none: Slurm's GRES wants device files, and
# a regular file is refused ("not a valid character or block device").
STAND_INS = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


@dataclass(frozen=True)
class ClusterFiles:
    """Where one cluster keeps everything: ``<state_root>/<cluster_id>/``."""

    root: Path

    @property
    def slurm_conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.root / "gres.conf"

    @property
    def munge_key(self) -> Path:
        return self.root / "munge" / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def jwt_key(self) -> Path:
        return self.root / "ctld" / "jwt_hs256.key"

    @property
    def state_save(self) -> Path:
        return self.root / "ctld"

    @property
    def rest_socket(self) -> Path:
        return self.root / "rest" / "slurmrestd.sock"   # its folder is slurmrestd's: it binds after setuid

    @property
    def logs(self) -> Path:
        return self.root / "log"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def spool_link(self) -> Path:
        """A short path to ``spool``, the one slurmd is given: a job step's Unix socket is
        ``<spool dir>/<node>/<node>_<job>.<step>``, and a socket path holds at most 107 bytes. With a node name of
        34 characters (a 31-character cluster name and its index) that leaves 18 for the directory:
        ``/tmp/tsp-<8 hex of the cluster's id>`` (17). The state directory itself is far longer."""
        return Path(tempfile.gettempdir()) / f"tsp-{self.root.name.replace('-', '')[:8]}"

    @property
    def jobs(self) -> Path:
        """Job output: one ``<slurm job id>.out`` each (world-writable: jobs may run as any user)."""
        return self.root / "jobs"

    def job_output(self, external_id: str) -> Path:
        return self.jobs / f"{external_id}.out"

    def daemon_log(self, daemon: str) -> Path:
        return self.logs / f"{daemon}.log"

    def dirs(self) -> tuple[Path, ...]:
        return (self.root, self.munge_key.parent, self.state_save, self.logs, self.run, self.spool, self.jobs)


def gpu_files(node: ClusterNode) -> tuple[str, ...]:
    """The device files of the node's GPUs: its own, else character-device stand-ins (one per GPU)."""
    if node.gpu_devices:
        return node.gpu_devices[:node.gpus] if node.gpus else node.gpu_devices
    if node.gpus > len(STAND_INS):
        raise ValueError(f"node {node.name}: {node.gpus} GPUs without device files (at most {len(STAND_INS)})")
    return STAND_INS[:node.gpus]


def node_line(node: ClusterNode) -> str:
    gpus = len(gpu_files(node))
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    return (f"NodeName={node.name} NodeAddr={node.address} NodeHostname={node.name} CPUs={node.cpus} "
            f"RealMemory={node.memory_mb}{gres} State=UNKNOWN")


def slurm_conf(spec: ClusterSpec, files: ClusterFiles) -> str:
    """slurm.conf of the cluster: its controller on nodes[0]'s tenant address, every node in one partition."""
    ctl = spec.controller
    lines = [
        f"# Rendered by Tessera for cluster {spec.cluster_id} (tenant {spec.tenant_id}); do not edit.",
        f"ClusterName={spec.name}",
        f"SlurmctldHost={ctl.name}({ctl.address})",
        f"SlurmctldPort={CTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={files.munge_socket}",
        "CredType=cred/munge",
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters=jwt_key={files.jwt_key}",
        f"StateSaveLocation={files.state_save}",
        f"SlurmdSpoolDir={files.spool_link}/%n",
        f"SlurmctldPidFile={files.run}/slurmctld.pid",
        f"SlurmdPidFile={files.run}/slurmd-%n.pid",
        f"SlurmctldLogFile={files.daemon_log('slurmctld')}",
        f"SlurmdLogFile={files.logs}/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "ReturnToService=2",
        "SlurmdTimeout=30",
        "MinJobAge=3600",
        "JobRequeue=1",              # a batch job whose node failed (or was set DOWN) is queued again
        *(node_line(n) for n in spec.nodes),
        f"PartitionName={PARTITION} Nodes={','.join(n.name for n in spec.nodes)} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def gres_conf(spec: ClusterSpec) -> str:
    """gres.conf: one line per GPU device file of each node."""
    lines = [f"NodeName={n.name} Name=gpu File={f}" for n in spec.nodes for f in gpu_files(n)]
    return "\n".join(lines) + "\n"
