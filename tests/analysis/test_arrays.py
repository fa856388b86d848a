"""The numpy helpers agree with the numpy functions they stand in for."""

import numpy as np
import pytest

from sidecar.analysis.reader.arrays import distinct, isin


@pytest.mark.parametrize("seed", range(5))
def test_distinct_and_isin_match_numpy(seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(-5, 50, size=int(rng.integers(0, 200)), dtype=np.int64)
    wanted = rng.integers(-10, 60, size=int(rng.integers(0, 30))).tolist()
    assert distinct(values).tolist() == np.unique(values).tolist()
    assert isin(values, wanted).tolist() == np.isin(values, wanted).tolist()


def test_edge_cases():
    empty = np.array([], dtype=np.int32)
    assert distinct(empty).tolist() == []
    assert isin(empty, [1, 2]).tolist() == []
    assert isin(np.array([1, 2, 3]), []).tolist() == [False, False, False]
    assert distinct(np.array([7])).tolist() == [7]
    big = np.array([2**40, 5, 2**40], dtype=np.int64)  # correlation ids may be large
    assert isin(big, [2**40]).tolist() == [True, False, True]


@pytest.mark.parametrize("seed", range(8))
def test_start_order_is_lexsort_by_start_then_longest_first(seed):
    from sidecar.analysis.reader.nesting import start_order

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    ts = np.sort(rng.integers(0, 40, size=n)).astype(np.float64)  # nearly sorted, many ties
    moved = rng.integers(0, n, size=n // 10) if n else np.zeros(0, dtype=np.int64)
    ts[moved] = rng.integers(0, 40, size=len(moved))  # some out of order
    dur = rng.integers(0, 5, size=n).astype(np.float64)  # ties in duration too
    assert start_order(ts, dur).tolist() == np.lexsort((-dur, ts)).tolist()


@pytest.mark.parametrize("seed", range(6))
def test_covered_matches_a_walk_over_the_union(seed):
    from sidecar.analysis.questions import intervals

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    start = rng.integers(0, 1000, size=n).astype(np.float64)
    spans = intervals.union(start, start + rng.integers(0, 50, size=n))
    lo = rng.integers(-50, 1100, size=40).astype(np.float64)
    hi = lo + rng.integers(0, 200, size=40)
    expected = [sum(max(0.0, min(e, h) - max(s, l)) for s, e in zip(spans.start.tolist(), spans.end.tolist())) for l, h in zip(lo.tolist(), hi.tolist())]
    assert intervals.covered(spans, lo, hi) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_groups_is_unique_with_first_index_and_inverse(seed):
    from sidecar.analysis.reader.arrays import groups

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    cases = [
        rng.integers(0, 50, size=n).astype(np.int32),  # name ids: small and dense, counted
        rng.integers(0, 2**40, size=n),  # correlation ids: sorted by np.unique
        rng.integers(-3, 5, size=n),  # negative values
        np.zeros(0, dtype=np.int32),
    ]
    for ids in cases:
        expected = np.unique(ids, return_index=True, return_inverse=True)
        got = groups(ids)
        assert [g.tolist() for g in got] == [e.tolist() for e in expected]
        assert got[0].dtype == expected[0].dtype
