"""The paged KV cache (minigpt.paged): the block pool, block tables (append, crop, compact, fork with copy on
write) and a forward pass through them, checked against the contiguous KVCache."""
from __future__ import annotations

import pytest
import torch

from minigpt.cache import KVCache
from minigpt.paged import BlockPool, PagedBatch, PagedSequence

from conftest import random_model


def small_pool(n_blocks=8, block_size=4, n_layer=2, heads=2, hs=3):
    return BlockPool(n_layer, heads, hs, n_blocks, block_size)


def write(seq: PagedSequence, values: list[float]) -> None:
    """Append positions whose keys and values are filled with ``values`` (one number per position)."""
    seq.reserve(len(values))
    slots = seq.slots(seq.length, seq.length + len(values))
    v = torch.tensor(values, dtype=torch.float)[:, None, None].expand(len(values), *seq.pool.k.shape[2:])
    seq.pool.k[:, slots] = v
    seq.pool.v[:, slots] = -v
    seq.advance(len(values))


def read(seq: PagedSequence) -> list[float]:
    slots = seq.slots(0, seq.length)
    k = seq.pool.k[0, slots, 0, 0]
    assert torch.equal(seq.pool.v[:, slots], -seq.pool.k[:, slots])
    return k.tolist()


def test_pool_alloc_release_and_refcounts():
    pool = small_pool(n_blocks=3)
    a, b, c = pool.alloc(), pool.alloc(), pool.alloc()
    assert sorted([a, b, c]) == [0, 1, 2] and pool.blocks_free == 0
    with pytest.raises(MemoryError, match="pool is full"):
        pool.alloc()
    pool.retain(b)
    pool.release(b)
    assert pool.blocks_free == 0          # still held once
    pool.release(b)
    assert pool.blocks_free == 1 and pool.alloc() == b
    pool.release(a)
    with pytest.raises(ValueError, match="already free"):
        pool.release(a)
    assert pool.bytes_per_block() == 2 * 2 * 4 * 2 * 3 * 4


def test_append_crop_frees_whole_blocks():
    pool = small_pool()
    s = PagedSequence(pool)
    write(s, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])            # 10 positions: 3 blocks of 4
    assert len(s.blocks) == 3 and pool.blocks_in_use == 3
    assert read(s) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    s.crop(5)                                              # rollback: positions 5.. forgotten, 1 block back
    assert read(s) == [1, 2, 3, 4, 5] and len(s.blocks) == 2 and pool.blocks_in_use == 2
    write(s, [60, 70])
    assert read(s) == [1, 2, 3, 4, 5, 60, 70]
    s.crop(4)
    assert len(s.blocks) == 1
    with pytest.raises(ValueError):
        s.crop(5)
    s.free()
    assert pool.blocks_in_use == 0 and s.length == 0


def test_compact_keeps_a_tree_path_across_blocks():
    pool = small_pool()
    s = PagedSequence(pool)
    write(s, [0, 1, 2])
    write(s, [10, 11, 12, 13, 14, 15, 16])                 # a flattened tree after position 3
    s.compact(3, [0, 2, 5, 6])
    assert read(s) == [0, 1, 2, 10, 12, 15, 16] and len(s.blocks) == 2
    c = KVCache(1, 1, 1, 16)                                # the contiguous cache agrees on the semantics
    c.k[0, 0, 0, :10, 0] = torch.tensor([0., 1, 2, 10, 11, 12, 13, 14, 15, 16])
    c.length = 10
    c.compact(3, [0, 2, 5, 6])
    assert c.k[0, 0, 0, :c.length, 0].tolist() == read(s)
    with pytest.raises(ValueError, match="increasing"):
        s.compact(3, [1, 0])
    with pytest.raises(ValueError, match="outside"):
        s.compact(3, [0, 9])


def test_fork_shares_blocks_and_copies_the_partly_filled_one_on_write():
    pool = small_pool()
    parent = PagedSequence(pool)
    write(parent, [1, 2, 3, 4, 5, 6])                      # block 0 full, block 1 half full
    child = parent.fork()
    assert child.blocks == parent.blocks and pool.blocks_in_use == 2
    assert all(pool.refs[b] == 2 for b in parent.blocks)
    write(child, [70])                                     # writes into the shared, partly filled block
    assert child.blocks[0] == parent.blocks[0]             # the full block stays shared
    assert child.blocks[1] != parent.blocks[1]             # the partly filled one was copied
    assert read(parent) == [1, 2, 3, 4, 5, 6] and read(child) == [1, 2, 3, 4, 5, 6, 70]
    write(parent, [80, 90, 100])
    assert read(parent) == [1, 2, 3, 4, 5, 6, 80, 90, 100] and read(child) == [1, 2, 3, 4, 5, 6, 70]
    child.crop(2)                                           # back inside the shared block, then write: copy it
    write(child, [30])
    assert read(child) == [1, 2, 30] and read(parent)[:4] == [1, 2, 3, 4]
    parent.free()
    child.free()
    assert pool.blocks_in_use == 0 and all(r == 0 for r in pool.refs)


