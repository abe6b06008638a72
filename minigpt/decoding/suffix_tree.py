"""Suffix trees for suffix decoding (:mod:`.suffix`): every substring of at most ``max_depth`` tokens of the texts
they hold, with occurrence counts; the longest matching suffix of a context; drafts grown from it best first.

:class:`SuffixTree` is the structure (insert, append, remove, matches, speculate), :class:`GlobalTree` the tree of
earlier requests' outputs with a cap and first-in-first-out eviction, :class:`Draft` what a lookup proposes,
:func:`grow_draft` how, and :func:`as_dicts` / :func:`tree_lines` show a tree. Costs are in :mod:`.suffix`'s
docstring, and measured in Lesson 14.
"""
from __future__ import annotations

import heapq
import sys
from collections import deque
from dataclasses import dataclass, field
from itertools import count as counter

ROOT = 0
STRIDE = 1 << 20  # an edge's key is parent * STRIDE + token: tokens must be below STRIDE
WIDE = 16         # a node with more children than this keeps its frequent ones at hand ...
SHARE = 32        # ... every child that held at least 1/SHARE of the node's continuations when it last grew


@dataclass
class Draft:
    """Candidates grown from a match: ``tokens`` with ``parents`` (-1: right after the context; otherwise an
    index into ``tokens``, always smaller than the node's own), each node's estimated probability ``probs``,
    the ``match_length`` it was grown from and which tree (``source``)."""
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    match_length: int = 0
    source: str = ""

    @property
    def score(self) -> float:
        """The expected number of accepted candidates if the counts are right: the sum of the nodes'
        probabilities (at most one path is accepted, so this is the sum over depths of P(reaching that depth))."""
        return sum(self.probs)


