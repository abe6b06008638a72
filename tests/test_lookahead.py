"""Lookahead decoding: the window's mask gives every guess a complete context, the n-gram pool keeps what the
trajectories showed, and the whole method is exact (greedy identical, sampled within the TV bound)."""
from __future__ import annotations

import random

import pytest

from conftest import first_two_joint, pair_frequencies, random_model
from minigpt import bench
from minigpt.decoding import decode, generate
from minigpt.decoding.lookahead import (Lookahead, NgramPool, lookahead_generate, merge_continuations,
                                        window_depths, window_mask)
from minigpt.exactness import tv_bound, tv_distance
from minigpt.sampling import sample


@pytest.mark.parametrize("rows, window", [(1, 4), (3, 5), (2, 1)])
def test_every_window_node_sees_one_token_at_each_earlier_depth(rows, window):
    mask, depth = window_mask(rows, window), window_depths(rows, window)
    for i in range(rows * window):
        seen = sorted(depth[j] for j in mask[i].nonzero().flatten().tolist())
        assert seen == list(range(1, depth[i] + 1)), f"node {i}"  # a full context: the root, then 1 .. depth


def test_the_last_row_of_a_column_sees_the_column_and_row_zero_before_it():
    mask = window_mask(3, 4)  # node (r, k) is r * 4 + k
    assert mask[2 * 4 + 1].nonzero().flatten().tolist() == [0, 1, 5, 9]  # (0,0) (0,1) (1,1) (2,1)


def test_the_pool_keeps_the_most_recent_continuations_first():
    pool = NgramPool(per_key=2)
    pool.add([1, 2, 3])
    pool.add([1, 4, 5])
    pool.add([1, 2, 3])   # seen again: to the front
    pool.add([7, 8, 9])
    assert pool.get(1) == [(2, 3), (4, 5)]
    pool.add([1, 6, 6])   # a third continuation pushes the oldest out
    assert pool.get(1) == [(6, 6), (2, 3)] and pool.get(7) == [(8, 9)] and pool.get(42) == [] and len(pool) == 3


def test_merged_continuations_share_their_prefixes():
    tokens, parents = merge_continuations(9, [(1, 2), (1, 3), (4,)])
    assert tokens == [9, 1, 2, 3, 4] and parents == [-1, 0, 1, 1, 0]


def test_lookahead_is_greedy_exact_on_random_models():
    rng = random.Random(0)
    for seed in range(3):
        model = random_model(seed)
        for _ in range(4):
            prompt = [rng.randrange(97) for _ in range(rng.randint(1, 12))]
            for settings in (dict(window=4, ngram=3, candidates=3), dict(window=2, ngram=2, candidates=1)):
                assert lookahead_generate(model, prompt, 30, **settings)[0] == generate(model, prompt, 30)


def test_lookahead_uses_its_pool_on_repetitive_text(target, tokenizer):
    prompt = tokenizer.encode_ordinary("for i in range(10):\n    print(i)\n" * 6)
    ids, stats = lookahead_generate(target, prompt, 48, window=5, ngram=4, candidates=5)
    assert ids == generate(target, prompt, 48)
    assert stats.accepted > 0 and stats.tokens_per_target_pass > 1  # pool n-grams were verified and accepted


def test_the_window_stops_at_the_end_of_the_context():
    model = random_model(1, block_size=64)
    prompt = list(range(1, 50))
    assert lookahead_generate(model, prompt, 15, window=5, ngram=4)[0] == generate(model, prompt, 15)


def test_bad_settings_fail_in_one_line():
    with pytest.raises(ValueError, match="window >= 1"):
        Lookahead(window=0)


class CountingLookahead(Lookahead):
    """Lookahead that counts the rounds in which the pool offered candidates."""
    rounds_with_candidates = 0

    def propose(self, session, room):
        proposal = super().propose(session, room)
        CountingLookahead.rounds_with_candidates += len(proposal.tokens) > 1
        return proposal


@pytest.mark.slow
def test_lookahead_samples_exactly():
    """The first two sampled tokens (6 x 6 outcomes, 3000 samples) within the TV bound of the exact joint.
    Three tokens are decoded, so that the second round has room for a candidate: the first pass's window (its
    first guesses are the prompt's first six tokens, every token of the vocabulary) leaves an n-gram for every
    possible first token in the pool; the test checks that pool candidates were really verified in most runs."""
    model = random_model(8, vocab_size=6)
    prompt, n = [0, 1, 2, 3, 4, 5, 0, 1], 3000
    exact = first_two_joint(model, prompt, 1.0)
    CountingLookahead.rounds_with_candidates = 0
    freq = pair_frequencies(lambda seed: decode(model, prompt, 3, CountingLookahead(window=6, ngram=2, candidates=3),
                                                temperature=1.0, seed=seed)[0], 6, n)
    d, bound = tv_distance(freq, exact), tv_bound(n, exact.numel(), delta=1e-4)
    assert CountingLookahead.rounds_with_candidates > n / 2, CountingLookahead.rounds_with_candidates
    assert d < bound, f"TV {d:.4f} >= bound {bound:.4f}"
    # the same measurement catches a rule that accepts every candidate (it measured TV 0.63 when written)
    biased = pair_frequencies(lambda seed: decode(model, prompt, 3, Lookahead(window=6, ngram=2, candidates=3),
                                                  temperature=1.0, seed=seed, rule=_accept_first_candidate)[0], 6, n)
    assert tv_distance(biased, exact) > bound


def _accept_first_candidate(sampling, generator):
    def rule(proposal, logits):
        p = sampling.probs(logits)
        if len(proposal.tokens) > 1:
            return [1], sample(p[1], generator)
        return [], sample(p[0], generator)
    return rule
