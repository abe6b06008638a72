"""Checks for exercise 06: the Medusa head's forward pass and the candidate tree built from the heads' guesses.

References are the library's own: :class:`minigpt.medusa_heads.MedusaHead` for the head and
:func:`minigpt.decoding.medusa.medusa_candidates` / :func:`minigpt.decoding.candidates.tree_from_paths` for the tree.
"""
from __future__ import annotations

import torch

from ..decoding.medusa import medusa_candidates
from ..medusa_heads import MedusaHead, sparse_tree_paths
from .core import Exercise, Mismatch, expect_close, expect_token_list
from .helpers import call_unchanged, pick_hint

NOTEBOOK = "ex06_medusa.ipynb"


# ---- medusa_head_forward(h, W, b, W_out) -> logits ------------------------------------------------------------

head = Exercise("medusa_head_forward", NOTEBOOK, "logits = W_out (h + SiLU(W h + b)), on the last dimension of h")


def _weights(g: torch.Generator, C: int, V: int, w_scale: float = 1.0, b_scale: float = 0.5):
    """Random head weights in nn.Linear's layout: W (C, C), b (C,), W_out (V, C); W is far from symmetric."""
    W = torch.randn(C, C, generator=g) * w_scale / C ** 0.5
    b = torch.randn(C, generator=g) * b_scale
    W_out = torch.randn(V, C, generator=g) / C ** 0.5
    return W, b, W_out


def _library_head(h, W, b, W_out) -> torch.Tensor:
    """The reference: minigpt.medusa_heads.MedusaHead with these weights."""
    C, V = W.shape[0], W_out.shape[0]
    m = MedusaHead(C, V)
    with torch.no_grad():
        m.fc.weight.copy_(W)
        m.fc.bias.copy_(b)
        m.out.weight.copy_(W_out)
        return m(h)


def _head_hint(got, h, W, b, W_out) -> str | None:
    """The hint of the known head mistakes that give ``got``."""
    silu = torch.nn.functional.silu
    known = [(silu(h @ W.T + b) @ W_out.T, "the residual is missing: add h to SiLU(W h + b) before the output "
                                            "projection"),
             ((h + torch.relu(h @ W.T + b)) @ W_out.T, "the activation is SiLU(x) = x * sigmoid(x), not ReLU"),
             (silu(h @ W.T + b + h) @ W_out.T, "h is added inside the activation: it is h + SiLU(W h + b)"),
             (silu((h + h @ W.T + b) @ W_out.T), "SiLU goes on the inner layer W h + b only, not on the logits"),
             ((h + silu(h @ W + b)) @ W_out.T, "W is in nn.Linear's layout (out, in): W h is h @ W.T"),
             ((h + silu(h @ W.T)) @ W_out.T, "the bias b is missing from the inner layer W h + b")]
    if not isinstance(got, torch.Tensor) or not got.is_floating_point():
        return None
    return pick_hint([hint for want, hint in known if want.shape == got.shape
                      and torch.allclose(got.float(), want, atol=1e-4, rtol=1e-4)])


def _head_case(fn, h, W, b, W_out) -> float:
    ref = _library_head(h, W, b, W_out)
    args = [t.clone() for t in (h, W, b, W_out)]
    got = fn(*args)
    if isinstance(got, torch.Tensor):
        got = got.detach()
    try:
        diff = expect_close("the logits", got, ref, atol=1e-4, rtol=1e-4)
    except Mismatch as m:
        m.hint = _head_hint(got, h, W, b, W_out) or m.hint
        raise
    if any(not torch.equal(a, t) for a, t in zip(args, (h, W, b, W_out))):
        raise Mismatch("the inputs left unchanged", "a modified input tensor",
                       "compute new tensors; do not write into h or the weights in place")
    return diff


@head.case("one hidden vector h of shape (C,) -> logits of shape (V,)", 1,
           "treat the last dimension of h as the feature dimension: h @ W.T + b works for any leading shape")
def _head_vector(fn):
    g = torch.Generator().manual_seed(601)
    W, b, W_out = _weights(g, 16, 40)
    diff = _head_case(fn, torch.randn(16, generator=g), W, b, W_out)
    return f"(16,) -> (40,), max |diff| {diff:.1e}"


@head.case("a batch of hidden states (B, T, C) -> (B, T, V)", 1,
           "use matrix products on the last dimension (h @ W.T), not torch.mv or a loop")
