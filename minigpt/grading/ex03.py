"""Checks for exercise 03: one round of speculative decoding -- drafting, the sampled rule, the greedy rule.

The sampled rule is checked for exactness statistically: over thousands of seeded rounds on small vocabularies
(V = 6) the empirical distribution of what the learner's function emits is compared with what the algorithm
must produce (the target's p at every position; acceptance counts set by Σ min(p, q)) through the total
variation distance and the bound of :func:`minigpt.exactness.tv_bound`. References: :mod:`minigpt.decoding.verify`.
"""
from __future__ import annotations

import torch

from ..decoding.verify import accept_greedy, accept_sampled
from ..exactness import tv_distance
from .core import Exercise, Mismatch, expect_distribution, expect_tensor, expect_token_list, fmt_probs, frequencies
from .helpers import call_unchanged, expect_reproducible, pick_hint
from .wire import NextTokenTable

NOTEBOOK = "ex03_speculative_step.ipynb"
V = 6


def _dist(g: torch.Generator, rows: int, sharpness: float = 1.5) -> torch.Tensor:
    """(rows, V) random distributions, neither flat nor one-hot."""
    return torch.softmax(sharpness * torch.randn(rows, V, generator=g, dtype=torch.float64), -1).float()


def _run_rounds(fn, q: torch.Tensor, p: torch.Tensor, n: int, seed: int) -> list[list[int]]:
    """Draw n sets of drafts from q, call fn on each; check each output's structure; return the outputs."""
    gamma = q.shape[0]
    g = torch.Generator().manual_seed(seed)
    drafts = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(gamma)], 1).tolist()
    outs = []
    answers = fn.map([(list(d), q.clone(), p.clone(), g) for d in drafts])  # one exchange, g shared in order
    for r, (d, ret) in enumerate(zip(drafts, answers)):
        out = expect_token_list("the returned tokens", ret)
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


def _first_token_variants(q: torch.Tensor, p: torch.Tensor) -> list[tuple[torch.Tensor, str]]:
    """The exact distribution of a round's first token under known wrong rules (q, p: one position's (V,)),
    each with the hint for its bug."""
    q, p = q.double(), p.double()
    res = (p - q).clamp(min=0)
    z = float(res.sum())
    norm_res = res / z if z > 0 else p

    def rule(accept_prob: torch.Tensor, replacement: torch.Tensor) -> torch.Tensor:
        accepted = q * accept_prob
        return accepted + (1 - float(accepted.sum())) * replacement

    ratio = torch.where(q > 0, p / q.clamp(min=1e-300), torch.zeros_like(p)).clamp(max=1)
    inverse = torch.where(p > 0, q / p.clamp(min=1e-300), torch.zeros_like(p)).clamp(max=1)
    lacking = res.clone()
    lacking[-1] += 1 - z  # inverse-CDF sampling of max(0, p - q) without normalising: the rest lands on the last id
    absolute = (p - q).abs() / float((p - q).abs().sum())
    return [
        (rule(ratio, p), "the replacement after a rejection is drawn from p itself: draw it from the residual "
                         "max(0, p - q), normalised (the lesson's 'why it is exact' shows why p over-counts)"),
        (rule(ratio, absolute), "the residual uses |p - q|: it is max(0, p - q), tokens the draft under-proposed "
                                "only"),
        (rule(ratio, lacking), "the residual max(0, p - q) is not normalised before sampling: divide it by its sum"),
        (rule(inverse, norm_res), "the acceptance ratio is upside down: accept with probability min(1, p(x)/q(x))"),
        (rule((p >= q).double(), norm_res), "the draft is accepted whenever p(x) >= q(x), with no random test: "
                                            "accept with probability min(1, p(x)/q(x)), i.e. when u < p(x)/q(x)"),
        (q, "the emitted token follows the draft's q: a rejected draft must be replaced (from the residual), and "
            "accepted only with probability min(1, p(x)/q(x))"),
    ]


