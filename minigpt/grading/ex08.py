"""Checks for exercise 08: the speed-up model of chain speculative decoding (Lesson 04b, sections 2 and 3).

Notation as in Lesson 04b and the course's vocabulary: α is the probability that a drafted token is accepted
(acceptances independent), γ the drafted tokens per round, c the cost of one draft pass as a fraction of a
one-token target step, r(k) the cost of a target pass over k tokens in one-token steps (r(1) = 1; a round's
verification pass scores γ + 1 tokens, so it costs ``r_verify = r(γ + 1)``, 1 when memory-bound).

* ``expected_tokens(alpha, gamma)`` = Σ_{k=0..γ} α^k = (1 − α^(γ+1)) / (1 − α), and γ + 1 when α = 1;
* ``speedup(alpha, gamma, c, r_verify=1.0)`` = expected_tokens / (γ·c + r_verify);
* ``best_gamma(alpha, c, r=None, gamma_max=24)``: the γ in 1..gamma_max with the largest
  ``speedup(alpha, γ, c, r(γ + 1))``, the smallest such γ on a tie (Python's ``max`` over ``range(1, gamma_max + 1)``,
  as Lesson 04b's table does); ``r=None`` means memory-bound verification, r(k) = 1.

The values are checked exactly (relative error 1e-9) and against a simulation of rounds with independent
Bernoulli(α) acceptances, within a Hoeffding bound that a right formula exceeds with probability below 1e-6.
"""
from __future__ import annotations

import math
import numbers
import random

import torch

from .core import Exercise, Mismatch, expect_number
from .helpers import pick_hint

NOTEBOOK = "ex08_speedup_model.ipynb"


def reference_expected_tokens(alpha: float, gamma: int) -> float:
    return float(gamma + 1) if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def reference_speedup(alpha: float, gamma: int, c: float, r_verify: float = 1.0) -> float:
    return reference_expected_tokens(alpha, gamma) / (gamma * c + r_verify)


def reference_best_gamma(alpha: float, c: float, r=None, gamma_max: int = 24) -> int:
    r = r or (lambda k: 1.0)
    return max(range(1, gamma_max + 1), key=lambda g: reference_speedup(alpha, g, c, r(g + 1)))


def simulate_rounds(alpha: float, gamma: int, n_rounds: int, seed: int) -> torch.Tensor:
    """Tokens emitted by each of n_rounds simulated rounds: drafts accepted independently with probability
    alpha until the first rejection, plus the target's one token."""
    g = torch.Generator().manual_seed(seed)
    accepted = (torch.rand(n_rounds, gamma, generator=g, dtype=torch.float64) < alpha).int()
    return accepted.cumprod(1).sum(1).double() + 1 if gamma else torch.ones(n_rounds, dtype=torch.float64)


def hoeffding(width: float, n: int, delta: float = 1e-6) -> float:
    """t such that the mean of n independent values in an interval of this width is t away from its
    expectation with probability below delta."""
    return width * math.sqrt(math.log(2 / delta) / (2 * n))


# ---- expected_tokens(alpha, gamma) ----------------------------------------------------------------------------

tokens = Exercise("expected_tokens", NOTEBOOK, "(1 - alpha^(gamma+1)) / (1 - alpha) tokens per round; gamma + 1 "
                  "when alpha = 1")

_TOKEN_BUGS = [
    (lambda a, g: (1 - a ** g) / (1 - a), "the sum of a geometric series Σ_{k=0..γ} α^k has γ + 1 terms: the "
                                          "exponent is γ + 1"),
    (lambda a, g: (1 - a ** (g + 1)) / (1 - a) - 1, "this is the number of accepted drafts; a round also emits "
                                                    "one token of the target (the replacement or the bonus)"),
    (lambda a, g: (1 - a ** (g + 2)) / (1 - a), "one term too many: the round emits at most γ + 1 tokens"),
    (lambda a, g: 1 / (1 - a), "1 / (1 − α) is the limit for an endless draft; a round drafts only γ tokens"),
    (lambda a, g: (1 - a ** g + 1) / (1 - a), "operator precedence: write alpha ** (gamma + 1), with brackets"),
]


def _token_hint(got, alpha, gamma) -> str | None:
    hints = []
    for bug, hint in _TOKEN_BUGS:
        try:
            want = bug(alpha, gamma)
        except ZeroDivisionError:
            continue
        if isinstance(got, numbers.Real) and math.isfinite(float(got)) and math.isclose(float(got), want,
                                                                                         rel_tol=1e-9):
            hints.append(hint)
    return pick_hint(hints)


