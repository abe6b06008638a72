"""Checks for exercise 08: the speed-up model where Lesson 04b stopped (position-dependent acceptance, not
speculating at all, the weakest draft worth having).

Notation as in Lesson 04b and the course's vocabulary: γ drafted tokens per round, c the cost of one draft pass
as a fraction of a one-token target step, r(k) the cost of a target pass over k tokens in one-token steps (r(1)
= 1; a round's verification pass scores γ + 1 tokens, so it costs r(γ + 1)). Lesson 04b gave every drafted
position the same acceptance probability α; here ``alphas[i]`` is the probability that the draft at position
i + 1 is accepted given that the drafts before it were.

* ``expected_tokens(alphas)`` = 1 + Σ_{k=1..γ} Π_{i<k} alphas[i] (γ = len(alphas)): the round emits A + 1 tokens
  and P(A >= k) is the product of the first k acceptance probabilities;
* ``best_gamma(alphas, c, r=None)``: the γ in 0..len(alphas) with the largest speed-up
  expected_tokens(alphas[:γ]) / (γ·c + r(γ + 1)), where γ = 0 is plain decoding (speed-up 1); the smallest such γ
  on a tie (Python's ``max`` over ``range(len(alphas) + 1)``); ``r=None`` means r(k) = 1;
* ``break_even_alpha(c, r=None, gamma_max=8)``: the smallest constant α at which some γ in 1..gamma_max is as fast
  as plain decoding (speed-up 1), or ``None`` when even α = 1 is not. The speed-up grows with α for every γ >= 1,
  so it is the smallest over γ of the root of Σ_{k=1..γ} α^k = γ·c + r(γ + 1) − 1; with r = 1 it is c itself.

The values are checked exactly (relative error 1e-9; break_even_alpha to 1e-6) and expected_tokens also against
a simulation of rounds with those acceptance probabilities, within a Hoeffding bound that a right formula
exceeds with probability below 1e-6. A function returning the same number whatever its inputs earns nothing:
every case has answers that differ.
"""
from __future__ import annotations

import math
import numbers
import random

import torch

from .core import Exercise, Mismatch, expect_number
from .helpers import pick_hint
from .wire import CostTable

NOTEBOOK = "ex08_speedup_model.ipynb"


def reference_expected_tokens(alphas) -> float:
    total, reach = 1.0, 1.0
    for a in alphas:
        reach *= a
        total += reach
    return total


def reference_speedup(alphas, c: float, r=None) -> float:
    gamma = len(alphas)
    return reference_expected_tokens(alphas) / (gamma * c + (r(gamma + 1) if r else 1.0))


def reference_best_gamma(alphas, c: float, r=None) -> int:
    return max(range(len(alphas) + 1), key=lambda g: reference_speedup(list(alphas)[:g], c, r))


def _root(gamma: int, target: float) -> float | None:
    """The α in [0, 1] with Σ_{k=1..γ} α^k = target (the sum grows with α), None if even α = 1 falls short."""
    if target <= 0:
        return 0.0
    if target > gamma:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(mid ** k for k in range(1, gamma + 1)) < target:
            lo = mid
        else:
            hi = mid
    return hi


def reference_break_even_alpha(c: float, r=None, gamma_max: int = 8) -> float | None:
    roots = [_root(g, g * c + (r(g + 1) if r else 1.0) - 1) for g in range(1, gamma_max + 1)]
    roots = [x for x in roots if x is not None]
    return min(roots) if roots else None


def simulate_rounds(alphas, n_rounds: int, seed: int) -> torch.Tensor:
    """Tokens emitted by each of n_rounds simulated rounds: draft i accepted with probability alphas[i] (given the
    ones before it were), until the first rejection, plus the target's one token."""
    g = torch.Generator().manual_seed(seed)
    if not alphas:
        return torch.ones(n_rounds, dtype=torch.float64)
    u = torch.rand(n_rounds, len(alphas), generator=g, dtype=torch.float64)
    accepted = (u < torch.tensor(alphas, dtype=torch.float64)).int()
    return accepted.cumprod(1).sum(1).double() + 1


