"""Checking that a speculative decoder samples exactly the target's distribution.

Two kinds of evidence, used by Lessons 04 and 05:

* **exact** -- the distribution an acceptance rule emits at one position, computed in closed form
  (:func:`emitted_distribution`), which equals the target's p when the rule is told the q it sampled from;
* **sampled** -- run the real code many times and compare the frequencies with p by total variation distance
  (:func:`tv_distance`), against the noise a correct sampler would show (:func:`tv_bound`). A test is only
  worth running when it can fail: :func:`samples_needed` picks N so that the bound is a fraction of the
  distance of the wrong answer one wants to catch.

Toy Markov "language models" (a next-token table per previous token, :func:`toy_markov_pair`) make the exact
distribution of the first two emitted tokens computable, so the bonus token and the restart after a rejection
(chain, :func:`toy_chain_first_two`) or the choice among siblings (tree, :func:`toy_tree_first_two`) are
tested too. :func:`accept_tree_per_path` is the tempting *wrong* tree rule, kept here to show it failing.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from .decoding.verify import accept_sampled, accept_tree_sampled, residual_distribution
from .sampling import make_generator, sample


def tv_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Total variation distance ½·Σ|a − b| between two distributions of the same shape."""
    return 0.5 * float((a.double() - b.double()).abs().sum())


def _coefficient(k: int, delta: float) -> float:
    return 0.5 * math.sqrt(k) + math.sqrt(math.log(1 / delta) / 2)


def tv_bound(n: int, k: int, delta: float = 1e-3) -> float:
    """TV(p̂, p) ≤ ½·√(k/n) + √(ln(1/δ)/(2n)) with probability ≥ 1 − δ, for n samples over k outcomes.

    (E[TV] ≤ ½·Σ√(p_i(1 − p_i)/n) ≤ ½·√(k/n) by Cauchy–Schwarz, plus McDiarmid's inequality for the deviation:
    one sample moves TV by at most 1/n, so P(TV − E[TV] ≥ t) ≤ exp(−2nt²).) The course's one TV bound: the lessons
    and the grader (:mod:`minigpt.grading.core`) both use it, so "within the bound" means the same everywhere.
    The Bretagnolle–Huber–Carol inequality, P(TV ≥ ε) ≤ 2^k·exp(−2nε²), i.e. ε = √((k·ln 2 + ln(1/δ))/(2n)), is
    also valid and is tighter for small k (it grows like 0.59·√(k/n) instead of 0.5·√(k/n), but adds its ln(1/δ)
    term under the same root); this bound is kept because every number the lessons print was computed with it.
    Both hold for any p; k counts the outcomes p̂ or p can put mass on."""
    if n < 1 or k < 1 or not 0 < delta < 1:
        raise ValueError(f"need n >= 1, k >= 1 and 0 < delta < 1, got n={n}, k={k}, delta={delta}")
    return _coefficient(k, delta) / math.sqrt(n)


def samples_needed(distance: float, k: int, delta: float = 1e-3, margin: float = 2.0) -> int:
    """The smallest n with ``tv_bound(n, k, delta) <= distance / margin``: enough samples that a sampler off
    by ``distance`` in TV lands far outside the bound a correct sampler stays within."""
    if distance <= 0 or margin <= 0:
        raise ValueError(f"distance and margin must be positive, got {distance} and {margin}")
    return math.ceil((margin * _coefficient(k, delta) / distance) ** 2)


def emitted_distribution(p: torch.Tensor, q_sampled: torch.Tensor,
                         q_rule: torch.Tensor | None = None) -> torch.Tensor:
    """The exact distribution of the token one speculative step emits (V,).

    The drafted x ~ ``q_sampled`` is accepted with min(1, p(x)/q_rule(x)), else the residual built from
    ``q_rule`` is sampled: P(x) = q_s(x)·min(1, p(x)/q_r(x)) + P(reject)·residual(x). With ``q_rule`` the
    distribution really sampled from (the default) this is exactly p; with any other q it is biased."""
    q_rule = q_sampled if q_rule is None else q_rule
    accept = torch.where(q_rule > 0, (p / q_rule).clamp(max=1), torch.zeros_like(p))
    reject = (q_sampled * (1 - accept)).sum()
    return q_sampled * accept + reject * residual_distribution(p, q_rule)


def first_token_frequencies(p: torch.Tensor, q_sampled: torch.Tensor, n: int, seed: int = 0,
                            q_rule: torch.Tensor | None = None) -> torch.Tensor:
    """Run :func:`~minigpt.decoding.verify.accept_sampled` n times on one drafted token x ~ ``q_sampled`` (the
    rule is told ``q_rule``, by default the truth) and return the frequencies of the token it emits (V,)."""
    gen = make_generator(seed)
    q_rule = q_sampled if q_rule is None else q_rule
    ps = torch.stack([p, p])  # p at the drafted position, and (never used: one draft) after it
    counts = torch.zeros(len(p), dtype=torch.float64)
    for x in torch.multinomial(q_sampled.float(), n, replacement=True, generator=gen).tolist():
        counts[accept_sampled([x], q_rule[None], ps, gen)[0]] += 1
    return counts / n


