"""A short chaos run with a fixed seed: about a minute of faults (services killed and paused, a node-agent killed,
a node's heartbeats lost, an XID, a JetStream server and PostgreSQL restarted) under three tenants' workload,
then every invariant of ``tooling.chaos_checks`` holds once the platform has settled. ``python -m tooling.chaos``
runs longer ones, with any seed."""
from __future__ import annotations

import json

import pytest

from tooling.chaos import run

pytestmark = pytest.mark.timeout(300)

SEED, RUN_S = 7, 60.0


async def test_a_short_chaos_run_keeps_every_invariant(tmp_path):
    summary = await run(tmp_path / "chaos", seed=SEED, run_s=RUN_S, nodes=3, settle_s=60.0)
    assert summary["faults_injected"] >= 8, summary["faults"]
    assert summary["requests_completed"] > 0 and summary["p99_create_to_active_s"] is not None, summary
    assert summary["violations"] == [], json.dumps(summary["violations"], indent=1)
