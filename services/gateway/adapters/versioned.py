"""The statement every versioned view of the gateway is written with: a service's document replaces the row it
describes only when it is newer, so documents arriving out of order (separate consumers, redelivery) never move
a view backwards."""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence


def upsert_newer(view: str, key: Sequence[str], columns: Sequence[str], *, jsonb: Collection[str] = (),
                 same: Sequence[str] = (), insert_only: Collection[str] = (), assign: Mapping[str, str] | None = None,
                 returning: bool = False, arrays: Sequence[str] = ()) -> str:
    """INSERT one document into ``view``: ``columns`` are its parameters $1, $2, ... in order (those in ``jsonb``
    cast to jsonb). On a row with the same ``key``, every other column takes the document's value, except those
    in ``insert_only`` (kept as first written) and those ``assign`` gives an expression of their own (or adds);
    only if the document's ``version`` is higher than the row's, and the columns ``same`` agree (a document never
    moves a row to another tenant). ``returning``: ``RETURNING 1``, a row only when the document was applied.
    ``arrays``: the columns' SQL types, to take many documents in one statement, each parameter an array of
    that column's values (a key may appear once). Names are the caller's constants, never input."""
    assign = dict(assign or {})
    if arrays:
        rows = "SELECT * FROM unnest(" + ", ".join(f"${i}::{t}[]" for i, t in enumerate(arrays, 1)) + ")"
    else:
        rows = "VALUES (" + ", ".join(f"${i}::jsonb" if c in jsonb else f"${i}" for i, c in enumerate(columns, 1)) + ")"
    kept = set(key) | set(same) | set(insert_only)
    updates = {c: f"EXCLUDED.{c}" for c in columns if c not in kept} | assign
    guard = " AND ".join([f"{view}.{c} = EXCLUDED.{c}" for c in same] + [f"{view}.version < EXCLUDED.version"])
    return (f"INSERT INTO {view} ({', '.join(columns)}) {rows} "
            f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {', '.join(f'{c}={e}' for c, e in updates.items())} "
            f"WHERE {guard}" + (" RETURNING 1" if returning else ""))