def _diagnose_first(tokens, q: torch.Tensor, p: torch.Tensor, m: Mismatch) -> Mismatch:
    """Give ``m`` the hint of the known wrong rule whose distribution is closest to what was observed (when
    it is clearly closer than the right one)."""
    freq = frequencies(torch.bincount(torch.as_tensor(tokens, dtype=torch.long), minlength=V))
    right = tv_distance(freq, p)
    best = min(_first_token_variants(q, p), key=lambda v: tv_distance(freq, v[0]))
    if tv_distance(freq, best[0]) < right / 2:
        m.hint = best[1]
    return m


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
        no_bonus = all(len(o) == 3 for o in outs)
        raise Mismatch("4 tokens (3 accepted drafts + 1 bonus) in every round", f"{len(short[0])} tokens, "
                       f"e.g. {short[0]}, in {len(short)} of 2000 rounds",
                       "every round ends after the 3 drafts: when every draft passes, sample one more token, the "
                       "bonus, from p[gamma]" if no_bonus else
                       "with q == p every ratio p(x)/q(x) is 1, so no draft may be rejected: test draft i "
                       "against row i of both (p[i, x] / q[i, x])")
    bonus = [o[3] for o in outs]
    try:
        return "4 tokens every round; bonus " + expect_distribution("the bonus token", bonus, p[3])
    except Mismatch as m:
        for row in range(3):
            try:
                expect_distribution("", bonus, p[row])
                m.hint = f"the bonus token follows p[{row}]: it comes from the row after the last draft, p[gamma]"
            except Mismatch:
                pass
        raise


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
    first = [o[0] for o in outs]
    try:
        return expect_distribution("the first output token", first, p[0])
    except Mismatch as m:
        raise _diagnose_first(first, q[0], p[0], m)


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
    theory = _theory_accepted(q, p).float()
    try:
        return expect_distribution("the number of accepted drafts", [len(o) - 1 for o in outs], theory)
    except Mismatch as m:
        if max(len(o) for o in outs) <= 3 and float(theory[3]) * len(outs) > 50:
            m.hint = ("no round emits 4 tokens: when every draft passes, add the bonus token from p[gamma] (the "
                      "count is read as len(round) - 1)")
        raise


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
            try:
                expect_distribution(f"the token at position {i}", tokens, p[i])
            except Mismatch as m:
                raise _diagnose_first(tokens, q[0], p[0], m) if i == 0 else m
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
            d, t = drafts.tolist(), target.tolist()
            hints = [h for v, h in _greedy_variants(d, t) if v == got]
            n = len(expected) - 1
            if n < len(d) and got[:n] == d[:n] and len(got) > n and got[n] == d[n]:
                hints.append("the rejected draft came back as its own replacement: the residual is max(0, p - q), "
                             "which is 0 at the rejected token")
            raise Mismatch(f"{expected} for drafts {d} and target argmax {t}", f"{got}", pick_hint(hints))
    return "60 one-hot rounds agree with the greedy rule"


@step.case("leaves its inputs unchanged, and a seeded generator reproduces the round", 1,
           "compute the residual as a new tensor ((p[i] - q[i]).clamp(min=0)), and draw every random number "
           "from the generator you are given", side=True)
def _step_unchanged_reproducible(fn):
    g = torch.Generator().manual_seed(391)
    q, p = _dist(g, 4, sharpness=3.0), _dist(g, 5, sharpness=3.0)  # sharp and unrelated: rejections are likely
    drafts = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(4)]
    for seed in range(5):
        call_unchanged(fn, (drafts, q, p, torch.Generator().manual_seed(seed)),
                       ("draft_tokens", "q", "p", "generator"))
    q, p = _dist(g, 4, sharpness=0.5), _dist(g, 5, sharpness=0.5)  # flat: every draw of the round matters
    drafts = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(4)]

    def twenty_rounds(gen):
        return [expect_token_list("the returned tokens", fn(list(drafts), q.clone(), p.clone(), gen))
                for _ in range(20)]
    return "inputs unchanged; " + expect_reproducible("20 rounds", twenty_rounds)


# ---- greedy_step(draft_tokens, target_argmax) -> list[int] ----------------------------------------------------

greedy = Exercise("greedy_step", NOTEBOOK, "keep drafts while they equal the target's argmax, then add the "
                  "target's token")


def _greedy_variants(drafts, target) -> list[tuple[list[int], str]]:
    """What known wrong greedy rules return on this input, each with the hint for its bug."""
    n = next((i for i, (x, t) in enumerate(zip(drafts, target)) if x != t), len(drafts))  # accepted drafts
    kept = list(drafts[:n])
    out = [(kept, "the round always ends with one token of the target: its argmax after the accepted drafts "
                  "(the bonus token when every draft matched)"),
           (kept + [target[min(n + 1, len(target) - 1)]], "the target's token is taken one position too late: "
                                                          "after n accepted drafts it is target_argmax[n]"),
           (list(drafts[:n + 1]) if n < len(drafts) else kept + [target[n]],
            "at the first mismatch the target's token replaces the draft: emit target_argmax[n], not the draft"),
           ([x for x, t in zip(drafts, target) if x == t] + [target[sum(x == t for x, t in zip(drafts, target))]],
            "drafts after the first mismatch were conditioned on a wrong token: stop at the first mismatch")]
    right = accept_greedy(drafts, target)
    return [(v, h) for v, h in out if v != right]


