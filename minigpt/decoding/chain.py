"""Speculative decoding with a chain of drafted tokens.

Each round: the draft model proposes gamma tokens one at a time (cheap: it is small), the target scores all of
them in **one** pass, :func:`.verify.verify` decides how many stand and rolls the target's cache back, and the
session rolls the draft's back. Greedy output is identical to the target's own greedy output; sampled output has
exactly the target's distribution, provided q is the distribution the draft really sampled from and p the
target's distribution after its own temperature, top-k and top-p. The draft may sample with other settings
(``draft_sampling``): that changes how often its tokens are accepted, never the output's distribution.

Self-speculation (:class:`SelfSpec`) is the same proposer with the target's own first layers as the draft
(:func:`minigpt.model.early_exit_draft`).
"""
from __future__ import annotations

import torch

from ..cache import KVCache
from ..model import GPT, early_exit_draft
from ..sampling import SamplingConfig, sample
from .candidates import Proposal, adapt_length
from .session import Proposer, Session, decode
from .stats import DecodeStats
from .verify import Verified


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


class Chain(Proposer):
    """The draft model proposes a chain of ``gamma`` tokens, sampled with ``sampling`` (None: the target's).

    adaptive: grow gamma by 2 after a round where every drafted token was accepted, shrink it by 1 after a
    rejection (between 1 and ``gamma_max``), the heuristic Hugging Face's assisted generation uses.
    confidence_stop: stop a round's drafting when the draft's probability of its token drops below this."""

    def __init__(self, draft: GPT, gamma: int = 4, sampling: SamplingConfig | None = None, adaptive: bool = False,
                 gamma_max: int = 16, confidence_stop: float | None = None):
        if gamma < 1:
            raise ValueError(f"gamma must be at least 1, got {gamma}")
        if sampling is not None and not isinstance(sampling, SamplingConfig):
            raise TypeError(f"draft_sampling must be a SamplingConfig, got {type(sampling).__name__}")
        self.draft, self.gamma, self.sampling = draft, gamma, sampling
        self.adaptive, self.gamma_max, self.confidence_stop = adaptive, gamma_max, confidence_stop

    def propose(self, session: Session, room: int) -> Proposal:
        g = min(self.gamma, room)  # never draft past the requested length: the round's own token fills the last slot
        if not g:
            return Proposal.chain(session.seq[-1], [])
        pending = session.seq[session.draft_cache.length:]  # what the draft's cache has not seen yet
        drafted, q = draft_tokens(self.draft, session.draft_cache, pending, g, self.sampling or session.sampling,
                                  session.generator, self.confidence_stop)
        return Proposal.chain(session.seq[-1], drafted, q, draft_passes=len(drafted))

    def observe(self, proposal: Proposal, verified: Verified) -> None:
        if self.adaptive:
            self.gamma = adapt_length(self.gamma, len(proposal.candidates), len(verified.path), self.gamma_max)


class SelfSpec(Chain):
    """Self-speculation: the target's own first ``n_layers`` layers, read out early, draft the chain. The draft
    shares the target's weights and has its own, smaller KV cache; verification by the full model keeps the
    output exact however poor the early exit's guesses are."""

    def __init__(self, target: GPT, n_layers: int, gamma: int = 4, **chain_options):
        super().__init__(early_exit_draft(target, n_layers), gamma, **chain_options)


def speculative_generate(target: GPT, draft: GPT, prompt, max_new_tokens: int, gamma: int = 4,
                         temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                         seed: int | None = None, eos_id: int | None = None, adaptive: bool = False,
                         gamma_max: int = 16, confidence_stop: float | None = None,
                         stats: DecodeStats | None = None,
                         draft_sampling: SamplingConfig | None = None,
                         on_tokens=None) -> tuple[list[int], DecodeStats]:
    """Generate with draft-then-verify rounds (:class:`Chain`); returns (new token ids, statistics).

    temperature, top_k, top_p: how the *target* samples (temperature 0: greedy). draft_sampling: how the draft
    samples its proposals (default: the same settings); the acceptance rule always uses the q it sampled from.
    adaptive, gamma_max, confidence_stop: see :class:`Chain`. on_tokens: called with each round's accepted
    tokens as they are decided (streaming; see :class:`~.session.Stream`); ``stats.from_draft`` records which
    output tokens were drafted and accepted."""
    proposer = Chain(draft, gamma, draft_sampling, adaptive, gamma_max, confidence_stop)
    return decode(target, prompt, max_new_tokens, proposer, temperature, top_k, top_p, seed, eos_id, stats, on_tokens)
