"""A key/value cache for autoregressive decoding.

During decoding each new token attends to every earlier token. Their keys and values do not change, so we
store them instead of recomputing them. Speculative decoding adds two operations to the usual "append":

* ``crop(n)``        -- forget everything after the first ``n`` positions (roll back rejected drafts);
* ``compact(start, keep)`` -- of the positions appended at ``start..``, keep only ``keep`` (the accepted
  path of a token tree) and move them to be contiguous, so the cache again looks like a plain sequence.

Layout: one pre-allocated tensor for keys and one for values, each ``(n_layer, B, n_head, max_len, head_size)``.
Appending writes into it in place; nothing is re-allocated while decoding.
"""
from __future__ import annotations

import torch


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
