"""A paged KV cache: fixed-size blocks from one pool, a block table per sequence, a free list.

:class:`~minigpt.cache.KVCache` gives each sequence one tensor as long as the context. That is simple and fast
for one sequence, and wasteful for many: a request that stops after 40 tokens still holds room for 256, and
a batch cannot admit a new request while the memory is reserved by sequences that will never use it. Serving
engines (vLLM's PagedAttention, Kwon et al. 2023, arXiv:2309.06180) cut the cache into blocks of
``block_size`` positions instead, handed out from one pool as sequences grow:

* :class:`BlockPool` owns the memory: keys and values of every layer for ``n_blocks * block_size`` slots, a
  free list, and a reference count per block;
* :class:`PagedSequence` is one sequence's block table: the blocks holding its positions, in order, and its
  length. Position ``p`` lives in slot ``blocks[p // block_size] * block_size + p % block_size``.

The operations speculative decoding needs are the contiguous cache's, done on the table:

* ``crop(n)``: roll back a rejected draft: forget positions ``n..``, and give whole blocks back to the pool;
* ``compact(start, keep)``: keep a token tree's accepted path, moved to be contiguous;
* ``fork()``: a second table over the same blocks (a shared prompt stored once). A block that more than one
  table holds is never written in place: the first table to write into it gets its own copy (copy on write),
  which for a fork at the end of a prompt is the last, partly filled block.

:class:`PagedBatch` is what a forward pass receives as its ``cache``: the tables of the ``B`` sequences decoded
together, each with its own length. The model writes each sequence's new keys and values into its blocks and
reads them back through the tables, padded to the longest sequence of the batch, with a mask that hides the
padding (:meth:`PagedBatch.begin`). Reading back copies the keys and values into one tensor (a gather); a
real paged-attention kernel reads the blocks where they are. Lesson 12 measures what that copy costs.
"""
from __future__ import annotations

import math

import torch

from .cache import Layout


