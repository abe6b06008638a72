"""Batched decoding on the paged cache (minigpt.decoding.batch): every sequence's output identical to decoding
it alone (greedy), distributed as the target's (sampled), ragged acceptance and stops, prefix sharing, the
continuous-batching scheduler, and no block left behind."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from conftest import perturbed_copy, random_model
from minigpt.decoding import Chain, DraftTree, Lookup, LookupTree, generate, speculative_generate
from minigpt.decoding.batch import (BatchedChain, BatchEngine, PerSequence, Request, decode_batch,
                                    longest_common_prefix, serve)
from minigpt.decoding.plain import Plain
from minigpt.exactness import tv_bound, tv_distance
from minigpt.sampling import SamplingConfig


def ragged_prompts(n: int, seed: int = 0, vocab: int = 97) -> list[list[int]]:
    """Prompts of different lengths, some repetitive (so lookup finds matches and acceptance is ragged)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        base = torch.randint(0, vocab, (3 + i % 5,), generator=g).tolist()
        out.append((base * 4)[: 4 + 3 * i % 17] if i % 2 else torch.randint(0, vocab, (2 + 2 * i,), generator=g).tolist())
    return out


def methods(draft):
    """Proposers as a session takes them: the engine gives each sequence its own copy."""
    return {"plain": Plain(), "lookup": Lookup(2, 4), "lookup_adaptive": Lookup(2, 3, adaptive=True, max_pred=8),
            "lookup_tree": LookupTree(2, 3, max_matches=3), "chain": Chain(draft, 3),
            "chain_adaptive": Chain(draft, 2, adaptive=True, gamma_max=6), "chain_confident": Chain(draft, 4,
                                                                                              confidence_stop=0.2),
            "tree": DraftTree(draft, budget=6, max_depth=3)}


@pytest.mark.parametrize("name", ["plain", "lookup", "lookup_adaptive", "lookup_tree", "chain", "chain_adaptive",
                                  "chain_confident", "tree"])
def test_batched_greedy_equals_decoding_alone(arch, name):
    target = random_model(1, **arch)
    draft = perturbed_copy(target, 0.3, seed=2)
    prompts = ragged_prompts(7)
    n = 20
    outs, stats, batch = decode_batch(target, prompts, n, methods(draft)[name])
    for p, out in zip(prompts, outs):
        assert out == generate(target, p, n)
    assert batch.blocks_left == 0
    assert batch.batch_sizes[0] == 7 and batch.new_tokens == sum(len(o) for o in outs)
    if name != "plain":
        accepted = [s.accepted for s in stats]
        assert sum(accepted) > 0                            # speculation happened ...
        assert sum(s.target_passes for s in stats) < len(prompts) * n   # ... and saved passes
        # the batch needs as many passes as its slowest sequence: never fewer than any one of them
        assert batch.target_passes == max(s.target_passes for s in stats)
    if name.startswith(("chain", "tree")):
        # the draft drafted for all sequences at once: one batched draft pass per position (chain) or level
        # (tree), so the batch's draft passes are those of its busiest sequence, not their sum
        assert 0 < batch.draft_passes <= sum(s.draft_passes for s in stats)


@pytest.mark.parametrize("name", ["eagle", "medusa", "lookahead"])
def test_per_sequence_proposers_with_hidden_states_or_extra_nodes_in_a_batch(arch, name):
    """EAGLE and Medusa read the target's hidden states of each sequence's own accepted positions; lookahead
    adds extra nodes (its window) to each pass. In a batch each sequence's output is still its solo output,
    with and without a shared prefix (whose hidden states the engine keeps for them)."""
    from minigpt.decoding.eagle import Eagle
    from minigpt.decoding.lookahead import Lookahead
    from minigpt.decoding.medusa import Medusa
    from minigpt.eagle_head import EagleHead
    from minigpt.medusa_heads import MedusaHeads
    target = random_model(2, **arch)
    torch.manual_seed(0)
    if name == "eagle":
        head = EagleHead(target).eval()
        with torch.no_grad():
            for prm in head.parameters():
                prm.add_(torch.randn_like(prm) * 0.05)
        factory = lambda: Eagle(head, depth=4, top_k=2, total_tokens=6)   # noqa: E731
    elif name == "medusa":
        heads = MedusaHeads.for_target(target, n_heads=2).eval()
        factory = lambda: Medusa(heads, [(0,), (1,), (0, 0)])            # noqa: E731
    else:
        factory = lambda: Lookahead(window=3, ngram=3, candidates=2)     # noqa: E731
    system = [5, 6, 7, 8, 9, 10, 11]
    prompts = [system + p for p in ragged_prompts(5, seed=7)]
    for share in (False, True):
        outs, stats, batch = decode_batch(target, prompts, 18, factory(), share_prefix=share, block_size=4)
        assert outs == [generate(target, p, 18) for p in prompts], f"share_prefix={share}"
        assert batch.blocks_left == 0
    assert sum(s.target_passes for s in stats) < 5 * 18 or name == "lookahead"