def _tokens_case(fn, calls) -> str:
    for alpha, gamma in calls:
        got = fn(alpha, gamma)
        try:
            expect_number(f"expected_tokens({alpha}, {gamma})", got, reference_expected_tokens(alpha, gamma))
        except Mismatch as m:
            m.hint = _token_hint(got, alpha, gamma) or m.hint
            raise
    return f"{len(calls)} value{'s' if len(calls) > 1 else ''} agree{'' if len(calls) > 1 else 's'}"


@tokens.case("Lesson 04b's examples: alpha = 0.6, gamma = 3 and alpha = 0.9, gamma = 8", 2,
             "Lesson 04b, section 2: the round emits A + 1 tokens, and P(A >= k) = alpha^k")
def _tokens_lesson(fn):
    return _tokens_case(fn, [(0.6, 3), (0.9, 8)])


@tokens.case("no drafts (gamma = 0) or a hopeless draft (alpha = 0): one token per round", 1,
             "with nothing accepted the round still emits the target's own token")
def _tokens_edges(fn):
    return _tokens_case(fn, [(0.7, 0), (0.0, 4), (0.0, 0)])


@tokens.case("a perfect draft (alpha = 1): gamma + 1 tokens, no division by zero", 1,
             "the closed form divides by 1 - alpha; at alpha = 1 every term alpha^k is 1: return gamma + 1")
def _tokens_alpha_one(fn):
    return _tokens_case(fn, [(1.0, 4), (1, 1), (1.0, 0)])


@tokens.case("long drafts approach the limit 1 / (1 - alpha) from below", 1,
             "Lesson 04b, section 2: the sum is 1 + alpha + ... + alpha^gamma")
def _tokens_limit(fn):
    return _tokens_case(fn, [(0.5, 40), (0.8, 60), (0.95, 200)])


@tokens.case("agrees with a simulation of 200000 rounds with independent acceptances", 2,
             "simulate it yourself: accept each draft with probability alpha until the first rejection, then "
             "add the target's token; average over rounds")
def _tokens_simulated(fn):
    rng = random.Random(801)
    worst = ""
    for i in range(4):
        alpha, gamma = round(rng.uniform(0.3, 0.95), 3), rng.randint(1, 8)
        sim = simulate_rounds(alpha, gamma, 200_000, seed=802 + i)
        mean, bound = float(sim.mean()), hoeffding(gamma, 200_000)
        got = expect_number(f"expected_tokens({alpha}, {gamma})", fn(alpha, gamma), mean, rel=1.0)  # a number
        if abs(got - mean) > bound:
            raise Mismatch(f"expected_tokens({alpha}, {gamma}) within {bound:.3f} of the simulated mean "
                           f"{mean:.4f} (200000 rounds)", f"{got:.4f}", _token_hint(got, alpha, gamma))
        worst = f"e.g. alpha={alpha}, gamma={gamma}: {got:.4f} vs simulated {mean:.4f} (bound {bound:.3f})"
    return "4 settings agree with the simulation; " + worst


# ---- speedup(alpha, gamma, c, r_verify=1.0) ------------------------------------------------------------------

speed = Exercise("speedup", NOTEBOOK, "expected tokens per round over the round's cost gamma * c + r_verify, "
                 "in one-token target steps")

_SPEEDUP_BUGS = [
    (lambda a, g, c, v: reference_expected_tokens(a, g) / (c + v), "the draft runs once per drafted token: the "
                                                                  "draft's cost is γ·c, not c"),
    (lambda a, g, c, v: reference_expected_tokens(a, g) / ((g + 1) * c + v), "the draft makes γ passes per round "
                                                                            "(γ·c), not γ + 1"),
    (lambda a, g, c, v: reference_expected_tokens(a, g) / (g * c + 1), "r_verify (r(γ + 1), the cost of the "
                                                                      "verification pass) is not used: the round "
                                                                      "costs γ·c + r_verify"),
    (lambda a, g, c, v: reference_expected_tokens(a, g) / (g * c), "the round also pays one target pass "
                                                                  "(r_verify): γ·c + r_verify"),
    (lambda a, g, c, v: reference_expected_tokens(a, g) / (g * c * v), "the costs add up: γ·c + r_verify, "
                                                                      "not a product"),
    (lambda a, g, c, v: (reference_expected_tokens(a, g) - 1) / (g * c + v), "the accepted drafts are not all "
                                                                            "the tokens: add the target's token "
                                                                            "(expected_tokens)"),
    (lambda a, g, c, v: (g * c + v) / reference_expected_tokens(a, g), "upside down: speed-up = tokens per round "
                                                                      "/ cost per round"),
]