def hoeffding(width: float, n: int, delta: float = 1e-6) -> float:
    """t such that the mean of n independent values in an interval of this width is t away from its
    expectation with probability below delta."""
    return width * math.sqrt(math.log(2 / delta) / (2 * n))


def _fmt(alphas) -> str:
    return "[" + ", ".join(f"{a:g}" for a in alphas) + "]"


# ---- expected_tokens(alphas) ------------------------------------------------------------------------------------

tokens = Exercise("expected_tokens", NOTEBOOK, "1 + Σ_k Π_{i<k} alphas[i]: the round's accepted drafts plus the "
                  "target's token, with P(A >= k) the product of the first k acceptance probabilities")


def _mean_closed_form(alphas):
    a, g = sum(alphas) / len(alphas), len(alphas)
    return g + 1.0 if a == 1 else (1 - a ** (g + 1)) / (1 - a)


_TOKEN_BUGS = [
    (_mean_closed_form, "Lesson 04b's closed form at the mean acceptance rate: with acceptance probabilities "
                        "that differ by position, P(A >= k) is not (mean)^k. What is the probability that the "
                        "first k drafts are all accepted?"),
    (lambda al: 1 + sum(al), "each draft counted with its own probability, as if a rejection did not end the round: "
                             "draft k is only emitted if every draft before it was accepted too"),
    (lambda al: reference_expected_tokens(al) - 1, "this counts the accepted drafts only; a round also emits one "
                                                   "token of the target (the replacement or the bonus)"),
    (lambda al: 1 + sum(a ** (k + 1) for k, a in enumerate(al)), "alphas[k] to the power k + 1 mixes Lesson 04b's "
                                                                "α^k with the profile: the k-th term is a product "
                                                                "of k different probabilities"),
    (lambda al: 2 + sum(math.prod(al[:k]) for k in range(1, len(al))),
     "off by one: the first term of the sum is P(A >= 1) = alphas[0], not 1"),
]


def _token_hint(got, alphas) -> str | None:
    hints = []
    for bug, hint in _TOKEN_BUGS:
        try:
            want = bug(list(alphas))
        except (ZeroDivisionError, ValueError):
            continue
        if isinstance(got, numbers.Real) and math.isfinite(float(got)) and math.isclose(float(got), want,
                                                                                         rel_tol=1e-9):
            hints.append(hint)
    return pick_hint(hints)


def _tokens_case(fn, profiles) -> str:
    for alphas in profiles:
        got = fn(list(alphas))
        try:
            expect_number(f"expected_tokens({_fmt(alphas)})", got, reference_expected_tokens(alphas))
        except Mismatch as m:
            m.hint = (_token_hint(got, alphas) if alphas else None) or m.hint
            raise
    return f"{len(profiles)} profiles agree"


@tokens.case("a constant profile gives Lesson 04b's closed form (alpha = 0.6, gamma = 3; alpha = 0.9, gamma = 8)", 2,
             "Lesson 04b, section 2: the expected tokens are 1 + the sum over k of P(A >= k)")
def _tokens_constant(fn):
    return _tokens_case(fn, [[0.6] * 3, [0.9] * 8, [0.75]])


@tokens.case("no drafts, or a first draft that is never accepted: one token per round", 1,
             "a round always emits the target's token; nothing after a certain rejection can be accepted")
def _tokens_edges(fn):
    return _tokens_case(fn, [[], [0.0, 0.9, 0.9], [0.5, 0.0, 1.0]])


@tokens.case("a perfect draft: gamma + 1 tokens, also when perfection stops at some position", 1,
             "with acceptance probability 1 every term of the sum is 1 until the first position below 1")
def _tokens_perfect(fn):
    return _tokens_case(fn, [[1.0] * 4, [1.0, 1.0, 0.5], [1, 1]])


@tokens.case("a falling profile (later drafts accepted less often) differs from the mean's closed form", 1,
             "a later draft counts only if all the drafts before it were accepted")
def _tokens_falling(fn):
    return _tokens_case(fn, [[0.8, 0.7, 0.6, 0.5], [0.95, 0.6, 0.3, 0.1, 0.05]])


