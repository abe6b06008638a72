"""The shared decoding loop: a new method is one proposer, and it is exact for free; the session keeps the
cache invariant; the verifier rolls the cache back for chains and trees alike."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from conftest import first_two_joint, pair_frequencies, perturbed_copy, prompts_from, random_model
from minigpt import bench
from minigpt.cache import KVCache
from minigpt.decoding import (Chain, DraftTree, Eagle, Lookahead, Lookup, LookupTree, Plain, Proposal, Proposer,
                              SelfSpec, Session, decode, generate, prefill, verify_chain)
from minigpt.eagle_head import EagleHead
from minigpt.decoding.verify import greedy_rule, rule_for, verify
from minigpt.exactness import tv_bound, tv_distance
from minigpt.sampling import SamplingConfig, sample


# ----- the toy proposer of the README: the whole method is these lines -----

class RepeatLast(Proposer):
    """Propose the last token again, ``n`` times."""

    def __init__(self, n: int = 2):
        self.n = n

    def propose(self, session, room):
        return Proposal.chain(session.seq[-1], [session.seq[-1]] * min(self.n, room))


def test_a_toy_proposer_is_greedy_exact_on_many_prompts(target, tokenizer, val_texts):
    prompts = prompts_from(val_texts, tokenizer, 12, seed=0, lengths=(2, 60), window=2000, min_text=3000)
    for i, prompt in enumerate(prompts):
        ids, stats = decode(target, prompt, 40, RepeatLast(1 + i % 3))
        assert ids == generate(target, prompt, 40), f"prompt {i}"
        assert stats.target_passes < 40 or stats.accepted == 0  # every accepted repeat saved a pass
        assert stats.new_tokens == 40 and stats.proposed == sum(stats.gammas)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_toy_proposer_is_greedy_exact_on_random_models(seed):
    model = random_model(seed)
    rng = random.Random(seed)
    for _ in range(6):
        prompt = [rng.randrange(97) for _ in range(rng.randint(1, 12))]
        assert decode(model, prompt, 30, RepeatLast(3))[0] == generate(model, prompt, 30)


def _replacement_from_p(sampling, generator):
    """A biased rule: on rejection it resamples from p instead of the residual (accepts the candidate twice)."""
    def rule(proposal, logits):
        p = sampling.probs(logits)
        if len(proposal.tokens) > 1 and float(torch.rand((), generator=generator)) < float(p[0, proposal.tokens[1]]):
            return [1], sample(p[1], generator)
        return [], sample(p[0], generator)
    return rule


def _sampled_pairs(model, prompt, n: int, rule=None) -> torch.Tensor:
    return pair_frequencies(lambda seed: decode(model, prompt, 2, RepeatLast(1), temperature=1.0, seed=seed,
                                                rule=rule)[0], model.config.vocab_size, n)


@pytest.mark.slow
def test_a_toy_proposer_samples_exactly_and_the_test_can_fail():
    """Sampled: the first two tokens (6 x 6 = 36 outcomes, 4000 samples) within the TV bound of the exact joint
    distribution (delta 1e-4); the same test fails a rule that resamples from p after a rejection."""
    model = random_model(3, vocab_size=6)
    prompt, n = [1, 4, 2], 4000
    exact = first_two_joint(model, prompt, 1.0)
    bound = tv_bound(n, exact.numel(), delta=1e-4)
    good = tv_distance(_sampled_pairs(model, prompt, n), exact)
    biased = tv_distance(_sampled_pairs(model, prompt, n, rule=_replacement_from_p), exact)
    assert good < bound, f"TV {good:.4f} >= bound {bound:.4f}"
    assert biased > bound, f"the biased rule passed: TV {biased:.4f} < bound {bound:.4f}"


# ----- the session owns the cache invariant -----

class Recording(Proposer):
    """Wraps a proposer and checks the invariant before every round."""

    def __init__(self, inner: Proposer):
        self.inner, self.draft, self.needs_hidden, self.rounds = inner, inner.draft, inner.needs_hidden, 0

    def start(self, session):
        self.inner.start(session)

    def propose(self, session, room):
        assert session.cache.length == len(session.seq) - 1  # the sequence without its last token
        if session.draft_cache is not None:
            assert session.draft_cache.length <= len(session.seq) - 1
        self.rounds += 1
        return self.inner.propose(session, room)

    def observe(self, proposal, verified):
        self.inner.observe(proposal, verified)


@pytest.mark.parametrize("make", [lambda d: Plain(), lambda d: Chain(d, 4), lambda d: Chain(d, 2, adaptive=True),
                                  lambda d: DraftTree(d, budget=8), lambda d: Lookup(), lambda d: LookupTree(),
                                  lambda d: RepeatLast(2)])
def test_every_proposer_keeps_the_cache_invariant_and_stays_exact(make):
    target = random_model(5)
    draft = perturbed_copy(target, 0.3)
    prompt = [3, 9, 27, 81, 3, 9, 27]
    rec = Recording(make(draft))
    ids, stats = decode(target, prompt, 24, rec)
    assert ids == generate(target, prompt, 24)
    assert rec.rounds == stats.target_passes


def test_plain_decoding_books_no_rounds():
    model = random_model(1)
    ids, stats = decode(model, [5, 6, 7], 10, Plain())
    assert stats.target_passes == 10 and stats.rounds == 0 and stats.proposed == 0 and stats.gammas == []


def test_verify_rolls_the_cache_back_for_chains_and_trees():
    target = random_model(2)
    prompt = [4, 8, 15, 16, 23]
    for proposal in (Proposal.chain(42, [1, 2, 3]), Proposal([42, 1, 2, 3, 4], [-1, 0, 0, 1, 2])):
        cache = KVCache.for_model(target)
        prefill(target, cache, torch.tensor([prompt[:-1] + [42]]))
        start = cache.length
        v = verify(target, cache, proposal, greedy_rule)
        assert cache.length == start + 1 + len(v.path)  # the root and the accepted candidates, nothing else
        # what the cache holds is what a fresh pass over the accepted sequence computes
        fresh = KVCache.for_model(target)
        target(torch.tensor([prompt[:-1] + [42] + v.tokens[:-1]]), cache=fresh)
        assert torch.allclose(cache.k[..., :cache.length, :], fresh.k[..., :fresh.length, :], atol=1e-5)


def test_verify_chain_rolls_back_itself():
    target = random_model(4)
    cache = KVCache.for_model(target)
    prefill(target, cache, torch.tensor([[1, 2, 3]]))
    new = verify_chain(target, cache, 3, [7, 7, 7], SamplingConfig())
    assert cache.length == 2 + len(new)  # the two prefilled tokens, the pending one, the accepted ones


def test_bad_proposals_and_drafts_fail_in_one_line():
    target = random_model(0)

    class Broken(Proposer):
        def propose(self, session, room):
            return Proposal([session.seq[-1], 5], [-1, 3])  # a parent after its child

    with pytest.raises(ValueError, match="invalid parent array"):
        decode(target, [1, 2], 5, Broken())
    with pytest.raises(ValueError, match="vocabularies differ"):
        decode(target, [1, 2], 5, Chain(random_model(0, vocab_size=50)))
    with pytest.raises(ValueError, match="exceeds the model's context"):
        Session(target, [1, 2], 10_000, rule=rule_for)


def test_self_speculation_is_a_chain_over_the_early_exit():
    target = random_model(6)
    prompt = [2, 7, 1, 8, 2, 8]
    ids, stats = decode(target, prompt, 20, SelfSpec(target, n_layers=1, gamma=3))
    assert ids == generate(target, prompt, 20)
    assert stats.draft_passes == stats.proposed > 0


def test_the_readme_toy_method_runs_as_written(monkeypatch, target):
    """The README's "Adding a decoding method" block, executed: its one declaration makes the proposer exact and
    raced by the bench (tests/test_registry.py checks the rest: the batch bench, the chat, sampling)."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Adding a decoding method", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.setitem(bench.METHODS, "repeat_last", None)  # the declaration below is undone after the test
    namespace: dict = {}
    exec(code, namespace)
    prompt = [int(t) for t in torch.randint(4000, (12,), generator=torch.Generator().manual_seed(1))]
    assert decode(target, prompt, 24, namespace["RepeatLast"]())[0] == generate(target, prompt, 24)
    records = bench.run_bench(["repeat_last"], models=bench.Models(target), prompts=[prompt], max_new_tokens=16,
                              repeats=1)
    assert [r["method"] for r in records] == ["plain", "repeat_last"]
    assert all(r["identical_to_plain_greedy"] for r in records)


