"""The KV cache gives exactly the logits of recomputing from scratch: appending token by token or in chunks,
after rolling back (crop), and after keeping a subset of a block (compact)."""
from __future__ import annotations

import pytest
import torch

from conftest import random_model
from minigpt.cache import KVCache
from test_model import ancestor_mask, depths, path_to, tokens

ATOL = 1e-5


@torch.no_grad()
def scratch(model, seq: torch.Tensor) -> torch.Tensor:
    """Logits of the whole sequence (B, T) computed without a cache."""
    return model(seq)


@pytest.mark.parametrize("batch", [1, 3])
@torch.no_grad()
def test_token_by_token_equals_from_scratch(arch, batch):
    model = random_model(0, **arch)
    seq = tokens(30, batch=batch, seed=1)
    cache = KVCache.for_model(model, batch_size=batch)
    steps = [model(seq[:, t:t + 1], cache=cache)[:, 0] for t in range(seq.shape[1])]
    assert cache.length == 30
    torch.testing.assert_close(torch.stack(steps, 1), scratch(model, seq), atol=ATOL, rtol=0)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("chunks", [[5, 1, 7, 2, 9], [1, 20], [12, 12, 1, 1, 4]])
@torch.no_grad()
def test_chunks_equal_from_scratch(arch, batch, chunks):
    model = random_model(1, **arch)
    seq = tokens(sum(chunks), batch=batch, seed=2)
    cache = KVCache.for_model(model, batch_size=batch)
    out, t = [], 0
    for n in chunks:
        out.append(model(seq[:, t:t + n], cache=cache))
        t += n
    torch.testing.assert_close(torch.cat(out, 1), scratch(model, seq), atol=ATOL, rtol=0)


@pytest.mark.parametrize("batch", [1, 2])
@torch.no_grad()
def test_crop_then_append_different_tokens(arch, batch):
    """Roll back rejected drafts: crop to a shorter length, append other tokens, compare with scratch."""
    model = random_model(2, **arch)
    seq = tokens(25, batch=batch, seed=3)
    cache = KVCache.for_model(model, batch_size=batch)
    model(seq[:, :18], cache=cache)
    model(seq[:, 18:25], cache=cache)              # 7 "drafted" tokens
    cache.crop(20)                                  # keep 2 of them
    assert cache.length == 20 and len(cache) == 20
    other = (seq[:, 20:25] + 5) % 97                # different continuation, written over the stale entries
    got = model(other, cache=cache)
    want = scratch(model, torch.cat([seq[:, :20], other], 1))[:, 20:]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    cache.crop(0)                                   # crop everything, start again
    torch.testing.assert_close(model(seq[:, :4], cache=cache), scratch(model, seq[:, :4]), atol=ATOL, rtol=0)


PARENTS = [-1, 0, 0, 1, 1, 2, 3, 3, 6]  # a token tree hanging off the last cached token


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("leaf", [0, 4, 5, 8])
@torch.no_grad()
def test_compact_keeps_a_tree_path_and_decoding_continues(arch, batch, leaf):
    """Append a flattened tree (ancestor mask), keep one root-to-node path with compact, decode two more
    tokens, and compare with recomputing prefix + path + new tokens from scratch."""
    model = random_model(4, **arch)
    prefix = tokens(13, batch=batch, seed=5)
    tree = tokens(len(PARENTS), batch=batch, seed=6)
    cache = KVCache.for_model(model, batch_size=batch)
    model(prefix, cache=cache)
    start = cache.length
    model(tree, cache=cache, position_ids=start + torch.tensor(depths(PARENTS)), attn_mask=ancestor_mask(PARENTS))
    keep = path_to(PARENTS, leaf)
    cache.compact(start, keep)
    assert cache.length == start + len(keep)
    new = tokens(2, batch=batch, seed=7)
    got = torch.cat([model(new[:, :1], cache=cache), model(new[:, 1:], cache=cache)], 1)
    want = scratch(model, torch.cat([prefix, tree[:, keep], new], 1))[:, -2:]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@torch.no_grad()
