"""Tessera's jobs and nodes in slurmrestd's v0.0.38 shapes, and slurmrestd's answers read back."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from services.paas.adapters.slurm.config import ClusterFiles
from services.paas.adapters.slurm.jobs import expand_hostlist, gpu_count, job_status, layout, node_use, submit_body
from services.paas.adapters.slurm.requeue import again, release
from services.paas.adapters.slurm.rest import Token, raise_for
from services.paas.domain.runtime import ClusterError, JobSpec


def job(tasks: int = 1, gpus: int = 0, **kw) -> JobSpec:
    return JobSpec(job_id=uuid.UUID(int=7), name="train", command=("python", "-c", "print('hi there')"), tasks=tasks,
                   gpus_per_task=gpus, **kw)


def test_a_gpu_job_packs_as_many_tasks_per_node_as_the_smallest_gpu_node_holds():
    assert layout(job(2, 1), [1, 1]) == {"tasks": 2, "tasks_per_node": 1, "nodes": [2, 2], "gpus_per_task": "1"}
    assert layout(job(4, 1), [2, 2, 0]) == {"tasks": 4, "tasks_per_node": 2, "nodes": [2, 2], "gpus_per_task": "1"}
    assert layout(job(1, 2), [4]) == {"tasks": 1, "tasks_per_node": 1, "nodes": [1, 1], "gpus_per_task": "2"}
    assert layout(job(3, 0), [1, 1]) == {"tasks": 3, "nodes": [1, 2]}


def test_the_submission_carries_the_job_id_the_environment_and_a_time_limit_in_whole_minutes():
    body = submit_body(job(time_limit_s=61, env={"SEED": "1"}), [1], ClusterFiles(Path("/s/c")))
    assert body["script"] == "#!/bin/bash\nexec srun --kill-on-bad-exit=1 -- python -c 'print('\"'\"'hi there'\"'\"')'\n"
    spec = body["job"]
    assert spec["comment"] == f"tessera:{uuid.UUID(int=7)}" and spec["time_limit"] == 2
    assert spec["environment"]["SEED"] == "1" and spec["environment"]["SLURM_CONF"] == "/s/c/slurm.conf"
    assert spec["standard_output"] == "/s/c/jobs/%j.out"


def test_host_lists_expand():
    assert expand_hostlist("a-[0-1,3],b") == ("a-0", "a-1", "a-3", "b")
    assert expand_hostlist("n[08-10]") == ("n08", "n09", "n10")
    assert expand_hostlist("") == ()


def test_job_states_map_and_the_exit_code_is_the_process_s():
    done = job_status({"job_state": "COMPLETED", "exit_code": 0, "start_time": 10, "end_time": 12, "nodes": "a-[0-1]",
                       "state_reason": "None"})
    assert (done.state, done.exit_code, done.started_at, done.ended_at, done.nodes, done.message) == (
        "SUCCEEDED", 0, 10.0, 12.0, ("a-0", "a-1"), "")
    assert job_status({"job_state": "FAILED", "exit_code": 768}).exit_code == 3
    assert job_status({"job_state": "CANCELLED", "exit_code": 9}).exit_code == 137
    pending = job_status({"job_state": "PENDING", "start_time": 99, "state_reason": "Resources"})
    assert (pending.state, pending.started_at, pending.exit_code, pending.message) == ("PENDING", None, None, "Resources")
    assert [job_status({"job_state": s}).state for s in ("NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT", "RUNNING")] == [
        "FAILED", "FAILED", "TIMEOUT", "RUNNING"]


def test_a_drain_is_draining_while_work_runs_and_drained_after():
    busy = {"name": "a-1", "state": "allocated", "state_flags": ["DRAIN"], "gres_used": "gpu:1(IDX:0)"}
    assert node_use(busy, 1) == node_use(busy, 1).__class__("a-1", "draining", 1, 1)
    assert node_use({**busy, "state": "idle", "gres_used": "gpu:0"}, 0).state == "drained"
    assert node_use({"name": "a-0", "state": "mixed", "state_flags": [], "gres_used": "gpu:a100:2(IDX:0-1)"}, 2).state == "mixed"
    assert gpu_count("gpu:a100:2(IDX:0-1),gpu:t4:1(IDX:2)") == 3


def test_a_request_slurm_says_is_wrong_is_permanent_and_carries_slurm_s_words():
    with pytest.raises(ClusterError) as wrong:
        raise_for(500, {"errors": [{"error_code": 2014, "error": "Requested node configuration is not available"}]}, "submit")
    assert wrong.value.permanent and "Requested node configuration is not available" in str(wrong.value)
    with pytest.raises(ClusterError) as busy:
        raise_for(500, {"errors": [{"error_code": 1007, "error": "Socket timed out"}]}, "submit")
    assert not busy.value.permanent
    with pytest.raises(ClusterError) as bad:
        raise_for(400, {}, "submit")
    assert bad.value.permanent
    raise_for(200, {"errors": []}, "ping")


async def test_a_token_is_fetched_again_after_half_its_life_or_when_asked():
    fetched = []

    async def fetch(lifespan: int) -> str:
        fetched.append(lifespan)
        return f"t{len(fetched)}"
    token = Token(fetch, lifespan_s=600)
    assert [await token.value(), await token.value()] == ["t1", "t1"]
    assert await token.value(fresh=True) == "t2"
    token._expires -= 301
    assert await token.value() == "t3" and fetched == [600, 600, 600]


class _Rest:
    def __init__(self, jobs: list[dict]) -> None:
        self._jobs = jobs

    async def jobs(self) -> list[dict]:
        return self._jobs


class _Daemons:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def scontrol(self, netns, *args: str) -> str:
        self.calls.append(args)
        return ""


async def test_only_the_jobs_a_loss_ended_are_requeued_and_the_rest_are_left_alone():
    rest = _Rest([{"job_id": 7, "job_state": "FAILED"}, {"job_id": 8, "job_state": "NODE_FAIL"},
                  {"job_id": 9, "job_state": "PENDING"}, {"job_id": 10, "job_state": "COMPLETED"},
                  {"job_id": 11, "job_state": "FAILED"}])
    daemons = _Daemons()
    assert await again(daemons, "ns", rest, ["7", "8", "9", "10"]) == ["7", "8"]   # 11 was not requeued by Tessera
    assert daemons.calls == [("requeue", "7"), ("requeue", "8")]


async def test_the_requeued_jobs_start_at_once_and_one_left_held_by_the_requeue_is_released_first():
    rest = _Rest([{"job_id": 7, "job_state": "PENDING", "state_reason": "JobHeldUser"},
                  {"job_id": 8, "job_state": "PENDING", "state_reason": "None"},
                  {"job_id": 9, "job_state": "PENDING", "state_reason": "JobHeldUser"},   # not requeued by Tessera
                  {"job_id": 10, "job_state": "PENDING", "state_reason": "BeginTime"},
                  {"job_id": 11, "job_state": "RUNNING"}])
    daemons = _Daemons()
    assert await release(daemons, "ns", rest, {7, 8, 11}) == [7, 8, 10]
    assert daemons.calls == [("release", "7"), ("update", "JobId=7", "StartTime=now"),
                             ("update", "JobId=8", "StartTime=now"), ("update", "JobId=10", "StartTime=now")]