class BlockPool:
    """Keys and values for ``n_blocks`` blocks of ``block_size`` positions, every layer, and the bookkeeping of
    which blocks are free. ``k`` and ``v``: (n_layer, n_blocks * block_size, n_kv_head, head_size)."""

    def __init__(self, n_layer: int, n_kv_head: int, head_size: int, n_blocks: int, block_size: int = 16,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        if n_blocks < 1 or block_size < 1:
            raise ValueError(f"a block pool needs n_blocks >= 1 and block_size >= 1, got {n_blocks} and {block_size}")
        shape = (n_layer, n_blocks * block_size, n_kv_head, head_size)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.n_blocks, self.block_size = n_blocks, block_size
        self.refs = [0] * n_blocks                   # how many tables hold each block
        self.free = list(range(n_blocks - 1, -1, -1))  # pop() hands out block 0 first

    @classmethod
    def for_model(cls, model, n_blocks: int, block_size: int = 16) -> "BlockPool":
        """An empty pool shaped for ``model`` (a :class:`minigpt.model.GPT`), on its device and dtype."""
        cfg = model.config
        p = next(model.parameters())
        return cls(cfg.n_layer, cfg.kv_heads, cfg.head_size, n_blocks, block_size, p.device, p.dtype)

    @property
    def blocks_free(self) -> int:
        return len(self.free)

    @property
    def blocks_in_use(self) -> int:
        return self.n_blocks - len(self.free)

    def bytes_per_block(self) -> int:
        """Memory of one block: 2 (K and V) x layers x block_size x heads x head_size x bytes."""
        n_layer, _, heads, hs = self.k.shape
        return 2 * n_layer * self.block_size * heads * hs * self.k.element_size()

    def alloc(self) -> int:
        if not self.free:
            raise MemoryError(f"the KV block pool is full: all {self.n_blocks} blocks of {self.block_size} "
                              f"positions are in use (make the pool larger or admit fewer sequences)")
        block = self.free.pop()
        self.refs[block] = 1
        return block

    def retain(self, block: int) -> None:
        if self.refs[block] < 1:
            raise ValueError(f"block {block} is free: a table cannot share it")
        self.refs[block] += 1

    def release(self, block: int) -> None:
        if self.refs[block] < 1:
            raise ValueError(f"block {block} is already free")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free.append(block)

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy the keys and values of slots ``src`` to slots ``dst``, every layer (source read first, so
        overlapping ranges are safe)."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]


class PagedSequence:
    """One sequence's KV cache as a block table over a :class:`BlockPool`; ``length`` positions are valid."""

    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.blocks: list[int] = []
        self.length = 0
        self._slots: torch.Tensor | None = None  # slot of every position the blocks hold, rebuilt when they change

    def __len__(self) -> int:
        return self.length

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.pool.block_size

    def slots(self, start: int, end: int) -> torch.Tensor:
        """Slot ids of positions ``start .. end - 1`` (LongTensor on the pool's device)."""
        if end > self.capacity:
            raise ValueError(f"positions up to {end - 1} are not in the table ({self.capacity} positions reserved)")
        if self._slots is None:
            bs = self.pool.block_size
            table = torch.tensor(self.blocks, dtype=torch.long)
            self._slots = (table[:, None] * bs + torch.arange(bs)).reshape(-1).to(self.pool.k.device)
        return self._slots[start:end]

    def reserve(self, n: int) -> None:
        """Make positions ``length .. length + n - 1`` writable: copy any shared block they fall in (copy on
        write), then take new blocks from the pool until they fit."""
        bs = self.pool.block_size
        for i in range(self.length // bs, min(len(self.blocks), math.ceil((self.length + n) / bs))):
            if self.pool.refs[self.blocks[i]] > 1:
                self._copy_on_write(i)
        while self.capacity < self.length + n:
            self.blocks.append(self.pool.alloc())
            self._slots = None

    def _copy_on_write(self, i: int) -> None:
        old, new = self.blocks[i], self.pool.alloc()
        bs = self.pool.block_size
        valid = min(bs, max(0, self.length - i * bs))  # positions of this block that hold something
        if valid:
            base = torch.arange(valid, device=self.pool.k.device)
            self.pool.copy_slots(old * bs + base, new * bs + base)
        self.pool.release(old)
        self.blocks[i] = new
        self._slots = None

    def advance(self, n: int) -> None:
        if self.length + n > self.capacity:
            raise ValueError(f"advance past the reserved blocks: {self.length} + {n} > {self.capacity}")
        self.length += n

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions and return every block after them to the pool."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a sequence of length {self.length} to {length}")
        self.length = length
        keep = math.ceil(length / self.pool.block_size)
        if keep < len(self.blocks):
            for block in self.blocks[keep:]:
                self.pool.release(block)
            del self.blocks[keep:]
            self._slots = None

    def compact(self, start: int, keep) -> None:
        """Of the positions ``start, start+1, ...`` keep the offsets ``keep`` (ascending), moved to ``start ..
        start + len(keep) - 1``; the sequence ends there (a tree's accepted path, as in KVCache.compact)."""
        keep = [int(k) for k in keep]
        if not 0 <= start <= self.length:
            raise ValueError(f"compact: start {start} is outside the sequence (length {self.length})")
        if keep and (min(keep) < 0 or start + max(keep) >= self.length):
            raise ValueError(f"compact: offsets {keep} from {start} fall outside the sequence (length {self.length})")
        if any(b <= a for a, b in zip(keep, keep[1:])):
            raise ValueError("compact: offsets to keep must be strictly increasing")
        if keep != list(range(len(keep))):  # anything to move?
            src = self.slots(start, self.length)[torch.tensor(keep)]
            for i in range(start // self.pool.block_size, len(self.blocks)):  # never move into a shared block
                if self.pool.refs[self.blocks[i]] > 1:
                    self._copy_on_write(i)
            self.pool.copy_slots(src, self.slots(start, start + len(keep)))
        self.crop(start + len(keep))

    def fork(self) -> "PagedSequence":
        """A new table over the same blocks and length; neither writes into a shared block in place."""
        child = PagedSequence(self.pool)
        child.blocks, child.length = list(self.blocks), self.length
        for block in child.blocks:
            self.pool.retain(block)
        return child

    def free(self) -> None:
        """Give every block back (a shared one only once no other table holds it)."""
        self.crop(0)


class PagedBatch:
    """The ``cache`` of one forward pass over ``B`` sequences, each with its own :class:`PagedSequence`.

    The model reads it through the interface of the contiguous cache (:mod:`minigpt.cache`): :meth:`begin` before
    its layers (it reserves room, fixes where the new tokens' keys go and builds the mask), :meth:`update` in every
    layer, and :meth:`advance` at the end."""

    def __init__(self, seqs):
        self.seqs = list(seqs)
        if not self.seqs:
            raise ValueError("a paged batch needs at least one sequence")
        pools = {id(s.pool) for s in self.seqs}
        if len(pools) != 1:
            raise ValueError("every sequence of a paged batch must use the same block pool")
        self.pool = self.seqs[0].pool
        self._write = self._read = None

    @property
    def batch_size(self) -> int:
        return len(self.seqs)

    @property
    def lengths(self) -> list[int]:
        return [s.length for s in self.seqs]

    def begin(self, T: int, position_ids: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None) -> Layout:
        """Prepare a pass that appends ``T`` tokens to every sequence. position_ids: (B, T), default each
        sequence's ``length .. length + T - 1``; attn_mask: (T, T) or (B, T, T) bool among the new tokens,
        default causal. Returns the :class:`~minigpt.cache.Layout`: positions (B, T) and a mask (B, 1, T, S)
        where S = longest length + T: what each new token may attend to among the keys :meth:`update` returns
        (its own sequence's cached positions and new tokens; the padding of shorter sequences never). When the
        sequences have one length and the new tokens are causal, the mask is (1, 1, T, S), the same for all,
        and None for one new token each (it would be all True)."""
        B, device = self.batch_size, self.pool.k.device
        lengths = torch.tensor(self.lengths, device=device)
        if position_ids is None:
            position_ids = lengths[:, None] + torch.arange(T, device=device)
        elif position_ids.shape != (B, T):
            raise ValueError(f"position_ids for a paged batch must have shape ({B}, {T}), got {tuple(position_ids.shape)}")
        if attn_mask is not None:
            if attn_mask.dim() == 2:
                attn_mask = attn_mask.expand(B, T, T)
            if attn_mask.shape != (B, T, T) or attn_mask.dtype != torch.bool:
                raise ValueError(f"attn_mask for a paged batch must be a bool ({T}, {T}) or ({B}, {T}, {T}) tensor, "
                                 f"got {attn_mask.dtype} {tuple(attn_mask.shape)}")
        for s in self.seqs:
            s.reserve(T)
        S = int(lengths.max()) + T
        # where each sequence's new tokens are written
        self._write = torch.cat([s.slots(s.length, s.length + T) for s in self.seqs])
        if int(lengths.min()) + T == S and (attn_mask is None or T == 1):
            # sequences of one length, causal among their new tokens (or one new token each): no padding to hide,
            # each reads exactly its own slots, and one mask serves all (none for a single new token)
            self._read = torch.stack([s.slots(0, S) for s in self.seqs])
            mask = None if T == 1 else torch.ones(T, S, dtype=torch.bool, device=device).tril(S - T)[None, None]
            return Layout(position_ids, 0, mask)
        if attn_mask is None:
            attn_mask = torch.ones(T, T, dtype=torch.bool, device=device).tril().expand(B, T, T)
        # which slots each sequence reads, padded to S with its own first slot (masked out below)
        reads = []
        for s in self.seqs:
            r = s.slots(0, s.length + T)
            reads.append(torch.cat([r, r[:1].expand(S - r.numel())]))
        self._read = torch.stack(reads)                                   # (B, S)
        key = torch.arange(S, device=device)
        cached = key[None, :] < lengths[:, None]                          # (B, S): an earlier position
        rel = key[None, :] - lengths[:, None]                             # (B, S): which new token, if any
        is_new = (rel >= 0) & (rel < T)
        among_new = attn_mask.gather(2, rel.clamp(0, T - 1)[:, None, :].expand(B, T, S))  # (B, T, S)
        mask = cached[:, None, :] | (is_new[:, None, :] & among_new)
        return Layout(position_ids, 0, mask[:, None])

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k_new, v_new`` (B, heads, T, head_size) into each sequence's blocks and return every
        sequence's keys and values read through its table, (B, heads, S, head_size)."""
        if self._write is None:
            raise RuntimeError("PagedBatch.begin() must be called before update()")
        B, H, T, hs = k_new.shape
        pool = self.pool
        pool.k[layer].index_copy_(0, self._write, k_new.transpose(1, 2).reshape(B * T, H, hs))
        pool.v[layer].index_copy_(0, self._write, v_new.transpose(1, 2).reshape(B * T, H, hs))
        S = self._read.shape[1]
        flat = self._read.reshape(-1)
        k = pool.k[layer].index_select(0, flat).view(B, S, H, hs).transpose(1, 2)
        v = pool.v[layer].index_select(0, flat).view(B, S, H, hs).transpose(1, 2)
        return k, v

    def advance(self, n: int) -> None:
        for s in self.seqs:
            s.advance(n)
        self._write = self._read = None