def test_a_fork_at_a_block_boundary_copies_nothing():
    pool = small_pool()
    parent = PagedSequence(pool)
    write(parent, [1, 2, 3, 4])
    child = parent.fork()
    write(child, [5])
    assert child.blocks[0] == parent.blocks[0] and pool.blocks_in_use == 2
    parent.free()
    assert read(child) == [1, 2, 3, 4, 5]
    child.free()
    assert pool.blocks_in_use == 0


def test_compact_in_a_fork_does_not_touch_the_parent():
    pool = small_pool()
    parent = PagedSequence(pool)
    write(parent, [1, 2, 3, 4, 5, 6, 7])
    child = parent.fork()
    child.compact(2, [1, 4])
    assert read(child) == [1, 2, 4, 7] and read(parent) == [1, 2, 3, 4, 5, 6, 7]
    parent.free()
    child.free()
    assert pool.blocks_in_use == 0


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_paged_logits_equal_the_contiguous_cache(arch, block_size):
    """Three sequences of different lengths decoded in one batch through their tables give each sequence the
    logits it gets alone with a contiguous cache; then every block goes back."""
    model = random_model(3, **arch)
    pool = BlockPool.for_model(model, 40, block_size)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 97, (n,), generator=g) for n in (9, 17, 5)]
    tables = [PagedSequence(pool) for _ in seqs]
    with torch.no_grad():
        for t, s in zip(tables, seqs):                           # prefill each alone, all but 3 tokens
            model(s[None, :-3], cache=PagedBatch([t]))
        out = model(torch.stack([s[-3:] for s in seqs]), cache=PagedBatch(tables))   # then 3 each, together
        for b, s in enumerate(seqs):
            cache = KVCache.for_model(model)
            ref = torch.cat([model(s[None, :-3], cache=cache), model(s[None, -3:], cache=cache)], dim=1)[0]
            assert torch.allclose(out[b], ref[-3:], atol=1e-5), f"sequence {b}"
        assert [t.length for t in tables] == [9, 17, 5]
    for t in tables:
        t.free()
    assert pool.blocks_in_use == 0


def test_paged_tree_pass_equals_the_contiguous_cache():
    """A tree (its own mask and positions) for one sequence and a chain for another, in one paged pass."""
    model = random_model(4)
    pool = BlockPool.for_model(model, 20, 4)
    a, b = torch.arange(10, 21), torch.arange(30, 37)
    parents = [-1, 0, 0, 1]
    tree_mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    ta, tb = PagedSequence(pool), PagedSequence(pool)
    with torch.no_grad():
        model(a[None], cache=PagedBatch([ta]))
        model(b[None], cache=PagedBatch([tb]))
        nodes = torch.tensor([[5, 6, 7, 8], [40, 41, 42, 43]])
        pos = torch.tensor([[11, 12, 12, 13], [7, 8, 9, 10]])
        mask = torch.stack([tree_mask, torch.ones(4, 4, dtype=torch.bool).tril()])
        out = model(nodes, cache=PagedBatch([ta, tb]), position_ids=pos, attn_mask=mask)
        ca = KVCache.for_model(model)
        model(a[None], cache=ca)
        ref_a = model(nodes[:1], cache=ca, position_ids=pos[0], attn_mask=tree_mask)[0]
        ref_b = model(torch.cat([b, nodes[1]])[None])[0, -4:]
    assert torch.allclose(out[0], ref_a, atol=1e-5) and torch.allclose(out[1], ref_b, atol=1e-5)
    assert parents  # the tree the mask spells out


def test_paged_batch_errors():
    model = random_model(0)
    pool, other = BlockPool.for_model(model, 4, 4), BlockPool.for_model(model, 4, 4)
    with pytest.raises(ValueError, match="same block pool"):
        PagedBatch([PagedSequence(pool), PagedSequence(other)])
    with pytest.raises(ValueError, match="at least one"):
        PagedBatch([])
    with pytest.raises(ValueError, match="batch size"):
        model(torch.zeros(2, 3, dtype=torch.long), cache=PagedBatch([PagedSequence(pool)]))
    with pytest.raises(MemoryError, match="pool is full"):
        model(torch.zeros(1, 20, dtype=torch.long), cache=PagedBatch([PagedSequence(pool)]))
    with pytest.raises(ValueError, match="context"):
        s = PagedSequence(BlockPool.for_model(model, 40, 4))
        model(torch.zeros(1, 3, dtype=torch.long), cache=PagedBatch([s]), position_ids=torch.tensor([[62, 63, 64]]))
