"""The verdict rule every lesson prints with: >= 5 interleaved repeats, paired ratios judged against an A/A control
(plain against plain in the same rounds). Synthetic timings show what the rule can see on a loaded machine and
what the former rule (the baseline's own spread across rounds) could not."""
from __future__ import annotations

import math
import random
import statistics

import pytest

from minigpt.device import time_rotating, time_rotating_over
from minigpt.verdict import (TOO_FEW, aa_band, interval_rank, noise_band, paired_ratios, race_band, ratio_interval,
                             record_noise_band, speed_verdict, twin_of, verdict_from_range, verdict_line,
                             verdict_sentence)

BAND = (1 / 1.03, 1.03)   # plain strayed 3% from its twin


def loaded_machine(speed: float, repeats: int, seed: int, jitter: float = 0.01):
    """Rounds of (plain, plain's twin, method) times on a shared machine: each round is slowed by a common factor
    drawn from 1.0-1.8 (the load of that moment), each call by its own jitter. ``speed``: the method's true speed
    over plain (1.15: 15% faster)."""
    rng = random.Random(seed)
    plain, twin, method = [], [], []
    for _ in range(repeats):
        load = rng.uniform(1.0, 1.8)
        plain.append(1.0 * load * math.exp(rng.gauss(0, jitter)))
        twin.append(1.0 * load * math.exp(rng.gauss(0, jitter)))
        method.append(1.0 / speed * load * math.exp(rng.gauss(0, jitter)))
    return plain, twin, method


def former_rule(plain: list[float], method: list[float]) -> str:
    """The rule this module replaced: a band from plain's own spread around its median across rounds."""
    m = statistics.median(plain)
    w = max(max(plain) / m - 1, 1 - min(plain) / m)
    ratios = [p / t for p, t in zip(plain, method)]
    if min(ratios) > 1 + w:
        return "faster"
    if max(ratios) < 1 - w:
        return "slower"
    return "no measurable difference"


def judge(plain, twin, method) -> str:
    return speed_verdict(paired_ratios(plain, method), noise_band(plain, twin))


def test_a_method_no_faster_than_plain_is_no_measurable_difference_on_a_loaded_machine():
    plain, twin, method = loaded_machine(1.00, 5, seed=0)
    assert judge(plain, twin, method) == "no measurable difference"
    calls = [judge(*loaded_machine(1.00, n, seed)) for n in (5, 9) for seed in range(200)]
    assert calls.count("no measurable difference") >= 0.99 * len(calls)   # a false verdict at most 1 in 100


def test_a_real_15_percent_speedup_is_faster_under_drift_that_blinded_the_former_rule():
    plain, twin, method = loaded_machine(1.15, 5, seed=0)
    assert max(plain) / min(plain) > 1.3                                   # the load moved whole rounds by > 30%
    assert former_rule(plain, method) == "no measurable difference"        # its band was the drift
    assert judge(plain, twin, method) == "faster"                          # the drift cancels within a round
    new = [judge(*loaded_machine(1.15, 5, seed)) for seed in range(200)]
    old = [former_rule(p, m) for p, _, m in (loaded_machine(1.15, 5, seed) for seed in range(200))]
    assert new.count("faster") >= 0.95 * len(new) and old.count("faster") <= 0.1 * len(old)


def test_a_real_slowdown_is_slower():
    plain, twin, method = loaded_machine(0.85, 5, seed=1)
    assert judge(plain, twin, method) == "slower"
    assert former_rule(plain, method) == "no measurable difference"


def test_too_few_repeats_give_no_verdict_however_large_the_ratio():
    plain, twin, method = loaded_machine(2.0, 3, seed=0)
    assert judge(plain, twin, method) == TOO_FEW == "too few repeats"
    assert speed_verdict([2.0] * 4, BAND) == "too few repeats"
    assert speed_verdict([0.5] * 4, BAND) == "too few repeats"
    line = verdict_sentence("chain", [2.0, 2.1, 1.9], BAND)
    assert line.startswith("chain: too few repeats for a verdict against plain") and "fewer than the 5" in line
    assert "no measurable difference" not in line


def test_more_repeats_narrow_the_interval_instead_of_widening_it():
    assert [interval_rank(n) for n in (5, 6, 7, 8, 10, 11, 13, 31)] == [1, 1, 1, 2, 2, 3, 4, 11]
    assert ratio_interval([1.3, 1.28, 1.35, 1.31, 1.29]) == (1.28, 1.35)            # the range for 5 repeats
    assert ratio_interval([1.0, 1.3, 1.31, 1.32, 1.33, 1.34, 1.35, 1.9]) == (1.3, 1.35)  # one outlier each end dropped
    # one disturbed round among 9 no longer decides: the interval skips it
    ratios = [1.2, 1.21, 1.19, 1.22, 1.2, 1.18, 1.21, 1.2, 0.7]
    assert speed_verdict(ratios, BAND) == "faster"
    assert speed_verdict(ratios[:5] + [0.7], BAND) == "no measurable difference"  # 6 repeats: still the range


