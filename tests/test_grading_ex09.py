"""The grader of exercise 09 (lookahead decoding's window as a tree, its masks) is itself tested.

The library's references and the solution notebook's functions earn full marks; realistic wrong versions (kept
below, each named for its bug) lose points, each with the hint that names its bug; the functional cases (a small
GPT scoring the window, or a whole round, with the learner's mask) catch every one of them on their own.
"""
from __future__ import annotations

import pytest
import torch

from minigpt.decoding.candidates import Proposal, tree_attention_mask
from minigpt.decoding.lookahead import window_depths, window_mask
from minigpt.grading import EXERCISES, check

from test_grading_ex04_ex05 import solution  # noqa: E402  (one copy of the notebook helpers)

NAMES = ("window_parents", "lookahead_mask", "proposal_mask")


# ---- ex09 (a): window_parents(rows, window) -------------------------------------------------------------------

def reference_parents(rows, window):
    return [(k - 1 if k else -1) if r == 0 else (r - 1) * window + k for r in range(rows) for k in range(window)]


def parents_flattened_chain(rows, window):
    # every node after the one before it in the flattened window
    return [i - 1 for i in range(rows * window)]


def parents_row0_on_the_root(rows, window):
    # forgets that row 0 is a trajectory too
    return [(r - 1) * window + k if r else -1 for r in range(rows) for k in range(window)]


def parents_on_the_diagonal(rows, window):
    # the n-gram diagonal of the Jacobi table, not the node one depth earlier in the context
    return [(r - 1) * window + k - 1 if r and k else (k - 1 if not r else -1) for r in range(rows) for k in range(window)]


def parents_column_major(rows, window):
    return [(k - 1 if k else -1) * rows if r == 0 else (r - 1) + k * rows for r in range(rows) for k in range(window)]


# ---- ex09 (b): lookahead_mask(rows, window, max_depth=None) -------------------------------------------------------

def cut(full):
    """A window mask function of (rows, window) made into one of (rows, window, max_depth): the right cut of its
    (right or wrong) full mask, so that only the full-window bug shows."""
    def masked(rows, window, max_depth=None):
        keep = [i for i, d in enumerate(window_depths(rows, window)) if max_depth is None or d <= max_depth]
        return full(rows, window)[keep][:, keep]
    masked.__name__ = full.__name__
    return masked

def _window(rows, window, see):
    """The mask in which node (r, k) (index r * window + k) sees the nodes ``see(r, k)`` lists, as (s, j) pairs."""
    n = rows * window
    mask = torch.zeros(n, n, dtype=torch.bool)
    for r in range(rows):
        for k in range(window):
            for s, j in see(r, k):
                if 0 <= s < rows and 0 <= j < window:
                    mask[r * window + k, s * window + j] = True
    return mask


def reference_window(rows, window):
    return _window(rows, window, lambda r, k: [(0, j) for j in range(k + 1)] + [(s, k) for s in range(1, r + 1)])


def plain_causal_over_flattened(rows, window):
    # every earlier index of the flattened window: whole earlier rows, as a chain's mask would allow
    return torch.ones(rows * window, rows * window, dtype=torch.bool).tril()


def forgot_row0_earlier_columns(rows, window):
    # only the guess's own column: the tokens at depths 1 .. k are missing
    return _window(rows, window, lambda r, k: [(s, k) for s in range(r + 1)])


def row0_column_off_by_one(rows, window):
    # mask[i, :k] instead of mask[i, :k + 1]: row 0 stops one column short
    return _window(rows, window, lambda r, k: [(0, j) for j in range(k)] + [(s, k) for s in range(1, r + 1)])


def rows_and_columns_swapped(rows, window):
    # the right pattern, numbered column by column: node (r, k) at index k * rows + r
    n = rows * window
    mask = torch.zeros(n, n, dtype=torch.bool)
    for r in range(rows):
        for k in range(window):
            for j in range(k + 1):
                mask[k * rows + r, j * rows] = True
            for s in range(1, r + 1):
                mask[k * rows + r, k * rows + s] = True
    return mask


def rows_and_window_arguments_swapped(rows, window):
    # the reference's loops over `window` rows of `rows` guesses each
    return reference_window(window, rows)


def no_self_attention(rows, window):
    return reference_window(rows, window) & ~torch.eye(rows * window, dtype=torch.bool)


def window_mask_transposed(rows, window):
    return reference_window(rows, window).T.contiguous()


