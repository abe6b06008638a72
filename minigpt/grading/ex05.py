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

NOTEBOOK = "ex05_prompt_lookup.ipynb"

lookup = Exercise("find_candidates", NOTEBOOK, "the tokens after the most recent earlier occurrence of the "
                  "longest suffix n-gram (max_ngram down to min_ngram), at most num_pred of them")


def _case(fn, seq, max_ngram, num_pred, min_ngram=1) -> str:
    want = reference(seq, max_ngram, num_pred, min_ngram)
    got = expect_token_list("the candidates", fn(list(seq), max_ngram, num_pred, min_ngram))
    if got != want:
        raise Mismatch(f"{want} for seq={list(seq)}, max_ngram={max_ngram}, num_pred={num_pred}, "
                       f"min_ngram={min_ngram}", f"{got}")
    return f"{list(seq)} -> {got}"


@lookup.case("too short to have an earlier occurrence: [] and [x] give []", 1,
             "with 0 or 1 tokens there is nothing earlier to copy from: return an empty list")
def _short(fn):
    _case(fn, [], 3, 4)
    _case(fn, [5], 3, 4)
    return "[] for the empty and the 1-token sequence"


@lookup.case("no earlier occurrence: []", 1, "when no suffix n-gram occurred before, there is no proposal")
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
