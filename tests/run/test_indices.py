"""Index specifications and sorted indices cut into runs of consecutive values."""

from __future__ import annotations

import numpy as np
import pytest

from probust.run import ConfigError, parse_indices
from probust.run.indices import consecutive_runs, index_ranges


def test_parse_indices():
    assert parse_indices(["0-3", "10,12", "20-26:3", 2]).tolist() == [0, 1, 2, 3, 10, 12, 20, 23, 26]
    for bad in ("a", "1-", "-3", "5-2"):
        with pytest.raises(ConfigError):
            parse_indices(bad)


def test_parsed_indices_are_sorted_unique_int64_whatever_the_order_given():
    got = parse_indices("9 3-5,4 0-8:4")
    assert got.dtype == np.int64 and got.tolist() == [0, 3, 4, 5, 8, 9]


@pytest.mark.parametrize("bad", [-1, "", [], "3-1", "0-9:0", "x-2"])
def test_a_bad_index_spec_is_one_line_naming_indices(bad):
    with pytest.raises(ConfigError, match="^indices: ") as info:
        parse_indices(bad)
    assert "\n" not in str(info.value)


def test_consecutive_runs_cover_the_indices_and_each_is_consecutive():
    indices = np.array([2, 3, 4, 7, 9, 10, 11, 20])
    runs = consecutive_runs(indices)
    assert [indices[r].tolist() for r in runs] == [[2, 3, 4], [7], [9, 10, 11], [20]]
    assert index_ranges(indices) == [[2, 5], [7, 8], [9, 12], [20, 21]]
    # the half-open ranges give the indices back
    assert np.concatenate([np.arange(a, b) for a, b in index_ranges(indices)]).tolist() == indices.tolist()
    assert index_ranges(np.empty(0, np.int64)) == []
