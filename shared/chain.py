"""The tamper-evident chain shared by the billing ledger and the audit trail: canonical form, row hashes,
RFC 6962 Merkle tree hashes and inclusion proofs. Pure: no I/O.

Canonical form of an entry (what a row hash covers) — ``canonical(fields)``:
  * a JSON object with keys sorted by code point, no whitespace (``,`` and ``:``), UTF-8, no ASCII escaping
    (json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False));
  * ``None`` → null, ``bool`` → true/false, ``int`` → a JSON integer (never quoted, any size);
  * ``str`` as is; ``uuid.UUID`` → its lowercase hyphenated string;
  * ``datetime`` (timezone-aware only) → ISO-8601 in UTC with microseconds: ``2026-01-02T03:04:05.000006Z``;
    ``date`` → ``2026-01-02``;
  * ``Decimal`` → its string (``"1.50"``: PostgreSQL numeric keeps the scale); ``bytes`` → lowercase hex;
  * dicts (e.g. a jsonb column) and lists/tuples recursively, with the same rules;
  * ``float`` is refused (TypeError): a float does not survive jsonb's numeric round trip byte for byte
    (``1e20`` comes back as ``100000000000000000000``), so money is integer minor units and other decimals
    are strings or Decimals.
The fields hashed are every column of the row except ``prev_hash`` and ``row_hash`` (``seq`` included),
so a row is hashed the same way whether written by the store or read back for verification.

Row hash: ``row_hash = sha256(prev_hash || canonical(fields))``; the first row's ``prev_hash`` is
``GENESIS`` (32 zero bytes).

Merkle tree hash (RFC 6962 §2.1, RFC 9162 §2.1.1) over a list of data items (here: row hashes in seq order):
``MTH({}) = sha256()``, ``MTH({d}) = sha256(0x00 || d)``, and for n > 1 with k the largest power of two
smaller than n, ``MTH(D[n]) = sha256(0x01 || MTH(D[0:k]) || MTH(D[k:n]))``. The 0x00/0x01 prefixes keep a leaf
from being passed off as an interior node. ``TreeBuilder`` computes the same root from a stream of items in
O(log n) memory (verify walks the table with a cursor).
"""
from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring
from typing import Any

HASH_SIZE = 32
GENESIS = bytes(HASH_SIZE)
EXCLUDED = frozenset({"prev_hash", "row_hash"})   # columns a row hash never covers


def _no_default(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} has no canonical form")


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
# The same encoder without its per-call set-up (json.dumps builds one each call: most of its cost on a small
# document). Only for JSON-native trees (what _plain and json.loads return): no cycles, so no markers.
_C_ENCODE = (c_make_encoder(None, _no_default, encode_basestring, None, ":", ",", True, False, False)
             if c_make_encoder is not None else None)


def _dumps(tree: Any) -> str:
    """Canonical JSON text of a JSON-native tree (dicts, lists, str, int, bool, None; no floats)."""
    if _C_ENCODE is None or isinstance(tree, float):
        return _ENCODER.encode(tree)
    return "".join(_C_ENCODE(tree, 0))


_NATIVE = frozenset({str, int, bool})   # exactly these types are their own canonical value (not subclasses)


