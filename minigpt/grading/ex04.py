"""Checks for exercise 04: tree attention -- the mask and positions of a flattened token tree, and greedy
verification of a whole tree (the longest path the target agrees with, plus its next token).

The mask and positions are checked twice: against :mod:`minigpt.decoding.candidates` on hand-made and random trees,
and functionally -- fed to a small random GPT after a cached prefix, they must give every node the logits of
running its root-to-node path alone. References: :func:`~minigpt.decoding.candidates.tree_attention_mask`,
:func:`~minigpt.decoding.candidates.tree_position_ids`, :func:`~minigpt.decoding.verify.accept_tree_greedy`.
"""
from __future__ import annotations

import numbers

import torch

from ..cache import KVCache
from ..decoding.candidates import children_of, tree_attention_mask, tree_depths, tree_position_ids
from ..decoding.verify import accept_tree_greedy
from ..model import GPT, GPTConfig
from .core import Exercise, Mismatch, expect_token_list
from .helpers import call_unchanged, pick_hint

NOTEBOOK = "ex04_tree_attention.ipynb"


def random_parents(g: torch.Generator, n: int) -> list[int]:
    """A random tree of n nodes: node i > 0 hangs under a random earlier node."""
    return [-1] + [int(torch.randint(i, (1,), generator=g)) for i in range(1, n)]


# ---- tree_mask_and_positions(parents, offset) -> (mask (N, N) bool, position_ids (N,)) -----------------------

masks = Exercise("tree_mask_and_positions", NOTEBOOK, "node i attends to itself and its ancestors; its "
                 "position is offset + depth")


def _call_mask(fn, parents, offset, strict_types: bool = False):
    """Call the learner's function; return (mask as bool (N, N), positions as long (N,)) or raise Mismatch."""
    n = len(parents)
    ret = fn(list(parents), offset)
    if not isinstance(ret, (tuple, list)) or len(ret) != 2:
        raise Mismatch("a tuple (mask, position_ids)", f"a {type(ret).__name__}", "return mask, position_ids")
    mask, pos = ret
    if not isinstance(mask, torch.Tensor):
        raise Mismatch(f"mask as a torch.Tensor of shape ({n}, {n})", f"a {type(mask).__name__}")
    if tuple(mask.shape) != (n, n):
        raise Mismatch(f"mask of shape ({n}, {n}) for {n} nodes", f"shape {tuple(mask.shape)}")
    if strict_types and mask.dtype != torch.bool:
        raise Mismatch("a boolean mask (True = may attend)", f"dtype {mask.dtype}",
                       "build it with torch.zeros(n, n, dtype=torch.bool)")
    if isinstance(pos, (list, tuple)) and all(isinstance(p, numbers.Integral) for p in pos):
        pos = torch.tensor([int(p) for p in pos], dtype=torch.long)
    if not isinstance(pos, torch.Tensor):
        raise Mismatch(f"position_ids as a torch.Tensor of shape ({n},)", f"a {type(pos).__name__}")
    if tuple(pos.shape) != (n,):
        raise Mismatch(f"position_ids of shape ({n},)", f"shape {tuple(pos.shape)}")
    if pos.is_floating_point() or pos.dtype == torch.bool:
        raise Mismatch("integer position_ids (they index the position embedding)", f"dtype {pos.dtype}",
                       "torch.tensor(list_of_ints) gives a LongTensor")
    return mask.detach().cpu().bool(), pos.detach().cpu().long()


def _mask_hint(mask: torch.Tensor, parents) -> str | None:
    """The hint of the known mask mistakes that give ``mask``."""
    ref, n = tree_attention_mask(parents), len(parents)
    known = [(torch.ones(n, n, dtype=torch.bool).tril(), "every earlier node was allowed, as in a chain's causal "
              "mask: siblings and cousins are alternative futures, so a node attends to its ancestors only"),
             (ref & ~torch.eye(n, dtype=torch.bool), "the diagonal is missing: every node attends to itself"),
             (ref.T, "the mask is transposed: row i lists what node i attends to, i.e. i and its ancestors (not "
                     "its descendants)")]
    return pick_hint([h for m, h in known if torch.equal(mask, m) and not torch.equal(m, ref)])


