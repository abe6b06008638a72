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
from .model import GPT, MLP, Block, CausalSelfAttention, make_norm
from .quant import dense_weight

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

    def target_features(self, idx: torch.Tensor, **kwargs) -> torch.Tensor:
        """What the head reads from the target at every position of ``idx`` (B, T): its final hidden states."""
        return self.target.hidden_states(idx, **kwargs)

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
        if self.vocab_subset is None:
            return self.target.lm_head(features)
        return F.linear(features, self.readout_weight())

    def readout_weight(self) -> torch.Tensor:
        """The subset's rows of the target's output layer, in fp32. They are copied out of the target's matrix
        once and kept (gathering 8192 of SmolLM2's 49152 rows on every draft step would cost more than the
        product itself); the copy is made again only if the target's output layer changes (another layer, a new
        tensor, another device or dtype, or an in-place update). When the target runs at reduced precision
        (:mod:`minigpt.precision`) its output layer keeps no fp32 matrix: the rows are read back through its
        kernel (:func:`minigpt.quant.dense_weight`). The output layer is frozen, so the copy carries no
        gradient."""
        layer = self.target.lm_head
        w = layer.weight if isinstance(layer, nn.Linear) else None
        key = (id(layer), self.vocab_subset.data_ptr()) + \
            (() if w is None else (w.data_ptr(), w._version, w.device, w.dtype))
        if self.__dict__.get("_rows_key") != key:
            rows = w.detach() if w is not None else dense_weight(layer).to(self.vocab_subset.device)
            self.__dict__["_rows"] = rows[self.vocab_subset].clone()
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


def read_head(path: Path, what: str, hint: str, build):
    """``build(checkpoint)`` on the file at ``path`` (loaded with ``weights_only``), any failure turned into one
    :class:`CheckpointError` line naming ``what`` (``hint``: how to make the file when it is missing)."""
    if not path.is_file():
        raise CheckpointError(f"{what} not found: {path} ({hint})")
    try:
        return build(torch.load(path, map_location="cpu", weights_only=True))
    except CheckpointError as e:
        raise CheckpointError(f"cannot load the {what} from {path}: {e}") from None
    except Exception as e:
        raise CheckpointError(f"cannot load the {what} from {path}: {str(e).splitlines()[0]}") from None


def load_eagle(target: GPT, path: Path | str = EAGLE_CHECKPOINT) -> EagleHead:
    """The EAGLE head saved at ``path`` for ``target`` (default: the one shipped for the shipped target)."""
    def build(ck):
        if ck.get("kind") == EAGLE3_KIND:
            raise CheckpointError("this is an EAGLE-3 head: load it with load_eagle3")
        if (ck["n_embd"], ck["vocab_size"]) != (target.config.n_embd, target.config.vocab_size):
            raise CheckpointError(f"the head is for width {ck['n_embd']} / vocabulary {ck['vocab_size']}, not this "
                                  f"target's {target.config.n_embd} / {target.config.vocab_size}")
        head = EagleHead(target, ck.get("vocab_subset"))
        head.load_state_dict(ck["head"])
        return head
    head = read_head(Path(path), "EAGLE head", "train one with `python -m minigpt.training.train_eagle`", build)
    return head.to(target.device).eval()


# ---------------------------------------------------------------------------------------------------- EAGLE-3

EAGLE3_KIND = "eagle3"


