"""Decoders: the KV cache changes nothing, greedy speculative decoding reproduces the target exactly, sampled
speculative decoding has exactly the target's distribution, and the statistics add up."""
from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import torch

from conftest import perturbed_copy, prompts_from, random_model
from minigpt.decoding import (DecodeStats, accept_greedy, accept_sampled, generate, generate_no_cache,
                              residual_distribution, speculative_generate)
from minigpt.sampling import make_generator, probs_from_logits

GAMMAS = (1, 2, 4, 7)
MODES = ({}, {"adaptive": True, "gamma_max": 9}, {"confidence_stop": 0.5})


def check_stats(stats: DecodeStats, out: list[int], gamma: int, mode: dict, eos_hit: bool) -> None:
    assert stats.new_tokens == len(out)
    assert stats.prefills == 1
    assert 0 <= stats.accepted <= stats.tested <= stats.proposed == sum(stats.gammas)
    assert stats.tested - stats.accepted <= stats.rounds       # at most one rejection per round
    assert stats.draft_passes == stats.proposed            # a chain draft runs once per drafted token
    assert stats.target_passes == stats.rounds == len(stats.gammas)
    assert max(stats.gammas) <= (mode.get("gamma_max", gamma) if mode.get("adaptive") else gamma)
    # each round emits its accepted drafts plus one target token; only an end-of-sequence cuts that short
    if eos_hit:
        assert stats.accepted + stats.rounds >= stats.new_tokens
    else:
        assert stats.accepted + stats.rounds == stats.new_tokens
    assert stats.tokens_per_target_pass == stats.new_tokens / stats.target_passes
    if stats.tested:
        assert 0 <= stats.acceptance_rate <= 1


# ----- plain decoding -----

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cache_equals_no_cache_on_random_models(seed):
    model = random_model(seed)
    rng = random.Random(seed)
    for _ in range(3):
        prompt = [rng.randrange(97) for _ in range(rng.randint(1, 20))]
        n = rng.randint(1, 64 - len(prompt))
        assert generate(model, prompt, n) == generate_no_cache(model, prompt, n)


def test_cache_equals_no_cache_on_the_target(target, tokenizer, val_texts):
    for prompt in prompts_from(val_texts, tokenizer, 3, seed=0):
        stats = DecodeStats()
        out = generate(target, prompt, 24, stats=stats)
        assert out == generate_no_cache(target, prompt, 24)
        assert stats.target_passes == stats.new_tokens == 24 and stats.tokens_per_target_pass == 1
        assert stats.rounds == 0 and stats.proposed == 0


# ----- greedy speculative decoding is exactly the target's greedy decoding -----

