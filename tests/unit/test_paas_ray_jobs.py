"""Tessera's jobs as Ray submissions, and Ray's job records as Tessera's states (pure)."""
from __future__ import annotations

import uuid

from services.paas.adapters.ray.jobs import already_exists, status_of, submission
from services.paas.domain.runtime import JobSpec


def job(**kw) -> JobSpec:
    return JobSpec(job_id=uuid.UUID(int=7), name="train", command=("python", "train.py", "--lr", "0.1 x"), **kw)


def test_a_one_task_job_is_one_entrypoint_holding_its_gpus_under_an_id_made_of_the_job_id():
    body = submission(job(gpus_per_task=2, env={"A": "1"}, time_limit_s=60))
    assert body["submission_id"] == f"tessera-{uuid.UUID(int=7)}"
    assert body["entrypoint"] == "timeout --kill-after=10 60 python train.py --lr '0.1 x'"
    assert body["entrypoint_num_gpus"] == 2 and body["runtime_env"] == {"env_vars": {"A": "1"}}
    assert body["metadata"]["time_limit_s"] == "60"


def test_a_many_task_job_runs_its_entrypoint_once_holding_no_gpu_and_told_its_fan_out():
    body = submission(job(tasks=4, gpus_per_task=1))
    assert body["entrypoint_num_gpus"] == 0
    assert body["runtime_env"]["env_vars"] == {"TESSERA_TASKS": "4", "TESSERA_GPUS_PER_TASK": "1"}


def test_a_second_submission_is_recognised_by_rays_text_not_its_status():
    assert already_exists(500, "ValueError: Job with submission_id tessera-x already exists. Please use")
    assert not already_exists(500, "Internal error") and not already_exists(200, "already exists")


def record(status: str, start=1_000_000, end=None, limit="60", **kw) -> dict:
    return {"status": status, "start_time": start, "end_time": end, "metadata": {"time_limit_s": limit},
            "driver_exit_code": kw.pop("code", None), "message": kw.pop("message", ""), **kw}


def test_rays_states_map_to_tesseras_and_milliseconds_to_seconds():
    done = status_of(record("SUCCEEDED", end=1_005_000, code=0, driver_node_id="n1"), {"n1": "alpha-1"})
    assert (done.state, done.exit_code, done.started_at, done.ended_at, done.nodes) == \
        ("SUCCEEDED", 0, 1000.0, 1005.0, ("alpha-1",))
    assert status_of(record("FAILED", end=1_001_000, code=3)).exit_code == 3
    assert status_of(record("PENDING")).started_at is None          # Ray's start_time is the submission's
    assert status_of(record("STOPPED", end=1_010_000)).state == "CANCELLED"


def test_the_exit_of_timeout_after_the_limit_reads_timeout_and_the_same_code_sooner_failed():
    for code in (124, 137):
        timed_out = status_of(record("FAILED", end=1_061_000, code=code))
        assert timed_out.state == "TIMEOUT" and "time limit of 60s" in timed_out.message
    assert status_of(record("FAILED", end=1_030_000, code=124)).state == "FAILED"
    assert status_of(record("FAILED", end=1_061_000, code=1)).state == "FAILED"
    assert status_of(record("STOPPED", end=1_061_000)).state == "CANCELLED"
