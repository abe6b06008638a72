"""The grader of exercise 09 (lookahead decoding's masks) is itself tested.

The library's references and the solution notebook's functions earn full marks; realistic wrong versions (kept
below, each named for its bug) lose points, each with the hint that names its bug; the functional cases (a small
GPT scoring the window, or a whole round, with the learner's mask) catch every one of them on their own.
"""
from __future__ import annotations

import pytest
import torch

from minigpt.decoding.candidates import Proposal, tree_attention_mask
from minigpt.decoding.lookahead import window_mask
from minigpt.grading import EXERCISES, check

from test_grading_ex04_ex05 import solution  # noqa: E402  (one copy of the notebook helpers)

NAMES = ("lookahead_mask", "proposal_mask")


# ---- ex09 (a): lookahead_mask(rows, window) -----------------------------------------------------------------------

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


# ---- ex09 (b): proposal_mask(parents, extra_mask) ----------------------------------------------------------------

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


WRONG = {
    "lookahead_mask": [plain_causal_over_flattened, forgot_row0_earlier_columns, row0_column_off_by_one,
                       rows_and_columns_swapped, rows_and_window_arguments_swapped, no_self_attention,
                       window_mask_transposed],
    "proposal_mask": [window_sees_candidates, candidates_see_window, window_misses_root, tree_block_causal,
                      extra_mask_transposed, window_block_forgotten],
}

# the words of the hint each wrong version must get (in every case it fails with a hint)
HINTS = {
    plain_causal_over_flattened: "causal mask over the flattened window",
    forgot_row0_earlier_columns: "row 0's earlier columns are missing",
    row0_column_off_by_one: "one column short",
    rows_and_columns_swapped: "numbered column by column",
    rows_and_window_arguments_swapped: "rows and columns are swapped",
    no_self_attention: "diagonal is missing",
    window_mask_transposed: "transposed",
    window_sees_candidates: "the window sees the root only",
    candidates_see_window: "candidates never see the window",
    window_misses_root: "every window node sees the root",
    tree_block_causal: "not the causal triangle",
    extra_mask_transposed: "copy extra_mask as it is given",
    window_block_forgotten: "copy it into the bottom-right block",
}


def test_exercises_are_registered_with_their_notebook():
    for name in NAMES:
        assert EXERCISES[name].notebook == "ex09_lookahead_mask.ipynb"
        assert EXERCISES[name].max_points >= 5 and len(WRONG[name]) >= 3


def test_the_wrong_versions_really_are_wrong_and_the_local_references_right():
    for rows, window in ((1, 4), (3, 4), (2, 5), (4, 1)):
        assert torch.equal(reference_window(rows, window), window_mask(rows, window))
    for wrong in WRONG["lookahead_mask"]:
        assert any(not torch.equal(wrong(r, w), window_mask(r, w)) for r, w in ((3, 4), (2, 5))), wrong.__name__
    parents, extra = [-1, 0, 0, 1], window_mask(2, 3)
    e = extra.shape[0]
    ref = Proposal([0] * 4, parents, extra_tokens=[0] * e, extra_depths=[1] * e, extra_mask=extra).attention_mask()
    assert torch.equal(reference_round(parents, extra), ref)
    for wrong in WRONG["proposal_mask"]:
        assert not torch.equal(wrong(parents, extra), ref), wrong.__name__


def test_library_references_earn_full_marks():
    assert check("lookahead_mask", window_mask, verbose=False).full_marks
    assert check("lookahead_mask", reference_window, verbose=False).full_marks
    assert check("proposal_mask", reference_round, verbose=False).full_marks


@pytest.mark.parametrize("name, wrong", [(n, w) for n, ws in WRONG.items() for w in ws],
                         ids=[f"{n}-{w.__name__}" for n, ws in WRONG.items() for w in ws])
def test_wrong_version_loses_points_with_its_hint(name, wrong):
    result = check(name, wrong, verbose=False)
    failed = [c for c in result.cases if not c.passed]
    assert result.points < result.max_points and failed, f"{wrong.__name__} passed every case of {name}"
    assert all(c.status == "fail" for c in failed), [c.line() for c in failed]
    assert any(HINTS[wrong] in c.hint for c in failed), [c.line() for c in failed]


@pytest.mark.parametrize("name, wrong", [(n, w) for n, ws in WRONG.items() for w in ws],
                         ids=[f"{n}-{w.__name__}" for n, ws in WRONG.items() for w in ws])
def test_functional_case_alone_catches_mask_bugs(name, wrong):
    result = check(name, wrong, verbose=False)
    functional = next(c for c in result.cases if c.name.startswith("functional"))
    assert functional.status == "fail", functional.line()


def test_a_float_mask_loses_only_the_type_case():
    result = check("lookahead_mask", float_window_mask, verbose=False)
    assert [c.status for c in result.cases if not c.passed] == ["fail"] and not result.cases[0].passed


def test_an_additive_mask_is_named_as_such():
    additive = lambda rows, window: torch.zeros(rows * window, rows * window).masked_fill(  # noqa: E731
        ~window_mask(rows, window), float("-inf"))
    result = check("lookahead_mask", additive, verbose=False)
    assert result.points == 0 and all("additive" in c.detail for c in result.cases)


def test_garbage_and_exceptions_are_one_line_fails():
    result = check("lookahead_mask", lambda rows, window: [[True]], verbose=False)
    assert result.points == 0 and "torch.Tensor" in result.cases[0].detail
    result = check("proposal_mask", lambda parents, extra_mask: 1 / 0, verbose=False)
    assert result.points == 0 and all("ZeroDivisionError" in c.detail for c in result.cases)


def test_stubs_score_zero():
    for name in NAMES:
        result = check(name, solution(name, "exercises"), verbose=False)
        assert result.points == 0 and result.status == "not implemented yet", (name, result.status)