def test_ragged_stops_and_eos():
    """Sequences stop at their own eos while the others go on; each output equals its solo output."""
    target = random_model(5)
    prompts = ragged_prompts(6, seed=3)
    solo = [generate(target, p, 24) for p in prompts]
    eos = Counter(t for o in solo for t in o[3:]).most_common(1)[0][0]   # a token some outputs contain
    outs, stats, batch = decode_batch(target, prompts, 24, Lookup(2, 4), eos_id=eos)
    want = [generate(target, p, 24, eos_id=eos) for p in prompts]
    assert outs == want
    assert len({len(o) for o in outs}) > 1                  # they did stop at different lengths
    assert sorted(batch.batch_sizes, reverse=True) == batch.batch_sizes and batch.batch_sizes[-1] < 6
    assert batch.blocks_left == 0


@pytest.mark.slow
def test_batched_greedy_on_the_shipped_pair(target, draft):
    from minigpt.prompts import code_prompts, edit_prompts
    prompts = code_prompts(6) + edit_prompts(2)
    solo = [generate(target, p, 32) for p in prompts]
    for proposer in (Plain(), Lookup(3, 8), Chain(draft, 4), DraftTree(draft, budget=12)):
        outs, _, batch = decode_batch(target, prompts, 32, proposer)
        assert outs == solo, type(proposer).__name__
        assert batch.blocks_left == 0
    # and the chain's own statistics per sequence match the single-sequence chain's
    _, stats, _ = decode_batch(target, prompts[:2], 32, Chain(draft, 4))
    for p, s in zip(prompts[:2], stats):
        _, alone = speculative_generate(target, draft, p, 32, gamma=4)
        assert (s.accepted, s.tested, s.target_passes) == (alone.accepted, alone.tested, alone.target_passes)


def test_prefix_sharing_stores_the_common_prompt_once():
    target = random_model(2)
    system = list(range(1, 30))                               # 29 tokens: blocks of 8 -> the last is partly filled
    prompts = [system + [40 + i, 50 + i, 60] for i in range(4)]
    assert longest_common_prefix(prompts) == 29
    shared, _, b1 = decode_batch(target, prompts, 12, share_prefix=True, block_size=8)
    separate, _, b2 = decode_batch(target, prompts, 12, block_size=8)
    assert shared == separate == [generate(target, p, 12) for p in prompts]
    assert b1.blocks_left == b2.blocks_left == 0

    engine = BatchEngine(target, Plain(), block_size=8, max_batch=4)
    engine.add_prefix(system)
    seqs = [engine.admit(Request(p, 12)) for p in prompts]
    # the 3 full blocks of the system prompt are held once by all four; each has its own copy of the 4th
    assert all(s.table.blocks[:3] == seqs[0].table.blocks[:3] for s in seqs)
    assert len({s.table.blocks[3] for s in seqs}) == 4
    assert engine.pool.blocks_in_use == 4 + 4 * 1          # the prefix's 4 blocks + one copied block each
    while engine.active:
        engine.step()
    engine.close()
    assert engine.pool.blocks_in_use == 0 and [s.output for s in seqs] == shared


def test_scheduler_serves_every_request_exactly():
    target = random_model(6)
    draft = perturbed_copy(target, 0.3, seed=1)
    prompts = ragged_prompts(7, seed=4)
    requests = [Request(p, 10 + 3 * i, arrival=0.002 * i, name=f"r{i}") for i, p in enumerate(prompts)]
    for proposer in (Plain(), Chain(draft, 3), Lookup(2, 4), DraftTree(draft, budget=4)):
        report = serve(target, requests, proposer, max_batch=3)
        assert report.outputs == [generate(target, r.prompt, r.max_new_tokens) for r in requests]
        assert report.stats.blocks_left == 0
        assert max(report.stats.batch_sizes) <= 3 and len(report.requests) == 7
        for r in report.requests:
            assert r["arrival"] <= r["admitted"] <= r["first"] <= r["done"] <= report.wall_time
        assert all(t >= 0 for t in report.ttft()) and report.throughput > 0
        assert report.new_tokens == sum(r.max_new_tokens for r in requests)


