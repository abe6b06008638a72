"""The transformer's forward pass: shapes, causality, custom positions and masks (token trees), and errors."""
from __future__ import annotations

import pytest
import torch

from conftest import random_model
from minigpt.cache import KVCache
from minigpt.model import GPT, GPTConfig

ATOL = 1e-5


def tokens(n: int, batch: int = 1, seed: int = 0, vocab: int = 97) -> torch.Tensor:
    return torch.randint(vocab, (batch, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_logits_at_every_position_and_hidden_states(small_model):
    idx = tokens(10, batch=3)
    logits = small_model(idx)
    assert logits.shape == (3, 10, 97) and logits.dtype == torch.float32
    logits2, hidden = small_model(idx, return_hidden=True)
    assert hidden.shape == (3, 10, small_model.config.n_embd)
    torch.testing.assert_close(logits2, logits, atol=0, rtol=0)
    # the hidden states are what the (tied) output layer reads: after ln_f
    torch.testing.assert_close(small_model.lm_head(hidden), logits, atol=ATOL, rtol=0)
    assert small_model.lm_head.weight is small_model.transformer.wte.weight


@torch.no_grad()
def test_causal_each_position_ignores_the_future(arch):
    small_model = random_model(0, **arch)
    idx = tokens(20, batch=2, seed=1)
    full = small_model(idx)
    for t in (1, 7, 19):
        torch.testing.assert_close(small_model(idx[:, :t]), full[:, :t], atol=ATOL, rtol=0)
    changed = idx.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % 97
    torch.testing.assert_close(small_model(changed)[:, :12], full[:, :12], atol=ATOL, rtol=0)
    assert not torch.allclose(small_model(changed)[:, 12:], full[:, 12:], atol=1e-3)


@torch.no_grad()
def test_explicit_causal_mask_and_positions_equal_the_defaults(small_model):
    idx = tokens(9, seed=2)
    mask = torch.ones(9, 9, dtype=torch.bool).tril()
    out = small_model(idx, attn_mask=mask, position_ids=torch.arange(9))
    torch.testing.assert_close(out, small_model(idx), atol=ATOL, rtol=0)
    # shifting the positions changes the answer: position_ids is really used
    assert not torch.allclose(small_model(idx, position_ids=torch.arange(3, 12)), out, atol=1e-3)


def test_num_params_counts_the_tied_matrix_once():
    model = GPT(GPTConfig(vocab_size=97, block_size=64, n_layer=2, n_head=4, n_embd=32))
    unique = {id(p): p.numel() for p in model.parameters()}
    assert model.num_params() == sum(unique.values())
    assert model.num_params(non_embedding=True) == model.num_params() - 97 * 32 - 64 * 32
    assert model.device == torch.device("cpu")


def test_config_rejects_heads_that_do_not_divide_the_width():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=30, n_head=4)


# ----- token trees: one pass over a flattened tree equals running every root-to-node path on its own -----

def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """(N, N) bool: node i may attend to node j iff j is i or one of i's ancestors (parents[i] < i, -1 = root)."""
    n = len(parents)
    mask = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            assert p < i, "nodes must come after their parents"
            mask[i] |= mask[p]
    return mask


def depths(parents: list[int]) -> list[int]:
    d: list[int] = []
    for p in parents:
        d.append(0 if p < 0 else d[p] + 1)
    return d


def path_to(parents: list[int], i: int) -> list[int]:
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


# two roots (the pending token and an alternative), branches of several depths, 10 nodes
PARENTS = [-1, -1, 0, 0, 1, 2, 2, 3, 5, 8]


def test_ancestor_mask_helper():
    mask = ancestor_mask(PARENTS)
    assert mask[9].nonzero().flatten().tolist() == [0, 2, 5, 8, 9]
    assert mask[4].nonzero().flatten().tolist() == [1, 4]
    assert depths(PARENTS) == [0, 0, 1, 1, 1, 2, 2, 2, 3, 4]


@pytest.mark.parametrize("batch", [1, 2])
@torch.no_grad()
def test_tree_pass_matches_each_path_from_scratch(arch, batch):
    model = random_model(3, **arch)
    prefix = tokens(11, batch=batch, seed=4)
    node_tokens = tokens(len(PARENTS), batch=batch, seed=5)
    cache = KVCache.for_model(model, batch_size=batch)
    model(prefix, cache=cache)
    positions = prefix.shape[1] + torch.tensor(depths(PARENTS))
    tree_logits = model(node_tokens, cache=cache, position_ids=positions, attn_mask=ancestor_mask(PARENTS))
    assert tree_logits.shape == (batch, len(PARENTS), 97)
    assert cache.length == prefix.shape[1] + len(PARENTS)
    for i in range(len(PARENTS)):
        seq = torch.cat([prefix, node_tokens[:, path_to(PARENTS, i)]], dim=1)
        torch.testing.assert_close(tree_logits[:, i], model(seq)[:, -1], atol=ATOL, rtol=0,
                                   msg=f"node {i} (path {path_to(PARENTS, i)})")


@torch.no_grad()
def test_tree_mask_without_a_cache(arch):
    """A tree scored from scratch (no prefix) matches its paths too: the mask also works without a cache."""
    model = random_model(6, **arch)
    node_tokens = tokens(len(PARENTS), seed=7)
    out = model(node_tokens, position_ids=torch.tensor(depths(PARENTS)), attn_mask=ancestor_mask(PARENTS))
    for i in range(len(PARENTS)):
        torch.testing.assert_close(out[0, i], model(node_tokens[:, path_to(PARENTS, i)])[0, -1], atol=ATOL, rtol=0)


# ----- errors: one ValueError whose message names the problem -----

@pytest.mark.parametrize("idx, fragment", [
    (torch.zeros(5, dtype=torch.long), "idx must be a (batch, time) tensor"),
    (torch.zeros(1, 2, 3, dtype=torch.long), "idx must be a (batch, time) tensor"),
    (torch.zeros(1, 5), "dtype torch.float32"),
    (torch.zeros(1, 0, dtype=torch.long), "no tokens"),
    (torch.zeros(1, 65, dtype=torch.long), "context is 64 tokens"),
])
def test_bad_inputs(small_model, idx, fragment):
    with pytest.raises(ValueError) as e:
        small_model(idx)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_too_long_after_the_cache(small_model):
    cache = KVCache.for_model(small_model)
    small_model(tokens(60), cache=cache)
    with pytest.raises(ValueError, match="sequence too long.*context is 64 tokens"):
        small_model(tokens(5), cache=cache)
    assert cache.length == 60, "a refused call must leave the cache as it was"


@pytest.mark.parametrize("mask", [torch.ones(4, 5, dtype=torch.bool), torch.ones(5, dtype=torch.bool),
                                  torch.ones(5, 5)])
def test_bad_attn_mask(small_model, mask):
    with pytest.raises(ValueError, match=r"attn_mask must be a bool \(5, 5\) tensor"):
        small_model(tokens(5), attn_mask=mask)


@pytest.mark.parametrize("pos", [torch.arange(4), torch.arange(6), torch.arange(5)[None]])
def test_bad_position_ids(small_model, pos):
    with pytest.raises(ValueError, match=r"position_ids must have shape \(5,\)"):
        small_model(tokens(5), position_ids=pos)


def test_position_beyond_the_context(small_model):
    with pytest.raises(ValueError, match="positions up to 64 but the model's context is 64 tokens"):
        small_model(tokens(5), position_ids=torch.tensor([0, 1, 2, 3, 64]))
    with pytest.raises(ValueError, match="position_ids must be >= 0, got -1"):
        small_model(tokens(5), position_ids=torch.tensor([-1, 0, 1, 2, 3]))


def test_cache_batch_size_must_match(small_model):
    cache = KVCache.for_model(small_model, batch_size=2)
    with pytest.raises(ValueError, match="cache holds batch size 2 but idx has batch size 3"):
        small_model(tokens(4, batch=3), cache=cache)