def test_the_band_is_plain_against_its_twin_either_way_round():
    assert aa_band([1.0, 1.02, 0.99, 1.01, 1.0]) == pytest.approx((1 / 1.02, 1.02))
    assert aa_band([1.0, 0.95, 1.0, 1.01, 1.0]) == pytest.approx((0.95, 1 / 0.95))  # a slow plain counts as much
    assert noise_band([2.0, 4.0, 3.0, 2.0, 2.0], [2.0, 4.0, 3.0, 2.0, 2.0]) == (1.0, 1.0)  # drift alone: no noise
    with pytest.raises(ValueError, match="A/A twin"):
        noise_band([1.0, 1.1, 0.9])                       # the former call: one line says what to do instead
    with pytest.raises(ValueError, match="same rounds"):
        paired_ratios([1.0, 1.0], [1.0])


def test_a_range_touching_the_band_gives_no_verdict():
    assert speed_verdict([1.3, 1.28, 1.35, 1.31, 1.29], BAND) == "faster"
    assert speed_verdict([1.02, 1.2, 1.3, 1.25, 1.22], BAND) == "no measurable difference"   # one round inside
    assert speed_verdict([0.7, 0.72, 0.69, 0.8, 0.75], BAND) == "slower"
    assert speed_verdict([0.98, 0.6, 0.7, 0.65, 0.66], BAND) == "no measurable difference"


def test_sentences_say_the_verdict_and_the_numbers_behind_it():
    line = verdict_sentence("chain", [1.3, 1.28, 1.35, 1.31, 1.29], BAND)
    assert line == "chain: faster than plain (1.28-1.35x over 5 repeats; A/A noise band 0.97-1.03)"
    assert verdict_line("medusa", 0.6, 0.8, 5, BAND).startswith("medusa: slower than plain")
    assert "over 9 repeats, the 1 lowest and 1 highest left out" in verdict_sentence("x", [1.0] * 9, BAND)
    assert verdict_from_range(0.6, 0.8, 5, BAND) == "slower"


def test_the_band_of_a_benchmark_record():
    assert record_noise_band({"noise_band": [0.97, 1.03]}) == (0.97, 1.03)
    with pytest.raises(ValueError, match="run the benchmark again"):
        record_noise_band(dict(time_s_min=0.9, time_s_median=1.0, time_s_max=1.2))


def test_time_rotating_times_the_baseline_twice_with_its_twin_half_way_round():
    order = []

    def make(label):
        return lambda: order.append(label) or label
    seconds, results = time_rotating({"plain": make("plain"), "a": make("a"), "b": make("b")}, "cpu", repeat=5,
                                     warmup=1, aa="plain")
    assert list(seconds) == ["plain", "a", "b", twin_of("plain")] and all(len(s) == 5 for s in seconds.values())
    assert order[:3] == ["plain", "a", "b"]                    # warm-up: the twin is plain, warmed once
    rounds = [order[3 + 4 * r: 7 + 4 * r] for r in range(5)]
    assert rounds[0] == ["plain", "a", "plain", "b"] and rounds[1] == ["a", "plain", "b", "plain"]
    assert results[twin_of("plain")] == "plain"
    assert len(race_band(seconds)) == 2 and len(paired_ratios(seconds["plain"], seconds["a"])) == 5
    with pytest.raises(ValueError, match="names no function"):
        time_rotating({"a": make("a")}, "cpu", aa="plain")
    with pytest.raises(ValueError, match="no A/A twin"):
        race_band({"plain": [1.0] * 5})


def test_per_input_times_of_a_round_are_summed():
    seconds, _ = time_rotating_over({"plain": lambda x: x, "m": lambda x: x}, [1, 2], "cpu", repeat=2, aa="plain")
    assert len(seconds[twin_of("plain")]) == 2 and len(seconds[twin_of("plain")][0]) == 2
    assert paired_ratios([[1.0, 2.0], [2.0, 2.0]], [[1.0, 0.5], [1.0, 1.0]]) == [2.0, 2.0]


def test_the_benchmark_records_carry_the_a_a_control_and_the_table_prints_verdicts():
    import torch

    from conftest import perturbed_copy, random_model
    from minigpt.bench import Models, format_table, run_bench
    from minigpt.prompts import Prompt
    target = random_model(1)
    g = torch.Generator().manual_seed(1)
    prompts = [Prompt(torch.randint(97, (12,), generator=g).tolist(), f"p{i}", k) for i, k in enumerate("aab")]
    for repeats, expect in ((5, {"faster", "slower", "no measurable difference"}), (3, {"too few repeats"})):
        records = run_bench(["chain"], models=Models(target, perturbed_copy(target, 0.3, seed=2)), prompts=prompts,
                            max_new_tokens=6, repeats=repeats, gamma=3)
        plain, chain = records
        assert len(plain["aa_ratios"]) == repeats and plain["verdict"] == "baseline"
        assert tuple(plain["noise_band"]) == aa_band(plain["aa_ratios"]) == record_noise_band(chain)
        assert chain["verdict"] in expect and chain["by_kind"]["a"]["verdict"] in expect
        assert chain["speedup_interval"] == [chain["speedup_min"], chain["speedup_max"]]   # the range, below 8
        table = format_table(records)
        assert "A/A noise band" in table and chain["verdict"] in table.splitlines()[3]
