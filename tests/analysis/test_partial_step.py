"""A process's last step range is cut off when under half the median of the others: the median is
numpy's to the bit, without the import of ``numpy.ma`` that ``np.median`` makes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, strategies as st

from sidecar.analysis.questions.steps import _median, partial_last

_DURATIONS = st.lists(st.floats(min_value=0.0, max_value=1e12, allow_nan=False), min_size=1, max_size=40)


@given(_DURATIONS)
def test_median_is_numpys(values):
    assert _median(values) == float(np.median(values))


def test_last_step_under_half_the_median_is_cut_off():
    assert partial_last([100.0, 300.0, 200.0, 99.0])  # median of the others 200: 99 < 100
    assert not partial_last([100.0, 300.0, 200.0, 100.0])
    assert partial_last([100.0, 200.0, 74.0])  # even count: the median is 150
    assert not partial_last([100.0, 200.0, 75.0])
    assert not partial_last([5.0])  # one step: nothing to compare it with