def _plain(value: Any) -> Any:
    """``value`` as JSON-native types under the canonical rule (see the module docstring)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        raise TypeError("floats are not canonical: use integer minor units, a Decimal or a string")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise TypeError(f"naive datetime {value!r}: the chain only hashes timezone-aware times")
        return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"object keys must be strings, got {k!r}")
            out[k] = v if v is None or type(v) in _NATIVE else _plain(v)   # most values: no call
        return out
    if isinstance(value, (list, tuple)):
        return [v if v is None or type(v) in _NATIVE else _plain(v) for v in value]
    raise TypeError(f"{type(value).__name__} has no canonical form")


def canonical(fields: Mapping[str, Any]) -> bytes:
    """The canonical UTF-8 JSON of a row's hashed fields (``prev_hash``/``row_hash`` are left out).
    Raises TypeError for a value with no canonical form (a float, a naive datetime, an unknown type)."""
    body = {k: v for k, v in fields.items() if k not in EXCLUDED}
    return _dumps(_plain(body)).encode("utf-8")


def canonical_with_documents(fields: Mapping[str, Any], documents: Iterable[str]) -> tuple[bytes, dict[str, str]]:
    """``canonical(fields)`` and the canonical JSON text of each named field (a jsonb document) that is not
    None, from one conversion of the values (a store writes the documents' text and hashes the row)."""
    plain = _plain({k: v for k, v in fields.items() if k not in EXCLUDED})
    texts = {k: _dumps(plain[k]) for k in documents if plain.get(k) is not None}
    return _dumps(plain).encode("utf-8"), texts


def canonical_json(value: Any) -> str:
    """A value (e.g. a jsonb document) as canonical JSON text: what the store writes, so that the text
    PostgreSQL parses is exactly the value that was hashed."""
    return _dumps(_plain(value))


def row_hash(prev_hash: bytes, fields: Mapping[str, Any]) -> bytes:
    """sha256(prev_hash || canonical(fields)); ``prev_hash`` is GENESIS for the first row."""
    if len(prev_hash) != HASH_SIZE:
        raise ValueError(f"prev_hash must be {HASH_SIZE} bytes, got {len(prev_hash)}")
    return hashlib.sha256(bytes(prev_hash) + canonical(fields)).digest()


# --- the canonical form of typed rows, fast ---------------------------------------------------------

def _refuse_float(text: str) -> Any:
    raise TypeError(f"floats are not canonical: {text} in a json column")


_DECODER = json.JSONDecoder(parse_float=_refuse_float, parse_constant=_refuse_float)


def _json_text(value: Any) -> str:
    """A json/jsonb column: text as PostgreSQL returns it without a codec, or a value a codec decoded."""
    if type(value) is not str:
        return canonical_json(value)
    try:
        tree, end = _DECODER.raw_decode(value)   # jsonb text: no whitespace around the document
    except json.JSONDecodeError:
        end = -1
    if end != len(value):
        tree = _DECODER.decode(value)            # json text may have some; anything else raises
    return _dumps(tree)


def _utc_text(value: Any) -> str:
    if type(value) is dt.datetime and value.tzinfo is dt.UTC and value.year >= 1000:   # asyncpg's timestamptz
        text = value.isoformat()    # …+00:00, without the fraction when it is zero
        return f'"{text[:26]}Z"' if value.microsecond else f'"{text[:19]}.000000Z"'
    return canonical_json(value)


# Per column type, the expression (of the value ``@``, known not to be None) giving its canonical JSON text;
# a value of another Python type than the driver's goes through the generic rule (``g``), so the result is
# always what ``canonical`` gives. Unknown types: the generic rule.
_EXPRESSIONS: dict[str, str] = {
    **dict.fromkeys(("int2", "int4", "int8", "smallint", "integer", "bigint"),
                    "(int_text(@) if type(@) is int else g(@))"),
    **dict.fromkeys(("text", "varchar", "bpchar", "character", "character varying", "name"),
                    "(string(@) if type(@) is str else g(@))"),
    "uuid": "('\"' + str(@) + '\"' if isinstance(@, UUID) else g(@))",     # asyncpg's UUID subclasses it
    "numeric": "('\"' + str(@) + '\"' if type(@) is Decimal else g(@))",
    "bytea": "('\"' + @.hex() + '\"' if type(@) is bytes else g(@))",
    **dict.fromkeys(("bool", "boolean"), "(('true' if @ else 'false') if type(@) is bool else g(@))"),
    **dict.fromkeys(("timestamptz", "timestamp with time zone"), "utc(@)"),
    **dict.fromkeys(("json", "jsonb"), "json_text(@)"),
}
_NAMES = {"int_text": int.__repr__, "string": encode_basestring, "UUID": uuid.UUID, "Decimal": decimal.Decimal,
          "utc": _utc_text, "json_text": _json_text}


class RowEncoder:
    """``canonical`` for rows of one table, as a database driver returns them: the same bytes, several times
    faster (the verify of a long chain is mostly this). Built from the columns in row order (name, type
    name: PostgreSQL's ``int8`` or ``bigint`` spelling); a column of another type, or a value not of its
    column's Python type, goes through the generic rule, so the output never differs from ``canonical``.

    ``encode`` is one expression compiled for the table (a loop over the columns cost as much as the
    values' own conversions); only column positions and the fixed expressions above go into its source,
    never a column name (the names' JSON text is passed in as constants)."""

    def __init__(self, columns: Sequence[tuple[str, str]]):
        hashed = sorted((name, i, type_name) for i, (name, type_name) in enumerate(columns)
                        if name not in EXCLUDED)
        scope: dict[str, Any] = {**_NAMES, "g": canonical_json}
        terms = []
        for k, (name, i, type_name) in enumerate(hashed):
            scope[f"key{k}"] = ("{" if k == 0 else ",") + encode_basestring(name) + ":"
            expression = _EXPRESSIONS.get(type_name, "g(@)").replace("@", f"v{k}")
            terms += [f"key{k}", f"('null' if (v{k} := row[{i}]) is None else {expression})"]
        body = "''.join((" + ", ".join(terms) + ", '}'))" if terms else "'{}'"   # one join: no growing string
        exec(compile(f"def encode(row):\n    return {body}.encode('utf-8')\n", "<RowEncoder>", "exec"), scope)
        self.encode: Callable[[Sequence[Any]], bytes] = scope["encode"]

    def row_hash(self, prev_hash: bytes, row: Sequence[Any]) -> bytes:
        return hashlib.sha256(prev_hash + self.encode(row)).digest()


# --- RFC 6962 Merkle tree -------------------------------------------------------------------------

EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + bytes(data)).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def _mth(leaves: Sequence[bytes]) -> bytes:
    """MTH over already leaf-hashed items."""
    n = len(leaves)
    if n == 0:
        return EMPTY_ROOT
    if n == 1:
        return leaves[0]
    k = _split(n)
    return node_hash(_mth(leaves[:k]), _mth(leaves[k:]))


