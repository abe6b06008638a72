"""minigpt.training.eagle_analysis: the measurements Lesson 10 makes on a trained EAGLE head, checked on a tiny
random target and an untrained head (the numbers mean nothing there; the relations between them must hold)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import random_model
from minigpt.decoding import decode, generate
from minigpt.decoding.eagle import Eagle, eagle_generate
from minigpt.eagle_head import EagleHead
from minigpt.medusa_heads import MedusaHeads
from minigpt.training.eagle_analysis import (StaticEagle, TimedEagle, eagle_round, entries_alone, head_agreement,
                                             held_out_windows, input_ablation, path_to, rank_hit_rates,
                                             token_swapped)
from minigpt.training.train_eagle import agreement


@pytest.fixture(scope="module")
def setup():
    target = random_model(5)
    torch.manual_seed(1)
    head = EagleHead(target).eval()
    with torch.no_grad():                       # an untrained head that still reads its token: fuse both halves
        head.fuse.weight.normal_(0.0, 0.1)
    data = np.random.default_rng(0).integers(0, target.config.vocab_size, 400)
    windows = held_out_windows(data, batches=2, batch_size=2, block_size=24)
    return target, head, windows


@torch.no_grad()
def test_agreement_is_eagle_top1s_and_medusa_is_scored_on_the_same_positions(setup):
    target, head, windows = setup
    medusa = MedusaHeads.for_target(target, n_heads=2).eval()
    got = head_agreement(target, head, windows, medusa)
    assert got["eagle"] == pytest.approx(agreement(target, head, [(x, None) for x in windows]))
    assert got["positions"] == sum(x.shape[0] * (x.shape[1] - 1) for x in windows)
    assert 0 <= got["medusa"] <= 1 and -1 <= got["cos_predicted"] <= 1 and -1 <= got["cos_copy"] <= 1


@torch.no_grad()
def test_the_ablations_reduce_to_the_head_when_nothing_is_withheld(setup):
    target, head, windows = setup
    x = windows[0]
    f = target.hidden_states(x)
    feats, toks = f[:, :-1], x[:, 1:]
    assert torch.allclose(token_swapped(head, feats, toks, toks), head(feats, toks), atol=1e-5)
    alone = entries_alone(head, feats, toks)
    assert torch.allclose(alone[:, :1], head(feats[:, :1], toks[:, :1]), atol=1e-5)   # entry 0 has no context anyway
    assert not torch.allclose(alone, head(feats, toks), atol=1e-3)                     # later entries lose theirs


@torch.no_grad()
def test_input_ablation_table_and_split_are_consistent(setup):
    target, head, windows = setup
    medusa = MedusaHeads.for_target(target, n_heads=2).eval()
    ab = input_ablation(target, head, windows, fixed_token=3, medusa_heads=medusa)
    base = head_agreement(target, head, windows, medusa)
    assert ab["table"]["x_(t+1)", "context"] == pytest.approx(base["eagle"])
    for name, key in (("EAGLE head", "eagle"), ("Medusa head 0", "medusa")):
        there, elsewhere = ab["split"][name]
        assert there * ab["own"] + elsewhere * (1 - ab["own"]) == pytest.approx(base[key])
    assert set(ab["table"]) == {(k, c) for k in ("x_(t+1)", "x_t", "fixed") for c in ("context", "alone")}


@torch.no_grad()
def test_rank_hit_rates_start_at_the_agreement(setup):
    target, head, windows = setup
    rates = rank_hit_rates(target, head, windows, max_rank=5)
    assert float(rates[0]) == pytest.approx(head_agreement(target, head, windows)["eagle"])
    assert float(rates.sum()) <= 1 + 1e-6


def test_a_static_chain_of_top_guesses_is_eagles_chain_and_exact(setup):
    target, head, _ = setup
    prompt = [5, 9, 2, 7, 1, 8, 3]
    chain = decode(target, prompt, 16, Eagle(head, depth=3, top_k=1, total_tokens=3))
    static = decode(target, prompt, 16, StaticEagle(head, [(0,), (0, 0), (0, 0, 0)]))
    assert static[0] == chain[0] == generate(target, prompt, 16)
    assert static[1].target_passes == chain[1].target_passes
    wide = decode(target, prompt, 16, StaticEagle(head, [(0,), (1,), (0, 0), (1, 0), (0, 1)]))
    assert wide[0] == chain[0]


def test_a_rounds_path_probabilities_shrink_down_every_path(setup):
    target, head, _ = setup
    prompt = [5, 9, 2, 7, 1, 8, 3]
    proposal, probs, verified = eagle_round(target, head, prompt, 12, depth=4, top_k=3, total_tokens=8)
    assert probs[0] == 1.0 and len(probs) == len(proposal.tokens)
    assert all(0 < probs[i] <= probs[proposal.parents[i]] + 1e-6 for i in range(1, len(probs)))
    kept = sorted(probs[1:], reverse=True)
    assert len(kept) == 8 and verified.tokens == generate(target, prompt, len(verified.tokens))
    assert path_to(0, proposal.parents) == [] and path_to(1, proposal.parents) == [1]


def test_timed_eagle_times_its_drafting_and_changes_nothing(setup):
    target, head, _ = setup
    prompt = [5, 9, 2, 7, 1, 8, 3]
    proposer = TimedEagle(head, depth=3, top_k=2, total_tokens=5)
    out, st = decode(target, prompt, 12, proposer)
    assert out == eagle_generate(target, head, prompt, 12, depth=3, top_k=2, total_tokens=5)[0]
    assert 0 < proposer.seconds < st.wall_time
