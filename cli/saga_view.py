"""Following an allocation's saga live: each step with its duration as it completes, the queue position
while queued, the guest's console ready line for a VM, and the outcome.

The steps come from ``GET /v1/allocations/{id}/steps``; where the gateway has no such route (404/405) the
allocation's own events stand in for them. Reads are woken by the allocation's event stream and happen at
most every ``MIN_REREAD_S``; a quiet stream still gets a re-read every second. On a terminal the view is a
rich Live table; elsewhere one line per completed step, so pipes and files get the same story.
Ctrl-C stops the watching only, never the work: it says how to re-attach and exits 130."""
from __future__ import annotations

import json
import sys
import threading
import time

from cli.errors import FAILED, INTERRUPTED, OK, ApiError, CliError

MIN_REREAD_S = 0.25
DONE = {"ACTIVE", "RELEASED", "FAILED"}
FINAL_STATUSES = {"succeeded", "failed", "timed_out", "compensated", "completed", "done"}
UNNEEDED_UNDO = {"armed", "disarmed"}      # an undo that never ran: not worth a line


def follow(c, allocation_id: str) -> int:
    """Follow until ACTIVE, RELEASED or FAILED; the exit code (0, 1 on FAILED, 130 on Ctrl-C)."""
    hint = f"re-attach: tessera alloc watch {allocation_id}"
    print(f"allocation {allocation_id} ({hint})", file=sys.stderr, flush=True)
    view = LiveView(allocation_id) if sys.stdout.isatty() else LineView(allocation_id)
    try:
        with view:
            a = _loop(c, allocation_id, view)
    except KeyboardInterrupt:
        print(f"\nstopped watching; allocation {allocation_id} carries on. {hint}", file=sys.stderr, flush=True)
        return INTERRUPTED
    return _outcome(c, a, view)


def _loop(c, allocation_id: str, view) -> dict:
    feed = _Feed(c, allocation_id)
    steps_route = True
    last = 0.0
    while True:
        a = c.get(f"/v1/allocations/{allocation_id}")
        steps = None
        if steps_route:
            try:
                steps = c.get(f"/v1/allocations/{allocation_id}/steps").get("items") or []
            except ApiError as exc:
                if exc.status not in (404, 405):
                    raise
                steps_route = False
        view.update(a, flatten(steps) if steps is not None else feed.as_steps())
        if a["state"] in DONE:
            return a
        last = time.monotonic()
        feed.wake.wait(1.0)
        feed.wake.clear()
        time.sleep(max(0.0, last + MIN_REREAD_S - time.monotonic()))


def flatten(sagas: list[dict]) -> list[dict]:
    """The steps of every saga of the allocation, in order, each with its saga's kind."""
    out = []
    for saga in sorted(sagas, key=lambda s: s.get("started_at") or ""):
        for st in saga.get("steps") or []:
            if st.get("phase") == "compensate" and st.get("status") in UNNEEDED_UNDO:
                continue
            out.append({**st, "kind": saga.get("kind"), "saga_id": saga.get("saga_id")})
    return out


def step_key(st: dict) -> tuple:
    return st.get("saga_id"), st.get("step"), st.get("phase"), st.get("attempt")


def is_final(st: dict) -> bool:
    return str(st.get("status", "")).lower() in FINAL_STATUSES


def step_text(st: dict) -> str:
    phase = st.get("phase")
    name = st.get("step") or "?"
    if phase == "compensate":
        name = f"{name} (undo)"
    dur = st.get("duration_s")
    took = f"{dur:.3f}s" if isinstance(dur, int | float) else "-"
    err = f"  {st['error']}" if st.get("error") else ""
    return f"{name:<28} {str(st.get('status') or '-'):<12} {took:>9}{err}"


def queue_text(a: dict) -> str | None:
    if a.get("queue_position") is None and a.get("state") != "QUEUED":
        return None
    why = f" ({a['queued_reason']})" if a.get("queued_reason") else ""
    return f"queued: position {a.get('queue_position') if a.get('queue_position') is not None else '?'}{why}"


