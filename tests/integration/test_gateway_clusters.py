"""/v1/clusters and /v1/jobs through the gateway, against real NATS and PostgreSQL: writes travel to the paas
service as commands (asserted as queued and sent), reads come from the gateway's projection of paas.* events,
which these tests publish as the paas service would (it is played here, not run)."""
from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from tests.support.gateway import (
    PROJECTED_WITHIN_S,
    assert_problem,
    ensure_default_shapes,
    node_doc,
    outbox_count,
    project,
)
from tests.support.polling import eventually


@pytest.fixture
async def shapes(api, nc) -> None:
    await ensure_default_shapes(api, nc)


def body(name: str | None = None, **over) -> dict:
    return {"name": name or f"c-{uuid.uuid4().hex[:8]}", "kind": "slurm", "shape": "vm.1gpu", "nodes": 2, **over}


async def create(client, **over) -> dict:
    r = await client.post("/v1/clusters", body(**over))
    assert r.status == 202, r.body
    return r.body


def cluster_doc(c: dict, version: int, state: str, **over) -> dict:
    """A paas.cluster_changed document of the cluster the gateway accepted (``c``: its 202 body)."""
    now = datetime.now(UTC).isoformat()
    nodes = [{"name": f"{c['name']}-{i}", "allocation_id": str(uuid.uuid4()), "state": "ready",
              "address": f"10.0.0.{10 + i}"} for i in range(c["node_count"])]
    doc = {"cluster_id": c["id"], "tenant_id": c["tenant_id"], "name": c["name"], "kind": c["kind"],
           "shape": c["shape"], "gpu_count": c["gpu_count"], "node_count": c["node_count"], "state": state,
           "driver": "slurm", "controller": "10.0.0.10", "nodes": nodes, "autoscaling": c["autoscaling"],
           "version": version, "created_at": now,
           "updated_at": now}
    return {**doc, **over}


async def paas_says(api, nc, c: dict, version: int, state: str, **over) -> dict:
    doc = cluster_doc(c, version, state, **over)
    await project(api, nc, "paas.cluster_changed", doc, c["tenant_id"])
    return doc


async def ready_cluster(api, nc, client, **over) -> dict:
    c = await create(client, **over)
    await paas_says(api, nc, c, 2, "ready")
    return c


def job_doc(job: dict, version: int, state: str, **over) -> dict:
    doc = {"job_id": job["id"], "tenant_id": job["tenant_id"], "user_id": job["user_id"], "cluster_id": job["cluster_id"],
           "name": job["name"], "state": state, "tasks": job["tasks"], "gpus_per_task": job["gpus_per_task"],
           "time_limit_s": job["time_limit_s"], "nodes": ["x-0"], "version": version,
           "submitted_at": job["submitted_at"]}
    return {**doc, **over}


async def shown(client, path: str, until) -> dict:
    async def read():
        return (await client.get(path)).body
    return await eventually(read, until=until, timeout=PROJECTED_WITHIN_S, what=path)


async def sent(api, type_: str, tenant_id: str) -> int:
    return await api.commands_of(type_, tenant_id)


# --- clusters -----------------------------------------------------------------------------------------------

