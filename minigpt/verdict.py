"""From interleaved timings to a verdict a lesson may print: "faster", "slower", "no measurable difference" or
"too few repeats".

The course's rule (COURSE_GUIDE, "Truth rules"), judged on **paired ratios against an A/A control**:

1. *Pair within a round.* Each repeat (a *round*) times the baseline, the method and the baseline's *twin* (the
   same baseline timed a second time: A and A'), interleaved in rotating order
   (:func:`minigpt.device.time_rotating` with ``aa="plain"``). The method's paired ratio in round i is
   :math:`r_i = t_{plain,i} / t_{method,i}` (> 1: faster); the A/A ratio is :math:`q_i = t_{plain,i} / t_{twin,i}`.
   A load that slows a whole round slows both times of a ratio alike, and cancels.
2. *The noise band is plain against itself:* how far a ratio strays when nothing differs. With
   :math:`[q_{lo}, q_{hi}]` the A/A ratios' interval (step 3), :math:`h = \\max(q_{hi}, 1/q_{lo})` (plain over
   its twin and the twin over plain count alike) and the band is :math:`[1/h, h]`.
3. *An interval, not one number:* :math:`[r_{lo}, r_{hi}]` runs from the k-th lowest to the k-th highest paired
   ratio, with k the largest for which it holds the median ratio with probability >= 90% (the sign test, which
   assumes nothing about the timings' distribution): k = 1, the **range**, for 5-7 repeats; 2 for 8-10; 3 for
   11-12 ... (:func:`interval_rank`). So more repeats narrow the interval instead of widening it.
4. *The verdict:* "faster" when :math:`r_{lo} > h`, "slower" when :math:`r_{hi} < 1/h`, otherwise "no measurable
   difference"; with fewer than :data:`MIN_REPEATS` (5) repeats, "too few repeats", whatever the ratios.

Why: the former band was the baseline's spread across rounds, which on a shared machine is mostly drift that
hits every method of a round alike, so one disturbed round made every verdict "no measurable difference". The
A/A control is criterion.rs's point that "benchmarking the same code twice will result in small but
statistically significant differences solely because of noise" (its fixed 1% ``noise_threshold``; pyperf's
``compare_to`` asks a t-test instead), measured here in the same run rather than assumed.

    seconds, _ = time_rotating({"plain": plain, "chain": chain}, device, repeat=5, aa="plain")
    band = noise_band(seconds["plain"], seconds[twin_of("plain")])    # e.g. (0.97, 1.03)
    ratios = paired_ratios(seconds["plain"], seconds["chain"])         # e.g. [1.31, 1.28, 1.35, 1.30, 1.29]
    speed_verdict(ratios, band)                                        # 'faster'
    verdict_sentence("chain", ratios, band)   # 'chain: faster than plain (1.28-1.35x over 5 repeats; A/A ...)'
"""
from __future__ import annotations

from math import comb
from typing import Sequence

from .device import twin_of

MIN_REPEATS = 5
COVERAGE = 0.90   # the probability that a ratio interval holds the median ratio (step 3)
TOO_FEW = "too few repeats"


def _per_repeat(times: Sequence) -> list[float]:
    """A time per repeat: a repeat's list of per-input times (:func:`minigpt.device.time_rotating_over`) summed."""
    return [sum(t) if isinstance(t, (list, tuple)) else t for t in times]


def paired_ratios(baseline_times: Sequence, method_times: Sequence) -> list[float]:
    """Per round, the baseline's time over the method's (> 1: the method was faster in that round). A round's
    list of per-input times counts as their sum."""
    base, meth = _per_repeat(baseline_times), _per_repeat(method_times)
    if len(base) != len(meth) or not base:
        raise ValueError(f"paired ratios need the same rounds: {len(base)} baseline times, {len(meth)} method times")
    if min(base) <= 0 or min(meth) <= 0:
        raise ValueError("paired ratios need positive times")
    return [b / m for b, m in zip(base, meth)]


def interval_rank(n: int, coverage: float = COVERAGE) -> int:
    """k: from the k-th lowest to the k-th highest of ``n`` ratios is the narrowest such interval that holds their
    median with probability >= ``coverage`` (sign test: ``1 - 2 P(Binomial(n, 1/2) < k)``); 1 (the range) when
    none narrower does."""
    k = 1
    while k + 1 <= n // 2 and 1 - 2 * sum(comb(n, j) for j in range(k + 1)) / 2 ** n >= coverage:
        k += 1
    return k


