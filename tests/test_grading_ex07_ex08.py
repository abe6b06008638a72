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
from minigpt.grading.core import run_case, tv_bound, tv_distance

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


# ---- ex08: wrong versions -------------------------------------------------------------------------------------

def exponent_gamma_not_gamma_plus_1(alpha, gamma):
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** gamma) / (1 - alpha)


def tokens_forgot_bonus_token(alpha, gamma):
    return float(gamma) if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha) - 1


def tokens_divide_by_zero_at_alpha_1(alpha, gamma):
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def tokens_limit_ignores_gamma(alpha, gamma):
    return gamma + 1.0 if alpha == 1 else 1 / (1 - alpha)


def tokens_precedence(alpha, gamma):
    return gamma + 1.0 if alpha == 1 else (1 - alpha ** gamma + 1) / (1 - alpha)


def speedup_draft_cost_not_times_gamma(alpha, gamma, c, r_verify=1.0):
    return ex08.reference_expected_tokens(alpha, gamma) / (c + r_verify)


def speedup_ignores_r_verify(alpha, gamma, c, r_verify=1.0):
    return ex08.reference_expected_tokens(alpha, gamma) / (gamma * c + 1)


def speedup_gamma_plus_1_draft_passes(alpha, gamma, c, r_verify=1.0):
    return ex08.reference_expected_tokens(alpha, gamma) / ((gamma + 1) * c + r_verify)


def speedup_upside_down(alpha, gamma, c, r_verify=1.0):
    return (gamma * c + r_verify) / ex08.reference_expected_tokens(alpha, gamma)


def _speeds(alpha, c, r, gamma_max):
    r = r or (lambda k: 1.0)
    return [ex08.reference_speedup(alpha, g, c, r(g + 1)) for g in range(1, gamma_max + 1)]


def best_gamma_returns_index(alpha, c, r=None, gamma_max=24):
    s = _speeds(alpha, c, r, gamma_max)
    return max(range(len(s)), key=s.__getitem__)  # 0-based: one less than the gamma it stands for


def best_gamma_ties_to_largest(alpha, c, r=None, gamma_max=24):
    s = _speeds(alpha, c, r, gamma_max)
    best = 1
    for g, v in enumerate(s, start=1):
        if v >= s[best - 1]:
            best = g
    return best


def best_gamma_excludes_gamma_max(alpha, c, r=None, gamma_max=24):
    return max(range(1, gamma_max), key=lambda g: ex08.reference_speedup(alpha, g, c, (r or (lambda k: 1.0))(g + 1)))


def best_gamma_ignores_r(alpha, c, r=None, gamma_max=24):
    return max(range(1, gamma_max + 1), key=lambda g: ex08.reference_speedup(alpha, g, c))


def best_gamma_returns_speedup(alpha, c, r=None, gamma_max=24):
    return max(_speeds(alpha, c, r, gamma_max))


WRONG = {
    "tree_speculative_step": [per_path_rule, no_residual_between_siblings, residual_not_normalised,
                              fallback_from_p_not_residual, only_first_child, never_descends,
                              tree_ignores_generator, residual_written_into_p],
    "expected_tokens": [exponent_gamma_not_gamma_plus_1, tokens_forgot_bonus_token, tokens_divide_by_zero_at_alpha_1,
                        tokens_limit_ignores_gamma, tokens_precedence],
    "speedup": [speedup_draft_cost_not_times_gamma, speedup_ignores_r_verify, speedup_gamma_plus_1_draft_passes,
                speedup_upside_down],
    "best_gamma": [best_gamma_returns_index, best_gamma_ties_to_largest, best_gamma_excludes_gamma_max,
                   best_gamma_ignores_r, best_gamma_returns_speedup],
}


def test_exercises_are_registered_with_their_notebooks():
    assert EXERCISES["tree_speculative_step"].notebook == "ex07_tree_sampling.ipynb"
    for name in ("expected_tokens", "speedup", "best_gamma"):
        assert EXERCISES[name].notebook == "ex08_speedup_model.ipynb"
    for name in WRONG:
        assert EXERCISES[name].max_points >= 5 and len(WRONG[name]) >= 4


def test_library_and_reference_functions_earn_full_marks():
    assert check("tree_speculative_step", accept_tree_sampled, verbose=False).full_marks
    assert check("expected_tokens", ex08.reference_expected_tokens, verbose=False).full_marks
    assert check("speedup", ex08.reference_speedup, verbose=False).full_marks
    assert check("best_gamma", ex08.reference_best_gamma, verbose=False).full_marks


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
    return tv_distance(counts, (ex07.TOY_P[0][:, None] * ex07.TOY_P).flatten())


def test_the_bound_is_far_below_what_the_biased_rule_reaches():
    bound = tv_bound(4000, 16)
    assert _toy_tv(accept_tree_sampled) < bound
    biased = _toy_tv(per_path_rule)
    assert biased > 3 * bound, (biased, bound)  # measured: about 0.31 against a bound of about 0.056


def test_biased_sibling_rules_are_far_outside_the_bound_on_deterministic_siblings():
    # the exact first-token distributions of the wrong rules that _one_level_variants knows, against p
    p_root, xs = ex07._det_siblings_inputs()
    bound = tv_bound(5000, 6)
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
    cases = check("expected_tokens", tokens_forgot_bonus_token, verbose=False).cases
    assert any("one token of the target" in c.hint for c in cases if not c.passed)
    cases = check("expected_tokens", exponent_gamma_not_gamma_plus_1, verbose=False).cases
    assert any("γ + 1 terms" in c.hint for c in cases if not c.passed)
    cases = check("speedup", speedup_draft_cost_not_times_gamma, verbose=False).cases
    assert all("γ·c" in c.hint for c in cases if not c.passed)
    cases = check("best_gamma", best_gamma_ties_to_largest, verbose=False).cases
    assert any("tie" in c.hint for c in cases if not c.passed)
    cases = check("best_gamma", best_gamma_returns_index, verbose=False).cases
    assert all("off by one" in c.hint or "index" in c.hint for c in cases if not c.passed)


def test_simulation_bound_holds_for_the_formula():
    # the Hoeffding bound of the simulated cases is met by the exact formula with a wide margin
    for alpha, gamma, seed in ((0.6, 3, 1), (0.9, 8, 2)):
        sim = ex08.simulate_rounds(alpha, gamma, 200_000, seed)
        gap = abs(float(sim.mean()) - ex08.reference_expected_tokens(alpha, gamma))
        assert gap < ex08.hoeffding(gamma, 200_000) / 2
        assert math.isclose(ex08.reference_expected_tokens(alpha, gamma), sum(alpha ** k for k in range(gamma + 1)))
