"""The graders of exercises 04 (tree attention) and 05 (prompt lookup) are themselves tested.

The solution notebooks' functions and the library's references earn full marks; realistic wrong versions
(kept below, each named for its bug) lose points; the functional case of the tree mask (a small GPT scoring a
tree with the learner's mask and positions) catches mask and position bugs on its own.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
import torch

from minigpt.decoding.lookup import find_candidates
from minigpt.decoding.candidates import children_of, tree_attention_mask, tree_depths, tree_position_ids
from minigpt.decoding.verify import accept_tree_greedy
from minigpt.grading import EXERCISES, check

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("tree_mask_and_positions", "longest_accepted_path", "find_candidates")


def graded_functions(notebook: Path) -> dict:
    """Execute only the graded cells (those with solution markers, or stubs) of a notebook; return its names."""
    nb = nbformat.read(str(notebook), as_version=4)
    namespace = {"torch": torch}
    for cell in nb.cells:
        if cell.cell_type == "code" and ("### BEGIN SOLUTION" in cell.source or "NotImplementedError" in cell.source):
            exec(compile(cell.source, notebook.name, "exec"), namespace)
    return namespace


def solution(name: str, folder: str = "solutions"):
    return graded_functions(ROOT / folder / EXERCISES[name].notebook)[name]


# ---- ex04 (a): tree_mask_and_positions ----------------------------------------------------------------------

def _ancestors_mask(parents, with_self=True):
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i if with_self else parents[i]
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def _depth(parents):
    return torch.tensor(tree_depths(parents))


def siblings_see_each_other(parents, offset):
    # the causal mask of a chain: every earlier index, whether or not it is an ancestor
    n = len(parents)
    return torch.ones(n, n, dtype=torch.bool).tril(), offset + _depth(parents)


def positions_off_by_one(parents, offset):
    return _ancestors_mask(parents), offset + _depth(parents) + 1


def forgot_self_attention(parents, offset):
    return _ancestors_mask(parents, with_self=False), offset + _depth(parents)


def positions_by_index(parents, offset):
    return _ancestors_mask(parents), offset + torch.arange(len(parents))


def mask_transposed(parents, offset):
    # node i attends to its descendants instead of its ancestors
    return _ancestors_mask(parents).T.contiguous(), offset + _depth(parents)


def positions_without_offset(parents, offset):
    return _ancestors_mask(parents), _depth(parents)


# ---- ex04 (b): longest_accepted_path --------------------------------------------------------------------------

def stops_at_first_child_only(tokens, parents, target_argmax):
    kids, path, node = children_of(parents), [], 0
    while kids[node] and tokens[kids[node][0]] == target_argmax[node]:
        node = kids[node][0]
        path.append(node)
    return path, int(target_argmax[node])


def forgot_bonus_token(tokens, parents, target_argmax):
    # the next token is only produced at a mismatch; a walk that reaches a leaf ends without one
    kids, path, node = children_of(parents), [], 0
    while kids[node]:
        nxt = next((c for c in kids[node] if tokens[c] == target_argmax[node]), None)
        if nxt is None:
            return path, int(target_argmax[node])
        path.append(nxt)
        node = nxt
    return path, None


def accepts_root(tokens, parents, target_argmax):
    path, nxt = accept_tree_greedy(tokens, parents, target_argmax)
    return [0] + path, nxt


def picks_longest_leaf_not_target_path(tokens, parents, target_argmax):
    # verify only the deepest root-to-leaf branch, as if the tree were one chain
    depth = tree_depths(parents)
    leaf = max(range(len(parents)), key=lambda i: depth[i])
    branch, node = [], leaf
    while node > 0:
        branch.append(node)
        node = parents[node]
    path, node = [], 0
    for c in reversed(branch):
        if tokens[c] != target_argmax[node]:
            break
        path.append(c)
        node = c
    return path, int(target_argmax[node])


def next_token_at_parent(tokens, parents, target_argmax):
    path, _ = accept_tree_greedy(tokens, parents, target_argmax)
    at = parents[path[-1]] if path else 0
    return path, int(target_argmax[at])


# ---- ex05: find_candidates ---------------------------------------------------------------------------------------

def _finder(seq, max_ngram, num_pred, min_ngram=1, *, sizes=None, recent=True, self_match=False, shift=0,
            limit=True):
    sizes = sizes if sizes is not None else range(max_ngram, min_ngram - 1, -1)
    for n in sizes:
        if n < 1 or len(seq) < n or (len(seq) == n and not self_match):
            continue
        last = len(seq) - n if self_match else len(seq) - n - 1
        starts = range(last, -1, -1) if recent else range(0, last + 1)
        for s in starts:
            if seq[s:s + n] == seq[-n:]:
                begin = s + n - shift
                return list(seq[begin:begin + num_pred]) if limit else list(seq[begin:])
    return []


def matches_suffix_itself(seq, max_ngram, num_pred, min_ngram=1):
    # the search includes the suffix's own position: it finds itself first and proposes nothing
    return _finder(seq, max_ngram, num_pred, min_ngram, self_match=True)


def shortest_ngram_first(seq, max_ngram, num_pred, min_ngram=1):
    return _finder(seq, max_ngram, num_pred, min_ngram, sizes=range(min_ngram, max_ngram + 1))


def oldest_match_not_most_recent(seq, max_ngram, num_pred, min_ngram=1):
    return _finder(seq, max_ngram, num_pred, min_ngram, recent=False)


def off_by_one_continuation(seq, max_ngram, num_pred, min_ngram=1):
    # starts the proposal at the matched n-gram's last token, which the sequence already ends with
    return _finder(seq, max_ngram, num_pred, min_ngram, shift=1)


def ignores_num_pred(seq, max_ngram, num_pred, min_ngram=1):
    return _finder(seq, max_ngram, num_pred, min_ngram, limit=False)


def ignores_min_ngram(seq, max_ngram, num_pred, min_ngram=1):
    return _finder(seq, max_ngram, num_pred, 1)


def find_candidates_reverses_seq(seq, max_ngram, num_pred, min_ngram=1):
    # right answers, but "most recent first" by reversing the caller's list in place (and never undoing it)
    seq.reverse()
    return _finder(seq[::-1], max_ngram, num_pred, min_ngram)


def misses_occurrence_at_index_0(seq, max_ngram, num_pred, min_ngram=1):
    for n in range(max_ngram, min_ngram - 1, -1):
        if n < 1 or len(seq) <= n:
            continue
        for s in range(len(seq) - n - 1, 0, -1):  # stops before s = 0
            if seq[s:s + n] == seq[-n:]:
                return list(seq[s + n:s + n + num_pred])
    return []


WRONG = {
    "tree_mask_and_positions": [siblings_see_each_other, positions_off_by_one, forgot_self_attention,
                                positions_by_index, mask_transposed, positions_without_offset],
    "longest_accepted_path": [stops_at_first_child_only, forgot_bonus_token, accepts_root,
                              picks_longest_leaf_not_target_path, next_token_at_parent],
    "find_candidates": [matches_suffix_itself, shortest_ngram_first, oldest_match_not_most_recent,
                        off_by_one_continuation, ignores_num_pred, ignores_min_ngram, find_candidates_reverses_seq,
                        misses_occurrence_at_index_0],
}


def test_exercises_are_registered_with_their_notebooks():
    assert EXERCISES["tree_mask_and_positions"].notebook == "ex04_tree_attention.ipynb"
    assert EXERCISES["longest_accepted_path"].notebook == "ex04_tree_attention.ipynb"
    assert EXERCISES["find_candidates"].notebook == "ex05_prompt_lookup.ipynb"
    for name in NAMES:
        assert EXERCISES[name].max_points >= 5 and len(WRONG[name]) >= 3


def test_library_references_earn_full_marks():
    ref_mask = lambda parents, offset: (tree_attention_mask(parents), tree_position_ids(parents, offset))  # noqa: E731
    assert check("tree_mask_and_positions", ref_mask, verbose=False).full_marks
    assert check("longest_accepted_path", accept_tree_greedy, verbose=False).full_marks
    assert check("find_candidates", find_candidates, verbose=False).full_marks


@pytest.mark.parametrize("wrong", [siblings_see_each_other, positions_off_by_one, forgot_self_attention,
                                   positions_by_index, mask_transposed, positions_without_offset])
def test_functional_case_alone_catches_mask_and_position_bugs(wrong):
    result = check("tree_mask_and_positions", wrong, verbose=False)
    functional = next(c for c in result.cases if c.name.startswith("functional"))
    assert functional.status == "fail", functional.line()


def test_functional_case_accepts_a_float_mask_and_list_positions():
    # the comparison cases look at values, not types; only the first case insists on bool / LongTensor
    def loose(parents, offset):
        return tree_attention_mask(parents).float(), [offset + d for d in tree_depths(parents)]
    result = check("tree_mask_and_positions", loose, verbose=False)
    assert [c.status for c in result.cases if not c.passed] == ["fail"]
    assert not result.cases[0].passed


def test_stubs_score_zero():
    for name in NAMES:
        result = check(name, solution(name, "exercises"), verbose=False)
        assert result.points == 0 and result.status == "not implemented yet", (name, result.status)


def test_wrong_finder_versions_really_differ_from_the_reference_on_a_classic_input():
    # documents each bug on the input that shows it (the graders use these and random sequences)
    seq = [4, 1, 2, 9, 1, 2, 7, 1, 2]
    assert find_candidates(seq, 2, 2) == [7, 1]
    assert matches_suffix_itself(seq, 2, 2) == []
    assert oldest_match_not_most_recent(seq, 2, 2) == [9, 1]
    assert off_by_one_continuation(seq, 2, 2) == [2, 7]
    assert ignores_num_pred(seq, 2, 2) == [7, 1, 2]