class SuffixTree:
    """Every substring of at most ``max_depth`` tokens of the texts it holds, with occurrence counts.

    ``insert(tokens)`` adds a finished text; ``append(token)`` extends the *open* text (the per-request tree
    grows with the request); ``remove(tokens)`` takes a finished text out again (eviction).

    Nodes are numbers (0 is the root) and live in flat lists, so that a tree of a million nodes is a handful
    of Python containers: quicker to build and smaller than an object per node, and nothing for the garbage
    collector to walk through node by node.
    ``edge[parent * STRIDE + token]`` is the child after ``token``; ``count[n]``: how often node n's string
    occurred; ``total[n]``: how often it was followed by something (its children's counts summed); ``first[n]``
    and ``sibling[n]`` chain a node's children, ``token[n]`` is the token that leads to n. A node with more
    than ``WIDE`` children also keeps ``frequent[n]``, the children that held at least 1/``SHARE`` of its
    continuations, so that a draft never has to look through a thousand rare ones."""

    def __init__(self, max_depth: int = 24):
        if max_depth < 2:
            raise ValueError(f"max_depth must be at least 2 (a match and one token after it), got {max_depth}")
        self.max_depth = max_depth
        self.edge: dict[int, int] = {}
        self.count, self.total = [0], [0]
        self.first, self.sibling, self.token = [-1], [-1], [-1]
        self.n_children = [0]
        self.frequent: dict[int, list[int]] = {}
        self.peak: dict[int, int] = {}  # a wide node's largest total since its frequent list was built
        self.free: list[int] = []       # numbers of deleted nodes, for reuse
        self.n_nodes = 1
        self._ends: list[int] = []  # nodes where the open text's last suffixes end, shortest first (< max_depth)

    # -- building ---------------------------------------------------------------------------------------------
    def _new(self, parent: int, token: int) -> int:
        """A new child of ``parent`` after ``token`` (count 0)."""
        if self.free:
            n = self.free.pop()
            self.count[n] = self.total[n] = self.n_children[n] = 0
            self.first[n], self.token[n] = -1, token
        else:
            n = len(self.count)
            self.count.append(0)
            self.total.append(0)
            self.first.append(-1)
            self.sibling.append(-1)
            self.token.append(token)
            self.n_children.append(0)
        self.sibling[n], self.first[parent] = self.first[parent], n
        self.edge[parent * STRIDE + token] = n
        self.n_children[parent] += 1
        self.n_nodes += 1
        if self.n_children[parent] > WIDE and parent not in self.frequent:
            self._rebuild_frequent(parent)
        return n

    def _rebuild_frequent(self, node: int) -> None:
        total = self.total[node]
        self.frequent[node] = [c for c in self.children(node) if self.count[c] * SHARE >= total]
        self.peak[node] = total

    def append(self, token: int) -> None:
        """The open text grows by ``token``: each of its suffixes that ends here (at most ``max_depth`` long)
        occurred once more. O(max_depth).

        The suffixes are taken shortest first, and once one of them was never followed by ``token`` before, no
        longer one was either (it would end with the shorter one): from there on every child is a new node, made
        without looking it up. On text that does not repeat itself that is nearly every suffix."""
        token = int(token)
        if not 0 <= token < STRIDE:
            raise ValueError(f"token ids must lie in [0, {STRIDE}), got {token}")
        edge, count, total, frequent = self.edge, self.count, self.total, self.frequent
        ends = [ROOT] + self._ends  # the empty suffix, then the ones of length 1, 2, ...
        grown = []
        for node in ends:   # the suffixes that were followed by ``token`` before
            child = edge.get(node * STRIDE + token)
            if child is None:
                break
            count[child] += 1
            total[node] += 1
            if node in frequent:
                self._grew_wide(node, child)
            grown.append(child)
        for node in ends[len(grown):]:   # the rest: a new child each
            child = self._new(node, token)
            count[child] = 1
            total[node] += 1
            if node in frequent:
                self._grew_wide(node, child)
            grown.append(child)
        count[ROOT] += 1
        self._ends = grown[:self.max_depth - 1]  # a suffix max_depth long can grow no further

    def _grew_wide(self, node: int, child: int) -> None:
        """A wide node's ``child`` occurred once more: keep it at hand if it now holds 1/SHARE of the continuations."""
        if self.count[child] * SHARE >= self.total[node] and child not in self.frequent[node]:
            self.frequent[node].append(child)
        self.peak[node] = max(self.peak[node], self.total[node])

    def close(self) -> None:
        """End the open text: the next :meth:`append` starts a new one."""
        self._ends = []

    def insert(self, tokens) -> None:
        """Add a finished text (every suffix, cut at ``max_depth``). O(len(tokens) * max_depth)."""
        self.close()
        for t in tokens:
            self.append(t)
        self.close()

    def remove(self, tokens) -> None:
        """Take out a text :meth:`insert` added: the counts of its substrings drop, and a node no text passes
        through any more is deleted with what hangs below it (only this text's path). O(len(tokens) * max_depth)."""
        tokens = [int(t) for t in tokens]
        for start in range(len(tokens)):
            path = tokens[start:start + self.max_depth]
            node = ROOT
            self.count[ROOT] -= 1
            for depth, t in enumerate(path):
                child = self.edge[node * STRIDE + t]
                self.count[child] -= 1
                self.total[node] -= 1
                if node in self.frequent and self.total[node] * 2 < self.peak[node]:
                    self._rebuild_frequent(node)  # half its continuations gone: a rarer child may count now
                if self.count[child] == 0:  # only this occurrence passed here: drop the rest of the path
                    del self.edge[node * STRIDE + t]
                    self._unlink(node, child)
                    self._drop_path(child, path[depth + 1:])
                    break
                node = child

    def _unlink(self, parent: int, child: int) -> None:
        prev, c = -1, self.first[parent]
        while c != child:
            prev, c = c, self.sibling[c]
        if prev < 0:
            self.first[parent] = self.sibling[child]
        else:
            self.sibling[prev] = self.sibling[child]
        self.n_children[parent] -= 1
        if parent in self.frequent and child in self.frequent[parent]:
            self.frequent[parent].remove(child)

    def _drop_path(self, node: int, rest: list[int]) -> None:
        """Delete ``node`` (already cut from its parent) and the path below it along ``rest``: nothing else
        passes there."""
        for t in rest:
            nxt = self.edge.pop(node * STRIDE + t)
            self._free(node)
            node = nxt
        self._free(node)

    def _free(self, node: int) -> None:
        self.frequent.pop(node, None)
        self.peak.pop(node, None)
        self.free.append(node)
        self.n_nodes -= 1

    # -- reading ----------------------------------------------------------------------------------------------
    def child(self, node: int, token: int) -> int | None:
        """The child of ``node`` after ``token``, or None."""
        return self.edge.get(node * STRIDE + int(token))

    def children(self, node: int) -> list[int]:
        """The children of ``node`` (numbers), oldest first."""
        out, c = [], self.first[node]
        while c >= 0:
            out.append(c)
            c = self.sibling[c]
        return out[::-1]

    def likely_children(self, node: int, min_share: float) -> list[int]:
        """The children holding at least ``min_share`` of ``node``'s continuations, perhaps with a few that do not.
        A wide node answers from its ``frequent`` list when ``min_share`` >= 2 / SHARE (so at most about SHARE
        children are looked at, however many it has); otherwise every child."""
        if node in self.frequent and min_share * SHARE >= 2:
            total, kept = self.total[node], []
            for c in self.frequent[node]:
                if self.count[c] * SHARE >= total:
                    kept.append(c)
            self.frequent[node] = kept   # the ones that fell below 1/SHARE leave (they rejoin when they grow)
            return kept
        return self.children(node)

    def matches(self, context) -> list[tuple[int, int]]:
        """Every suffix of ``context`` that occurred in the tree *followed by something*: (length, node),
        shortest first. A suffix that never occurred (or was never followed) has no longer one that did, so the
        first miss ends the search. Lengths up to ``max_depth - 1``, so a match leaves room for one more token.
        At most max_depth - 1 walks of at most max_depth - 1 dictionary look-ups, whatever the tree holds."""
        context = [int(t) for t in context[-(self.max_depth - 1):]]
        edge, found = self.edge, []
        for length in range(1, len(context) + 1):
            node = ROOT
            for t in context[len(context) - length:]:
                node = edge.get(node * STRIDE + t)
                if node is None:
                    return found
            if self.total[node] == 0:
                return found
            found.append((length, node))
        return found

    def longest_match(self, context) -> tuple[int, int | None]:
        """The longest suffix of ``context`` that occurred followed by something: (its length, its node), or
        (0, None) when even its last token never did."""
        found = self.matches(context)
        return found[-1] if found else (0, None)

    def speculate(self, context, max_spec: int = 24, factor: float | None = 1.0, offset: float = 0.0,
                  min_prob: float = 0.1, tree: bool = True) -> Draft:
        """The best :class:`Draft` after ``context``. Each match of length p may propose
        ``min(max_spec, int(factor * p + offset))`` candidates (``factor`` None: a fixed ``max_spec``), grown by
        :func:`grow_draft`; the highest score wins (a tie: the longer match). A draft scores at most its budget
        and at most its depth, which the tree limits to ``max_depth - p``; so the matches are tried in the order of
        that bound (longer first among equals), and the search stops when no match left could beat the best draft
        so far."""
        def budget(p: int) -> int:
            return max_spec if factor is None else min(max_spec, int(factor * p + offset + 1e-6))

        def bound(p: int) -> int:
            return min(budget(p), self.max_depth - p)

        best = Draft()
        for length, node in sorted(self.matches(context), key=lambda m: (-bound(m[0]), -m[0])):
            if bound(length) <= best.score:
                break
            draft = grow_draft(self, node, budget(length), min_prob, tree)
            if draft.score > best.score or (draft.score == best.score and length > best.match_length):
                best, best.match_length = draft, length
        return best

    def memory_bytes(self) -> int:
        """Bytes held: the lists, the edge dictionary, the wide nodes' lists, and every int object they point to
        (counted once; Python shares the small ones). Walks everything: O(nodes)."""
        containers = [self.count, self.total, self.first, self.sibling, self.token, self.n_children, self.edge,
                      self.frequent, self.peak, self.free, *self.frequent.values()]
        total, seen = sum(sys.getsizeof(c) for c in containers), set()
        for values in (self.count, self.total, self.first, self.sibling, self.token, self.n_children,
                       self.edge.keys(), self.edge.values()):
            for v in values:
                if not -5 <= v <= 256 and id(v) not in seen:
                    seen.add(id(v))
                    total += sys.getsizeof(v)
        return total


