"""`./taskw ledger:verify`: check the platform's hash-chained tables (the billing ledger by default).

Recomputes every row hash and link and every Merkle checkpoint of each table (shared.ledger_store.verify),
prints a human summary per table, and as its last line one JSON object:
``{"ok": bool, "tables": [{"table", "ok", "entries", "last_seq", "head_hash", "checkpoints",
"bad_entry_count", "bad_checkpoint_count", "first_bad_entry": {"seq", "problems"} | null,
"first_bad_checkpoint": {"id", "first_seq", "last_seq", "problem"} | null, "bad_entries": [seq…],
"bad_checkpoints": [id…]}]}``.
Exit status: 0 when every table is intact, 1 when one is not, 2 when it could not check (no database,
no such table).

The database: ``--dsn``, else ``TESSERA_DATABASE_URL`` (what `up` uses for a given server), else the embedded
server of the data folder (``--data``, ``TESSERA_DATA_DIR`` or ``.tessera/``): its port and socket from
``pg/pgdata/postmaster.pid``, the superuser's password from ``pg/superuser.password``. It reads only.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import asyncpg

from shared.ledger_store import VerifyResult, verify

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TABLES = ("billing.ledger_entries",)


class NoDatabase(RuntimeError):
    """No DSN given and no running embedded server found in the data folder."""


def embedded_dsn(data: Path) -> str:
    """The superuser DSN of the embedded PostgreSQL running from ``data`` (as tooling.embedded starts it)."""
    pid_file, pw_file = data / "pg" / "pgdata" / "postmaster.pid", data / "pg" / "superuser.password"
    if not pid_file.exists() or not pw_file.exists():
        raise NoDatabase(f"no running platform in {data} (no {pid_file}): start `./taskw up` or pass --dsn")
    lines = pid_file.read_text().splitlines()
    port, sock = lines[3].strip(), lines[4].strip() if len(lines) > 4 else ""
    password = pw_file.read_text().strip()
    if sock and len(sock) < 80:
        return f"postgresql://postgres:{password}@/tessera?host={sock}&port={port}"
    return f"postgresql://postgres:{password}@127.0.0.1:{port}/tessera"


def summary(r: VerifyResult) -> list[str]:
    head = r.head_hash.hex() if r.head_hash else "-"
    lines = [f"{r.table}: {'INTACT' if r.ok else 'BROKEN'} — {r.entries} entries (last seq {r.last_seq}, "
             f"head {head}), {r.checkpoints} checkpoint(s)"]
    for f in r.bad_entries[:10]:
        lines.append(f"  entry seq {f.seq}: " + "; ".join(f.problems))
    if r.bad_entry_count > 10:
        lines.append(f"  … {r.bad_entry_count - 10} more entries")
    for c in r.bad_checkpoints[:10]:
        lines.append(f"  checkpoint {c.id} (seq {c.first_seq}..{c.last_seq}): {c.problem}")
    if r.bad_checkpoint_count > 10:
        lines.append(f"  … {r.bad_checkpoint_count - 10} more checkpoints")
    return lines


async def run(dsn: str, tables: list[str]) -> tuple[int, list[str], dict]:
    """(exit status, summary lines, the JSON object) for ``tables`` in the database at ``dsn``."""
    conn = await asyncpg.connect(dsn)
    try:
        results = [await verify(conn, t) for t in tables]
    finally:
        await conn.close()
    ok = all(r.ok for r in results)
    lines = [line for r in results for line in summary(r)]
    return (0 if ok else 1), lines, {"ok": ok, "tables": [r.to_json() for r in results]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ledger:verify", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("TESSERA_DATABASE_URL") or None,
                        help="PostgreSQL DSN (default: the embedded server of --data)")
    parser.add_argument("--data", default=os.environ.get("TESSERA_DATA_DIR", str(REPO / ".tessera")),
                        help="the platform's data folder (default .tessera/)")
    parser.add_argument("--table", action="append", dest="tables",
                        help="a chained table, schema-qualified (repeatable; default billing.ledger_entries)")
    args = parser.parse_args(argv)
    tables = args.tables or list(DEFAULT_TABLES)
    try:
        status, lines, report = asyncio.run(run(args.dsn or embedded_dsn(Path(args.data)), tables))
    except (NoDatabase, OSError, asyncpg.PostgresError, ValueError) as exc:
        print(f"ledger:verify: cannot check: {exc}", file=sys.stderr)
        print(json.dumps({"ok": False, "error": str(exc), "tables": []}))
        return 2
    print("\n".join(lines))
    print(json.dumps(report, sort_keys=True))
    return status


if __name__ == "__main__":
    sys.exit(main())
