"""Checks for exercise 09: lookahead decoding's attention mask -- the 2-D Jacobi window seen as a token tree,
its mask (also when the end of the context cuts the window), and the one mask of a round that scores the
candidates' tree and the window in the same target pass.

* ``window_parents(rows, window)``: the window is a tree hanging from the root; node (r, k) (index r * window + k,
  depth 1 + r + k) has as parent the node one position before it on the trajectory that produced it: (0, k - 1)
  in row 0, (r - 1, k) below it, the root (-1) for (0, 0);
* ``lookahead_mask(rows, window, max_depth=None)``: the window's mask (a node sees its ancestors and itself), over
  the nodes at depth <= max_depth only when it is given (the library cuts the window there at the end of the
  context), numbered in row-major order among those kept;
* ``proposal_mask(parents, extra_mask)``: the round's mask, the candidates' tree beside the window.

The masks are checked against the library on edge cases and random sizes, and functionally: fed to a small
random GPT after a cached prefix, they must give every guess of the window the logits of its own context run
alone, and every candidate the logits of its root-to-node path alone. References:
:func:`~minigpt.decoding.lookahead.window_mask`, :func:`~minigpt.decoding.lookahead.window_depths`,
:meth:`~minigpt.decoding.lookahead.Lookahead.propose` (the cut) and
:meth:`~minigpt.decoding.candidates.Proposal.attention_mask`.
"""
from __future__ import annotations

import torch

from ..cache import KVCache
from ..decoding.candidates import Proposal, tree_attention_mask
from ..decoding.lookahead import window_depths, window_mask
from ..model import GPT, GPTConfig
from .core import Exercise, Mismatch, expect_token_list
from .ex04 import random_parents
from .helpers import call_unchanged, pick_hint

NOTEBOOK = "ex09_lookahead_mask.ipynb"
VOCAB = 61


def _as_bool_mask(got, shape: tuple[int, int], what: str, strict_types: bool) -> torch.Tensor:
    """The learner's mask as a bool tensor of ``shape`` (on the CPU), or a Mismatch saying what is wrong."""
    if not isinstance(got, torch.Tensor):
        raise Mismatch(f"{what} as a torch.Tensor of shape {shape}", f"a {type(got).__name__}",
                       "build it with torch.zeros(n, n, dtype=torch.bool) and set the allowed entries to True")
    if tuple(got.shape) != shape:
        raise Mismatch(f"{what} of shape {shape}", f"shape {tuple(got.shape)}",
                       "one row and one column per node: rows * window nodes for the window, N + E for a round")
    got = got.detach().cpu()
    if got.is_floating_point() and bool((~torch.isfinite(got) | (got < 0)).any()):
        raise Mismatch(f"{what} with True (or 1) where a node may attend", "an additive mask (0 / -inf values)",
                       "return a bool mask, True = may attend; the model builds the additive mask itself")
    if strict_types and got.dtype != torch.bool:
        raise Mismatch(f"{what} of dtype torch.bool", f"dtype {got.dtype}",
                       "a bool mask, True where a node may attend (the model turns it into -inf itself)")
    return got != 0


def _node(i: int, window: int) -> str:
    return f"({i // window}, {i % window})"


def _nodes(row: torch.Tensor, window: int) -> str:
    return "[" + ", ".join(_node(j, window) for j in row.nonzero().flatten().tolist()) + "]"


# ---- window_parents(rows, window) -> list of rows * window ints ---------------------------------------------------

trees = Exercise("window_parents", NOTEBOOK, "the window as a token tree: each guess's parent is the node one "
                 "position before it on its trajectory (-1: the root)")


def reference_parents(rows: int, window: int) -> list[int]:
    """Node (r, k)'s parent: (0, k - 1) in row 0, (r - 1, k) below it, -1 (the root) for (0, 0)."""
    return [(k - 1 if k else -1) if r == 0 else (r - 1) * window + k for r in range(rows) for k in range(window)]