async def test_a_cluster_is_accepted_placing_sends_one_create_and_shows_the_newest_document(api, nc, watch, shapes):
    admin, tenant_id = await api.tenant_user("tenant_admin")
    commands = await watch("paas.cmd.create_cluster")
    r = await admin.post("/v1/clusters", body("train", nodes=2, autoscaling={"min_nodes": 1, "max_nodes": 4}))
    assert r.status == 202, r.body
    c = r.body
    assert r.headers["Location"] == f"/v1/clusters/{c['id']}" == c["links"]["self"]
    assert (c["state"], c["kind"], c["shape"], c["gpu_count"], c["node_count"], c["nodes"], c["driver"],
            c["version"]) == ("placing", "slurm", "vm.1gpu", 1, 2, [], None, 0)
    [(_, env, _)] = await commands.wait_for(lambda i: i[1]["data"]["cluster_id"] == c["id"])
    data = env["data"]
    assert (data["tenant_id"], data["name"], data["kind"], data["shape"], data["gpu_count"], data["node_count"]) == (
        tenant_id, "train", "slurm", "vm.1gpu", 1, 2)
    assert data["autoscaling"] == {"min_nodes": 1, "max_nodes": 4, "target_gpu_util": 0.7, "cooldown_s": 300}
    # documents arrive out of order: the highest version stays
    await paas_says(api, nc, c, 3, "ready")
    await paas_says(api, nc, c, 1, "provisioning", nodes=[])
    got = await shown(admin, f"/v1/clusters/{c['id']}", lambda b: b["state"] == "ready")
    assert (got["driver"], got["controller"], got["created_at"], got["version"]) == ("slurm", "10.0.0.10",
                                                                                      c["created_at"], 3)
    assert [(n["name"], n["state"], n["address"]) for n in got["nodes"]] == [
        ("train-0", "ready", "10.0.0.10"), ("train-1", "ready", "10.0.0.11")]
    assert_problem(await admin.post("/v1/clusters", body("train")), 409)
    scaled = await admin.post(f"/v1/clusters/{c['id']}/scale", {"nodes": 3})
    assert (scaled.status, scaled.body["requested_node_count"]) == (202, 3)
    assert_problem(await admin.post(f"/v1/clusters/{c['id']}/scale", {"nodes": 5}), 409)
    for _ in range(2):
        deleting = await admin.delete(f"/v1/clusters/{c['id']}")
        assert (deleting.status, deleting.body["state"]) == (202, "deleting")
    counts = [await sent(api, f"paas.{t}", tenant_id) for t in ("create_cluster", "scale_cluster", "delete_cluster")]
    assert counts == [1, 1, 1]
    await paas_says(api, nc, c, 9, "deleted", nodes=[])
    await eventually(lambda: admin.get(f"/v1/clusters/{c['id']}"), until=lambda r: r.status == 404,
                     timeout=PROJECTED_WITHIN_S, what="the deleted cluster gone")


async def test_an_idempotency_key_creates_one_cluster_and_refuses_another_body(api, shapes):
    admin, tenant_id = await api.tenant_user("tenant_admin")
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    first = await admin.post("/v1/clusters", body("once"), headers=key)
    again = await admin.post("/v1/clusters", body("once"), headers=key)
    assert (first.status, again.status, again.headers.get("Idempotent-Replayed")) == (202, 202, "true")
    assert again.body == first.body
    assert_problem(await admin.post("/v1/clusters", body("other"), headers=key), 422, "Idempotency-Key")
    assert await sent(api, "paas.create_cluster", tenant_id) == 1


@pytest.mark.parametrize(("over", "field"), [
    ({"name": "Bad_Name"}, "name"), ({"name": "-x"}, "name"), ({"name": "a" * 32}, "name"),
    ({"nodes": 0}, "nodes"), ({"nodes": 65}, "nodes"), ({"kind": "mesos"}, "kind"),
    ({"shape": "vm.3gpu"}, "shape"), ({"priority": 1001}, "priority"), ({"nodes": "2"}, "nodes"),
    ({"id": str(uuid.uuid4())}, "id"),
    ({"autoscaling": {"min_nodes": 3, "max_nodes": 2}}, "autoscaling"),
    ({"autoscaling": {"min_nodes": 1, "max_nodes": 64, "target_gpu_util": 1.5}}, "autoscaling.target_gpu_util"),
])
async def test_an_invalid_cluster_is_a_422_naming_the_field_and_sends_nothing(api, shapes, over, field):
    admin, tenant_id = await api.tenant_user("tenant_admin")
    assert_problem(await admin.post("/v1/clusters", body(**over)), 422, field)
    assert await sent(api, "paas.create_cluster", tenant_id) == 0


