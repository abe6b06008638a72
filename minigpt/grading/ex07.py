"""Checks for exercise 07: exact verification of a token tree under sampling (Lesson 05, section 6).

``tree_speculative_step(tokens, parents, q, p, generator)``: walk down from the root; at a node with target
distribution p, try its children in index order, accepting child x with probability min(1, p(x) / q_x(x));
after a rejection p becomes the normalised residual max(0, p − q_x) and the next child is tried against it;
if every child is rejected (or the node is a leaf) the round's last token is drawn from what p has become;
after an acceptance the walk descends into the child, starting again from the target's distribution there.
q[i] is the distribution node i was proposed from (one-hot for a deterministic candidate such as a top-k
child). Reference: :func:`minigpt.decoding.verify.accept_tree_sampled` (SpecInfer, arXiv:2305.09781).

The rule is checked statistically: over thousands of seeded rounds the first output token (and, on Lesson
05's toy model, the first two) must follow the target's distribution within :func:`minigpt.exactness.tv_bound`. A biased
rule is far outside that bound: ``tests/test_grading_ex07_ex08.py`` measures the distance each wrong rule
reaches on the same inputs.
"""
from __future__ import annotations

import numbers

import torch

from ..decoding.candidates import children_of
from ..decoding.verify import accept_tree_greedy, accept_tree_sampled
from ..exactness import toy_tree
from ..exactness import tv_distance
from .core import Exercise, Mismatch, expect_distribution, expect_token_list, frequencies
from .helpers import call_unchanged, expect_reproducible, pick_hint

NOTEBOOK = "ex07_tree_sampling.ipynb"
V = 6

# Lesson 05's toy language (section 6): 4 tokens, the next-token distribution depends on the previous token
TOY_P = torch.tensor([[0.10, 0.20, 0.30, 0.40], [0.55, 0.15, 0.15, 0.15],
                      [0.05, 0.05, 0.60, 0.30], [0.25, 0.25, 0.25, 0.25]])
TOY_Q = torch.tensor([[0.50, 0.30, 0.10, 0.10], [0.10, 0.10, 0.40, 0.40],
                      [0.40, 0.40, 0.10, 0.10], [0.70, 0.10, 0.10, 0.10]])


def _dist(g: torch.Generator, rows: int, sharpness: float = 1.5, v: int = V) -> torch.Tensor:
    return torch.softmax(sharpness * torch.randn(rows, v, generator=g, dtype=torch.float64), -1).float()


def _call(fn, tokens, parents, q, p, g, ret=None):
    """Call the learner's function on copies (unless ``ret``, its answer from a batch, is given); check the
    answer's structure; return (path, token)."""
    if ret is None:
        ret = fn(list(tokens), list(parents), q.clone(), p.clone(), g)
    if not isinstance(ret, (tuple, list)) or len(ret) != 2:
        raise Mismatch("a pair (path, token)", f"a {type(ret).__name__}" + (f" of length {len(ret)}" if
                       isinstance(ret, (tuple, list)) else ""), "return path, token (the docstring's Returns line)")
    path = expect_token_list("the path (node indices)", ret[0])
    token = ret[1]
    if isinstance(token, torch.Tensor) and token.numel() == 1:
        token = token.item()
    if isinstance(token, bool) or not isinstance(token, numbers.Integral):
        raise Mismatch("the last token as an int", f"{token!r}"[:60], "return the sampled token id as an int")
    node = 0
    for c in path:
        if not 0 < c < len(parents) or parents[c] != node:
            raise Mismatch(f"a root-to-node path: each node a child of the one before (parents {list(parents)})",
                           f"path {path}", "the path lists the accepted nodes from the root down, without node 0")
        node = c
    if not 0 <= int(token) < p.shape[1]:
        raise Mismatch(f"a token id in 0..{p.shape[1] - 1}", f"{token}")
    return path, int(token)


def _batch(fn, rounds, g) -> list[tuple[list[int], int]]:
    """(path, token) of the learner's function on each round (tokens, parents, q, p), in one exchange, every
    call drawing from the generator ``g`` in turn."""
    answers = fn.map([(list(t), list(par), q.clone(), p.clone(), g) for t, par, q, p in rounds])
    return [_call(fn, *r, g, ret=ret) for r, ret in zip(rounds, answers)]