def _outcome(c, a: dict, view) -> int:
    if a["state"] == "FAILED":
        p = a.get("problem") or {}
        title = f"allocation FAILED at {a.get('failed_step') or p.get('code') or 'an unknown step'}"
        detail = a.get("reason") or p.get("reason") or "no reason given"
        print(f"error: {title}: {detail}", file=sys.stderr, flush=True)
        return FAILED
    if a["state"] == "ACTIVE":
        ready = console_ready(c, a)
        if ready:
            view.line(f"console: {ready}")
    view.line(f"allocation {a['id']} {a['state']}" + (f" on node {a['node_id']}" if a.get("node_id") else ""))
    return OK


def console_ready(c, a: dict) -> str | None:
    """The guest's line saying it is up (a VM's console), when there is one to read; None otherwise."""
    inst = a.get("instance") or {}
    if inst.get("driver") not in ("libvirt", "vm", "qemu"):
        return None
    try:
        text = c.text(f"/v1/allocations/{a['id']}/console", {"tail": 4000})
    except CliError:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    hits = [ln for ln in lines if "ready" in ln.lower() or "login:" in ln.lower()]
    return hits[-1] if hits else None


class _Feed:
    """The allocation's event stream on a thread of its own: it wakes the re-reads and keeps the events (the
    stand-in for steps where the gateway has no steps route)."""

    def __init__(self, c, allocation_id: str):
        from cli.api import Client
        self.wake = threading.Event()
        self.events: list[dict] = []
        self._client = Client(c.ctx)
        self._path = f"/v1/allocations/{allocation_id}/events"
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            for ev in self._client.events(self._path, idle_s=1.0):
                if ev is None:
                    continue
                try:
                    env = json.loads(ev[2])
                except ValueError:
                    env = {}
                self.events.append({"type": ev[1] or env.get("type"), "at": env.get("occurred_at"),
                                    "seen": time.monotonic()})
                self.wake.set()
        except CliError:
            pass

    def as_steps(self) -> list[dict]:
        out, prev = [], None
        for i, ev in enumerate(self.events):
            took = ev["seen"] - prev if prev is not None else None
            prev = ev["seen"]
            out.append({"saga_id": "events", "step": ev["type"], "phase": None, "attempt": i, "status": "done",
                        "duration_s": took, "finished_at": ev["at"] or "-"})
        return out


class LineView:
    """Plain lines: a step when it completes, the queue position when it changes."""

    def __init__(self, allocation_id: str):
        self.id, self.printed, self.queue, self.state = allocation_id, set(), None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def line(self, text: str) -> None:
        print(text, flush=True)

    def update(self, a: dict, steps: list[dict]) -> None:
        """Lines for what is new since the last read: each step that ended, the state (the steps' outcome: a read
        that finds the saga done prints its steps before ACTIVE), then the queue position."""
        for st in steps:
            if is_final(st) and step_key(st) not in self.printed:
                self.printed.add(step_key(st))
                self.line(f"step {step_text(st)}")
        if a["state"] != self.state:
            self.state = a["state"]
            self.line(f"state {a['state']}")
        q = queue_text(a)
        if q and q != self.queue:
            self.line(q)
        self.queue = q


class LiveView(LineView):
    """The same story as a rich Live table that redraws in place."""

    def __enter__(self):
        from rich.console import Console
        from rich.live import Live
        self.console = Console()
        self.live = Live(console=self.console, refresh_per_second=8, transient=False)
        self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.live.__exit__(*exc)
        return False

    def line(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)   # the terminal wraps it

    def update(self, a: dict, steps: list[dict]) -> None:
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text
        t = Table(box=None, padding=(0, 2, 0, 0))
        for h in ("step", "status", "took"):
            t.add_column(h.upper())
        for st in steps:
            dur = st.get("duration_s")
            name = st.get("step") or "?"
            t.add_row(f"{name} (undo)" if st.get("phase") == "compensate" else name, str(st.get("status") or "-"),
                      f"{dur:.3f}s" if isinstance(dur, int | float) else "…")
        head = [Text(f"allocation {a['id']}  {a['state']}"), *([Text(q)] if (q := queue_text(a)) else [])]
        self.live.update(Group(*head, t), refresh=True)
