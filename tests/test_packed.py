import pickle

import pytest

from blockprep.packed import checksum, pack, records, unpack
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
