"""A GPT-2-style transformer, written to be read top to bottom.

The architecture is GPT-2's: token + learned position embeddings, a stack of pre-LayerNorm blocks
(causal self-attention, then a GELU MLP, each wrapped in a residual connection), a final LayerNorm and an
output projection that shares its weights with the token embedding. Parameter names follow GPT-2
(``wte``, ``wpe``, ``c_attn``, ``c_proj``, ``c_fc``, ``ln_f``) so the weights map one to one onto other
GPT-2 implementations.

Two things go beyond a training-only GPT, because speculative decoding needs them:

* ``forward`` returns logits at **every** position of the input, since verification scores all drafted
  tokens in one pass, and can also return the final hidden states (Medusa heads read them);
* new tokens may come with their own ``position_ids`` and an ``attn_mask`` among themselves, so a whole
  flattened tree of candidates (each node seeing only the cached prefix and its own ancestors) is scored
  in one pass. A :class:`~minigpt.cache.KVCache` holds the keys and values of earlier positions.

A few config switches turn the same code into a Llama-family model (Lesson 09 loads SmolLM2-135M into it):
RMSNorm instead of LayerNorm, rotary positions (RoPE, computed from the explicit position ids, so trees
still work) instead of a position table, a SwiGLU MLP, grouped-query attention (fewer key/value heads than
query heads, so a smaller KV cache) and no biases. The defaults are GPT-2 and the GPT-2 path is unchanged.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cache import KVCache, causal_layout
from .paged import PagedBatch


@dataclass
class GPTConfig:
    vocab_size: int = 4096
    block_size: int = 256   # longest sequence (prompt + generated) the position table covers
    n_layer: int = 6
    n_head: int = 8
    n_embd: int = 256
    dropout: float = 0.0
    # Switches for the Llama family (SmolLM2, Llama, Mistral, ...). The defaults are GPT-2.
    norm: str = "layernorm"          # "rmsnorm": scale by 1/RMS, no mean subtraction, no bias
    norm_eps: float = 1e-5
    pos: str = "learned"             # "rope": rotary positions inside attention, no position table
    rope_base: float = 10000.0
    mlp: str = "gelu"                # "swiglu": silu(gate(x)) * up(x), then down
    mlp_hidden: int | None = None    # width of the MLP's hidden layer; default 4 * n_embd
    n_kv_head: int | None = None     # grouped-query attention: fewer key/value heads; default n_head
    bias: bool = True                # biases in the linear layers (and LayerNorm)

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        for name, value, allowed in (("norm", self.norm, ("layernorm", "rmsnorm")),
                                     ("pos", self.pos, ("learned", "rope")), ("mlp", self.mlp, ("gelu", "swiglu"))):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {', '.join(allowed)}")
        if self.n_head % self.kv_heads:
            raise ValueError(f"n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}")
        if self.pos == "rope" and self.head_size % 2:
            raise ValueError(f"rotary positions need an even head size, got {self.head_size}")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def hidden(self) -> int:
        return self.mlp_hidden or 4 * self.n_embd

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (Llama): x / sqrt(mean(x^2) + eps) * weight. Unlike LayerNorm it does
    not subtract the mean and has no bias: one reduction instead of two."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.n_embd, config.norm_eps)
    return nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)


def rotary_angles(position_ids: torch.Tensor, head_size: int, base: float,
                  dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, each (T, head_size / 2) (or (B, T, head_size / 2) for (B, T) positions):
    pair i of a token at position p turns by ``p * base**(-2i / head_size)``. Computed once per forward pass and
    shared by every layer."""
    inv_freq = base ** (-torch.arange(0, head_size, 2, device=position_ids.device, dtype=torch.float32) / head_size)
    angles = position_ids.to(torch.float32)[..., None] * inv_freq  # (..., T, head_size / 2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn the adjacent pairs (x[2i], x[2i+1]) of every head of x (B, heads, T, head_size) by the angles
    whose cos and sin (T, head_size / 2) are given."""
    x1, x2 = x[..., 0::2], x[..., 1::2]                                                       # the two coordinates
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def rotate(x: torch.Tensor, position_ids: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary position embedding (RoPE, Su et al. 2021) of queries or keys x: (B, heads, T, head_size).

    Split each head's vector into adjacent pairs (x[2i], x[2i+1]) and turn pair i, as a point in the plane,
    by the angle ``position * base**(-2i / head_size)``. The dot product of a query turned for position m
    with a key turned for position n then depends on m - n only, so attention sees relative positions.
    The angles come from ``position_ids``, not from the token's index in the input: a flattened token tree
    gives its siblings the same position, exactly as each would have in its own sequence."""
    return apply_rotary(x, *rotary_angles(position_ids, x.shape[-1], base, x.dtype))


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_size = config.n_head, config.kv_heads, config.head_size
        self.rotary = config.pos == "rope"
        # q for every head, k and v for every key/value head, in one matmul
        self.c_attn = nn.Linear(config.n_embd, (self.n_head + 2 * self.n_kv_head) * self.head_size, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout

    def qkv(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None):
        """The new tokens' queries (B, n_head, T, hs), keys and values (B, n_kv_head, T, hs), rotated if the model
        uses rotary positions."""
        B, T, C = x.shape
        hs = self.head_size
        q, k, v = self.c_attn(x).split([self.n_head * hs, self.n_kv_head * hs, self.n_kv_head * hs], dim=2)
        # (B, T, heads * hs) -> (B, heads, T, hs): each head attends independently
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, hs).transpose(1, 2)
        if self.rotary:
            if rope is None:
                raise ValueError("this model uses rotary positions: pass rope=model.rotary(position_ids)")
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        return q, k, v

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                cache: KVCache | None = None, layer: int = 0,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x: (B, T, C). mask: None for plain causal attention, else a bool (T, S) matrix, True where a new
        token may attend, over the S = cached + T keys. rope: the (cos, sin) of :func:`rotary_angles` for the
        new tokens' positions, required by a model with rotary positions. Returns (B, T, C)."""
        B, T, C = x.shape
        q, k, v = self.qkv(x, rope)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, n_kv_head, S, hs), S = cached + T (keys already rotated)
        if self.n_kv_head != self.n_head:
            # grouped-query attention: each key/value head serves n_head // n_kv_head query heads
            k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        p = self.dropout if self.training else 0.0
        if mask is None:
            # Without a cache this is ordinary causal attention; with a cache and a single new token,
            # that token may see every key, so no mask is needed either.
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=(cache is None and T > 1))
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, n_head, T, hs) -> (B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.swiglu = config.mlp == "swiglu"
        # SwiGLU has two input projections (gate and up), computed as one matmul and split
        self.c_fc = nn.Linear(config.n_embd, (2 if self.swiglu else 1) * config.hidden, bias=config.bias)
        self.c_proj = nn.Linear(config.hidden, config.n_embd, bias=config.bias)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            gate, up = self.c_fc(x).chunk(2, dim=-1)
            return F.dropout(self.c_proj(F.silu(gate) * up), self.dropout, self.training)
        # GPT-2 uses the tanh approximation of GELU; we keep it so converted weights behave identically.
        return F.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")), self.dropout, self.training)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, mask=None, cache=None, layer=0, rope=None):
        x = x + self.attn(self.ln_1(x), mask, cache, layer, rope)
        return x + self.mlp(self.ln_2(x))


@contextmanager
def evaluating(model: nn.Module):
    """Run a block with ``model`` in eval mode and give it back in the mode it was in (training or not)."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@contextmanager
def frozen(model: nn.Module):
    """Run a block with ``model`` in eval mode and its parameters out of autograd (a frozen target under trained
    heads), then give both back as they were."""
    trainable = [p.requires_grad for p in model.parameters()]
    with evaluating(model):
        model.requires_grad_(False)
        try:
            yield model
        finally:
            for p, flag in zip(model.parameters(), trainable):
                p.requires_grad_(flag)


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=make_norm(config),
        ))
        if config.pos == "learned":  # with rotary positions, attention itself encodes where tokens are
            self.transformer["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied input/output embeddings
        self.apply(self._init_weights)
        # GPT-2: scale the projections that write into the residual stream by 1/sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @classmethod
    def sharing(cls, config: GPTConfig, transformer: nn.ModuleDict, lm_head: nn.Linear) -> GPT:
        """A GPT made of existing modules, shared, not copied (no new weights are made): the constructor of
        :func:`early_exit_draft`. ``config`` must describe them (its ``n_layer`` sizes the KV cache)."""
        model = cls.__new__(cls)   # skip __init__, which would make and initialise new weights
        nn.Module.__init__(model)
        model.config, model.transformer, model.lm_head = config, transformer, lm_head
        return model

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (the tied output matrix counted once); optionally without the embeddings."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= sum(self.transformer[e].weight.numel() for e in ("wte", "wpe") if e in self.transformer)
        return n

    def rotary(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The (cos, sin) of the rotary angles for these positions, which every block takes as ``rope``
        (None for a model with learned positions)."""
        if self.config.pos != "rope":
            return None
        cos, sin = rotary_angles(position_ids, self.config.head_size, self.config.rope_base,
                                 self.transformer.wte.weight.dtype)
        if position_ids.dim() == 2:  # a position per sequence of a batch: (B, 1, T, hs / 2) serves every head
            cos, sin = cos[:, None], sin[:, None]
        return cos, sin

    @property
    def device(self) -> torch.device:
        return self.transformer.wte.weight.device

    def forward(self, idx: torch.Tensor, cache: KVCache | PagedBatch | None = None,
                position_ids: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None,
                return_hidden: bool | tuple[int, ...] = False):
        """Score a batch of token sequences.

        idx:          (B, T) token ids, appended after the ``cache`` contents if a cache is given.
        position_ids: (T,) absolute positions of the new tokens; default ``cached, ..., cached + T - 1``.
                      A flattened tree passes ``cached + depth``.
        attn_mask:    (T, T) bool, True where new token i may attend to new token j; default causal.
                      Every new token always sees the whole cache.
        With a :class:`~minigpt.paged.PagedBatch` the B sequences have their own lengths: position_ids are
        (B, T) and attn_mask may be (B, T, T), one per sequence (see :meth:`PagedBatch.begin`).
        Returns logits (B, T, vocab_size) at every position, and with ``return_hidden`` the final hidden states
        (B, T, n_embd) after ``ln_f`` -- or, when ``return_hidden`` is a tuple of block numbers, those blocks'
        outputs side by side (B, T, len * n_embd): what an EAGLE-3 head reads (:meth:`features`).
        """
        if isinstance(return_hidden, bool):
            h = self.hidden_states(idx, cache, position_ids, attn_mask)
            logits = self.lm_head(h)  # (B, T, vocab_size)
            return (logits, h) if return_hidden else logits
        h, states = self.layer_states(idx, return_hidden, cache, position_ids, attn_mask)
        return self.lm_head(h), torch.cat(states, dim=-1)

    def features(self, idx: torch.Tensor, layers: bool | tuple[int, ...] = True, **kwargs) -> torch.Tensor:
        """What a drafting head reads at every position of ``idx`` without the output layer: the final hidden
        states (``layers`` True), or the outputs of the blocks numbered ``layers``, side by side."""
        if layers is True:
            return self.hidden_states(idx, **kwargs)
        _, states = self.layer_states(idx, layers, **kwargs)
        return torch.cat(states, dim=-1)

    def hidden_states(self, idx: torch.Tensor, cache: KVCache | PagedBatch | None = None,
                      position_ids: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`forward` without the output layer: the final hidden states (B, T, n_embd) after ``ln_f``.
        With a large vocabulary the output layer is the most expensive matmul of a small model, so code that
        needs no logits (a prefill keeps only keys and values) or logits at a few positions (training on
        answers only) skips it or applies ``lm_head`` to those positions alone."""
        if idx.dim() != 2 or idx.dtype not in (torch.long, torch.int):
            raise ValueError(f"idx must be a (batch, time) tensor of token ids, got shape {tuple(idx.shape)} "
                             f"and dtype {idx.dtype}")
        B, T = idx.shape
        if cache is not None and cache.batch_size != B:
            raise ValueError(f"cache holds batch size {cache.batch_size} but idx has batch size {B}")
        if T == 0:
            raise ValueError("idx holds no tokens")
        # the cache says where the new tokens sit and what each may see; the contiguous cache and the paged batch
        # answer alike (begin -> Layout), so nothing below asks which one it has
        layout = (cache.begin(T, position_ids, attn_mask) if cache is not None
                  else causal_layout(T, 0, position_ids, attn_mask, idx.device, cached=False))
        self._check_positions(*layout.span(T))
        return self._blocks(*self._embed(idx, layout.positions, layout.past), layout.mask, cache)

    @contextmanager
    def recording_layers(self, layers):
        """Within the ``with`` block, every pass of the model writes the outputs of the blocks numbered ``layers``
        (0-based: the residual stream after block i, (B, T, n_embd)) into the list it yields, in the order of
        ``layers`` (EAGLE-3 reads a low, a middle and a high layer). Forward hooks: the pass itself is unchanged."""
        if any(not 0 <= i < self.config.n_layer for i in layers):
            raise ValueError(f"layers must be in [0, {self.config.n_layer - 1}], got {list(layers)}")
        states: list[torch.Tensor | None] = [None] * len(layers)
        hooks = [self.transformer.h[i].register_forward_hook(
            lambda module, args, out, slot=slot: states.__setitem__(slot, out)) for slot, i in enumerate(layers)]
        try:
            yield states
        finally:
            for h in hooks:
                h.remove()

    def layer_states(self, idx: torch.Tensor, layers, cache: KVCache | PagedBatch | None = None,
                     position_ids: torch.Tensor | None = None,
                     attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """:meth:`hidden_states`, and the outputs of the blocks numbered ``layers`` in the same pass
        (:meth:`recording_layers`)."""
        with self.recording_layers(layers) as states:
            final = self.hidden_states(idx, cache, position_ids, attn_mask)
        return final, states

    def _check_positions(self, first: int, last: int) -> None:
        if first < 0:
            raise ValueError(f"position_ids must be >= 0, got {first}")
        if last >= self.config.block_size:
            raise ValueError(f"sequence too long: positions up to {last} but the model's context "
                             f"is {self.config.block_size} tokens")

    def _embed(self, idx: torch.Tensor, position_ids: torch.Tensor | None, past: int = 0):
        """The token embeddings (B, T, C), with learned positions added, and the rotary angles for the blocks
        (None with learned positions). position_ids: (T,) or (B, T); None: ``past, past + 1, ...``."""
        T = idx.shape[1]
        x = self.transformer.wte(idx)  # (B, T, C)
        if "wpe" in self.transformer:  # learned positions: consecutive ones are a slice of the table
            wpe = self.transformer.wpe
            return x + (wpe.weight[past:past + T] if position_ids is None else wpe(position_ids)), None
        # rotary positions: the angles, once for all layers
        return x, self.rotary(torch.arange(past, past + T, device=idx.device) if position_ids is None
                              else position_ids)

    def _blocks(self, x: torch.Tensor, rope, mask, cache) -> torch.Tensor:
        """The layers after the embeddings, then the final norm; the cache learns that ``T`` positions were added."""
        x = F.dropout(x, self.config.dropout, self.training)  # a no-op when not training
        for i, block in enumerate(self.transformer.h):
            x = block(x, mask, cache, i, rope)
        if cache is not None:
            cache.advance(x.shape[1])
        return self.transformer.ln_f(x)


def early_exit_draft(model: GPT, n_layers: int) -> GPT:
    """Self-speculation: a draft made of ``model``'s embedding, its first ``n_layers`` blocks, its final norm
    and its output layer ("early exit"; LayerSkip, Elhoushi et al. 2024; Draft & Verify, Zhang et al. 2023,
    skip layers instead of truncating).

    Early layers already point roughly where the whole stack will go, so this draft needs no training, no
    extra weights and no separate tokenizer, and costs ``n_layers / n_layer`` of a target pass. Its modules
    are the target's (changing one changes the other), but it has its own config (``n_layer = n_layers``), so
    it gets its own, smaller KV cache and plugs into every chain or tree decoder as an ordinary draft.
    Verification by the full model keeps the output exact, however poor the guesses; how poor decides the speed."""
    total = model.config.n_layer
    if not 1 <= n_layers < total:
        raise ValueError(f"an early-exit draft needs 1 <= n_layers < {total} (the target's layers), got {n_layers}")
    transformer = nn.ModuleDict({name: (nn.ModuleList(list(m)[:n_layers]) if name == "h" else m)
                                 for name, m in model.transformer.items()})
    return GPT.sharing(replace(model.config, n_layer=n_layers), transformer, model.lm_head)
