"""Checks for exercise 10: suffix decoding's lookup of the longest matching suffix.

``longest_match(trie, context, max_depth)``: ``trie`` is a suffix tree as nested dicts (``trie[a][b]`` holds the
tokens that followed the string ``[a, b]`` somewhere; ``{}`` where nothing did). Return the length p of the
longest suffix ``context[-p:]``, at most ``max_depth - 1`` tokens, that is a path of the trie ending at a node
with at least one child (it occurred, *followed by something*); 0 when even the last token never was.
Reference: :meth:`minigpt.decoding.suffix.SuffixTree.longest_match`; the tries come from
:class:`~minigpt.decoding.suffix.SuffixTree` through :func:`~minigpt.decoding.suffix.as_dicts`.
"""
from __future__ import annotations

import random

from ..decoding.suffix import SuffixTree, as_dicts
from .core import Exercise, Mismatch
from .helpers import call_unchanged, pick_hint

NOTEBOOK = "ex10_suffix_match.ipynb"

match = Exercise("longest_match", NOTEBOOK, "the length of the longest suffix of the context that the suffix "
                 "tree holds followed by something (at most max_depth - 1; 0 if none)")


def _matcher(trie, context, max_depth, *, childless=False, shift=0, shortest=False):
    """The lookup with one pluggable mistake (the defaults give the right answer)."""
    best = 0
    for n in range(1, min(max_depth - 1, len(context)) + 1):
        node = trie
        for t in context[len(context) - n:]:
            node = node.get(t) if isinstance(node, dict) else None
            if node is None:
                break
        if node is None or (not node and not childless):
            continue
        best = n
        if shortest:
            break
    return max(0, best + shift) if best else 0


_BUGS = [
    (dict(childless=True), "a suffix that was never followed by anything counted: in the request's own tree the "
                           "context itself is such a path (its last occurrence ends the text); the node you reach "
                           "must have at least one child"),
    (dict(shift=1), "one too many: the match length is the number of context tokens you walked, not one more"),
    (dict(shift=-1), "one too few: a suffix of n tokens takes n steps from the root, and its length is n"),
    (dict(shortest=True), "a shorter match won: keep trying longer suffixes and return the longest that matches"),
]


def _diagnose(got, trie, context, max_depth) -> str | None:
    hints = []
    for kw, hint in _BUGS:
        if _matcher(trie, context, max_depth, **kw) == got:
            hints.append(hint)
    return pick_hint(hints)


def _tree(texts, max_depth, open_text=()) -> SuffixTree:
    """A tree holding finished ``texts`` and, as the open text, ``open_text`` (a request's own tree)."""
    tree = SuffixTree(max_depth)
    for t in texts:
        tree.insert(t)
    for t in open_text:
        tree.append(t)
    return tree


def _case(fn, texts, context, max_depth, own: bool = False) -> str:
    """Compare with the reference; ``own``: the context is in the trie too, as in a request's own tree."""
    tree = _tree(texts, max_depth, context if own else ())
    want = tree.longest_match(context)[0]
    trie = as_dicts(tree)
    got = fn(trie, list(context), max_depth)
    if isinstance(got, bool) or not isinstance(got, int):
        raise Mismatch("an int (the match length)", f"a {type(got).__name__}: {got!r}",
                       "return the length of the longest matching suffix as an int, 0 when none matches")
    if got != want:
        where = f"texts={texts}" + (" plus the context itself (a request's own tree)" if own else "")
        raise Mismatch(f"{want} for context={list(context)}, max_depth={max_depth}, {where}", f"{got}",
                       _diagnose(got, trie, list(context), max_depth))
    return f"{list(context)} -> {got}"


@match.case("an empty tree, an empty context, and a context that never occurred: 0", 1,
            "with nothing to match, the answer is 0", side=True)
def _empty(fn):
    _case(fn, [], [1, 2, 3], 4)
    _case(fn, [[1, 2, 3]], [], 4)
    return _case(fn, [[1, 2, 3]], [5, 6], 4)


@match.case("the longest suffix that occurred wins over shorter ones", 2,
            "walk context[-n:] for n = 1, 2, ... and keep the largest n that reaches a node with children")
def _longest(fn):
    _case(fn, [[7, 1, 2, 3, 9], [2, 3, 4]], [5, 1, 2, 3], 6)
    return _case(fn, [[4, 5, 6, 7], [6, 8]], [0, 4, 5, 6], 6)


@match.case("a suffix that was never followed by anything does not count", 2,
            "check that the node you reach has at least one child: a text that ends there offers nothing to draft")
def _followed(fn):
    _case(fn, [[1, 2, 3], [5, 2, 3, 4]], [1, 2, 3], 5)   # [1, 2, 3] ends a text; [2, 3] was followed by 4
    return _case(fn, [[3, 4]], [9, 3, 4], 5)


@match.case("a request's own tree holds the context itself: only earlier occurrences count", 2,
            "the context's own last occurrence is a path with nothing after it; it must not be taken as a match")
def _own(fn):
    _case(fn, [], [1, 2, 3, 1, 2], 6, own=True)
    _case(fn, [], [4, 5, 6, 7], 6, own=True)
    return _case(fn, [[9, 9]], [8, 7, 8, 7], 6, own=True)


@match.case("a context longer than the tree is deep: matches of up to max_depth - 1 tokens", 1,
            "try lengths 1 .. max_depth - 1 (a match of max_depth tokens would leave no room to draft)")
def _cap(fn):
    text = list(range(12))
    _case(fn, [text], list(range(8)), 4)
    return _case(fn, [text], list(range(8)), 6)


@match.case("300 random trees and contexts agree with the reference", 2,
            "for n = 1, 2, ... up to max_depth - 1: walk context[-n:] from the root; the longest walk that "
            "succeeds and ends at a node with children is the answer")
def _random(fn):
    rng = random.Random(1001)
    for r in range(300):
        depth = rng.randint(2, 8)
        texts = [[rng.randrange(3) for _ in range(rng.randint(1, 20))] for _ in range(rng.randint(0, 3))]
        context = [rng.randrange(3) for _ in range(rng.randint(0, 12))]
        _case(fn, texts, context, depth, own=r % 3 == 0)
    return "300 random cases right"


@match.case("leaves the caller's trie and context unchanged", 1,
            "read them only: node.get(t) does not add a key, node[t] = ... and context.pop() do", side=True)
def _unchanged(fn):
    tree = _tree([[1, 2, 3, 1, 2, 4], [2, 4, 4]], 5)
    for context in ([9, 1, 2], [4, 4, 7]):
        call_unchanged(fn, (as_dicts(tree), list(context), 5), ("trie", "context", "max_depth"))
    return "trie and context unchanged"
