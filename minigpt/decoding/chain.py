"""Speculative decoding with a chain of drafted tokens.

Each round: the draft model proposes gamma tokens one at a time (cheap: it is small), the target scores all of
them in **one** pass, :mod:`.verify` decides how many stand, and both KV caches are cropped back to the
accepted sequence. Greedy output is identical to the target's own greedy output; sampled output has exactly
the target's distribution, provided q is the distribution the draft really sampled from and p the target's
distribution after its own temperature, top-k and top-p. The draft may sample with other settings
(``draft_sampling``): that changes how often its tokens are accepted, never the output's distribution.

Cache invariant between rounds: each cache holds the sequence minus its last token (the "pending" token,
fed at the start of the next pass).
"""
from __future__ import annotations

import time

import torch

from ..cache import KVCache
from ..model import GPT
from ..sampling import SamplingConfig, make_generator, sample
from .plain import as_prompt, check_length, prefill
from .stats import DecodeStats, Stream, trim
from .verify import accept_greedy, accept_sampled


@torch.no_grad()
def draft_tokens(draft: GPT, cache: KVCache, pending: list[int], gamma: int, cfg: SamplingConfig,
                 generator: torch.Generator | None = None, confidence_stop: float | None = None):
    """Let ``draft`` propose up to ``gamma`` tokens after ``pending`` (tokens not yet in its cache).

    Returns (tokens, q) with q (n, V) the distributions the tokens were drawn from. With ``confidence_stop``,
    drafting stops early once the draft gives its own token a probability below that threshold.
    The cache ends holding everything fed: ``pending`` and all drafted tokens but the last."""
    device = draft.device
    tokens, qs = [], []
    feed = pending
    for _ in range(gamma):
        logits = draft(torch.tensor([feed], device=device), cache=cache)[0, -1]
        q = cfg.probs(logits)
        x = int(q.argmax()) if cfg.greedy else sample(q, generator)
        tokens.append(x)
        qs.append(q)
        if confidence_stop is not None:
            # the draft's own belief in its token; under greedy q is one-hot, so read it off the softmax
            conf = float(torch.softmax(logits.float(), -1)[x]) if cfg.greedy else float(q[x])
            if conf < confidence_stop:
                break
        feed = [x]
    return tokens, torch.stack(qs) if qs else torch.empty(0, draft.config.vocab_size)


@torch.no_grad()
def verify_chain(target: GPT, cache: KVCache, pending: int, tokens: list[int], cfg: SamplingConfig,
                 generator: torch.Generator | None = None, q: torch.Tensor | None = None) -> list[int]:
    """Score ``pending`` + ``tokens`` with the target in one pass and apply the acceptance rule.

    Returns the accepted drafted tokens plus one target token; the target cache grows by len(tokens) + 1
    (the caller crops it to the accepted length)."""
    logits = target(torch.tensor([[pending] + tokens], device=target.device), cache=cache)[0]  # (gamma+1, V)
    if cfg.greedy:
        return accept_greedy(tokens, logits.argmax(-1).tolist())
    if q is None:  # nothing drafted: the pass is a plain decoding step
        q = logits.new_zeros(0, logits.shape[-1])
    return accept_sampled(tokens, q, cfg.probs(logits), generator)


@torch.no_grad()
def speculative_generate(target: GPT, draft: GPT, prompt, max_new_tokens: int, gamma: int = 4,
                         temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                         seed: int | None = None, eos_id: int | None = None, adaptive: bool = False,
                         gamma_max: int = 16, confidence_stop: float | None = None,
                         stats: DecodeStats | None = None,
                         draft_sampling: SamplingConfig | None = None,
                         on_tokens=None) -> tuple[list[int], DecodeStats]:
    """Generate with draft-then-verify rounds; returns (new token ids, statistics).

    temperature, top_k, top_p: how the *target* samples (temperature 0: greedy). draft_sampling: how the draft
    samples its proposals (default: the same settings); the acceptance rule always uses the q it sampled from.

    adaptive: grow gamma by 2 after a round where every drafted token was accepted, shrink it by 1 after a
    rejection (between 1 and ``gamma_max``), the heuristic Hugging Face's assisted generation uses.
    confidence_stop: stop a round's drafting when the draft's probability of its token drops below this.
    on_tokens: called with each round's accepted tokens as they are decided (streaming; see
    :class:`~.stats.Stream`); ``stats.from_draft`` records which output tokens were drafted and accepted."""
    if gamma < 1:
        raise ValueError(f"gamma must be at least 1, got {gamma}")
    if target.config.vocab_size != draft.config.vocab_size:
        raise ValueError(f"target and draft vocabularies differ ({target.config.vocab_size} vs "
                         f"{draft.config.vocab_size}): they must share a tokenizer")
    cfg = SamplingConfig(temperature, top_k, top_p)
    if draft_sampling is not None and not isinstance(draft_sampling, SamplingConfig):
        raise TypeError(f"draft_sampling must be a SamplingConfig, got {type(draft_sampling).__name__}")
    dcfg = cfg if draft_sampling is None else draft_sampling
    idx = as_prompt(prompt, target)
    n_prompt = idx.shape[1]
    check_length(target, n_prompt, max_new_tokens)
    check_length(draft, n_prompt, max_new_tokens)
    gen = make_generator(seed)
    stats = stats if stats is not None else DecodeStats()
    t0 = time.perf_counter()
    tcache, dcache = KVCache.for_model(target), KVCache.for_model(draft)
    prefill(target, tcache, idx)
    prefill(draft, dcache, idx.to(draft.device))
    stats.prefills += 1
    stream = Stream(stats, max_new_tokens, eos_id, on_tokens)
    out: list[int] = []
    prompt_ids = idx[0].tolist()
    last = prompt_ids[-1]
    draft_pending = [last]  # tokens the draft cache has not seen yet
    while len(out) < max_new_tokens:
        # never draft past the requested length: the round's extra target token fills the last slot
        g = min(gamma, max_new_tokens - len(out) - 1)
        drafted, q = draft_tokens(draft, dcache, draft_pending, g, dcfg, gen, confidence_stop) if g else ([], None)
        stats.draft_passes += len(drafted)
        new = verify_chain(target, tcache, last, drafted, cfg, gen, q)
        n_acc = len(new) - 1
        # tokens after the first rejection are never tested
        stats.add_round(len(drafted), n_acc, min(n_acc + 1, len(drafted)))
        # roll back: both caches keep the sequence up to (not including) the round's final token
        seq_len = n_prompt + len(out) + n_acc
        tcache.crop(seq_len)
        dcache.crop(min(dcache.length, seq_len))  # if all were accepted the draft never saw the last one
        out.extend(new)
        stream.emit(new, n_acc)
        full = prompt_ids + out
        draft_pending = full[dcache.length:]
        last = new[-1]
        if adaptive and drafted:
            gamma = min(gamma + 2, gamma_max) if n_acc == len(drafted) else max(1, gamma - 1)
        if eos_id is not None and eos_id in new:
            break
    out = trim(out, max_new_tokens, eos_id)
    stats.new_tokens += len(out)
    stats.wall_time += time.perf_counter() - t0
    return out, stats
