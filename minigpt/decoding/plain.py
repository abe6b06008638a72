"""Plain autoregressive decoding with a KV cache: one target pass per generated token."""
from __future__ import annotations

import time

import torch

from ..cache import KVCache
from ..model import GPT
from ..sampling import SamplingConfig, make_generator, sample
from .stats import DecodeStats, Stream


def as_prompt(prompt, model: GPT) -> torch.Tensor:
    """A prompt given as a list of ids or a 1-D tensor -> a (1, T) LongTensor on the model's device."""
    ids = torch.as_tensor(prompt, dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"prompt must be a non-empty 1-D sequence of token ids, got shape {tuple(ids.shape)}")
    if int(ids.min()) < 0 or int(ids.max()) >= model.config.vocab_size:
        raise ValueError(f"prompt holds token ids outside the vocabulary [0, {model.config.vocab_size})")
    return ids.to(model.device)[None]


def check_length(model: GPT, prompt_len: int, max_new_tokens: int, extra: int = 0) -> None:
    """Fail early, in one line, when prompt + generation (+ ``extra`` lookahead) exceeds the context."""
    need = prompt_len + max_new_tokens + extra
    if need > model.config.block_size:
        raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens})"
                         f"{f' + lookahead ({extra})' if extra else ''} = {need} exceeds the model's context "
                         f"of {model.config.block_size} tokens")


def prefill(model: GPT, cache: KVCache, idx: torch.Tensor) -> None:
    """Run every prompt token but the last through ``model`` in one pass, filling ``cache``.

    The last prompt token is left for the first decoding pass, so every decoder here starts its loop from a
    cache that holds the sequence minus its last token -- the invariant the speculative decoders keep too.
    Only the keys and values are needed, so the output layer is skipped (``hidden_states``): with a large
    vocabulary it would cost more than the rest of the pass (SmolLM2: 49152 x 576 weights per prompt token)."""
    if idx.shape[1] > 1:
        model.hidden_states(idx[:, :-1], cache=cache)


@torch.no_grad()
def generate(model: GPT, prompt, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, seed: int | None = None, eos_id: int | None = None,
             stats: DecodeStats | None = None, on_tokens=None) -> list[int]:
    """Generate up to ``max_new_tokens`` after ``prompt`` (a list of ids); return the new ids.

    One target pass per new token (``stats.target_passes == len(output)``), after one prefill pass.

    ``temperature=0`` is greedy. With a ``seed`` the output is reproducible. Stops early after ``eos_id``.
    Pass a :class:`DecodeStats` to have it filled in. ``on_tokens(tokens)`` is called with every new token
    as it is made (streaming); it changes nothing else."""
    cfg = SamplingConfig(temperature, top_k, top_p)
    idx = as_prompt(prompt, model)
    check_length(model, idx.shape[1], max_new_tokens)
    gen = make_generator(seed)
    stats = stats if stats is not None else DecodeStats()
    t0 = time.perf_counter()
    cache = KVCache.for_model(model)
    prefill(model, cache, idx)
    stats.prefills += 1
    stream = Stream(stats, max_new_tokens, eos_id, on_tokens)
    tok = int(idx[0, -1])
    out: list[int] = []
    while len(out) < max_new_tokens:
        logits = model(torch.tensor([[tok]], device=idx.device), cache=cache)[0, -1]  # decode: one token
        stats.target_passes += 1
        tok = int(logits.argmax()) if cfg.greedy else sample(cfg.probs(logits), gen)
        out.append(tok)
        stream.emit([tok], 0)
        if tok == eos_id:
            break
    stats.new_tokens += len(out)
    stats.wall_time += time.perf_counter() - t0
    return out


@torch.no_grad()
def generate_no_cache(model: GPT, prompt, max_new_tokens: int) -> list[int]:
    """Greedy decoding that recomputes the whole sequence every step -- the slow baseline of Lesson 2."""
    idx = as_prompt(prompt, model)
    check_length(model, idx.shape[1], max_new_tokens)
    out: list[int] = []
    for _ in range(max_new_tokens):
        logits = model(idx)[0, -1]
        tok = int(logits.argmax())
        out.append(tok)
        idx = torch.cat([idx, torch.tensor([[tok]], device=idx.device)], dim=1)
    return out
