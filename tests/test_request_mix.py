"""The request mix for distillation: seeded and prefix-stable, broad (every kind, thousands of distinct requests,
follow-ups with a second turn), and sharing no text and no run of 12 words with the benchmark's requests or the
suffix-decoding streams."""
from __future__ import annotations

from collections import Counter

import pytest

from minigpt.real import request_mix as rm
from minigpt.real.request_sets import HELD_OUT_REQUESTS, REQUESTS


@pytest.fixture(scope="module")
def mix():
    return rm.request_mix(10000)


def test_the_mix_is_seeded_and_a_prefix_of_a_longer_one(mix):
    assert rm.request_mix(500) == mix[:500]
    assert rm.request_mix(500, seed=1) != mix[:500]


def test_the_mix_is_broad(mix):
    assert len(mix) >= 9900 and len({r.turns[0] for r in mix}) == len(mix)
    assert [r.index for r in mix] == sorted({r.index for r in mix}) and mix[-1].index < 10000
    kinds = Counter(r.kind for r in mix)
    assert set(kinds) == set(rm.KINDS) and min(kinds.values()) >= 300
    assert len({r.family for r in mix}) >= 25
    assert all(len(r.turns) == (2 if r.kind == "followup" else 1) for r in mix)
    # the standard library's functions and docstrings are in it, and its validation files are not
    assert any("```python\ndef " in r.turns[0] for r in mix)
    assert sum(r.family.endswith("docstring") for r in mix) >= 500


def test_no_request_shares_text_with_the_benchmark_or_the_streams(mix):
    protected = rm.protected_texts()
    assert len(protected) > len(REQUESTS) + len(HELD_OUT_REQUESTS)          # the streams are in it
    texts = {t.strip() for r in mix for t in r.turns}
    assert not texts & {t.strip() for t in protected}
    grams = set().union(*(rm.word_ngrams(t) for t in protected))
    assert all(grams.isdisjoint(rm.word_ngrams(t)) for t in texts)
    short = [t for t in protected if len(t.split()) < rm.NGRAM]
    assert not any(f" {' '.join(s.lower().split())} " in f" {' '.join(t.lower().split())} " for s in short for t in texts)
    # ... and the check would see one: 12 words of a long benchmark request, or the whole of a short one
    words = REQUESTS[0][1].split()
    assert rm.shares_protected_text(f"Please do this: {' '.join(words[3:15]).upper()} thanks")
    assert not rm.shares_protected_text(" ".join(words[3:14]))
    assert rm.shares_protected_text(f"Hello! {REQUESTS[-1][1]} Thanks.")      # "Give me a short summary of what a CPU does."


def test_unknown_kinds_are_refused():
    with pytest.raises(ValueError, match="unknown request kind"):
        rm.request_mix(10, kinds=("poetry",))
    assert {r.kind for r in rm.request_mix(50, kinds=("math", "code"))} == {"math", "code"}
