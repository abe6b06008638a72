"""The registry (minigpt.decoding.registry): a method declared once runs everywhere -- the benchmark, the batch
benchmark, the chat -- and is exact there; every declared method is checked the same way, parametrised by the
registry itself."""
from __future__ import annotations

import pytest
import torch

from conftest import first_two_joint, perturbed_copy, random_model
from test_session import _replacement_from_p  # the biased rule the toy's sampled test must catch
from minigpt.bench import run_bench
from minigpt.bench.batch import run_batch_bench
from minigpt.decoding import (METHODS, Models, Proposal, Proposer, Settings, decode, decode_batch, declare,
                              generate)
from minigpt.eagle_head import Eagle3Head, EagleHead
from minigpt.exactness import tv_bound, tv_distance
from minigpt.medusa_heads import MedusaHeads
from minigpt.real import chat


class RepeatLast(Proposer):
    """Propose the last token again, ``n`` times: the whole method."""

    def __init__(self, n: int = 2):
        self.n = n

    def propose(self, session, room):
        return Proposal.chain(session.seq[-1], [session.seq[-1]] * min(self.n, room))


@pytest.fixture
def toy(monkeypatch):
    """The toy, declared once (the declaration is undone after the test)."""
    monkeypatch.setitem(METHODS, "repeat_last", None)
    return declare("repeat_last", RepeatLast, "propose the last token again", params=dict(n=2))


def prompts_with_repeats(n: int, vocab: int = 97, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, vocab, (3,), generator=g).tolist() + [7, 7, 7])[: 4 + i % 3] for i in range(n)]


def test_a_method_declared_once_is_raced_batched_offered_by_the_chat_and_greedy_exact(toy):
    target = random_model(5)
    models = Models(target)
    prompts = prompts_with_repeats(6)
    solo = [generate(target, p, 12) for p in prompts]
    # raced by the benchmark against plain decoding
    records = run_bench(["repeat_last"], models=models, prompts=prompts, max_new_tokens=12, repeats=1)
    assert [r["method"] for r in records] == ["plain", "repeat_last"]
    assert all(r["identical_to_plain_greedy"] for r in records) and records[1]["description"] == toy.description
    # by the batch benchmark at B = 4
    batch = run_batch_bench([4], methods=("repeat_last",), max_new_tokens=12, repeats=1, models=models,
                            prompts=prompts)
    assert [r["method"] for r in batch] == ["plain", "repeat_last"]
    assert all(r["identical_to_solo_plain"] and r["blocks_left"] == 0 for r in batch)
    # offered by the chat loop, and its streamed answer is the plain greedy one
    assert "repeat_last" in chat.choices(models)
    lines, out = iter(["hello", "/quit"]), []
    history = chat.chat_loop(target, lambda messages: prompts[0], lambda ids: " ".join(map(str, ids)), eos_id=96,
                             read=lambda _: next(lines), write=out.append, speculate="repeat_last", models=models,
                             max_new_tokens=12)
    free = generate(target, prompts[0], 12, eos_id=96)
    assert history[1]["content"] == " ".join(map(str, free[:-1] if free[-1] == 96 else free))
    # greedy: identical to plain decoding, alone and in a batch, on many prompts
    many = prompts_with_repeats(20, seed=1)
    for p in many:
        assert toy.run(models, p, 16)[0] == generate(target, p, 16), p
    assert decode_batch(target, many, 16, toy.make(models))[0] == [generate(target, p, 16) for p in many]
    assert solo == [toy.run(models, p, 12)[0] for p in prompts]


def batched_pairs(target, proposer, prompt, n, rule=None, per_batch=250) -> torch.Tensor:
    """The empirical joint of the first two sampled tokens over n sequences, decoded ``per_batch`` at a time (sequence
    i with seed i)."""
    V = target.config.vocab_size
    counts = torch.zeros(V, V)
    for start in range(0, n, per_batch):
        k = min(per_batch, n - start)
        if rule is None:
            outs, _, _ = decode_batch(target, [prompt] * k, 2, proposer, temperature=1.0, seed=start)
        else:  # the same sequences, one by one, under the given rule
            outs = [decode(target, prompt, 2, proposer, Settings(temperature=1.0, seed=start + i), rule=rule)[0]
                    for i in range(k)]
        for a, b in (o[:2] for o in outs):
            counts[a, b] += 1
    return counts / n


@pytest.mark.slow
def test_the_declared_toy_samples_exactly_and_the_test_can_fail(toy):
    """Sampled, in the batch engine: the first two tokens (36 outcomes, 4000 sequences) within the TV bound of the
    target's exact joint (delta 1e-4); the same measurement rejects a rule that resamples from p."""
    target = random_model(3, vocab_size=6)
    prompt, n = [1, 4, 2], 4000
    exact = first_two_joint(target, prompt, 1.0)
    bound = tv_bound(n, exact.numel(), delta=1e-4)
    good = tv_distance(batched_pairs(target, toy.make(Models(target), n=1), prompt, n), exact)
    biased = tv_distance(batched_pairs(target, toy.make(Models(target), n=1), prompt, n, _replacement_from_p), exact)
    assert good < bound, f"TV {good:.4f} >= bound {bound:.4f}"
    assert biased > bound, f"the biased rule passed: TV {biased:.4f} < bound {bound:.4f}"