def _first_tokens(fn, make_round, n: int, seed: int) -> list[int]:
    """The first output token of n rounds (the first accepted node's token, or the last token). The rounds are
    made from one generator, the learner's function draws from another."""
    make, g = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 10_000)
    rounds = [make_round(make) for _ in range(n)]
    return [r[0][path[0]] if path else token for r, (path, token) in zip(rounds, _batch(fn, rounds, g))]


# ---- exact first-token distributions of known wrong rules, one level of deterministic siblings -------------

def _one_level_variants(p: torch.Tensor, xs: list[int]) -> list[tuple[torch.Tensor, str]]:
    """For a root with children carrying the distinct tokens xs, each with a one-hot q, the exact
    distribution of the first output token under known wrong rules, each with the hint for its bug."""
    p = p.double()

    def first_accepted_then(accept_probs, fallback):
        out, reach = torch.zeros_like(p), 1.0
        for x, a in zip(xs, accept_probs):
            out[x] += reach * a
            reach *= 1 - a
        return out + reach * fallback

    removed = p.clone()
    removed[xs] = 0
    plain = [float(p[x]) for x in xs]  # each child tried against the target's p itself
    minus_last = (p - torch.nn.functional.one_hot(torch.tensor(xs[-1]), p.numel()).double()).clamp(min=0)
    minus_first = p.clone()
    minus_first[xs[0]] = 0
    accepted_as_p = torch.zeros_like(p)
    accepted_as_p[xs] = p[xs]  # the right rule accepts child x with total probability p(x)
    return [
        (first_accepted_then(plain, minus_last / minus_last.sum()),
         "after a rejected child, the next sibling is tested against the residual: p <- norm(max(0, p - q_x)) "
         "before trying it, not the original p"),
        (first_accepted_then(plain, removed / removed.sum()),
         "the residual must be normalised before it is used in the next sibling's ratio: "
         "norm(max(0, p - q_x)) = max(0, p - q_x) / its sum"),
        (first_accepted_then(plain, minus_first / minus_first.sum()),
         "each root-to-leaf path was verified on its own (the per-path rule Lesson 05 shows is biased): "
         "try the children of one node in turn, each against the residual left by the rejected ones"),
        (accepted_as_p + (1 - sum(plain)) * p,
         "when every child is rejected, the token comes from the residual p has become, not from the "
         "target's original p"),
    ]


def _diagnose(tokens_seen, p: torch.Tensor, variants, m: Mismatch) -> Mismatch:
    freq = frequencies(torch.bincount(torch.as_tensor(tokens_seen, dtype=torch.long), minlength=p.numel()))
    right = tv_distance(freq, p)
    close = [h for d, h in variants if tv_distance(freq, d.float()) < right / 2]
    m.hint = pick_hint(close) or m.hint
    return m


# ---- tree_speculative_step(tokens, parents, q, p, generator) -> (path, token) -----------------------------------

step = Exercise("tree_speculative_step", NOTEBOOK, "walk down the tree: try each node's children in turn against "
                "the residual left by the rejected ones; sample the last token from what p has become")


def _random_tree(g: torch.Generator, n: int, v: int = V, one_hot: bool = True):
    """A random tree of n nodes whose siblings carry distinct tokens; q one-hot (deterministic candidates) or
    each child drawn from a random draft distribution at its parent; p random at every node."""
    parents = [-1] + [int(torch.randint(i, (1,), generator=g)) for i in range(1, n)]
    tokens = [int(torch.randint(v, (1,), generator=g))]
    used: list[set] = [set() for _ in range(n)]
    q_parent = _dist(g, n, v=v)
    q_rows = [torch.zeros(v)]
    for i in range(1, n):
        if one_hot:
            t = int(torch.randint(v, (1,), generator=g))
            while t in used[parents[i]]:
                t = (t + 1) % v
            q_rows.append(torch.nn.functional.one_hot(torch.tensor(t), v).float())
        else:
            t = int(torch.multinomial(q_parent[parents[i]], 1, generator=g))
            q_rows.append(q_parent[parents[i]].clone())
        used[parents[i]].add(t)
        tokens.append(t)
    return tokens, parents, torch.stack(q_rows), _dist(g, n, sharpness=2.0, v=v)


@step.case("returns (path, token): a root-to-node path of node indices and one token id", 1,
           "the docstring's Returns line: accepted node indices after the root, then the last token as an int")
