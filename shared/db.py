"""PostgreSQL: per-service schema and login role, migrations, and the connection pool.

Each service owns one schema (named like the service) and one login role
(``tessera_<service>``) that owns that schema and has no privilege anywhere else.
``provision_service`` runs with an administrative connection (the runner or the
test suite); services themselves only ever connect as their own role.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

KIT_SQL = Path(__file__).parent / "schema"


_CONSTANT = re.compile(r"^[A-Za-z0-9_-]+$")


def in_list(values: Iterable[str]) -> str:
    """A code constant's values written into a statement as a SQL list, ``('compensating', 'running')``, instead
    of passed as a parameter. PostgreSQL uses a partial index (``... WHERE status IN ('running', 'compensating')``)
    only when it can prove the query's condition implies the index's, and it proves that from constants: with
    ``status = ANY($1)`` the generic plan, the one a prepared statement runs from its sixth execution on when it
    looks no dearer, reads every row the other conditions allow, finished ones included, and the cost grows with
    the table's history. Only letters, digits, ``_`` and ``-`` are accepted: never a value from outside the code."""
    listed = sorted(set(values))
    if not listed or not all(_CONSTANT.match(v) for v in listed):
        raise ValueError(f"not a list of constants: {listed!r}")
    return "(" + ", ".join(f"'{v}'" for v in listed) + ")"


def role_name(service: str) -> str:
    return f"tessera_{service}"


def role_password(service: str, secret: str) -> str:
    return hashlib.sha256(f"{secret}:{service}".encode()).hexdigest()[:32]


def service_dsn(admin_dsn: str, service: str, secret: str) -> str:
    """The DSN a service uses: same server and database, its own role and password."""
    parts = urlsplit(admin_dsn)
    host = parts.hostname or ""
    netloc = f"{role_name(service)}:{quote(role_password(service, secret))}@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


async def provision_service(admin: asyncpg.Connection, service: str, secret: str) -> None:
    """Create (idempotently) the service's role and schema; the role can touch nothing else."""
    role, pw = role_name(service), role_password(service, secret)
    exists = await admin.fetchval("SELECT 1 FROM pg_roles WHERE rolname=$1", role)
    if exists:
        await admin.execute(f"ALTER ROLE {role} WITH LOGIN PASSWORD '{pw}'")
    else:
        await admin.execute(f"CREATE ROLE {role} WITH LOGIN PASSWORD '{pw}' NOSUPERUSER NOCREATEDB NOCREATEROLE")
    await admin.execute(f"CREATE SCHEMA IF NOT EXISTS {service} AUTHORIZATION {role}")
    await admin.execute(f"REVOKE ALL ON SCHEMA {service} FROM PUBLIC")
    await admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    db = await admin.fetchval("SELECT current_database()")
    await admin.execute(f'GRANT CONNECT ON DATABASE "{db}" TO {role}')
    await admin.execute(f"ALTER ROLE {role} SET search_path = {service}")


async def migrate(conn: asyncpg.Connection, schema: str, sql_dir: Path | None) -> list[str]:
    """Apply the kit's tables (outbox, inbox) and the service's own migrations, once each, in order. Safe to
    run from several processes at once (replicas, or a rack of node-agents starting together): every step
    holds the schema's advisory lock."""
    await conn.execute(f"SET search_path = {schema}")
    async with conn.transaction():   # under the lock too: two creating the table at once collide in pg_type
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", schema)
        await conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations "
                           "(name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
    applied: list[str] = []
    files = sorted(KIT_SQL.glob("*.sql")) + (sorted(sql_dir.glob("*.sql")) if sql_dir and sql_dir.exists() else [])
    for f in files:
        name = f"{'kit' if f.parent == KIT_SQL else 'svc'}/{f.name}"
        async with conn.transaction():
            # advisory lock: two replicas starting together migrate once
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", schema)
            if await conn.fetchval("SELECT 1 FROM schema_migrations WHERE name=$1", name):
                continue
            await conn.execute(f.read_text())
            await conn.execute("INSERT INTO schema_migrations(name) VALUES ($1)", name)
            applied.append(name)
    return applied


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """Release without asyncpg's default reset query (UNLISTEN *, RESET ALL, advisory unlock, CLOSE ALL):
    our code changes no session state (advisory locks are transaction-scoped; the one LISTEN lives on a
    connection the relay holds for its whole life), and the reset cost a round trip per message.
    asyncpg still rolls back any open transaction and drops listener callbacks on release."""


async def create_pool(dsn: str, schema: str, *, min_size: int = 2, max_size: int = 10) -> asyncpg.Pool:
    return await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, reset=_keep_session,
        server_settings={"search_path": schema, "application_name": f"tessera-{schema}"},
    )
