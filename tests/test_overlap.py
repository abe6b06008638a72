"""minigpt.overlap: which answer tokens repeat a run of the request."""
from __future__ import annotations

import pytest

from minigpt.overlap import copied_positions, copied_share, first_copied


def test_a_copied_run_is_marked_and_a_short_coincidence_is_not():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    answer = [9, 9, 3, 4, 5, 6, 9, 1, 2, 9]     # 3 4 5 6 is a 4-token copy; 1 2 only a 2-token one
    mask = copied_positions(prompt, answer, n=4)
    assert mask == [False, False, True, True, True, True, False, False, False, False]
    assert copied_share(prompt, answer, n=4) == pytest.approx(0.4)
    assert first_copied(mask) == 2
    assert copied_positions(prompt, answer, n=2)[7:9] == [True, True]


def test_overlapping_ngrams_join_into_one_run_and_edges():
    prompt = list(range(20))
    answer = [50, 51] + list(range(5, 15)) + [52]
    mask = copied_positions(prompt, answer, n=4)
    assert mask == [False, False] + [True] * 10 + [False]
    assert first_copied([False, False]) is None
    assert copied_share(prompt, [], n=4) == 0.0
    assert copied_positions(prompt, [1, 2], n=4) == [False, False]   # shorter than n: nothing to match
    with pytest.raises(ValueError):
        copied_positions(prompt, answer, n=0)
