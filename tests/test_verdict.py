"""The verdict rule every lesson prints with: >= 5 repeats and a ratio range outside the run's noise band."""
from __future__ import annotations

import pytest

from minigpt.verdict import (noise_band, record_noise_band, speed_verdict, verdict_from_range, verdict_line,
                             verdict_sentence)

BAND = noise_band([1.0, 0.95, 1.05, 1.0, 1.02])   # the baseline strays 5% either way


def test_noise_band_is_the_baselines_own_spread_symmetric_around_one():
    assert BAND == pytest.approx((0.95, 1.05))
    assert noise_band([2.0, 2.0, 2.0]) == (1.0, 1.0)
    assert noise_band([1.0, 1.0, 1.3]) == pytest.approx((0.7, 1.3))   # the larger side sets the width
    assert noise_band([1.0, 1.0, 2.85]) == pytest.approx((0.0, 2.85))   # a wild repeat: the band starts at 0
    with pytest.raises(ValueError):
        noise_band([])


def test_clearly_faster_and_clearly_slower_runs_get_their_verdicts():
    assert speed_verdict([1.3, 1.28, 1.35, 1.31, 1.29], BAND) == "faster"
    assert speed_verdict([0.7, 0.72, 0.69, 0.8, 0.75], BAND) == "slower"


def test_too_few_repeats_give_no_verdict_however_large_the_ratio():
    assert speed_verdict([2.0, 2.1], BAND) == "no measurable difference"        # Lesson 09's old 2-repeat race
    assert speed_verdict([2.0] * 4, BAND) == "no measurable difference"
    assert "fewer than the 5" in verdict_sentence("chain", [2.0, 2.1], BAND)


def test_a_range_touching_the_noise_band_gives_no_verdict():
    assert speed_verdict([1.01, 1.2, 1.3, 1.25, 1.22], BAND) == "no measurable difference"  # one repeat inside
    assert speed_verdict([1.04, 1.02, 1.01, 1.03, 1.02], BAND) == "no measurable difference"  # a 1.01x-style run
    assert speed_verdict([0.97, 0.6, 0.7, 0.65, 0.66], BAND) == "no measurable difference"


def test_sentences_say_the_verdict_and_the_numbers_behind_it():
    line = verdict_sentence("chain", [1.3, 1.28, 1.35, 1.31, 1.29], BAND)
    assert line.startswith("chain: faster than plain (1.28-1.35x over 5 repeats")
    assert "noise band 0.95-1.05" in line
    assert verdict_line("medusa", 0.6, 0.8, 5, BAND).startswith("medusa: slower than plain")
    assert verdict_from_range(0.6, 0.8, 5, BAND) == "slower"


def test_the_band_of_a_benchmark_record():
    rec = dict(time_s_min=0.9, time_s_median=1.0, time_s_max=1.2)
    assert record_noise_band(rec) == pytest.approx((0.8, 1.2))