@tokens.case("agrees with a simulation of 200000 rounds with these acceptance probabilities", 2,
             "simulate it yourself: accept draft k with probability alphas[k] until the first rejection, then add "
             "the target's token; average over rounds")
def _tokens_simulated(fn):
    rng = random.Random(801)
    worst = ""
    for i in range(4):
        alphas = [round(rng.uniform(0.2, 0.98), 3) for _ in range(rng.randint(1, 8))]
        sim = simulate_rounds(alphas, 200_000, seed=802 + i)
        mean, bound = float(sim.mean()), hoeffding(len(alphas), 200_000)
        got = expect_number(f"expected_tokens({_fmt(alphas)})", fn(list(alphas)), mean, rel=1.0)  # a number
        if abs(got - mean) > bound:
            raise Mismatch(f"expected_tokens({_fmt(alphas)}) within {bound:.3f} of the simulated mean "
                           f"{mean:.4f} (200000 rounds)", f"{got:.4f}", _token_hint(got, alphas))
        worst = f"e.g. {_fmt(alphas)}: {got:.4f} vs simulated {mean:.4f} (bound {bound:.3f})"
    return "4 profiles agree with the simulation; " + worst


# ---- best_gamma(alphas, c, r=None) --------------------------------------------------------------------------------

best = Exercise("best_gamma", NOTEBOOK, "the gamma in 0..len(alphas) (0: plain decoding) with the largest speed-up "
                "expected_tokens(alphas[:gamma]) / (gamma c + r(gamma + 1)); the smallest on a tie")


def _linear(slope: float, n: int) -> CostTable:
    return CostTable([1 + slope * (k - 1) for k in range(1, n + 2)], f"1 + {slope:g} (k - 1)")


def _step(n: int, low: float, high: float, width: int) -> CostTable:
    """r(1) = 1, r(k) = low for 2 <= k <= width + 1, high beyond: a pass that pays a fixed price for its second
    token and little for the next ones, up to a tile's width."""
    return CostTable([1.0] + [low if k <= width + 1 else high for k in range(2, n + 2)],
                     f"1, then {low:g} up to {width + 1} tokens, {high:g} beyond")


def _best_case(fn, alphas, c, r=None, label=None) -> int:
    want = reference_best_gamma(alphas, c, r)
    got = fn(list(alphas), c, r)
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    what = label or f"best_gamma({_fmt(alphas) if len(set(alphas)) > 1 else f'[{alphas[0]:g}] * {len(alphas)}'}, " \
                    f"{c:g}{', ' + repr(r) if r else ''})"
    if isinstance(got, bool) or not isinstance(got, numbers.Integral):
        raise Mismatch(f"{what} as an int ({want} here)", f"{got!r}"[:60],
                       "return the number of drafts gamma itself (an int), not its speed-up or a pair")
    got = int(got)
    if got != want:
        speeds = {g: reference_speedup(alphas[:g], c, r) for g in range(len(alphas) + 1)}
        hints = []
        if want == 0:
            hints.append("no draft length is faster than plain decoding here (every speed-up is at most 1): "
                         "gamma = 0, not speculating, is a candidate too")
        if 0 <= got <= len(alphas) and speeds[got] == speeds[want]:
            hints.append("a tie: several gammas are equally fast; the smallest wins")
        if r is not None and got == reference_best_gamma(alphas, c, None):
            hints.append("r is ignored: the verification pass over gamma + 1 tokens costs r(gamma + 1)")
        if r is not None and got == max(range(len(alphas) + 1), key=lambda g: reference_expected_tokens(
                alphas[:g]) / (g * c + (r(g) if g else 1.0))):
            hints.append("the verification pass scores gamma + 1 tokens (the drafts and the one after them): it "
                         "costs r(gamma + 1), not r(gamma)")
        climbs = {next((g for g in range(start, len(alphas)) if speeds[g + 1] < speeds[g]), len(alphas))
                  for start in (0, 1)}
        if got in climbs:
            hints.append("the search stopped at the first gamma whose successor is slower: the speed-up can fall "
                         "and rise again (a verification cost with a step), so compare every gamma")
        raise Mismatch(f"{what} = {want} (speed-up {speeds[want]:.4f})",
                       f"{got}" + (f" (speed-up {speeds[got]:.4f})" if got in speeds else ""), pick_hint(hints))
    return got


