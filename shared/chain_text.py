"""The chain's row checks over PostgreSQL's COPY text format: the canonical bytes of a row straight from its
text fields (no driver values), and the hash and link checks of a run of rows. Pure: no I/O, so a worker
process can run ``check`` on a slice of ``COPY (SELECT * FROM t ORDER BY seq) TO STDOUT`` while the
connection streams the next one (shared/ledger_copy.py).

The text must come from a session with ``TimeZone`` UTC, ``DateStyle`` ISO and ``bytea_output`` hex, in
UTF-8. Each column type below gives the same canonical JSON text as shared.chain's rule for the value the
driver would have returned; a table with a column of another type is not handled here (``supported``), and a
value whose text falls outside what is decoded here (a year before 1000 or after 9999, a bytea in escape
format, a NULL hash) raises ``Unsupported``: the caller then walks the table the record way, so findings never
depend on which way was taken.
"""
from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring
from typing import Any, NamedTuple

from shared.chain import _C_ENCODE, _DECODER, EXCLUDED, _json_text, leaf_hash


class Unsupported(ValueError):
    """A value this module does not decode from its COPY text: verify the table from driver records."""


_ESCAPES = {"\\": "\\", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_ESCAPE = re.compile(r"\\(.)", re.S)
NULL = "\\N"


def _unescape_one(match: re.Match) -> str:
    try:
        return _ESCAPES[match.group(1)]
    except KeyError:
        raise Unsupported(f"COPY escape \\{match.group(1)}") from None


def unescape(field: str) -> str:
    """A COPY text field's value (only the escapes COPY TO writes: backslash, \\b \\f \\n \\r \\t \\v)."""
    return _ESCAPE.sub(_unescape_one, field) if "\\" in field else field


def _text(field: str) -> str:
    return encode_basestring(unescape(field))


def _utc(field: str) -> str:
    """``2026-01-02 03:04:05[.fraction]+00`` → ``"2026-01-02T03:04:05.000000Z"`` (years 1000–9999 only: the
    driver's values outside them take shared.chain's generic rule, not decoded here)."""
    if field[-3:] == "+00" and field[4] == "-" and field[10] == " " and "1" <= field[0] <= "9":
        n = len(field)
        if n == 29 and field[19] == ".":     # most: all six digits of the fraction (PostgreSQL drops zeros)
            return '"' + field[:10] + "T" + field[11:26] + 'Z"'
        if n == 22:
            return f'"{field[:10]}T{field[11:19]}.000000Z"'
        if 24 <= n <= 29 and field[19] == ".":
            return f'"{field[:10]}T{field[11:19]}.{field[20:-3]:0<6}Z"'
    raise Unsupported(f"timestamptz {field!r}")


_scan = _DECODER.scan_once


def _jsonb(field: str) -> str:
    """A json/jsonb field: its canonical text (shared.chain's rule for json text), decoded in one scan when
    it is a document without surrounding whitespace (jsonb's output always is)."""
    text = unescape(field) if "\\" in field else field
    if _C_ENCODE is not None:
        try:
            tree, end = _scan(text, 0)
        except StopIteration:
            end = -1
        if end == len(text):
            return "".join(_C_ENCODE(tree, 0))
    return _json_text(text)


def _hex(field: str) -> str:
    if field[:3] != "\\\\x":
        raise Unsupported("bytea not in hex output format")
    return field[3:]


def _bool(field: str) -> str:
    if field == "t":
        return "true"
    if field == "f":
        return "false"
    raise Unsupported(f"bool {field!r}")


# Per column type, the expression (of the field's text ``@``, known not to be NULL) giving its canonical JSON
# text: PostgreSQL's output of these types is already the canonical text (integers, lowercase uuids) or is
# mapped to it exactly. Types not listed (numeric, floats, dates, …) are not handled here.
_EXPRESSIONS: dict[str, str] = {
    **dict.fromkeys(("int2", "int4", "int8", "smallint", "integer", "bigint"), "@"),
    **dict.fromkeys(("text", "varchar", "bpchar", "character", "character varying", "name"),
                    "(string(@) if '\\\\' not in @ else text(@))"),
    "uuid": "'\"' + @ + '\"'",
    "bytea": "'\"' + hex(@) + '\"'",
    **dict.fromkeys(("bool", "boolean"), "boolean(@)"),
    **dict.fromkeys(("timestamptz", "timestamp with time zone"), "utc(@)"),
    **dict.fromkeys(("json", "jsonb"), "jsonb(@)"),
}
_NAMES = {"string": encode_basestring, "text": _text, "hex": _hex, "boolean": _bool, "utc": _utc,
          "jsonb": _jsonb}


def supported(columns: Sequence[tuple[str, str]]) -> bool:
    """Whether rows of these columns (name, type name) are checked here: every hashed column of a type
    above, and ``seq`` an integer."""
    types = dict(columns)
    return (types.get("seq") in ("int8", "bigint", "int4", "integer") and "prev_hash" in types
            and "row_hash" in types
            and all(t in _EXPRESSIONS for name, t in columns if name not in EXCLUDED))


def text_encoder(columns: Sequence[tuple[str, str]]) -> Callable[[Sequence[str]], bytes]:
    """The canonical bytes of a row given as its COPY text fields, in column order: one expression compiled
    for the table, like shared.chain.RowEncoder (column positions and the fixed expressions above go into
    its source, never a column name)."""
    hashed = sorted((name, i, type_name) for i, (name, type_name) in enumerate(columns) if name not in EXCLUDED)
    scope: dict[str, Any] = dict(_NAMES)
    terms = []
    for k, (name, i, type_name) in enumerate(hashed):
        scope[f"key{k}"] = ("{" if k == 0 else ",") + encode_basestring(name) + ":"
        expression = _EXPRESSIONS[type_name].replace("@", f"v{k}")
        terms += [f"key{k}", f"('null' if (v{k} := row[{i}]) == {NULL!r} else {expression})"]
    body = "''.join((" + ", ".join(terms) + ", '}'))" if terms else "'{}'"
    exec(compile(f"def encode(row):\n    return {body}.encode('utf-8')\n", "<text_encoder>", "exec"), scope)
    return scope["encode"]


@functools.lru_cache(maxsize=16)
def _table(columns: tuple[tuple[str, str], ...]) -> tuple[Callable[[Sequence[str]], bytes], int, int, int]:
    names = [name for name, _ in columns]
    return text_encoder(columns), names.index("seq"), names.index("prev_hash"), names.index("row_hash")


class Checked(NamedTuple):
    """What ``check`` found in a run of rows. The first row is not judged (its expected seq and prev_hash
    are the previous run's): ``first`` is its (seq, prev_hash, row_hash, recomputed hash). ``findings`` are
    the first ``limit`` bad rows after it, as (seq, expected seq, prev_hash, previous row_hash, row_hash,
    recomputed), in row order; ``bad`` counts them all."""
    rows: int
    first: tuple[int, bytes, bytes, bytes] | None
    last_seq: int
    last_hash: bytes | None
    max_seq: int
    bad: int
    findings: list[tuple[int, int, bytes, bytes, bytes, bytes]]
    seqs: list[int] | None          # every row's seq and the Merkle leaf hash of its recomputed hash (RFC 6962's
    leaves: list[bytes] | None      # leaf_hash of each recomputed hash, when asked for (checkpoints)


def check(columns: tuple[tuple[str, str], ...], data: bytes, limit: int, keep: bool) -> Checked:
    """Recompute the hash of each row of ``data`` (whole lines of COPY text) and check each row after the
    first against the one before it: seq one more, prev_hash equal to its row_hash, row_hash equal to the
    recomputed hash. ``keep``: return every seq and the leaf hash of every recomputed hash too."""
    encode, i_seq, i_prev, i_hash = _table(columns)
    sha256, fromhex = hashlib.sha256, bytes.fromhex
    lines = data.decode("utf-8").split("\n")
    if lines[-1] == "":
        lines.pop()
    findings: list[tuple[int, int, bytes, bytes, bytes, bytes]] = []
    seqs: list[int] | None = [] if keep else None
    leaves: list[bytes] | None = [] if keep else None
    first, bad, expected, prev_stored, stored, max_seq, seq, stored_text = None, 0, 0, b"", None, 0, 0, None
    for line in lines:
        row = line.split("\t")
        # the previous row's row_hash again, most often: its bytes are at hand
        stored_prev = prev_stored if row[i_prev] == stored_text else fromhex(_hex(row[i_prev]))
        seq, stored_text = int(row[i_seq]), row[i_hash]
        stored = fromhex(_hex(stored_text))
        recomputed = sha256(stored_prev + encode(row)).digest()
        if first is None:
            first = (seq, stored_prev, stored, recomputed)
        elif seq != expected or stored_prev != prev_stored or recomputed != stored:
            bad += 1
            if len(findings) < limit:
                findings.append((seq, expected, stored_prev, prev_stored, stored, recomputed))
        if seq > max_seq:
            max_seq = seq
        if keep:
            seqs.append(seq)
            leaves.append(leaf_hash(recomputed))
        expected, prev_stored = seq + 1, stored
    return Checked(len(lines), first, seq, stored, max_seq, bad, findings, seqs, leaves)
