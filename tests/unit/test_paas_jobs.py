"""Job requests, the tenant's job policy and the job lifecycle: every rule names its field."""
from __future__ import annotations

import uuid

import pytest

from services.paas.domain.jobs import (
    FINAL,
    MOVES,
    IllegalTransition,
    JobPolicy,
    JobRequest,
    Lifecycle,
    check,
    runtime_command,
    validate,
)

CLUSTER = uuid.UUID(int=7)


def request(**overrides) -> JobRequest:
    values = {"cluster_id": CLUSTER, "name": "train-1", "command": ("python", "train.py")}
    return JobRequest(**(values | overrides))


def rules(violations) -> set[tuple[str, str]]:
    return {(v.field, v.rule) for v in violations}


# --- The request's own rules ---------------------------------------------------------------------------------

def test_a_plain_request_is_valid():
    assert validate(request()) == []
    assert validate(request(command=None, entrypoint="python train.py | tee log")) == []
    big = request(tasks=1024, gpus_per_task=16, time_limit_s=7 * 24 * 3600, image="nvcr.io/nvidia/pytorch:24.05-py3")
    assert validate(big) == []


@pytest.mark.parametrize("name", ["", "Train", "-x", "a" * 64, "a_b", "a.b"])
def test_a_name_outside_the_label_pattern_is_refused(name):
    assert rules(validate(request(name=name))) == {("name", "pattern")}


def test_command_and_entrypoint_are_exactly_one():
    assert rules(validate(request(entrypoint="x"))) == {("command", "exclusive")}
    assert rules(validate(request(command=None))) == {("command", "exclusive")}


@pytest.mark.parametrize("command, expected", [
    ((), {("command", "length")}),
    (tuple("x" * 65), {("command", "length")}),
    (("ok", "a" * 4097), {("command[1]", "length")}),
    (("ok", "a\x00b"), {("command[1]", "nul")}),
    (("",), {("command[0]", "empty")}),
])
def test_command_items_are_bounded(command, expected):
    assert rules(validate(request(command=command))) == expected


def test_an_argv_at_its_bounds_is_taken():
    assert validate(request(command=tuple("a" * 4096 for _ in range(64)))) == []


@pytest.mark.parametrize("entrypoint, rule", [("a\x00", "nul"), ("x" * (16 * 1024 + 1), "length"), ("  ", "length")])
def test_entrypoint_is_bounded(entrypoint, rule):
    assert rules(validate(request(command=None, entrypoint=entrypoint))) == {("entrypoint", rule)}


@pytest.mark.parametrize("field, value", [
    ("tasks", 0), ("tasks", 1025), ("gpus_per_task", -1), ("gpus_per_task", 17),
    ("time_limit_s", 59), ("time_limit_s", 7 * 24 * 3600 + 1), ("tasks", True), ("tasks", 1.5),
])
def test_numbers_out_of_range_are_refused(field, value):
    assert rules(validate(request(**{field: value}))) == {(field, "range")}


@pytest.mark.parametrize("env, expected", [
    ({"9X": "v"}, {("env.9X", "pattern")}),
    ({"A-B": "v"}, {("env.A-B", "pattern")}),
    ({"SLURM_JOB_ID": "1"}, {("env.SLURM_JOB_ID", "reserved")}),
    ({"ray_address": "x"}, {("env.ray_address", "reserved")}),
    ({"CUDA_VISIBLE_DEVICES": "0"}, {("env.CUDA_VISIBLE_DEVICES", "reserved")}),
    ({"TESSERA_TOKEN": "x"}, {("env.TESSERA_TOKEN", "reserved")}),
    ({"A": "x" * 4097}, {("env.A", "length")}),
    ({"A": "a\x00"}, {("env.A", "nul")}),
    ({f"V{i}": "" for i in range(65)}, {("env", "length")}),
])
def test_env_names_values_and_reserved_prefixes(env, expected):
    assert rules(validate(request(env=env))) == expected


def test_env_at_its_bounds_is_taken():
    env = {f"V{i}": "x" * 4096 for i in range(63)} | {"_" + "a" * 127: ""}
    assert validate(request(env=env)) == []
    assert rules(validate(request(env={"_" + "a" * 128: ""}))) == {("env._" + "a" * 128, "pattern")}


@pytest.mark.parametrize("image", [
    "ubuntu", "ubuntu:24.04", "nvcr.io/nvidia/pytorch:24.05-py3", "localhost:5000/team/app",
    "registry.example.com/a/b@sha256:" + "a" * 64, "ghcr.io/org/img:v1@sha256:" + "0" * 64,
])
def test_oci_references_are_taken(image):
    assert validate(request(image=image)) == []


@pytest.mark.parametrize("image", ["", "Ubuntu", "ubuntu:", "a//b", "ubuntu:-x", "a@sha256:xyz", "-a/b", "a b"])
def test_other_image_strings_are_refused(image):
    assert rules(validate(request(image=image))) == {("image", "pattern")}


# --- Policy and cluster kind ---------------------------------------------------------------------------------

def test_privileged_is_refused_unless_the_policy_allows_it():
    job = request(privileged=True)
    assert rules(check(job, JobPolicy(), "slurm", 8)) == {("privileged", "not_allowed")}
    assert check(job, JobPolicy(allow_privileged=True), "slurm", 8) == []


