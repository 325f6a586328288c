"""The command lines of a Ray cluster's daemons, each run "on its node" (inside the node's network namespace).

Pure: what to run and with which environment; starting and stopping them is ``processes``'s work.

Every daemon's environment carries ``TESSERA_RAY_CLUSTER`` and ``TESSERA_RAY_NODE``: everything Ray starts
below it (raylet, workers, a job's driver, which Ray puts in a session of its own) inherits them, so the
cluster's processes, and one node's, are found by that mark rather than by name (``ray stop`` kills every Ray
process on the host, other tenants' included).
"""
from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

from ...domain.runtime import ClusterError, ClusterNode

GCS_PORT = 6379
DASHBOARD_PORT = 8265
# Ray refuses less (75 MiB); several tenants' clusters share a small host, and the jobs here pass little data.
OBJECT_STORE_BYTES = 75 * 1024 * 1024
CLUSTER_MARK = "TESSERA_RAY_CLUSTER"
NODE_MARK = "TESSERA_RAY_NODE"
# A Unix socket path holds at most 107 bytes, and Ray puts its sockets at
# <temp dir>/session_<date>_<time>_<micros>_<pid>/sockets/plasma_store (62 bytes past the temp dir).
MAX_TEMP_DIR = 107 - 62


def cluster_temp_root(short_root: Path, cluster_id: uuid.UUID) -> Path:
    """Where the cluster's nodes keep Ray's temp dirs: short, for Ray's socket paths (the state dir is long)."""
    return short_root / f"tr-{cluster_id.hex[:16]}"


def node_temp_dir(short_root: Path, cluster_id: uuid.UUID, node: str) -> Path:
    """One node's Ray temp dir (``--temp-dir``): its own, since every node runs its own raylet."""
    path = cluster_temp_root(short_root, cluster_id) / hashlib.sha1(node.encode()).hexdigest()[:6]
    if len(str(path)) > MAX_TEMP_DIR:
        raise ClusterError(f"Ray's temp dir {path} is too long for its socket paths "
                           f"(at most {MAX_TEMP_DIR} bytes): give the driver a shorter short_root", permanent=True)
    return path


def in_netns(node: ClusterNode, argv: list[str]) -> list[str]:
    """``argv`` run on ``node``: in its namespace slot (``ip netns exec`` execs, so the pid is the daemon's)."""
    if node.netns is None:
        raise ClusterError(f"node {node.name} has no network namespace: the Ray driver runs daemons in namespace "
                           "slots only", permanent=True)
    return ["ip", "netns", "exec", node.netns, *argv]


def daemon_env(ray_venv: Path, cluster_id: uuid.UUID, node: str) -> dict[str, str]:
    """A daemon's environment: the venv's bin first on PATH (a job's entrypoint runs with the PATH of whoever ran
    ``ray start``, so a bare ``python`` is Ray's), no usage reports, and the cluster's and node's marks."""
    return {"PATH": f"{ray_venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "VIRTUAL_ENV": str(ray_venv), "RAY_USAGE_STATS_ENABLED": "0",
            CLUSTER_MARK: str(cluster_id), NODE_MARK: node}


def _resources(node: ClusterNode, temp_dir: Path) -> list[str]:
    return [f"--node-ip-address={node.address}", f"--num-cpus={node.cpus}", f"--num-gpus={node.gpus}",
            f"--memory={node.memory_mb * 1024 * 1024}", f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--temp-dir={temp_dir}", "--disable-usage-stats"]


def head_argv(ray_venv: Path, node: ClusterNode, temp_dir: Path) -> list[str]:
    """The head (GCS, dashboard and Jobs API, and a raylet for the node's own GPUs), bound to its tenant address."""
    return in_netns(node, [str(ray_venv / "bin" / "ray"), "start", "--head", "--block", f"--port={GCS_PORT}",
                           f"--dashboard-host={node.address}", f"--dashboard-port={DASHBOARD_PORT}",
                           *_resources(node, temp_dir)])


def worker_argv(ray_venv: Path, node: ClusterNode, head: ClusterNode, temp_dir: Path) -> list[str]:
    """A worker node's raylet, joined to the head's GCS over the tenant network."""
    return in_netns(node, [str(ray_venv / "bin" / "ray"), "start", "--block", f"--address={head.address}:{GCS_PORT}",
                           *_resources(node, temp_dir)])


def api_bridge_argv(head: ClusterNode, socket: Path) -> list[str]:
    """The Jobs API as a Unix socket in the file system, for Tessera (which is not on the tenant's network)."""
    return in_netns(head, ["socat", f"UNIX-LISTEN:{socket},fork,mode=600,unlink-early",
                           f"TCP:{head.address}:{DASHBOARD_PORT}"])


def drain_argv(ray_venv: Path, head: ClusterNode, node_id: str, reason: str) -> list[str]:
    """Ask the GCS to drain a node: no new work lands there, running work finishes, then its raylet exits.

    PREEMPTION, not IDLE_TERMINATION: the GCS refuses the latter for a node with work running."""
    return in_netns(head, [str(ray_venv / "bin" / "ray"), "drain-node", f"--address={head.address}:{GCS_PORT}",
                           f"--node-id={node_id}", "--reason=DRAIN_NODE_REASON_PREEMPTION",
                           f"--reason-message={reason or 'drain'}"])
