"""pipeline.PartitionLayout (a fold's rows per deck/preset cut as slices of the partition-sorted table) against the
plain definition: the rows of the range whose partition is p, in time order, partitions in order of first
appearance."""

import numpy as np
import pandas as pd

from models.base import ReviewData
from pipeline import PartitionLayout


def _data(part):
    n = len(part)
    rows = pd.DataFrame({"review_th": np.arange(1, n + 1), "delta_t": np.linspace(1, 2, n), "partition": part})
    return ReviewData(rows, np.zeros(1), np.zeros(1, dtype=np.int8))


def test_layout_split_equals_the_rows_of_each_partition_in_first_appearance_order():
    rng = np.random.default_rng(4)
    for n, k in ((50, 3), (200, 7), (30, 1), (90, 2)):
        part = rng.choice(np.array([-1, 5, 17, 3, 40, 8, 2])[:k], n)
        data = _data(part)
        layout = PartitionLayout(data)
        for lo, hi in ((0, n // 2), (n // 2, n // 2 + n // 6), (0, n), (n - 5, n), (3, 4)):
            whole = data.subset(np.arange(lo, hi))
            got = layout.split(whole, lo, hi)
            seen = list(dict.fromkeys(part[lo:hi]))  # first appearance
            assert [p for p, _ in got] == seen
            for p, sub in got:
                expected = data.rows.iloc[lo:hi]
                expected = expected[expected["partition"] == p]
                assert sub.rows["review_th"].tolist() == expected["review_th"].tolist()
                assert sub.rows.index.equals(pd.RangeIndex(len(sub)))
            if len(seen) == 1:
                assert got[0][1] is whole  # one partition: the fold's own rows, no copy


def test_column_is_the_frames_column_read_only():
    """models.base.column equals rows[name].to_numpy(dtype) on whole frames and on slices, and cannot be written
    through (it is the frame's own memory)."""
    import pytest

    from models.base import column

    rows = pd.DataFrame({"a": np.arange(10), "b": np.linspace(0, 1, 10), "c": np.arange(10) * 3})
    for frame in (rows, rows.iloc[3:8], _data(np.arange(10) % 3).subset(np.arange(2, 9)).rows):
        for name in frame.columns:
            for dtype in (None, np.float64, np.int64):
                got = column(frame, name, dtype)
                want = frame[name].to_numpy(dtype)
                assert got.dtype == want.dtype and np.array_equal(got, want)
    with pytest.raises(ValueError):
        column(rows, "a")[0] = 5
    assert rows["a"].iat[0] == 0
