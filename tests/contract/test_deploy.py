"""The deploy files are valid for their real validators and describe the platform we build.

Nothing here runs a container (CI has no Docker engine): Kubernetes manifests go through
kubernetes-validate's schemas (strict), compose.yaml through the Compose Specification schema,
and the init SQL through a real PostgreSQL 16 (the NATS configurations and the bus's secrets:
test_deploy_bus.py).
"""
from __future__ import annotations

import os
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

from shared.contract import SERVICES
from tooling.embedded import EmbeddedPostgres

from .deploy_files import (
    COMPOSE,
    DEPLOY_NAME,
    INITDB_SQL,
    K8S,
    K8S_VERSION,
    compose,
    compose_schema,
    env_of,
    find,
    k8s_files,
    k8s_objects,
    pod_spec,
    workloads,
)

# --- Kubernetes: schema validation -----------------------------------------------------------------


@pytest.mark.parametrize("path", k8s_files(), ids=lambda p: p.name)
def test_kubernetes_manifest_is_valid_in_strict_mode(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs, f"{path} holds no object"
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


BROKEN_DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: broken}
spec:
  replicas: two
  selector: {matchLabels: {app: broken}}
  template:
    metadata: {labels: {app: broken}}
    spec:
      containers:
        - name: broken
          image: tessera:0.1.0
          livenessProbe: {httpGet: {path: /healthz, prot: 8080}}
