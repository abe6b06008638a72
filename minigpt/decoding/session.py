"""One decoding loop for every method: a :class:`Session` owns a generation, a :class:`Proposer` drafts.

Plain, chain, tree, prompt lookup, Medusa and self-speculation differ in one thing only: what they propose
each round. Everything else is the same and lives here, once:

* the prompt and length checks, the generator (``seed``), the stopping rules (``max_new_tokens``, ``eos_id``);
* the target's KV cache and, for a proposer with a draft model, the draft's; the prefill of both;
* the round: ask the proposer for a :class:`~.candidates.Proposal`, :func:`~.verify.verify` it (one target
  pass, the acceptance rule, the cache rollback), book it in the :class:`~.stats.DecodeStats`, stream the
  accepted tokens, roll the draft's cache back;
* the wall time and the output, cut exactly where the stopping rules say.

Cache invariant between rounds: the target's cache holds the sequence without its last token (the next
round's root). The draft's cache holds a prefix of that (a proposer feeds it what it has not seen yet).

A new method is one proposer::

    class RepeatLast(Proposer):                      # propose "the last token again", twice
        def propose(self, session, room):
            return Proposal.chain(session.seq[-1], [session.seq[-1]] * min(2, room))

    ids, stats = decode(target, prompt, 64, RepeatLast())   # exact: greedy output identical to generate()

How a generation runs, whatever the method (the target's sampling, the seed, the stop token, the statistics to
fill, a streaming callback), is one :class:`Settings` object; every function the lessons call also takes its
fields as keywords (``temperature=0.8, seed=1``).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import Callable

import torch

from ..cache import KVCache
from ..model import GPT
from ..sampling import SamplingConfig, make_generator
from .candidates import Proposal
from .stats import DecodeStats
from .verify import Rule, Verified, rule_for, verify


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


@lru_cache(maxsize=16)
def vocabulary_difference(a, b) -> str | None:
    """The first difference between two tokenizers (tiktoken Encodings), as llama.cpp's ``are_compatible`` looks
    for it between a target and a draft: their sizes, their special tokens, then the text (bytes) of every
    token; None when they are the same vocabulary."""
    if a.n_vocab != b.n_vocab:
        return f"{a.n_vocab} vs {b.n_vocab} tokens"
    specials = [{t: enc.encode_single_token(t) for t in enc.special_tokens_set} for enc in (a, b)]
    if specials[0] != specials[1]:
        return f"special tokens {specials[0]} vs {specials[1]}"

    def text(enc, i):
        try:
            return enc.decode_single_token_bytes(i)
        except KeyError:  # an id with no token
            return None
    first = next((i for i in range(a.n_vocab) if text(a, i) != text(b, i)), None)
    return None if first is None else f"token {first} is {text(a, first)!r} vs {text(b, first)!r}"


def check_vocabularies(target: GPT, draft: GPT) -> None:
    """A draft must propose in the target's vocabulary: the same size and, when both models carry their tokenizer
    (``model.tokenizer``, set by the loaders of :mod:`minigpt.bench` and :mod:`minigpt.real`), the same special
    tokens and the same text for every token (:func:`vocabulary_difference`). ValueError in one line."""
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"target and draft vocabularies differ ({target.config.vocab_size} vs "
                         f"{draft.config.vocab_size}): they must share a tokenizer")
    a, b = getattr(target, "tokenizer", None), getattr(draft, "tokenizer", None)
    diff = None if a is None or b is None or a is b else vocabulary_difference(a, b)
    if diff:
        raise ValueError(f"target and draft vocabularies differ ({diff}): they must share a tokenizer")


@dataclass
class Settings:
    """How one generation runs, whatever the method: how the target samples (``temperature`` 0: greedy;
    ``top_k``, ``top_p``), the ``seed`` of its generator, the token that ends it (``eos_id``: stop after it), a
    :class:`~.stats.DecodeStats` to fill in (``stats``), and ``on_tokens``, called with each round's accepted
    tokens as they are decided (streaming, :class:`Stream`)."""
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    eos_id: int | None = None
    stats: DecodeStats | None = None
    on_tokens: Callable[[list[int]], None] | None = None

    @classmethod
    def of(cls, settings: "Settings | None" = None, **changes) -> "Settings":
        """``settings`` (default: greedy, no seed, no stop token) with the fields in ``changes`` replaced: what
        every decoding function does with its keywords. An unknown keyword is a TypeError naming the fields."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(f"unknown decoding setting {unknown[0]!r}; the settings are {', '.join(sorted(known))}")
        return replace(settings or cls(), **changes)

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)


