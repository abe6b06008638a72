"""minigpt.batch_costs: Lesson 12's measurements of batched, paged decoding, on a tiny random target (the
timings themselves are not asserted; their structure, the outputs they check and the counted ratios are)."""
from __future__ import annotations

import statistics

import pytest
import torch

from conftest import random_model
from minigpt.batch_costs import (PAGED_PARTS, added_by_paging, batch_step_times, fixed_batch_pass_ratio,
                                 paged_step_parts, paging_throughput, race_verdicts, request_passes, round_split)
from minigpt.decoding import Lookup
from minigpt.decoding.batch import PerSequence, Request
from minigpt.decoding.plain import Plain
from minigpt.verdict import twin_of


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return random_model(0)


def prompts(n: int, vocab: int = 97) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (5 + 3 * i,), generator=g).tolist() for i in range(n)]


def test_batch_step_times_rounds_twin_and_outputs(model):
    times = batch_step_times(model, prompts(4), [1, 2, 4], n_steps=3, repeats=2, warmup=0)
    assert list(times) == [1, twin_of(1), 2, 4]
    assert all(len(v) == 2 and min(v) > 0 for v in times.values())
    with pytest.raises(ValueError, match="B = 1"):
        batch_step_times(model, prompts(4), [2, 4], n_steps=2, repeats=1)
    with pytest.raises(ValueError, match="prompts for a batch"):
        batch_step_times(model, prompts(2), [1, 4], n_steps=2, repeats=1)


def test_paging_throughput_serves_the_same_tokens_with_a_larger_batch(model):
    reqs = [Request(p, n) for p, n in zip(prompts(6), [2, 12, 3, 10, 2, 12])]
    seconds, reports = paging_throughput(model, reqs, same_memory=2, repeats=1, block_size=16)
    assert set(seconds) == {"contiguous", "paged", twin_of("contiguous")}
    assert max(reports["contiguous"].stats.batch_sizes) <= 2
    assert max(reports["paged"].stats.batch_sizes) > 2          # short requests fit where a whole context would not
    assert reports["paged"].peak_blocks <= 2 * model.config.block_size // 16


def test_paged_step_parts_cover_every_part_and_account_for_the_difference(model):
    parts = paged_step_parts(model, prompts(3)[2], steps=2, repeats=2, block_size=4)
    for label in ("contiguous", "paged", twin_of("contiguous"), *PAGED_PARTS):
        assert len(parts[label]) == 2 and min(parts[label]) > 0
    assert parts["cached"] == len(prompts(3)[2]) - 1
    split = added_by_paging(parts)
    assert set(split["added"]) == set(PAGED_PARTS)
    med = {k: statistics.median(v) for k, v in parts.items() if isinstance(v, list)}
    assert split["difference"] == pytest.approx(med["paged"] - med["contiguous"])
    assert split["unexplained"] == pytest.approx(split["difference"] - sum(split["added"].values()))
    assert split["added"]["gather"] == pytest.approx(med["gather"])   # the contiguous cache gathers nothing


def test_fixed_batch_pass_ratio_counts_the_slowest_sequence():
    passes, plain = [4, 8, 2, 6], [10, 10, 10, 10]
    assert fixed_batch_pass_ratio(passes, plain, 1) == pytest.approx(40 / 20)     # the requests' own ratio
    assert fixed_batch_pass_ratio(passes, plain, 2) == pytest.approx(20 / (8 + 6))
    assert fixed_batch_pass_ratio(passes, plain, 4) == pytest.approx(10 / 8)
    with pytest.raises(ValueError):
        fixed_batch_pass_ratio([1, 2], [3], 1)


def test_request_passes_are_the_solo_counts(model):
    ps = prompts(3)
    lookup = request_passes(model, ps, 6, PerSequence(lambda: Lookup(2, 4)))
    alone = [request_passes(model, [p], 6, PerSequence(lambda: Lookup(2, 4)))[0] for p in ps]
    assert lookup == alone
    assert request_passes(model, ps, 6, PerSequence(Plain)) == [6, 6, 6]


def record(batch, method, passes, tokens_per_s, speedup, verdict):
    return dict(batch=batch, method=method, tokens=48 * batch, batch_passes=passes, tokens_per_s=tokens_per_s,
                speedup=speedup, verdict=verdict)


def test_round_split_and_race_verdicts():
    records = [record(1, "plain", 48, 100.0, 1.0, "baseline"), record(1, "chain", 24, 150.0, 1.5, "faster"),
               record(2, "plain", 48, 180.0, 1.0, "baseline"), record(2, "chain", 30, 170.0, 0.9, "slower")]
    split = round_split(records)
    ratio, cost = split["chain", 1]
    assert ratio == pytest.approx(2.0) and ratio / cost == pytest.approx(1.5)
    ratio, cost = split["chain", 2]
    assert ratio == pytest.approx(48 / 30) and ratio / cost == pytest.approx(170 / 180)
    v = race_verdicts(records, "chain")
    assert v == dict(faster=[1], slower=[2], undecided=[], below_one=[2], first_slower=2)