def default_feature_layers(n_layer: int) -> tuple[int, int, int]:
    """A low, a middle and a high block of an ``n_layer``-block target (0-based; their outputs are read): after
    layers 2, n/2 and n - 2 (SmolLM2's 30: blocks 1, 14, 27)."""
    return min(1, n_layer - 1), max(n_layer // 2 - 1, 0), max(n_layer - 3, 0)


class Eagle3Head(nn.Module):
    """EAGLE-3's draft head (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models
    via Training-Time Test", arXiv:2503.01840): it predicts tokens, not features.

    Entry t reads the target's low, middle and high layers at position t (``feature_layers``, each normalised, then
    fused into one vector g_t by a linear layer) and the embedding of the token x_{t+1}. One transformer layer --
    its attention fed both, normalised and mixed, its residual stream started from g_t -- outputs a vector h_t,
    and a read-out over ``vocab_subset`` (frequency-ranked tokens, FR-Spec; its rows start as the target's output
    layer's and are trained) gives x_{t+2}. Deeper in a draft, the head reads its own h in place of g: the
    forward pass takes either (width ``len(feature_layers) * C``: the target's, fused; width C: the head's own).
    Training feeds it its own h for several steps (training-time test), so that is what it learns to read.

    The token embedding is the target's, shared and frozen; so is the target (not a submodule)."""

    def __init__(self, target: GPT, vocab_subset: torch.Tensor | None = None, feature_layers=None):
        super().__init__()
        C = target.config.n_embd
        self.feature_layers = tuple(feature_layers or default_feature_layers(target.config.n_layer))
        self.config = replace(target.config, n_layer=1, dropout=0.0)
        self.in_norms = nn.ModuleList([make_norm(self.config) for _ in self.feature_layers])
        self.fuse = nn.Linear(len(self.feature_layers) * C, C, bias=False)
        with torch.no_grad():  # start as "the highest layer's feature", normalised
            self.fuse.weight.zero_()
            self.fuse.weight[:, -C:] = torch.eye(C)
        self.ln_emb, self.ln_feat = make_norm(self.config), make_norm(self.config)
        self.mix = nn.Linear(2 * C, C, bias=False)          # the attention's input: (embedding, feature) -> C
        self.attn = CausalSelfAttention(self.config)
        self.ln_2, self.mlp = make_norm(self.config), MLP(self.config)
        self.ln_out = make_norm(self.config)
        self.__dict__["target"] = target
        self.register_buffer("vocab_subset", None if vocab_subset is None else vocab_subset.long(), persistent=False)
        rows = target.lm_head.weight.detach()
        self.readout = nn.Linear(C, len(rows) if vocab_subset is None else len(vocab_subset), bias=False)
        with torch.no_grad():
            self.readout.weight.copy_(rows if vocab_subset is None else rows[vocab_subset.long()])
            self.ln_out.load_state_dict(target.transformer.ln_f.state_dict())
        self.to(device=target.device, dtype=rows.dtype)

    def new_cache(self, max_len: int | None = None) -> KVCache:
        """An empty one-layer KV cache for the head."""
        return KVCache.for_model(self, max_len=max_len)

    def target_features(self, idx: torch.Tensor, **kwargs) -> torch.Tensor:
        """The target's ``feature_layers`` at every position of ``idx`` (B, T), side by side: (B, T, layers * C)."""
        _, states = self.target.layer_states(idx, self.feature_layers, **kwargs)
        return torch.cat(states, dim=-1)

    def fused(self, features: torch.Tensor) -> torch.Tensor:
        """g: the target's layers fused (input width layers * C), or the head's own vectors as they are (width C)."""
        C = self.config.n_embd
        if features.shape[-1] == C:
            return features
        if features.shape[-1] != len(self.feature_layers) * C:
            raise ValueError(f"features must be {len(self.feature_layers)} x {C} (the target's layers) or {C} wide "
                             f"(the head's own), got {features.shape[-1]}")
        parts = features.split(C, dim=-1)
        return self.fuse(torch.cat([norm(p) for norm, p in zip(self.in_norms, parts)], dim=-1))

    def step(self, features: torch.Tensor, tokens: torch.Tensor, position_ids: torch.Tensor,
             attn_mask: torch.Tensor | None = None, cache: KVCache | None = None, earlier=()):
        """The layer on entries (features (B, T, *), tokens (B, T)) at ``position_ids`` (T,). Keys: the ``cache``'s
        and/or ``earlier`` ((k, v) pairs of earlier passes, in order), then the new ones; ``attn_mask`` (T, keys)
        bool (None: causal among the new ones, after all earlier keys). Returns (h (B, T, C), the new (k, v))."""
        g = self.fused(features)
        x = self.mix(torch.cat([self.ln_emb(self.target.transformer.wte(tokens)), self.ln_feat(g)], dim=-1))
        if "wpe" in self.target.transformer:  # learned positions, as the target adds them
            x = x + self.target.transformer.wpe(position_ids)
        q, k_new, v_new = self.attn.qkv(x, self.target.rotary(position_ids))
        k, v = (k_new, v_new) if cache is None else cache.update(0, k_new, v_new)
        if earlier:
            k = torch.cat([*(e[0] for e in earlier), k], dim=2)
            v = torch.cat([*(e[1] for e in earlier), v], dim=2)
        T, S = q.shape[2], k.shape[2]
        if attn_mask is None and T > 1:
            attn_mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
        rep = self.attn.n_head // self.attn.n_kv_head
        if rep > 1:  # grouped-query attention
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        B = x.shape[0]
        h = g + self.attn.c_proj(y.transpose(1, 2).reshape(B, T, -1))
        if cache is not None:
            cache.advance(T)
        return h + self.mlp(self.ln_2(h)), (k_new, v_new)

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, cache: KVCache | None = None,
                position_ids: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """features (B, T, layers * C) or (B, T, C); tokens (B, T): x_{t+1}; returns h (B, T, C), read out by
        :meth:`logits`. position_ids (T,): default after the cache; attn_mask (T, cached + T) bool: as
        :class:`EagleHead`'s (the proposer :class:`minigpt.decoding.eagle.Eagle` drives both alike)."""
        past = cache.length if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + tokens.shape[1], device=tokens.device)
        return self.step(features, tokens, position_ids, attn_mask, cache)[0]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(..., len(vocab_subset)) logits (entry i is token ``vocab_subset[i]``; all tokens without a subset)."""
        return self.readout(self.ln_out(h))

    def token_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Token ids of read-out indices (the identity without a subset)."""
        return index if self.vocab_subset is None else self.vocab_subset[index]