def as_dicts(tree: SuffixTree, node: int = ROOT) -> dict:
    """A tree (or the subtree under ``node``) as nested dicts: token -> the same for what followed it ({} where
    nothing did). The plain form Lesson 14 prints and exercise 10 reads; counts left out."""
    return {tree.token[c]: as_dicts(tree, c) for c in tree.children(node)}


def tree_lines(tree: SuffixTree, name=str, depth: int = 3, node: int = ROOT, indent: str = "") -> list[str]:
    """The tree (or the subtree under ``node``) drawn as text, down to ``depth`` levels: one line per node,
    ``name(token) (count)``, children indented under their parent, most frequent first."""
    lines = []
    if depth < 1:
        return lines
    for c in sorted(tree.children(node), key=lambda c: -tree.count[c]):
        lines.append(f"{indent}{name(tree.token[c])} ({tree.count[c]})")
        lines += tree_lines(tree, name, depth - 1, c, indent + "    ")
    return lines


def grow_draft(tree: SuffixTree, node: int, budget: int, min_prob: float = 0.0, branching: bool = True) -> Draft:
    """Candidates after a matched ``node``, best first: a child's probability is its parent's times
    ``count(child) / total(parent)``; the most probable open node joins next, until ``budget`` candidates or
    none left with probability >= ``min_prob``. ``branching=False``: one path, the most frequent child at each
    step (a chain)."""
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    heap: list = []
    order = counter()  # ties: first seen first (deterministic)

    def expand(at: int, prob: float, index: int) -> None:
        total = tree.total[at]
        if not total:
            return
        kids = tree.likely_children(at, min_prob / prob)
        if not branching and kids:
            kids = [max(kids, key=lambda c: tree.count[c])]
        for c in kids:
            p = prob * tree.count[c] / total
            if p >= min_prob:
                heapq.heappush(heap, (-p, next(order), c, index))

    expand(node, 1.0, -1)
    while heap and len(tokens) < budget:
        neg_p, _, c, parent = heapq.heappop(heap)
        tokens.append(tree.token[c])
        parents.append(parent)
        probs.append(-neg_p)
        expand(c, -neg_p, len(tokens) - 1)
    return Draft(tokens, parents, probs)


