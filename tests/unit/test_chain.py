"""The shared chain: canonical form, row hashes, RFC 6962 Merkle tree hashes and inclusion proofs.

The Merkle vectors are Certificate Transparency's (the eight leaves and roots used by Google's CT tests and
transparency-dev/merkle's testonly constants); the empty, 1-leaf and 2-leaf roots are also recomputed here
straight from the definition."""
from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import json
import uuid

import pytest

from shared.chain import (
    EMPTY_ROOT,
    GENESIS,
    RowEncoder,
    TreeBuilder,
    canonical,
    canonical_json,
    canonical_with_documents,
    inclusion_proof,
    leaf_hash,
    merkle_root,
    node_hash,
    root_from_inclusion,
    row_hash,
    verify_inclusion,
)

CT_LEAVES = [bytes.fromhex(h) for h in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657",
                                         "606162636465666768696a6b6c6d6e6f")]
CT_ROOTS = [bytes.fromhex(h) for h in (
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
)]
CT_PATHS = [   # (leaf index, tree size, audit path)
    (0, 1, []),
    (0, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (5, 8, ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
]


# --- canonical form and row hashes ---------------------------------------------------------------

def test_canonical_sorts_keys_drops_whitespace_and_keeps_utf8():
    assert canonical({"b": 1, "a": {"z": [1, "é"], "y": None}}) == '{"a":{"y":null,"z":[1,"é"]},"b":1}'.encode()


def test_canonical_writes_times_in_utc_with_microseconds_uuids_as_strings_and_integers_bare():
    t = dt.datetime(2026, 1, 2, 4, 4, 5, 6, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    out = canonical({"t": t, "u": u, "n": 2 ** 70, "ok": True, "d": decimal.Decimal("1.50"), "day": dt.date(2026, 1, 2)})
    assert out == (b'{"d":"1.50","day":"2026-01-02","n":1180591620717411303424,"ok":true,'
                   b'"t":"2026-01-02T03:04:05.000006Z","u":"12345678-1234-5678-1234-567812345678"}')


def test_canonical_leaves_out_the_hash_columns():
    assert canonical({"seq": 1, "prev_hash": b"x", "row_hash": b"y"}) == b'{"seq":1}'


@pytest.mark.parametrize("bad", [1.5, dt.datetime(2026, 1, 1), object(), {1: "non-string key"}])
def test_canonical_refuses_values_with_no_stable_form(bad):
    with pytest.raises(TypeError):
        canonical({"v": bad})


def test_canonical_json_is_the_canonical_text_of_a_document():
    assert canonical_json({"b": [1, 2], "a": "x"}) == '{"a":"x","b":[1,2]}'


def test_row_hash_is_sha256_of_prev_hash_then_canonical_fields():
    fields = {"seq": 1, "kind": "charge", "amount_minor": 1250}
    expected = hashlib.sha256(bytes(32) + b'{"amount_minor":1250,"kind":"charge","seq":1}').digest()
    assert GENESIS == bytes(32)
    assert row_hash(GENESIS, fields) == expected
    assert row_hash(expected, {**fields, "seq": 2}) != row_hash(GENESIS, {**fields, "seq": 2})


def test_row_hash_changes_with_any_field_and_ignores_key_order():
    a = {"seq": 7, "entry": {"x": 1, "y": 2}}
    assert row_hash(GENESIS, a) == row_hash(GENESIS, {"entry": {"y": 2, "x": 1}, "seq": 7})
    assert row_hash(GENESIS, a) != row_hash(GENESIS, {"seq": 7, "entry": {"x": 1, "y": 3}})


def test_row_hash_refuses_a_prev_hash_of_the_wrong_size():
    with pytest.raises(ValueError):
        row_hash(b"short", {"seq": 1})


# --- Merkle tree hash ----------------------------------------------------------------------------

def test_empty_tree_hash_is_sha256_of_nothing():
    assert merkle_root([]) == EMPTY_ROOT
    assert EMPTY_ROOT.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert TreeBuilder().root() == EMPTY_ROOT


def test_one_and_two_leaf_trees_by_hand():
    d0, d1 = CT_LEAVES[0], CT_LEAVES[1]
    one = hashlib.sha256(b"\x00" + d0).digest()
    two = hashlib.sha256(b"\x01" + one + hashlib.sha256(b"\x00" + d1).digest()).digest()
    assert merkle_root([d0]) == one == CT_ROOTS[0]
    assert merkle_root([d0, d1]) == two == CT_ROOTS[1]
    assert node_hash(leaf_hash(d0), leaf_hash(d1)) == two


@pytest.mark.parametrize("n", range(1, 9))
def test_certificate_transparency_roots(n):
    assert merkle_root(CT_LEAVES[:n]) == CT_ROOTS[n - 1]


def test_the_streaming_builder_gives_the_recursive_root_at_every_size():
    items = [hashlib.sha256(str(i).encode()).digest() for i in range(70)]
    b = TreeBuilder()
    for i, d in enumerate(items, 1):
        b.append(d)
        assert b.size == i and b.root() == merkle_root(items[:i])


def test_the_split_is_the_largest_power_of_two_below_n():
    d = CT_LEAVES[:5]
    left = merkle_root(d[:4])
    assert merkle_root(d) == node_hash(left, leaf_hash(d[4]))   # 5 = 4 + 1, not 3 + 2


# --- inclusion proofs ----------------------------------------------------------------------------

@pytest.mark.parametrize("index,size,path", CT_PATHS)
def test_certificate_transparency_audit_paths(index, size, path):
    proof = inclusion_proof(CT_LEAVES[:size], index)
    assert [p.hex() for p in proof] == path
    assert verify_inclusion(CT_LEAVES[index], index, size, proof, CT_ROOTS[size - 1])


def test_every_leaf_of_every_small_tree_proves_its_inclusion():
    items = [hashlib.sha256(str(i).encode()).digest() for i in range(33)]
    for size in range(1, len(items) + 1):
        root = merkle_root(items[:size])
        for index in range(size):
            proof = inclusion_proof(items[:size], index)
            assert root_from_inclusion(items[index], index, size, proof) == root


def test_an_inclusion_proof_fails_for_another_leaf_index_size_or_a_changed_path():
    proof = inclusion_proof(CT_LEAVES, 5)
    root = CT_ROOTS[7]
    assert not verify_inclusion(CT_LEAVES[4], 5, 8, proof, root)
    assert not verify_inclusion(CT_LEAVES[5], 4, 8, proof, root)
    assert not verify_inclusion(CT_LEAVES[5], 5, 6, proof, root)
    assert not verify_inclusion(CT_LEAVES[5], 5, 8, proof[:-1], root)
    assert not verify_inclusion(CT_LEAVES[5], 5, 8, proof + [root], root)
    assert not verify_inclusion(CT_LEAVES[5], 5, 8, [bytes(32)] + proof[1:], root)
    assert not verify_inclusion(CT_LEAVES[5], 8, 8, proof, root)


def test_inclusion_proof_refuses_a_leaf_outside_the_tree():
    with pytest.raises(IndexError):
        inclusion_proof(CT_LEAVES[:3], 3)


# --- the fast encoder of typed rows ---------------------------------------------------------------

ROW_COLUMNS = [("seq", "int8"), ("tenant_id", "uuid"), ("kind", "text"), ("amount_minor", "bigint"),
               ("currency", "bpchar"), ("entry", "jsonb"), ("prev_hash", "bytea"), ("row_hash", "bytea"),
               ("created_at", "timestamptz"), ("quantity", "numeric"), ("paid", "bool"), ("blob", "bytea"),
               ("day", "date"), ("extra", "some_custom_type")]
AWKWARD_TEXT = ['plain', 'Zürich', '"quoted"', "back\\slash", "ctl\x00\x01\x1f\x7f", "tab\tnl\nret\r",
                "\u2028\u2029", "emoji 🚀", "", "ünïcödé ключ"]


def _row(i: int, text: str) -> tuple:
    t = dt.datetime(2026, 1, 2, 3, 4, 5, i % 3 * 7, tzinfo=dt.UTC)    # microsecond 0 every third row
    entry = {"z": [1, text, None, True, {"b": 2 ** 70, "a": ""}], text: i, "a": {"nested": [text]}}
    return (i, uuid.uuid4(), text, -(2 ** 62) + i, "EUR", json.dumps(entry, ensure_ascii=i % 2 == 0),
            bytes(32), bytes([i % 256]) * 32, t, decimal.Decimal(f"{i}.{i:03d}"), i % 2 == 0, bytes([i % 256, 0]),
            dt.date(2026, 1, 1 + i % 28), text)


def _as_fields(row: tuple) -> dict:
    fields = dict(zip([name for name, _ in ROW_COLUMNS], row))
    fields["entry"] = json.loads(fields["entry"])
    return fields


@pytest.mark.parametrize("i", range(len(AWKWARD_TEXT) * 3))
def test_the_row_encoder_gives_the_canonical_bytes_of_a_typed_row(i):
    row = _row(i, AWKWARD_TEXT[i % len(AWKWARD_TEXT)])
    assert RowEncoder(ROW_COLUMNS).encode(row) == canonical(_as_fields(row))
    assert RowEncoder(ROW_COLUMNS).row_hash(GENESIS, row) == row_hash(GENESIS, _as_fields(row))


def test_the_row_encoder_falls_back_to_the_generic_rule_for_values_not_of_their_column_type():
    other_tz = dt.datetime(2026, 1, 2, 4, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    row = (True, "not-a-uuid", 5, "12", None, {"already": "decoded"}, b"", b"", other_tz, "1.5", 1, "x",
           dt.date(2026, 1, 1), [1, "two"])
    fields = dict(zip([name for name, _ in ROW_COLUMNS], row))
    assert RowEncoder(ROW_COLUMNS).encode(row) == canonical(fields)


@pytest.mark.parametrize("column, value", [("entry", '{"rate": 0.1}'), ("entry", '[NaN]'),
                                           ("created_at", dt.datetime(2026, 1, 1)), ("extra", 1.5)])
def test_the_row_encoder_refuses_what_canonical_refuses(column, value):
    row = list(_row(1, "x"))
    row[[name for name, _ in ROW_COLUMNS].index(column)] = value
    with pytest.raises(TypeError):
        RowEncoder(ROW_COLUMNS).encode(tuple(row))


def test_the_row_encoder_of_json_text_with_whitespace_decodes_it_as_json_does():
    cols = [("doc", "json")]
    assert RowEncoder(cols).encode((' {"b": 1,  "a": [ ]} ',)) == canonical({"doc": {"a": [], "b": 1}})
    with pytest.raises(ValueError):
        RowEncoder(cols).encode(('{"a": 1} trailing',))


def test_a_rows_documents_come_with_its_canonical_bytes_from_one_conversion():
    fields = {"seq": 3, "entry": {"b": [1, "é"], "a": None}, "note": None, "prev_hash": b"x"}
    body, texts = canonical_with_documents(fields, {"entry", "note", "absent"})
    assert body == canonical(fields) and texts == {"entry": canonical_json(fields["entry"])}


@pytest.mark.parametrize("value", [0.5, [1, 0.5], {"a": {"b": [0.5]}}, dt.datetime(2026, 1, 1), [dt.datetime(2026, 1, 1)]])
def test_a_value_without_canonical_form_is_refused_however_deep(value):
    with pytest.raises(TypeError):
        canonical({"entry": {"x": value}})


def test_subclasses_of_native_types_and_nested_scalars_encode_as_their_plain_values():
    class Code(str):
        pass

    class Count(int):
        pass

    assert canonical({"a": {"c": Code("x"), "n": Count(3), "t": True, "z": None, "l": [Code("y"), 1, False]}}) == \
        b'{"a":{"c":"x","l":["y",1,false],"n":3,"t":true,"z":null}}'