def _greedy_case(fn, drafts, target, got=None) -> str:
    """``got``: the answer when it was already obtained (a batch), else ``fn`` is called here."""
    expected = accept_greedy(drafts, target)
    got = expect_token_list("the returned tokens", fn(list(drafts), list(target)) if got is None else got)
    if got != expected:
        hint = pick_hint([h for v, h in _greedy_variants(drafts, target) if v == got])
        raise Mismatch(f"{expected} for drafts {drafts} and target argmax {target}", f"{got}", hint)
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
    rounds = []
    for r in range(200):
        gamma = r % 6
        target = torch.randint(50, (gamma + 1,), generator=g)
        agree = torch.rand(gamma, generator=g) < 0.8
        drafts = torch.where(agree, target[:gamma], torch.randint(50, (gamma,), generator=g))
        rounds.append((drafts.tolist(), target.tolist()))
    for (drafts, target), got in zip(rounds, fn.map([(list(d), list(t)) for d, t in rounds])):
        _greedy_case(fn, drafts, target, got)
    return "200 rounds agree"


@greedy.case("leaves the caller's lists unchanged", 1, "build a new output list; read the inputs only", side=True)
def _greedy_unchanged(fn):
    call_unchanged(fn, ([3, 1, 4, 1], [3, 1, 5, 9, 2]), ("draft_tokens", "target_argmax"))
    return "draft_tokens and target_argmax unchanged"


# ---- draft(next_probs, context, gamma, generator) -> (tokens, q) -----------------------------------------------

drafting = Exercise("draft", NOTEBOOK, "sample gamma tokens one at a time from next_probs, recording each q")


def _call_draft(fn, table, context, gamma, g, check_context=False, ret=None):
    """Call the learner's draft (unless ``ret``, its answer from a batch, is given); check the answer's structure."""
    ctx = list(context)  # the learner's function gets its own copy: only one case grades leaving it unchanged
    if ret is None:
        ret = fn(NextTokenTable(table), ctx, gamma, g)  # next_probs(context): row context[-1]
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
               "copy the context before extending it: the caller still needs the original", side=True)
def _draft_context(fn):
    g = torch.Generator().manual_seed(383)
    _call_draft(fn, _dist(g, V), [1, 2, 3], 3, g, check_context=True)
    return "context unchanged"


@drafting.case("the same generator seed gives the same draft, another seed another draft", 1,
               "sample with torch.multinomial(..., generator=generator): the global RNG (no generator=) "
               "differs from call to call, so a seed would not reproduce the draft")
def _draft_reproducible(fn):
    g = torch.Generator().manual_seed(386)
    table = _dist(g, V, sharpness=0.5)
    return expect_reproducible("draft", lambda gen: _call_draft(fn, table, [0, 1], 8, gen)[0])


@drafting.case("drafted tokens are samples from q (not its argmax)", 2,
               "sample each token from q with torch.multinomial(q, 1, generator=generator); the verification "
               "rule assumes the drafts were drawn from the q it is given")
def _draft_samples(fn):
    g = torch.Generator().manual_seed(384)
    table = _dist(g, V, sharpness=0.8)
    n = 3000
    firsts, seconds = [], []
    for ret in fn.map([(NextTokenTable(table), [4], 2, g) for _ in range(n)]):
        tokens, _ = _call_draft(fn, table, [4], 2, g, ret=ret)
        firsts.append(tokens[0])
        seconds.append(tokens[1])
    try:
        a = expect_distribution("the first drafted token", firsts, table[4])
    except Mismatch as m:
        if len(set(firsts)) == 1:
            m.hint = ("the same first token every time: sample it from q (torch.multinomial(q, 1, "
                      "generator=generator)) instead of taking its argmax")
        raise
    try:
        expect_distribution("the second drafted token", seconds, table[4] @ table)  # Σ_x q0(x) q(. | x)
    except Mismatch as m:
        m.hint = ("the first token is right, the second is not: draw it from next_probs(context + [first token]), "
                  "extending the context with every token drafted so far")
        raise
    return "first token " + a


@drafting.case("draft + the sampled rule reproduce the target's first token", 1,
               "drafts must be drawn from exactly the q you return, else min(1, p/q) corrects the wrong thing")
def _draft_end_to_end(fn):
    g = torch.Generator().manual_seed(385)
    table, target = _dist(g, V, sharpness=0.8), _dist(g, V, sharpness=1.5)
    verify = torch.Generator().manual_seed(386)  # the rule's own random numbers, apart from the draft's
    firsts = []
    for ret in fn.map([(NextTokenTable(table), [2], 2, g) for _ in range(3000)]):
        context = [2]
        tokens, q = _call_draft(fn, table, context, 2, g, ret=ret)
        seq = context + tokens
        p = torch.stack([target[seq[i]] for i in range(3)])  # target rows after context, tokens[0], tokens[1]
        firsts.append(accept_sampled(tokens, q, p, verify)[0])
    return expect_distribution("the first token of the round", firsts, target[2])