def test_compact_with_an_arbitrary_mask_and_an_empty_keep(arch):
    """A block scored with an arbitrary mask, of which only positions that saw exactly the kept tokens stay
    meaningful; keeping none of them is a plain crop back to ``start``."""
    model = random_model(5, **arch)
    seq = tokens(20, seed=8)
    cache = KVCache.for_model(model)
    model(seq[:, :10], cache=cache)
    # new tokens 0, 3, 6 see only each other (and themselves); the others see arbitrary sets
    g = torch.Generator().manual_seed(9)
    mask = (torch.rand(8, 8, generator=g) < 0.5) | torch.eye(8, dtype=torch.bool)
    keep = [0, 3, 6]
    for i in keep:
        mask[i] = False
        for j in keep:
            if j <= i:
                mask[i, j] = True
    block = seq[:, 10:18]
    pos = torch.tensor([10, 0, 0, 11, 0, 0, 12, 0]) + torch.tensor([0, 30, 31, 0, 32, 33, 0, 34])
    model(block, cache=cache, position_ids=pos, attn_mask=mask)
    cache.compact(10, keep)
    got = model(seq[:, 18:20], cache=cache)
    want = scratch(model, torch.cat([seq[:, :10], block[:, keep], seq[:, 18:20]], 1))[:, -2:]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    cache.compact(10, [])
    assert cache.length == 10
    torch.testing.assert_close(model(seq[:, 10:12], cache=cache), scratch(model, seq[:, :12])[:, 10:], atol=ATOL,
                               rtol=0)


def test_compact_moves_keys_and_values():
    cache = KVCache(n_layer=2, n_head=1, head_size=1, max_len=10)
    vals = torch.arange(8.0).view(1, 1, 8, 1).expand(1, 1, 8, 1)
    for layer in range(2):
        cache.update(layer, vals + 100 * layer, -vals)
    cache.advance(8)
    cache.compact(3, [1, 2, 4])                      # positions 4, 5, 7 -> 3, 4, 5 (overlapping ranges)
    assert cache.length == 6
    assert cache.k[0, 0, 0, :6, 0].tolist() == [0, 1, 2, 4, 5, 7]
    assert cache.k[1, 0, 0, :6, 0].tolist() == [100, 101, 102, 104, 105, 107]
    assert cache.v[0, 0, 0, :6, 0].tolist() == [0, -1, -2, -4, -5, -7]
    cache.compact(2, [0, 1, 2, 3])                   # keeping everything from 2 on changes nothing
    assert cache.length == 6 and cache.k[0, 0, 0, :6, 0].tolist() == [0, 1, 2, 4, 5, 7]


def test_for_model_shapes_and_bytes_per_token(small_model):
    cache = KVCache.for_model(small_model, batch_size=2, max_len=40)
    assert cache.k.shape == cache.v.shape == (2, 2, 4, 40, 8)
    assert cache.max_len == 40 and cache.batch_size == 2 and cache.length == 0
    assert cache.bytes_per_token() == 2 * 2 * 2 * 4 * 8 * 4   # K and V, layers, batch, heads, head size, fp32
    assert KVCache.for_model(small_model).max_len == small_model.config.block_size


# ----- errors -----

def test_overflow(small_model):
    cache = KVCache.for_model(small_model, max_len=10)
    small_model(tokens(8), cache=cache)
    with pytest.raises(ValueError, match=r"KV cache overflow: 8 cached \+ 3 new tokens > max_len 10"):
        small_model(tokens(3), cache=cache)


@pytest.mark.parametrize("length", [-1, 6])
def test_crop_beyond_the_length(small_model, length):
    cache = KVCache.for_model(small_model)
    small_model(tokens(5), cache=cache)
    with pytest.raises(ValueError, match=f"cannot crop a cache of length 5 to {length}"):
        cache.crop(length)
    assert cache.length == 5


@pytest.mark.parametrize("start, keep, fragment", [
    (2, [0, 3], "fall outside the cache"),        # 2 + 3 = 5 is not a valid position of a length-5 cache
    (2, [-1, 1], "fall outside the cache"),
    (2, [2, 1], "strictly increasing"),
    (2, [1, 1], "strictly increasing"),
    (-1, [0], "outside the cache"),
    (6, [], "outside the cache"),
])
def test_bad_compact_offsets(small_model, start, keep, fragment):
    cache = KVCache.for_model(small_model)
    small_model(tokens(5), cache=cache)
    before = cache.k.clone()
    with pytest.raises(ValueError, match=fragment) as e:
        cache.compact(start, keep)
    assert "\n" not in str(e.value)
    assert cache.length == 5 and torch.equal(cache.k, before), "a refused compact must change nothing"
