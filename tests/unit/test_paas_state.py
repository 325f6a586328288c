"""A local platform's PaaS state folder: traversable by other users, and reaped with what still uses it."""
from __future__ import annotations

import os
import stat
import subprocess

from tooling import paas_state


def test_the_state_folder_lets_other_users_through_and_is_the_same_for_the_same_work_folder(tmp_path):
    first = paas_state.state_dir(tmp_path)
    try:
        assert first == paas_state.state_dir(tmp_path) and first != paas_state.state_dir(tmp_path / "other")
        assert stat.S_IMODE(first.stat().st_mode) == 0o711
    finally:
        paas_state.reap(first)
        paas_state.reap(paas_state.state_dir(tmp_path / "other"))


def test_reap_kills_every_process_naming_the_folder_and_removes_it(tmp_path):
    folder = paas_state.state_dir(tmp_path)
    (folder / "cluster").mkdir()
    mine = subprocess.Popen(["sleep", "60"], env={**os.environ, paas_state.VARIABLE: str(folder)})
    other = subprocess.Popen(["sleep", "60"], env={**os.environ, paas_state.VARIABLE: str(folder) + "-x"})
    try:
        assert paas_state.reap(folder) == [mine.pid]
        assert mine.wait(timeout=10) == -9 and other.poll() is None and not folder.exists()
    finally:
        other.kill()
        other.wait()
