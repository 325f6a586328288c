"""Loaders for the deploy files (compose, Kubernetes, NATS config, init SQL) used by test_deploy."""
from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from shared.contract import SERVICES

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
INITDB_SQL = ROOT / "deploy" / "compose" / "initdb" / "01-tessera-roles.sql"
NATS_CONF = ROOT / "deploy" / "nats" / "nats-server.conf"
K8S = ROOT / "deploy" / "k8s"
K8S_VERSION = "1.33.0"   # a release every supported managed Kubernetes still offers; kubernetes-validate ships it

# The name a service has in compose and Kubernetes (DNS names allow no underscore).
DEPLOY_NAME = {s: s.replace("_", "-") for s in SERVICES}
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet")
_VAR = re.compile(r"\$\$|\$\{(\w+)(?:(:?-)([^}]*))?\}")


def compose_schema() -> dict[str, Any]:
    """The Compose Specification JSON schema, as vendored (with its license) by the check-jsonschema wheel."""
    return json.loads(files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text())


def interpolate(value: Any, env: dict[str, str] | None = None) -> Any:
    """Resolve ${VAR}, ${VAR:-default}, ${VAR-default} and $$ as `docker compose` does, from ``env`` (default: empty).

    Raises KeyError for a ${VAR} without a default that ``env`` does not set: compose would warn and use "".
    """
    env = env or {}
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, default = m.groups()
        if op is None:
            return env[name]
        return (env.get(name) or default) if op == ":-" else env.get(name, default)
    return _VAR.sub(sub, value)


def compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    return interpolate(yaml.safe_load(COMPOSE.read_text()), env)


def k8s_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


@functools.cache
def k8s_objects() -> tuple[tuple[Path, dict[str, Any]], ...]:
    """Every object of every manifest, parsed once per test session (callers must not modify them)."""
    return tuple((p, doc) for p in k8s_files() for doc in yaml.safe_load_all(p.read_text()) if doc)


def find(kind: str, name: str) -> dict[str, Any]:
    matches = [d for _, d in k8s_objects() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name} under deploy/k8s, found {len(matches)}"
    return matches[0]


def workloads() -> Iterator[dict[str, Any]]:
    return (d for _, d in k8s_objects() if d["kind"] in WORKLOADS)


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}
