"""Checks for exercise 03: one round of speculative decoding -- drafting, the sampled rule, the greedy rule.

The sampled rule is checked for exactness statistically: over thousands of seeded rounds on small vocabularies
(V = 6) the empirical distribution of what the learner's function emits is compared with what the algorithm
must produce (the target's p at every position; acceptance counts set by Σ min(p, q)) through the total
variation distance and the bound of :func:`~.core.tv_bound`. References: :mod:`minigpt.decoding.verify`.
"""
from __future__ import annotations

import torch

from ..decoding.verify import accept_greedy, accept_sampled
from .core import Exercise, Mismatch, expect_distribution, expect_tensor, expect_token_list, fmt_probs

NOTEBOOK = "ex03_speculative_step.ipynb"
V = 6


def _dist(g: torch.Generator, rows: int, sharpness: float = 1.5) -> torch.Tensor:
    """(rows, V) random distributions, neither flat nor one-hot."""
    return torch.softmax(sharpness * torch.randn(rows, V, generator=g, dtype=torch.float64), -1).float()


def _run_rounds(fn, q: torch.Tensor, p: torch.Tensor, n: int, seed: int) -> list[list[int]]:
    """Draw n sets of drafts from q, call fn on each; check each output's structure; return the outputs."""
    gamma = q.shape[0]
    g = torch.Generator().manual_seed(seed)
    drafts = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(gamma)], 1)
    outs = []
    for r, d in enumerate(drafts.tolist()):
        out = expect_token_list("the returned tokens", fn(d, q.clone(), p.clone(), g))
        if not 1 <= len(out) <= gamma + 1:
            raise Mismatch(f"between 1 and {gamma + 1} tokens for {gamma} drafts", f"{len(out)} tokens {out} "
                           f"in round {r}", "accepted drafts, then exactly one token from the target")
        if out[:-1] != d[:len(out) - 1]:
            raise Mismatch(f"the accepted drafts {d} as a prefix, then one new token", f"{out} in round {r}",
                           "stop at the first rejection: its replacement is the last token of the round")
        if not all(0 <= t < V for t in out):
            raise Mismatch(f"token ids in 0..{V - 1}", f"{out}")
        outs.append(out)
    return outs


# ---- speculative_step(draft_tokens, q, p, generator) -> list[int] --------------------------------------------

step = Exercise("speculative_step", NOTEBOOK, "accept each draft with prob min(1, p/q); at the first rejection "
                "sample from norm(max(0, p - q)); if all pass, a bonus token from p[gamma]")


@step.case("returns 1 to gamma+1 ints: accepted drafts then one target token", 1,
           "return a list of Python ints: the drafts that passed, then the replacement or the bonus token")
def _structure(fn):
    g = torch.Generator().manual_seed(301)
    for gamma in (1, 2, 3, 4):
        _run_rounds(fn, _dist(g, gamma), _dist(g, gamma + 1), 50, seed=302 + gamma)
    return "200 rounds with gamma = 1..4 are well formed"


@step.case("q == p: every draft is accepted, then a bonus token from p[gamma]", 2,
           "when every draft passes, sample one more token from p[gamma] (the bonus token)")
def _identical(fn):
    g = torch.Generator().manual_seed(311)
    p = _dist(g, 4)
    outs = _run_rounds(fn, p[:3].clone(), p, 2000, seed=312)
    short = [o for o in outs if len(o) != 4]
    if short:
        raise Mismatch("4 tokens (3 accepted drafts + 1 bonus) in every round", f"{len(short[0])} tokens, "
                       f"e.g. {short[0]}, in {len(short)} of 2000 rounds")
    return "4 tokens every round; bonus " + expect_distribution("the bonus token", [o[3] for o in outs], p[3])


@step.case("disjoint supports: the first draft is always replaced, from p[0]", 1,
           "p(x) = 0 means a certain rejection; the residual max(0, p - q) is then p itself")
def _disjoint(fn):
    p = torch.zeros(3, V)
    p[:, :3] = torch.tensor([0.5, 0.3, 0.2])
    q = torch.zeros(2, V)
    q[:, 3:] = torch.tensor([0.2, 0.3, 0.5])
    outs = _run_rounds(fn, q, p, 2000, seed=321)
    if any(len(o) != 1 for o in outs):
        bad = next(o for o in outs if len(o) != 1)
        raise Mismatch("exactly 1 token (the replacement) when p(x) = 0", f"{bad}",
                       "a rejected draft ends the round")
    return expect_distribution("the replacement", [o[0] for o in outs], p[0])


@step.case("gamma = 1: the first output token follows the target's p[0] exactly", 2,
           "accept with probability min(1, p(x)/q(x)); replace from max(0, p - q) renormalised")