@pytest.mark.parametrize("make", [lambda t, d: DraftTree(d, budget=16), lambda t, d: LookupTree(max_matches=4),
                                  lambda t, d: Chain(d, 6)])
def test_wide_rounds_fit_at_the_end_of_the_context(make):
    """Near the end of the context a round's nodes can outnumber the positions left (siblings share one):
    the caches keep room for the proposer's widest pass."""
    target = random_model(3, block_size=48)
    draft = perturbed_copy(target, 0.2)
    prompt = [1, 2, 3, 4] * 10 + [1, 2]
    assert decode(target, prompt, 6, make(target, draft))[0] == generate(target, prompt, 6)


# ----- the lifecycle: start() resets what a generation changes -----

@pytest.mark.parametrize("make", [lambda t, d: Chain(d, 2, adaptive=True, gamma_max=8),
                                  lambda t, d: Lookup(2, 2, adaptive=True, max_pred=12),
                                  lambda t, d: Lookahead(window=3, ngram=3, candidates=2),
                                  lambda t, d: Eagle(EagleHead(t).eval(), depth=3, top_k=2, total_tokens=4)])
def test_a_proposer_used_again_starts_afresh(make):
    """The same proposer object decodes a second prompt exactly as a fresh one would (its adaptive length, its n-gram
    pool, its head's cache are made in start(), not carried over), with the same statistics."""
    target = random_model(5)
    draft = perturbed_copy(target, 0.3)
    first, second = [3, 9, 27, 81, 3, 9, 27, 81, 3], [5, 6, 5, 6, 5, 6, 7]
    used = make(target, draft)
    decode(target, first, 20, used)
    again, stats_again = decode(target, second, 20, used)
    fresh, stats_fresh = decode(target, second, 20, make(target, draft))
    assert again == fresh == generate(target, second, 20)
    assert (stats_again.gammas, stats_again.accepted) == (stats_fresh.gammas, stats_fresh.accepted)


