"""exercises/ is generated from solutions/: the committed files must be what the generator writes today.

Also tests the generator itself: stubs keep the signature and docstring, regions must be balanced, outputs
are cleared, output is byte-for-byte reproducible, and ``--check`` names stale or orphaned files.
"""
from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from minigpt.grading.make_exercises import MarkerError, make_exercise, run, stub_source

ROOT = Path(__file__).resolve().parents[1]


def test_committed_exercises_are_up_to_date():
    proc = subprocess.run([sys.executable, "-m", "minigpt.grading.make_exercises", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_solution_has_an_exercise_with_the_same_cells():
    solutions = sorted((ROOT / "solutions").glob("*.ipynb"))
    assert solutions, "no solution notebooks"
    for sol in solutions:
        ex = ROOT / "exercises" / sol.name
        a, b = nbformat.read(str(sol), as_version=4), nbformat.read(str(ex), as_version=4)
        assert [c.cell_type for c in a.cells] == [c.cell_type for c in b.cells]
        for ca, cb in zip(a.cells, b.cells):
            if "### BEGIN SOLUTION" not in ca.source:
                assert ca.source == cb.source
            if cb.cell_type == "code":
                assert cb.outputs == [] and cb.execution_count is None


def _functions(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "<cell>", "exec"), namespace)
    return {k: v for k, v in namespace.items() if inspect.isfunction(v)}


def test_stubs_keep_signature_and_docstring_and_raise():
    for sol in sorted((ROOT / "solutions").glob("*.ipynb")):
        ex = nbformat.read(str(ROOT / "exercises" / sol.name), as_version=4)
        for cell_sol, cell_ex in zip(nbformat.read(str(sol), as_version=4).cells, ex.cells):
            if "### BEGIN SOLUTION" not in cell_sol.source:
                continue
            solved, stubbed = _functions(cell_sol.source), _functions(cell_ex.source)
            assert solved.keys() == stubbed.keys() and solved
            for name, fn in stubbed.items():
                assert inspect.signature(fn) == inspect.signature(solved[name])
                assert fn.__doc__ and fn.__doc__ == solved[name].__doc__
                args = [None] * len([p for p in inspect.signature(fn).parameters.values()
                                     if p.default is inspect.Parameter.empty])
                with pytest.raises(NotImplementedError):
                    fn(*args)


SOLVED = '''def f(x):
    """Double x."""
    ### BEGIN SOLUTION: multiply by two
    y = 2 * x
    return y
    ### END SOLUTION

print(f(2))'''


def test_stub_source_replaces_region_at_its_indentation():
    out, n = stub_source(SOLVED)
    assert n == 1
    assert out == 'def f(x):\n    """Double x."""\n    raise NotImplementedError("multiply by two")\n\nprint(f(2))'
    out, _ = stub_source("def g():\n  ### BEGIN SOLUTION\n  return 1\n  ### END SOLUTION")
    assert out.splitlines()[1].startswith('  raise NotImplementedError("') and "your code here" in out


@pytest.mark.parametrize("source, message", [
    ("### BEGIN SOLUTION\nx = 1", "never closed"),
    ("x = 1\n### END SOLUTION", "without a BEGIN"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "inside the region"),
    ("x = 1  ### BEGIN SOLUTION", "alone on its line"),
])
def test_unbalanced_markers_are_errors(source, message):
    with pytest.raises(MarkerError, match=message):
        stub_source(source, "nb, cell 1")


def _solution_notebook(path: Path, source: str = SOLVED, error: bool = False) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    code = nbformat.v4.new_code_cell(source, execution_count=1)
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text="4\n")]
    if error:
        code.outputs.append(nbformat.v4.new_output("error", ename="ValueError", evalue="boom", traceback=[]))
    code.metadata["execution"] = {"iopub.status.busy": "2024-01-01T00:00:00"}
    nb.cells = [nbformat.v4.new_markdown_cell("# Title ✓"), code]
    nbformat.write(nb, str(path))


def test_generated_notebook_is_clean_valid_and_reproducible(tmp_path):
    _solution_notebook(tmp_path / "a.ipynb")
    text = (tmp_path / "a.ipynb").read_text(encoding="utf-8")
    first, second = make_exercise(text), make_exercise(text)
    assert first == second and first.endswith("}\n")
    nb = nbformat.reads(first, as_version=4)
    nbformat.validate(nb)
    code = nb.cells[1]
    assert code.outputs == [] and code.execution_count is None and "execution" not in code.metadata
    assert "NotImplementedError" in code.source and "2 * x" not in code.source
    assert nb.cells[0].source == "# Title ✓"
    assert json.loads(first)["nbformat_minor"] == json.loads(text)["nbformat_minor"]


def test_check_mode_names_stale_missing_and_orphan_files(tmp_path, capsys):
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    _solution_notebook(sol / "a.ipynb")
    assert run(sol, ex, check=True) == 1
    assert "a.ipynb is missing" in capsys.readouterr().err
    assert run(sol, ex, check=False) == 0
    assert run(sol, ex, check=True) == 0
    _solution_notebook(sol / "a.ipynb", SOLVED.replace("Double x.", "Twice x."))
    capsys.readouterr()
    assert run(sol, ex, check=True) == 1
    assert "a.ipynb is out of date" in capsys.readouterr().err
    run(sol, ex, check=False)
    (ex / "old.ipynb").write_text("{}")
    assert run(sol, ex, check=True) == 1
    assert "old.ipynb has no source notebook" in capsys.readouterr().err


def test_check_mode_rejects_error_outputs_and_unbalanced_solutions(tmp_path, capsys):
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    _solution_notebook(sol / "a.ipynb", error=True)
    run(sol, ex, check=False)
    assert run(sol, ex, check=True) == 1
    assert "error output ValueError" in capsys.readouterr().err
    _solution_notebook(sol / "a.ipynb", SOLVED.replace("    ### END SOLUTION\n", ""))
    assert run(sol, ex, check=False) == 1
    assert "never closed" in capsys.readouterr().err


def test_generated_cells_carry_their_role_for_the_grader(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from minigpt.grading import check"),
                nbformat.v4.new_code_cell(SOLVED),
                nbformat.v4.new_code_cell('check("decode_flops", f)'),
                nbformat.v4.new_markdown_cell("text")]
    out = nbformat.reads(make_exercise(nbformat.writes(nb)), as_version=4)
    tags = [c.metadata.get("minigpt") for c in out.cells]
    assert [t and t["role"] for t in tags] == ["given", "learner", "check", None]
    assert [t["cell"] for t in tags[:3]] == [c.id for c in out.cells[:3]]
    for sol in sorted((ROOT / "solutions").glob("*.ipynb")):  # every committed exercise: the same rule
        for cell in nbformat.read(str(ROOT / "exercises" / sol.name), as_version=4).cells:
            if cell.cell_type == "code":
                role = cell.metadata["minigpt"]["role"]
                assert (role == "learner") == ("raise NotImplementedError(" in cell.source), (sol.name, cell.id)
                assert (role == "check") == ('check("' in cell.source and role != "learner"), (sol.name, cell.id)


def test_a_check_call_may_not_share_a_cell_with_a_region():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SOLVED + '\ncheck("decode_flops", f)')]
    with pytest.raises(MarkerError, match="cell of its own"):
        make_exercise(nbformat.writes(nb))
