"""The CLI's `cluster` and `job` nouns: the request bodies they send, how they render clusters and jobs, and
`job watch` following a job to its end (against a fake API client)."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.commands import paas
from cli.errors import USAGE, CliError
from cli.render import to_text

CLUSTER = {"id": "c1", "name": "train", "kind": "slurm", "shape": "vm.8gpu", "node_count": 2,
           "requested_node_count": 3, "state": "scaling", "driver": "slurm", "controller": "10.0.0.10",
           "nodes": [{"name": "train-0", "state": "ready", "address": "10.0.0.10"},
                     {"name": "train-1", "state": "joining", "address": None}],
           "autoscaling": {"min_nodes": 1, "max_nodes": 4, "target_gpu_util": 0.7, "cooldown_s": 300},
           "reason": None, "created_at": "2026-01-01T00:00:00Z"}
JOB = {"id": "j1", "name": "fit", "cluster_id": "c1", "state": "RUNNING", "tasks": 4, "gpus_per_task": 2,
       "exit_code": None, "external_id": "42", "nodes": ["train-0"], "reason": None}


class FakeClient:
    """Records each call; answers GETs from ``reads`` in order (the last one repeats)."""

    def __init__(self, reads: list | None = None):
        self.calls: list[tuple] = []
        self.reads = list(reads or [])

    def request(self, method, path, body=None, **_):
        self.calls.append((method, path, body))
        return {"id": "new", "state": "placing" if "cluster" in path else "SUBMITTING"}

    def get(self, path, **query):
        self.calls.append(("GET", path, query))
        return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]

    def items(self, path, **query):
        self.calls.append(("LIST", path, query))
        return [CLUSTER]


@pytest.fixture
def fake(monkeypatch):
    def install(reads=None) -> FakeClient:
        c = FakeClient(reads)
        monkeypatch.setattr(paas, "client", lambda: c)
        return c
    return install


def test_a_cluster_body_carries_autoscaling_only_with_both_bounds():
    body = paas.cluster_body("train", "ray", "vm.1gpu", 2, None, "gold", 10, 1, 4, 0.8, 60)
    assert body == {"name": "train", "kind": "ray", "shape": "vm.1gpu", "nodes": 2, "priority": 10, "pool": "gold",
                    "autoscaling": {"min_nodes": 1, "max_nodes": 4, "target_gpu_util": 0.8, "cooldown_s": 60}}
    assert "autoscaling" not in paas.cluster_body("t", "slurm", "s", 1, "n1", None, 0, None, None, 0.7, 300)
    with pytest.raises(CliError) as refused:
        paas.cluster_body("t", "slurm", "s", 1, None, None, 0, 2, None, 0.7, 300)
    assert refused.value.code == USAGE


def test_a_job_body_takes_a_command_or_an_entrypoint_and_env_pairs():
    body = paas.job_body("c1", "fit", ["python", "-c", "x=1"], None, 2, 1, 600, ["A=1", "B=x=y"], None, False)
    assert body == {"cluster_id": "c1", "name": "fit", "tasks": 2, "gpus_per_task": 1, "time_limit_s": 600,
                    "env": {"A": "1", "B": "x=y"}, "privileged": False, "command": ["python", "-c", "x=1"]}
    ray = paas.job_body("c1", "fit", [], "python x.py", 1, 0, 3600, [], "img:1", True)
    assert (ray["entrypoint"], ray["image"], "command" in ray) == ("python x.py", "img:1", False)
    for command, entrypoint, env in ([], None, []), (["a"], "b", []), (["a"], None, ["NOEQUALS"]):
        with pytest.raises(CliError) as refused:
            paas.job_body("c1", "fit", command, entrypoint, 1, 0, 3600, env, None, False)
        assert refused.value.code == USAGE


def test_a_cluster_renders_ready_nodes_the_pending_scale_and_in_wide_its_addresses():
    lines = to_text([CLUSTER], paas.CLUSTERS, "table").splitlines()
    assert lines[0].split() == ["ID", "NAME", "KIND", "SHAPE", "NODES", "STATE", "DRIVER"]
    assert lines[1].split() == ["c1", "train", "slurm", "vm.8gpu", "1/2→3", "scaling", "slurm"]
    wide = to_text([CLUSTER], paas.CLUSTERS, "wide").splitlines()[1].split()
    assert wide[7:10] == ["10.0.0.10", "10.0.0.10", "1-4@0.7"]


def test_a_job_renders_its_gpus_in_all():
    lines = to_text([JOB], paas.JOBS, "table").splitlines()
    assert lines[0].split() == ["ID", "NAME", "CLUSTER", "STATE", "TASKS", "GPUS", "EXIT"]
    assert lines[1].split() == ["j1", "fit", "c1", "RUNNING", "4", "8", "-"]


def test_cluster_create_and_scale_send_their_bodies(fake):
    api = fake()
    runner = CliRunner()
    r = runner.invoke(paas.cluster_app, ["create", "train", "--kind", "slurm", "--shape", "vm.8gpu", "--nodes", "4",
                                         "--min-nodes", "2", "--max-nodes", "8"])
    assert r.exit_code == 0, r.output
    assert runner.invoke(paas.cluster_app, ["scale", "c1", "--nodes", "6"]).exit_code == 0
    assert api.calls[0][:2] == ("POST", "/v1/clusters")
    assert (api.calls[0][2]["nodes"], api.calls[0][2]["autoscaling"]["max_nodes"]) == (4, 8)
    assert api.calls[1] == ("POST", "/v1/clusters/c1/scale", {"nodes": 6})


def test_job_submit_sends_the_words_after_the_dashes_as_the_argv(fake):
    api = fake()
    r = CliRunner().invoke(paas.job_app, ["submit", "c1", "fit", "--tasks", "2", "-e", "EPOCHS=3", "--", "python",
                                          "train.py", "--lr", "0.1"])
    assert r.exit_code == 0, r.output
    [(method, path, body)] = api.calls
    assert (method, path, body["command"], body["env"], body["tasks"]) == (
        "POST", "/v1/jobs", ["python", "train.py", "--lr", "0.1"], {"EPOCHS": "3"}, 2)


def test_follow_says_each_new_state_once_and_stops_at_the_end_without_sleeping_again():
    reads = iter([{**JOB, "state": s} for s in ("PENDING", "PENDING", "RUNNING", "SUCCEEDED")])
    said, slept = [], []
    last = paas.follow(lambda: next(reads), 1.0, said.append, slept.append)
    assert said == ["j1 PENDING", "j1 RUNNING", "j1 SUCCEEDED"]
    assert (last["state"], slept) == ("SUCCEEDED", [1.0, 1.0, 1.0])


def test_job_watch_exits_1_naming_the_end_when_the_job_did_not_succeed(fake, monkeypatch):
    monkeypatch.setattr(paas.time, "sleep", lambda s: None)
    fake([{**JOB, "state": "RUNNING"}, {**JOB, "state": "FAILED", "exit_code": 3, "reason": "exit 3"}])
    r = CliRunner().invoke(paas.job_app, ["watch", "j1"])
    assert r.exit_code == 1 and isinstance(r.exception, CliError)
    assert "ended FAILED (exit code 3)" in r.exception.message
    assert "j1 FAILED (exit 3)" in r.output


def test_a_cluster_body_carries_the_tolerations_given():
    body = paas.cluster_body("hpc", "slurm", "vm.1gpu", 2, None, "paas", 0, None, None, 0.7, 300,
                             ["dedicated=paas:NoSchedule"])
    assert body["pool"] == "paas" and body["tolerations"] == ["dedicated=paas:NoSchedule"]
    assert "tolerations" not in paas.cluster_body("hpc", "slurm", "vm.1gpu", 2, None, None, 0, None, None, 0.7, 300)


def test_a_cluster_over_held_allocations_sends_their_ids_and_refuses_a_second_form(fake):
    body = paas.cluster_body("mine", "ray", None, None, None, None, 0, None, None, 0.7, 300, None, ["a1", "a2"])
    assert body == {"name": "mine", "kind": "ray", "priority": 0, "allocation_ids": ["a1", "a2"]}
    for shape, nodes, allocations in (("vm.1gpu", None, ["a1"]), (None, 2, ["a1"]), (None, None, None),
                                      ("vm.1gpu", None, None)):
        with pytest.raises(CliError) as refused:
            paas.cluster_body("mine", "ray", shape, nodes, None, None, 0, None, None, 0.7, 300, None, allocations)
        assert refused.value.code == USAGE
    api = fake()
    r = CliRunner().invoke(paas.cluster_app, ["create", "mine", "--kind", "slurm", "--allocation", "a1",
                                              "--allocation", "a2"])
    assert r.exit_code == 0, r.output
    assert api.calls == [("POST", "/v1/clusters", {"name": "mine", "kind": "slurm", "priority": 0,
                                                   "allocation_ids": ["a1", "a2"]})]
    refused = CliRunner().invoke(paas.cluster_app, ["create", "mine", "--kind", "slurm", "--allocation", "a1",
                                                    "--nodes", "2"])
    assert isinstance(refused.exception, CliError) and refused.exception.code == USAGE and len(api.calls) == 1
