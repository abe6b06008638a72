"""EAGLE: the head reads the right feature and token, the dynamic tree is exact, and a frequency-subset read-out
proposes only its tokens and stays exact."""
from __future__ import annotations

import random

import pytest
import torch

from conftest import first_two_joint, pair_frequencies, prompts_from, random_model
from minigpt import bench
from minigpt.decoding import decode, generate
from minigpt.decoding.eagle import Eagle, eagle_generate
from minigpt.eagle_head import EagleHead, frequency_subset, load_eagle, save_eagle
from minigpt.exactness import tv_bound, tv_distance
from minigpt.training.train_eagle import eagle_loss


class SpyHead(EagleHead):
    """Records every (features, tokens) the head is fed."""

    def __init__(self, target):
        super().__init__(target)
        self.calls = []

    def forward(self, features, tokens, cache=None, position_ids=None, attn_mask=None):
        self.calls.append((features.detach().clone(), tokens.clone()))
        return super().forward(features, tokens, cache, position_ids, attn_mask)


def test_the_decoder_feeds_the_head_f_t_with_x_t_plus_1():
    target = random_model(2)
    head = SpyHead(target).eval()
    prompt = [5, 9, 2, 7, 1, 8]
    ids, _ = eagle_generate(target, head, prompt, 12, depth=3, top_k=2, total_tokens=5)
    seq = prompt + ids
    with torch.no_grad():
        truth = target.hidden_states(torch.tensor([seq]))[0]  # f_t for every position t
    # the catch-up calls (no attn_mask needed beyond causal) cover positions 0, 1, ... in order
    fed = 0
    for features, tokens in head.calls:
        n = features.shape[1]
        if fed + n <= len(seq) - 1 and torch.allclose(features[0], truth[fed:fed + n], atol=1e-5):
            assert tokens[0].tolist() == seq[fed + 1:fed + 1 + n]  # token t + 1 beside feature t
            fed += n
    assert fed >= len(prompt) - 1 + 4  # the prompt and several rounds of real features were fed


def test_the_training_loss_pairs_f_t_and_x_t_plus_1_with_f_t_plus_1():
    target = random_model(3)
    head = SpyHead(target)
    x = torch.randint(97, (2, 10))
    with torch.no_grad():
        f = target.hidden_states(x)
    eagle_loss(head, f, x)
    features, tokens = head.calls[0]
    assert torch.equal(features, f[:, :-1]) and torch.equal(tokens, x[:, 1:])


class OracleHead(EagleHead):
    """Knows the target's greedy continuation: an entry at position t that holds the true f_t (or its own
    prediction of it) and x_{t+1} gets SHARP * f_{t+1} -- the target's logits, sharpened, so that the greedy
    path is also the most probable one; anything else (a wrong feature, token or position) gets zeros."""
    SHARP = 20.0

    def __init__(self, target, seq):
        super().__init__(target)
        with torch.no_grad():
            self.truth = target.hidden_states(torch.tensor([seq]))[0]
        self.seq = seq

    def forward(self, features, tokens, cache=None, position_ids=None, attn_mask=None):
        past = cache.length if cache is not None else 0
        positions = range(past, past + features.shape[1]) if position_ids is None else position_ids.tolist()
        out = torch.zeros_like(features)
        for j, t in enumerate(positions):
            right_feature = any(torch.allclose(features[0, j], s * self.truth[t], atol=1e-3) for s in (1, self.SHARP))
            if t + 1 < len(self.seq) and int(tokens[0, j]) == self.seq[t + 1] and right_feature:
                out[0, j] = self.SHARP * self.truth[t + 1]
        super().forward(features, tokens, cache, position_ids, attn_mask)  # the cache's bookkeeping
        return out


