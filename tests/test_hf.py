"""minigpt <-> Hugging Face transformers: the conversion is exact, and transformers' decoders (minigpt.peers)
produce our tokens. Skipped when transformers (the optional extra ``.[peers]``) is not installed."""
from __future__ import annotations

import sys

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="Hugging Face transformers is not installed: pip install -e '.[peers]'")

import minigpt  # noqa: E402
from minigpt.real.hf import from_hf, require_transformers, to_hf  # noqa: E402
from minigpt.peers import our_methods, peer_methods  # noqa: E402

from conftest import perturbed_copy, random_model  # noqa: E402

# Measured differences between the two implementations are a few 1e-6 on logits of magnitude ~10 (the
# matmuls are grouped differently: Conv1D's addmm vs nn.Linear); 2e-5 leaves room for other BLAS builds.
ATOL = 2e-5


@pytest.mark.parametrize("seed,shape", [(0, {}), (1, dict(n_layer=3, n_head=2, n_embd=24)),
                                        (2, dict(n_layer=1, n_head=8, n_embd=64, vocab_size=50))])
def test_logits_match_random_models(seed, shape):
    model = random_model(seed, **shape)
    hf = to_hf(model)
    assert isinstance(hf, transformers.GPT2LMHeadModel) and not hf.training
    idx = torch.randint(model.config.vocab_size, (2, model.config.block_size), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ours, theirs = model(idx), hf(idx).logits
    assert theirs.shape == ours.shape
    torch.testing.assert_close(theirs, ours, atol=ATOL, rtol=0)


def test_logits_match_shipped_target(target):
    hf = to_hf(target)
    assert hf.config.n_positions == target.config.block_size
    assert (hf.config.eos_token_id, hf.generation_config.pad_token_id) == (4095, 4095)
    assert hf.num_parameters() == target.num_params()  # tied output layer counted once by both
    idx = torch.randint(4096, (1, target.config.block_size), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        # the trained target's logits are large (tens), so fp32 rounding in a 256-token pass reaches 3e-5 here; a wrong
        # mapping differs by whole units
        torch.testing.assert_close(hf(idx).logits, target(idx), atol=1e-4, rtol=0)


def test_conversion_transposes_conv1d_weights(small_model):
    """A check on the mapping itself: a conversion that forgot the transpose would fail on shapes or values."""
    hf = to_hf(small_model)
    ours = small_model.transformer.h[0].mlp.c_fc.weight      # (4C, C) as nn.Linear stores it
    theirs = hf.transformer.h[0].mlp.c_fc.weight             # (C, 4C) as Conv1D stores it
    assert theirs.shape == ours.shape[::-1]
    assert torch.equal(theirs, ours.t())


def test_round_trip_is_exact(small_model):
    back = from_hf(to_hf(small_model))
    assert back.config == small_model.config
    ours, again = small_model.state_dict(), back.state_dict()
    assert set(ours) == set(again)
    for name in ours:
        assert torch.equal(ours[name], again[name]), name
    assert back.lm_head.weight is back.transformer.wte.weight  # still tied


def test_from_hf_rejects_what_minigpt_cannot_express():
    cfg = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                  activation_function="relu")
    with pytest.raises(ValueError, match="activation"):
        from_hf(transformers.GPT2LMHeadModel(cfg))


def test_missing_transformers_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # makes `import transformers` raise ImportError
    with pytest.raises(ImportError, match=r"pip install -e '\.\[peers\]'"):
        require_transformers()


@pytest.fixture(scope="module")
def held_out_prompts():
    from minigpt.prompts import code_prompts, edit_prompts
    return code_prompts(2) + edit_prompts(1)


def test_hf_greedy_generate_equals_ours_on_held_out_prompts(target, held_out_prompts):
    hf = to_hf(target)
    for prompt in held_out_prompts:
        ours = minigpt.generate(target, prompt, 24)
        ids = torch.tensor([prompt])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                          pad_token_id=4095, eos_token_id=None)
        assert out[0, len(prompt):].tolist() == ours, prompt.name


def test_peer_methods_reproduce_our_tokens_random_model():
    """All three transformers decoders against ours on a model whose greedy output varies, with prompts
    that repeat (prompt lookup finds matches) and one that does not."""
    model = random_model(3)
    draft = perturbed_copy(model, 0.3)
    peers = peer_methods(model, draft, gamma=3, max_ngram=2, num_pred=5)
    ours = our_methods(model, draft, gamma=3, max_ngram=2, num_pred=5)
    assert set(peers) == {"hf_plain", "hf_assisted", "hf_prompt_lookup"}
    for prompt in ([1, 2, 3, 4, 5], list(range(10, 20)) * 2):
        expected = ours["plain"](prompt, 30)
        assert 96 in expected or prompt != [1, 2, 3, 4, 5]  # the eos id (vocab - 1) is generated ...
        for name, fn in peers.items():
            assert fn(prompt, 30) == expected, name  # ... and does not stop generation (eos_id=None)
            assert fn.stats.new_tokens == 30 and fn.stats.target_passes >= 1
        assert ours["chain"](prompt, 30) == ours["prompt_lookup"](prompt, 30) == expected


def test_assisted_generation_drafts_a_constant_gamma():
    """transformers' default would draft 20 tokens and stop early on low confidence; we ask for gamma."""
    model = random_model(5)
    peers = peer_methods(model, model, gamma=4)  # the target as its own draft: every drafted token is accepted
    fn = peers["hf_assisted"]
    fn([3, 1, 4, 1, 5], 21)
    # 21 tokens, 5 per round (4 accepted + 1 from the target), the last round a single token: 5 target passes
    # (with 20 drafted tokens it would be 2; with the confidence stop, more than 5)
    assert fn.stats.target_passes == 5, fn.stats
    with pytest.raises(ValueError, match="context"):
        peers["hf_prompt_lookup"](list(range(50)), 10)  # 50 + 10 + lookahead 8 > 64 positions


def test_bench_peers_records():
    """``minigpt.bench`` with ``peers=True`` times transformers' decoders next to ours in the same loop."""
    import inspect

    from minigpt import bench
    from minigpt.peers import PAIRS
    if "peers" not in inspect.signature(bench.run_bench).parameters:
        pytest.skip("minigpt.bench.run_bench has no `peers` option yet")
    model = random_model(3)
    records = bench.run_bench(["plain"], models=bench.Models(model, perturbed_copy(model, 0.3)),
                              prompts=[[1, 2, 3, 4, 5], list(range(10, 20)) * 2], max_new_tokens=12, repeats=1,
                              peers=True)
    by_name = {r["method"]: r for r in records}
    for theirs, ours in PAIRS.items():
        if ours in bench.METHODS:
            r = by_name[theirs]
            assert ours in by_name and r["ours"] == ours
            assert r["identical_to_ours"] is True and r["identical_to_plain_greedy"] is True
            assert r["tokens_per_s"] > 0 and r["ours_over_theirs"] > 0


def test_bench_peers_without_a_draft_races_what_it_can():
    """No draft: transformers' plain and prompt-lookup decoders race ours; assisted generation (and our chain,
    its partner) are left out instead of failing."""
    from minigpt import bench
    models = bench.Models(random_model(0))
    prompts = [list(range(5, 17)), list(range(20, 30)) * 2]
    records = bench.run_bench(["plain"], models=models, prompts=prompts, max_new_tokens=6, repeats=1, peers=True)
    names = [r["method"] for r in records]
    assert names == ["plain", "prompt_lookup", "hf_plain", "hf_prompt_lookup"]
    assert all(r["identical_to_plain_greedy"] for r in records)