def _speedup_hint(got, args, rel: float = 1e-9) -> str | None:
    """The hint of the known mistakes that give ``got`` for these arguments (within ``rel``)."""
    full = tuple(args) + (1.0,) * (4 - len(args))
    hints = []
    for bug, hint in _SPEEDUP_BUGS:
        try:
            want = bug(*full)
        except ZeroDivisionError:
            continue
        if isinstance(got, numbers.Real) and math.isfinite(float(got)) and math.isclose(float(got), want, rel_tol=rel):
            hints.append(hint)
    return pick_hint(hints)


def _speedup_case(fn, calls) -> str:
    for args in calls:
        got = fn(*args)
        try:
            expect_number(f"speedup{args}", got, reference_speedup(*args))
        except Mismatch as m:
            m.hint = _speedup_hint(got, args) or m.hint
            raise
    return f"{len(calls)} value{'s' if len(calls) > 1 else ''} agree{'' if len(calls) > 1 else 's'}"


@speed.case("free verification (r = 1): alpha = 0.8, c = 0.1, gamma = 1, 4, 8", 2,
            "Lesson 04b, section 3: the speed-up is expected tokens per round / cost of the round")
def _speed_lesson(fn):
    return _speedup_case(fn, [(0.8, 1, 0.1), (0.8, 4, 0.1), (0.8, 8, 0.1)])


@speed.case("a free draft (c = 0): the speed-up is the expected tokens per round", 1,
            "with c = 0 and r_verify = 1 a round costs one target pass")
def _speed_free(fn):
    return _speedup_case(fn, [(0.7, 3, 0.0), (0.5, 6, 0.0)])


@speed.case("the verification cost r(gamma + 1) is used", 2,
            "the round's target pass scores gamma + 1 tokens and costs r_verify = r(gamma + 1) one-token "
            "steps (the docstring)")
def _speed_verify(fn):
    return _speedup_case(fn, [(0.8, 4, 0.1, 1.6), (0.6, 2, 0.3, 1.2), (0.9, 7, 0.05, 2.5)])


@speed.case("a draft as costly as the target (c = 1) and a perfect one (alpha = 1): exactly 1", 1,
            "alpha = 1 gives gamma + 1 tokens for gamma + 1 target-step costs")
def _speed_no_gain(fn):
    return _speedup_case(fn, [(1.0, 3, 1.0), (1.0, 6, 1.0)])


@speed.case("r_verify defaults to 1.0 (memory-bound verification)", 1,
            "keep the signature speedup(alpha, gamma, c, r_verify=1.0)")
def _speed_default(fn):
    return _speedup_case(fn, [(0.75, 5, 0.2)])


@speed.case("agrees with a simulated decoding run (200000 rounds)", 1,
            "simulate it: each round costs gamma * c + r_verify target steps and emits its tokens; plain "
            "decoding costs one step per token")
def _speed_simulated(fn):
    rng = random.Random(811)
    for i in range(3):
        alpha, gamma = round(rng.uniform(0.4, 0.95), 3), rng.randint(1, 8)
        c, v = round(rng.uniform(0.02, 0.4), 3), round(rng.uniform(1.0, 2.0), 3)
        sim = simulate_rounds(alpha, gamma, 200_000, seed=812 + i)
        cost = gamma * c + v
        simulated = float(sim.sum()) / (len(sim) * cost)  # tokens / time, with plain decoding at 1 token per step
        bound = hoeffding(gamma, 200_000) / cost
        got = expect_number(f"speedup({alpha}, {gamma}, {c}, {v})", fn(alpha, gamma, c, v), simulated, rel=1.0)
        if abs(got - simulated) > bound:
            raise Mismatch(f"speedup({alpha}, {gamma}, {c}, {v}) within {bound:.4f} of the simulated "
                           f"{simulated:.4f}", f"{got:.4f}", _speedup_hint(got, (alpha, gamma, c, v)))
    return "3 settings agree with the simulation"


# ---- best_gamma(alpha, c, r=None, gamma_max=24) ------------------------------------------------------------------

best = Exercise("best_gamma", NOTEBOOK, "the gamma in 1..gamma_max with the largest speed-up (the smallest on a tie)")


