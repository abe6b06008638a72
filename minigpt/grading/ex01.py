"""Checks for exercise 01: causal self-attention with a KV cache, and cropping the cache.

Shapes follow minigpt's attention: queries, keys and values are (B, n_head, T, head_size); a cache holds
(B, n_head, S, head_size) for the S positions already processed. The references are PyTorch's
``scaled_dot_product_attention`` with an explicit mask and minigpt's own ``CausalSelfAttention`` + ``KVCache``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..cache import KVCache
from ..model import CausalSelfAttention, GPTConfig
from .core import Exercise, Mismatch, expect_close, expect_tensor
from .helpers import call_unchanged, pick_hint

NOTEBOOK = "ex01_kv_attention.ipynb"


def _reference_attention(q, k_new, v_new, k_cache, v_cache):
    k = torch.cat([k_cache, k_new], dim=2)
    v = torch.cat([v_cache, v_new], dim=2)
    S, T = k_cache.shape[2], q.shape[2]
    # new token i (absolute position S + i) sees every cached key and the new keys 0..i
    mask = torch.ones(T, S + T, dtype=torch.bool).tril(diagonal=S)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), k, v


def _inputs(B, H, S, T, D, seed):
    g = torch.Generator().manual_seed(seed)
    q, k_new, v_new = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    k_cache, v_cache = (torch.randn(B, H, S, D, generator=g) for _ in range(2))
    return q, k_new, v_new, k_cache, v_cache


def _unpack(ret, what: str, n: int):
    if not isinstance(ret, (tuple, list)) or len(ret) != n:
        got = f"a {type(ret).__name__}" + (f" of length {len(ret)}" if isinstance(ret, (tuple, list)) else "")
        raise Mismatch(f"a tuple {what}", got, f"return {what} as a tuple")
    return ret


def _variant(q, k_new, v_new, k_cache, v_cache, *, scale=None, mask="shifted", keys="all", softmax_dim=-1):
    """Attention with one known mistake, to recognise which one a wrong answer made."""
    k = torch.cat([k_cache, k_new], 2) if keys == "all" else k_new
    v = torch.cat([v_cache, v_new], 2) if keys == "all" else v_new
    T, L = q.shape[2], k.shape[2]
    scores = q @ k.transpose(-2, -1) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if mask == "shifted":
        allowed = torch.ones(T, L, dtype=torch.bool).tril(diagonal=L - T)
    elif mask == "top_left":
        allowed = torch.ones(T, L, dtype=torch.bool).tril()
    else:
        allowed = torch.ones(T, L, dtype=torch.bool)
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=softmax_dim) @ v


_ATTENTION_BUGS = [
    (dict(mask="none"), "new tokens see later new tokens: mask the scores with -inf where key j > S + i "
                        "(the causal mask)"),
    (dict(mask="top_left"), "the causal triangle is aligned to the top-left corner (tril of (T, S+T), or "
                            "is_causal=True): new token i sits at position S + i, so shift it by S columns "
                            "(tril(diagonal=S))"),
    (dict(scale="d"), "the scores are divided by head_size; the scale is 1/sqrt(head_size)"),
    (dict(scale=1.0), "the scores are not scaled: divide q K^T by sqrt(head_size)"),
    (dict(softmax_dim=-2), "the softmax runs over the queries (dim -2): normalise over the keys, the last dim"),
    (dict(keys="new"), "out attends over the new keys only: attend over the cache followed by the new keys"),
    (dict(keys="new", mask="none"), "out attends over the new keys only, without a mask: attend over the cache "
                                    "and the new keys, causally"),
]


def _diagnose(out, args) -> str | None:
    """The hint of the known mistake that reproduces ``out``, if one does."""
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        return None
    hints = []
    for kw, hint in _ATTENTION_BUGS:
        kw = dict(kw)
        if kw.get("scale") == "d":
            kw["scale"] = 1 / args[0].shape[-1]
        want = _variant(*args, **kw)
        if want.shape == out.shape and torch.allclose(out.detach().cpu().float(), want, atol=1e-5, rtol=1e-4):
            hints.append(hint)
    return pick_hint(hints)


def _compare_attention(fn, B, H, S, T, D, seed) -> str:
    args = _inputs(B, H, S, T, D, seed)
    ref_out, ref_k, ref_v = _reference_attention(*args)
    out, k_all, v_all = _unpack(fn(*[a.clone() for a in args]), "(out, k_all, v_all)", 3)
    try:
        expect_tensor("k_all", k_all, tuple(ref_k.shape))
        expect_tensor("v_all", v_all, tuple(ref_v.shape))
    except Mismatch as m:
        m.hint = ("k_all, v_all are the grown cache: the S cached positions followed by the T new ones, "
                  "concatenated on dim 2")
        raise
    try:
        diff = expect_close("out", out, ref_out)
    except Mismatch as m:
        m.hint = _diagnose(out, args) or m.hint
        raise
    return f"out {tuple(ref_out.shape)} matches scaled_dot_product_attention (max |diff| {diff:.1e})"


attend = Exercise("attend_with_cache", NOTEBOOK,
                  "append new keys/values to the cache and attend causally over cache + new tokens")


@attend.case("one new token, empty cache", 1,
             "with a single key, softmax gives weight 1: out should equal v_new")
def _one_token_empty(fn):
    return _compare_attention(fn, B=1, H=2, S=0, T=1, D=8, seed=11)


@attend.case("one new token after 7 cached positions", 1,
             "concatenate cache and new keys along the time axis (dim 2), scale scores by 1/sqrt(head_size)")
def _one_token_cached(fn):
    return _compare_attention(fn, B=2, H=4, S=7, T=1, D=16, seed=12)


@attend.case("prefill: 5 new tokens, empty cache (causal)", 2,
             "new token i must not see new tokens after it: mask scores with -inf above the diagonal")
def _prefill(fn):
    return _compare_attention(fn, B=2, H=3, S=0, T=5, D=8, seed=13)


@attend.case("4 new tokens after 6 cached positions", 2,
             "new token i sits at position S + i: it sees all S cached keys and new keys 0..i "
             "(a causal mask over the new tokens only, shifted by S columns)")
def _several_after_cache(fn):
    return _compare_attention(fn, B=1, H=4, S=6, T=4, D=16, seed=14)


@attend.case("returns the grown cache k_all, v_all = cache followed by the new keys/values", 1,
             "k_all = torch.cat([k_cache, k_new], dim=2), likewise for v")
def _returns_cache(fn):
    args = _inputs(2, 2, 3, 2, 4, seed=15)
    _, ref_k, ref_v = _reference_attention(*args)
    _, k_all, v_all = _unpack(fn(*[a.clone() for a in args]), "(out, k_all, v_all)", 3)
    expect_close("k_all", k_all, ref_k, atol=0, rtol=0)
    expect_close("v_all", v_all, ref_v, atol=0, rtol=0)
    return f"k_all, v_all {tuple(ref_k.shape)} = cache then new"


@attend.case("leaves its inputs unchanged (q, k_new, v_new and the cache)", 1,
             "compute new tensors (q @ k.transpose(-2, -1) / math.sqrt(d)); do not write into the inputs", side=True)
def _attend_unchanged(fn):
    args = _inputs(2, 2, 3, 4, 8, seed=17)
    call_unchanged(fn, args, ("q", "k_new", "v_new", "k_cache", "v_cache"))
    return "q, k_new, v_new, k_cache, v_cache unchanged"


@attend.case("decodes like minigpt's CausalSelfAttention + KVCache (5, then 1, then 3 tokens)", 2,
             "this case runs your function inside a real layer for three steps, feeding k_all, v_all back as "
             "the next cache; if a case above fails, its hint names the mistake")
def _like_minigpt(fn):
    cfg = GPTConfig(vocab_size=16, block_size=32, n_layer=1, n_head=4, n_embd=32)
    g = torch.Generator().manual_seed(16)
    attn = CausalSelfAttention(cfg).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    H, hs, C = cfg.n_head, cfg.n_embd // cfg.n_head, cfg.n_embd
    cache = KVCache(1, H, hs, 32)
    k_all, v_all = torch.zeros(1, H, 0, hs), torch.zeros(1, H, 0, hs)
    worst = 0.0
    with torch.no_grad():
        for step, T in enumerate((5, 1, 3)):
            x = torch.randn(1, T, C, generator=g)
            S = cache.length
            mask = None if T == 1 else torch.ones(T, S + T, dtype=torch.bool).tril(diagonal=S)  # as GPT.forward
            y_ref = attn(x, mask, cache, 0)
            cache.advance(T)
            q, k, v = (t.view(1, T, H, hs).transpose(1, 2) for t in attn.c_attn(x).split(C, dim=2))
            out, k_all, v_all = _unpack(fn(q, k, v, k_all, v_all), "(out, k_all, v_all)", 3)
            out = expect_tensor(f"out at step {step + 1}", out, (1, H, T, hs))
            expect_tensor(f"k_all at step {step + 1}", k_all, (1, H, S + T, hs))
            y = attn.c_proj(out.transpose(1, 2).reshape(1, T, C))
            worst = max(worst, expect_close(f"layer output at step {step + 1} (after c_proj)", y, y_ref))
    return f"3 steps match the minigpt layer (max |diff| {worst:.1e})"


crop = Exercise("crop_cache", NOTEBOOK, "keep only the first `length` positions of the cache")


def _crop_hint(got, k, length) -> str | None:
    """The hint of the known cropping mistake that gives ``got`` from the cache ``k``, if one does."""
    if not isinstance(got, torch.Tensor):
        return None
    S = k.shape[2]
    known = [(k, "the cache came back uncropped: keep only its first `length` positions"),
             (k[:, :, :length - 1], "one position too few: [:, :, :length] keeps positions 0..length-1"),
             (k[:, :, :length + 1], "one position too many: [:, :, :length] keeps exactly `length` positions"),
             (k[:, :, S - length:], "the last `length` positions were kept: the accepted prefix is at the start"),
             (k[..., :length], "the slice cut the head_size dimension (the last one): positions are dim 2")]
    return pick_hint([hint for want, hint in known
                      if tuple(got.shape) == tuple(want.shape) and torch.equal(got.detach().cpu(), want)])


def _crop_case(fn, S, length, seed):
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(2, 3, S, 4, generator=g), torch.randn(2, 3, S, 4, generator=g)
    k2, v2 = _unpack(fn(k.clone(), v.clone(), length), "(k, v)", 2)
    try:
        expect_tensor("cropped k", k2, (2, 3, length, 4))
        expect_tensor("cropped v", v2, (2, 3, length, 4))
        expect_close("cropped k", k2, k[:, :, :length], atol=0, rtol=0)
        expect_close("cropped v", v2, v[:, :, :length], atol=0, rtol=0)
    except Mismatch as m:
        m.hint = _crop_hint(k2, k, length) or m.hint
        raise
    return f"shape (2, 3, {length}, 4), the first {length} of {S} positions"


@crop.case("crop 10 positions to 6", 1,
           "positions live on dim 2 (B, n_head, S, head_size); keep indices 0..length-1, i.e. [:, :, :length]")
def _crop_middle(fn):
    return _crop_case(fn, 10, 6, seed=21)


@crop.case("crop to 0 (empty cache)", 1, "length 0 keeps nothing: shape (B, n_head, 0, head_size)")
def _crop_zero(fn):
    return _crop_case(fn, 5, 0, seed=22)


@crop.case("crop to the full length (nothing removed)", 1, "length == S must return the cache unchanged")
def _crop_full(fn):
    return _crop_case(fn, 7, 7, seed=23)


@crop.case("rollback: 6 cached + 4 drafts, 1 accepted, crop to 7, append 2: same as never drafting", 2,
           "after a rejection the cache must end right after the last accepted token")
def _crop_rollback(fn):
    B, H, D = 1, 2, 8
    g = torch.Generator().manual_seed(24)
    k_prefix, v_prefix = torch.randn(B, H, 6, D, generator=g), torch.randn(B, H, 6, D, generator=g)
    q_d, k_d, v_d = (torch.randn(B, H, 4, D, generator=g) for _ in range(3))
    _, k_full, v_full = _reference_attention(q_d, k_d, v_d, k_prefix, v_prefix)  # cache of 10
    k_c, v_c = _unpack(fn(k_full.clone(), v_full.clone(), 7), "(k, v)", 2)
    expect_tensor("k after the crop", k_c, (B, H, 7, D))
    expect_tensor("v after the crop", v_c, (B, H, 7, D))
    q_n, k_n, v_n = (torch.randn(B, H, 2, D, generator=g) for _ in range(3))
    out, _, _ = _reference_attention(q_n, k_n, v_n, k_c, v_c)
    ref, _, _ = _reference_attention(q_n, k_n, v_n, k_full[:, :, :7], v_full[:, :, :7])
    diff = expect_close("attention output after the rollback", out, ref)
    return f"attention after the rollback matches (max |diff| {diff:.1e})"


@crop.case("leaves the caller's cache unchanged", 1, "slicing makes a view without changing the tensor it reads", side=True)
def _crop_unchanged(fn):
    g = torch.Generator().manual_seed(25)
    k, v = torch.randn(2, 3, 8, 4, generator=g), torch.randn(2, 3, 8, 4, generator=g)
    call_unchanged(fn, (k, v, 5), ("k_cache", "v_cache", "length"))
    return "k_cache, v_cache unchanged"