def ratio_interval(ratios: Sequence[float]) -> tuple[float, float]:
    """``(r_lo, r_hi)``: the k-th lowest and k-th highest ratio, k = :func:`interval_rank` (the range for 5-7)."""
    if not ratios:
        raise ValueError("no ratios to take an interval of")
    s, k = sorted(ratios), interval_rank(len(ratios))
    return s[k - 1], s[-k]


def aa_band(aa_ratios: Sequence[float]) -> tuple[float, float]:
    """``(1/h, h)``: the noise band of the A/A ratios (baseline over its twin, per round), h the larger of the
    interval's top and the reciprocal of its bottom (step 2 of the rule)."""
    lo, hi = ratio_interval(aa_ratios)
    h = max(hi, 1 / lo)
    return 1 / h, h


def noise_band(baseline_times: Sequence, twin_times: Sequence | None = None) -> tuple[float, float]:
    """:func:`aa_band` of the baseline's times against its twin's, round by round (``seconds["plain"]`` and
    ``seconds[twin_of("plain")]`` of a race timed with ``aa="plain"``)."""
    if twin_times is None:
        raise ValueError("noise_band needs the baseline's A/A twin: time plain twice per round "
                         "(time_rotating(..., aa='plain')) and pass noise_band(seconds['plain'], "
                         "seconds[twin_of('plain')])")
    return aa_band(paired_ratios(baseline_times, twin_times))


def race_band(seconds: dict, baseline: str = "plain") -> tuple[float, float]:
    """:func:`noise_band` of a race from :func:`minigpt.device.time_rotating` (or ``_over``) with ``aa=baseline``."""
    if twin_of(baseline) not in seconds:
        raise ValueError(f"this race has no A/A twin of {baseline!r}: time it with aa={baseline!r}")
    return noise_band(seconds[baseline], seconds[twin_of(baseline)])


def verdict_from_range(lowest: float, highest: float, repeats: int, band: tuple[float, float],
                       min_repeats: int = MIN_REPEATS) -> str:
    """The verdict from the paired ratios' interval ``[lowest, highest]`` (:func:`ratio_interval`; for 5-7 repeats
    their min and max, a benchmark record's ``speedup_min``/``speedup_max``) of ``repeats`` rounds, against the
    A/A noise ``band``: "faster", "slower", "no measurable difference", or "too few repeats"."""
    if repeats < min_repeats:
        return TOO_FEW
    if lowest > band[1]:
        return "faster"
    if highest < band[0]:
        return "slower"
    return "no measurable difference"


def speed_verdict(ratios: Sequence[float], band: tuple[float, float], min_repeats: int = MIN_REPEATS) -> str:
    """:func:`verdict_from_range` of the per-round paired ratios (their :func:`ratio_interval`)."""
    return verdict_from_range(*ratio_interval(ratios), len(ratios), band, min_repeats)


def verdict_sentence(name: str, ratios: Sequence[float], band: tuple[float, float], baseline: str = "plain",
                     min_repeats: int = MIN_REPEATS) -> str:
    """One printable line: the verdict with the numbers behind it, e.g. ``"chain: faster than plain
    (1.28-1.35x over 5 repeats; A/A noise band 0.97-1.03)"``; says why when there are too few repeats."""
    return verdict_line(name, *ratio_interval(ratios), len(ratios), band, baseline, min_repeats)


def verdict_line(name: str, lowest: float, highest: float, repeats: int, band: tuple[float, float],
                 baseline: str = "plain", min_repeats: int = MIN_REPEATS) -> str:
    """:func:`verdict_sentence` from the paired ratios' interval ``[lowest, highest]`` of ``repeats`` rounds."""
    v = verdict_from_range(lowest, highest, repeats, band, min_repeats)
    words = {"faster": f"faster than {baseline}", "slower": f"slower than {baseline}",
             "no measurable difference": f"no measurable difference from {baseline}",
             TOO_FEW: f"too few repeats for a verdict against {baseline}"}[v]
    k = interval_rank(repeats)
    span = f"over {repeats} repeats" + ("" if k == 1 else f", the {k - 1} lowest and {k - 1} highest left out")
    why = "" if repeats >= min_repeats else f", fewer than the {min_repeats} a verdict needs"
    return f"{name}: {words} ({lowest:.2f}-{highest:.2f}x {span}{why}; A/A noise band {band[0]:.2f}-{band[1]:.2f})"


def record_noise_band(record: dict) -> tuple[float, float]:
    """The A/A noise band a :func:`minigpt.bench.run_bench` record (any method's, or a ``by_kind`` group's) was
    judged against: plain against its twin in the same rounds."""
    if "noise_band" not in record:
        raise ValueError("this record has no A/A noise band (it predates the A/A control): run the benchmark again")
    return tuple(record["noise_band"])