"""


def test_kubernetes_validation_rejects_a_broken_manifest():
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(yaml.safe_load(BROKEN_DEPLOYMENT), K8S_VERSION, strict=True)
    typo_only = yaml.safe_load(BROKEN_DEPLOYMENT.replace("replicas: two", "replicas: 2").replace("prot:", "port:"))
    typo_only["spec"]["template"]["spec"]["containers"][0]["imagePullPolicey"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolicey"):
        kubernetes_validate.validate(typo_only, K8S_VERSION, strict=True)   # strict: unknown fields are errors


def test_kustomization_lists_every_manifest_but_the_secret_example():
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    present = {p.name for p in k8s_files()} - {"secret.example.yaml"}
    assert sorted(listed) == sorted(present)


# --- Kubernetes: what the manifests say --------------------------------------------------------------


def test_every_service_runs_in_kubernetes_with_its_module_and_database_role():
    for service, name in DEPLOY_NAME.items():
        workload = find("DaemonSet" if service == "node_agent" else "Deployment", name)
        container = pod_spec(workload)["containers"][0]
        assert f"python -m services.{service}" in " ".join(container["command"])
        env = env_of(container)
        assert env["TESSERA_DB_DSN"]["value"].startswith(f"postgresql://tessera_{service}:")
        assert {"configMapRef": {"name": "tessera-config"}} in container["envFrom"]


def _containers(workload: dict) -> list[dict]:
    spec = pod_spec(workload)
    return spec.get("initContainers", []) + spec["containers"]


def test_every_workload_has_probes_limits_and_a_restricted_security_context():
    checked = 0
    for w in workloads():
        where = f"{w['kind']}/{w['metadata']['name']}"
        pod = pod_spec(w)
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        for c in _containers(w):
            res, sc = c["resources"], c["securityContext"]
            assert {"cpu", "memory"} <= set(res["requests"]) and {"cpu", "memory"} <= set(res["limits"]), where
            assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"] and sc["seccompProfile"]["type"] == "RuntimeDefault", where
        for c in pod["containers"]:
            assert "readinessProbe" in c and "livenessProbe" in c, where
        checked += 1
    assert checked == len(SERVICES) + 2   # + the NATS and PostgreSQL StatefulSets


def test_tessera_services_probe_readyz_for_readiness_and_healthz_for_liveness():
    for service, name in DEPLOY_NAME.items():
        c = pod_spec(find("DaemonSet" if service == "node_agent" else "Deployment", name))["containers"][0]
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_every_process_is_restarted_when_it_exits_in_compose_and_kubernetes():
    """What `./taskw up` does for its processes (docs/operations.md), the deployments do too: every compose
    service, infrastructure included, is `restart: unless-stopped`; every Kubernetes workload states
    `restartPolicy: Always` and probes its containers (a hung process is restarted, an unready one gets no traffic)."""
    services = compose()["services"]
    assert {name: s.get("restart") for name, s in services.items()} == dict.fromkeys(services, "unless-stopped")
    kinds = {}
    for w in workloads():
        where = f"{w['kind']}/{w['metadata']['name']}"
        assert pod_spec(w).get("restartPolicy") == "Always", where
        for c in pod_spec(w)["containers"]:
            assert "livenessProbe" in c and "readinessProbe" in c, where
        kinds[w["metadata"]["name"]] = w["kind"]
    assert set(DEPLOY_NAME.values()) | {"nats", "postgres"} <= set(kinds)


def test_gateway_is_exposed_by_a_service_and_every_service_has_a_metrics_port():
    assert {"http", "metrics"} <= {p["name"] for p in find("Service", "gateway")["spec"]["ports"]}
    for service, name in DEPLOY_NAME.items():
        if service != "gateway":
            assert [p["name"] for p in find("Service", f"{name}-metrics")["spec"]["ports"]] == ["metrics"]


def test_node_agent_is_a_daemonset_that_learns_its_node_id_from_its_node():
    ds = find("DaemonSet", "node-agent")
    init = pod_spec(ds)["initContainers"][0]
    assert env_of(init)["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "tessera.io/node-id" in init["command"][-1]
    assert "TESSERA_NODE_ID=" in pod_spec(ds)["containers"][0]["command"][-1]
    assert "TESSERA_INSTANCE" not in env_of(pod_spec(ds)["containers"][0])   # it must not disagree with the node id


def test_nats_is_a_three_server_cluster_with_volumes_and_a_disruption_budget():
    sts = find("StatefulSet", "nats")
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["serviceName"] == "nats-headless"
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    assert find("Service", "nats-headless")["spec"]["clusterIP"] == "None"
    conf = find("ConfigMap", "nats-config")["data"]["nats.conf"]
    for i in range(3):
        assert f"nats://nats-{i}.nats-headless.tessera.svc.cluster.local:6222" in conf
    pdb = find("PodDisruptionBudget", "nats")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]


def test_every_referenced_secret_key_and_configmap_exists():
    secret = find("Secret", "tessera")["stringData"]
    configmaps = {d["metadata"]["name"] for _, d in k8s_objects() if d["kind"] == "ConfigMap"}
    for w in workloads():
        for c in _containers(w):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == "tessera" and ref["key"] in secret, f"{w['metadata']['name']}: {ref}"
            for src in c.get("envFrom", []):
                assert src["configMapRef"]["name"] in configmaps


# --- Compose ---------------------------------------------------------------------------------------


def test_compose_file_matches_the_compose_specification():
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose())]
    assert not errors, "\n".join(errors)


def test_compose_specification_schema_rejects_a_broken_compose_file():
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    doc = compose()
    doc["services"]["gateway"]["restart_policy"] = "always"                   # not a service key
    doc["services"]["billing"]["depends_on"]["nats"]["condition"] = "service_ready"   # not a condition
    assert len(list(validator.iter_errors(doc))) >= 2


def test_every_service_runs_in_compose_with_its_own_role_health_and_dependencies():
    services = compose()["services"]
    assert set(DEPLOY_NAME.values()) | {"nats", "postgres"} == set(services)
    for service, name in DEPLOY_NAME.items():
        s = services[name]
        assert s["command"] == ["python", "-m", f"services.{service}"]
        assert s["build"] == {"context": "../..", "dockerfile": "deploy/compose/Dockerfile"}
        env = s["environment"]
        assert env["TESSERA_NATS_URL"] == "tls://nats:4222" and env["TESSERA_HTTP_PORT"] == "8080"
        assert env["TESSERA_DB_DSN"].startswith(f"postgresql://tessera_{service}:")
        assert "/healthz" in " ".join(s["healthcheck"]["test"])
        assert s["depends_on"] == {"nats": {"condition": "service_healthy"}, "postgres": {"condition": "service_healthy"}}
        assert s["restart"] == "unless-stopped"
    assert services["gateway"]["ports"] == ["8080:8080"]
    assert services["node-agent"]["environment"]["TESSERA_NODE_ID"]
    assert len(services["gateway"]["environment"]["TESSERA_TOKEN_SECRET"]) >= 32


def test_compose_infrastructure_mounts_the_nats_config_and_the_role_script():
    c = compose()
    nats, pg = c["services"]["nats"], c["services"]["postgres"]
    assert nats["image"].startswith("nats:2.11")
    assert "../nats/nats-server.conf:/etc/nats/nats-server.conf:ro" in nats["volumes"]
    assert "./nats.conf:/etc/nats/tessera.conf:ro" in nats["volumes"]
    assert "./secrets/nats/authorization.conf:/etc/nats/authorization.conf:ro" in nats["volumes"]
    assert nats["command"][:2] == ["--config", "/etc/nats/tessera.conf"]
    assert pg["image"] == "postgres:16" and "./initdb:/docker-entrypoint-initdb.d:ro" in pg["volumes"]
    for service in SERVICES:
        assert f"TESSERA_DB_PASSWORD_{service.upper()}" in pg["environment"]
    assert (COMPOSE.parent / "Dockerfile").exists()


def test_dockerfile_installs_requirements_and_runs_as_a_non_root_user():
    text = (COMPOSE.parent / "Dockerfile").read_text()
    assert text.startswith("#") and "FROM python:3.11-slim" in text
    assert "pip install -r requirements.txt" in text
    assert "\nUSER 10001" in text


# --- PostgreSQL roles and schemas -----------------------------------------------------------------


def test_init_sql_is_identical_in_compose_and_kubernetes():
    assert find("ConfigMap", "postgres-initdb")["data"]["01-tessera-roles.sql"] == INITDB_SQL.read_text()


def _psql(pg: EmbeddedPostgres, user: str, password: str, *args: str, env: dict | None = None):
    return subprocess.run([str(pg.bindir / "psql"), "-X", "-h", "127.0.0.1", "-p", str(pg.port), "-U", user, "-d", "tessera",
                           "-v", "ON_ERROR_STOP=1", *args], check=False, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {}), "PGPASSWORD": password})


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    """A throwaway PostgreSQL 16 (roles are cluster-wide: the suite's shared server must not get these)."""
    pg = EmbeddedPostgres(tmp_path_factory.mktemp("initdb-pg"), durable=False).start()
    yield pg
    pg.stop()


def _tessera_roles(pg: EmbeddedPostgres) -> str:
    return _psql(pg, "postgres", pg.password, "-At", "-c",
                 "SELECT string_agg(rolname, ',' ORDER BY rolname) FROM pg_roles WHERE rolname LIKE 'tessera_%'").stdout


def test_init_sql_stops_at_the_first_missing_password_without_creating_a_role(postgres):
    before = _tessera_roles(postgres)
    done = _psql(postgres, "postgres", postgres.password, "-f", str(INITDB_SQL), env={"POSTGRES_DB": "tessera"})
    assert done.returncode != 0 and 'syntax error at or near ":"' in done.stderr
    assert _tessera_roles(postgres) == before


def test_init_sql_creates_each_service_role_confined_to_its_schema(postgres):
    passwords = {f"TESSERA_DB_PASSWORD_{s.upper()}": f"pw-{s}" for s in SERVICES}
    done = _psql(postgres, "postgres", postgres.password, "-f", str(INITDB_SQL), env={"POSTGRES_DB": "tessera", **passwords})
    assert done.returncode == 0, done.stderr
    for service in SERVICES:
        own = _psql(postgres, f"tessera_{service}", f"pw-{service}", "-At", "-c", "CREATE TABLE probe (x int)",
                    "-c", "SELECT current_schema()")
        assert own.returncode == 0 and own.stdout.strip().endswith(service), own.stderr
    wrong_password = _psql(postgres, "tessera_billing", "not-the-password", "-c", "SELECT 1")
    foreign = _psql(postgres, "tessera_billing", "pw-billing", "-c", "CREATE TABLE saga.intruder (x int)")
    public = _psql(postgres, "tessera_billing", "pw-billing", "-c", "CREATE TABLE public.intruder (x int)")
    assert wrong_password.returncode != 0 and "password authentication failed" in wrong_password.stderr
    assert foreign.returncode != 0 and "permission denied" in foreign.stderr
    assert public.returncode != 0 and "permission denied" in public.stderr