def toy_markov_pair(vocab: int = 5, seed: int = 1, sharpness: float = 1.5,
                    draft_noise: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two toy language models as (vocab, vocab) tables of next-token distributions, row = previous token:
    a target P and a draft Q = P perturbed in log space by Gaussian noise of scale ``draft_noise``."""
    g = torch.Generator().manual_seed(seed)
    P = torch.softmax(sharpness * torch.randn(vocab, vocab, generator=g, dtype=torch.float64), -1)
    Q = torch.softmax(torch.log(P) + draft_noise * torch.randn(vocab, vocab, generator=g, dtype=torch.float64), -1)
    return P, Q


def exact_first_two(P: torch.Tensor, start: int) -> torch.Tensor:
    """(V, V) joint distribution of the first two tokens the target P writes after ``start``: P(a|s)·P(b|a)."""
    return P[start][:, None] * P


def toy_chain_speculative(P: torch.Tensor, Q: torch.Tensor, start: int, n_tokens: int, gamma: int,
                          gen: torch.Generator) -> list[int]:
    """Chain speculative sampling on the toy pair: draft gamma tokens from Q, verify with
    :func:`~minigpt.decoding.verify.accept_sampled` against P, repeat until ``n_tokens`` are written."""
    out: list[int] = []
    while len(out) < n_tokens:
        prev = ([start] + out)[-1]
        drafted, qs = [], []
        for _ in range(gamma):
            q_row = Q[drafted[-1] if drafted else prev]
            drafted.append(sample(q_row, gen))
            qs.append(q_row)
        ps = P[[prev] + drafted]  # (gamma + 1, V): the target at each drafted position and one beyond
        out += accept_sampled(drafted, torch.stack(qs), ps, gen)
    return out[:n_tokens]


def toy_chain_first_two(P: torch.Tensor, Q: torch.Tensor, start: int, n: int, gamma: int = 1,
                        seed: int = 0) -> torch.Tensor:
    """(V, V) frequencies of the first two tokens over n runs of :func:`toy_chain_speculative`."""
    gen = make_generator(seed)
    counts = torch.zeros(P.shape[0], P.shape[0], dtype=torch.float64)
    for _ in range(n):
        a, b = toy_chain_speculative(P, Q, start, 2, gamma, gen)
        counts[a, b] += 1
    return counts / n


def toy_tree(P: torch.Tensor, Q: torch.Tensor, root: int, gen: torch.Generator,
             shape: tuple[int, ...] = (0, 0, 1, 1, 2, 2)):
    """A random draft tree on the toy pair: node i > 0 has parent ``shape[i - 1]`` and is an independent draw
    from Q after its parent's token. Returns (tokens, parents, q, p) with q[i] the distribution node i was drawn
    from and p[i] the target's distribution after node i (the inputs of ``accept_tree_sampled``)."""
    tokens, parents = [root], [-1]
    for parent in shape:
        tokens.append(sample(Q[tokens[parent]], gen))
        parents.append(parent)
    q = torch.stack([Q[tokens[par]] if par >= 0 else Q[root] for par in parents])  # row 0 is never used
    p = torch.stack([P[t] for t in tokens])
    return tokens, parents, q, p


def _path_to(i: int, parents) -> list[int]:
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def accept_tree_per_path(tokens, parents, q: torch.Tensor, p: torch.Tensor,
                         generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """WRONG, kept to be shown failing: verify each root-to-leaf path on its own with the chain rule and keep
    the longest accepted one. Each path alone is exact, but the best of several random trials favours what the
    draft proposed. Same signature and return value as :func:`~minigpt.decoding.verify.accept_tree_sampled`."""
    best = None
    for leaf in [i for i in range(len(tokens)) if i not in parents]:
        acc, node, last = [], 0, None
        for c in _path_to(leaf, parents)[1:]:
            x = int(tokens[c])
            if float(torch.rand((), generator=generator)) < min(1.0, float(p[node, x] / q[c, x])):
                acc.append(c)
                node = c
            else:
                last = sample(residual_distribution(p[node], q[c]), generator)
                break
        if last is None:
            last = sample(p[node], generator)
        if best is None or len(acc) > len(best[0]):
            best = (acc, last)
    return best


def toy_tree_first_two(rule: Callable = accept_tree_sampled, P: torch.Tensor | None = None,
                       Q: torch.Tensor | None = None, root: int = 0, n: int = 2000,
                       seed: int = 0) -> tuple[torch.Tensor, float]:
    """Run a tree acceptance ``rule`` n times on fresh :func:`toy_tree` s; return the (V, V) frequencies of
    the first two output tokens and the mean number of accepted nodes per round. When a round writes only one
    token, the second comes from the target itself (what the next round would be, in distribution)."""
    if P is None or Q is None:
        raise ValueError("give the toy pair's tables P and Q (e.g. from toy_markov_pair)")
    gen = make_generator(seed)
    V = P.shape[0]
    counts, accepted = torch.zeros(V, V, dtype=torch.float64), 0
    for _ in range(n):
        tokens, parents, q, p = toy_tree(P, Q, root, gen)
        path, last = rule(tokens, parents, q, p, gen)
        out = [tokens[i] for i in path] + [last]
        accepted += len(path)
        if len(out) == 1:
            out.append(sample(P[out[0]], gen))
        counts[out[0], out[1]] += 1
    return counts / n, accepted / n