async def test_a_cluster_is_refused_for_a_tenant_user_another_tenants_network_the_quota_and_a_policy(api, nc, shapes):
    admin, tenant_id = await api.tenant_user("tenant_admin")
    user, _ = await api.new_user(tenant_id)
    other, _ = await api.tenant_user("tenant_admin")
    net = await other.post("/v1/networks", {"name": "theirs", "cidr": "10.77.0.0/24"})
    assert net.status == 202, net.body
    assert_problem(await user.post("/v1/clusters", body()), 403)
    for network_id in (net.body["id"], str(uuid.uuid4())):
        assert_problem(await admin.post("/v1/clusters", body(network_id=network_id)), 404)
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    await project(api, nc, "scheduler.node_changed", node_doc(str(uuid.uuid4()), f"n-{uuid.uuid4().hex[:8]}", 1,
                                                              pool=pool, status="schedulable"))
    await project(api, nc, "scheduler.quota_changed", {"tenant_id": tenant_id, "gpu_model": "H100", "pool": pool,
                                                       "user_id": None, "limit": 4, "guaranteed": 0, "used": 0,
                                                       "version": 1})
    over = assert_problem(await admin.post("/v1/clusters", body(shape="vm.2gpu", nodes=3, pool=pool)), 403)
    assert (over["type"].endswith("/quota-exceeded"), over["quota"], over["limit"], over["requested"]) == (
        True, f"tenant {tenant_id} H100 in pool {pool}", 4, 6)
    policy = await admin.post("/v1/policies", {
        "scope": "tenant", "tenant_id": tenant_id, "name": "no-4gpu-nodes",
        "text": '@reason("no 4-GPU nodes in this tenant")\nforbid (principal, action == '
                'Tessera::Action::"createAllocation", resource is Tessera::Allocation)\n'
                'when { resource.shape == "vm.4gpu" };'})
    assert policy.status == 201, policy.body
    denied = assert_problem(await admin.post("/v1/clusters", body(shape="vm.4gpu", nodes=1)), 403)
    assert (denied["policy_id"], denied["reason"]) == (policy.body["id"], "no 4-GPU nodes in this tenant")
    assert await sent(api, "paas.create_cluster", tenant_id) == 0
    fits = await admin.post("/v1/clusters", body(shape="vm.2gpu", nodes=2, pool=pool))
    assert fits.status == 202, fits.body
    assert await sent(api, "paas.create_cluster", tenant_id) == 1


async def test_another_tenant_gets_404_for_every_cluster_and_job_route_and_lists_nothing(api, nc, shapes):
    alice, _ = await api.tenant_user("tenant_admin")
    bob, bob_tenant = await api.tenant_user("tenant_admin")
    c = await ready_cluster(api, nc, alice)
    job = await alice.post("/v1/jobs", {"cluster_id": c["id"], "name": "mine", "command": ["hostname"]})
    assert job.status == 202, job.body
    cpath, jpath = f"/v1/clusters/{c['id']}", f"/v1/jobs/{job.body['id']}"
    for method, where, payload in [("GET", cpath, None), ("DELETE", cpath, None),
                                   ("POST", f"{cpath}/scale", {"nodes": 3}), ("GET", jpath, None),
                                   ("POST", f"{jpath}/cancel", None), ("GET", f"{jpath}/logs", None),
                                   ("GET", "/v1/clusters/not-a-uuid", None), ("GET", f"/v1/jobs/{uuid.uuid4()}", None)]:
        assert_problem(await bob.call(method, where, json_body=payload), 404)
    assert (await bob.get("/v1/clusters?limit=100")).body["items"] == []
    assert (await bob.get(f"/v1/jobs?cluster_id={c['id']}")).body["items"] == []
    stolen = await bob.post("/v1/jobs", {"cluster_id": c["id"], "name": "theirs", "command": ["id"]})
    assert_problem(stolen, 404)
    assert_problem(await alice.post("/v1/jobs", {"cluster_id": str(uuid.uuid4()), "name": "x", "command": ["id"]}), 404)
    for type_ in ("submit_job", "cancel_job", "scale_cluster", "delete_cluster"):
        assert await sent(api, f"paas.{type_}", bob_tenant) == 0