@best.case("Lesson 04b's table with a constant profile of 24 positions, and its last row", 2,
           "Lesson 04b, section 3: try every gamma and keep the fastest; look at the speed-up the lesson printed for "
           "alpha = 0.8, c = 1")
def _best_lesson(fn):
    got = [_best_case(fn, [a] * 24, c) for a, c in ((0.9, 0.05), (0.7, 0.05), (0.5, 0.05), (0.8, 0.3), (0.8, 1.0))]
    return f"best gammas {got}"


@best.case("when no draft length beats plain decoding, do not speculate (gamma = 0); ties go to the smallest", 2,
           "a round with gamma drafts is worth it only if its speed-up exceeds 1, the speed-up of plain decoding")
def _best_zero(fn):
    got = [_best_case(fn, [a] * 8, c) for a, c in ((0.3, 0.4), (0.6, 0.7), (1.0, 1.0), (0.6, 0.2))]
    return f"best gammas {got}"


@best.case("a falling profile: stop where the next position no longer pays for itself", 2,
           "the speed-up of each prefix of the profile: the later positions are accepted less often, so drafting "
           "them can cost more than it brings")
def _best_falling(fn):
    profiles = ([0.9, 0.85, 0.5, 0.2, 0.1, 0.05], [0.95, 0.9, 0.85, 0.8, 0.3, 0.2, 0.1, 0.1], [0.6, 0.3, 0.1])
    got = [_best_case(fn, list(p), c) for p, c in zip(profiles, (0.1, 0.05, 0.2))]
    return f"best gammas {got}"


@best.case("verification costs that grow with the tokens: linear, and with a step", 1,
           "r(gamma + 1) prices the verification pass; with a step in r the speed-up can fall, then rise again")
def _best_r(fn):
    got = [_best_case(fn, [0.9] * 12, 0.05, _linear(0.15, 12)), _best_case(fn, [0.8] * 12, 0.02, _linear(0.05, 12)),
           _best_case(fn, [0.85] * 10, 0.05, _step(10, 1.6, 3.0, 6)), _best_case(fn, [0.9] * 10, 0.05, _step(10, 2.0, 3.5, 6))]
    return f"best gammas {got}"


@best.case("30 random settings agree with the reference", 1, "compare the speed-up of every prefix, gamma = 0 included")
def _best_random(fn):
    rng = random.Random(821)
    done = 0
    while done < 30:
        n = rng.randint(1, 12)
        start = rng.uniform(0.3, 0.99)
        alphas = [round(max(0.0, start - rng.uniform(0, 0.12) * k), 3) for k in range(n)]
        c = round(rng.uniform(0.005, 0.6), 3)
        r = rng.choice([None, _linear(rng.choice([0.05, 0.3]), n), _step(n, 1.4, 2.2, rng.randint(1, n))])
        s = sorted(reference_speedup(alphas[:g], c, r) for g in range(n + 1))
        if len(s) > 1 and s[-1] - s[-2] < 1e-9 * s[-1]:
            continue  # a near-tie: rounding could decide it either way
        _best_case(fn, alphas, c, r, label=f"best_gamma({_fmt(alphas)}, {c:g}{', ' + repr(r) if r else ''})")
        done += 1
    return "30 settings agree"


# ---- break_even_alpha(c, r=None, gamma_max=8) ---------------------------------------------------------------------

breakeven = Exercise("break_even_alpha", NOTEBOOK, "the smallest constant alpha at which some gamma in 1..gamma_max "
                     "is as fast as plain decoding; None if no alpha <= 1 is")

TOLERANCE = 1e-6