def _parents_hint(got: list, rows: int, window: int) -> str | None:
    n = rows * window
    known = [
        ([i - 1 for i in range(n)], "a chain through the flattened window makes every guess read whole earlier rows: "
                                    "which node holds the token one position before (r, k) in *its* context?"),
        ([(r - 1) * window + k if r else -1 for r in range(rows) for k in range(window)],
         "row 0 is itself a trajectory: (0, k) continues (0, k - 1), not the root"),
        ([(r - 1) * window + k - 1 if r and k else (k - 1 if not r else -1) for r in range(rows) for k in range(window)],
         "the diagonal is how n-grams are read off the trajectories; the parent is the node whose token comes "
         "right before this one in its own context, one position (one depth) earlier"),
        ([(k - 1 if k else -1) * rows if r == 0 else (r - 1) + k * rows for r in range(rows) for k in range(window)],
         "node (r, k) is index r * window + k (row-major), for the nodes and for the parents"),
    ]
    return pick_hint([h for ref, h in known if got == ref and ref != reference_parents(rows, window)])


def _parents_case(fn, rows: int, window: int) -> list[int]:
    want = reference_parents(rows, window)
    got = expect_token_list(f"window_parents({rows}, {window})", fn(rows, window))
    if len(got) != rows * window:
        raise Mismatch(f"{rows * window} parents (one per guess of a {rows} x {window} window)", f"{len(got)}",
                       "one entry per node (r, k), in row-major order")
    if got != want:
        bad = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        name = lambda j: "the root" if j == -1 else f"node {_node(j, window)}"  # noqa: E731
        raise Mismatch(f"the parent of node {_node(bad, window)} in a {rows} x {window} window = {name(want[bad])}",
                       f"{name(got[bad]) if -1 <= got[bad] < rows * window else got[bad]}",
                       _parents_hint(got, rows, window))
    return got


@trees.case("one row (plain Jacobi): the window is a chain", 1,
            "with one row, which guess comes right before guess k in the text it continues?")
def _parents_jacobi(fn):
    _parents_case(fn, 1, 1)
    return f"1 x 4: {_parents_case(fn, 1, 4)}; 1 x 1 right"


@trees.case("one column: a chain down the column", 1, "with one column, which node is one position before (r, 0)?")
def _parents_column(fn):
    return f"3 x 1: {_parents_case(fn, 3, 1)}"


@trees.case("the 3 x 4 window: every guess one position after its parent", 2,
            "a guess at depth d is scored after one token at each depth 1 .. d - 1: its parent is the one at d - 1, "
            "on the same trajectory")
def _parents_example(fn):
    return f"3 x 4: {_parents_case(fn, 3, 4)}"


@trees.case("20 random sizes agree with the reference, and the tree's mask is the window's", 2,
            "ancestors and itself: the tree mask of exercise 04 over your parents must give each guess one node at "
            "each depth 1 .. its own")
def _parents_random(fn):
    g = torch.Generator().manual_seed(905)
    for _ in range(20):
        rows, window = (int(torch.randint(1, m + 1, (1,), generator=g)) for m in (5, 8))
        got = _parents_case(fn, rows, window)
        assert torch.equal(tree_attention_mask([-1] + [p + 1 for p in got])[1:, 1:], window_mask(rows, window))
    return "20 random windows right; the tree mask of each is the library's window mask"


# ---- lookahead_mask(rows, window, max_depth=None) -> (E, E) bool --------------------------------------------------

windows = Exercise("lookahead_mask", NOTEBOOK, "each guess sees its ancestors in the window's tree and itself; with "
                   "max_depth, only the nodes at depth <= max_depth, in row-major order")


def _kept(rows: int, window: int, max_depth: int | None) -> list[int]:
    return [i for i, d in enumerate(window_depths(rows, window)) if max_depth is None or d <= max_depth]


