"""Suffix decoding: draft from suffix trees over everything already written.

Prompt lookup (:mod:`.lookup`) copies from the current request only. A deployed model also repeats what it wrote
for *earlier* requests: the skeleton of a JSON answer, the frame of a code review, the same edit applied file
after file. SuffixDecoding (Oliaro, Jia, Campos and Qiao, "SuffixDecoding: Extreme Speculative Decoding for
Emerging AI Applications", NeurIPS 2025, arXiv:2411.04975) drafts from two suffix trees:

* a **per-request tree** over the request's own text (the prompt, then each token as it is decided), and
* a **global tree** over the outputs of earlier requests (:class:`GlobalTree`): at most ``max_requests`` of
  them, the oldest evicted first. A request's own output enters it only when the request has ended.

A :class:`SuffixTree` here is a depth-limited suffix trie: every substring of at most ``max_depth`` tokens of
the text it holds is a path from the root, and each node counts how often its string occurred. Where the
current context's suffix of length p is a path (a *match*), the node's children are what followed it, and
their counts estimate how likely each continuation is. From the match we grow a tree of candidates best first
(the most probable node next, a node's probability the product of count ratios along its path), and stop at
a budget that **follows the match length** (``factor * p + offset`` tokens, at most ``max_spec``) and at
candidates below ``min_prob``: a long match earns a long speculation, a weak guess none (the paper's adaptive
speculation; its defaults in vLLM's ``suffix`` method: depth 24, 10,000 cached requests, factor 1, minimum
probability 0.1). A draft's *score*, the sum of its nodes' probabilities, is the number of tokens it expects
to have accepted; of the match lengths and the two trees, the best score proposes.

Costs, with D = ``max_depth`` and L the tokens of a text (measured in Lesson 14):

* insert a finished output: O(L * D) node steps (one path of at most D nodes per start position);
* append one token to an open text (the per-request tree): O(D) (each of the last D - 1 suffixes grows by one);
* remove (evict) an output: O(L * D);
* look up the matches of a context: O(D^2) dictionary look-ups, **whatever the number of requests held**;
* grow a draft of k candidates: O(k * b * log(k * b)), b the children of a node (bounded by the vocabulary);
* memory: at most L * D nodes per text held, fewer where texts repeat (shared paths are stored once).

Every candidate is chosen deterministically, so its q is one-hot and the exact rules verify the tree as they
verify prompt lookup's chain: greedy output identical to plain decoding, sampled output the target's.
"""
from __future__ import annotations

import heapq
import sys
from collections import deque
from dataclasses import dataclass, field
from itertools import count

from ..model import GPT
from .candidates import Proposal
from .session import Progress, Proposer, Session, Settings, decode
from .stats import DecodeStats


