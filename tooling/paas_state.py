"""Where a local platform's tenant clusters keep their state, and what is left of them when it stops.

Slurm's REST daemon drops to ``nobody`` and must read the cluster's configuration, so every folder above the
state must let other users through: a test's or a data folder's work directory (often 0700) cannot hold it. The
state goes to a folder of its own in the system's temporary directory, named after the work directory (the same
platform finds it again on a restart), 0711.

A cluster's daemons are started by the paas service and inherit its environment, ``TESSERA_PAAS_STATE_DIR``
included: at the platform's stop, every process still naming this platform's state folder there is killed (a
cluster nobody deleted; a test that failed half-way) and the folder removed.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

from services.paas.adapters.processes import carrying

VARIABLE = "TESSERA_PAAS_STATE_DIR"


def state_dir(workdir: Path) -> Path:
    """The platform's PaaS state folder (made, 0711, if missing)."""
    tag = hashlib.sha256(str(Path(workdir).resolve()).encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"tessera-paas-{tag}"
    path.mkdir(mode=0o711, exist_ok=True)
    path.chmod(0o711)
    return path


def marked(path: Path) -> list[int]:
    """Pids of the live processes whose environment names ``path`` as their PaaS state folder."""
    return carrying(f"{VARIABLE}={path}")


def reap(path: Path) -> list[int]:
    """Kill what is left of the platform's clusters and remove their state; returns the pids killed."""
    pids = marked(path)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for link in Path(tempfile.gettempdir()).glob("tsp-*"):     # Slurm spool links into it (adapters/slurm/config)
        if link.is_symlink() and str(link.readlink()).startswith(f"{path}/"):
            link.unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)
    return pids
