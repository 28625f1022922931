import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockprep.packed import checksum, index_records, message, pack, records, unpack
from blockprep.wire import DeltaMessageError

MESSAGE = pack(2, 1, [(1, 0, 0, [5, 6]), (3, 0, 1, [0, 9]), (4, 0, 1, [0])])


def test_round_trip():
    m = pickle.loads(pickle.dumps(MESSAGE))
    assert unpack(m, ["a", "b"]) == {
        "seq": 2,
        "base": 1,
        "rows": {"a": [["w", [5, 6]]], "b": [["s", [0], [9]], ["t", 0]]},
    }
    grouped = pack(3, None, [(2, 1, 0, [7]), (1, 0, 0, [4])])
    assert unpack(grouped, ["r"], ["x", "y"])["rows"] == {
        "r": {"y": [["a", [7]]], "x": [["w", [4]]]}
    }


def _resealed(m, **fields):
    out = dict(m, **fields)
    out["crc"] = checksum(out["seq"], out["base"], out["count"], out["data"])
    return out


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (dict(MESSAGE, data=MESSAGE["data"][:-4]), "checksum"),
        (dict(MESSAGE, seq=3), "checksum"),
        (dict(MESSAGE, base=None), "checksum"),
        (dict(MESSAGE, v=2), "version 2"),
        (_resealed(MESSAGE, count=4), "says 4 records, holds 3"),
        (_resealed(MESSAGE, data=MESSAGE["data"][:-4]), r"record 2 is truncated: its header"),
        (_resealed(MESSAGE, data=MESSAGE["data"][:20]), r"record 0 is truncated: it needs 6"),
        (_resealed(MESSAGE, data=b"\x09" + MESSAGE["data"][1:]), "record 0: unknown kind 9"),
        (_resealed(MESSAGE, data=MESSAGE["data"] + b"\0\0\0"), "whole int32 words"),
        ("not a message", "must be a dict"),
    ],
)
def test_corruption_is_refused(bad, match):
    with pytest.raises(DeltaMessageError, match=match):
        records(bad, 2)


def test_rows_and_groups_are_bounded():
    with pytest.raises(DeltaMessageError, match=r"record 1: row 1 not in the batch's 1 requests"):
        unpack(MESSAGE, ["a"])
    with pytest.raises(DeltaMessageError, match=r"record 0: group 1 not in \[0, 1\)"):
        records(pack(0, None, [(1, 1, 0, [3])]), 1)


@pytest.mark.parametrize(
    "record", [(5, 0, 0, [1]), (3, 0, 0, [1]), (4, 0, 0, []), (1, -1, 0, [1]), (1, 0, 0, [2**31])]
)
def test_pack_refuses_bad_records(record):
    with pytest.raises(DeltaMessageError, match="record 0"):
        pack(0, None, [record])


# --- index_records: the compiled index and its twin ---------------------------------------------

compiled = pytest.importorskip("blockprep._engine._kernel")


def _outcome(function, *args):
    try:
        return "ok", function(*args)
    except (TypeError, ValueError) as error:
        return type(error).__name__, str(error)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_index_records_compiled_equals_twin(data) -> None:
    """Random payloads, mostly well formed (whole, append, set, truncate records of a few
    groups and rows), sometimes cut, with a wrong count, a bad kind, group or row, or a table
    row that is no int: the compiled index and the twin agree on the result or the error, and
    a well-formed payload's index is what its records say (checked against ``records``)."""
    batch = data.draw(st.integers(1, 5))
    groups = data.draw(st.integers(1, 3))
    words: list[int] = []
    count = 0
    for _ in range(data.draw(st.integers(0, 6))):
        kind = data.draw(st.integers(1, 4))
        n = data.draw(st.integers(0, 3))
        width = 0 if kind == 4 else 2 * n if kind == 3 else n
        group = data.draw(st.integers(0, groups - 1))
        row = data.draw(st.integers(0, batch - 1))
        words += [
            kind,
            group,
            row,
            n,
            *data.draw(st.lists(st.integers(-5, 50), min_size=width, max_size=width)),
        ]
        count += 1
    damage = data.draw(st.integers(0, 9))
    if damage == 1 and words:
        words = words[: data.draw(st.integers(0, len(words) - 1))]
    elif damage == 2:
        count += data.draw(st.sampled_from([-1, 1, 2**63, 2**64, -(2**70)]))
    elif damage == 3 and words:
        words[data.draw(st.integers(0, len(words) - 1))] = data.draw(
            st.sampled_from([-1, 0, 5, batch, groups, 2**31 - 1, -(2**31)])
        )
    rows = data.draw(st.permutations(range(10)))[:batch]
    if damage == 4:
        rows[data.draw(st.integers(0, batch - 1))] = data.draw(
            st.sampled_from([-1, 2**31, "1", 1.0, True])
        )
    payload = np.asarray(words, dtype="<i4").tobytes()
    got_c = _outcome(compiled.index_records, payload, count, rows, groups)
    got_py = _outcome(index_records, payload, count, rows, groups)
    assert got_c == got_py
    if got_c[0] == "ok" and got_c[1] is not None:
        expected: list[dict[int, list[int]]] = [{} for _ in range(groups)]
        for record in records(message(0, None, count, payload), batch, groups)[1]:
            expected[record.group].setdefault(rows[record.row], []).append(record.offset)
        assert got_c[1] == [{r: tuple(o) for r, o in d.items()} for d in expected]
    elif got_c[0] == "ok":
        with pytest.raises(DeltaMessageError):
            records(message(0, None, count, payload), batch, groups)


@pytest.mark.parametrize(
    "args",
    [
        (b"\0\0\0", 0, [0], 1),
        (b"", 0, (0,), 1),
        (b"", 0, [0], 0),
        (b"", 0, [0], 2**17),
        (b"", 0, [0], 2**70),
        (b"", 0, [0], -(2**70)),
        (b"", 0, [0], 1.5),
        (b"", 1.0, [0], 1),
        (b"", "0", [0], 1),
        ("", 0, [], 1),
        ("", 1.0, [], 1),
    ],
)
def test_index_records_refuses_bad_arguments(args) -> None:
    assert _outcome(compiled.index_records, *args) == _outcome(index_records, *args)
    assert _outcome(index_records, *args)[0] in ("TypeError", "ValueError")