def _position_hint(pos: torch.Tensor, parents, offset) -> str | None:
    """The hint of the known position mistakes that give ``pos``."""
    depth = torch.tensor(tree_depths(parents))
    ref = tree_position_ids(parents, offset)
    known = [(offset + depth + 1, "one too far: the root itself sits at position offset, right after the "
                                  "cached prefix (depth 0)"),
             (offset + torch.arange(len(parents)), "positions by index: siblings are candidates for the same "
                                                   "slot, so a node's position is offset + its depth"),
             (depth, "offset is missing: the tree comes after the cached prefix, so add offset to the depth")]
    return pick_hint([h for p, h in known if torch.equal(pos, p) and not torch.equal(p, ref)])


def _compare(fn, parents, offset) -> None:
    mask, pos = _call_mask(fn, parents, offset)
    ref_mask, ref_pos = tree_attention_mask(parents), tree_position_ids(parents, offset)
    if not torch.equal(mask, ref_mask):
        bad = int((mask != ref_mask).any(1).nonzero()[0])
        want = torch.nonzero(ref_mask[bad]).flatten().tolist()
        got = torch.nonzero(mask[bad]).flatten().tolist()
        raise Mismatch(f"row {bad} of the mask to allow nodes {want} (parents {parents})", f"nodes {got}",
                       _mask_hint(mask, parents))
    if not torch.equal(pos, ref_pos):
        raise Mismatch(f"position_ids {ref_pos.tolist()} (parents {parents}, offset {offset})", f"{pos.tolist()}",
                       _position_hint(pos, parents, offset))


@masks.case("returns a bool (N, N) mask and integer (N,) positions", 1,
            "mask: torch.bool, True where node i may attend to node j; positions: a LongTensor")
def _mask_types(fn):
    for parents in ([-1, 0, 0, 1], [-1, 0, 1, 2, 2, 0]):
        _call_mask(fn, parents, 5, strict_types=True)
    return "types and shapes right for trees of 4 and 6 nodes"


@masks.case("a root alone: it sees itself, at position offset", 1,
            "every node must attend to itself (the diagonal is True); the root sits at position offset")
def _mask_root(fn):
    for offset in (0, 9):
        _compare(fn, [-1], offset)
    return "[[True]], position offset"


@masks.case("a chain: the mask is the causal triangle, positions offset .. offset + N - 1", 1,
            "in a chain every earlier node is an ancestor")
def _mask_chain(fn):
    _compare(fn, [-1, 0, 1, 2, 3], 7)
    return "chain of 5 nodes right"


@masks.case("siblings: children of one node do not see each other and share a position", 2,
            "attend to ancestors only (not to every earlier index); siblings are alternatives for the same "
            "position, so position = offset + depth, not offset + index")
def _mask_siblings(fn):
    _compare(fn, [-1, 0, 0, 0], 4)
    _compare(fn, [-1, 0, 0, 1, 2, 1], 11)
    return "siblings separated, positions by depth"


@masks.case("positions are offset + depth on deeper trees", 2,
            "depth(root) = 0, depth(i) = depth(parents[i]) + 1; the root itself is at position offset, "
            "right after the cached prefix")
def _mask_positions(fn):
    parents = [-1, 0, 1, 1, 0, 3, 5, 4]
    for offset in (0, 1, 23):
        mask, pos = _call_mask(fn, parents, offset)
        want = tree_position_ids(parents, offset)
        if not torch.equal(pos, want):
            raise Mismatch(f"position_ids {want.tolist()} (parents {parents}, offset {offset}; depths "
                           f"{tree_depths(parents)})", f"{pos.tolist()}", _position_hint(pos, parents, offset))
    return "positions right for offsets 0, 1, 23"


@masks.case("30 random trees (2 to 14 nodes) agree with the reference", 2,
            "row i allows exactly i and its ancestors: walk up parents[] from i to the root")
def _mask_random(fn):
    g = torch.Generator().manual_seed(401)
    for _ in range(30):
        n = int(torch.randint(2, 15, (1,), generator=g))
        _compare(fn, random_parents(g, n), int(torch.randint(0, 40, (1,), generator=g)))
    return "30 random trees right"


@masks.case("leaves the caller's parents list unchanged", 1, "read parents; build the mask and positions as "
            "new tensors", side=True)
def _mask_unchanged(fn):
    call_unchanged(fn, ([-1, 0, 0, 1, 2, 1], 3), ("parents", "offset"))
    return "parents unchanged"


_MODEL: dict = {}


