"""The graders of exercises 07 (exact tree sampling) and 08 (the speed-up model) are themselves tested.

The solution notebooks' functions and the library's references earn full marks; realistic wrong versions
(kept below, each named for its bug) lose points; the stubs score zero; the statistical cases' bound is far
below the distance the biased rules reach (measured here, on the grader's own inputs).
"""
from __future__ import annotations

import math

import pytest
import torch

from minigpt.decoding.candidates import children_of
from minigpt.decoding.verify import accept_tree_sampled, residual_distribution
from minigpt.exactness import accept_tree_per_path
from minigpt.grading import EXERCISES, check
from minigpt.grading import ex07, ex08
from minigpt.exactness import tv_bound, tv_distance
from minigpt.grading.core import frequencies, run_case

from test_grading_ex04_ex05 import graded_functions, solution  # noqa: E402  (one copy of the helpers)


def _sample(dist, g):
    return int(torch.multinomial(dist, 1, generator=g))


# ---- ex07: wrong versions of tree_speculative_step(tokens, parents, q, p, generator) ---------------------------

def _walk(tokens, parents, q, p, g, *, update="residual", fallback="current", descend=True, first_only=False):
    """The sibling rule with pluggable mistakes (the defaults give the right rule)."""
    kids = children_of(parents)
    path, node = [], 0
    while True:
        dist = p[node]
        for c in kids[node][:1] if first_only else kids[node]:
            x = int(tokens[c])
            if float(torch.rand((), generator=g)) < min(1.0, float(dist[x]) / float(q[c, x])):
                break
            if update == "residual":
                dist = residual_distribution(dist, q[c])
            elif update == "unnormalised":
                dist = (dist - q[c]).clamp(min=0)
            # update == "none": every sibling is tested against the target's p itself
        else:
            if fallback == "p":
                return path, _sample(p[node], g)
            if update == "none" and kids[node]:
                return path, _sample(residual_distribution(p[node], q[kids[node][-1]]), g)
            return path, _sample(dist, g)
        path.append(c)
        if not descend:
            return path, _sample(p[c], g)
        node = c


per_path_rule = accept_tree_per_path  # Lesson 05's biased rule: each root-to-leaf path alone, the longest kept


def no_residual_between_siblings(tokens, parents, q, p, generator=None):
    return _walk(tokens, parents, q, p, generator, update="none")


def residual_not_normalised(tokens, parents, q, p, generator=None):
    return _walk(tokens, parents, q, p, generator, update="unnormalised")


def fallback_from_p_not_residual(tokens, parents, q, p, generator=None):
    return _walk(tokens, parents, q, p, generator, fallback="p")


def only_first_child(tokens, parents, q, p, generator=None):
    # still exact in distribution (a chain through the first children), but it throws the siblings away
    return _walk(tokens, parents, q, p, generator, first_only=True)


def never_descends(tokens, parents, q, p, generator=None):
    # stops after the first accepted child: exact too, but the tree's deeper levels are never used
    return _walk(tokens, parents, q, p, generator, descend=False)


def tree_ignores_generator(tokens, parents, q, p, generator=None):
    return accept_tree_sampled(tokens, parents, q, p, None)


def residual_written_into_p(tokens, parents, q, p, generator=None):
    # right rule, but the residual is computed in the caller's p
    kids = children_of(parents)
    path, node = [], 0
    while True:
        for c in kids[node]:
            x = int(tokens[c])
            if float(torch.rand((), generator=generator)) < min(1.0, float(p[node, x] / q[c, x])):
                break
            p[node] -= q[c]
            p[node].clamp_(min=0)
            p[node] /= p[node].sum()
        else:
            return path, _sample(p[node], generator)
        path.append(c)
        node = c


# ---- ex08: wrong versions ---------------------------------------------------------------------------------------

def tokens_closed_form_at_the_mean(alphas):
    # Lesson 04b's formula with the profile's mean: right only for a constant profile
    if not alphas:
        return 1.0
    a, g = sum(alphas) / len(alphas), len(alphas)
    return g + 1.0 if a == 1 else (1 - a ** (g + 1)) / (1 - a)


def tokens_each_draft_independent(alphas):
    # forgets that a rejection ends the round
    return 1.0 + sum(alphas)


def tokens_forgot_target_token(alphas):
    total, reach = 0.0, 1.0
    for a in alphas:
        reach *= a
        total += reach
    return total


def tokens_alpha_k_to_the_k(alphas):
    # mixes Lesson 04b's alpha^k with the profile
    return 1.0 + sum(a ** (k + 1) for k, a in enumerate(alphas))


def tokens_product_off_by_one(alphas):
    # sums P(A >= k - 1) instead of P(A >= k)
    total, reach = 1.0, 1.0
    for a in alphas:
        total += reach
        reach *= a
    return total


def _speeds(alphas, c, r):
    cost = r if r is not None else (lambda k: 1.0)
    return [ex08.reference_expected_tokens(alphas[:g]) / (g * c + cost(g + 1)) for g in range(len(alphas) + 1)]