def test_a_perfect_head_is_accepted_to_full_depth():
    target = random_model(4)
    prompt = [3, 1, 4, 1, 5]
    greedy = generate(target, prompt, 30)
    head = OracleHead(target, prompt + greedy).eval()
    for top_k, total in ((1, 4), (3, 12)):  # a chain, and a tree whose frontiers hold several nodes
        ids, stats = eagle_generate(target, head, prompt, 30, depth=4, top_k=top_k, total_tokens=total)
        assert ids == greedy
        assert stats.rounds == 6 and stats.accepted == 24  # every round accepts its 4-deep path: 5 tokens


@pytest.mark.parametrize("seed", [0, 1])
def test_eagle_is_greedy_exact_on_random_models_and_heads(seed):
    target = random_model(seed)
    head = EagleHead(target).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    rng = random.Random(seed)
    for _ in range(4):
        prompt = [rng.randrange(97) for _ in range(rng.randint(1, 10))]
        for settings in (dict(depth=1, top_k=1, total_tokens=1), dict(depth=5, top_k=3, total_tokens=10)):
            assert eagle_generate(target, head, prompt, 25, **settings)[0] == generate(target, prompt, 25)


def test_eagle_with_the_shipped_head_is_greedy_exact(target, tokenizer, val_texts):
    try:
        head = load_eagle(target)
    except Exception:
        pytest.skip("no EAGLE head shipped for the target")
    prompts = prompts_from(val_texts, tokenizer, 8, seed=1, lengths=(4, 80), window=2000, min_text=3000)
    for i, prompt in enumerate(prompts):
        ids, stats = eagle_generate(target, head, prompt, 48)
        assert ids == generate(target, prompt, 48), f"prompt {i}"


def _pairs(target, head, prompt, n, **settings):
    return pair_frequencies(lambda seed: eagle_generate(target, head, prompt, 2, temperature=1.0, seed=seed,
                                                        **settings)[0], target.config.vocab_size, n)


@pytest.mark.slow
def test_eagle_samples_exactly_with_and_without_a_vocabulary_subset():
    """First two sampled tokens (6 x 6 outcomes, 3000 samples each) within the TV bound of the exact joint."""
    target = random_model(7, vocab_size=6)
    prompt, n = [2, 5, 1], 3000
    exact = first_two_joint(target, prompt, 1.0)
    bound = tv_bound(n, exact.numel(), delta=1e-4)
    full = EagleHead(target).eval()
    sub = EagleHead(target, vocab_subset=torch.tensor([4, 0, 3])).eval()
    sub.load_state_dict(full.state_dict())
    for head in (full, sub):
        d = tv_distance(_pairs(target, head, prompt, n, depth=2, top_k=2, total_tokens=3), exact)
        assert d < bound, f"TV {d:.4f} >= bound {bound:.4f}"


def test_a_frequency_subset_proposes_only_its_tokens():
    target = random_model(5)
    subset = frequency_subset(torch.arange(97.0), 20)  # the 20 "most frequent": ids 96 .. 77
    assert subset.tolist() == list(range(96, 76, -1))
    head = EagleHead(target, vocab_subset=subset).eval()
    proposed = []

    class Recording(Eagle):
        def propose(self, session, room):
            p = super().propose(session, room)
            proposed.extend(p.candidates)
            return p

    prompt = [1, 2, 3, 4]
    ids, _ = decode(target, prompt, 20, Recording(head, depth=3, top_k=3, total_tokens=6))
    assert ids == generate(target, prompt, 20)
    assert proposed and set(proposed) <= set(subset.tolist())
    assert head.logits(torch.zeros(2, target.config.n_embd)).shape == (2, 20)