def _small_model() -> GPT:
    """A small random GPT (seeded, built once): the functional test of the mask and the positions."""
    if "m" not in _MODEL:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(404)
            m = GPT(GPTConfig(vocab_size=61, block_size=64, n_layer=2, n_head=2, n_embd=32)).eval()
        _MODEL["m"] = m
    return _MODEL["m"]


@masks.case("functional: a small GPT given your mask and positions scores every node like its path alone", 3,
            "a node's logits must equal running the prefix and its root-to-node path on their own; check the "
            "mask (ancestors and itself) and the positions (offset + depth)")
def _mask_functional(fn):
    model = _small_model()
    g = torch.Generator().manual_seed(405)
    worst = 0.0
    for trial in range(4):
        n = 6 + 2 * trial
        parents = random_parents(g, n)
        prefix = torch.randint(61, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
        tokens = [prefix[-1]] + torch.randint(61, (n - 1,), generator=g).tolist()
        cache_prefix = prefix[:-1]  # the cache holds the sequence without its last token, the root
        mask, pos = _call_mask(fn, parents, len(cache_prefix))
        with torch.no_grad():
            cache = KVCache.for_model(model)
            model(torch.tensor([cache_prefix]), cache=cache)
            tree_logits = model(torch.tensor([tokens]), cache=cache, position_ids=pos, attn_mask=mask)[0]
            for i in range(n):
                path, node = [], i
                while node >= 0:
                    path.append(tokens[node])
                    node = parents[node]
                alone = model(torch.tensor([cache_prefix + path[::-1]]))[0, -1]
                diff = float((tree_logits[i] - alone).abs().max())
                worst = max(worst, diff)
                if diff > 1e-4:
                    hint = pick_hint([h for h in (_mask_hint(mask, parents),
                                                  _position_hint(pos, parents, len(cache_prefix))) if h])
                    raise Mismatch(f"node {i}'s logits = those of its path alone (parents {parents}, offset "
                                   f"{len(cache_prefix)})", f"max |diff| {diff:.3g}", hint)
    return f"4 trees of 6-12 nodes: every node matches its path alone (max |diff| {worst:.1e})"


# ---- longest_accepted_path(tokens, parents, target_argmax) -> (path, next token) -----------------------------

paths = Exercise("longest_accepted_path", NOTEBOOK, "walk from the root to the child whose token is the target's "
                 "argmax, until none is; return the nodes walked and the target's token at the last one")


def random_tree(g: torch.Generator, n: int, vocab: int = 40, agree: float = 0.75):
    """(tokens, parents, target_argmax): a random tree whose siblings carry distinct tokens, and target
    choices that pick one of a node's children with probability ``agree``."""
    parents = random_parents(g, n)
    tokens = [int(torch.randint(vocab, (1,), generator=g))]
    kids: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        used = {tokens[c] for c in kids[parents[i]]}
        t = int(torch.randint(vocab, (1,), generator=g))
        while t in used:
            t = (t + 1) % vocab
        tokens.append(t)
        kids[parents[i]].append(i)
    argmax = []
    for i in range(n):
        if kids[i] and float(torch.rand((), generator=g)) < agree:
            argmax.append(tokens[kids[i][int(torch.randint(len(kids[i]), (1,), generator=g))]])
        else:
            used = {tokens[c] for c in kids[i]}
            t = int(torch.randint(vocab, (1,), generator=g))
            while t in used:
                t = (t + 1) % vocab
            argmax.append(t)
    return tokens, parents, argmax


def _path_hint(got, tokens, parents, argmax) -> str | None:
    """The hint of the known greedy-walk mistakes that give ``got`` on this tree."""
    kids = children_of(parents)
    want_path, want_next = accept_tree_greedy(tokens, parents, argmax)
    first_only, node = [], 0
    while kids[node] and tokens[kids[node][0]] == argmax[node]:
        node = kids[node][0]
        first_only.append(node)
    depth = tree_depths(parents)
    leaf = max(range(len(parents)), key=lambda i: depth[i])
    branch, node = [], leaf
    while node > 0:
        branch.insert(0, node)
        node = parents[node]
    chain, node = [], 0
    for c in branch:
        if tokens[c] != argmax[node]:
            break
        chain.append(c)
        node = c
    at_parent = parents[want_path[-1]] if want_path else 0
    known = [((first_only, argmax[first_only[-1] if first_only else 0]),
              "only the first child of each node was compared: any child whose token is the target's choice "
              "is accepted"),
             (([0] + want_path, want_next), "the root (node 0) is already in the sequence: the path starts with "
                                            "its accepted child"),
             ((chain, argmax[chain[-1] if chain else 0]), "only the deepest branch was verified, as a chain: "
                                                          "follow the target's choices from the root instead"),
             ((want_path, argmax[at_parent]), "the last token is the target's argmax at the last accepted node "
                                              "(not at its parent)")]
    return pick_hint([h for v, h in known if v == got and v != (want_path, want_next)])


def _path_case(fn, tokens, parents, argmax) -> str:
    want_path, want_next = accept_tree_greedy(tokens, parents, argmax)
    ret = fn(list(tokens), list(parents), list(argmax))
    if not isinstance(ret, (tuple, list)) or len(ret) != 2:
        raise Mismatch("a tuple (path, next_token)", f"a {type(ret).__name__}", "return path, next_token")
    path = expect_token_list("the path (node indices)", ret[0])
    nxt = ret[1]
    if isinstance(nxt, torch.Tensor) and nxt.numel() == 1:
        nxt = nxt.item()
    if isinstance(nxt, bool) or not isinstance(nxt, numbers.Integral):
        raise Mismatch(f"next_token as an int ({want_next} here)", f"{nxt!r}",
                       "the round always ends with one token chosen by the target: its argmax at the last "
                       "accepted node (the bonus token when the walk reaches a leaf)")
    if path != want_path or int(nxt) != want_next:
        raise Mismatch(f"({want_path}, {want_next}) for tokens {list(tokens)}, parents {list(parents)}, "
                       f"target_argmax {list(argmax)}", f"({path}, {int(nxt)})",
                       _path_hint((path, int(nxt)), tokens, parents, argmax))
    return f"path {path}, next {want_next}"


@paths.case("the root has no children: no path, the target's token at the root", 1,
            "the root (node 0) is already in the sequence: it is never part of the path")
def _path_root(fn):
    return _path_case(fn, [7], [-1], [3])


@paths.case("no child matches the target: empty path, the target's own token", 1,
            "the path holds accepted nodes after the root; when no child of the root matches, it is empty")
def _path_none(fn):
    return _path_case(fn, [5, 1, 2], [-1, 0, 0], [9, 4, 6])


@paths.case("a chain the target agrees with all the way: every node, then the bonus token", 1,
            "at a leaf the walk stops and the target's argmax at that leaf is the extra (bonus) token")
def _path_chain(fn):
    return _path_case(fn, [5, 1, 2, 3], [-1, 0, 1, 2], [1, 2, 3, 8])


@paths.case("the target picks the root's second child, then its child", 2,
            "compare the target's choice with every child of the current node, not only the first")
def _path_second_child(fn):
    # root 0 -> children 1 (token 4), 2 (token 6); 2 -> child 3 (token 8); 1 -> child 4 (token 9)
    return _path_case(fn, [0, 4, 6, 8, 9], [-1, 0, 0, 2, 1], [6, 9, 8, 2, 3])


@paths.case("a deeper branch the target does not follow is not accepted", 2,
            "accept the path the target's choices lead to, even when another branch is longer")
def _path_deep_wrong_branch(fn):
    # branch via node 1 is 4 deep, the target follows node 2 (then stops after one node)
    tokens = [0, 10, 20, 11, 12, 13, 21]
    parents = [-1, 0, 0, 1, 3, 4, 2]
    argmax = [20, 11, 21, 12, 13, 14, 5]
    return _path_case(fn, tokens, parents, argmax)


@paths.case("200 random trees (1 to 16 nodes) agree with the reference", 2,
            "walk down from node 0: step to the child whose token equals target_argmax[node]; stop when "
            "none does and return target_argmax at that node")
def _path_random(fn):
    g = torch.Generator().manual_seed(411)
    for r in range(200):
        _path_case(fn, *random_tree(g, 1 + r % 16))
    return "200 random trees right"


@paths.case("leaves the caller's lists unchanged", 1, "read tokens, parents and target_argmax; build a new path list", side=True)
def _path_unchanged(fn):
    call_unchanged(fn, ([0, 4, 6, 8, 9], [-1, 0, 0, 2, 1], [6, 9, 8, 2, 3]), ("tokens", "parents", "target_argmax"))
    return "tokens, parents and target_argmax unchanged"