def _structure(fn):
    g = torch.Generator().manual_seed(701)
    _batch(fn, [_random_tree(g, 1 + r % 9, one_hot=r % 2 == 0) for r in range(100)], g)
    return "100 random trees give well-formed answers"


@step.case("a root without children: the token is a sample of the target's p at the root", 1,
           "with no child to try, the last token comes straight from p[0]")
def _root_alone(fn):
    g = torch.Generator().manual_seed(702)
    p = _dist(g, 1)
    q = torch.zeros(1, V)
    outs = _first_tokens(fn, lambda gen: ([3], [-1], q, p), 3000, seed=703)
    return expect_distribution("the token", outs, p[0])


@step.case("a child the target gives probability 0 is never accepted", 1,
           "the acceptance probability is min(1, p(x) / q(x)): 0 when p(x) = 0")
def _zero_child(fn):
    g = torch.Generator().manual_seed(704)
    p = _dist(g, 3)
    p[0, 2] = 0.0
    p[0] /= p[0].sum()
    tokens, parents = [0, 2, 4], [-1, 0, 0]
    q = torch.stack([torch.zeros(V), _dist(g, 1)[0], torch.nn.functional.one_hot(torch.tensor(4), V).float()])
    gen = torch.Generator().manual_seed(705)
    for r, (path, token) in enumerate(_batch(fn, [(tokens, parents, q, p)] * 500, gen)):
        if path[:1] == [1] or (not path and token == 2):
            raise Mismatch("node 1 (token 2, p = 0 at the root) never accepted, and token 2 never emitted there",
                           f"path {path}, token {token} in round {r}",
                           "accept with probability min(1, p(x)/q(x)) and sample the last token from the residual, "
                           "which is 0 wherever p is 0")
    return "500 rounds never accept it"


@step.case("greedy limit: one-hot p and deterministic children give the greedy tree walk", 2,
           "with a one-hot p, min(1, p(x)/q(x)) is 1 for the target's token and 0 for the others: the walk must "
           "follow the target's choice into every child it accepts, level after level")
def _greedy(fn):
    g = torch.Generator().manual_seed(706)
    eye = torch.eye(V)
    for r in range(60):
        tokens, parents, q, _ = _random_tree(g, 2 + r % 10)
        kids = children_of(parents)
        argmax = []
        for i in range(len(tokens)):
            if kids[i] and float(torch.rand((), generator=g)) < 0.7:
                argmax.append(tokens[kids[i][int(torch.randint(len(kids[i]), (1,), generator=g))]])
            else:
                argmax.append(int(torch.randint(V, (1,), generator=g)))
        want = accept_tree_greedy(tokens, parents, argmax)
        got = _call(fn, tokens, parents, q, eye[argmax], g)
        if got != (want[0], want[1]):
            hint = None
            if got[0] == want[0][:len(got[0])] and len(got[0]) < len(want[0]):
                hint = ("the walk stopped early: after accepting a child, continue with that child's children "
                        "(and with every sibling of a rejected one)")
            raise Mismatch(f"{want} for tokens {tokens}, parents {parents}, target argmax {argmax}", f"{got}", hint)
    return "60 one-hot rounds agree with the greedy walk"


def _siblings_round(p_root: torch.Tensor, xs: list[int]):
    tokens, parents = [0] + xs, [-1] + [0] * len(xs)
    q = torch.stack([torch.zeros(V)] + [torch.nn.functional.one_hot(torch.tensor(x), V).float() for x in xs])
    p = torch.cat([p_root[None], torch.full((len(xs), V), 1.0 / V)])
    return lambda g: (tokens, parents, q, p)


def _det_siblings_inputs() -> tuple[torch.Tensor, list[int]]:
    """p at the root, and its three most likely tokens as the children (as draft_tree's top-k children)."""
    p_root = _dist(torch.Generator().manual_seed(708), 1, sharpness=1.0)[0]
    return p_root, torch.topk(p_root, 3).indices.tolist()


@step.case("three deterministic siblings (one-hot q, the top-3 tokens): the first token follows the target's p", 2,
           "Lesson 05, section 6, steps 1-3: each sibling is tried against the residual the rejected ones left")