def _first_token(fn):
    g = torch.Generator().manual_seed(1000)
    q, p = _dist(g, 1), _dist(g, 2)
    outs = _run_rounds(fn, q, p, 4000, seed=1001)
    return expect_distribution("the first output token", [o[0] for o in outs], p[0])


def _theory_accepted(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """P(number of accepted drafts = k), k = 0..gamma, when position i passes with prob beta_i = Σ min(p_i, q_i)."""
    beta = torch.minimum(p[:-1], q).sum(-1).double()
    gamma = q.shape[0]
    reach = torch.cat([torch.ones(1, dtype=beta.dtype), beta.cumprod(0)])  # P(first k all accepted)
    stop = torch.cat([1 - beta, torch.ones(1, dtype=beta.dtype)])
    return (reach * stop)[: gamma + 1]


@step.case("gamma = 3: the number of accepted drafts follows beta_i = Σ min(p_i, q_i)", 2,
           "the acceptance test is u < p(x)/q(x) with u uniform in [0, 1)")
def _accept_count(fn):
    g = torch.Generator().manual_seed(1100)
    q, p = _dist(g, 3), _dist(g, 4)
    outs = _run_rounds(fn, q, p, 4000, seed=1101)
    return expect_distribution("the number of accepted drafts", [len(o) - 1 for o in outs],
                               _theory_accepted(q, p).float())


@step.case("gamma = 3: every output position follows the target's p", 2,
           "each emitted token, accepted or replaced or bonus, must have the target's distribution")
def _every_position(fn):
    g = torch.Generator().manual_seed(351)
    q, p = _dist(g, 3, sharpness=1.0), _dist(g, 4, sharpness=1.0)
    outs = _run_rounds(fn, q, p, 4000, seed=352)
    checked = []
    for i in range(4):
        tokens = [o[i] for o in outs if len(o) > i]
        if len(tokens) >= 200:  # too few rounds reach a position -> no verdict on it
            expect_distribution(f"the token at position {i}", tokens, p[i])
            checked.append(f"{i} ({len(tokens)} samples)")
    return "positions " + ", ".join(checked) + " follow p"


@step.case("greedy: one-hot p and q give the greedy rule", 1,
           "with one-hot distributions the sampled rule must keep drafts equal to the target's argmax")
def _greedy_onehot(fn):
    g = torch.Generator().manual_seed(361)
    eye = torch.eye(V)
    for r in range(60):
        gamma = 1 + r % 4
        target = torch.randint(V, (gamma + 1,), generator=g)
        agree = torch.rand(gamma, generator=g) < 0.7
        drafts = torch.where(agree, target[:gamma], torch.randint(V, (gamma,), generator=g))
        expected = accept_greedy(drafts.tolist(), target.tolist())
        got = expect_token_list("the returned tokens", fn(drafts.tolist(), eye[drafts].clone(), eye[target].clone(), g))
        if got != expected:
            raise Mismatch(f"{expected} for drafts {drafts.tolist()} and target argmax {target.tolist()}", f"{got}")
    return "60 one-hot rounds agree with the greedy rule"


# ---- greedy_step(draft_tokens, target_argmax) -> list[int] ----------------------------------------------------

greedy = Exercise("greedy_step", NOTEBOOK, "keep drafts while they equal the target's argmax, then add the "
                  "target's token")


def _greedy_case(fn, drafts, target) -> str:
    expected = accept_greedy(drafts, target)
    got = expect_token_list("the returned tokens", fn(list(drafts), list(target)))
    if got != expected:
        raise Mismatch(f"{expected} for drafts {drafts} and target argmax {target}", f"{got}")
    return f"{drafts} vs {target} -> {got}"


@greedy.case("all drafts match: keep them, plus the target's next token", 1,
             "after the last accepted draft the target has already chosen one more token: append it")
def _greedy_all(fn):
    return _greedy_case(fn, [5, 1, 4], [5, 1, 4, 2])


@greedy.case("first draft differs: only the target's token", 1, "a mismatch ends the round with the target's choice")
def _greedy_first(fn):
    return _greedy_case(fn, [3, 1, 4], [2, 1, 4, 0])


@greedy.case("mismatch in the middle, later drafts match again: stop at the first mismatch", 1,
             "drafts after a mismatch were conditioned on a wrong token: never keep them")
def _greedy_middle(fn):
    return _greedy_case(fn, [7, 8, 9, 10], [7, 0, 9, 10, 11])


@greedy.case("no drafts (gamma = 0): just the target's token", 1, "with no drafts return [target_argmax[0]]")
def _greedy_empty(fn):
    return _greedy_case(fn, [], [42])


@greedy.case("200 random rounds", 1, "compare draft_tokens[i] with target_argmax[i], left to right")
def _greedy_random(fn):
    g = torch.Generator().manual_seed(371)
    for r in range(200):
        gamma = r % 6
        target = torch.randint(50, (gamma + 1,), generator=g)
        agree = torch.rand(gamma, generator=g) < 0.8
        drafts = torch.where(agree, target[:gamma], torch.randint(50, (gamma,), generator=g))
        _greedy_case(fn, drafts.tolist(), target.tolist())
    return "200 rounds agree"


# ---- draft(next_probs, context, gamma, generator) -> (tokens, q) -----------------------------------------------

drafting = Exercise("draft", NOTEBOOK, "sample gamma tokens one at a time from next_probs, recording each q")


class _Bigram:
    """A toy drafter: the next-token distribution depends on the last token only (and counts its calls)."""

    def __init__(self, table: torch.Tensor):
        self.table, self.calls = table, 0

    def __call__(self, context) -> torch.Tensor:
        self.calls += 1
        return self.table[int(context[-1])].clone()


def _call_draft(fn, table, context, gamma, g, check_context=False):
    ctx = list(context)  # the learner's function gets its own copy: only one case grades leaving it unchanged
    ret = fn(_Bigram(table), ctx, gamma, g)
    if not isinstance(ret, (tuple, list)) or len(ret) != 2:
        raise Mismatch("a tuple (tokens, q)", f"a {type(ret).__name__}", "return tokens, torch.stack(qs)")
    tokens = expect_token_list("tokens", ret[0])
    if len(tokens) != gamma:
        raise Mismatch(f"{gamma} drafted tokens", f"{len(tokens)}")
    q = expect_tensor("q", ret[1], (gamma, table.shape[1]))
    if check_context and ctx != list(context):
        raise Mismatch(f"the caller's context left as {list(context)}", f"it changed to {ctx}",
                       "build a new list (context + tokens) instead of appending to the caller's list")
    return tokens, q


@drafting.case("returns gamma ints and q of shape (gamma, V)", 1, "tokens: a list of ints; q: torch.stack of the rows")
def _draft_shapes(fn):
    g = torch.Generator().manual_seed(381)
    table = _dist(g, V)
    for gamma in (1, 3, 5):
        _call_draft(fn, table, [0, 2], gamma, g)
    return "gamma = 1, 3, 5 give the right shapes"


@drafting.case("q[i] is next_probs of the context extended by the tokens drafted so far", 2,
               "call next_probs(context + tokens) before sampling each token, and record that distribution")
def _draft_rows(fn):
    g = torch.Generator().manual_seed(382)
    table = _dist(g, V)
    for _ in range(20):
        context = torch.randint(V, (3,), generator=g).tolist()
        tokens, q = _call_draft(fn, table, context, 4, g)
        seq = context + tokens
        for i in range(4):
            want = table[seq[len(context) + i - 1]]
            if not torch.allclose(q[i], want, atol=1e-6):
                raise Mismatch(f"q[{i}] = next_probs(context + tokens[:{i}]) = {fmt_probs(want)}",
                               f"{fmt_probs(q[i])} (context {context}, tokens {tokens})")
    return "20 drafts record the right distributions"


@drafting.case("leaves the caller's context unchanged", 1,
               "copy the context before extending it: the caller still needs the original")
def _draft_context(fn):
    g = torch.Generator().manual_seed(383)
    _call_draft(fn, _dist(g, V), [1, 2, 3], 3, g, check_context=True)
    return "context unchanged"


@drafting.case("drafted tokens are samples from q (not its argmax)", 2,
               "sample each token from q with torch.multinomial(q, 1, generator=generator); the verification "
               "rule assumes the drafts were drawn from the q it is given")
def _draft_samples(fn):
    g = torch.Generator().manual_seed(384)
    table = _dist(g, V, sharpness=0.8)
    n = 3000
    firsts, seconds = [], []
    for _ in range(n):
        tokens, _ = _call_draft(fn, table, [4], 2, g)
        firsts.append(tokens[0])
        seconds.append(tokens[1])
    a = expect_distribution("the first drafted token", firsts, table[4])
    expect_distribution("the second drafted token", seconds, table[4] @ table)  # Σ_x q0(x) q(. | x)
    return "first token " + a


@drafting.case("draft + the sampled rule reproduce the target's first token", 1,
               "drafts must be drawn from exactly the q you return, else min(1, p/q) corrects the wrong thing")
def _draft_end_to_end(fn):
    g = torch.Generator().manual_seed(385)
    table, target = _dist(g, V, sharpness=0.8), _dist(g, V, sharpness=1.5)
    firsts = []
    for _ in range(3000):
        context = [2]
        tokens, q = _call_draft(fn, table, context, 2, g)
        seq = context + tokens
        p = torch.stack([target[seq[i]] for i in range(3)])  # target rows after context, tokens[0], tokens[1]
        firsts.append(accept_sampled(tokens, q, p, g)[0])
    return expect_distribution("the first token of the round", firsts, target[2])