def cut_to_depth(draft: Draft, room: int) -> Draft:
    """The draft without its nodes deeper than ``room`` (they would pass ``max_new_tokens``)."""
    depth, keep, new_index = [], [], {-1: -1}
    for i, p in enumerate(draft.parents):
        depth.append(1 if p < 0 else depth[p] + 1)
        if depth[i] <= room:
            new_index[i] = len(keep)
            keep.append(i)
    return Draft([draft.tokens[i] for i in keep], [new_index[draft.parents[i]] for i in keep],
                 [draft.probs[i] for i in keep], draft.match_length, draft.source)


def merge_drafts(first: Draft, second: Draft, budget: int) -> Draft:
    """One tree holding both drafts' candidates: a path the two share is one path, a node's probability the
    larger of its two estimates; then, best first from the roots down, ``budget`` nodes (a node is never more
    probable than its parent in either draft, so these are the ``budget`` most probable, up to rounding in the
    products of count ratios, and every kept node's parent is kept before it). Source "both" when each draft
    gave something (else the one that did), the match length the longer of the two. O(n log n) for the n
    candidates of both."""
    key_of: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    tokens, parents, probs = [], [], []
    for draft in (first, second):
        at = []  # the draft's node i -> its merged node
        for t, p, q in zip(draft.tokens, draft.parents, draft.probs):
            parent = at[p] if p >= 0 else -1
            node = key_of.get((parent, t))
            if node is None:
                node = key_of[parent, t] = len(tokens)
                tokens.append(t)
                parents.append(parent)
                probs.append(q)
            else:
                probs[node] = max(probs[node], q)
            at.append(node)
    kids: dict[int, list[int]] = {}
    for n, parent in enumerate(parents):
        kids.setdefault(parent, []).append(n)
    heap = [(-probs[n], n) for n in kids.get(-1, [])]
    heapq.heapify(heap)
    kept, new = [], {-1: -1}
    while heap and len(kept) < budget:  # best first from the roots down: a parent is always kept before its children
        _, n = heapq.heappop(heap)
        new[n] = len(kept)
        kept.append(n)
        for c in kids.get(n, []):
            heapq.heappush(heap, (-probs[c], c))
    source = "both" if first.tokens and second.tokens else (first if first.tokens else second).source
    return Draft([tokens[n] for n in kept], [new[parents[n]] for n in kept], [probs[n] for n in kept],
                 max(first.match_length, second.match_length), source)


class GlobalTree:
    """The outputs of finished requests in one :class:`SuffixTree`, at most ``max_requests`` of them: adding
    one more evicts the oldest (first in, first out)."""

    def __init__(self, max_requests: int = 10_000, max_depth: int = 24):
        if max_requests < 1:
            raise ValueError(f"max_requests must be at least 1, got {max_requests}")
        self.max_requests = max_requests
        self.tree = SuffixTree(max_depth)
        self.outputs: deque[list[int]] = deque()

    def add(self, output) -> None:
        """A request has ended: its output joins; the oldest leaves if the cap is passed."""
        output = [int(t) for t in output]
        self.tree.insert(output)
        self.outputs.append(output)
        while len(self.outputs) > self.max_requests:
            self.tree.remove(self.outputs.popleft())

    def clear(self) -> None:
        """Forget every output (a benchmark's stream starts each repeat from an empty tree)."""
        self.tree = SuffixTree(self.tree.max_depth)
        self.outputs.clear()

    def __len__(self) -> int:
        return len(self.outputs)