def _det_siblings(fn):
    p_root, xs = _det_siblings_inputs()
    outs = _first_tokens(fn, _siblings_round(p_root, xs), 8000, seed=708)
    try:
        return expect_distribution("the first output token", outs, p_root)
    except Mismatch as m:
        raise _diagnose(outs, p_root, _one_level_variants(p_root, xs), m)


def _iid_round(q_root: torch.Tensor, p_root: torch.Tensor, k: int):
    def make(g):
        xs = torch.multinomial(q_root, k, replacement=True, generator=g).tolist()
        tokens, parents = [0] + xs, [-1] + [0] * k
        q = torch.stack([torch.zeros(V)] + [q_root] * k)
        p = torch.cat([p_root[None], torch.full((k, V), 1.0 / V)])
        return tokens, parents, q, p
    return make


@step.case("three siblings drawn from the draft (same q): the first token follows the target's p", 2,
           "Lesson 05, section 6: accept with min(1, p(x)/q(x)) where p is the current residual; after a "
           "rejection p <- max(0, p - q) / its sum; all rejected: sample from that p")
def _iid_siblings(fn):
    g = torch.Generator().manual_seed(709)
    q_root, p_root = _dist(g, 1, sharpness=1.5)[0], _dist(g, 1, sharpness=1.5)[0]
    outs = _first_tokens(fn, _iid_round(q_root, p_root, 3), 4000, seed=710)
    return expect_distribution("the first output token", outs, p_root)


def _toy_tree(g: torch.Generator):
    """Lesson 05's toy tree: two draft samples under the root, two under each of them."""
    return toy_tree(TOY_P, TOY_Q, 0, g)


@step.case("Lesson 05's toy tree: the first two output tokens follow P(a | root) P(b | a)", 3,
           "Lesson 05, section 6: the sibling rule at every node of the accepted path, descending into each "
           "accepted child")
def _toy_joint(fn):
    g, gen = torch.Generator().manual_seed(711), torch.Generator().manual_seed(712)
    trees = [_toy_tree(g) for _ in range(4000)]
    joint, lengths = [], []
    for (tokens, parents, q, p), (path, token) in zip(trees, _batch(fn, trees, gen)):
        lengths.append(len(path))
        out = [tokens[i] for i in path] + [token]
        if len(out) == 1:  # one token this round: the next comes from the target itself
            out.append(int(torch.multinomial(TOY_P[out[0]], 1, generator=g)))
        joint.append(4 * out[0] + out[1])
    exact = (TOY_P[0][:, None] * TOY_P).flatten()
    try:
        return expect_distribution("(first, second) output tokens", joint, exact)
    except Mismatch as m:
        # compare how much the learner's rule accepts with what the library's rule accepts on the same trees
        g, ref = torch.Generator().manual_seed(711), 0
        for _ in range(4000):
            ref += len(accept_tree_sampled(*_toy_tree(g), g)[0])
        mine, ref = sum(lengths) / len(lengths), ref / 4000
        if mine > ref + 0.1:
            m.hint = (f"your rule accepts {mine:.2f} nodes per round where the exact rule accepts {ref:.2f}: it "
                      "over-accepts what the draft proposed. Either each path was verified on its own, or a "
                      "sibling after a rejection was tested against the original p: try the children of one node "
                      "in turn, each against the normalised residual the rejected ones left")
        elif mine < ref - 0.1:
            m.hint = (f"your rule accepts {mine:.2f} nodes per round where the exact rule accepts {ref:.2f}: check "
                      "the residual update between siblings (normalised) and that after an acceptance the walk "
                      "continues from the target's p at the accepted child")
        raise


@step.case("leaves its inputs unchanged, and a seeded generator reproduces the round", 1,
           "build the residual as a new tensor ((p - q).clamp(min=0) / its sum) instead of writing into p; draw "
           "every random number from the generator you are given", side=True)
def _unchanged_reproducible(fn):
    g = torch.Generator().manual_seed(712)
    tokens, parents, q, p = _random_tree(g, 9, one_hot=False)
    call_unchanged(fn, (tokens, parents, q, p, torch.Generator().manual_seed(0)),
                   ("tokens", "parents", "q", "p", "generator"))

    def rounds(gen):
        return [tuple(_call(fn, tokens, parents, q, p, gen)[0]) + (_call(fn, tokens, parents, q, p, gen)[1],)
                for _ in range(15)]
    return "inputs unchanged; " + expect_reproducible("15 rounds", rounds)
