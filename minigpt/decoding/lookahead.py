"""Lookahead decoding: Jacobi iteration guesses the future, an n-gram pool remembers it, one pass does both.

Fu, Bailis, Stoica and Zhang 2024 (arXiv:2402.02057). Greedy decoding is a fixed point: if every token of a
guessed continuation is the target's argmax after the tokens before it, the guess is the output. Jacobi
iteration feeds a whole window of guesses, replaces each by the target's choice after its predecessors, and
repeats; a window rarely converges, but the *trajectories* it leaves -- a token guessed at position p in one
iteration, at p + 1 in the next, ... -- are n-grams the text often contains. Each round here is one target
pass over three things:

* the root (the sequence's last token), as in every method;
* the lookahead window: ``ngram - 1`` rows of ``window`` guesses; row r, column k sits ``1 + r + k`` after the
  root and sees the root, row 0 up to column k and rows 1 .. r of column k -- a complete context, so its
  output guesses the token after it. The last row's outputs end ``window`` n-grams (row 0 .. last row of one
  column, then the output), which join the pool; then every row moves up one and the outputs become the last row;
* the verification branch: up to ``candidates`` n-grams from the pool that begin with the root, merged into a
  tree of candidates and verified exactly by :mod:`.verify`.

The window's nodes are extra nodes of the proposal (:class:`~.candidates.Proposal`): they see neither the
candidates nor are seen by them, and nothing of them stays in the cache. Exact by construction: the candidates
are deterministic (one-hot q), whatever the window guessed. The price is width: every pass scores
``1 + (ngram - 1) * window`` tokens plus the candidates, which a GPU hides and a CPU pays for.
"""
from __future__ import annotations

import torch

from ..model import GPT
from .candidates import Proposal, merge_continuations
from .session import Progress, Proposer, Session, Settings, decode
from .stats import DecodeStats
from .verify import Verified


def window_mask(rows: int, window: int) -> torch.Tensor:
    """(rows * window, rows * window) bool, row-major nodes (r, k): node (r, k) sees (0, j) for j <= k and
    (s, k) for 1 <= s <= r -- the tokens at the positions 1 .. 1 + r + k before it, one each."""
    n = rows * window
    mask = torch.zeros(n, n, dtype=torch.bool)
    for r in range(rows):
        for k in range(window):
            i = r * window + k
            mask[i, :k + 1] = True                       # row 0, columns 0 .. k
            mask[i, [s * window + k for s in range(1, r + 1)]] = True
    return mask


def window_depths(rows: int, window: int) -> list[int]:
    """Distance of node (r, k) from the root: 1 + r + k."""
    return [1 + r + k for r in range(rows) for k in range(window)]


class NgramPool:
    """n-grams seen in the trajectories, by first token: for each, up to ``per_key`` continuations of length
    n - 1, the most recent first (a repeat moves to the front)."""

    def __init__(self, per_key: int = 8):
        self.per_key, self.table = per_key, {}

    def add(self, ngram) -> None:
        first, rest = int(ngram[0]), tuple(int(t) for t in ngram[1:])
        conts = self.table.setdefault(first, [])
        if rest in conts:
            conts.remove(rest)
        conts.insert(0, rest)
        del conts[self.per_key:]

    def get(self, first: int) -> list[tuple[int, ...]]:
        return list(self.table.get(int(first), []))

    def __len__(self) -> int:
        return sum(len(v) for v in self.table.values())


class Lookahead(Proposer):
    """Lookahead decoding with a ``window`` x (``ngram`` - 1) Jacobi window and up to ``candidates`` pool
    n-grams verified per round."""

    def __init__(self, window: int = 5, ngram: int = 4, candidates: int = 5):
        if window < 1 or ngram < 2 or candidates < 0:
            raise ValueError(f"need window >= 1, ngram >= 2 and candidates >= 0, got {window}, {ngram}, {candidates}")
        self.window, self.rows, self.candidates = window, ngram - 1, candidates
        self.mask, self.depths = window_mask(self.rows, window), window_depths(self.rows, window)
        self.max_width = 1 + candidates * self.rows + self.rows * window
        self.pool, self.guesses = None, None  # made per generation, in start()

    def start(self, session: Progress) -> None:
        """A new generation: guesses from the prompt, an empty pool."""
        self.pool = NgramPool(max(self.candidates, 1))
        self.guesses = [session.seq[i % len(session.seq)] for i in range(self.rows * self.window)]

    def propose(self, session: Session, room: int) -> Proposal:
        root = session.seq[-1]
        conts = [c[:room] for c in self.pool.get(root)[:self.candidates]] if room else []
        tokens, parents = merge_continuations(root, conts)
        # the window's nodes whose positions fit in the context (a node's context nodes are never deeper than it,
        # and come before it in this order)
        limit = session.target.config.block_size - len(session.seq)
        keep = [i for i, d in enumerate(self.depths) if d <= limit]
        return Proposal(tokens, parents, extra_tokens=[self.guesses[i] for i in keep],
                        extra_depths=[self.depths[i] for i in keep], extra_mask=self.mask[keep][:, keep])

    def observe(self, proposal: Proposal, verified: Verified) -> None:
        if len(proposal.extra_tokens) < len(self.guesses):  # the window ran into the end of the context
            return
        out = verified.extra_logits.argmax(-1).tolist()
        W, R, g = self.window, self.rows, self.guesses
        last = out[(R - 1) * W:]  # the last row's outputs: the next token of each column's trajectory
        for k in range(W):
            self.pool.add([g[r * W + k] for r in range(R)] + [last[k]])
        self.guesses = g[W:] + last  # every row moves up one; the outputs become the last row


def lookahead_generate(target: GPT, prompt, max_new_tokens: int, window: int = 5, ngram: int = 4,
                       candidates: int = 5, settings: Settings | None = None,
                       **sampling) -> tuple[list[int], DecodeStats]:
    """Lookahead decoding (:class:`Lookahead`); returns (new token ids, statistics). ``settings`` or its fields as
    keywords (:class:`~.session.Settings`): how the target samples and when it stops."""
    return decode(target, prompt, max_new_tokens, Lookahead(window, ngram, candidates), settings, **sampling)
