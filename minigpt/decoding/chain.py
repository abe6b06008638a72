"""Speculative decoding with a chain of drafted tokens.

Each round: the draft model proposes gamma tokens one at a time (cheap: it is small), the target scores all of
them in **one** pass, :func:`.verify.verify` decides how many stand and rolls the target's cache back, and the
session rolls the draft's back. Greedy output is identical to the target's own greedy output; sampled output has
exactly the target's distribution, provided q is the distribution the draft really sampled from and p the
target's distribution after its own temperature, top-k and top-p. The draft may sample with other settings
(``draft_sampling``): that changes how often its tokens are accepted, never the output's distribution.

In a batch (:mod:`.batch`) the draft drafts for every sequence at once: one ragged pass of the draft per drafted
position (:func:`draft_chains`, the same loop as for one sequence).

Self-speculation (:class:`SelfSpec`) is the same proposer with the target's own first layers as the draft
(:func:`minigpt.model.early_exit_draft`).
"""
from __future__ import annotations

import torch

from ..cache import KVCache
from ..model import GPT, early_exit_draft
from ..sampling import SamplingConfig, sample
from .candidates import Proposal, adapt_length
from .session import Progress, Proposer, Session, Settings, decode
from .stats import DecodeStats
from .verify import Verified, score_ragged


@torch.no_grad()
def draft_chains(draft: GPT, caches: list, pending: list[list[int]], goals: list[int], cfgs: list[SamplingConfig],
                 generators: list, confidence_stop: float | None = None):
    """Let ``draft`` propose up to ``goals[b]`` tokens after ``pending[b]`` (tokens its cache ``caches[b]`` has not
    seen) for every sequence b: one pass of the draft per drafted position, over all sequences still drafting
    (:func:`~.verify.score_ragged`: paged block tables, or one contiguous cache). Sequence b samples with
    ``cfgs[b]`` from ``generators[b]`` (greedy: the argmax).

    Returns (tokens, qs) per sequence, qs[b] the list of distributions its tokens were drawn from. With
    ``confidence_stop``, a sequence stops drafting once the draft gives its own token a probability below that
    threshold. Each cache ends holding everything fed: ``pending`` and all drafted tokens but the last."""
    tokens: list[list[int]] = [[] for _ in caches]
    qs: list[list[torch.Tensor]] = [[] for _ in caches]
    feeds = [list(p) for p in pending]
    live = [b for b, g in enumerate(goals) if g > 0]
    while live:
        logits, _ = score_ragged(draft, [caches[b] for b in live], [feeds[b] for b in live])
        going = []
        for row, b in enumerate(live):
            last = logits[row, len(feeds[b]) - 1]
            q = cfgs[b].probs(last)
            x = int(q.argmax()) if cfgs[b].greedy else sample(q, generators[b])
            tokens[b].append(x)
            qs[b].append(q)
            feeds[b] = [x]
            if confidence_stop is not None:
                # the draft's own belief in its token; under greedy q is one-hot, so read it off the softmax
                conf = float(torch.softmax(last.float(), -1)[x]) if cfgs[b].greedy else float(q[x])
                if conf < confidence_stop:
                    continue
            if len(tokens[b]) < goals[b]:
                going.append(b)
        live = going
    return tokens, qs


def draft_tokens(draft: GPT, cache: KVCache, pending: list[int], gamma: int, cfg: SamplingConfig,
                 generator: torch.Generator | None = None, confidence_stop: float | None = None):
    """Let ``draft`` propose up to ``gamma`` tokens after ``pending`` (tokens not yet in its cache): one sequence's
    :func:`draft_chains`. Returns (tokens, q) with q (n, V) the distributions the tokens were drawn from."""
    tokens, qs = draft_chains(draft, [cache], [pending], [gamma], [cfg], [generator], confidence_stop)
    return tokens[0], torch.stack(qs[0]) if qs[0] else torch.empty(0, draft.config.vocab_size)


