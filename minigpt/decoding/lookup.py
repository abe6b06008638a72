"""Prompt lookup decoding: draft by copying from the text itself.

When the continuation repeats something already in the prompt or the output (editing code, renaming a
variable, quoting), the tokens that followed the last occurrence of the current suffix are a free draft: no
draft model, no extra passes. We look for the longest n-gram (from ``max_ngram`` down to ``min_ngram``) that
ends the sequence and occurred earlier, and propose the ``num_pred`` tokens that followed its most recent
earlier occurrence. The target verifies them like any draft.

Proposals are deterministic, so under sampling their proposal distribution q is one-hot: a candidate x is
accepted with probability p(x), and a rejection resamples from p with x removed. That keeps sampling exact.

Adaptive lookup (``adaptive=True``): how many tokens to propose follows recent acceptance, with the rule Hugging
Face's assisted generation applies to its drafts. The proposal length k starts at ``num_pred``; after a round in
which every proposed token was accepted, k grows by 2; after a round with a rejection, it shrinks by 1; k stays
between 1 and ``max_pred``, and a round with no match (nothing proposed) leaves it alone. A long copy is thus
proposed in ever longer runs, while text that does not repeat costs one or two tokens of verification per
round. k depends only on what happened in earlier rounds, so each proposal is still a fixed function of the
sequence so far: exactness is untouched (greedy: identical output; sampled: the target's distribution).
"""
from __future__ import annotations

import copy

import numpy as np

from ..model import GPT
from .candidates import Proposal, adapt_length, merge_continuations
from .session import Progress, Proposer, Session, Settings, decode
from .stats import DecodeStats
from .verify import Verified


def ngram_matches(seq, n: int) -> list[int]:
    """Start indices of earlier occurrences of the last ``n`` tokens of ``seq``, most recent first.

    The suffix itself (which trivially matches) is excluded, and so is any occurrence with nothing after it."""
    seq = np.asarray(seq)
    if n < 1 or len(seq) <= n:
        return []
    suffix = seq[-n:]
    windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)  # windows starting at 0 .. len-n-1
    hits = np.nonzero((windows == suffix).all(axis=1))[0]
    hits = hits[hits < len(seq) - n]  # exclude the suffix's own position
    return hits[::-1].tolist()


def find_candidates(seq, max_ngram: int = 3, num_pred: int = 8, min_ngram: int = 1) -> list[int]:
    """The tokens that followed the most recent earlier occurrence of the longest matching suffix n-gram."""
    return find_match(seq, max_ngram, num_pred, min_ngram)[1]


def find_match(seq, max_ngram: int = 3, num_pred: int = 8, min_ngram: int = 1) -> tuple[int, list[int]]:
    """(n, candidates): the length of the longest suffix n-gram that occurred before (0: none) and the tokens that
    followed its most recent earlier occurrence. A longer match is a better bet (the controller, :mod:`.auto`,
    counts acceptance by n)."""
    for n in range(max_ngram, min_ngram - 1, -1):
        for start in ngram_matches(seq, n):
            cont = list(seq[start + n:start + n + num_pred])
            if cont:
                return n, [int(t) for t in cont]
    return 0, []


def find_candidate_tree(seq, max_ngram: int = 3, num_pred: int = 8, min_ngram: int = 1, max_matches: int = 4):
    """Several continuations (from up to ``max_matches`` earlier occurrences of the longest matching n-gram)
    merged into a tree that shares common prefixes. Returns (tokens, parents) with the root = ``seq[-1]``."""
    conts: list[list[int]] = []
    for n in range(max_ngram, min_ngram - 1, -1):
        for start in ngram_matches(seq, n):
            cont = [int(t) for t in seq[start + n:start + n + num_pred]]
            if cont and cont not in conts:
                conts.append(cont)
            if len(conts) == max_matches:
                break
        if conts:
            break
    return merge_continuations(seq[-1], conts)


def replay_lookup(prompt, output, max_ngram: int = 3, num_pred: int = 8, min_ngram: int = 1,
                  adaptive: bool = False, max_pred: int = 32) -> list[tuple[int, int]]:
    """Greedy chain lookup replayed on a known greedy ``output``, without the model: (proposed, accepted) per
    round. Greedy lookup accepts a proposal's longest prefix that agrees with the output, so the rounds (and
    the target passes, one per round) are those :func:`lookup_generate` would make; settings can be swept for
    free. Same parameters as :func:`lookup_generate`."""
    prompt, output = [int(t) for t in prompt], [int(t) for t in output]
    k, done, rounds = num_pred, 0, []
    while done < len(output):
        room = len(output) - done - 1
        proposal = find_candidates(prompt + output[:done], max_ngram, k, min_ngram)[:room]
        n = 0
        while n < len(proposal) and proposal[n] == output[done + n]:
            n += 1
        rounds.append((len(proposal), n))
        if adaptive:
            k = adapt_length(k, len(proposal), n, max_pred)
        done += n + 1
    return rounds