def test_scheduler_admits_within_the_pool():
    """A pool with room for two worst-case requests never runs more than two, and still serves all."""
    target = random_model(6)
    requests = [Request([1, 2, 3], 20) for _ in range(5)]
    blocks = 2 * ((3 + 20 + 1 + 7) // 8)                     # two requests' worst case (a plain pass: 1 token)
    report = serve(target, requests, max_batch=5, n_blocks=blocks, block_size=8)
    assert max(report.stats.batch_sizes) == 2 and report.peak_blocks <= blocks
    assert report.outputs == [generate(target, [1, 2, 3], 20)] * 5
    with pytest.raises(ValueError, match="more KV blocks"):
        serve(target, [Request([1, 2, 3], 20)], n_blocks=2, block_size=8)


def test_bad_requests_fail_in_one_line():
    target = random_model(0)
    engine = BatchEngine(target, Plain(), max_batch=1)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        engine.admit(Request([1, 2], 100))
    with pytest.raises(ValueError, match="non-empty"):
        engine.admit(Request([], 5))
    engine.admit(Request([1, 2], 5))
    with pytest.raises(MemoryError, match="batch is full"):
        engine.admit(Request([1, 2], 5))
    with pytest.raises(ValueError, match="vocabularies differ"):
        BatchEngine(target, Chain(random_model(0, vocab_size=50), 2))


def test_lesson_12s_spellings_still_build_the_same_proposers():
    """PerSequence(factory) and BatchedChain were a batch's own classes; the engine takes any proposer now."""
    draft = random_model(1)
    assert type(PerSequence(Plain)) is Plain and type(PerSequence(lambda: Lookup(3, 8))) is Lookup
    chain = BatchedChain(draft, 4)
    assert type(chain) is Chain and chain.gamma == 4 and chain.max_width == 5


def test_each_sequence_has_its_own_proposer_state():
    """The engine forks the proposer per sequence and starts each fork: an adaptive length grows per sequence, and
    the proposer handed to the engine is left as it was."""
    target = random_model(3)
    proto = Lookup(2, 2, adaptive=True, max_pred=12)
    engine = BatchEngine(target, proto, max_batch=2)
    a = engine.admit(Request([5, 6, 7] * 6, 16))         # repeats: lookup matches, its length grows
    b = engine.admit(Request(ragged_prompts(1, seed=9)[0], 16))
    assert a.proposer is not proto and a.proposer is not b.proposer
    while engine.active:
        engine.step()
    assert proto.k == 2 and (a.proposer.k, b.proposer.k) != (2, 2)


def _accept_everything(sampling, generator):
    """A wrong rule: every drafted token stands (the output would follow the draft, not the target)."""
    def rule(proposal, logits):
        return list(range(1, len(proposal.tokens))), int(logits[-1].argmax())
    return rule


def sampled_pairs(target, draft, n, rule=None):
    """(first, second) token of n sampled batched chain decodes after a one-token prompt, 250 per batch."""
    pairs = []
    for start in range(0, n, 250):
        engine = BatchEngine(target, Chain(draft, 2), SamplingConfig(1.0, top_k=3), max_batch=250, rule=rule)
        seqs = [engine.admit(Request([7], 2, seed=start + i)) for i in range(min(250, n - start))]
        while engine.active:
            engine.step()
        pairs += [tuple(s.output) for s in seqs]
    return pairs


@pytest.mark.slow
def test_batched_sampling_matches_the_target_distribution():
    """Batched chain sampling (draft sampling with its own q, each sequence its own generator) draws the first
    two tokens from the target's exact joint distribution under top_k=3 (9 outcomes): within tv_bound of
    the truth for 1000 draws. The same measurement rejects a rule that accepts every drafted token."""
    target = random_model(8, n_layer=1)
    draft = perturbed_copy(target, 0.8, seed=3)
    cfg = SamplingConfig(1.0, top_k=3)
    with torch.no_grad():
        p1 = cfg.probs(target(torch.tensor([[7]]))[0, -1])
        truth = {}
        for a in p1.nonzero().flatten().tolist():
            p2 = cfg.probs(target(torch.tensor([[7, a]]))[0, -1])
            for b in p2.nonzero().flatten().tolist():
                truth[(a, b)] = float(p1[a] * p2[b])
    outcomes = sorted(truth)
    p = torch.tensor([truth[o] for o in outcomes] + [0.0])   # the last entry: any pair outside the support

    def empirical(pairs):
        counts = Counter(pairs)
        inside = [counts[o] for o in outcomes]
        return torch.tensor(inside + [len(pairs) - sum(inside)]) / len(pairs)

    n = 1000
    good = empirical(sampled_pairs(target, draft, n))
    assert good[-1] == 0, "a pair outside the target's top-3 support was generated"
    bound = tv_bound(n, len(p))
    assert tv_distance(good, p) < bound, f"TV {tv_distance(good, p):.4f} >= bound {bound:.4f}"
    bad = empirical(sampled_pairs(target, draft, n, rule=_accept_everything))
    assert tv_distance(bad, p) > bound, "the wrong rule passed the exactness test"
