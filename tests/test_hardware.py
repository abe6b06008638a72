"""Smoke tests of the device measurements: small sizes, only facts that hold on any machine, busy or not."""
from __future__ import annotations

import math

import pytest
import torch

from minigpt import hardware
from minigpt.model import GPT, GPTConfig

CPU = torch.device("cpu")


def positive_finite(x: float) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_bandwidth_is_a_positive_rate_and_runs_are_returned():
    assert positive_finite(hardware.measure_bandwidth(CPU, n_bytes=2**22, repeat=2))
    runs = hardware.measure_bandwidth(CPU, n_bytes=2**22, repeat=3, return_runs=True)
    assert len(runs) == 3 and all(positive_finite(r) for r in runs)


def test_matmul_flops_is_a_positive_rate():
    assert positive_finite(hardware.measure_matmul_flops(CPU, n=128, repeat=2))
    runs = hardware.measure_matmul_flops(CPU, n=64, repeat=2, return_runs=True)
    assert len(runs) == 2 and all(positive_finite(r) for r in runs)


def test_presets_grow_from_tiny_to_hundreds_of_millions():
    # the meta device builds the shapes without allocating or initialising any memory
    sizes = {name: hardware.model_of_size(name, device="meta").num_params() for name in hardware.MODEL_SIZES}
    counts = list(sizes.values())
    assert counts == sorted(counts) and len(set(counts)) == len(counts)
    assert sizes["tiny"] < 200_000
    assert 250e6 < max(counts) < 400e6
    with pytest.raises(ValueError, match="unknown model size"):
        hardware.model_of_size("enormous")


def test_model_of_size_is_a_seeded_eval_model():
    a, b = hardware.model_of_size("tiny"), hardware.model_of_size("tiny")
    assert not a.training and a.config.block_size >= 512 + 64
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_forward_time_with_and_without_cache():
    model = hardware.model_of_size("tiny")
    assert positive_finite(hardware.forward_time(model, 4, repeat=2))
    # the cache is cropped back before every run, so many repeats never overflow max_len = cached + n_tokens
    runs = hardware.forward_time(model, 3, batch_size=2, cached=5, repeat=4, return_runs=True)
    assert len(runs) == 4 and all(positive_finite(t) for t in runs)
    with pytest.raises(ValueError, match="exceeds the context"):
        hardware.forward_time(model, 1000, cached=100)


def test_sweep_times_every_shape_repeat_times():
    model = hardware.model_of_size("tiny")
    shapes = [(1, 1), (4, 1), (1, 3)]
    runs = hardware.forward_time_sweep(model, shapes, cached=8, repeat=2)
    assert list(runs) == shapes
    assert all(len(r) == 2 and all(positive_finite(t) for t in r) for r in runs.values())


def test_rounds_time_named_passes_of_several_models_round_by_round():
    tiny, draft = hardware.model_of_size("tiny"), hardware.model_of_size("draft")
    passes = {"tiny 1": (tiny, 1, 1), "tiny 5x2": (tiny, 5, 2), "draft 1": (draft, 1, 1)}
    runs = hardware.forward_time_rounds(passes, cached=4, repeat=3, warmup=0)
    assert list(runs) == list(passes)
    assert all(len(r) == 3 and all(positive_finite(t) for t in r) for r in runs.values())
    with pytest.raises(ValueError, match="exceeds the context"):
        hardware.forward_time_rounds({"too long": (tiny, 2000, 1)}, repeat=1)


def test_rounds_set_each_pass_threads_and_restore_them():
    tiny = hardware.model_of_size("tiny")
    seen = []
    real_forward_time = hardware.forward_time
    try:
        hardware.forward_time = lambda *a, **k: seen.append(torch.get_num_threads()) or 1.0
        before = torch.get_num_threads()
        hardware.forward_time_rounds({"one": (tiny, 1, 1, 1), "two": (tiny, 1, 1, 2), "as is": (tiny, 1, 1)}, repeat=2)
    finally:
        hardware.forward_time = real_forward_time
    assert seen == [1, 2, 2, 1, 2, 2] and torch.get_num_threads() == before


def test_rounds_warm_up_more_after_a_change_of_threads():
    tiny = hardware.model_of_size("tiny")
    warmups = []
    real_forward_time = hardware.forward_time
    try:
        hardware.forward_time = lambda *a, **k: warmups.append(k["warmup"]) or 1.0
        torch.set_num_threads(1)
        hardware.forward_time_rounds({"a": (tiny, 1, 1, 1), "b": (tiny, 2, 1, 1), "c": (tiny, 1, 1, 2)}, repeat=2,
                                     warmup=1)
    finally:
        hardware.forward_time = real_forward_time
        torch.set_num_threads(1)
    assert warmups == [1, 1, 3, 3, 1, 3]


def test_round_ratio_takes_ratios_within_rounds():
    # round 3 is slowed 3x for both passes: per-round ratios ignore it, the fastest-of-each ratio would not
    num, den = [2.0, 2.2, 6.0, 2.1, 2.0], [1.0, 1.1, 3.0, 1.05, 1.0]
    med, lo, hi = hardware.round_ratio(num, den)
    assert med == pytest.approx(2.0) and lo == pytest.approx(2.0) and hi == pytest.approx(2.0)
    med, lo, hi = hardware.round_ratio([1.0, 2.0, 3.0, 4.0, 5.0], [1.0] * 5)
    assert (med, lo, hi) == (3.0, 1.0, 5.0)


def test_forward_time_keeps_the_training_flag():
    model = hardware.model_of_size("tiny").train()
    hardware.forward_time(model, 2, repeat=1)
    assert model.training


def test_forward_time_grows_with_many_tokens():
    # 512 tokens through the draft-shaped model are ~0.9 GFLOP, hundreds of times the work of 1 token; even on
    # a busy machine the median cannot come out within a factor 1.5 of a single-token pass.
    model = hardware.model_of_size("draft")
    t1 = hardware.forward_time(model, 1, repeat=3)
    t512 = hardware.forward_time(model, 512, repeat=3)
    assert t512 > 1.5 * t1


def test_call_count_grows_with_depth_and_overhead_is_small():
    one = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    two = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16)).eval()
    c1, c2 = hardware.count_torch_calls(one), hardware.count_torch_calls(two)
    assert 0 < c1 < c2
    assert (c2 - c1) * 2 == hardware.count_torch_calls(
        GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=2, n_embd=16)).eval()) - c2
    overhead = hardware.measure_call_overhead(CPU, repeat=2, calls=200)
    assert positive_finite(overhead) and overhead < 1e-3