class NgramIndex:
    """Prompt lookup's search made incremental: for every n-gram (``min_ngram`` <= n <= ``max_ngram``) of a growing
    sequence, the start of its most recent occurrence that has a token after it. A round then costs a dictionary
    read per n and a few entries per new token, instead of a scan of the whole text (:func:`ngram_matches`), and
    finds what :func:`find_match` finds. It keeps a copy of the tokens it has indexed; a sequence that is not a
    continuation of them (another request) is indexed afresh."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        check_lookup(max_ngram, 1, min_ngram)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []
        self.latest: dict[tuple[int, ...], int] = {}   # n-gram -> start of its most recent occurrence before the end

    def find_match(self, seq, num_pred: int) -> tuple[int, list[int]]:
        """:func:`find_match` (``seq``, max_ngram, num_pred, min_ngram), from the index."""
        seq = seq if isinstance(seq, list) else [int(t) for t in seq]
        known = len(self.tokens)
        if len(seq) < known or seq[:known] != self.tokens:   # not a continuation: start over
            self.tokens, self.latest, known = [], {}, 0
        tokens, latest = self.tokens, self.latest
        tokens.extend(int(t) for t in seq[known:])
        # n-grams that end before the last token have a token after them: index those not indexed yet
        for end in range(max(known, 1), len(tokens)):
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                latest[tuple(tokens[end - n:end])] = end - n
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(tokens) > n:
                start = latest.get(tuple(tokens[-n:]))
                if start is not None:
                    return n, tokens[start + n:start + n + num_pred]
        return 0, []


def check_lookup(max_ngram: int, num_pred: int, min_ngram: int) -> None:
    """ValueError in one line unless num_pred >= 1 and max_ngram >= min_ngram >= 1."""
    if num_pred < 1 or max_ngram < min_ngram or min_ngram < 1:
        raise ValueError(f"need num_pred >= 1 and max_ngram >= min_ngram >= 1, got num_pred={num_pred}, "
                         f"max_ngram={max_ngram}, min_ngram={min_ngram}")


class Lookup(Proposer):
    """Prompt lookup as a chain: the ``num_pred`` tokens after the latest earlier match of the longest suffix
    n-gram (:func:`find_candidates`); ``adaptive``: the length follows acceptance (:func:`adapt_length`)."""

    def __init__(self, max_ngram: int = 3, num_pred: int = 8, min_ngram: int = 1, adaptive: bool = False,
                 max_pred: int = 32):
        check_lookup(max_ngram, num_pred, min_ngram)
        if adaptive and max_pred < num_pred:
            raise ValueError(f"max_pred ({max_pred}) must be at least the starting length num_pred ({num_pred})")
        self.max_ngram, self.num_pred, self.k, self.min_ngram = max_ngram, num_pred, num_pred, min_ngram
        self.adaptive, self.max_pred = adaptive, max_pred
        self.last_match = 0  # the n of the n-gram the last proposal copied after (0: no match)
        self.index = NgramIndex(max_ngram, min_ngram)
        self.max_width = 1 + (max(max_pred, num_pred) if adaptive else num_pred)

    def start(self, session: Progress) -> None:
        self.k = self.num_pred  # every generation starts from the first length

    def fork(self) -> "Lookup":
        twin = copy.copy(self)
        twin.index = NgramIndex(self.max_ngram, self.min_ngram)   # each sequence of a batch indexes its own text
        return twin

    def propose(self, session: Session, room: int) -> Proposal:
        self.last_match, drafted = self.index.find_match(session.seq, self.k)   # = find_match(session.seq, ...)
        return Proposal.chain(session.seq[-1], drafted[:room])  # copied tokens: deterministic, one-hot q

    def observe(self, proposal: Proposal, verified: Verified) -> None:
        if self.adaptive:  # the next length, from this round's outcome only
            self.k = adapt_length(self.k, len(proposal.candidates), len(verified.path), self.max_pred)


class LookupTree(Proposer):
    """Prompt lookup as a tree: the continuations of up to ``max_matches`` earlier matches, merged
    (:func:`find_candidate_tree`)."""

    def __init__(self, max_ngram: int = 3, num_pred: int = 8, min_ngram: int = 1, max_matches: int = 4):
        check_lookup(max_ngram, num_pred, min_ngram)
        self.max_ngram, self.num_pred, self.min_ngram, self.max_matches = max_ngram, num_pred, min_ngram, max_matches
        self.max_width = 1 + max_matches * num_pred

    def propose(self, session: Session, room: int) -> Proposal:
        tokens, parents = find_candidate_tree(session.seq, self.max_ngram, min(self.num_pred, room), self.min_ngram,
                                              self.max_matches)
        return Proposal(tokens, parents) if room else Proposal(tokens[:1], parents[:1])


def lookup_generate(target: GPT, prompt, max_new_tokens: int, max_ngram: int = 3, num_pred: int = 8,
                    min_ngram: int = 1, tree: bool = False, max_matches: int = 4, adaptive: bool = False,
                    max_pred: int = 32, settings: Settings | None = None,
                    **sampling) -> tuple[list[int], DecodeStats]:
    """Speculative decoding with prompt-lookup drafts (a chain, or with ``tree=True`` a tree of several
    matches); returns (new token ids, statistics). Without a match a round is a plain decoding step.

    max_ngram, min_ngram: the longest and shortest suffix n-gram searched for; num_pred: how many tokens that
    followed the match are proposed (with ``adaptive``: the starting proposal length).
    adaptive: the proposal length k follows acceptance (chain only): +2 after a round where every proposed
    token was accepted, -1 after a rejection, within [1, ``max_pred``]; see the module docstring.
    ``stats.gammas`` records the number of tokens proposed in each round, ``stats.from_draft`` which output
    tokens were proposed and accepted. ``settings`` or its fields as keywords (:class:`~.session.Settings`):
    how the target samples and when it stops."""
    if adaptive and tree:
        raise ValueError("adaptive proposal lengths are for the chain (tree=False)")
    proposer = (LookupTree(max_ngram, num_pred, min_ngram, max_matches) if tree
                else Lookup(max_ngram, num_pred, min_ngram, adaptive, max_pred))
    return decode(target, prompt, max_new_tokens, proposer, settings, **sampling)