def _head_batch(fn):
    g = torch.Generator().manual_seed(602)
    W, b, W_out = _weights(g, 24, 50)
    diff = _head_case(fn, torch.randn(3, 5, 24, generator=g), W, b, W_out)
    return f"(3, 5, 24) -> (3, 5, 50), max |diff| {diff:.1e}"


@head.case("zero-initialised block (W = 0, b = 0): the head is just W_out h", 2,
           "SiLU(0) = 0, so with a zero block the head must reduce to W_out h: add h back *before* the output "
           "projection, and apply SiLU only to W h + b")
def _head_zero_init(fn):
    g = torch.Generator().manual_seed(603)
    C, V = 16, 30
    _, _, W_out = _weights(g, C, V)
    h = torch.randn(4, C, generator=g)
    diff = _head_case(fn, h, torch.zeros(C, C), torch.zeros(C), W_out)
    return f"equals W_out h, max |diff| {diff:.1e}"


@head.case("the bias is used: W = 0, b != 0 gives W_out (h + SiLU(b))", 1,
           "the inner layer is the affine map W h + b (like nn.Linear), then SiLU")
def _head_bias(fn):
    g = torch.Generator().manual_seed(604)
    C, V = 12, 20
    _, b, W_out = _weights(g, C, V, b_scale=2.0)
    diff = _head_case(fn, torch.randn(6, C, generator=g), torch.zeros(C, C), b, W_out)
    return f"max |diff| {diff:.1e}"


@head.case("random weights: matches minigpt.medusa_heads.MedusaHead", 2,
           "logits = W_out (h + SiLU(W h + b)) with SiLU(x) = x * sigmoid(x); the weights are in nn.Linear's "
           "layout, so W h is h @ W.T")
def _head_random(fn):
    g = torch.Generator().manual_seed(605)
    worst = 0.0
    for C, V, scale in ((8, 11, 2.0), (32, 64, 1.0), (20, 7, 3.0)):
        W, b, W_out = _weights(g, C, V, w_scale=scale)
        worst = max(worst, _head_case(fn, torch.randn(2, 9, C, generator=g), W, b, W_out))
    return f"3 random heads agree, max |diff| {worst:.1e}"


# ---- build_candidate_tree(head_logits, paths, root) -> (tokens, parents) ---------------------------------------

tree = Exercise("build_candidate_tree", NOTEBOOK, "the root, then one node per path sorted by (depth, ranks); "
                "a depth-d node with last rank r holds head d-1's rank-r token")


def _order(paths) -> list[tuple[int, ...]]:
    return sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))


def _tree_case(fn, head_logits: torch.Tensor, paths, root: int) -> str:
    want_tokens, want_parents = medusa_candidates(head_logits, root, paths)  # parents: tree_from_paths(paths)
    ret = fn(head_logits.clone(), [tuple(p) for p in paths], root)
    if not isinstance(ret, (tuple, list)) or len(ret) != 2:
        raise Mismatch("a pair (tokens, parents)", f"a {type(ret).__name__}" + (f" of length {len(ret)}"
                       if isinstance(ret, (tuple, list)) else ""), "return tokens, parents")
    tokens = expect_token_list("tokens", ret[0])
    parents = expect_token_list("parents", ret[1])
    n = len(want_tokens)
    if len(tokens) != n or len(parents) != n:
        raise Mismatch(f"{n} nodes (the root + {n - 1} paths) in tokens and in parents",
                       f"{len(tokens)} tokens and {len(parents)} parents",
                       "node 0 is the root (the last token of the sequence, parent -1), then one node per path")
    if tokens[0] != root or parents[0] != -1:
        raise Mismatch(f"the root first: tokens[0] = {root}, parents[0] = -1",
                       f"tokens[0] = {tokens[0]}, parents[0] = {parents[0]}",
                       "node 0 is the root (the last token of the sequence so far), with parent -1")
    order = _order(paths)
    for i in range(1, n):
        if parents[i] != want_parents[i]:
            extra = " (a parent must come before its child)" if parents[i] >= i else ""
            raise Mismatch(f"parents {want_parents} for paths {order}",
                           f"{parents}: node {i} (path {order[i - 1]}) has parent {parents[i]}{extra}",
                           "the parent of path (r_1, ..., r_d) is the node of (r_1, ..., r_d-1) (the root for "
                           "depth 1); nodes are sorted by (depth, ranks)")
    for i in range(1, n):
        if tokens[i] != want_tokens[i]:
            p = order[i - 1]
            ranked = torch.argsort(head_logits, dim=-1, descending=True)
            hint = None
            if len(p) < head_logits.shape[0] and tokens[i] == int(ranked[len(p), p[-1]]):
                hint = "a depth-d node reads head d - 1 (head 0 guesses the first token after the root)"
            elif tokens[i] == int(torch.argsort(head_logits[len(p) - 1])[p[-1]]):
                hint = "rank 0 is the largest logit: sort in descending order (topk, or argsort(descending=True))"
            raise Mismatch(f"tokens {want_tokens}", f"{tokens}: node {i} (path {p}, depth {len(p)}) holds "
                           f"{tokens[i]} instead of head {len(p) - 1}'s rank-{p[-1]} token {want_tokens[i]}", hint)
    return f"{n} nodes, depth {max(len(p) for p in order)}"