@torch.no_grad()
def prefill(model: GPT, cache: KVCache, idx: torch.Tensor, return_hidden: bool | tuple[int, ...] = False):
    """Run every prompt token but the last through ``model`` in one pass, filling ``cache``.

    The last prompt token is left for the first decoding pass (the cache invariant of the module docstring).
    Only keys and values are needed, so the output layer is skipped (``hidden_states``): with a large vocabulary
    it would cost more than the rest of the pass (SmolLM2: 49152 x 576 weights per prompt token). With
    ``return_hidden``, returns the final hidden states at the prefilled positions, (T - 1, C) (None for a
    one-token prompt): what Medusa heads and EAGLE read; with a tuple of block numbers, those blocks' outputs side by
    side (:meth:`~minigpt.model.GPT.features`: EAGLE-3)."""
    if idx.shape[1] < 2:
        return None
    if return_hidden is False:
        model.hidden_states(idx[:, :-1], cache=cache)
        return None
    return model.features(idx[:, :-1], return_hidden, cache=cache)[0]


def trim(out: list[int], max_new_tokens: int, eos_id: int | None) -> list[int]:
    """The output a decoder returns: cut after the first ``eos_id`` and at ``max_new_tokens``."""
    if eos_id is not None and eos_id in out:
        out = out[:out.index(eos_id) + 1]
    return out[:max_new_tokens]


class Stream:
    """One decoding call's output as the rounds produce it.

    ``emit(new, n_drafted)`` takes a round's tokens, of which the first ``n_drafted`` were drafted and
    accepted, cuts them exactly as the call's returned output will be cut (after ``eos_id``, at
    ``max_new_tokens``), appends their origin to ``stats.from_draft``, and passes them to ``on_tokens`` (if
    given) -- so the pieces handed to ``on_tokens`` join into the returned output, and streaming changes
    nothing the decoder computes."""

    def __init__(self, stats: DecodeStats, max_new_tokens: int, eos_id: int | None = None, on_tokens=None):
        self.stats, self.left, self.eos_id, self.on_tokens = stats, max_new_tokens, eos_id, on_tokens
        self.done = False

    def emit(self, new: list[int], n_drafted: int) -> None:
        if self.done:
            return
        kept = trim(list(new), self.left, self.eos_id)
        self.left -= len(kept)
        self.done = self.left <= 0 or (self.eos_id is not None and self.eos_id in kept)
        k = min(n_drafted, len(kept))
        self.stats.from_draft.extend([True] * k + [False] * (len(kept) - k))
        if self.on_tokens is not None and kept:
            self.on_tokens(kept)


class Proposer:
    """What a decoding method contributes: the candidates of each round.

    The loops call, for each generation: :meth:`start` once (reset what the last generation left), then each round
    :meth:`propose` and, once the round is decided, :meth:`observe`; :meth:`finish` at the end. A batch
    (:mod:`.batch`) gives every sequence its own copy (:meth:`fork`, then :meth:`start`) and asks the original for
    all active sequences at once (:meth:`propose_batch`).

    Class attributes a proposer may set:
    ``draft``        a draft model; the session checks it, keeps its KV cache (``session.draft_cache``,
                     prefilled like the target's and rolled back after every round) and passes it nothing else;
    ``lazy_draft``   True: the draft's cache starts empty, not prefilled, because the proposer catches the draft
                     up itself when it first drafts (the controller, which may never choose the chain);
    ``needs_hidden`` the session keeps ``session.new_hidden``, the target's final hidden states at the
                     positions the last pass added to the cache (the prefill's, then each round's root and
                     accepted nodes: EAGLE reads them), and ``session.hidden``, the last of them, at the position
                     before the root (Medusa's heads read it); a tuple of block numbers instead of True keeps
                     those blocks' outputs side by side (an EAGLE-3 head's low, middle and high layers);
    ``speculative``  False for plain decoding: its passes are not draft-then-verify rounds in the statistics;
    ``max_width``    the most tokens one of its passes feeds the target (root included): the KV cache keeps that
                     much room beyond the context, since near the end of the context a tree's nodes may
                     outnumber the positions left (siblings share a position; a chain never needs it);
    ``rule``         the acceptance rule, as a function of (sampling, generator) (None: the exact one,
                     :func:`~.verify.rule_for`; Medusa's typical acceptance is another);
    ``batched``      True when :meth:`propose_batch` runs the drafting model once for all sequences of a batch
                     (a draft chain, a draft tree); False: each sequence drafts on its own (nothing to batch, or a
                     drafter that works per sequence), and only the target's pass is shared;
``timed``        True when its rounds follow measured time (the speculation controller): two runs of the same
                     request give the same output but may make different rounds.

    Set by the batch engine before each round: ``waiting``, how many requests wait for a place in the batch (the
    speculation controller scores a batch's rounds by it)."""
    draft: GPT | None = None
    lazy_draft: bool = False
    needs_hidden: bool | tuple[int, ...] = False
    speculative: bool = True
    max_width: int = 64
    rule: Callable[[SamplingConfig, torch.Generator | None], Rule] | None = None
    batched: bool = False
    timed: bool = False
    waiting: int = 0

    def start(self, session: "Progress") -> None:
        """A generation begins (a :class:`Session`, or a sequence joining a batch): forget what the previous one
        left (an adaptive length, a head's cache, a pool of n-grams)."""

    def propose(self, session: "Session", room: int) -> Proposal:
        """This round's candidates after ``session.seq``; ``room``: how many candidate levels can still be used
        (a deeper node would only be cut off at ``max_new_tokens``)."""
        raise NotImplementedError

    def propose_batch(self, seqs: list["Progress"], rooms: list[int]) -> list[Proposal]:
        """The candidates of every active sequence of a batch; ``seqs[i].proposer`` is sequence i's own copy (its
        state). By default each copy proposes on its own; a proposer that drafts with a model batches its passes."""
        return [s.proposer.propose(s, r) for s, r in zip(seqs, rooms)]

    def observe(self, proposal: Proposal, verified: Verified) -> None:
        """Called after each round with its outcome (adaptive proposers change their length here)."""

    def finish(self, progress: "Progress") -> None:
        """Called once when the generation has ended, with its :class:`Progress` (suffix decoding keeps the output)."""

    def fork(self) -> "Proposer":
        """A copy for another sequence of a batch: it shares the models, and :meth:`start` gives it its own state."""
        return copy.copy(self)