async def test_clusters_and_jobs_are_paged_newest_first_and_jobs_filter_by_cluster(api, nc, shapes):
    admin, _ = await api.tenant_user("tenant_admin")
    made = [await ready_cluster(api, nc, admin) for _ in range(3)]
    first = (await admin.get("/v1/clusters?limit=2")).body
    second = (await admin.get(f"/v1/clusters?limit=2&cursor={first['next_cursor']}")).body
    assert [c["id"] for c in first["items"] + second["items"]] == [c["id"] for c in reversed(made)]
    assert second["next_cursor"] is None
    for c in made[:2]:
        r = await admin.post("/v1/jobs", {"cluster_id": c["id"], "name": "j", "command": ["true"]})
        assert r.status == 202, r.body
    only = (await admin.get(f"/v1/jobs?cluster_id={made[0]['id']}")).body["items"]
    assert [j["cluster_id"] for j in only] == [made[0]["id"]]
    assert len((await admin.get("/v1/jobs")).body["items"]) == 2
    assert_problem(await admin.get("/v1/jobs?cluster_id=nope"), 422, "cluster_id")


# --- jobs ---------------------------------------------------------------------------------------------------

async def test_a_job_is_accepted_submitting_sends_the_contracts_fields_and_follows_its_documents(api, nc, watch,
                                                                                                 shapes):
    admin, tenant_id = await api.tenant_user("tenant_admin")
    user, _ = await api.new_user(tenant_id)
    c = await ready_cluster(api, nc, admin)
    commands = await watch("paas.cmd.submit_job")
    r = await user.post("/v1/jobs", {"cluster_id": c["id"], "name": "train-1", "command": ["python", "-c", "print(1)"],
                                     "tasks": 2, "gpus_per_task": 1, "env": {"EPOCHS": "3"}})
    assert r.status == 202, r.body
    job = r.body
    assert r.headers["Location"] == job["links"]["self"] == f"/v1/jobs/{job['id']}"
    assert (job["state"], job["tasks"], job["gpus_per_task"], job["version"]) == ("SUBMITTING", 2, 1, 0)
    [(_, env, _)] = await commands.wait_for(lambda i: i[1]["data"]["job_id"] == job["id"])
    assert {k: env["data"][k] for k in ("cluster_id", "name", "command", "entrypoint", "tasks", "env", "image",
                                        "privileged", "time_limit_s")} == {
        "cluster_id": c["id"], "name": "train-1", "command": ["python", "-c", "print(1)"], "entrypoint": None,
        "tasks": 2, "env": {"EPOCHS": "3"}, "image": None, "privileged": False, "time_limit_s": 3600}
    await project(api, nc, "paas.job_changed", job_doc(job, 2, "RUNNING", external_id="42"), tenant_id)
    await project(api, nc, "paas.job_changed", job_doc(job, 1, "PENDING"), tenant_id)
    got = await shown(user, job["links"]["self"], lambda b: b["state"] == "RUNNING")
    assert (got["external_id"], got["nodes"], got["submitted_at"]) == ("42", ["x-0"], job["submitted_at"])
    for _ in range(2):
        cancel = await user.post(f"/v1/jobs/{job['id']}/cancel")
        assert (cancel.status, cancel.body["cancel_requested"]) == (202, True)
    assert await sent(api, "paas.cancel_job", tenant_id) == 1
    # nobody answers paas.job_logs here: a 503 problem, as every live read
    logs = assert_problem(await user.get(f"/v1/jobs/{job['id']}/logs"), 503)
    assert logs["type"].endswith("/paas-unavailable")
    await project(api, nc, "paas.job_changed", job_doc(job, 3, "CANCELLED"), tenant_id)
    await shown(user, job["links"]["self"], lambda b: b["state"] == "CANCELLED" and not b["cancel_requested"])
    assert_problem(await user.post(f"/v1/jobs/{job['id']}/cancel"), 409)


