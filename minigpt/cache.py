"""A key/value cache for autoregressive decoding.

During decoding each new token attends to every earlier token. Their keys and values do not change, so we
store them instead of recomputing them. Speculative decoding adds two operations to the usual "append":

* ``crop(n)``        -- forget everything after the first ``n`` positions (roll back rejected drafts);
* ``compact(start, keep)`` -- of the positions appended at ``start..``, keep only ``keep`` (the accepted
  path of a token tree) and move them to be contiguous, so the cache again looks like a plain sequence.

Layout: one pre-allocated tensor for keys and one for values, each ``(n_layer, B, n_head, max_len, head_size)``.
Appending writes into it in place; nothing is re-allocated while decoding.

The model reads every cache through one interface, the same for this contiguous cache and for the paged batch of
:mod:`minigpt.paged`: ``begin(T, position_ids, attn_mask)`` before a pass that appends ``T`` tokens (where they sit,
what each may see: a :class:`Layout`), ``update(layer, k, v)`` in every layer, ``advance(T)`` after the last one.
"""
from __future__ import annotations

from typing import NamedTuple

import torch


class Layout(NamedTuple):
    """Where a pass's new tokens sit and what they may see, as a cache's ``begin`` answers it.

    positions: (T,) or (B, T) absolute positions of the new tokens, or None for consecutive ones from ``past``
    (the common case: a slice of the position table, and no reading of a tensor to check it);
    past: the first new position when ``positions`` is None;
    mask: bool, True where a new token may attend, over the keys ``update`` returns (cached, then new): (T, S),
    or (B, 1, T, S) for a paged batch; None when every key may be seen (a single new token) or, without a
    cache, for plain causal attention."""
    positions: torch.Tensor | None
    past: int
    mask: torch.Tensor | None

    def span(self, T: int) -> tuple[int, int]:
        """The first and last position of the new tokens."""
        if self.positions is None:
            return self.past, self.past + T - 1
        return int(self.positions.min()), int(self.positions.max())


def causal_layout(T: int, past: int, position_ids: torch.Tensor | None, attn_mask: torch.Tensor | None,
                  device, cached: bool = True) -> Layout:
    """The :class:`Layout` of ``T`` new tokens after ``past`` positions of one contiguous sequence (``cached``) or
    with no cache. position_ids: (T,) or None (consecutive); attn_mask: (T, T) bool among the new tokens or None
    (causal). Every new token sees every cached position."""
    if position_ids is not None and position_ids.shape != (T,):
        raise ValueError(f"position_ids must have shape ({T},), got {tuple(position_ids.shape)}")
    mask = None
    if attn_mask is not None:
        if attn_mask.shape != (T, T) or attn_mask.dtype != torch.bool:
            raise ValueError(f"attn_mask must be a bool ({T}, {T}) tensor, got {attn_mask.dtype} "
                             f"{tuple(attn_mask.shape)}")
        mask = attn_mask
    elif cached and T > 1:
        mask = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    if mask is not None and past > 0:
        # every new token sees every cached position: (T, past + T)
        mask = torch.cat([torch.ones(T, past, dtype=torch.bool, device=device), mask], dim=1)
    return Layout(position_ids, past, mask)


class KVCache:
    """Pre-allocated keys and values for every layer; ``length`` positions are valid."""

    def __init__(self, n_layer: int, n_head: int, head_size: int, max_len: int, batch_size: int = 1,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        shape = (n_layer, batch_size, n_head, max_len, head_size)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len
        self.length = 0  # number of valid positions, shared by all layers

    @classmethod
    def for_model(cls, model, batch_size: int = 1, max_len: int | None = None) -> "KVCache":
        """An empty cache shaped for ``model`` (a :class:`minigpt.model.GPT`), on its device and dtype."""
        cfg = model.config
        p = next(model.parameters())
        # with grouped-query attention only the key/value heads are cached (fewer than the query heads)
        return cls(cfg.n_layer, cfg.kv_heads, cfg.head_size, max_len or cfg.block_size,
                   batch_size, p.device, p.dtype)

    def __len__(self) -> int:
        return self.length

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def begin(self, T: int, position_ids: torch.Tensor | None = None,
              attn_mask: torch.Tensor | None = None) -> Layout:
        """Before a pass that appends ``T`` tokens: their :class:`Layout` (:func:`causal_layout`)."""
        return causal_layout(T, self.length, position_ids, attn_mask, self.k.device)

    def update(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k_new, v_new`` (B, n_head, T, head_size) after the valid positions of ``layer`` and
        return all keys and values so far, (B, n_head, length + T, head_size).

        ``length`` itself moves only in :meth:`advance`, once every layer has written its part."""
        T = k_new.shape[2]
        end = self.length + T
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: {self.length} cached + {T} new tokens > max_len {self.max_len}")
        self.k[layer, :, :, self.length:end] = k_new
        self.v[layer, :, :, self.length:end] = v_new
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, n: int) -> None:
        """Mark ``n`` more positions as valid (called by the model after a forward pass)."""
        self.length += n

    def crop(self, length: int) -> None:
        """Keep only the first ``length`` positions: the rollback after drafted tokens are rejected.

        Nothing is erased; later writes simply overwrite the stale entries."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length

    def compact(self, start: int, keep: torch.Tensor | list[int]) -> None:
        """Of the positions ``start, start+1, ...`` keep the offsets ``keep`` (ascending) and move them to
        ``start, start+1, ..., start+len(keep)-1``; the cache then ends there.

        Used after tree verification: the nodes of the accepted root-to-leaf path are scattered through the
        flattened tree, and the next step needs them as a contiguous sequence."""
        keep = torch.as_tensor(keep, dtype=torch.long, device=self.k.device)
        if not 0 <= start <= self.length:
            raise ValueError(f"compact: start {start} is outside the cache (length {self.length})")
        if keep.numel() and (keep.min() < 0 or start + keep.max() >= self.length):
            raise ValueError(f"compact: offsets {keep.tolist()} from {start} fall outside the cache "
                             f"(length {self.length})")
        if keep.numel() > 1 and not bool((keep[1:] > keep[:-1]).all()):
            raise ValueError("compact: offsets to keep must be strictly increasing")
        src = start + keep
        n = keep.numel()
        # index_select copies first, so overlapping source and destination ranges are safe.
        self.k[:, :, :, start:start + n] = self.k.index_select(3, src)
        self.v[:, :, :, start:start + n] = self.v.index_select(3, src)
        self.length = start + n

    def bytes_per_token(self) -> int:
        """Memory one cached position takes: 2 (K and V) x layers x batch x heads x head_size x bytes."""
        n_layer, B, n_head, _, hs = self.k.shape
        return 2 * n_layer * B * n_head * hs * self.k.element_size()