def test_speculative_greedy_equals_plain_on_random_models():
    """36 random prompts and lengths, every gamma, with and without adaptive gamma and early-stopped drafting,
    with a draft close to the target (high acceptance) and an unrelated smaller one (low acceptance)."""
    target = random_model(10)
    drafts = [perturbed_copy(target, noise=0.06, seed=1), random_model(11, n_layer=1, n_head=2, n_embd=16)]
    rng = random.Random(0)
    total = Counter()
    for i in range(36):
        prompt = [rng.randrange(97) for _ in range(rng.randint(1, 24))]
        n = rng.choice([1, 2, rng.randint(3, 64 - len(prompt))])
        want = generate(target, prompt, n)
        eos = want[n // 2] if i % 6 == 5 else None       # sometimes stop at an end-of-sequence token
        if eos is not None:
            want = want[:want.index(eos) + 1]
        draft = drafts[i % 2]
        for j, gamma in enumerate(GAMMAS):
            mode = MODES[(i + j) % len(MODES)]
            out, stats = speculative_generate(target, draft, prompt, n, gamma=gamma, eos_id=eos, **mode)
            assert out == want, f"prompt {i}, gamma {gamma}, {mode}"
            check_stats(stats, out, gamma, mode, eos_hit=eos is not None)
            total["accepted" if i % 2 == 0 else "accepted_far"] += stats.accepted
            total["tested" if i % 2 == 0 else "tested_far"] += stats.tested
    # both regimes really occurred: many drafts accepted by the close draft, many rejected by the far one
    assert total["accepted"] > 0.5 * total["tested"]
    assert total["accepted_far"] < 0.2 * total["tested_far"]


def test_a_perfect_draft_is_always_accepted():
    target = random_model(12)
    want = generate(target, [1, 2, 3], 40)
    out, stats = speculative_generate(target, target, [1, 2, 3], 40, gamma=4)
    assert out == want
    assert stats.accepted == stats.tested == stats.proposed > 0
    assert stats.rounds == math.ceil(40 / 5) and stats.tokens_per_target_pass == 5


def test_adaptive_gamma_and_confidence_stop_follow_their_rules():
    target = random_model(13)
    want = generate(target, [4, 5], 40)
    # every draft accepted: gamma grows by 2 per round up to gamma_max, and the last round is cut to fit
    out, stats = speculative_generate(target, target, [4, 5], 40, gamma=2, adaptive=True, gamma_max=7)
    expected, done, gamma = [], 0, 2
    while done < 40:
        g = min(gamma, 40 - done - 1)
        expected.append(g)
        done += g + 1
        gamma = min(gamma + 2, 7) if g else gamma
    assert out == want and stats.gammas == expected == [2, 4, 6, 7, 7, 7, 0]
    # a draft that always rejects: gamma shrinks by 1 per round, down to 1
    other = random_model(14, n_layer=1, n_head=2, n_embd=16)
    out, stats = speculative_generate(target, other, [4, 5], 40, gamma=5, adaptive=True)
    assert out == want
    assert stats.gammas[0] == 5 and min(stats.gammas[:-1]) == 1
    for before, after in zip(stats.gammas, stats.gammas[1:-1]):
        assert after in (max(1, before - 1), min(before + 2, 16))
    # no probability reaches 1.01, so with confidence_stop=1.01 each round drafts exactly one token
    out, stats = speculative_generate(target, target, [4, 5], 40, gamma=6, confidence_stop=1.01)
    assert out == want and stats.gammas == [1] * 20 and stats.draft_passes == 20


def test_speculative_greedy_equals_plain_on_the_shipped_pair(target, draft, tokenizer, val_texts):
    for i, prompt in enumerate(prompts_from(val_texts, tokenizer, 4, seed=1)):
        n = 24
        want = generate(target, prompt, n)
        for j, gamma in enumerate(GAMMAS):
            mode = MODES[(i + j) % len(MODES)]
            out, stats = speculative_generate(target, draft, prompt, n, gamma=gamma, **mode)
            assert out == want, f"prompt {i}, gamma {gamma}, {mode}"
            check_stats(stats, out, gamma, mode, eos_hit=False)


def test_speculative_argument_errors(small_model):
    with pytest.raises(ValueError, match="gamma must be at least 1"):
        speculative_generate(small_model, small_model, [1], 5, gamma=0)
    with pytest.raises(ValueError, match="vocabularies differ"):
        speculative_generate(small_model, random_model(1, vocab_size=50), [1], 5)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        speculative_generate(small_model, random_model(1, block_size=32), [1] * 20, 20)


# ----- the acceptance rules -----

def test_accept_greedy():
    assert accept_greedy([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]    # all accepted + bonus
    assert accept_greedy([5, 6, 7], [5, 9, 7, 8]) == [5, 9]          # first mismatch replaced, rest dropped
    assert accept_greedy([5], [4, 1]) == [4]
    assert accept_greedy([], [3]) == [3]
    with pytest.raises(ValueError, match="need 3 target choices for 2 drafted tokens"):
        accept_greedy([1, 2], [1, 2])


def test_residual_distribution():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.4, 0.2, 0.2])
    torch.testing.assert_close(residual_distribution(p, q), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(residual_distribution(p, p), p)      # nothing left over: fall back to p


def test_accept_sampled_shapes():
    p, q = torch.full((3, 5), 0.2), torch.full((2, 5), 0.2)
    with pytest.raises(ValueError, match="expected q of shape"):
        accept_sampled([1, 2], q, p[:2])
    out = accept_sampled([1, 2], q, p, make_generator(0))      # p == q: every draft accepted, plus a bonus
    assert out[:2] == [1, 2] and len(out) == 3


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def tv_bound(n: int, v: int, delta: float = 1e-4) -> float:
    """A total-variation distance that the empirical distribution of n draws from a v-outcome distribution
    exceeds with probability < delta: E[TV] <= 1/2 sqrt(v / n) (Cauchy-Schwarz), plus McDiarmid's
    sqrt(ln(1/delta) / (2n)) since one draw moves TV by at most 1/n."""
    return 0.5 * math.sqrt(v / n) + math.sqrt(math.log(1 / delta) / (2 * n))


# target p and draft q at two drafted positions plus the bonus position, over a 6-token vocabulary
P = torch.tensor([[0.40, 0.25, 0.15, 0.10, 0.06, 0.04],
                  [0.10, 0.10, 0.50, 0.10, 0.10, 0.10],
                  [0.30, 0.20, 0.10, 0.10, 0.20, 0.10]])
Q = torch.tensor([[0.10, 0.15, 0.35, 0.05, 0.30, 0.05],
                  [0.20, 0.20, 0.20, 0.20, 0.10, 0.10]])


def emitted_distributions(rule, n: int, seed: int = 0) -> tuple[list[torch.Tensor], list[int], float]:
    """Draw two drafts from Q and run ``rule`` (accept_sampled's signature) n times.

    Returns, for each output position k = 0, 1, 2, the empirical distribution of the k-th emitted token over
    the rounds that emitted it and how many did, plus the fraction of rounds whose first draft was accepted.
    A correct rule emits position k with exactly the distribution P[k]: position 0 always, position 1 when
    the first draft was accepted (the second draft or its replacement), position 2 (the bonus) when both were."""
    g = make_generator(seed)
    drafts = torch.stack([torch.multinomial(Q[i], n, replacement=True, generator=g) for i in range(2)], 1)
    counts = torch.zeros(3, 6)
    for x in drafts.tolist():
        for k, y in enumerate(rule(x, Q, P, g)):
            counts[k, y] += 1
    totals = counts.sum(1)
    return [counts[k] / max(1.0, float(totals[k])) for k in range(3)], totals.int().tolist(), float(totals[1]) / n


def distances(rule, n: int, seed: int = 0) -> list[tuple[float, float]]:
    """(TV from P[k], tv_bound for the number of rounds that emitted position k) for k = 0, 1, 2."""
    dists, totals, _ = emitted_distributions(rule, n, seed)
    return [(tv(dists[k], P[k]), tv_bound(totals[k], 6)) for k in range(3)]


# Wrong rules a learner might write, each differing from accept_sampled in one place.
def replacement_from_p(draft_tokens, q, p, g):
    """Bug: after a rejection, resample from p instead of the residual max(0, p - q)."""
    for i, x in enumerate(draft_tokens):
        if float(torch.rand((), generator=g)) >= min(1.0, float(p[i, x] / q[i, x])):
            return draft_tokens[:i] + [int(torch.multinomial(p[i], 1, generator=g))]
    return list(draft_tokens) + [int(torch.multinomial(p[-1], 1, generator=g))]


def accept_with_p_only(draft_tokens, q, p, g):
    """Bug: accept x with probability p(x), forgetting to divide by q(x)."""
    for i, x in enumerate(draft_tokens):
        if float(torch.rand((), generator=g)) >= float(p[i, x]):
            return draft_tokens[:i] + [int(torch.multinomial(residual_distribution(p[i], q[i]), 1, generator=g))]
    return list(draft_tokens) + [int(torch.multinomial(p[-1], 1, generator=g))]


def residual_without_max(draft_tokens, q, p, g):
    """Bug: residual |p - q| instead of max(0, p - q)."""
    for i, x in enumerate(draft_tokens):
        if float(torch.rand((), generator=g)) >= min(1.0, float(p[i, x] / q[i, x])):
            r = (p[i] - q[i]).abs()
            return draft_tokens[:i] + [int(torch.multinomial(r / r.sum(), 1, generator=g))]
    return list(draft_tokens) + [int(torch.multinomial(p[-1], 1, generator=g))]


def bonus_from_the_wrong_row(draft_tokens, q, p, g):
    """Bug: the bonus token drawn from p at the last drafted position instead of the one after it."""
    out = accept_sampled(draft_tokens, q, p, g)
    if len(out) == len(draft_tokens) + 1:
        out[-1] = int(torch.multinomial(p[len(draft_tokens) - 1], 1, generator=g))
    return out


def test_accept_sampled_reproduces_the_target_distribution():
    """The key exactness test: tokens drafted from q and passed through accept_sampled come out distributed
    exactly as p at every position. 40,000 rounds keep the sampling noise of the first position below
    tv_bound (0.017) with probability 1 - 1e-4; the later positions, emitted less often, get wider bounds."""
    n = 40_000
    dists, totals, acc = emitted_distributions(accept_sampled, n)
    for k in range(3):
        assert tv(dists[k], P[k]) < tv_bound(totals[k], 6), f"position {k}: TV {tv(dists[k], P[k]):.4f}"
    # the first draft is accepted with probability alpha = sum_x min(p(x), q(x)) (0.55 here)
    alpha = float(torch.minimum(P[0], Q[0]).sum())
    assert abs(acc - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / n)


@pytest.mark.parametrize("rule", [replacement_from_p, accept_with_p_only, residual_without_max,
                                  bonus_from_the_wrong_row])
def test_the_exactness_test_catches_wrong_rules(rule):
    """The same measurement on a quarter of the draws (so its bounds are looser: 0.034 at the first position)
    rejects each wrong rule. Exactly computed, the first three are at TV 0.125 (replacement from p), 0.20
    (accept with p only) and 0.225 (|p - q| residual) from P[0]; the wrong bonus row is at TV 0.4 from P[2]."""
    result = distances(rule, 10_000, seed=1)
    assert any(d > bound for d, bound in result), f"{rule.__name__} passed: {result}"


# ----- sampled speculative decoding on the shipped pair -----

@torch.no_grad()
def exact_two_token_distribution(model, prompt: list[int], **sampling) -> dict[tuple[int, int], float]:
    """P(first two generated tokens) under ``model`` with the given sampling settings, computed exactly."""
    logits = model(torch.tensor([prompt], device=model.device))[0, -1]
    p1 = probs_from_logits(logits, **sampling)
    joint = {}
    for a in p1.nonzero().flatten().tolist():
        p2 = probs_from_logits(model(torch.tensor([prompt + [a]], device=model.device))[0, -1], **sampling)
        for b in p2.nonzero().flatten().tolist():
            joint[(a, b)] = float(p1[a] * p2[b])
    return joint


@pytest.mark.slow
def test_speculative_sampling_matches_the_target_on_the_shipped_pair(target, draft, tokenizer):
    """Sampled speculative decoding must draw the first two tokens from the target's own distribution.

    With top_k=3 the joint distribution of two tokens has at most 9 outcomes, which we compute exactly from the
    target. N seeded runs of speculative_generate (and, as a control, of generate) give empirical
    distributions; a correct sampler lands within tv_bound(N, 9) of the truth (0.116 for N=1000, 0.18 for the
    control's N=400) except with probability 1e-4. A one-token prompt keeps each run to two or three model
    passes. For scale, the draft's own joint distribution is printed: a decoder that returned the draft's
    samples would be off by that much."""
    prompt = tokenizer.encode("def")
    settings = dict(temperature=1.0, top_k=3)
    truth = exact_two_token_distribution(target, prompt, **settings)
    outcomes = sorted(truth)
    p = torch.tensor([truth[o] for o in outcomes])
    assert abs(float(p.sum()) - 1) < 1e-5

    def empirical(fn, n):
        counts = Counter(tuple(fn(seed)) for seed in range(n))
        assert set(counts) <= set(outcomes), "a token outside the top-3 support was generated"
        return torch.tensor([counts[o] / n for o in outcomes])

    n_spec, n_plain = 1000, 400
    spec = empirical(lambda s: speculative_generate(target, draft, prompt, 2, gamma=2, seed=s, **settings)[0], n_spec)
    plain = empirical(lambda s: generate(target, prompt, 2, seed=s, **settings), n_plain)
    draft_truth = exact_two_token_distribution(draft, prompt, **settings)
    d = torch.tensor([draft_truth.get(o, 0.0) for o in outcomes])
    d_outside = 1 - float(d.sum())          # the draft's mass on pairs the target never produces
    print(f"TV(speculative, target) = {tv(spec, p):.4f} (bound {tv_bound(n_spec, len(outcomes)):.4f}), "
          f"TV(plain, target) = {tv(plain, p):.4f} (bound {tv_bound(n_plain, len(outcomes)):.4f}), "
          f"TV(draft, target) = {tv(d, p) + d_outside / 2:.4f}")
    assert tv(spec, p) < tv_bound(n_spec, len(outcomes))
    assert tv(plain, p) < tv_bound(n_plain, len(outcomes))