def best_gamma_never_zero(alphas, c, r=None):
    # Lesson 04b's habit: some gamma >= 1, even when it is slower than plain decoding
    s = _speeds(alphas, c, r)
    return max(range(1, len(alphas) + 1), key=s.__getitem__)


def best_gamma_ties_to_largest(alphas, c, r=None):
    s = _speeds(alphas, c, r)
    return max(range(len(s)), key=lambda g: (s[g], g))


def best_gamma_hill_climb(alphas, c, r=None):
    # stops at the first gamma whose successor is slower
    s = _speeds(alphas, c, r)
    g = 0
    while g < len(alphas) and s[g + 1] >= s[g]:
        g += 1
    return g


def best_gamma_r_of_gamma(alphas, c, r=None):
    # prices the verification pass at r(gamma), not r(gamma + 1)
    cost = r if r is not None else (lambda k: 1.0)
    return max(range(len(alphas) + 1), key=lambda g: ex08.reference_expected_tokens(alphas[:g]) / (
        g * c + (cost(g) if g else 1.0)))


def best_gamma_mean_alpha(alphas, c, r=None):
    mean = sum(alphas) / len(alphas)
    return ex08.reference_best_gamma([mean] * len(alphas), c, r)


def best_gamma_returns_speedup(alphas, c, r=None):
    return max(_speeds(alphas, c, r))


def break_even_is_c(c, r=None, gamma_max=8):
    # right with free verification only
    return c if c < 1 else None


def break_even_gamma_1_only(c, r=None, gamma_max=8):
    # the closed form for gamma = 1: alpha = c + r(2) - 1
    cost = r if r is not None else (lambda k: 1.0)
    a = max(0.0, c + cost(2) - 1)
    return a if a <= 1 else None


def break_even_coarse_bisection(c, r=None, gamma_max=8):
    # the right search, stopped after 8 halvings: within 0.004, not 1e-6
    cost = r if r is not None else (lambda k: 1.0)
    found = None
    for g in range(1, gamma_max + 1):
        if g + 1 < g * c + cost(g + 1):
            continue
        lo, hi = 0.0, 1.0
        for _ in range(8):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if ex08.reference_expected_tokens([mid] * g) < g * c + cost(g + 1) else (lo, mid)
        found = hi if found is None else min(found, hi)
    return found


def break_even_one_when_nothing_pays(c, r=None, gamma_max=8):
    # returns 1.0 instead of None when no alpha pays
    got = ex08.reference_break_even_alpha(c, r, gamma_max)
    return 1.0 if got is None else got


def break_even_r_of_gamma(c, r=None, gamma_max=8):
    cost = r if r is not None else (lambda k: 1.0)
    shifted = lambda k: cost(k - 1) if k > 2 else 1.0  # noqa: E731  (r(gamma) where r(gamma + 1) is meant)
    return ex08.reference_break_even_alpha(c, shifted if r is not None else None, gamma_max)


WRONG = {
    "tree_speculative_step": [per_path_rule, no_residual_between_siblings, residual_not_normalised,
                              fallback_from_p_not_residual, only_first_child, never_descends,
                              tree_ignores_generator, residual_written_into_p],
    "expected_tokens": [tokens_closed_form_at_the_mean, tokens_each_draft_independent, tokens_forgot_target_token,
                        tokens_alpha_k_to_the_k, tokens_product_off_by_one],
    "best_gamma": [best_gamma_never_zero, best_gamma_ties_to_largest, best_gamma_hill_climb, best_gamma_r_of_gamma,
                   best_gamma_mean_alpha, best_gamma_returns_speedup],
    "break_even_alpha": [break_even_is_c, break_even_gamma_1_only, break_even_coarse_bisection,
                         break_even_one_when_nothing_pays, break_even_r_of_gamma],
}


def test_exercises_are_registered_with_their_notebooks():
    assert EXERCISES["tree_speculative_step"].notebook == "ex07_tree_sampling.ipynb"
    for name in ("expected_tokens", "best_gamma", "break_even_alpha"):
        assert EXERCISES[name].notebook == "ex08_speedup_model.ipynb"
    for name in WRONG:
        assert EXERCISES[name].max_points >= 5 and len(WRONG[name]) >= 4


def test_library_and_reference_functions_earn_full_marks():
    assert check("tree_speculative_step", accept_tree_sampled, verbose=False).full_marks
    assert check("expected_tokens", ex08.reference_expected_tokens, verbose=False).full_marks
    assert check("best_gamma", ex08.reference_best_gamma, verbose=False).full_marks
    assert check("break_even_alpha", ex08.reference_break_even_alpha, verbose=False).full_marks


@pytest.mark.parametrize("name", sorted(WRONG))
def test_stubs_score_zero(name):
    result = check(name, solution(name, "exercises"), verbose=False)
    assert result.points == 0 and result.status == "not implemented yet", result.status