@pytest.mark.parametrize(("over", "field"), [
    ({"name": "Bad Name"}, "name"), ({"command": ["echo", "a\u0000b"]}, "command.1"), ({"command": [""]}, "command.0"),
    ({"env": {"SLURM_JOB_ID": "1"}}, "env"), ({"env": {"1BAD": "x"}}, "env.1BAD"), ({"gpus_per_task": 17}, "gpus_per_task"),
    ({"tasks": 0}, "tasks"), ({"time_limit_s": 59}, "time_limit_s"), ({"entrypoint": "echo hi"}, "body"),
    ({"command": [], "entrypoint": "echo hi"}, "entrypoint"), ({"image": "nvcr.io/x:1"}, "image"),
    ({"tasks": 3, "gpus_per_task": 1}, "gpus_per_task"),
    ({"state": "RUNNING"}, "state"),
])
async def test_an_invalid_job_is_a_422_naming_the_field_and_sends_nothing(api, nc, shapes, over, field):
    admin, tenant_id = await api.tenant_user("tenant_admin")
    c = await ready_cluster(api, nc, admin)     # slurm, 2 nodes of 1 GPU
    r = await admin.post("/v1/jobs", {"cluster_id": c["id"], "name": "j", "command": ["true"], **over})
    problem = assert_problem(r, 422)
    assert field in [e["field"] for e in problem["errors"]], problem
    assert await outbox_count(api, "paas.submit_job", "cluster_id", c["id"]) == 0


async def test_a_tenants_own_job_policy_refuses_a_job_before_anything_is_sent(api, nc, shapes):
    """Per-tenant job policy: a tenant admin's Cedar policy over the `Job` resource (GPUs, time, kind, privileged)
    is judged before the submission is written or sent; the provider's settings apply after it, in the service."""
    admin, tenant_id = await api.tenant_user("tenant_admin")
    c = await ready_cluster(api, nc, admin)     # slurm, 2 nodes of 1 GPU
    policy = await admin.post("/v1/policies", {
        "scope": "tenant", "tenant_id": tenant_id, "name": "one-gpu-short-jobs",
        "text": '@reason("jobs here take one GPU for at most an hour")\nforbid (principal, action == '
                'Tessera::Action::"submitJob", resource is Tessera::Job)\n'
                'when { resource.gpus > 1 || resource.time_limit_s > 3600 || resource.privileged };'})
    assert policy.status == 201, policy.body
    job = {"cluster_id": c["id"], "name": "j", "command": ["true"]}
    for over in ({"tasks": 2, "gpus_per_task": 1}, {"time_limit_s": 7200}, {"privileged": True}):
        denied = assert_problem(await admin.post("/v1/jobs", {**job, **over}), 403)
        assert (denied["policy_id"], denied["reason"]) == (policy.body["id"], "jobs here take one GPU for at most "
                                                                              "an hour"), over
    assert await sent(api, "paas.submit_job", tenant_id) == 0
    assert (await admin.get("/v1/jobs")).body["items"] == []              # nothing written either
    fits = await admin.post("/v1/jobs", {**job, "gpus_per_task": 1})
    assert fits.status == 202, fits.body
    assert await sent(api, "paas.submit_job", tenant_id) == 1
    other, _ = await api.tenant_user("tenant_admin")      # another tenant's policy is not this one's
    theirs = await ready_cluster(api, nc, other)
    assert (await other.post("/v1/jobs", {**job, "cluster_id": theirs["id"], "tasks": 2, "gpus_per_task": 1})).status \
        == 202