def merkle_root(items: Iterable[bytes]) -> bytes:
    """MTH(D[n]) over the data items, by the recursive definition of RFC 6962 §2.1."""
    return _mth([leaf_hash(d) for d in items])


class TreeBuilder:
    """The same root as ``merkle_root`` from items appended one at a time, keeping only the perfect
    subtrees of the tree's left-filled shape (at most log2(n) hashes): RFC 6962's split puts the largest
    power-of-two subtree on the left, so the stack, folded right to left, is the recursive MTH."""

    def __init__(self) -> None:
        self.size = 0
        self._stack: list[tuple[int, bytes]] = []   # (subtree size, subtree hash), sizes strictly decreasing

    def append(self, data: bytes) -> None:
        self.extend_leaves((leaf_hash(data),))

    def extend_leaves(self, leaves: Sequence[bytes]) -> None:
        """Append items given as their leaf hashes (``leaf_hash(item)``, e.g. computed elsewhere), in order."""
        stack = self._stack
        for h in leaves:
            size = 1
            while stack and stack[-1][0] == size:
                left_size, left = stack.pop()
                size, h = size + left_size, node_hash(left, h)
            stack.append((size, h))
        self.size += len(leaves)

    def root(self) -> bytes:
        """The root of the items appended so far; does not change the builder."""
        if not self._stack:
            return EMPTY_ROOT
        h = self._stack[-1][1]
        for _, left in reversed(self._stack[:-1]):
            h = node_hash(left, h)
        return h


def _path(index: int, leaves: Sequence[bytes]) -> list[bytes]:
    n = len(leaves)
    if n <= 1:
        return []
    k = _split(n)
    if index < k:
        return _path(index, leaves[:k]) + [_mth(leaves[k:])]
    return _path(index - k, leaves[k:]) + [_mth(leaves[:k])]


def inclusion_proof(items: Sequence[bytes], index: int) -> list[bytes]:
    """The audit path PATH(index, D[n]) of RFC 6962 §2.1.1 for item ``index`` (0-based) of ``items``.
    Raises IndexError when index is outside the tree."""
    if not 0 <= index < len(items):
        raise IndexError(f"leaf {index} is outside a tree of {len(items)}")
    return _path(index, [leaf_hash(d) for d in items])


def root_from_inclusion(data: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes:
    """The root that ``proof`` implies for item ``data`` at ``index`` in a tree of ``size`` (the
    verification algorithm of RFC 9162 §2.1.3.2). Raises ValueError when the proof has the wrong length."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is outside a tree of {size}")
    fn, sn, r = index, size - 1, leaf_hash(data)
    for p in proof:
        if sn == 0:
            raise ValueError("proof longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise ValueError("proof shorter than the tree is deep")
    return r


def verify_inclusion(data: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """True when ``proof`` shows ``data`` is item ``index`` of the tree of ``size`` items with ``root``."""
    try:
        return root_from_inclusion(data, index, size, proof) == root
    except ValueError:
        return False
