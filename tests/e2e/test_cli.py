"""The `tessera` command against a live platform, run as a user would: a subprocess per command, its
config in a temporary directory, the gateway and key from the environment (or a login)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE2ZZdnE/RtlHeGDHHC2CVZeBzgkzYhgCfhP2TXh3PAj ada@example"
ALLOCATE_STEPS = ["reserve_slots", "attach_network", "provision_volume", "provision_node"]


def cli_env(tmp_path: Path, url: str | None = None, key: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TESSERA_URL", "TESSERA_API_KEY")}
    env.update(TESSERA_CONFIG=str(tmp_path / "tessera" / "config.json"), PYTHONPATH=str(REPO))
    if url and key:
        env.update(TESSERA_URL=url, TESSERA_API_KEY=key)
    return env


async def run(env: dict, *args: str, timeout: float = 90) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "cli", *args, env=env, cwd=REPO,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode, out.decode(), err.decode()


async def ok(env: dict, *args: str) -> str:
    rc, out, err = await run(env, *args)
    assert rc == 0, (args, rc, out, err)
    return out


async def until(probe, timeout: float = 30, what: str = "condition"):
    """Call ``probe`` (async) until it returns something truthy; its value. No fixed sleeps: short polls."""
    deadline, delay = time.monotonic() + timeout, 0.05
    while True:
        value = await probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"not {what} after {timeout}s"
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.5)


@pytest.fixture
def user_env(platform, tenant, tmp_path):
    return cli_env(tmp_path, platform.gateway_url, tenant.user.api_key)


@pytest.fixture
def admin_env(platform, tmp_path):
    return cli_env(tmp_path, platform.gateway_url, platform.admin_key)


async def test_login_contexts_and_the_config_file(platform, tenant, tmp_path):
    env = cli_env(tmp_path)
    assert (await run(env, "alloc", "list"))[0] == 2                       # not logged in: a usage error
    out = await ok(env, "login", platform.gateway_url, "--api-key", tenant.user.api_key, "--context", "lab")
    assert "tenant_user" in out and "lab" in out
    await ok(env, "login", platform.gateway_url, "--api-key", platform.admin_key, "--context", "ops")
    path = Path(env["TESSERA_CONFIG"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert (await ok(env, "context", "current")).strip() == "ops"
    assert "No resources found." in await ok(env, "--context", "lab", "alloc", "list")
    assert (await run(env, "--context", "lab", "node", "list"))[0] == 4    # a tenant calling an operator verb
    await ok(env, "context", "use", "lab")
    listing = await ok(env, "context", "list")
    assert any(line.startswith("*") and "lab" in line for line in listing.splitlines())
    await ok(env, "context", "delete", "ops")
    assert (await run(env, "context", "use", "ops"))[0] == 3
    assert json.loads(path.read_text())["contexts"]["lab"]["token"]       # kept for the next command


async def test_alloc_create_wait_get_list_delete_and_exit_codes(user_env):
    rc, out, err = await run(user_env, "alloc", "create", "cli-1", "--shape", "vm.1gpu", "--wait")
    assert rc == 0, (out, err)
    lines = out.strip().splitlines()
    assert "ACTIVE" in lines[-1] and "tessera alloc watch" in err
    steps = [ln.split()[1] for ln in lines if ln.startswith("step ")]
    assert [s for s in steps if s in ALLOCATE_STEPS] == ALLOCATE_STEPS, out      # the saga's own order
    alloc_id = lines[-1].split()[1]
    doc = json.loads(await ok(user_env, "alloc", "get", alloc_id, "-o", "json"))
    assert doc["state"] == "ACTIVE"
    assert alloc_id in (await ok(user_env, "alloc", "list", "-o", "name")).split()
    assert "ACTIVE" in await ok(user_env, "alloc", "list", "-o", "wide")
    assert f"id: {alloc_id}" in await ok(user_env, "alloc", "get", alloc_id, "-o", "yaml")
    assert "releasing" in await ok(user_env, "alloc", "delete", alloc_id)
    rc, out, err = await run(user_env, "alloc", "get", str(uuid.uuid4()))
    assert rc == 3 and err.startswith("error: ") and "(HTTP 404)" in err and len(err.strip().splitlines()) == 1
    rc, _, err = await run(user_env, "alloc", "create", "no-shape")
    assert rc == 2
    rc, _, err = await run(user_env, "alloc", "create", "bad", "--shape", "no.such.shape")
    assert rc in (2, 3) and "error: " in err and "Traceback" not in err


async def test_failed_saga_exits_1_with_the_failed_step(user_env):
    rc, out, err = await run(user_env, "alloc", "create", "cli-fail", "--shape", "vm.1gpu", "--wait",
                             "--label", "sim.tessera.io/fault=provision_node=fail")
    assert rc == 1, (out, err)
    assert "error: allocation FAILED at provision_node" in err


async def test_unreachable_gateway_is_one_line(tmp_path):
    rc, _, err = await run(cli_env(tmp_path, "http://127.0.0.1:9", "k"), "alloc", "list")
    assert rc == 1 and err.startswith("error: cannot reach http://127.0.0.1:9") and "Traceback" not in err


async def test_tenant_nouns_in_order(platform, tenant, user_env, tmp_path):
    key_file = tmp_path / "k.pub"
    key_file.write_text(SSH_KEY)
    assert "added" in await ok(user_env, "ssh-key", "add", "laptop", str(key_file))
    assert (await run(user_env, "ssh-key", "add", "laptop", str(key_file)))[0] == 5      # conflict
    assert (await ok(user_env, "ssh-key", "list", "-o", "name")).split() == ["laptop"]
    assert json.loads(await ok(user_env, "ssh-key", "get", "laptop", "-o", "json"))["name"] == "laptop"
    await ok(user_env, "ssh-key", "delete", "laptop")
    assert (await run(user_env, "ssh-key", "get", "laptop"))[0] == 3

    net = json.loads(await ok(user_env, "network", "create", "cli-net", "--cidr", "10.77.0.0/24", "-o", "json"))
    await until(lambda: _state(user_env, "network", net["id"], "active"), what="network active")
    assert net["id"] in await ok(user_env, "network", "list", "-o", "name")
    await ok(user_env, "network", "attachments", net["id"])
    await ok(user_env, "network", "delete", net["id"])

    vol = json.loads(await ok(user_env, "volume", "create", "cli-vol", "--size-gb", "0.05", "-o", "json"))
    await until(lambda: _state(user_env, "volume", vol["id"], "available"), what="volume available")
    assert vol["id"] in await ok(user_env, "volume", "list", "-o", "name")
    await ok(user_env, "volume", "delete", vol["id"])

    await ok(user_env, "image", "list", "-o", "wide")
    assert "H100" in await ok(user_env, "quota")
    await ok(user_env, "usage", "-o", "json")
    await ok(user_env, "key", "list")
    owner = cli_env(tmp_path, platform.gateway_url, tenant.admin.api_key)
    assert (await run(user_env, "policy", "list"))[0] == 4                # a tenant user may not manage policies
    await ok(owner, "policy", "list", "-o", "wide")
    await ok(owner, "invoice", "list")
    await ok(owner, "budget", "get")
    assert json.loads(await ok(owner, "audit", "-o", "json"))["items"]   # the ssh key added, at least


async def _state(env: dict, noun: str, ident: str, state: str) -> bool:
    rc, out, _ = await run(env, noun, "get", ident, "-o", "json")
    return rc == 0 and json.loads(out).get("state") == state


async def test_operator_nouns(admin_env, tenant):
    fleet = json.loads(await ok(admin_env, "node", "list", "-o", "json"))["items"]
    assert fleet and all({"free", "allocated", "other"} <= set(n["gpus"]) for n in fleet)
    table = await ok(admin_env, "node", "list")
    assert table.splitlines()[0].split()[:4] == ["ID", "NAME", "MODEL", "STATUS"]
    node_id = fleet[0]["id"]
    assert json.loads(await ok(admin_env, "node", "get", node_id, "-o", "json"))["id"] == node_id
    await ok(admin_env, "node", "health", node_id)
    assert "vm.1gpu" in (await ok(admin_env, "shape", "list", "-o", "name")).split()
    await ok(admin_env, "pool", "list")
    assert tenant.id in await ok(admin_env, "tenant", "list", "-o", "name")
    assert "H100" in await ok(admin_env, "quota", "--tenant", tenant.id)
    await ok(admin_env, "quota", "set", "shared", "H100", "32", "--tenant", tenant.id)
    await ok(admin_env, "user", "list", "--tenant", tenant.id)
    await ok(admin_env, "price-list", "list")
    await ok(admin_env, "rate-limit", "get", "--tenant", tenant.id)
    await ok(admin_env, "dead-letters")


async def test_alloc_list_watch_into_a_file_keeps_streaming(user_env, tenant, tmp_path):
    out_path = tmp_path / "watch.jsonl"
    with out_path.open("w") as sink:
        # Ctrl-C as a terminal delivers it, whatever the suite inherited: a shell's background job ignores
        # SIGINT, its children too, and Python then installs no KeyboardInterrupt
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cli", "alloc", "list", "--watch", "-o", "json", "--interval", "0.5",
            env=user_env, cwd=REPO, stdout=sink, stderr=asyncio.subprocess.PIPE, preexec_fn=_interruptible)
    try:   # the feed is open and the list read: what is created from here on comes as ADDED, then MODIFIED
        ready = await asyncio.wait_for(proc.stderr.readline(), 30)
        assert b"watching allocations" in ready, ready
        ids = [(await tenant.user.create_allocation(f"w-{i}", shape="vm.1gpu"))["id"] for i in range(2)]

        async def seen():
            events = [json.loads(ln) for ln in out_path.read_text().splitlines() if ln.strip()]
            kinds = {(e["object"]["id"], e["type"]) for e in events}
            return all((i, "ADDED") in kinds and (i, "MODIFIED") in kinds for i in ids) and events
        events = await until(seen, timeout=60, what="ADDED and MODIFIED of both allocations")
        assert [e["type"] for e in events if e["object"]["id"] == ids[0]][0] == "ADDED"
        assert proc.returncode is None                                   # still streaming
        proc.send_signal(signal.SIGINT)                                  # Ctrl-C ends the watch quietly
        assert await asyncio.wait_for(proc.wait(), 15) == 130
        assert "Traceback" not in (await proc.stderr.read()).decode()
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def test_ops_events_follow_filtered_on_the_envelope(admin_env, tenant, tmp_path):
    out_path = tmp_path / "events.jsonl"
    with out_path.open("w") as sink:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cli", "events", "--follow", "--tenant", tenant.id, "--type", "allocation.*",
            "-o", "json", env=admin_env, cwd=REPO, stdout=sink, stderr=asyncio.subprocess.PIPE)
    try:   # the stream delivers only what is new: allocate once it says it is open
        ready = await asyncio.wait_for(proc.stderr.readline(), 30)
        assert b"watching the streams" in ready, ready
        await tenant.user.create_allocation(f"ev-{uuid.uuid4().hex[:4]}", shape="vm.1gpu")

        async def some():
            assert proc.returncode is None, "the follow ended"
            return [json.loads(ln) for ln in out_path.read_text().splitlines() if ln.strip()]
        events = await until(some, timeout=60, what="allocation events of the tenant")
        assert all(e["envelope"]["tenant_id"] == tenant.id and e["type"].startswith("allocation.") for e in events)
    finally:
        proc.terminate()
        await proc.wait()


def _interruptible() -> None:
    """In the child, before it runs: SIGINT back to its default (see the watch test)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _live_script(platform, tenant, tmp_path, *args: str) -> Path:
    """A shell script for a tmux pane: ``tessera alloc create … --wait`` with ``args``, then EXIT=<its code>."""
    env = cli_env(tmp_path, platform.gateway_url, tenant.user.api_key)
    script = tmp_path / "live.sh"
    exports = "".join(f"export {k}='{env[k]}'\n" for k in ("TESSERA_CONFIG", "TESSERA_URL", "TESSERA_API_KEY",
                                                         "PYTHONPATH"))
    script.write_text(f"{exports}cd {REPO}\n{sys.executable} -m cli alloc create {' '.join(args)} --wait\n"
                      "echo EXIT=$?\nsleep 120\n")
    return script


