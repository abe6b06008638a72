"""The grader of exercise 10 (suffix decoding's longest matching suffix) is itself tested: the solution earns
full marks, the stub earns nothing, and realistic wrong versions (each named for its bug) lose points with a
hint that names the bug."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from minigpt.decoding.suffix import SuffixTree, as_dicts
from minigpt.grading import EXERCISES, check

ROOT = Path(__file__).resolve().parents[1]


def graded_function(folder: str):
    nb = nbformat.read(str(ROOT / folder / EXERCISES["longest_match"].notebook), as_version=4)
    namespace: dict = {}
    for cell in nb.cells:
        if cell.cell_type == "code" and ("### BEGIN SOLUTION" in cell.source or "NotImplementedError" in cell.source):
            exec(compile(cell.source, "ex10", "exec"), namespace)
    return namespace["longest_match"]


def _walk(trie, suffix):
    node = trie
    for t in suffix:
        node = node.get(t)
        if node is None:
            return None
    return node


def counts_the_context_itself(trie, context, max_depth):
    # any path counts, even one nothing followed: in the request's own tree, that is the context itself
    best = 0
    for n in range(1, min(max_depth - 1, len(context)) + 1):
        if _walk(trie, context[-n:]) is None:
            break
        best = n
    return best


def one_too_many(trie, context, max_depth):
    best = 0
    for n in range(1, min(max_depth - 1, len(context)) + 1):
        node = _walk(trie, context[-n:])
        if not node:
            break
        best = n + 1          # counts the root as a step
    return best


def one_too_few(trie, context, max_depth):
    best = 0
    for n in range(1, min(max_depth - 1, len(context)) + 1):
        node = _walk(trie, context[-n:])
        if not node:
            break
        best = n - 1          # the length of the path above the last node
    return best


def prefers_the_shortest(trie, context, max_depth):
    for n in range(1, min(max_depth - 1, len(context)) + 1):
        if _walk(trie, context[-n:]):
            return n           # stops at the first match
    return 0


def walks_from_the_start(trie, context, max_depth):
    # matches prefixes of the context instead of suffixes
    best = 0
    for n in range(1, min(max_depth - 1, len(context)) + 1):
        if _walk(trie, context[:n]):
            best = n
    return best


def pops_the_context(trie, context, max_depth):
    # right answers, but it eats the caller's list while looking
    answer = 0
    for n in range(1, min(max_depth - 1, len(context)) + 1):
        if _walk(trie, context[-n:]):
            answer = n
        else:
            break
    context.clear()
    return answer


WRONG = [counts_the_context_itself, one_too_many, one_too_few, prefers_the_shortest, walks_from_the_start,
         pops_the_context]


def test_registered_with_its_notebook():
    assert EXERCISES["longest_match"].notebook == "ex10_suffix_match.ipynb"
    assert EXERCISES["longest_match"].max_points >= 5


def test_the_solution_earns_full_marks_and_agrees_with_the_library():
    solution = graded_function("solutions")
    assert check("longest_match", solution, verbose=False).full_marks
    tree = SuffixTree(5)
    for text in ([1, 2, 3, 1, 2, 4], [2, 4, 4, 1]):
        tree.insert(text)
    for context in ([9, 1, 2], [4, 4], [2, 4, 4], [7]):
        assert solution(as_dicts(tree), context, 5) == tree.longest_match(context)[0]


def test_the_stub_scores_zero():
    result = check("longest_match", graded_function("exercises"), verbose=False)
    assert result.points == 0 and result.status == "not implemented yet", result.status


@pytest.mark.parametrize("wrong", WRONG, ids=lambda f: f.__name__)
def test_wrong_versions_lose_points(wrong):
    result = check("longest_match", wrong, verbose=False)
    assert not result.full_marks, wrong.__name__
    if wrong is pops_the_context:   # right answers: only the case that watches the inputs fails
        assert [c.name.startswith("leaves") for c in result.cases if not c.passed] == [True]


@pytest.mark.parametrize("wrong, words", [(counts_the_context_itself, "never followed"),
                                          (one_too_many, "one too many"), (one_too_few, "one too few"),
                                          (prefers_the_shortest, "shorter match")])
def test_the_hint_names_the_bug(wrong, words):
    result = check("longest_match", wrong, verbose=False)
    assert any(words in c.hint for c in result.cases if not c.passed), [c.hint for c in result.cases]
