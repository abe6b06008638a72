"""The Llama-family switches of the model: RMSNorm, rotary positions, SwiGLU and grouped-query attention.

The cache and tree-mask tests in test_cache.py and test_model.py already run on both architectures; these
tests check the pieces themselves, and the whole model against transformers' Llama when it is installed."""
from __future__ import annotations

import pytest
import torch

from conftest import ARCHS, SMALL, random_model
from minigpt.cache import KVCache
from minigpt.model import GPT, GPTConfig, RMSNorm, rotate
from test_model import tokens

LLAMA = {**SMALL, **ARCHS["llama"]}


def test_rms_norm_is_the_formula():
    x = torch.randn(3, 5, 16)
    norm = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 16))
    expected = x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * norm.weight
    torch.testing.assert_close(norm(x), expected)


def test_rotation_keeps_lengths_and_position_zero_is_the_identity():
    x = torch.randn(2, 3, 7, 8)
    torch.testing.assert_close(rotate(x, torch.zeros(7, dtype=torch.long), 10000.0), x)
    turned = rotate(x, torch.arange(7) * 13, 10000.0)
    torch.testing.assert_close(turned.norm(dim=-1), x.norm(dim=-1))
    assert not torch.allclose(turned, x)


def test_rotary_scores_depend_on_the_distance_only():
    """q at position m and k at position n give the same score as at m + s and n + s, for any shift s."""
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(m, n):
        return (rotate(q, torch.tensor([m]), 100.0) * rotate(k, torch.tensor([n]), 100.0)).sum().item()

    for m, n in [(5, 2), (9, 9), (3, 30)]:
        for shift in (1, 17, 200):
            assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=1e-4)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)


def test_grouped_query_attention_caches_only_the_key_value_heads():
    model = random_model(0, **ARCHS["llama"])
    cache = KVCache.for_model(model)
    assert cache.k.shape == (2, 1, 2, 64, 8)  # (layers, batch, n_kv_head, max_len, head_size)
    full = KVCache.for_model(random_model(0))
    assert cache.bytes_per_token() * 2 == full.bytes_per_token()


def test_llama_parameters_no_biases_no_position_table():
    model = GPT(GPTConfig(**LLAMA))
    names = dict(model.named_parameters())
    assert "transformer.wpe.weight" not in names
    assert not any(n.endswith("bias") for n in names)
    assert names["transformer.h.0.attn.c_attn.weight"].shape == ((4 + 2 * 2) * 8, 32)
    assert names["transformer.h.0.mlp.c_fc.weight"].shape == (2 * 48, 32)  # gate and up


@pytest.mark.parametrize("overrides, fragment", [
    (dict(norm="batchnorm"), "norm='batchnorm'"),
    (dict(pos="alibi"), "pos='alibi'"),
    (dict(mlp="relu"), "mlp='relu'"),
    (dict(n_kv_head=3), "not a multiple of n_kv_head=3"),
    (dict(n_embd=36, n_head=12, pos="rope"), "even head size"),
])
def test_bad_switches_are_named(overrides, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        GPTConfig(**{**SMALL, **overrides})


def test_to_hf_refuses_a_mix_of_gpt2_and_llama_switches():
    from minigpt.real.hf import to_hf
    pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[peers]')")
    with pytest.raises(ValueError, match="mixes the two"):
        to_hf(random_model(0, **{**ARCHS["llama"], "pos": "learned"}))


@torch.no_grad()
def test_same_logits_as_transformers_llama():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                                              "(pip install -e '.[peers]')")
    cfg = GPTConfig(**{**LLAMA, "rope_base": 500.0, "norm_eps": 1e-6})
    ours = random_model(0, **{k: v for k, v in cfg.to_dict().items() if k not in SMALL})
    from minigpt.real.hf import to_hf
    theirs = to_hf(ours)
    assert isinstance(theirs, transformers.LlamaForCausalLM)
    idx = tokens(40, batch=2, seed=3)
    torch.testing.assert_close(ours(idx), theirs(idx).logits, atol=1e-4, rtol=1e-4)


# ----- every decoder stays exact on the Llama path; the target's own first layers as a draft -----

@torch.no_grad()
def test_decoders_greedy_equal_plain_on_a_llama_model():
    from minigpt.decoding import generate, speculative_generate
    from minigpt.decoding.lookup import lookup_generate
    from minigpt.decoding.tree import tree_generate
    from minigpt.model import early_exit_draft
    target = random_model(3, **ARCHS["llama"])
    draft = early_exit_draft(target, 1)
    for seed in range(6):
        prompt = tokens(5 + 3 * seed, seed=seed)[0].tolist()
        plain = generate(target, prompt, 24)
        assert speculative_generate(target, draft, prompt, 24, gamma=3)[0] == plain, f"chain, prompt {seed}"
        assert tree_generate(target, draft, prompt, 24, budget=8)[0] == plain, f"tree, prompt {seed}"
        assert lookup_generate(target, prompt + prompt, 24)[0] == generate(target, prompt + prompt, 24)


def test_early_exit_draft_shares_the_weights_and_checks_its_depth():
    from minigpt.model import early_exit_draft
    target = random_model(0, **ARCHS["llama"])
    draft = early_exit_draft(target, 1)
    assert draft.config.n_layer == 1 and len(draft.transformer.h) == 1
    assert draft.transformer.h[0] is target.transformer.h[0] and draft.lm_head is target.lm_head
    assert target.config.n_layer == 2 and len(target.transformer.h) == 2  # the target is untouched
    idx = tokens(9)
    with torch.no_grad():  # the draft is the target's first layer read out early
        h = target.transformer.wte(idx)
        h = target.transformer.h[0](h, rope=target.rotary(torch.arange(9)))
        torch.testing.assert_close(draft(idx), target.lm_head(target.transformer.ln_f(h)))
    for n in (0, 2):
        with pytest.raises(ValueError, match="1 <= n_layers < 2"):
            early_exit_draft(target, n)
