"""The README's two commands set themselves up: ./taskw installs the system packages it needs, and CI runs
exactly what a user runs."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def listed_packages() -> list[tuple[str, str]]:
    rows = []
    for line in (REPO / "system-packages.txt").read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            rows.append((words[0], words[1] if len(words) > 1 else ""))
    return rows


def test_every_system_package_names_the_command_that_proves_it_is_installed():
    rows = listed_packages()
    assert {"nftables", "iputils-ping", "iproute2", "passwd", "nodejs", "npm"} <= {p for p, _ in rows}
    assert all(cmd for _, cmd in rows), rows


def test_after_set_up_every_listed_command_is_on_the_path():
    """./taskw ran before this suite, so what it promises to install is there (as root, nothing may skip)."""
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    assert [cmd for _, cmd in listed_packages() if cmd != "-" and shutil.which(cmd, path=path) is None] == []
    without_command = [pkg for pkg, cmd in listed_packages() if cmd == "-"]
    installed = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Status}\\n", *without_command],
                               capture_output=True, text=True, check=False).stdout
    assert [p for p in without_command if f"{p} install ok installed" not in installed] == []


def test_ci_runs_the_readme_test_command_and_installs_nothing_itself():
    ci = (REPO / ".ci" / "run").read_text()
    assert "./taskw test" in ci and "apt-get" not in ci
    readme = (REPO / "README.md").read_text()
    assert "./taskw up" in readme and "./taskw test" in readme


def test_taskw_without_root_and_a_missing_package_stops_with_the_exact_apt_get_command():
    work = Path(tempfile.mkdtemp(prefix="taskw-"))
    try:
        shutil.copy(REPO / "taskw", work / "taskw")
        (work / "system-packages.txt").write_text(
            "# a package no machine has\n"
            "tessera-test-missing-package   tessera-no-such-command   # why it is needed\n"
            "coreutils                      ls\n")
        (work / "requirements.txt").write_text("")
        work.chmod(0o755)
        demote = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
        env = {k: v for k, v in os.environ.items() if k != "TESSERA_SKIP_SYSTEM_PACKAGES"}
        done = subprocess.run([*demote, "bash", str(work / "taskw"), "--list"], capture_output=True, text=True,
                              timeout=60, env=env, cwd=work)
        assert done.returncode == 1, done.stderr
        assert ("run: sudo apt-get install -y --no-install-recommends tessera-test-missing-package\n"
                in done.stderr), done.stderr
        assert not (work / ".venv").exists(), "it stopped before setting anything else up"
    finally:
        shutil.rmtree(work, ignore_errors=True)