class Progress:
    """Where a generation stands, for the loops and the proposers that read it: ``seq`` (prompt and tokens so far),
    ``n_prompt``, ``max_new_tokens``, ``ended`` (``eos_id`` was produced) and ``new_hidden`` (the target's final
    hidden states at the positions its last pass kept, when a proposer needs them). A :class:`Session` is one;
    so is each sequence of a batch (:class:`~.batch.Sequence`)."""
    seq: list[int]
    n_prompt: int
    max_new_tokens: int
    eos_id: int | None
    stats: DecodeStats
    stream: "Stream"
    ended: bool = False
    new_hidden: torch.Tensor | None = None

    def record(self, proposal: Proposal, verified: Verified, speculative: bool, draft_cache=None) -> None:
        """Book a decided round: the statistics (a draft-then-verify round, or a plain step), the tokens, the
        target's hidden states kept, the draft's cache (if any) rolled back to what it saw of the sequence
        without its last token, the stream, and whether ``eos_id`` came."""
        self.stats.draft_passes += proposal.draft_passes
        if speculative:
            self.stats.add_tree_round(proposal.parents, verified.path)
        else:
            self.stats.target_passes += 1
        self.seq.extend(verified.tokens)
        self.new_hidden = verified.hidden_kept
        if draft_cache is not None:
            draft_cache.crop(min(draft_cache.length, len(self.seq) - 1))
        self.stream.emit(verified.tokens, len(verified.path))
        self.ended = self.eos_id is not None and self.eos_id in verified.tokens

    @property
    def draft_backlog(self) -> list[int]:
        """The tokens the draft's cache has not read, all but the newest (the next draft pass reads that one
        itself): what a catch-up pass feeds it. Empty without a draft."""
        cache = getattr(self, "draft_cache", None)
        return [] if cache is None else self.seq[cache.length:-1]

    @property
    def hidden(self) -> torch.Tensor | None:
        """The target's final hidden state at the last cached position (the one before the root), if kept."""
        return None if self.new_hidden is None else self.new_hidden[-1]

    @property
    def n_new(self) -> int:
        return len(self.seq) - self.n_prompt

    @property
    def finished(self) -> bool:
        return self.ended or self.n_new >= self.max_new_tokens

    @property
    def output(self) -> list[int]:
        """The new tokens, cut where the stopping rules say (:func:`trim`)."""
        return trim(self.seq[self.n_prompt:], self.max_new_tokens, self.eos_id)