async def _pane_when(session: str, ready, what: str, timeout: float = 90) -> str:
    async def probe():
        pane = await _tmux("capture-pane", "-p", "-J", "-t", session)
        return pane if ready(pane) else None
    return await until(probe, timeout=timeout, what=what)


async def test_live_display_in_a_terminal(platform, tenant, tmp_path):
    session = f"tessera-cli-{uuid.uuid4().hex[:8]}"
    script = _live_script(platform, tenant, tmp_path, "live-1", "--shape", "vm.1gpu")
    await _tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "50", f"sh {script}")
    try:
        pane = await _pane_when(session, lambda p: "EXIT=" in p, "the live display finished")
        assert "EXIT=0" in pane, pane
        lines = [ln for ln in pane.splitlines() if ln.strip()]
        assert "ACTIVE" in lines[lines.index(next(ln for ln in lines if ln.startswith("EXIT="))) - 1], pane
        assert sorted((s for s in ALLOCATE_STEPS if s in pane), key=pane.index) == ALLOCATE_STEPS, pane
    finally:
        await _tmux("kill-session", "-t", session)


async def test_the_terminal_shows_each_step_as_it_ends_while_the_saga_runs(platform, tenant, tmp_path):
    """provision_node held until its step times out: captured while it is held, the steps before it are on screen
    in order and the display has not ended; at the end the failure is named and the exit code is 1."""
    session = f"tessera-cli-{uuid.uuid4().hex[:8]}"
    script = _live_script(platform, tenant, tmp_path, "held-1", "--shape", "vm.1gpu",
                          "--label", "sim.tessera.io/fault=provision_node=timeout")
    await _tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "50", f"sh {script}")
    try:
        before = ALLOCATE_STEPS[:ALLOCATE_STEPS.index("provision_node")]
        mid = await _pane_when(session, lambda p: all(s in p for s in before) or "EXIT=" in p, "the first steps shown")
        assert "EXIT=" not in mid, f"the display ended before provision_node timed out:\n{mid}"
        assert sorted(before, key=mid.index) == before, mid
        pane = await _pane_when(session, lambda p: "EXIT=" in p, "the display ended")
        assert "EXIT=1" in pane and "FAILED" in pane and "provision_node" in pane, pane
    finally:
        await _tmux("kill-session", "-t", session)


async def _tmux(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec("tmux", *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return out.decode()
