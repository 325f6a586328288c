"""How rendered Kubernetes work reaches a cluster: ``KubernetesApplier``. The one implementation here records:
no Kubernetes server (nor kubeadm, nor kubelet) can run on this platform's hosts, so ``RecordingApplier``
appends each intended call, with the documents it carries, to ``<state_root>/<cluster>/calls.jsonl`` (0600: the
kubeadm documents hold the cluster's bootstrap token). A real applier (kubectl server-side apply through the
controller's socket, ``ip netns exec`` for kubeadm on a namespace slot) would be another class."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Protocol

CALLS = "calls.jsonl"


class KubernetesApplier(Protocol):
    async def apply(self, cluster: str, documents: list[dict]) -> None:
        """Create or update the documents (server-side apply: a repeat is a no-op)."""

    async def delete(self, cluster: str, refs: list[tuple[str, str, str | None]]) -> None:
        """Delete (kind, name, namespace) objects; one already gone is fine."""

    async def run(self, cluster: str, node: str, argv: list[str], documents: list[dict] | None = None) -> None:
        """Run ``argv`` on ``node`` (in its namespace slot, or over the host agent); ``documents`` are the
        configuration the command reads (``kubeadm init/join --config``), written on the node first."""


class RecordingApplier:
    def __init__(self, state_root: Path) -> None:
        self.state_root = state_root

    def calls(self, cluster: str) -> list[dict]:
        path = self.state_root / cluster / CALLS
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    async def apply(self, cluster: str, documents: list[dict]) -> None:
        self._append(cluster, {"call": "apply", "documents": documents})

    async def delete(self, cluster: str, refs: list[tuple[str, str, str | None]]) -> None:
        self._append(cluster, {"call": "delete", "refs": [
            {"kind": kind, "name": name, "namespace": namespace} for kind, name, namespace in refs]})

    async def run(self, cluster: str, node: str, argv: list[str], documents: list[dict] | None = None) -> None:
        self._append(cluster, {"call": "run", "node": node, "argv": list(argv), "documents": documents or []})

    def _append(self, cluster: str, entry: dict) -> None:
        folder = self.state_root / cluster
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(folder / CALLS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(json.dumps({"at": time.time(), **entry}, sort_keys=True) + "\n")