class Session(Progress):
    """One generation with ``target``: checks, caches, prefill, generator, stopping, statistics, timing.

    ``run(proposer)`` decodes to the end and returns (new ids, stats). ``proposer``: the method, from which the
    draft model, whether hidden states are kept, the room a pass needs and the acceptance rule are taken (or, for
    a session driven by hand, ``draft``, ``needs_hidden``, ``max_width`` given directly); ``rule``: a function of
    (sampling, generator) returning the acceptance rule, over the proposer's (default: the exact one,
    :func:`~.verify.rule_for`)."""

    def __init__(self, target: GPT, prompt, max_new_tokens: int, sampling: SamplingConfig | None = None,
                 seed: int | None = None, eos_id: int | None = None, stats: DecodeStats | None = None,
                 on_tokens=None, draft: GPT | None = None, needs_hidden: bool | tuple[int, ...] = False,
                 rule: Callable[[SamplingConfig, torch.Generator | None], Rule] | None = None, max_width: int = 64,
                 proposer: Proposer | None = None):
        lazy_draft = False
        if proposer is not None:
            draft, needs_hidden, max_width = proposer.draft, proposer.needs_hidden, proposer.max_width
            lazy_draft = proposer.lazy_draft
            rule = rule or proposer.rule
        idx = as_prompt(prompt, target)
        n_prompt = idx.shape[1]
        check_length(target, n_prompt, max_new_tokens)
        if draft is not None:
            check_vocabularies(target, draft)
            check_length(draft, n_prompt, max_new_tokens)
        self.target, self.draft = target, draft
        self.sampling = sampling if sampling is not None else SamplingConfig()
        self.generator = make_generator(seed)
        self.rule = (rule or rule_for)(self.sampling, self.generator)
        self.max_new_tokens, self.eos_id, self.needs_hidden = max_new_tokens, eos_id, needs_hidden
        self.stats = stats if stats is not None else DecodeStats()
        self.t0 = time.perf_counter()
        self.seq: list[int] = idx[0].tolist()  # the prompt and every token decided so far
        self.n_prompt = n_prompt
        # room for what this generation can write: the prompt, the new tokens and one proposal past them, rounded
        # up to a multiple of 256 positions (a padded attention never meets the end of the buffer), not the whole
        # context: zeroing SmolLM2's cache for all 2048 positions took 30 ms on one CPU core, most of a decoding step
        room = min(-(-(n_prompt + max_new_tokens + max_width) // 256) * 256, target.config.block_size + max_width)
        self.cache = KVCache.for_model(target, max_len=room)
        self.new_hidden = prefill(target, self.cache, idx, return_hidden=needs_hidden)
        self.draft_cache = None
        if draft is not None:
            self.draft_cache = KVCache.for_model(draft, max_len=min(room, draft.config.block_size + max_width))
            if not lazy_draft:
                prefill(draft, self.draft_cache, idx.to(draft.device))
        self.stats.prefills += 1
        self.stream = Stream(self.stats, max_new_tokens, eos_id, on_tokens)
        self.ended = False  # set once eos_id was produced
        self.proposer: Proposer | None = None  # the proposer this generation runs (started on its first round)

    def step(self, proposer: Proposer) -> Verified:
        """One round: propose, verify (one target pass), book, extend the sequence, roll the draft back. A
        proposer that joins the session here is started first."""
        if proposer is not self.proposer:
            self.proposer = proposer
            proposer.start(self)
        proposal = proposer.propose(self, self.max_new_tokens - self.n_new - 1)
        verified = verify(self.target, self.cache, proposal, self.rule, return_hidden=self.needs_hidden)
        proposer.observe(proposal, verified)
        self.record(proposal, verified, proposer.speculative, self.draft_cache)
        return verified

    def run(self, proposer: Proposer) -> tuple[list[int], DecodeStats]:
        """:meth:`Proposer.start`, then rounds until ``max_new_tokens`` or ``eos_id``; returns (new ids, stats)."""
        self.proposer = proposer
        proposer.start(self)
        with torch.no_grad():
            while not self.finished:
                self.step(proposer)
        proposer.finish(self)
        out = self.output
        self.stats.new_tokens += len(out)
        self.stats.wall_time += time.perf_counter() - self.t0
        return out, self.stats


def decode(target: GPT, prompt, max_new_tokens: int, proposer: Proposer, settings: Settings | None = None,
           rule=None, **sampling) -> tuple[list[int], DecodeStats]:
    """Decode with any proposer; returns (new token ids, statistics).

    ``settings`` (a :class:`Settings`) or its fields as keywords (``temperature``, ``top_k``, ``top_p``, ``seed``,
    ``eos_id``, ``stats``, ``on_tokens``): how the target samples and when it stops; rule: see :class:`Session`.
    Exact for every proposer that reports the q its candidates were drawn from: greedy output identical to
    :func:`~.plain.generate`, sampled output distributed as the target's."""
    s = Settings.of(settings, **sampling)
    session = Session(target, prompt, max_new_tokens, s.sampling, s.seed, s.eos_id, s.stats, s.on_tokens, rule=rule,
                      proposer=proposer)
    return session.run(proposer)
