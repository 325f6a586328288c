"""What ``bench:saga --replicas N`` checks: with N replicas of each stateless service sharing their durable
consumers, every allocation the run created got each of its effects exactly once.

``Effects`` watches every event (a core subscription to ``*.evt.>``) and keeps, per allocation and event type,
the envelope ids seen; ``check`` then reads the saga schema. An effect published twice under two envelope ids (a
handler run twice) shows as two ids; a re-publish of one outbox row (the server drops it by its Nats-Msg-Id) as
one."""
from __future__ import annotations

import json
import re
import uuid

import aiohttp
import asyncpg
import nats

STATELESS = ("allocation", "network", "storage", "billing", "saga")
# the effects one allocation's allocate saga has, exactly once each (the bench asks for no volume: no storage step)
ONCE = ("allocation.requested", "allocation.activated", "scheduler.slots_reserved",
        "network.network_attached", "saga.completed:allocate")
_HANDLED = re.compile(r'^tessera_messages_consumed_total\{[^}]*outcome="ok"[^}]*\} (\S+)$', re.M)


class Effects:
    """Every event seen, by (allocation id, type): the envelope ids."""

    def __init__(self):
        self.seen: dict[tuple[str, str], set[str]] = {}
        self.nc = None

    async def start(self, url: str, **connect) -> Effects:
        self.nc = await nats.connect(url, **connect)
        await self.nc.subscribe("*.evt.>", cb=self._on_event)
        return self

    async def _on_event(self, msg) -> None:
        env = json.loads(msg.data)
        data = env.get("data") or {}
        if data.get("allocation_id"):
            what = f"{env['type']}:{data.get('kind')}" if env["type"].startswith("saga.") else env["type"]
            self.seen.setdefault((data["allocation_id"], what), set()).add(env["id"])

    async def close(self) -> None:
        await self.nc.flush()
        await self.nc.close()

    def allocations(self) -> set[str]:
        """The allocations whose request was seen."""
        return {a for (a, what) in self.seen if what == "allocation.requested"}

    async def check(self, database_url: str, handled: dict[str, float]) -> dict:
        """Each allocation seen: every ``ONCE`` effect exactly once, and no event twice under two ids; one allocate
        saga each; ``handled`` (messages each process handled in the run) shows every replica of each service on
        the allocations' path took part."""
        ids = sorted(self.allocations())
        wrong = {}
        for a in ids:
            counts = {t: len(self.seen.get((a, t), ())) for t in ONCE}
            twice = {what: len(envs) for (b, what), envs in self.seen.items() if b == a and len(envs) > 1}
            if counts != dict.fromkeys(ONCE, 1) or twice:
                wrong[a] = {**{t: n for t, n in counts.items() if n != 1}, **twice}
        conn = await asyncpg.connect(database_url)
        try:
            sagas = await conn.fetch(
                "SELECT s.allocation_id, count(DISTINCT s.id) AS n, max(st.attempt) AS attempts FROM saga.sagas s "
                "LEFT JOIN saga.saga_steps st ON st.saga_id = s.id WHERE s.kind = 'allocate' "
                "AND s.allocation_id = ANY($1::uuid[]) GROUP BY s.allocation_id", [uuid.UUID(a) for a in ids])
            active = await conn.fetchval(
                "SELECT count(*) FROM allocation.allocations WHERE id = ANY($1::uuid[]) AND state = 'ACTIVE'",
                [uuid.UUID(a) for a in ids])
            # billing meters each activation (allocation.activated): one meter each, whichever replica took it
            metered_once = await conn.fetchval(
                "SELECT count(*) FROM (SELECT allocation_id FROM billing.meters WHERE allocation_id = ANY($1::uuid[]) "
                "GROUP BY allocation_id HAVING count(*) = 1) AS m", [uuid.UUID(a) for a in ids])
        finally:
            await conn.close()
        one_saga = sum(1 for r in sagas if r["n"] == 1)
        # a service none of whose replicas handled anything is not on these allocations' path (storage, for an
        # allocation without volumes); one with a replica idle beside a busy one did not share its consumers
        replicas: dict[str, dict[str, float]] = {}
        for name, n in handled.items():
            replicas.setdefault(name.split(":")[0], {})[name] = n
        idle = sorted(name for reps in replicas.values() if any(n > 0 for n in reps.values())
                      for name, n in reps.items() if n <= 0)
        unused = sorted(svc for svc, reps in replicas.items() if all(n <= 0 for n in reps.values()))
        return {"allocations_checked": len(ids), "allocations_with_an_effect_not_once": len(wrong),
                "not_once_examples": dict(list(wrong.items())[:3]), "allocate_sagas": one_saga, "active": active,
                "metered_once": metered_once,
                "steps_retried": sum(1 for r in sagas if (r["attempts"] or 0) > 1),
                "replicas_that_handled_nothing": idle, "services_not_on_the_path": unused,
                "exactly_once": bool(ids) and not wrong and one_saga == len(ids) == active == metered_once and not idle}


async def handled(port: int) -> float:
    """Messages a process's consumers handled so far (its own /metrics)."""
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
        return sum(float(v) for v in _HANDLED.findall(await r.text()))