def test_gpus_are_bounded_by_the_policy_and_by_the_cluster():
    job = request(tasks=4, gpus_per_task=2)
    assert check(job, JobPolicy(max_gpus_per_job=8), "slurm", 8) == []
    assert rules(check(job, JobPolicy(max_gpus_per_job=4), "slurm", 8)) == {("gpus_per_task", "policy")}
    assert rules(check(job, JobPolicy(), "slurm", 7)) == {("gpus_per_task", "capacity")}
    assert rules(check(job, JobPolicy(max_gpus_per_job=4), "slurm", 4)) == {
        ("gpus_per_task", "policy"), ("gpus_per_task", "capacity")}


def test_the_policy_bounds_the_time_limit():
    assert rules(check(request(time_limit_s=7200), JobPolicy(max_time_limit_s=3600), "slurm", 0)) == {
        ("time_limit_s", "policy")}


def test_images_must_match_an_allowed_glob():
    policy = JobPolicy(allowed_images=("nvcr.io/nvidia/*",))
    assert check(request(image="nvcr.io/nvidia/pytorch:24.05-py3"), policy, "kubernetes", 8) == []
    refused = check(request(image="docker.io/evil/miner:latest"), policy, "kubernetes", 8)
    assert rules(refused) == {("image", "not_allowed")}
    assert "nvcr.io/nvidia/*" in refused[0].message
    assert check(request(image="docker.io/any/thing"), JobPolicy(), "kubernetes", 8) == []


def test_each_kind_takes_its_own_program():
    shell = request(command=None, entrypoint="python train.py")
    assert rules(check(shell, JobPolicy(), "slurm", 0)) == {("entrypoint", "kind")}
    assert check(shell, JobPolicy(), "ray", 0) == []
    assert check(request(), JobPolicy(), "ray", 0) == []
    assert rules(check(request(), JobPolicy(), "kubernetes", 0)) == {("image", "required")}
    assert check(request(image="ubuntu"), JobPolicy(), "kubernetes", 0) == []
    assert rules(check(request(image="ubuntu"), JobPolicy(), "slurm", 0)) == {("image", "kind")}


def test_every_violation_is_said_at_once():
    job = request(name="Bad", privileged=True, tasks=2, gpus_per_task=8, env={"RAY_X": "1"}, image="ubuntu")
    assert rules(check(job, JobPolicy(max_gpus_per_job=8), "slurm", 8)) == {
        ("name", "pattern"), ("privileged", "not_allowed"), ("gpus_per_task", "policy"),
        ("gpus_per_task", "capacity"), ("env.RAY_X", "reserved"), ("image", "kind")}


def test_the_runtime_command_is_the_argv_or_the_entrypoint_through_sh():
    assert runtime_command(request()) == ("python", "train.py")
    assert runtime_command(request(command=None, entrypoint="a && b")) == ("sh", "-c", "a && b")


# --- Lifecycle -----------------------------------------------------------------------------------------------

def test_the_happy_path():
    job = Lifecycle()
    for state in ("PENDING", "RUNNING", "SUCCEEDED"):
        job = job.to(state)
    assert job.state == "SUCCEEDED" and job.final


def test_a_rejected_job_keeps_its_reason_and_needs_one():
    job = Lifecycle().to("REJECTED", "image not allowed")
    assert (job.state, job.reason, job.final) == ("REJECTED", "image not allowed", True)
    with pytest.raises(ValueError):
        Lifecycle().to("REJECTED")
    with pytest.raises(IllegalTransition):
        Lifecycle("PENDING").to("REJECTED", "too late: the scheduler has it")


def test_a_cancel_in_flight_ends_cancelled_or_with_the_jobs_own_end():
    cancelling = Lifecycle("RUNNING").to("CANCELLING")
    assert cancelling.to("CANCELLED").state == "CANCELLED"
    assert cancelling.to("SUCCEEDED").state == "SUCCEEDED"
    with pytest.raises(IllegalTransition):
        cancelling.to("RUNNING")


@pytest.mark.parametrize("final", sorted(FINAL))
def test_final_states_are_final(final):
    job = Lifecycle(final, "why")
    assert job.to(final) is job     # a redelivered event
    for target in MOVES:
        if target != final:
            with pytest.raises(IllegalTransition):
                job.to(target, "x")
    assert job.observed("RUNNING") is job


@pytest.mark.parametrize("current, target", [
    ("RUNNING", "PENDING"), ("PENDING", "SUBMITTING"), ("RUNNING", "SUBMITTING"), ("CANCELLING", "PENDING"),
    ("RUNNING", "REJECTED"), ("PENDING", "UNKNOWN"),
])
def test_impossible_moves_are_refused(current, target):
    with pytest.raises(IllegalTransition):
        Lifecycle(current).to(target, "x")


def test_a_poll_may_skip_states_but_never_goes_back():
    assert Lifecycle("PENDING").observed("SUCCEEDED").state == "SUCCEEDED"
    assert Lifecycle("SUBMITTING").observed("RUNNING").state == "RUNNING"
    assert Lifecycle("RUNNING").observed("PENDING").state == "RUNNING"          # a lagging read
    assert Lifecycle("CANCELLING").observed("RUNNING").state == "CANCELLING"    # the cancel has not landed yet
    ended = Lifecycle("RUNNING").observed("FAILED", "exit 3")
    assert (ended.state, ended.reason) == ("FAILED", "exit 3")
    assert ended.observed("SUCCEEDED") is ended


def test_every_state_has_its_moves_and_every_move_a_state():
    assert set(MOVES) == {"SUBMITTING", "PENDING", "RUNNING", "CANCELLING"} | FINAL
    assert all(targets <= set(MOVES) for targets in MOVES.values())
