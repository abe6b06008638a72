"""Checks for exercise 05: the n-gram finder of prompt lookup decoding.

``find_candidates(seq, max_ngram, num_pred, min_ngram=1)``: for n from ``max_ngram`` down to ``min_ngram``, take
the last n tokens of ``seq``; if they occurred earlier (the suffix's own occurrence does not count), return the
up to ``num_pred`` tokens that followed their most recent earlier occurrence; if no n matches, return ``[]``.
Reference: :func:`minigpt.decoding.lookup.find_candidates`.
"""
from __future__ import annotations

import torch

from ..decoding.lookup import find_candidates as reference
from .core import Exercise, Mismatch, expect_token_list
from .helpers import call_unchanged, pick_hint

NOTEBOOK = "ex05_prompt_lookup.ipynb"

lookup = Exercise("find_candidates", NOTEBOOK, "the tokens after the most recent earlier occurrence of the "
                  "longest suffix n-gram (max_ngram down to min_ngram), at most num_pred of them")


def _finder(seq, max_ngram, num_pred, min_ngram=1, *, sizes=None, recent=True, self_match=False, shift=0,
            limit=True, first_start=0):
    """The n-gram finder with one pluggable mistake (the defaults give the right answer)."""
    sizes = sizes if sizes is not None else range(max_ngram, min_ngram - 1, -1)
    for n in sizes:
        if n < 1 or len(seq) < n or (len(seq) == n and not self_match):
            continue
        last = len(seq) - n if self_match else len(seq) - n - 1
        starts = range(last, first_start - 1, -1) if recent else range(first_start, last + 1)
        for s in starts:
            if seq[s:s + n] == seq[-n:]:
                begin = s + n - shift
                return list(seq[begin:begin + num_pred]) if limit else list(seq[begin:])
    return []


_FINDER_BUGS = [
    (dict(first_start=1), "the search never looks at start index 0: range(len(seq) - n - 1, -1, -1) includes it"),
    (dict(self_match=True), "the suffix matched itself (start len(seq) - n): only starts before it count"),
    (dict(recent=False), "the oldest occurrence was used: scan the starts from the end backwards, most recent "
                         "first"),
    (dict(shift=1), "the proposal starts at the matched n-gram's last token: it starts right after the n-gram, "
                    "at s + n"),
    (dict(limit=False), "more than num_pred tokens: slice the continuation to at most num_pred"),
    (dict(sizes="ascending"), "a shorter n-gram won over a longer one: try n = max_ngram first, then shorter"),
    (dict(sizes="from_one"), "an n-gram shorter than min_ngram was used: stop at n = min_ngram"),
    (dict(sizes="max_only"), "only n = max_ngram was tried: fall back to shorter n-grams, down to min_ngram"),
]


def _diagnose(got, seq, max_ngram, num_pred, min_ngram) -> str | None:
    hints = []
    for kw, hint in _FINDER_BUGS:
        kw = dict(kw)
        sizes = kw.pop("sizes", None)
        if sizes == "ascending":
            kw["sizes"] = range(min_ngram, max_ngram + 1)
        elif sizes == "from_one":
            kw["sizes"] = range(max_ngram, 0, -1)
        elif sizes == "max_only":
            kw["sizes"] = [max_ngram]
        if _finder(seq, max_ngram, num_pred, min_ngram, **kw) == got:
            hints.append(hint)
    return pick_hint(hints)


def _case(fn, seq, max_ngram, num_pred, min_ngram=1) -> str:
    want = reference(seq, max_ngram, num_pred, min_ngram)
    got = expect_token_list("the candidates", fn(list(seq), max_ngram, num_pred, min_ngram))
    if got != want:
        raise Mismatch(f"{want} for seq={list(seq)}, max_ngram={max_ngram}, num_pred={num_pred}, "
                       f"min_ngram={min_ngram}", f"{got}", _diagnose(got, list(seq), max_ngram, num_pred, min_ngram))
    return f"{list(seq)} -> {got}"


@lookup.case("too short to have an earlier occurrence: [] and [x] give []", 1,
             "with 0 or 1 tokens there is nothing earlier to copy from: return an empty list", side=True)
