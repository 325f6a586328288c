"""The head's dashboard server (Jobs API, state API, cluster status) over the cluster's Unix socket.

The dashboard listens only on the head's tenant address; ``socat`` in the head's namespace bridges it to a Unix
socket in the cluster's state dir, which is how Tessera (not on the tenant's network) reaches it.
"""
from __future__ import annotations

import json

import aiohttp

from ...domain.runtime import ClusterError
from .jobs import already_exists


class RayApi:
    """One cluster's dashboard server, reached at ``socket`` (a path)."""

    def __init__(self, socket: str, timeout_s: float = 30.0) -> None:
        self.socket, self.timeout_s = socket, timeout_s

    async def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
        """(HTTP status, body text); ClusterError (retryable) when the server cannot be reached."""
        try:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.socket),
                                             timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as session:
                async with session.request(method, f"http://ray{path}", json=body) as resp:
                    return resp.status, await resp.text()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ClusterError(f"ray dashboard at {self.socket}: {exc!r}") from exc

    async def json(self, method: str, path: str, body: dict | None = None, *, missing_ok: bool = False):
        """The JSON answer; a 404 is None with ``missing_ok``; any other failure is ClusterError (permanent: 4xx)."""
        status, text = await self.call(method, path, body)
        if status == 404 and missing_ok:
            return None
        if status >= 400:
            raise ClusterError(f"ray {method} {path}: HTTP {status}: {text.strip()[-300:]}",
                               permanent=400 <= status < 500)
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ClusterError(f"ray {method} {path}: not JSON: {text[:200]!r}") from exc

    async def version(self) -> str | None:
        """Ray's version once the Jobs API answers, else None."""
        try:
            return (await self.json("GET", "/api/version")).get("ray_version")
        except ClusterError:
            return None

    async def submit(self, body: dict) -> str:
        """Submit; a submission id Ray already holds returns that id (Ray answers 500 "already exists")."""
        status, text = await self.call("POST", "/api/jobs/", body)
        if already_exists(status, text):
            return body["submission_id"]
        if status >= 400:
            permanent = 400 <= status < 500
            raise ClusterError(f"ray submit: HTTP {status}: {text.strip()[-300:]}", permanent=permanent)
        return json.loads(text)["submission_id"]

    async def job(self, submission_id: str) -> dict | None:
        return await self.json("GET", f"/api/jobs/{submission_id}", missing_ok=True)

    async def jobs(self) -> list[dict]:
        return await self.json("GET", "/api/jobs/") or []

    async def logs(self, submission_id: str) -> str:
        answer = await self.json("GET", f"/api/jobs/{submission_id}/logs", missing_ok=True)
        return (answer or {}).get("logs", "")

    async def stop(self, submission_id: str) -> None:
        await self.json("POST", f"/api/jobs/{submission_id}/stop", missing_ok=True)

    async def nodes(self) -> list[dict]:
        """The state API's node records (``node_id``, ``node_ip``, ``state``: ALIVE|DEAD, ``state_message``)."""
        answer = await self.json("GET", "/api/v0/nodes?limit=10000")
        return answer["data"]["result"]["result"]

    async def usage_by_node(self) -> dict[str, dict]:
        """Node id -> resource -> [used, total], from the autoscaler's cluster status."""
        answer = await self.json("GET", "/api/cluster_status")
        report = ((answer.get("data") or {}).get("clusterStatus") or {}).get("loadMetricsReport") or {}
        return report.get("usageByNode") or {}