def test_the_subset_read_out_is_the_full_read_out_at_the_subset_and_follows_the_target():
    """The subset's rows are copied once and kept; the logits equal the full read-out's at the subset's ids,
    also after the target's output layer changes in place (the kept copy is made again)."""
    target = random_model(6)
    subset = torch.tensor([5, 90, 3, 41])
    head, full = EagleHead(target, vocab_subset=subset).eval(), EagleHead(target).eval()
    f = torch.randn(3, target.config.n_embd)
    assert torch.equal(head.logits(f), full.logits(f)[:, subset])
    assert head.readout_weight() is head.readout_weight()            # kept, not gathered again
    with torch.no_grad():
        target.lm_head.weight[90].mul_(-2.0)                          # the target's weights change in place
    assert torch.equal(head.logits(f), full.logits(f)[:, subset])


def test_save_and_load_round_trip(tmp_path):
    target = random_model(6)
    head = EagleHead(target, vocab_subset=torch.tensor([1, 5, 7]))
    with torch.no_grad():
        head.fuse.bias.normal_()
    save_eagle(head, tmp_path / "e.pt")
    back = load_eagle(target, tmp_path / "e.pt")
    assert torch.equal(back.fuse.bias, head.fuse.bias) and back.vocab_subset.tolist() == [1, 5, 7]
    with pytest.raises(Exception, match="not this target"):
        load_eagle(random_model(6, n_embd=48), tmp_path / "e.pt")


def test_the_bench_races_eagle_exactly():
    target = random_model(9)
    models = bench.Models(target, eagle_head=EagleHead(target).eval())
    prompts = [[1, 2, 3, 4, 5, 6], [9, 8, 7]]
    records = bench.run_bench(["eagle"], models=models, prompts=prompts, max_new_tokens=10, repeats=1)
    assert [r["method"] for r in records] == ["plain", "eagle"] and all(r["identical_to_plain_greedy"] for r in records)
    assert records[1]["draft_passes"] > 0


@pytest.mark.parametrize("trainer", ["eagle", "medusa"])
def test_training_a_head_gives_the_target_back_as_it_came(trainer):
    """The target is frozen while its head trains, and afterwards trainable and in train mode again if it was:
    its weights unchanged either way."""
    import numpy as np
    from minigpt.medusa_heads import MedusaHeads
    from minigpt.training.train_eagle import train_eagle
    from minigpt.training.train_heads import train_heads
    target = random_model(2).train()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    if trainer == "eagle":
        batches = lambda g: (torch.randint(0, 97, (2, 16), generator=g), None)  # noqa: E731
        train_eagle(target, EagleHead(target), minutes=1, batches=batches, max_steps=2, progress=False)
    else:
        data = np.random.default_rng(0).integers(0, 97, 4000)
        train_heads(target, MedusaHeads.for_target(target, 2), minutes=0.005, batch_size=2, block_size=16,
                    data=data, progress=False)
    assert target.training and all(p.requires_grad for p in target.parameters())
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())


class RecordingEagle(Eagle):
    """An Eagle proposer that keeps every round's tree (tokens, parents)."""

    def start(self, session):
        super().start(session)
        self.seen = []

    def propose(self, session, room):
        proposal = super().propose(session, room)
        self.seen.append((proposal.tokens, proposal.parents))
        return proposal


def test_stopping_early_verifies_the_same_trees_with_fewer_head_passes(target, tokenizer, val_texts):
    try:
        head = load_eagle(target)
    except Exception:
        pytest.skip("no EAGLE head shipped for the target")
    saved = 0
    for prompt in prompts_from(val_texts, tokenizer, 6, seed=2, lengths=(8, 80), window=2000, min_text=3000):
        runs = []
        for stop_early in (True, False):
            proposer = RecordingEagle(head, depth=6, top_k=4, total_tokens=8, stop_early=stop_early)
            ids, stats = decode(target, prompt, 40, proposer)
            runs.append((ids, proposer.seen, stats.draft_passes))
        (ids, trees, passes), (full_ids, full_trees, full_passes) = runs
        assert ids == full_ids == generate(target, prompt, 40)
        assert trees == full_trees  # the same tree verified every round
        assert passes <= full_passes
        saved += full_passes - passes
    assert saved > 0  # and some rounds stopped early