class Node:
    """A node of a suffix tree: ``count``, how often the string spelled from the root to it occurred, and
    ``children``, the tokens that followed it (token -> Node)."""
    __slots__ = ("children", "count")

    def __init__(self):
        self.children: dict[int, Node] = {}
        self.count = 0


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
    grows with the request); ``remove(tokens)`` takes a finished text out again (eviction)."""

    def __init__(self, max_depth: int = 24):
        if max_depth < 2:
            raise ValueError(f"max_depth must be at least 2 (a match and one token after it), got {max_depth}")
        self.max_depth = max_depth
        self.root = Node()
        self.n_nodes = 1
        self._ends: list[Node] = []  # nodes where the open text's last suffixes end, shortest first (< max_depth)

    def append(self, token: int) -> None:
        """The open text grows by ``token``: each of its suffixes that ends here (at most ``max_depth`` long)
        occurred once more. O(max_depth)."""
        token = int(token)
        grown = []
        for node in [self.root] + self._ends:  # the empty suffix, then the ones of length 1, 2, ...
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = Node()
                self.n_nodes += 1
            child.count += 1
            grown.append(child)
        self.root.count += 1
        self._ends = grown[:self.max_depth - 1]  # a suffix max_depth long can grow no further

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
            node = self.root
            node.count -= 1
            for depth, t in enumerate(path):
                child = node.children[t]
                child.count -= 1
                if child.count == 0:  # only this occurrence passed here: drop the rest of the path
                    del node.children[t]
                    self.n_nodes -= len(path) - depth
                    break
                node = child

    def matches(self, context) -> list[tuple[int, Node]]:
        """Every suffix of ``context`` that occurred in the tree *followed by something*: (length, node),
        shortest first. A suffix that never occurred (or was never followed) has no longer one that did, so the
        first miss ends the search. Lengths up to ``max_depth - 1``, so a match leaves room for one more token.
        O(max_depth^2) dictionary look-ups, whatever the tree holds."""
        context = [int(t) for t in context[-(self.max_depth - 1):]]
        found = []
        for length in range(1, len(context) + 1):
            node = self.root
            for t in context[len(context) - length:]:
                node = node.children.get(t)
                if node is None:
                    return found
            if not node.children:
                return found
            found.append((length, node))
        return found

    def longest_match(self, context) -> tuple[int, Node | None]:
        """The longest suffix of ``context`` that occurred followed by something: (its length, its node), or
        (0, None) when even its last token never did."""
        found = self.matches(context)
        return found[-1] if found else (0, None)

    def speculate(self, context, max_spec: int = 24, factor: float | None = 1.0, offset: float = 0.0,
                  min_prob: float = 0.1, tree: bool = True) -> Draft:
        """The best :class:`Draft` after ``context``. For each match, longest first: a budget of
        ``min(max_spec, int(factor * length + offset))`` candidates (``factor`` None: a fixed ``max_spec``)
        grown by :func:`grow_draft`; the highest score wins (ties: the longer match). Shorter matches have
        smaller budgets, and a draft never scores more than its budget, so the search stops there."""
        best = Draft()
        for length, node in reversed(self.matches(context)):
            budget = max_spec if factor is None else min(max_spec, int(factor * length + offset + 1e-6))
            if budget <= best.score or budget < 1:
                if factor is None:
                    continue
                break
            draft = grow_draft(node, budget, min_prob, tree)
            if draft.score > best.score:
                best, best.match_length = draft, length
        return best

    def memory_bytes(self) -> int:
        """Bytes held by the nodes and their children's dictionaries (Python's own sizes; walks the tree)."""
        total, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            total += sys.getsizeof(node) + sys.getsizeof(node.children)
            stack.extend(node.children.values())
        return total


def as_dicts(node: "Node | SuffixTree") -> dict:
    """A tree (or the subtree under a node) as nested dicts: token -> the same for what followed it ({} where
    nothing did). The plain form Lesson 14 prints and exercise 10 reads; counts left out."""
    node = node.root if isinstance(node, SuffixTree) else node
    return {t: as_dicts(child) for t, child in node.children.items()}


def tree_lines(node: "Node | SuffixTree", name=str, depth: int = 3, indent: str = "") -> list[str]:
    """The tree (or the subtree under ``node``) drawn as text, down to ``depth`` levels: one line per node,
    ``name(token) (count)``, children indented under their parent, most frequent first."""
    node = node.root if isinstance(node, SuffixTree) else node
    lines = []
    if depth < 1:
        return lines
    for t, child in sorted(node.children.items(), key=lambda kv: -kv[1].count):
        lines.append(f"{indent}{name(t)} ({child.count})")
        lines += tree_lines(child, name, depth - 1, indent + "    ")
    return lines


def grow_draft(node: Node, budget: int, min_prob: float = 0.0, tree: bool = True) -> Draft:
    """Candidates after a matched ``node``, best first: a child's probability is its parent's times
    ``child.count / (sum of the parent's children's counts)``; the most probable open node joins next, until
    ``budget`` candidates or none left with probability >= ``min_prob``. ``tree=False``: one path, the most
    frequent child at each step (a chain)."""
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    heap: list = []
    order = count()  # ties: first seen first (deterministic)

    def expand(at: Node, prob: float, index: int) -> None:
        total = sum(c.count for c in at.children.values())
        kids = at.children.items()
        if not tree and kids:
            kids = [max(kids, key=lambda kv: kv[1].count)]
        for token, child in kids:
            p = prob * child.count / total
            if p >= min_prob:
                heapq.heappush(heap, (-p, next(order), token, child, index))

    expand(node, 1.0, -1)
    while heap and len(tokens) < budget:
        neg_p, _, token, child, parent = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        probs.append(-neg_p)
        expand(child, -neg_p, len(tokens) - 1)
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


class Suffix(Proposer):
    """Suffix decoding on the shared loop: each round, the better :class:`Draft` of the request's own tree
    (its prompt and every token decided so far) and of ``cache``'s tree of earlier outputs, as one
    :class:`~.candidates.Proposal` tree (or chain) verified in one target pass. When the generation ends, the
    loop calls :meth:`finish` (a :class:`~.session.Session` at the end of ``run``, the batch engine as the
    sequence retires) and its output joins ``cache``: never earlier, so no request drafts from its own answer.

    adaptive: budget ``factor * match length + offset`` (at most ``max_spec``) and ``min_prob``, as in the
    paper; False: a fixed ``max_spec`` candidates, no probability floor. tree: False proposes one path.
    ``rounds`` records each round's (source, match length, candidates) -- source "prompt", "global" or "".

    The defaults are vLLM's (depth 24, at most 24 candidates, probability floor 0.1) except the budget: factor 4
    and offset 2 instead of 1 and 0, chosen by replaying the development streams of both model families
    (:func:`replay_suffix`; the course pair's and SmolLM2's, :mod:`minigpt.streams`), never the held-out ones."""

    def __init__(self, cache: GlobalTree | None = None, max_depth: int = 24, max_spec: int = 24,
                 factor: float = 4.0, offset: float = 2.0, min_prob: float = 0.1, adaptive: bool = True,
                 tree: bool = True):
        if max_spec < 1:
            raise ValueError(f"max_spec must be at least 1, got {max_spec}")
        if cache is not None and cache.tree.max_depth != max_depth:
            raise ValueError(f"the global tree's depth ({cache.tree.max_depth}) differs from max_depth ({max_depth})")
        self.cache, self.max_depth, self.max_spec = cache, max_depth, max_spec
        self.factor = factor if adaptive else None
        self.offset, self.min_prob = offset, (min_prob if adaptive else 0.0)
        self.tree = tree
        self.cheap = not tree  # a path costs no model pass and may be cut to any length (decoding.auto's option)
        self.max_width = 1 + max_spec
        self.local: SuffixTree | None = None
        self._session, self._seen = None, 0
        self.rounds: list[tuple[str, int, int]] = []

    def start(self, progress: Progress) -> None:
        """A generation begins: its own tree starts empty (the global tree is kept, and shared by forks)."""
        self.local, self._session, self._seen = SuffixTree(self.max_depth), progress, 0
        self.rounds = []

    def _sync(self, progress: Progress) -> None:
        """Bring the request's own tree up to ``progress.seq``: O(max_depth) per token it has not seen."""
        if progress is not self._session:
            self.start(progress)
        for t in progress.seq[self._seen:]:
            self.local.append(t)
        self._seen = len(progress.seq)

    def best_draft(self, progress: Progress) -> Draft:
        """This round's best draft, before it is cut to the room left."""
        self._sync(progress)
        context = progress.seq[-(self.max_depth - 1):]
        args = (self.max_spec, self.factor, self.offset, self.min_prob, self.tree)
        best = self.local.speculate(context, *args)
        best.source = "prompt" if best.tokens else ""
        if self.cache is not None and len(self.cache):
            other = self.cache.tree.speculate(context, *args)
            if other.score > best.score:
                best, best.source = other, "global"
        return best

    def propose(self, session: Session, room: int) -> Proposal:
        best = cut_to_depth(self.best_draft(session), room)
        self.rounds.append((best.source, best.match_length, len(best.tokens)))
        return Proposal([session.seq[-1]] + best.tokens, [-1] + [p + 1 for p in best.parents])

    def finish(self, progress: Progress) -> None:
        """The generation has ended: its output joins the global tree (never before: while it runs, its own
        tree already holds it)."""
        if self.cache is not None:
            self.cache.add(progress.output)