def _be_hint(got, c, r, gamma_max) -> str | None:
    hints = []
    r1 = r or (lambda k: 1.0)
    if isinstance(got, numbers.Real) and not isinstance(got, bool):
        got = float(got)
        if math.isclose(got, c, abs_tol=TOLERANCE) and r is not None:
            hints.append("c is the answer when verification is free (r = 1); here a pass over more tokens costs more")
        gamma1 = c + r1(2) - 1
        if math.isclose(got, gamma1, abs_tol=TOLERANCE):
            hints.append("this is the break-even of gamma = 1; a longer draft can break even at a lower alpha when "
                         "r has a step (its extra tokens cost little): take the smallest over gamma = 1..gamma_max")
        shifted = [_root(g, g * c + (r1(g) if g > 1 else 1.0) - 1) for g in range(1, gamma_max + 1)]
        shifted = [x for x in shifted if x is not None]
        if shifted and math.isclose(got, min(shifted), abs_tol=TOLERANCE):
            hints.append("the verification pass scores gamma + 1 tokens: it costs r(gamma + 1), not r(gamma)")
        if 0 < abs(got - (reference_break_even_alpha(c, r, gamma_max) or 2.0)) < 1e-2:
            hints.append("close, but not within 1e-6: iterate longer (a bisection halves the interval each step)")
    return pick_hint(hints)


def _be_case(fn, c, r=None, gamma_max=8) -> str:
    want = reference_break_even_alpha(c, r, gamma_max)
    got = fn(c, r, gamma_max)
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    what = f"break_even_alpha({c:g}{', ' + repr(r) if r else ''}, gamma_max={gamma_max})"
    if want is None:
        if got is not None:
            raise Mismatch(f"{what} = None: no alpha <= 1 makes a round as fast as plain decoding",
                           f"{got!r}"[:60], "check whether even alpha = 1 pays before searching; return None if not")
        return f"{what} = None"
    if got is None:
        raise Mismatch(f"{what} = {want:.6f}", "None", "some gamma breaks even below alpha = 1 here")
    if isinstance(got, bool) or not isinstance(got, numbers.Real) or not math.isfinite(float(got)):
        raise Mismatch(f"{what} as a number ({want:.6f})", f"{got!r}"[:60])
    if abs(float(got) - want) > TOLERANCE:
        raise Mismatch(f"{what} = {want:.6f} (within {TOLERANCE:g})", f"{float(got):.6f}", _be_hint(got, c, r,
                                                                                                      gamma_max))
    return f"{what} = {float(got):.6f}"


@breakeven.case("free verification (r = 1): three draft costs", 2,
                "write 'speed-up >= 1' as an inequality in alpha for one gamma; which gamma satisfies it first?")
def _be_free(fn):
    return "; ".join(_be_case(fn, c) for c in (0.05, 0.25, 0.6))


@breakeven.case("a verification cost that grows linearly with the tokens", 1,
                "the round's verification pass over gamma + 1 tokens costs r(gamma + 1)")
def _be_linear(fn):
    return "; ".join(_be_case(fn, c, _linear(s, 8)) for c, s in ((0.1, 0.1), (0.05, 0.3)))


@breakeven.case("a step in r (the second token is dear, the next ones cheap): a longer draft breaks even first", 2,
                "compare the break-even of every gamma in 1..gamma_max, not only gamma = 1")
def _be_step(fn):
    return "; ".join(_be_case(fn, c, _step(8, low, 3.0, 5)) for c, low in ((0.05, 1.5), (0.1, 1.4)))


@breakeven.case("when nothing pays (a draft dearer than the target, or no parallel verification): None", 1,
                "even alpha = 1 must make some gamma at least as fast as plain decoding, else there is no break-even")
def _be_none(fn):
    serial = CostTable([float(k) for k in range(1, 10)], "k (no parallel verification)")
    return "; ".join([_be_case(fn, 1.5), _be_case(fn, 0.3, serial), _be_case(fn, 0.2)])


@breakeven.case("20 random settings agree with the reference (within 1e-6)", 1,
                "the speed-up of each gamma grows with alpha: search alpha in [0, 1] (bisection) for each gamma")
def _be_random(fn):
    rng = random.Random(831)
    for _ in range(20):
        gmax = rng.randint(1, 10)
        c = round(rng.uniform(0.01, 0.7), 3)
        r = rng.choice([None, _linear(rng.choice([0.05, 0.2]), gmax), _step(gmax, rng.uniform(1.1, 1.6), 2.5,
                                                                            rng.randint(1, gmax))])
        _be_case(fn, c, r, gmax)
    return "20 settings agree"
