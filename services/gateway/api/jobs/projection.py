"""Jobs as the paas service publishes them: jobs_view, fed by paas.job_changed (in the consumer's transaction,
inbox-deduped). A document is applied only when its ``version`` is higher than the one shown; the row the POST
wrote keeps its submission time (a page cursor stays where it was)."""
from __future__ import annotations

import json

from services.paas import contracts as pc
from shared.unit_of_work import UnitOfWork

from ...adapters.versioned import upsert_newer

_JOB = upsert_newer(
    "jobs_view", ["id"], ["id", "tenant_id", "user_id", "cluster_id", "name", "state", "reason", "exit_code",
                          "external_id", "tasks", "gpus_per_task", "time_limit_s", "nodes", "version", "created_at",
                          "started_at", "ended_at"],
    jsonb={"nodes"}, same=["tenant_id"], insert_only={"created_at"}, assign={"updated_at": "now()"})


async def on_job_changed(ctx: UnitOfWork, data: pc.JobChanged) -> None:
    await ctx.conn.execute(_JOB, data.job_id, data.tenant_id, data.user_id, data.cluster_id, data.name, data.state,
                           data.reason, data.exit_code, data.external_id, data.tasks, data.gpus_per_task,
                           data.time_limit_s, json.dumps(data.nodes), data.version, data.submitted_at,
                           data.started_at, data.ended_at)