def reference_window(rows: int, window: int, max_depth: int | None = None) -> torch.Tensor:
    keep = _kept(rows, window, max_depth)
    return window_mask(rows, window)[keep][:, keep]


def _call_window(fn, rows: int, window: int, strict_types: bool = False, max_depth: int | None = None):
    n = len(_kept(rows, window, max_depth))
    got = fn(rows, window) if max_depth is None else fn(rows, window, max_depth)
    what = f"the mask of a {rows} x {window} window" + (f" cut at depth {max_depth}" if max_depth else "")
    try:
        return _as_bool_mask(got, (n, n), what, strict_types)
    except Mismatch as m:
        size = tuple(got.shape) if isinstance(got, torch.Tensor) else None
        if max_depth is not None and size == (rows * window,) * 2 and n != rows * window:
            m.hint = "max_depth is ignored: keep only the nodes whose depth 1 + r + k is at most max_depth"
        elif max_depth is not None and size == (len(_kept(rows, window, max_depth - 1)),) * 2:
            m.hint = "off by one: a node at depth exactly max_depth still fits"
        raise


def _window_hint(mask: torch.Tensor, rows: int, window: int) -> str | None:
    """The hint of the known window-mask mistakes that give ``mask``."""
    ref, n = window_mask(rows, window), rows * window
    col_major = torch.tensor([(i % rows) * window + i // rows for i in range(n)])  # node k*rows + r is (r, k)
    column_only = torch.zeros(n, n, dtype=torch.bool)
    short_row0 = torch.zeros(n, n, dtype=torch.bool)
    long_row0 = torch.zeros(n, n, dtype=torch.bool)
    for r in range(rows):
        for k in range(window):
            i, col = r * window + k, [s * window + k for s in range(r + 1)]
            column_only[i, col] = True
            short_row0[i, :k] = True
            short_row0[i, col[1:]] = True
            long_row0[i, :k + 2] = True
            long_row0[i, col[1:]] = True
    known = [
        (torch.ones(n, n, dtype=torch.bool).tril(),
         "a causal mask over the flattened window lets a guess see whole earlier rows, several tokens at one depth: "
         "a guess must see exactly its ancestors in the window's tree (window_parents) and itself"),
        (column_only, "some ancestors are missing: follow the parents up to the root, through row 0 as well"),
        (short_row0, "one ancestor is missing in row 0: follow the parents all the way up"),
        (long_row0, "one node of row 0 too many: it sits at the same depth as one of the guess's ancestors"),
        (ref[col_major][:, col_major], "the nodes are numbered column by column: node (r, k) is index "
                                       "r * window + k (row-major), not k * rows + r"),
        (window_mask(window, rows) if rows != window else ref,
         "rows and columns are swapped: there are `rows` rows (ngram - 1) of `window` guesses each"),
        (ref & ~torch.eye(n, dtype=torch.bool), "the diagonal is missing: every guess attends to itself"),
        (ref.T, "the mask is transposed: row i lists what node i attends to (the nodes before it), not the "
                "nodes that attend to it"),
    ]
    return pick_hint([h for m, h in known if torch.equal(mask, m) and not torch.equal(m, ref)])


def _compare_window(fn, rows: int, window: int, max_depth: int | None = None) -> None:
    mask, ref = _call_window(fn, rows, window, max_depth=max_depth), reference_window(rows, window, max_depth)
    if not torch.equal(mask, ref):
        keep = _kept(rows, window, max_depth)
        bad = int((mask != ref).any(1).nonzero()[0])
        label = lambda row: "[" + ", ".join(_node(keep[j], window) for j in row.nonzero().flatten().tolist()) + "]"  # noqa: E731
        cut = f" cut at depth {max_depth}" if max_depth else ""
        raise Mismatch(f"row {bad} of the {rows} x {window} window's mask{cut} (node {_node(keep[bad], window)}) "
                       f"to allow nodes {label(ref[bad])}", f"nodes {label(mask[bad])}",
                       _window_hint(mask, rows, window) if max_depth is None else _cut_hint(mask, rows, window,
                                                                                             max_depth))


def _cut_hint(mask: torch.Tensor, rows: int, window: int, max_depth: int) -> str | None:
    n = mask.shape[0]
    full = window_mask(rows, window)
    known = [(full[:n, :n], "the first nodes by index are not the nodes that fit: keep the nodes whose depth "
                            "1 + r + k is at most max_depth, whatever their index"),
             (reference_window(rows, window, max_depth - 1) if n == len(_kept(rows, window, max_depth - 1)) else None,
              "off by one: a node at depth exactly max_depth still fits")]
    return pick_hint([h for m, h in known if m is not None and m.shape == mask.shape and torch.equal(mask, m)])


@windows.case("returns a bool (rows * window, rows * window) tensor", 1,
              "torch.zeros(n, n, dtype=torch.bool) with n = rows * window, then set the allowed entries to True")
def _window_types(fn):
    for rows, window in ((2, 3), (3, 4)):
        _call_window(fn, rows, window, strict_types=True)
    return "bool masks of shape (6, 6) and (12, 12)"


@windows.case("one row (plain Jacobi, ngram = 2)", 1,
              "with one row the window is a chain: what does each guess see of it?")
def _window_jacobi(fn):
    for window in (4, 7, 1):
        _compare_window(fn, 1, window)
    return "1 x 4, 1 x 7 and 1 x 1 right"


@windows.case("one column (window = 1)", 1, "with one column the window is a chain down the column")
def _window_one_column(fn):
    for rows in (2, 5):
        _compare_window(fn, rows, 1)
    return "2 x 1 and 5 x 1 right"


@windows.case("the 3 x 4 window drawn in section 1", 2,
              "each guess sees its ancestors in the window's tree and itself (exercise 04's tree mask)")
def _window_example(fn):
    _compare_window(fn, 3, 4)
    return "every row of the 3 x 4 window right"


@windows.case("every guess sees exactly one token at each depth 1 .. its own (node (r, k) is at 1 + r + k)", 1,
              "a guess at depth d must see a complete context: one node at each depth 1, 2, .., d (itself last)")
def _window_depths(fn):
    for rows, window in ((2, 5), (4, 3), (3, 6)):
        mask, depth = _call_window(fn, rows, window), window_depths(rows, window)
        for i in range(rows * window):
            seen = sorted(depth[j] for j in mask[i].nonzero().flatten().tolist())
            if seen != list(range(1, depth[i] + 1)):
                raise Mismatch(f"node {_node(i, window)} of a {rows} x {window} window (depth {depth[i]}) to see "
                               f"one node at each depth 1 .. {depth[i]}", f"nodes at depths {seen}",
                               _window_hint(mask, rows, window))
    return "complete contexts in 2 x 5, 4 x 3 and 3 x 6 windows"


@windows.case("20 random sizes (1 to 5 rows, 1 to 8 columns) agree with the reference", 1,
              "node (r, k) is index r * window + k; it sees its ancestors in the window's tree and itself")
def _window_random(fn):
    g = torch.Generator().manual_seed(901)
    for _ in range(20):
        rows, window = (int(torch.randint(1, m + 1, (1,), generator=g)) for m in (5, 8))
        _compare_window(fn, rows, window)
    return "20 random windows right"


@windows.case("the window cut at the end of the context: only the nodes at depth <= max_depth", 2,
              "which nodes fit, and does each of them keep its whole context? number the kept nodes in row-major "
              "order")
def _window_cut(fn):
    for rows, window, depth in ((3, 4, 4), (2, 5, 3), (3, 3, 1)):
        _compare_window(fn, rows, window, depth)
    return "3 x 4 cut at 4, 2 x 5 at 3, 3 x 3 at 1 right"


@windows.case("20 random cut windows agree with the reference (max_depth beyond the window: nothing cut)", 1,
              "keep the nodes whose depth 1 + r + k fits; a max_depth larger than every depth keeps them all")
def _window_cut_random(fn):
    g = torch.Generator().manual_seed(906)
    for _ in range(20):
        rows, window = (int(torch.randint(1, m + 1, (1,), generator=g)) for m in (4, 6))
        _compare_window(fn, rows, window, int(torch.randint(1, rows + window + 2, (1,), generator=g)))
    return "20 random cut windows right"


_MODEL: dict = {}


def _small_model() -> GPT:
    """A small random GPT (seeded, built once): the functional tests of both masks."""
    if "m" not in _MODEL:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(909)
            m = GPT(GPTConfig(vocab_size=VOCAB, block_size=64, n_layer=2, n_head=2, n_embd=32)).eval()
        _MODEL["m"] = m
    return _MODEL["m"]


def _one_pass(cache_prefix, tokens, mask, positions) -> torch.Tensor:
    """The small GPT's logits at every node of one pass over ``tokens`` after ``cache_prefix`` (cached)."""
    model = _small_model()
    with torch.no_grad():
        cache = KVCache.for_model(model)
        model(torch.tensor([cache_prefix]), cache=cache)
        return model(torch.tensor([tokens]), cache=cache, position_ids=positions, attn_mask=mask)[0]


def _alone(cache_prefix, context) -> torch.Tensor:
    """The small GPT's logits after ``cache_prefix + context``, scored as an ordinary sequence."""
    with torch.no_grad():
        return _small_model()(torch.tensor([list(cache_prefix) + list(context)]))[0, -1]


def _random_round(g: torch.Generator, n_extra: int):
    prefix = torch.randint(VOCAB, (int(torch.randint(3, 11, (1,), generator=g)),), generator=g).tolist()
    return prefix[:-1], prefix[-1], torch.randint(VOCAB, (n_extra,), generator=g).tolist()


def _window_context(i: int, rows: int, window: int, guesses) -> list[int]:
    """The guesses node i reads, in depth order: row 0 up to its column, then its column below row 0."""
    r, k = divmod(i, window)
    return [guesses[j] for j in range(k + 1)] + [guesses[s * window + k] for s in range(1, r + 1)]


@windows.case("functional: a small GPT given your mask scores every guess like its context alone", 2,
              "each guess's logits must equal running the prefix, the root and the guesses of its context "
              "(row 0 up to its column, then its column) on their own")
def _window_functional(fn):
    g = torch.Generator().manual_seed(902)
    worst = 0.0
    for rows, window in ((1, 4), (3, 3), (2, 5)):
        cache_prefix, root, guesses = _random_round(g, rows * window)
        wmask = _call_window(fn, rows, window)
        n = rows * window
        mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        mask[:, 0], mask[1:, 1:] = True, wmask  # the root sees itself; every guess sees the root
        positions = len(cache_prefix) + torch.tensor([0] + window_depths(rows, window))
        logits = _one_pass(cache_prefix, [root] + guesses, mask, positions)
        for i in range(n):
            diff = float((logits[1 + i] - _alone(cache_prefix, [root] + _window_context(i, rows, window, guesses)))
                         .abs().max())
            worst = max(worst, diff)
            if diff > 1e-4:
                raise Mismatch(f"guess {_node(i, window)}'s logits (a {rows} x {window} window) = those of its "
                               f"context alone", f"max |diff| {diff:.3g}", _window_hint(wmask, rows, window))
    return f"1 x 4, 3 x 3 and 2 x 5 windows: every guess matches its context alone (max |diff| {worst:.1e})"


# ---- proposal_mask(parents, extra_mask) -> (N + E, N + E) bool ---------------------------------------------------

rounds = Exercise("proposal_mask", NOTEBOOK, "candidates scored as their paths alone, guesses as their contexts "
                  "(the root, then what extra_mask allows)")


def _reference_round(parents, extra_mask: torch.Tensor) -> torch.Tensor:
    e = extra_mask.shape[0]
    return Proposal([0] * len(parents), list(parents), extra_tokens=[0] * e, extra_depths=[1] * e,
                    extra_mask=extra_mask).attention_mask()


def _call_round(fn, parents, extra_mask: torch.Tensor, strict_types: bool = False) -> torch.Tensor:
    n, e = len(parents), extra_mask.shape[0]
    return _as_bool_mask(fn(list(parents), extra_mask.clone()), (n + e, n + e),
                         f"the mask of {n} tree nodes and {e} window nodes", strict_types)


def _round_hint(mask: torch.Tensor, parents, extra_mask: torch.Tensor) -> str | None:
    """The hint of the known mistakes in combining the two masks that give ``mask``."""
    ref, n, e = _reference_round(parents, extra_mask), len(parents), extra_mask.shape[0]

    def variant(edit):
        m = ref.clone()
        edit(m)
        return m

    def causal_tree(m):
        m[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()

    def sees_candidates(m):
        m[n:, :n] = True

    def seen_by_candidates(m):
        m[:n, n:] = True

    def no_root(m):
        m[n:, 0] = False

    def transposed(m):
        m[n:, n:] = extra_mask.T

    def no_window(m):
        m[n:, n:] = torch.eye(e, dtype=torch.bool)

    def window_empty(m):
        m[n:, n:] = False

    known = [(causal_tree, "the candidates' block is the tree mask (each node sees its ancestors and itself), not "
                           "the causal triangle: siblings are alternative futures"),
             (sees_candidates, "the window sees the root only: its guesses continue the text before this round's "
                               "candidates, which are alternatives it must not read"),
             (seen_by_candidates, "candidates never see the window: a candidate must be scored as its path alone, "
                                  "or the verification is no longer the target's own verdict"),
             (no_root, "every window node sees the root (column 0): the root is the token at depth 0 of every "
                       "guess's context"),
             (transposed, "copy extra_mask as it is given: row i lists what window node i sees"),
             (no_window, "the window's nodes see each other as extra_mask says: copy it into the bottom-right "
                         "block"),
             (window_empty, "the window's nodes see each other as extra_mask says: copy it into the bottom-right "
                            "block")]
    variants = [(variant(edit), h) for edit, h in known]
    return pick_hint([h for m, h in variants if torch.equal(mask, m) and not torch.equal(m, ref)])


def _label(i: int, n: int) -> str:
    return f"node {i}" if i < n else f"window node {i - n}"


def _compare_round(fn, parents, extra_mask: torch.Tensor) -> None:
    mask, ref, n = _call_round(fn, parents, extra_mask), _reference_round(parents, extra_mask), len(parents)
    if not torch.equal(mask, ref):
        bad = int((mask != ref).any(1).nonzero()[0])
        names = lambda row: [_label(j, n) for j in row.nonzero().flatten().tolist()]  # noqa: E731
        raise Mismatch(f"row {bad} ({_label(bad, n)}; parents {list(parents)}, {extra_mask.shape[0]} window nodes) "
                       f"to allow {names(ref[bad])}", f"{names(mask[bad])}", _round_hint(mask, parents, extra_mask))


@rounds.case("returns a bool (N + E, N + E) tensor", 1,
             "N tree nodes first, then the E window nodes: torch.zeros(N + E, N + E, dtype=torch.bool)")
def _round_types(fn):
    _call_round(fn, [-1, 0, 0, 1], window_mask(2, 3), strict_types=True)
    _call_round(fn, [-1, 0, 1], window_mask(1, 2), strict_types=True)
    return "bool masks of shape (10, 10) and (5, 5)"


@rounds.case("no window (E = 0): the tree mask alone", 1,
             "with an empty (0, 0) extra_mask the round is an ordinary tree: return its tree attention mask")
def _round_no_window(fn):
    for parents in ([-1], [-1, 0, 0, 1, 2]):
        _compare_round(fn, parents, torch.zeros(0, 0, dtype=torch.bool))
    return "a root alone and a 5-node tree right"


@rounds.case("a root alone beside a window (no pool candidates yet)", 1,
             "the root sees itself; every window node sees the root, then what extra_mask allows")
def _round_root_only(fn):
    _compare_round(fn, [-1], window_mask(2, 3))
    return "root + 2 x 3 window right"


@rounds.case("a chain of candidates beside a window", 2,
             "a candidate's logits are the target's verdict on its path: what may it read? and a guess?")
def _round_chain(fn):
    _compare_round(fn, [-1, 0, 1, 2], window_mask(3, 2))
    return "chain of 4 + 3 x 2 window right"


@rounds.case("a bushy tree beside a window", 2,
             "siblings are alternative futures: a candidate reads its path only, a guess the text up to the root "
             "and its own context")
def _round_bushy(fn):
    _compare_round(fn, [-1, 0, 0, 0, 1, 1, 2, 3], window_mask(2, 4))
    return "8-node tree + 2 x 4 window right"


@rounds.case("20 random trees beside random windows (and any extra_mask given)", 1,
             "copy extra_mask into the bottom-right block as it is, whatever it holds")
def _round_random(fn):
    g = torch.Generator().manual_seed(903)
    for t in range(20):
        parents = random_parents(g, int(torch.randint(1, 12, (1,), generator=g)))
        if t % 2:
            e = int(torch.randint(1, 9, (1,), generator=g))
            extra = torch.rand(e, e, generator=g) < 0.4
        else:
            extra = window_mask(*(int(torch.randint(1, m + 1, (1,), generator=g)) for m in (4, 5)))
        _compare_round(fn, parents, extra)
    return "20 random rounds right"


@rounds.case("functional: one pass over tree and window; candidates score like their paths, guesses like their "
             "contexts", 2,
             "a candidate's logits must equal its root-to-node path alone, a guess's its context alone: "
             "nothing may cross between the tree and the window, and every guess needs the root")
def _round_functional(fn):
    g = torch.Generator().manual_seed(904)
    worst = 0.0
    for parents, (rows, window) in (([-1, 0, 0, 1, 2], (2, 3)), ([-1, 0, 1, 1, 0, 4], (3, 2)), ([-1], (1, 4))):
        n, e = len(parents), rows * window
        cache_prefix, root, rest = _random_round(g, n - 1 + e)
        tokens, guesses, extra = [root] + rest[:n - 1], rest[n - 1:], window_mask(rows, window)
        mask = _call_round(fn, parents, extra)
        proposal = Proposal(tokens, parents, extra_tokens=guesses, extra_depths=window_depths(rows, window),
                            extra_mask=extra)
        logits = _one_pass(cache_prefix, tokens + guesses, mask, proposal.position_ids(len(cache_prefix)))
        for i in range(n + e):
            if i < n:
                path, node = [], i
                while node >= 0:
                    path.append(tokens[node])
                    node = parents[node]
                context = path[::-1]
            else:
                context = [root] + _window_context(i - n, rows, window, guesses)
            diff = float((logits[i] - _alone(cache_prefix, context)).abs().max())
            worst = max(worst, diff)
            if diff > 1e-4:
                what = "path" if i < n else "context"
                raise Mismatch(f"{_label(i, n)}'s logits = those of its {what} alone (parents {parents}, a "
                               f"{rows} x {window} window)", f"max |diff| {diff:.3g}",
                               _round_hint(mask, parents, extra))
    return f"3 rounds: every candidate and guess matches its context alone (max |diff| {worst:.1e})"


@rounds.case("leaves the caller's parents and extra_mask unchanged", 1,
             "read parents and extra_mask; build the round's mask as a new tensor", side=True)
def _round_unchanged(fn):
    call_unchanged(fn, ([-1, 0, 0, 1], window_mask(2, 3)), ("parents", "extra_mask"))
    return "parents and extra_mask unchanged"