def _byte_encoding(name: str, swap: bool = False):
    """A tiktoken Encoding of the 256 bytes plus an end token; ``swap``: bytes 65 and 66 trade ids."""
    import tiktoken
    ranks = {bytes([i]): i for i in range(256)}
    if swap:
        ranks[b"A"], ranks[b"B"] = 66, 65
    return tiktoken.Encoding(name, pat_str=r".", mergeable_ranks=ranks, special_tokens={"<|end|>": 256})


def test_a_draft_with_another_vocabulary_of_the_same_size_is_refused():
    """As llama.cpp's are_compatible: sizes, special tokens and the text of every token are compared when the models
    carry their tokenizers; a draft whose token 65 reads "B" cannot draft for a target whose 65 reads "A"."""
    target, draft = random_model(0, vocab_size=257), random_model(1, vocab_size=257)
    target.tokenizer, draft.tokenizer = _byte_encoding("a"), _byte_encoding("b", swap=True)
    with pytest.raises(ValueError, match=r"vocabularies differ \(token 65 is b'A' vs b'B'\)"):
        decode(target, [1, 2], 5, Chain(draft, 2))
    draft.tokenizer = _byte_encoding("c")            # the same vocabulary in another object: accepted
    assert decode(target, [1, 2], 5, Chain(draft, 2))[0] == generate(target, [1, 2], 5)
    import tiktoken
    other = tiktoken.Encoding("d", pat_str=r".", mergeable_ranks={bytes([i]): i for i in range(256)},
                              special_tokens={"<|stop|>": 256})
    draft.tokenizer = other
    with pytest.raises(ValueError, match="special tokens"):
        decode(target, [1, 2], 5, Chain(draft, 2))