def _toy_tv(rule, n: int = 4000, seed: int = 711) -> float:
    """TV between the joint distribution of the first two output tokens on Lesson 05's toy tree and the exact
    one, exactly as the grader's toy case measures it."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(16)
    for _ in range(n):
        tokens, parents, q, p = ex07._toy_tree(g)
        path, token = rule(tokens, parents, q, p, g)
        out = [tokens[i] for i in path] + [token]
        if len(out) == 1:
            out.append(int(torch.multinomial(ex07.TOY_P[out[0]], 1, generator=g)))
        counts[4 * out[0] + out[1]] += 1
    return tv_distance(frequencies(counts), (ex07.TOY_P[0][:, None] * ex07.TOY_P).flatten())


def test_the_bound_is_far_below_what_the_biased_rule_reaches():
    bound = tv_bound(4000, 16, delta=1e-6)  # the grader's bound
    assert _toy_tv(accept_tree_sampled) < bound
    biased = _toy_tv(per_path_rule)
    assert biased > 3 * bound, (biased, bound)  # measured: about 0.31 against a bound of about 0.073


def test_biased_sibling_rules_are_far_outside_the_bound_on_deterministic_siblings():
    # the exact first-token distributions of the wrong rules that _one_level_variants knows, against p
    p_root, xs = ex07._det_siblings_inputs()
    bound = tv_bound(8000, 6, delta=1e-6)  # the grader's 8000 rounds
    for dist, hint in ex07._one_level_variants(p_root, xs):
        assert 0.5 * float((dist - p_root.double()).abs().sum()) > 2 * bound, hint


def _run_cases(name: str, fn, *prefixes: str) -> dict:
    """Run only the cases of ``name`` whose names start with one of ``prefixes`` (the statistical ones are slow)."""
    return {c.name: run_case(c, fn) for c in EXERCISES[name].cases if c.name.startswith(prefixes)}


def test_tree_hints_name_the_bug():
    got = _run_cases("tree_speculative_step", no_residual_between_siblings, "three deterministic", "Lesson 05's toy")
    det = next(r for n, r in got.items() if n.startswith("three deterministic"))
    toy = next(r for n, r in got.items() if n.startswith("Lesson 05's toy"))
    assert not det.passed and "residual" in det.hint, det.line()
    assert not toy.passed and "accepts" in toy.hint, toy.line()
    toy = next(iter(_run_cases("tree_speculative_step", per_path_rule, "Lesson 05's toy").values()))
    assert not toy.passed and "each path was verified on its own" in toy.hint, toy.line()


def test_speedup_model_hints_name_the_bug():
    def failed_hints(name, fn):
        return [c.hint for c in check(name, fn, verbose=False).cases if not c.passed]

    assert any("mean" in h for h in failed_hints("expected_tokens", tokens_closed_form_at_the_mean))
    assert any("rejection" in h for h in failed_hints("expected_tokens", tokens_each_draft_independent))
    assert any("one token of the target" in h for h in failed_hints("expected_tokens", tokens_forgot_target_token))
    assert any("gamma = 0" in h for h in failed_hints("best_gamma", best_gamma_never_zero))
    assert any("tie" in h for h in failed_hints("best_gamma", best_gamma_ties_to_largest))
    assert any("fall and rise" in h for h in failed_hints("best_gamma", best_gamma_hill_climb))
    assert any("r(gamma + 1)" in h for h in failed_hints("best_gamma", best_gamma_r_of_gamma))
    assert any("smallest over gamma" in h for h in failed_hints("break_even_alpha", break_even_gamma_1_only))
    assert any("1e-6" in h for h in failed_hints("break_even_alpha", break_even_coarse_bisection))
    assert any("None" in h for h in failed_hints("break_even_alpha", break_even_one_when_nothing_pays))


def test_a_constant_answer_earns_nothing_on_the_speedup_model():
    # the attack ends with stubs returning 1.0; no case of exercise 08 may accept a constant
    for name in ("expected_tokens", "best_gamma", "break_even_alpha"):
        for constant in (1.0, 1, 0, 0.5, 2, None):
            result = check(name, lambda *a, _c=constant, **k: _c, verbose=False)
            assert result.points == 0, (name, constant, [c.name for c in result.cases if c.passed])


def test_simulation_bound_holds_for_the_formula():
    # the Hoeffding bound of the simulated case is met by the exact formula with a wide margin
    for alphas, seed in (([0.6] * 3, 1), ([0.9, 0.7, 0.5, 0.3], 2)):
        sim = ex08.simulate_rounds(alphas, 200_000, seed)
        gap = abs(float(sim.mean()) - ex08.reference_expected_tokens(alphas))
        assert gap < ex08.hoeffding(len(alphas), 200_000) / 2
    assert math.isclose(ex08.reference_expected_tokens([0.6] * 3), (1 - 0.6 ** 4) / (1 - 0.6))


def test_break_even_is_where_the_best_gamma_leaves_zero():
    # just above the break-even alpha some gamma pays, just below none does: the two functions agree
    for c, r in ((0.1, None), (0.05, ex08._step(8, 1.5, 3.0, 5)), (0.2, ex08._linear(0.1, 8))):
        alpha = ex08.reference_break_even_alpha(c, r, 8)
        assert ex08.reference_best_gamma([alpha + 1e-4] * 8, c, r) > 0
        assert ex08.reference_best_gamma([alpha - 1e-4] * 8, c, r) == 0