def _best_case(fn, alpha, c, r=None, gamma_max=24, label=None) -> int:
    want = reference_best_gamma(alpha, c, r, gamma_max)
    got = fn(alpha, c, r, gamma_max)
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    what = label or f"best_gamma({alpha}, {c}, gamma_max={gamma_max})"
    if isinstance(got, bool) or not isinstance(got, numbers.Integral):
        raise Mismatch(f"{what} as an int ({want} here)", f"{got!r}"[:60],
                       "return the draft length gamma itself (an int), not its speed-up or a pair")
    got = int(got)
    if got != want:
        rr = r or (lambda k: 1.0)
        speeds = {g: reference_speedup(alpha, g, c, rr(g + 1)) for g in range(0, gamma_max + 2)}
        if 1 <= got <= gamma_max and speeds[got] == speeds[want]:
            hint = ("a tie: several gammas give the same speed-up; the smallest wins (max over range(1, "
                    "gamma_max + 1) keeps the first)")
        elif want == gamma_max and got == gamma_max - 1:
            hint = ("gamma_max itself is a candidate: range(1, gamma_max + 1) (or an index into a list of "
                    "speed-ups, one less than the gamma it stands for)")
        elif got == want - 1:
            hint = "off by one: an index into a list of speed-ups is not the gamma it stands for"
        elif got == want + 1 and got <= gamma_max:
            hint = "off by one: return the gamma whose speed-up is largest"
        elif r is not None and got == reference_best_gamma(alpha, c, None, gamma_max):
            hint = "r is ignored: the verification pass over gamma + 1 tokens costs r(gamma + 1)"
        else:
            hint = None
        raise Mismatch(f"{what} = {want} (speed-up {speeds[want]:.4f})",
                       f"{got}" + (f" (speed-up {speeds[got]:.4f})" if got in speeds else ""), hint)
    return got


@best.case("Lesson 04b's table: five (alpha, c) settings, gamma up to 24", 2,
           "Lesson 04b, section 3: try every gamma from 1 to gamma_max and keep the fastest")
def _best_lesson(fn):
    got = [_best_case(fn, a, c) for a, c in ((0.9, 0.05), (0.7, 0.05), (0.5, 0.05), (0.8, 0.3), (0.8, 1.0))]
    return f"best gammas {got}"


@best.case("ties go to the smallest gamma (alpha = 1, c = 1: every gamma gives exactly 1)", 1,
           "the docstring: the smallest gamma among equally fast ones")
def _best_tie(fn):
    return f"{_best_case(fn, 1.0, 1.0, gamma_max=10)} (and {_best_case(fn, 0.0, 0.2, gamma_max=10)} for alpha = 0)"


@best.case("a cheap, excellent draft: the best gamma is gamma_max itself", 1,
           "gamma_max is included in the range searched")
def _best_edge(fn):
    return f"{_best_case(fn, 0.99, 0.001, gamma_max=12)} of 12"


@best.case("a verification pass that costs more with more tokens, r(k) = 1 + 0.15 (k - 1), shortens the draft", 2,
           "the round's verification pass scores gamma + 1 tokens: it costs r(gamma + 1)")
def _best_r(fn):
    def r(k):
        return 1 + 0.15 * (k - 1)
    got = [_best_case(fn, a, c, r, label=f"best_gamma({a}, {c}, r=1 + 0.15 (k - 1))")
           for a, c in ((0.9, 0.05), (0.8, 0.02), (0.95, 0.1))]
    free = [reference_best_gamma(a, c) for a, c in ((0.9, 0.05), (0.8, 0.02), (0.95, 0.1))]
    return f"best gammas {got} (with free verification: {free})"


@best.case("30 random settings agree with the reference", 1, "compare speedup(alpha, g, c, r(g + 1)) for every g")
def _best_random(fn):
    rng = random.Random(821)
    done = 0
    while done < 30:
        a, c, gmax = rng.uniform(0.2, 0.98), rng.uniform(0.005, 0.5), rng.randint(2, 20)
        slope = rng.choice([0.0, 0.05, 0.3])
        r = None if slope == 0 else (lambda k, s=slope: 1 + s * (k - 1))
        rr = r or (lambda k: 1.0)
        s = sorted(reference_speedup(a, g, c, rr(g + 1)) for g in range(1, gmax + 1))
        if len(s) > 1 and s[-1] - s[-2] < 1e-9 * s[-1]:
            continue  # a near-tie: rounding could decide it either way
        _best_case(fn, a, c, r, gmax, label=f"best_gamma({a:.3f}, {c:.3f}, r slope {slope}, gamma_max={gmax})")
        done += 1
    return "30 settings agree"
