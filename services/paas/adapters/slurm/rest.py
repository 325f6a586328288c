"""slurmrestd's v0.0.38 API over the cluster's Unix socket, authenticated by a JWT that is refreshed before expiry.

The token comes from ``scontrol token`` run in the controller's namespace with the cluster's SLURM_CONF
(slurmctld signs it with the cluster's own jwt key); it is kept in memory only, never in the handle.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import aiohttp

from ...domain.runtime import ClusterError
from .jobs import PERMANENT_CODES

API = "/slurm/v0.0.38"
USER = "root"
TOKEN_LIFESPAN_S = 3600


class Token:
    """A JWT fetched by ``fetch`` and fetched again once half its life has passed (or on a 401)."""

    def __init__(self, fetch: Callable[[int], Awaitable[str]], lifespan_s: int = TOKEN_LIFESPAN_S) -> None:
        self._fetch, self._lifespan = fetch, lifespan_s
        self._value, self._expires = "", 0.0

    async def value(self, *, fresh: bool = False) -> str:
        if fresh or not self._value or time.monotonic() > self._expires - self._lifespan / 2:
            self._value = await self._fetch(self._lifespan)
            self._expires = time.monotonic() + self._lifespan
        return self._value


def errors_of(body) -> list[dict]:
    return [e for e in (body.get("errors") or []) if isinstance(e, dict)] if isinstance(body, dict) else []


def raise_for(status: int, body, what: str) -> None:
    """ClusterError for a failed answer: permanent for a 4xx or a Slurm error that says the request is wrong."""
    errors = errors_of(body)
    if status < 400 and not errors:
        return
    text = "; ".join(str(e.get("error") or e.get("description") or e) for e in errors) or f"HTTP {status}"
    codes = {e.get("error_code") for e in errors}
    permanent = 400 <= status < 500 and status not in (401, 408, 429) or bool(codes & PERMANENT_CODES)
    raise ClusterError(f"slurm {what}: {text}", permanent=permanent)


class SlurmRest:
    """One cluster's slurmrestd, reached at ``socket`` (a path)."""

    def __init__(self, socket: str, token: Token) -> None:
        self.socket, self.token = socket, token

    async def call(self, method: str, path: str, body: dict | None = None, *, check: bool = True) -> tuple[int, dict]:
        """(HTTP status, JSON body); a 401 fetches a new token and tries once more. ``check``: raise on failure."""
        for attempt in (0, 1):
            status, answer = await self._once(method, path, body, fresh=attempt == 1)
            if status != 401:
                break
        if check:
            raise_for(status, answer, f"{method} {path}")
        return status, answer

    async def _once(self, method: str, path: str, body: dict | None, fresh: bool) -> tuple[int, dict]:
        headers = {"X-SLURM-USER-NAME": USER, "X-SLURM-USER-TOKEN": await self.token.value(fresh=fresh)}
        try:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.socket),
                                             timeout=aiohttp.ClientTimeout(total=30)) as session:
                async with session.request(method, f"http://slurmrestd{API}{path}", json=body, headers=headers) as resp:
                    try:
                        answer = await resp.json(content_type=None)
                    except ValueError:
                        answer = {"errors": [{"error": (await resp.text())[:300]}]}
                    return resp.status, answer if isinstance(answer, dict) else {}
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ClusterError(f"slurmrestd at {self.socket}: {exc!r}") from exc

    async def ping(self) -> bool:
        try:
            _, body = await self.call("GET", "/ping")
        except ClusterError:
            return False
        return any(p.get("ping") == "UP" for p in body.get("pings", []))

    async def jobs(self) -> list[dict]:
        return (await self.call("GET", "/jobs"))[1].get("jobs", [])

    async def job(self, external_id: str) -> dict | None:
        status, body = await self.call("GET", f"/job/{external_id}", check=False)
        jobs = body.get("jobs") or []
        if not jobs:
            if status < 400 or any(e.get("error_code") == 2017 for e in errors_of(body)):   # ESLURM_INVALID_JOB_ID
                return None
            raise_for(status, body, f"GET /job/{external_id}")
        return jobs[0]

    async def nodes(self) -> list[dict]:
        return (await self.call("GET", "/nodes"))[1].get("nodes", [])