def _short(fn):
    _case(fn, [], 3, 4)
    _case(fn, [5], 3, 4)
    return "[] for the empty and the 1-token sequence"


@lookup.case("no earlier occurrence: []", 1, "when no suffix n-gram occurred before, there is no proposal", side=True)
def _no_match(fn):
    _case(fn, [1, 2, 3, 4], 3, 4)
    _case(fn, [9, 8, 7], 2, 5)
    return "no match -> []"


@lookup.case("the suffix itself is not a match: skip it and find the earlier occurrence", 2,
             "the last n tokens always 'occur' at the end of seq; only occurrences that start before "
             "len(seq) - n count")
def _not_itself(fn):
    _case(fn, [1, 2, 3], 2, 5)
    return _case(fn, [1, 2, 3, 1, 2], 2, 5)


@lookup.case("the continuation starts right after the matched n-gram", 2,
             "propose seq[start + n : start + n + num_pred], not from the match's last token")
def _continuation(fn):
    _case(fn, [6, 7, 8, 9, 3, 6, 7], 2, 3)
    return _case(fn, [4, 5, 1, 2, 3, 4, 5], 2, 2)


@lookup.case("several earlier occurrences: the most recent one wins", 2,
             "search from the end of the sequence backwards: the most recent context is the best predictor")
def _most_recent(fn):
    _case(fn, [4, 1, 2, 9, 1, 2, 7, 1, 2], 2, 2)
    return _case(fn, [3, 5, 6, 3, 5, 8, 0, 3, 5], 2, 3)


@lookup.case("the longest matching n-gram wins over shorter ones", 2,
             "try n = max_ngram first and only fall back to shorter n-grams when it has no earlier occurrence")
def _longest_first(fn):
    # the 3-gram [1, 2, 3] occurred at the start; the 1-gram [3] occurred more recently, followed by 0
    _case(fn, [1, 2, 3, 4, 5, 9, 3, 0, 1, 2, 3], 3, 2)
    return _case(fn, [7, 1, 5, 1], 3, 4)


@lookup.case("at most num_pred tokens, fewer when the sequence ends first", 1,
             "slice the continuation to num_pred tokens")
def _num_pred(fn):
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    for k in (1, 3, 20):
        _case(fn, seq, 2, k)
    return "num_pred = 1, 3, 20 respected"


@lookup.case("min_ngram: shorter matches are not used", 1, "stop trying at n = min_ngram")
def _min_ngram(fn):
    _case(fn, [7, 1, 5, 1], 3, 4, min_ngram=2)
    return _case(fn, [1, 2, 9, 1, 2], 3, 4, min_ngram=2)


@lookup.case("a match at the very start, and runs of one repeated token", 1,
             "an occurrence starting at index 0 counts; the continuation may run into the suffix itself")
def _edges(fn):
    _case(fn, [8, 9, 1, 8, 9], 2, 4)
    _case(fn, [5, 5, 5, 5, 5], 3, 4)
    return _case(fn, [2, 2], 3, 4)


@lookup.case("300 random sequences over small vocabularies agree with the reference", 2,
             "for n = max_ngram..min_ngram: earlier occurrences of seq[-n:], most recent first; return the "
             "first non-empty continuation")
def _random(fn):
    g = torch.Generator().manual_seed(501)
    for r in range(300):
        vocab = 2 + r % 5
        seq = torch.randint(vocab, (int(torch.randint(0, 30, (1,), generator=g)),), generator=g).tolist()
        max_ngram = 1 + r % 4
        _case(fn, seq, max_ngram, 1 + r % 7, 1 + (r // 4) % max_ngram)
    return "300 random sequences right"


@lookup.case("leaves the caller's seq unchanged", 1,
             "read seq, do not reorder or extend it: seq[::-1] and sorted(seq) make new lists, seq.reverse() "
             "and seq.sort() change the caller's", side=True)
def _unchanged(fn):
    for seq in ([3, 1, 4, 1, 5, 9, 2, 6, 1, 4], [7, 7, 2, 7]):
        call_unchanged(fn, (list(seq), 3, 4, 1), ("seq", "max_ngram", "num_pred", "min_ngram"))
    return "seq unchanged"
