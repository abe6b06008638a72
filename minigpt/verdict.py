"""From repeated timings to a verdict a lesson may print: "faster", "slower" or "no measurable difference".

The course's rule (COURSE_GUIDE, "Truth rules"): a verdict needs at least :data:`MIN_REPEATS` repeats and a
speed ratio whose whole range over the repeats lies outside the run's **noise band**; anything else is "no
measurable difference". The noise band is how far the baseline moves against itself within the same run: with
the baseline's repeats at times :math:`t_1..t_n` and median :math:`m`, its half-width is
:math:`w = \\max(\\max_i t_i / m - 1,\\; 1 - \\min_i t_i / m)`, and the band is :math:`[1 - w, 1 + w]`. A
method is "faster" only when even its worst repeat is above :math:`1 + w`, "slower" only when even its best is
below :math:`1 - w`. On a busy machine the band is wide and few verdicts survive: that is the point.

    band = noise_band(plain_times)                        # e.g. (0.94, 1.06)
    speed_verdict([1.31, 1.28, 1.35, 1.30, 1.29], band)   # 'faster'
    verdict_sentence("chain", speedups, band)             # 'chain: faster than plain (1.28-1.35x over 5 ...)'
"""
from __future__ import annotations

import statistics
from typing import Sequence

MIN_REPEATS = 5


def noise_band(baseline_times: Sequence[float]) -> tuple[float, float]:
    """``(1 - w, 1 + w)``: how far the baseline's own repeats stray from their median, as a ratio band (the lower
    end held at 0 when a repeat took more than twice the median: a ratio is never negative)."""
    if not baseline_times or min(baseline_times) <= 0:
        raise ValueError("noise_band needs at least one positive baseline time")
    m = statistics.median(baseline_times)
    w = max(max(baseline_times) / m - 1, 1 - min(baseline_times) / m)
    return max(0.0, 1 - w), 1 + w


def verdict_from_range(lowest: float, highest: float, repeats: int, band: tuple[float, float],
                       min_repeats: int = MIN_REPEATS) -> str:
    """``"faster"``, ``"slower"`` or ``"no measurable difference"`` from the lowest and highest per-repeat speed
    ratio (baseline time over the method's time, > 1 when the method is faster) of ``repeats`` repeats, judged
    against the run's noise ``band`` (the benchmark's ``speedup_min``, ``speedup_max`` and ``repeats``)."""
    if repeats < min_repeats:
        return "no measurable difference"
    if lowest > band[1]:
        return "faster"
    if highest < band[0]:
        return "slower"
    return "no measurable difference"


def speed_verdict(ratios: Sequence[float], band: tuple[float, float], min_repeats: int = MIN_REPEATS) -> str:
    """:func:`verdict_from_range` for the list of per-repeat speed ratios."""
    return verdict_from_range(min(ratios), max(ratios), len(ratios), band, min_repeats)


def verdict_sentence(name: str, ratios: Sequence[float], band: tuple[float, float], baseline: str = "plain",
                     min_repeats: int = MIN_REPEATS) -> str:
    """One printable line: the verdict with the numbers behind it, e.g. ``"chain: faster than plain
    (1.28-1.35x over 5 repeats; noise band 0.94-1.06)"``; says why when there are too few repeats."""
    return verdict_line(name, min(ratios), max(ratios), len(ratios), band, baseline, min_repeats)


def verdict_line(name: str, lowest: float, highest: float, repeats: int, band: tuple[float, float],
                 baseline: str = "plain", min_repeats: int = MIN_REPEATS) -> str:
    """:func:`verdict_sentence` from the lowest and highest ratio of ``repeats`` repeats."""
    v = verdict_from_range(lowest, highest, repeats, band, min_repeats)
    words = {"faster": f"faster than {baseline}", "slower": f"slower than {baseline}",
             "no measurable difference": f"no measurable difference from {baseline}"}[v]
    why = "" if repeats >= min_repeats else f", fewer than the {min_repeats} a verdict needs"
    return (f"{name}: {words} ({lowest:.2f}-{highest:.2f}x over {repeats} repeats{why}; "
            f"noise band {band[0]:.2f}-{band[1]:.2f})")


def record_noise_band(plain_record: dict) -> tuple[float, float]:
    """:func:`noise_band` of a :func:`minigpt.bench.run_bench` record of the baseline, from its fastest, median
    and slowest repeat (``time_s_min``, ``time_s_median``, ``time_s_max``)."""
    return noise_band([plain_record["time_s_min"], plain_record["time_s_median"], plain_record["time_s_max"]])