def save_eagle3(head: Eagle3Head, path: Path, dtype: torch.dtype | None = None, **extra) -> None:
    """Save the head's own weights (read-out included; in ``dtype`` if given, e.g. bfloat16 to ship: they load
    back in the target's), its layers and its subset, and ``extra`` (a card, a training state)."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    subset = None if head.vocab_subset is None else head.vocab_subset.cpu()
    state = {k: v.to(dtype) if dtype is not None and v.is_floating_point() else v
             for k, v in head.state_dict().items()}
    torch.save({"kind": EAGLE3_KIND, "n_embd": head.config.n_embd, "vocab_size": head.config.vocab_size,
                "target_layers": head.target.config.n_layer, "feature_layers": list(head.feature_layers),
                "head": state, "vocab_subset": subset, **extra}, tmp)
    tmp.replace(path)


def load_eagle3(target: GPT, path: Path | str) -> Eagle3Head:
    """The EAGLE-3 head saved at ``path`` for ``target`` (loaded with ``weights_only``), in eval mode."""
    def build(ck):
        if ck.get("kind") != EAGLE3_KIND:
            raise CheckpointError("not an EAGLE-3 head (an EAGLE head loads with load_eagle)")
        want = (target.config.n_embd, target.config.vocab_size, target.config.n_layer)
        if (ck["n_embd"], ck["vocab_size"], ck["target_layers"]) != want:
            raise CheckpointError(f"the head is for width / vocabulary / layers {ck['n_embd']} / {ck['vocab_size']} / "
                                  f"{ck['target_layers']}, not this target's {want[0]} / {want[1]} / {want[2]}")
        head = Eagle3Head(target, ck.get("vocab_subset"), ck["feature_layers"])
        head.load_state_dict(ck["head"])
        return head
    head = read_head(Path(path), "EAGLE-3 head", "train one with `python -m minigpt.real train-eagle3`", build)
    return head.to(target.device).eval()
