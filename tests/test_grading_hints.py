"""A failed case's hint must point at the bug the learner made, not at whatever bug the case was written for.

Each wrong version below fails a case that other bugs fail too; the grader recognises the mistake (by comparing
the answer with what known mistakes give, or by the shape of the failure) and its hint must say so.
"""
from __future__ import annotations

import math

import torch

from minigpt.decoding.lookup import find_candidates
from minigpt.grading import check

from test_grading_ex04_ex05 import misses_occurrence_at_index_0


def _failed(name, fn):
    return {c.name: c for c in check(name, fn, verbose=False).cases if not c.passed}


def _case(failed: dict, prefix: str):
    return next(c for n, c in failed.items() if n.startswith(prefix))


def test_missing_index_0_is_not_told_about_min_ngram():
    failed = _failed("find_candidates", misses_occurrence_at_index_0)
    assert failed
    for case in failed.values():
        assert "index 0" in case.hint, (case.name, case.hint)
        assert not case.hint.startswith("stop trying at n = min_ngram")


def test_reversing_the_callers_seq_loses_a_point_and_names_reverse():
    def reverses(seq, max_ngram, num_pred, min_ngram=1):
        seq.reverse()
        return find_candidates(seq[::-1], max_ngram, num_pred, min_ngram)

    failed = _failed("find_candidates", reverses)
    assert list(failed) == ["leaves the caller's seq unchanged"]
    assert "reverse" in _case(failed, "leaves").hint


def test_reading_the_next_row_of_p_is_not_told_about_the_bonus_token():
    def reads_p_next_row(draft_tokens, q, p, generator=None):  # p[i + 1] where p[i] is meant
        out = []
        for i, x in enumerate(draft_tokens):
            if float(torch.rand((), generator=generator)) < min(1.0, float(p[i + 1, x] / q[i, x])):
                out.append(int(x))
                continue
            r = (p[i + 1] - q[i]).clamp(min=0)
            return out + [int(torch.multinomial(r / r.sum(), 1, generator=generator))]
        return out + [int(torch.multinomial(p[len(draft_tokens)], 1, generator=generator))]

    failed = _failed("speculative_step", reads_p_next_row)
    identical = _case(failed, "q == p")
    assert "bonus" not in identical.hint and "row i" in identical.hint, identical.hint


def test_forgotten_bonus_token_is_told_about_the_bonus_token():
    from minigpt.decoding.verify import accept_sampled

    def no_bonus(draft_tokens, q, p, generator=None):
        out = accept_sampled(draft_tokens, q, p, generator)
        return out[:-1] if len(out) == len(draft_tokens) + 1 else out

    assert "bonus" in _case(_failed("speculative_step", no_bonus), "q == p").hint


def test_in_place_scaling_of_q_loses_a_point_with_an_in_place_hint():
    def scales_q_in_place(q, k_new, v_new, k_cache, v_cache):
        q /= math.sqrt(q.shape[-1])
        k, v = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
        S, T = k_cache.shape[2], q.shape[2]
        allowed = torch.ones(T, S + T, dtype=torch.bool).tril(diagonal=S)
        return torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~allowed, float("-inf")), -1) @ v, k, v

    failed = _failed("attend_with_cache", scales_q_in_place)
    assert list(failed) == ["leaves its inputs unchanged (q, k_new, v_new and the cache)"]
    assert "in place" in next(iter(failed.values())).hint


def test_a_draft_from_the_global_rng_is_not_reproducible():
    def global_rng(next_probs, context, gamma, generator=None):
        seq, tokens, qs = list(context), [], []
        for _ in range(gamma):
            q = next_probs(seq)
            tokens.append(int(torch.multinomial(q, 1)))
            qs.append(q)
            seq.append(tokens[-1])
        return tokens, torch.stack(qs)

    failed = _failed("draft", global_rng)
    assert list(failed) == ["the same generator seed gives the same draft, another seed another draft"]
    assert "generator" in next(iter(failed.values())).hint


def test_attention_bugs_get_their_own_hints():
    def top_left_mask(q, k_new, v_new, k_cache, v_cache):
        k, v = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), k, v

    failed = _failed("attend_with_cache", top_left_mask)
    assert "top-left" in _case(failed, "4 new tokens after 6 cached").hint
