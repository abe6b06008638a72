"""From logits to the distribution actually sampled from: temperature, top-k, top-p, and the sampler itself."""
from __future__ import annotations

import math

import pytest
import torch

from minigpt.sampling import SamplingConfig, make_generator, probs_from_logits, sample


def random_logits(*shape, seed=0, scale=3.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("kwargs", [dict(), dict(temperature=0.5), dict(temperature=2.0, top_k=5),
                                    dict(top_p=0.9), dict(temperature=0.7, top_k=20, top_p=0.5), dict(temperature=0)])
def test_probs_are_distributions(kwargs):
    p = probs_from_logits(random_logits(4, 7, 50), **kwargs)
    assert p.shape == (4, 7, 50) and p.dtype == torch.float32
    assert (p >= 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(4, 7), atol=1e-6, rtol=0)


def test_temperature_zero_is_one_hot_at_the_argmax():
    logits = random_logits(6, 30, seed=1)
    p = probs_from_logits(logits, temperature=0)
    assert torch.equal(p.argmax(-1), logits.argmax(-1))
    assert torch.equal(p.sum(-1), torch.ones(6)) and torch.equal(p.max(-1).values, torch.ones(6))
    # top-k / top-p do not change greedy decoding
    assert torch.equal(probs_from_logits(logits, 0, top_k=3, top_p=0.2), p)
    assert SamplingConfig(0).greedy and not SamplingConfig(0.5).greedy


@pytest.mark.parametrize("t", [0.25, 1.0, 3.0])
def test_temperature_scaling(t):
    logits = random_logits(3, 40, seed=2)
    torch.testing.assert_close(probs_from_logits(logits, t), torch.softmax(logits / t, -1), atol=1e-7, rtol=1e-5)


def test_low_temperature_approaches_greedy_and_high_approaches_uniform():
    logits = random_logits(40, seed=3)
    assert probs_from_logits(logits, 0.01).max() > 0.99
    torch.testing.assert_close(probs_from_logits(logits, 1e4), torch.full((40,), 1 / 40), atol=1e-3, rtol=0)


@pytest.mark.parametrize("k", [1, 2, 7, 49, 50, 80])
def test_top_k_keeps_exactly_k_and_renormalises(k):
    logits = random_logits(5, 50, seed=4)         # distinct logits
    p = probs_from_logits(logits, 1.0, top_k=k)
    kept = p > 0
    assert (kept.sum(-1) == min(k, 50)).all()
    top = torch.topk(logits, min(k, 50), dim=-1).indices
    assert torch.equal(kept, torch.zeros_like(kept).scatter(-1, top, True))
    # renormalised: the kept tokens keep their relative odds
    full = torch.softmax(logits, -1)
    want = torch.where(kept, full, 0) / torch.where(kept, full, 0).sum(-1, keepdim=True)
    torch.testing.assert_close(p, want, atol=1e-6, rtol=1e-5)


def test_top_p_handcrafted():
    probs = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])  # sorted: 0.4, 0.3, 0.15, 0.1, 0.05
    logits = probs.log()
    # p=0.5: 0.4 alone is not enough, 0.4 + 0.3 = 0.7 is -> tokens 1 and 3
    torch.testing.assert_close(probs_from_logits(logits, top_p=0.5), torch.tensor([0, 4 / 7, 0, 3 / 7, 0]))
    # p=0.7 is reached by the same two tokens (exactly, up to rounding): nothing more is added
    assert (probs_from_logits(logits, top_p=0.7) > 0).tolist() == [False, True, False, True, False]
    torch.testing.assert_close(probs_from_logits(logits, top_p=0.8), torch.tensor([0, 0.4, 0, 0.3, 0.15]) / 0.85)
    assert (probs_from_logits(logits, top_p=0.3) > 0).tolist() == [False, True, False, False, False]
    torch.testing.assert_close(probs_from_logits(logits, top_p=1.0), probs)


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.99])
def test_top_p_keeps_the_smallest_sufficient_prefix(top_p):
    logits = random_logits(200, 64, seed=5, scale=2.0)
    full = torch.softmax(logits, -1)
    p = probs_from_logits(logits, top_p=top_p)
    for row_full, row in zip(full, p):
        kept = row > 0
        assert float(row_full[kept].sum()) >= top_p - 1e-6, "kept mass must reach top_p"
        # the kept tokens are the most likely ones ...
        if (~kept).any():
            assert float(row_full[kept].min()) >= float(row_full[~kept].max())
        # ... and the set is minimal: without its least likely member the mass falls below top_p
        smallest = row_full[kept].min()
        assert float(row_full[kept].sum() - smallest) < top_p
        torch.testing.assert_close(row[kept], row_full[kept] / row_full[kept].sum(), atol=1e-6, rtol=1e-5)


def test_top_k_then_top_p():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, -1.0]).log_softmax(-1)  # an already normalised example
    p = probs_from_logits(logits, 1.0, top_k=4, top_p=0.8)
    # top-k first: the 4 best renormalised; top-p then applies to those renormalised probabilities
    after_k = torch.softmax(torch.tensor([4.0, 3.0, 2.0, 1.0]), -1)
    n_keep = int((after_k.cumsum(0) - after_k < 0.8).sum())
    want = torch.zeros(6)
    want[:n_keep] = after_k[:n_keep] / after_k[:n_keep].sum()
    torch.testing.assert_close(p, want)
    assert n_keep == 2
    cfg = SamplingConfig(1.0, top_k=4, top_p=0.8)
    torch.testing.assert_close(cfg.probs(logits), p)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(temperature=-0.1), "temperature must be >= 0"),
    (dict(top_k=0), "top_k must be a positive integer"),
    (dict(top_k=-3), "top_k must be a positive integer"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
])
def test_invalid_arguments(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        probs_from_logits(torch.zeros(5), **kwargs)
    with pytest.raises(ValueError, match=fragment):
        SamplingConfig(**{"temperature": 1.0, **kwargs})


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def tv_bound(n: int, v: int, delta: float = 1e-4) -> float:
    """A total-variation distance that n draws from a v-outcome distribution exceed with probability < delta.

    E[TV] <= 1/2 sum_i sqrt(p_i / n) <= 1/2 sqrt(v / n) (Cauchy-Schwarz), and TV moves by at most 1/n when one
    draw changes, so McDiarmid's inequality adds sqrt(ln(1/delta) / (2 n))."""
    return 0.5 * math.sqrt(v / n) + math.sqrt(math.log(1 / delta) / (2 * n))


def test_sample_draws_from_the_distribution():
    p = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03])
    n = 20_000
    g = make_generator(0)
    counts = torch.bincount(torch.tensor([sample(p, g) for _ in range(n)]), minlength=5).float()
    bound = tv_bound(n, 5)
    assert tv(counts / n, p) < bound
    # the test has the power to notice a wrong sampler: a distribution this far off fails it
    shifted = torch.tensor([0.45, 0.3, 0.15, 0.07, 0.03])
    assert tv(counts / n, shifted) > bound
    assert sample(torch.tensor([0.0, 0.0, 1.0]), g) == 2


def test_sample_is_reproducible_with_a_seed():
    p = torch.softmax(random_logits(100, seed=6), -1)
    def draws(seed):
        g = make_generator(seed)
        return [sample(p, g) for _ in range(20)]
    assert draws(7) == draws(7)
    assert draws(1) != draws(2)