def _logits(g: torch.Generator, K: int = 4, V: int = 50) -> torch.Tensor:
    return 3.0 * torch.randn(K, V, generator=g)


@tree.case("the root comes first: one path (0,) gives [root, head 0's top token] and parents [-1, 0]", 1,
           "node 0 is the root (the last token of the sequence so far, parent -1); the depth-1 nodes are what "
           "head 0 predicts")
def _tree_single(fn):
    g = torch.Generator().manual_seed(611)
    return _tree_case(fn, _logits(g), [(0,)], root=7)


@tree.case("a chain of top-1 guesses: the depth-d node holds head d-1's top token", 2,
           "head k guesses the token k + 2 places after the hidden state's own, i.e. depth k + 1 of the tree: "
           "a depth-d node reads head d - 1")
def _tree_chain(fn):
    g = torch.Generator().manual_seed(612)
    return _tree_case(fn, _logits(g), [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)], root=3)


@tree.case("one level of four ranks: rank r is the r-th largest logit of head 0", 2,
           "rank 0 is the most likely token: topk(..., largest=True) or argsort(descending=True)")
def _tree_ranks(fn):
    g = torch.Generator().manual_seed(613)
    return _tree_case(fn, _logits(g), [(0,), (1,), (2,), (3,)], root=11)


@tree.case("a branching tree: each node's parent is the node of its path without the last rank", 2,
           "look the parent up by path: index[path[:-1]], with index[()] = 0 for the root")
def _tree_branching(fn):
    g = torch.Generator().manual_seed(614)
    paths = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (1, 0, 0), (0, 1, 0)]
    return _tree_case(fn, _logits(g), paths, root=0)


@tree.case("paths in any order (as sparse_tree_paths returns them): nodes sorted by (depth, ranks)", 1,
           "sort the paths by (len(path), path) before numbering the nodes, so every parent precedes its "
           "children and the order matches the library's")
def _tree_unsorted(fn):
    g = torch.Generator().manual_seed(615)
    logits = _logits(g)
    rank_acc = torch.tensor([[0.5, 0.2, 0.1], [0.4, 0.15, 0.1], [0.3, 0.1, 0.05], [0.2, 0.1, 0.05]])
    paths = sparse_tree_paths(rank_acc, budget=10)  # most likely first, not by depth
    _tree_case(fn, logits, paths, root=5)
    return _tree_case(fn, logits, list(reversed(paths)), root=5) + " (given deepest first, too)"


@tree.case("40 random sparse trees of 1 to 30 nodes", 1, "compare your tree with the examples above on small cases")
def _tree_random(fn):
    g = torch.Generator().manual_seed(616)
    for _ in range(40):
        K = int(torch.randint(1, 5, (1,), generator=g))
        rank_acc = torch.rand(K, 6, generator=g).sort(dim=1, descending=True).values
        budget = int(torch.randint(1, 31, (1,), generator=g))
        paths = sparse_tree_paths(rank_acc, budget=budget)
        order = torch.randperm(len(paths), generator=g).tolist()
        _tree_case(fn, _logits(g, K, 30), [paths[i] for i in order], root=int(torch.randint(30, (1,), generator=g)))
    return "40 random trees agree"


@tree.case("leaves the caller's head_logits and paths unchanged", 1,
           "sort a copy of the paths (sorted(paths, ...)), not the caller's list (paths.sort())", side=True)
def _tree_unchanged(fn):
    g = torch.Generator().manual_seed(617)
    paths = [(1,), (0, 0), (0,), (1, 0), (0, 1)]  # not in (depth, ranks) order, as sparse_tree_paths may return
    call_unchanged(fn, (_logits(g), paths, 4), ("head_logits", "paths", "root"))
    return "head_logits and paths unchanged"
