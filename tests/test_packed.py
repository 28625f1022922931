import pickle

import pytest

from blockprep.packed import pack, unpack
from blockprep.wire import DeltaMessageError


def test_round_trip_and_corruption():
    m = pack(2, 1, [(1, 0, 0, [5, 6]), (3, 0, 1, [0, 9]), (4, 0, 1, [0])])
    m = pickle.loads(pickle.dumps(m))
    assert unpack(m, ["a", "b"]) == {
        "seq": 2,
        "base": 1,
        "rows": {"a": [["w", [5, 6]]], "b": [["s", [0], [9]], ["t", 0]]},
    }
    bad = dict(m, data=m["data"][:-4])
    with pytest.raises(DeltaMessageError, match="checksum"):
        unpack(bad, ["a", "b"])
    with pytest.raises(DeltaMessageError, match="row"):
        unpack(m, ["a"])