def suffix_generate(target: GPT, prompt, max_new_tokens: int, cache: GlobalTree | None = None,
                    max_depth: int = 24, max_spec: int = 24, factor: float = 4.0, offset: float = 2.0,
                    min_prob: float = 0.1, adaptive: bool = True, tree: bool = True, settings: Settings | None = None,
                    **sampling) -> tuple[list[int], DecodeStats]:
    """Speculative decoding with suffix-tree drafts (:class:`Suffix`); returns (new token ids, statistics).

    cache: the :class:`GlobalTree` of earlier outputs (None: the request's own tree only); this generation's
    output joins it at the end. max_depth: the trees' depth (match plus speculation); max_spec: the most
    candidates per round; factor, offset: the budget per matched token; min_prob: the floor of a candidate's
    estimated probability; adaptive False: always ``max_spec`` candidates; tree False: one path per round.
    ``settings`` or its fields as keywords (:class:`~.session.Settings`): how the target samples and when it
    stops."""
    proposer = Suffix(cache, max_depth, max_spec, factor, offset, min_prob, adaptive, tree)
    return decode(target, prompt, max_new_tokens, proposer, settings, **sampling)


def replay_suffix(prompt, output, cache: GlobalTree | None = None, **settings) -> list[tuple[int, int]]:
    """Greedy suffix decoding replayed on a known greedy ``output``, without the model: (candidates, accepted)
    per round. Greedy verification accepts the deepest path of the draft that agrees with the output, so the
    rounds are those :func:`suffix_generate` would make (settings: :class:`Suffix`'s); ``output`` joins ``cache``
    at the end, as it would. Settings can be swept for free, like :func:`~.lookup.replay_lookup`."""
    proposer = Suffix(cache, **settings)
    progress = Progress()
    progress.seq = [int(t) for t in prompt]
    output = [int(t) for t in output]
    done, rounds = 0, []
    while done < len(output):
        draft = cut_to_depth(proposer.best_draft(progress), len(output) - done - 1)
        node, n = -1, 0
        while True:  # follow the output down the draft tree
            node = next((i for i, (t, p) in enumerate(zip(draft.tokens, draft.parents))
                         if p == node and t == output[done + n]), None)
            if node is None:
                break
            n += 1
        rounds.append((len(draft.tokens), n))
        progress.seq += output[done:done + n + 1]
        done += n + 1
    if cache is not None:
        cache.add(output)
    return rounds