# ---------------------------------------------------------------- every declared method

def loaded(target: torch.nn.Module) -> Models:
    """``target`` with every drafter a method may need: a draft, Medusa heads and their tree, an EAGLE head and an
    EAGLE-3 head."""
    torch.manual_seed(0)
    heads = MedusaHeads.for_target(target, n_heads=2).eval()
    head, head3 = EagleHead(target).eval(), Eagle3Head(target).eval()
    with torch.no_grad():
        for prm in list(heads.parameters()) + list(head.parameters()) + list(head3.parameters()):
            prm.add_(torch.randn_like(prm) * 0.05)
    return Models(target, perturbed_copy(target, 0.3, seed=2), heads, [(0,), (1,), (0, 0)], head, eagle3_head=head3,
                  early_exit_layers=1)


@pytest.mark.parametrize("name", list(METHODS))
def test_every_declared_method_is_greedy_exact_alone_and_in_a_batch(name):
    target = random_model(2)
    models = loaded(target)
    prompts = prompts_with_repeats(5, seed=4) + [[3], [8, 9, 8, 9, 8]]
    want = [generate(target, p, 14) for p in prompts]
    assert [METHODS[name].run(models, p, 14)[0] for p in prompts] == want
    outs, stats, batch = decode_batch(target, prompts, 14, METHODS[name].make(models))
    assert outs == want and batch.blocks_left == 0
    assert METHODS[name].missing(models) == [] and METHODS[name].make(models).batched == METHODS[name].batched


@pytest.mark.slow
@pytest.mark.parametrize("name", list(METHODS))
def test_every_declared_method_samples_exactly_in_a_batch(name):
    """2000 sampled sequences per method, decoded 250 at a time: the first two tokens within the TV bound of the
    target's exact joint (delta 1e-4; Medusa's default acceptance is the exact one)."""
    target = random_model(3, vocab_size=6)
    prompt, n = [1, 4, 2], 2000
    exact = first_two_joint(target, prompt, 1.0)
    got = batched_pairs(target, METHODS[name].make(loaded(target)), prompt, n)
    assert tv_distance(got, exact) < tv_bound(n, exact.numel(), delta=1e-4)


def test_a_declaration_is_checked_and_a_missing_drafter_is_one_line():
    with pytest.raises(ValueError, match="unknown need 'tokenizer'"):
        declare("nothing", RepeatLast, "never added", needs=("tokenizer",))
    assert "nothing" not in METHODS
    with pytest.raises(ValueError, match="the eagle method needs an EAGLE head, and none is loaded"):
        METHODS["eagle"].make(Models(random_model(0)))
    assert METHODS["prompt_lookup"].defaults("smollm2")["num_pred"] == 16
    assert METHODS["prompt_lookup"].defaults()["num_pred"] == 8


def test_settings_are_one_object_and_keywords_fold_into_it():
    target = random_model(1)
    s = Settings(temperature=1.0, seed=4)
    assert generate(target, [1, 2], 8, s) == generate(target, [1, 2], 8, temperature=1.0, seed=4)
    assert generate(target, [1, 2], 8, s, seed=5) == generate(target, [1, 2], 8, temperature=1.0, seed=5)
    with pytest.raises(TypeError, match="unknown decoding setting 'temprature'"):
        generate(target, [1, 2], 8, temprature=1.0)


def test_auto_has_the_same_options_whichever_methods_are_loaded_beside_it():
    """The controller uses every drafter its options need when installed: loading the models for ``auto`` alone
    loads the EAGLE head and the draft as loading them for ``auto`` raced beside ``eagle`` does, so a benchmark's
    ``auto`` does not depend on the other methods in its race (nor on the chat's loading)."""
    from minigpt.decoding.registry import AUTO_OPTIONS, auto_options, wanted
    assert wanted(["auto"]) == {"draft", "eagle_head"} == wanted(["plain", "auto"]) | wanted(["eagle"])
    assert wanted(["plain", "auto", "eagle"]) == wanted(["auto"])
    assert METHODS["auto"].needs == ()      # a use, never a need: auto runs with no drafter loaded
    alone = Models.shipped("cpu", methods=["auto"])
    assert alone.eagle_head is not None and alone.draft is not None
    assert set(auto_options(alone)) == set(AUTO_OPTIONS) == {"prompt_lookup", "suffix", "chain", "eagle"}
    bare = Models(alone.target)             # nothing loaded: the copying options only
    assert set(auto_options(bare)) == {"prompt_lookup", "suffix"}
    with pytest.raises(ValueError, match="unknown need 'tokenizer'"):
        declare("nothing", RepeatLast, "never added", uses=("tokenizer",))
