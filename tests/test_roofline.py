"""minigpt.roofline: the per-GPU floor of a model too large for one GPU, and the module's worked example."""
from __future__ import annotations

import doctest

import pytest

from minigpt import roofline as R


def test_gpus_to_hold_counts_whole_gpus():
    assert R.gpus_to_hold(70e9, 2) == 2                    # 140 GB on 80 GB GPUs
    assert R.gpus_to_hold(7e9, 2) == 1                     # 14 GB fits on one
    assert R.gpus_to_hold(40e9, 2, 80e9) == 1              # exactly full still fits
    assert R.gpus_to_hold(40e9 + 1, 2, 80e9) == 2
    with pytest.raises(ValueError):
        R.gpus_to_hold(0, 2)


def test_a_split_model_keeps_its_ridge_and_halves_its_floor():
    bw, peak = R.H100_SXM_BANDWIDTH, R.H100_SXM_BF16_FLOPS
    whole, half = R.step_time_floor(70e9, 2, bw, peak), R.step_time_floor(35e9, 2, bw, peak)
    assert half == pytest.approx(whole / 2)
    t_star = R.tokens_until_compute_bound(peak, bw, 2)   # depends on the chip only, not on N
    for n in (70e9, 35e9):
        assert R.step_time_floor(n, 2, bw, peak, n_tokens=int(t_star)) == pytest.approx(R.step_time_floor(n, 2, bw, peak))
        assert R.step_time_floor(n, 2, bw, peak, n_tokens=int(2 * t_star)) > 1.9 * R.step_time_floor(n, 2, bw, peak)


def test_module_docstring_examples():
    failures, _ = doctest.testmod(R)
    assert failures == 0