def float_window_mask(rows, window):
    # right values as 0/1 floats: only the type case may fail
    return reference_window(rows, window).float()


def cut_by_index(rows, window, max_depth=None):
    # keeps the first nodes by index, as many as fit, instead of the nodes that fit
    n = sum(1 for d in window_depths(rows, window) if max_depth is None or d <= max_depth)
    return window_mask(rows, window)[:n, :n]


def cut_off_by_one(rows, window, max_depth=None):
    # depth < max_depth: drops the nodes at depth exactly max_depth
    return cut(window_mask)(rows, window, None if max_depth is None else max_depth - 1)


def ignores_max_depth(rows, window, max_depth=None):
    return window_mask(rows, window)


# ---- ex09 (c): proposal_mask(parents, extra_mask) ----------------------------------------------------------------

def _round(parents, extra_mask, *, tree=None, window_sees_tree=False, tree_sees_window=False, root=True,
           block=None):
    n, e = len(parents), extra_mask.shape[0]
    mask = torch.zeros(n + e, n + e, dtype=torch.bool)
    mask[:n, :n] = tree_attention_mask(parents) if tree is None else tree
    if root:
        mask[n:, 0] = True
    mask[n:, n:] = extra_mask if block is None else block
    if window_sees_tree:
        mask[n:, :n] = True
    if tree_sees_window:
        mask[:n, n:] = True
    return mask


def reference_round(parents, extra_mask):
    return _round(parents, extra_mask)


def window_sees_candidates(parents, extra_mask):
    return _round(parents, extra_mask, window_sees_tree=True)


def candidates_see_window(parents, extra_mask):
    return _round(parents, extra_mask, tree_sees_window=True)


def window_misses_root(parents, extra_mask):
    return _round(parents, extra_mask, root=False)


def tree_block_causal(parents, extra_mask):
    n = len(parents)
    return _round(parents, extra_mask, tree=torch.ones(n, n, dtype=torch.bool).tril())


def extra_mask_transposed(parents, extra_mask):
    return _round(parents, extra_mask, block=extra_mask.T)


def window_block_forgotten(parents, extra_mask):
    # each window node sees the root and itself, not its context in the window
    return _round(parents, extra_mask, block=torch.eye(extra_mask.shape[0], dtype=torch.bool))


FULL_WINDOW_BUGS = [cut(f) for f in (plain_causal_over_flattened, forgot_row0_earlier_columns,
                                     row0_column_off_by_one, rows_and_columns_swapped,
                                     rows_and_window_arguments_swapped, no_self_attention, window_mask_transposed)]
CUT_BUGS = [cut_by_index, cut_off_by_one, ignores_max_depth]
WRONG = {
    "window_parents": [parents_flattened_chain, parents_row0_on_the_root, parents_on_the_diagonal,
                       parents_column_major],
    "lookahead_mask": FULL_WINDOW_BUGS + CUT_BUGS,
    "proposal_mask": [window_sees_candidates, candidates_see_window, window_misses_root, tree_block_causal,
                      extra_mask_transposed, window_block_forgotten],
}

# the words of the hint each wrong version must get (in every case it fails with a hint)
HINTS = {
    "parents_flattened_chain": "whole earlier rows",
    "parents_row0_on_the_root": "row 0 is itself a trajectory",
    "parents_on_the_diagonal": "one position (one depth) earlier",
    "parents_column_major": "row-major",
    "plain_causal_over_flattened": "whole earlier rows",
    "forgot_row0_earlier_columns": "some ancestors are missing",
    "row0_column_off_by_one": "one ancestor is missing in row 0",
    "rows_and_columns_swapped": "numbered column by column",
    "rows_and_window_arguments_swapped": "rows and columns are swapped",
    "no_self_attention": "diagonal is missing",
    "window_mask_transposed": "transposed",
    "cut_by_index": "first nodes by index",
    "cut_off_by_one": "depth exactly max_depth still fits",
    "ignores_max_depth": "max_depth is ignored",
    "window_sees_candidates": "the window sees the root only",
    "candidates_see_window": "candidates never see the window",
    "window_misses_root": "every window node sees the root",
    "tree_block_causal": "not the causal triangle",
    "extra_mask_transposed": "copy extra_mask as it is given",
    "window_block_forgotten": "copy it into the bottom-right block",
}


def test_exercises_are_registered_with_their_notebook():
    for name in NAMES:
        assert EXERCISES[name].notebook == "ex09_lookahead_mask.ipynb"
        assert EXERCISES[name].max_points >= 5 and len(WRONG[name]) >= 3