class Chain(Proposer):
    """The draft model proposes a chain of ``gamma`` tokens, sampled with ``sampling`` (None: the target's).

    adaptive: grow gamma by 2 after a round where every drafted token was accepted, shrink it by 1 after a
    rejection (between 1 and ``gamma_max``), the heuristic Hugging Face's assisted generation uses; each
    generation starts again from ``gamma``. confidence_stop: stop a round's drafting when the draft's
    probability of its token drops below this. In a batch the draft's passes are batched."""
    batched = True

    def __init__(self, draft: GPT, gamma: int = 4, sampling: SamplingConfig | None = None, adaptive: bool = False,
                 gamma_max: int = 16, confidence_stop: float | None = None):
        if gamma < 1:
            raise ValueError(f"gamma must be at least 1, got {gamma}")
        if sampling is not None and not isinstance(sampling, SamplingConfig):
            raise TypeError(f"draft_sampling must be a SamplingConfig, got {type(sampling).__name__}")
        self.draft, self.gamma, self.first_gamma, self.sampling = draft, gamma, gamma, sampling
        self.adaptive, self.gamma_max, self.confidence_stop = adaptive, gamma_max, confidence_stop
        self.max_width = 1 + (max(gamma, gamma_max) if adaptive else gamma)

    def start(self, session: Progress) -> None:
        self.gamma = self.first_gamma

    def propose(self, session: Session, room: int) -> Proposal:
        return self._draft([self], [session], [room])[0]

    def propose_batch(self, seqs: list[Progress], rooms: list[int]) -> list[Proposal]:
        return self.propose_batch_for([s.proposer for s in seqs], seqs, rooms)

    def propose_batch_for(self, owners: list["Chain"], seqs: list[Progress], rooms: list[int]) -> list[Proposal]:
        """:meth:`propose_batch` for sequences whose chains are ``owners`` (each with its own gamma), when the
        sequences' own proposers are something else (the speculation controller, which chose the chain for them)."""
        return self._draft(owners, seqs, rooms)

    @torch.no_grad()
    def feed_batch(self, seqs: list[Progress]) -> None:
        """Bring each sequence's draft cache up to all but its newest token, in one ragged draft pass, so that the
        next proposal's first pass reads one token. A proposal makes this catch-up itself; the speculation
        controller makes it first, so that the drafting it times is the drafting alone (after rounds without the
        chain, the catch-up reads every token since, at first the whole prompt)."""
        behind = [(s.draft_cache, s.draft_backlog) for s in seqs]
        behind = [(cache, tokens) for cache, tokens in behind if tokens]
        if behind:
            score_ragged(self.draft, [cache for cache, _ in behind], [tokens for _, tokens in behind])

    def _draft(self, owners: list["Chain"], seqs: list, rooms: list[int]) -> list[Proposal]:
        """Each sequence's chain, its length its own proposer's (``owners``) gamma, never past the requested length:
        the round's own token fills the last slot."""
        drafted, qs = draft_chains(self.draft, [s.draft_cache for s in seqs],
                                   [s.seq[s.draft_cache.length:] for s in seqs],  # what each draft has not seen
                                   [min(o.gamma, r) for o, r in zip(owners, rooms)],
                                   [self.sampling or s.sampling for s in seqs], [s.generator for s in seqs],
                                   self.confidence_stop)
        return [Proposal.chain(s.seq[-1], d, torch.stack(q) if q else None, draft_passes=len(d))
                for s, d, q in zip(seqs, drafted, qs)]

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
                         adaptive: bool = False, gamma_max: int = 16, confidence_stop: float | None = None,
                         draft_sampling: SamplingConfig | None = None, settings: Settings | None = None,
                         **sampling) -> tuple[list[int], DecodeStats]:
    """Generate with draft-then-verify rounds (:class:`Chain`); returns (new token ids, statistics).

    ``settings`` or its fields as keywords (``temperature``, ``top_k``, ``top_p``, ``seed``, ``eos_id``,
    ``stats``, ``on_tokens``; see :class:`~.session.Settings`): how the *target* samples and when it stops.
    draft_sampling: how the draft samples its proposals (default: the same settings); the acceptance rule always
    uses the q it sampled from. adaptive, gamma_max, confidence_stop: see :class:`Chain`.
    ``stats.from_draft`` records which output tokens were drafted and accepted."""
    proposer = Chain(draft, gamma, draft_sampling, adaptive, gamma_max, confidence_stop)
    return decode(target, prompt, max_new_tokens, proposer, settings, **sampling)
