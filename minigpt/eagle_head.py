"""EAGLE's draft head: the target drafts with its own features, one cheap layer ahead.

Li et al. 2024, EAGLE (arXiv:2401.15077) and EAGLE-2 (arXiv:2406.16858). Drafting tokens is hard; drafting the
target's *feature* -- its final hidden state, the vector its output layer reads -- is easier, because features
change smoothly and carry everything the target knows. The head at position t reads

    the target's feature f_t  and  the embedding of the token x_{t+1} that was sampled from it,

fuses them with one linear layer, runs one transformer layer over the sequence of such pairs (with its own
small KV cache), and predicts f_{t+1}. The target's frozen output layer turns the predicted feature into a
distribution over x_{t+2}. The token input resolves the uncertainty a feature alone leaves: f_t says what the
target *might* say next, x_{t+1} says what it *did* say.

Here: the head, its token read-out (over the whole vocabulary or over a frequency-ranked subset, which for a
large vocabulary is most of the head's cost), saving and loading. Training: :mod:`minigpt.training.train_eagle`;
drafting with it: :mod:`minigpt.decoding.eagle`.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cache import KVCache
from .checkpoint import PACKAGE_CHECKPOINTS, CheckpointError
from .model import GPT, Block

EAGLE_CHECKPOINT = PACKAGE_CHECKPOINTS / "eagle.pt"


class EagleHead(nn.Module):
    """One fused-input transformer layer that predicts the target's next final hidden state.

    The token embedding and the output layer are the target's own, shared and frozen (not part of the head's
    parameters or state dict). ``vocab_subset``: token ids the read-out is restricted to (None: all)."""

    def __init__(self, target: GPT, vocab_subset: torch.Tensor | None = None):
        super().__init__()
        C = target.config.n_embd
        self.config = replace(target.config, n_layer=1, dropout=0.0)
        self.fuse = nn.Linear(2 * C, C)
        with torch.no_grad():  # start as "the next feature is this feature": the identity on f, nothing from x
            self.fuse.weight.zero_()
            self.fuse.weight[:, :C] = torch.eye(C)
            self.fuse.bias.zero_()
        self.block = Block(self.config)
        self.__dict__["target"] = target  # shared, deliberately not a submodule: its weights stay the target's
        self.register_buffer("vocab_subset", None if vocab_subset is None else vocab_subset.long(), persistent=False)
        self.to(target.device)

    def new_cache(self, max_len: int | None = None) -> KVCache:
        """An empty one-layer KV cache for the head."""
        return KVCache.for_model(self, max_len=max_len)

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, cache: KVCache | None = None,
                position_ids: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """features (B, T, C): f_t; tokens (B, T): x_{t+1}; returns the predicted f_{t+1} (B, T, C).

        position_ids (T,): the positions t (default: after the cache). attn_mask (T, cached + T) bool: which
        keys each new entry may see (default: all cached ones and the earlier new ones, causally)."""
        B, T, _ = features.shape
        past = cache.length if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + T, device=features.device)
        if attn_mask is None and T > 1:
            attn_mask = torch.ones(T, past + T, dtype=torch.bool, device=features.device).tril(past)
        x = self.fuse(torch.cat([features, self.target.transformer.wte(tokens)], dim=-1))
        if "wpe" in self.target.transformer:  # learned positions, as the target adds them
            x = x + self.target.transformer.wpe(position_ids)
        rope = self.target.rotary(position_ids)
        out = self.block(x, attn_mask, cache, 0, rope)
        if cache is not None:
            cache.advance(T)
        return out

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's output layer on predicted features: (..., V) logits, or (..., len(vocab_subset)) when a
        subset is set (entry i is token ``vocab_subset[i]``)."""
        return F.linear(features, self.readout_weight())

    def readout_weight(self) -> torch.Tensor:
        """The output layer's rows the head reads out: all of them, or the subset's. The subset's rows are
        copied out of the target's matrix once and kept (gathering 8192 of SmolLM2's 49152 rows on every draft
        step would cost more than the product itself); the copy is made again only if the target's weights
        change (a new tensor, another device or dtype, or an in-place update). The output layer is frozen, so
        the copy carries no gradient."""
        w = self.target.lm_head.weight
        if self.vocab_subset is None:
            return w
        key = (w.data_ptr(), w._version, w.device, w.dtype, self.vocab_subset.data_ptr())
        if self.__dict__.get("_rows_key") != key:
            self.__dict__["_rows"] = w.detach()[self.vocab_subset].clone()
            self.__dict__["_rows_key"] = key
        return self.__dict__["_rows"]

    def token_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Token ids of read-out indices (the identity without a subset)."""
        return index if self.vocab_subset is None else self.vocab_subset[index]


def frequency_subset(token_counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` most frequent token ids, most frequent first: a read-out that skips rare tokens. A drafted
    token is then always one of these; exactness is untouched, since verification never assumes the draft could
    propose every token (q is simply zero outside the subset)."""
    if not 0 < size <= token_counts.numel():
        raise ValueError(f"subset size must be in [1, {token_counts.numel()}], got {size}")
    return torch.argsort(token_counts, descending=True, stable=True)[:size]


def save_eagle(head: EagleHead, path: Path = EAGLE_CHECKPOINT, **extra) -> None:
    """Save the head's own weights (not the shared target's), its subset if any, and ``extra`` (e.g. a card)."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    subset = None if head.vocab_subset is None else head.vocab_subset.cpu()
    torch.save({"n_embd": head.config.n_embd, "vocab_size": head.config.vocab_size, "head": head.state_dict(),
                "vocab_subset": subset, **extra}, tmp)
    tmp.replace(path)


def load_eagle(target: GPT, path: Path | str = EAGLE_CHECKPOINT) -> EagleHead:
    """The EAGLE head saved at ``path`` for ``target`` (default: the one shipped for the shipped target)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"EAGLE head not found: {path} (train one with `python -m minigpt.training.train_eagle`)")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        if (ck["n_embd"], ck["vocab_size"]) != (target.config.n_embd, target.config.vocab_size):
            raise CheckpointError(f"the head is for width {ck['n_embd']} / vocabulary {ck['vocab_size']}, not this "
                                  f"target's {target.config.n_embd} / {target.config.vocab_size}")
        head = EagleHead(target, ck.get("vocab_subset"))
        head.load_state_dict(ck["head"])
    except CheckpointError as e:
        raise CheckpointError(f"cannot load the EAGLE head from {path}: {e}") from None
    except Exception as e:
        raise CheckpointError(f"cannot load the EAGLE head from {path}: {str(e).splitlines()[0]}") from None
    return head.to(target.device).eval()