def test_the_wrong_versions_really_are_wrong_and_the_local_references_right():
    for rows, window in ((1, 4), (3, 4), (2, 5), (4, 1)):
        assert torch.equal(reference_window(rows, window), window_mask(rows, window))
    for wrong in FULL_WINDOW_BUGS:
        assert any(not torch.equal(wrong(r, w), window_mask(r, w)) for r, w in ((3, 4), (2, 5))), wrong.__name__
    for wrong in CUT_BUGS:
        assert any(not torch.equal(wrong(3, 4, d), cut(window_mask)(3, 4, d)) for d in (2, 3, 4)), wrong.__name__
    for wrong in WRONG["window_parents"]:
        assert wrong(3, 4) != reference_parents(3, 4), wrong.__name__
    parents, extra = [-1, 0, 0, 1], window_mask(2, 3)
    e = extra.shape[0]
    ref = Proposal([0] * 4, parents, extra_tokens=[0] * e, extra_depths=[1] * e, extra_mask=extra).attention_mask()
    assert torch.equal(reference_round(parents, extra), ref)
    for wrong in WRONG["proposal_mask"]:
        assert not torch.equal(wrong(parents, extra), ref), wrong.__name__


def test_library_references_earn_full_marks():
    assert check("window_parents", reference_parents, verbose=False).full_marks
    assert check("lookahead_mask", cut(window_mask), verbose=False).full_marks
    assert check("lookahead_mask", cut(reference_window), verbose=False).full_marks
    result = check("lookahead_mask", window_mask, verbose=False)  # the library's full mask: only the cut cases fail
    assert {c.name.split(":")[0] for c in result.cases if not c.passed} == {
        "the window cut at the end of the context", "20 random cut windows agree with the reference (max_depth "
        "beyond the window"}
    assert check("proposal_mask", reference_round, verbose=False).full_marks


@pytest.mark.parametrize("name, wrong", [(n, w) for n, ws in WRONG.items() for w in ws],
                         ids=[f"{n}-{w.__name__}" for n, ws in WRONG.items() for w in ws])
def test_wrong_version_loses_points_with_its_hint(name, wrong):
    result = check(name, wrong, verbose=False)
    failed = [c for c in result.cases if not c.passed]
    assert result.points < result.max_points and failed, f"{wrong.__name__} passed every case of {name}"
    assert all(c.status == "fail" for c in failed), [c.line() for c in failed]
    assert any(HINTS[wrong.__name__] in c.hint for c in failed), [c.line() for c in failed]


FUNCTIONAL = {"lookahead_mask": FULL_WINDOW_BUGS, "proposal_mask": WRONG["proposal_mask"]}


@pytest.mark.parametrize("name, wrong", [(n, w) for n, ws in FUNCTIONAL.items() for w in ws],
                         ids=[f"{n}-{w.__name__}" for n, ws in FUNCTIONAL.items() for w in ws])
def test_functional_case_alone_catches_mask_bugs(name, wrong):
    result = check(name, wrong, verbose=False)
    functional = next(c for c in result.cases if c.name.startswith("functional"))
    assert functional.status == "fail", functional.line()


def test_a_float_mask_loses_only_the_type_case():
    result = check("lookahead_mask", cut(float_window_mask), verbose=False)
    assert [c.status for c in result.cases if not c.passed] == ["fail"] and not result.cases[0].passed


def test_an_additive_mask_is_named_as_such():
    additive = cut(lambda rows, window: torch.zeros(rows * window, rows * window).masked_fill(
        ~window_mask(rows, window), float("-inf")))
    result = check("lookahead_mask", additive, verbose=False)
    assert result.points == 0 and all("additive" in c.detail for c in result.cases)


def test_garbage_and_exceptions_are_one_line_fails():
    result = check("lookahead_mask", lambda rows, window, max_depth=None: [[True]], verbose=False)
    assert result.points == 0 and "torch.Tensor" in result.cases[0].detail
    result = check("proposal_mask", lambda parents, extra_mask: 1 / 0, verbose=False)
    assert result.points == 0 and all("ZeroDivisionError" in c.detail for c in result.cases)


def test_stubs_score_zero():
    for name in NAMES:
        result = check(name, solution(name, "exercises"), verbose=False)
        assert result.points == 0 and result.status == "not implemented yet", (name, result.status)


