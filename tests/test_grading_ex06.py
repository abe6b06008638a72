"""The grader of exercise 06 (Medusa heads, candidate tree) is itself tested: the solution notebook's functions
and the library's references earn full marks; realistic wrong versions, each named for its bug, lose points;
the stubs of the generated exercise score zero; a failed check never prints the reference code."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F

from minigpt.decoding.medusa import medusa_candidates
from minigpt.grading import EXERCISES, check
from minigpt.medusa_heads import MedusaHead

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "ex06_medusa.ipynb"


def graded_functions(notebook: Path) -> dict:
    """Execute only the graded cells (solution markers, or stubs) of a notebook; return its namespace."""
    nb = nbformat.read(str(notebook), as_version=4)
    namespace: dict = {}
    for cell in nb.cells:
        if cell.cell_type == "code" and ("### BEGIN SOLUTION" in cell.source or "NotImplementedError" in cell.source):
            exec(compile(cell.source, notebook.name, "exec"), namespace)
    return namespace


# ---- wrong versions of medusa_head_forward(h, W, b, W_out) ----------------------------------------------------

def forgot_residual(h, W, b, W_out):
    return F.silu(h @ W.T + b) @ W_out.T


def relu_not_silu(h, W, b, W_out):
    return (h + torch.relu(h @ W.T + b)) @ W_out.T


def residual_after_projection(h, W, b, W_out):
    # h added to the inner projection, inside the activation: SiLU(W h + b + h) instead of h + SiLU(W h + b)
    return F.silu(h @ W.T + b + h) @ W_out.T


def silu_on_output(h, W, b, W_out):
    return F.silu((h + h @ W.T + b) @ W_out.T)


def forgot_transpose(h, W, b, W_out):
    return (h + F.silu(h @ W + b)) @ W_out.T


def forgot_bias(h, W, b, W_out):
    return (h + F.silu(h @ W.T)) @ W_out.T


# ---- wrong versions of build_candidate_tree(head_logits, paths, root) -----------------------------------------

def _tree(head_logits, paths, root, *, head_of=lambda d: d - 1, largest=True, sort=True, by_depth=False):
    order = sorted(set(map(tuple, paths)), key=lambda p: (len(p), p)) if sort else [tuple(p) for p in paths]
    top = torch.topk(head_logits, max(p[-1] for p in order) + 1, dim=-1, largest=largest).indices
    index = {p: i + 1 for i, p in enumerate(order)}
    index[()] = 0
    tokens, parents = [int(root)], [-1]
    first_at_depth = {0: 0}
    for i, p in enumerate(order, start=1):
        first_at_depth.setdefault(len(p), i)
        parents.append(first_at_depth[len(p) - 1] if by_depth else index[p[:-1]])
        tokens.append(int(top[head_of(len(p)), p[-1]]))
    return tokens, parents


def depth_uses_wrong_head(head_logits, paths, root):
    return _tree(head_logits, paths, root, head_of=lambda d: min(d, head_logits.shape[0] - 1))


def ranks_ascending_logits(head_logits, paths, root):
    return _tree(head_logits, paths, root, largest=False)


def parents_by_depth_only(head_logits, paths, root):
    return _tree(head_logits, paths, root, by_depth=True)


def unsorted_node_order(head_logits, paths, root):
    # numbers the nodes in the order given: parents may come after their children
    return _tree(head_logits, paths, root, sort=False)


def forgot_root(head_logits, paths, root):
    tokens, parents = _tree(head_logits, paths, root)
    return tokens[1:], [p - 1 for p in parents[1:]]


WRONG = {
    "medusa_head_forward": [forgot_residual, relu_not_silu, residual_after_projection, silu_on_output,
                            forgot_transpose, forgot_bias],
    "build_candidate_tree": [depth_uses_wrong_head, ranks_ascending_logits, parents_by_depth_only,
                             unsorted_node_order, forgot_root],
}


def test_exercises_are_registered_for_the_notebook():
    for name in WRONG:
        assert EXERCISES[name].notebook == NOTEBOOK and EXERCISES[name].max_points >= 2


def test_library_references_earn_full_marks():
    def library_head(h, W, b, W_out):
        m = MedusaHead(W.shape[0], W_out.shape[0])
        with torch.no_grad():
            m.fc.weight.copy_(W)
            m.fc.bias.copy_(b)
            m.out.weight.copy_(W_out)
            return m(h)

    assert check("medusa_head_forward", library_head, verbose=False).full_marks
    assert check("build_candidate_tree", lambda logits, paths, root: medusa_candidates(logits, root, paths),
                 verbose=False).full_marks


def test_zero_init_case_catches_every_misplaced_residual_or_activation():
    # the property the lesson relies on (an untrained head = the target's output layer) has its own case
    for wrong in (forgot_residual, residual_after_projection, silu_on_output):
        cases = {c.name: c for c in check("medusa_head_forward", wrong, verbose=False).cases}
        zero = next(c for n, c in cases.items() if n.startswith("zero-initialised"))
        assert not zero.passed, wrong.__name__


def test_node_order_mistakes_are_explained():
    result = check("build_candidate_tree", unsorted_node_order, verbose=False)
    failed = [c for c in result.cases if not c.passed]
    assert failed and all("sort" in c.hint for c in failed if c.name.startswith("paths in any order"))
    assert any("parent must come before its child" in c.detail for c in failed)


def test_exercise_stubs_score_zero_not_implemented():
    names = graded_functions(ROOT / "exercises" / NOTEBOOK)
    for name in WRONG:
        result = check(name, names[name], verbose=False)
        assert result.points == 0 and result.status == "not implemented yet", (name, result.status)


def sorts_callers_paths(head_logits, paths, root):
    # right tree, but paths.sort() reorders the caller's list
    paths.sort(key=lambda p: (len(p), p))
    return medusa_candidates(head_logits, root, paths)


WRONG["build_candidate_tree"].append(sorts_callers_paths)
