"""Submissions as they arrive, a class's table, and the platforms instructors grade on.

* which release notebook a submission is (its metadata, its cells' tags, its name) and whose it is (the layout);
* the class CSV: one row per student, one column per exercise, totals;
* Gradescope: ``results.json`` against the documented format, the autograder bundle's contents, and (slow) its
  ``run_autograder`` run locally on a submission;
* GitHub Classroom: the workflow parses, passes the GitHub-workflow JSON schema, wires the grading step to the
  reporter, and (slow) the command of its grading step, run locally, produces the result the reporter reads;
* the learners' release: built without solutions, checked for leaks.
"""
from __future__ import annotations

import base64
import copy
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import nbformat
import pytest
import yaml

from minigpt.grading import EXERCISES
from minigpt.grading.make_exercises import build_release, make_exercise, release_problems
from minigpt.grading.platforms import HERE as PLATFORMS, gradescope_bundle
from minigpt.grading.reports import Graded, Row, class_csv, classroom_result, gradescope_results
from minigpt.grading.submissions import load_releases, match_release, student_of

ROOT = Path(__file__).resolve().parents[1]
RELEASES = load_releases(ROOT / "exercises")
EX02 = [n for n, e in EXERCISES.items() if e.notebook == "ex02_memory_bound.ipynb"]

# Gradescope's results.json, as its autograder specifications ("Output format") describe it
GRADESCOPE_SCHEMA = {
    "type": "object",
    "properties": {
        "score": {"type": "number"}, "execution_time": {"type": "number"}, "output": {"type": "string"},
        "output_format": {"enum": ["text", "html", "simple_format", "md", "ansi"]},
        "visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
        "stdout_visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
        "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": {
            "type": "object",
            "properties": {"score": {"type": "number"}, "max_score": {"type": "number"},
                           "status": {"enum": ["passed", "failed"]}, "name": {"type": "string"},
                           "number": {"type": "string"}, "output": {"type": "string"},
                           "tags": {"type": "array", "items": {"type": "string"}},
                           "visibility": {"enum": ["hidden", "after_due_date", "after_published", "visible"]},
                           "extra_data": {"type": "object"}},
            "required": ["score", "max_score", "name", "output", "visibility"], "additionalProperties": False}},
    },
    "required": ["score", "tests"],
    "additionalProperties": False,
}


def _nb(name: str):
    return nbformat.read(str(ROOT / "exercises" / name), as_version=4)


def _bare(nb):
    nb = copy.deepcopy(nb)
    nb.metadata.pop("minigpt", None)
    for cell in nb.cells:
        cell.metadata.pop("minigpt", None)
    return nb


# ---- which release, whose ------------------------------------------------------------------------------------------

def test_a_submission_is_matched_by_its_metadata_its_cells_then_its_name():
    nb = _nb("ex03_speculative_step.ipynb")
    release, rule = match_release(Path("whatever I called it.ipynb"), nb, RELEASES)
    assert release.identity == "ex03_speculative_step" and rule == "notebook metadata"
    tags_only = copy.deepcopy(nb)
    tags_only.metadata.pop("minigpt")
    release, rule = match_release(Path("whatever.ipynb"), tags_only, RELEASES)
    assert release.identity == "ex03_speculative_step" and rule == "cell tags"
    bare = _bare(nb)
    for name, rule in (("ex03_speculative_step.ipynb", "file name"),
                       ("ex03_speculative_step (1).ipynb", "file name contains ex03_speculative_step"),
                       ("ex03_speculative_step-alice.ipynb", "file name contains ex03_speculative_step"),
                       ("alice_ex03.ipynb", "file name contains ex03"), ("EX03-final.ipynb", "file name contains ex03")):
        release, got = match_release(Path(name), bare, RELEASES)
        assert release is not None and release.identity == "ex03_speculative_step" and got == rule, (name, got)
    release, why = match_release(Path("notes.ipynb"), bare, RELEASES)
    assert release is None and "no release notebook" in why
    release, why = match_release(Path("ex03_and_ex05.ipynb"), bare, RELEASES)
    assert release is None and "names 2 release notebooks" in why


def test_the_student_is_read_from_the_layout(tmp_path):
    ex03 = next(r for r in RELEASES if r.identity == "ex03_speculative_step")
    root = tmp_path / "class"
    cases = {root / "submitted" / "alice" / "hw1" / "ex03_speculative_step.ipynb": "alice",  # nbgrader
             root / "bob" / "anything.ipynb": "bob",                                          # a folder each
             root / "carol_ex03.ipynb": "carol",                                              # flat
             root / "ex03_speculative_step-dave.ipynb": "dave",
             root / "Erin Smith - ex03_speculative_step.ipynb": "Erin_Smith",
             root / "ex03_speculative_step (1).ipynb": "-"}                                   # no name in it
    for path, student in cases.items():
        assert student_of(path, root, ex03) == student, path
    # nbgrader's layout is recognised whichever folder is graded
    deep = root / "submitted" / "alice" / "hw1" / "ex03_speculative_step.ipynb"
    assert student_of(deep, root / "submitted" / "alice", ex03) == "alice"


# ---- a class's table --------------------------------------------------------------------------------------------------

def _graded(student: str, points: dict[str, int], notebook: str = "ex02_memory_bound.ipynb") -> Graded:
    return Graded(f"{student}/{notebook}", release=notebook, student=student, matched_by="file name",
                  rows=[Row(notebook, n, p, EXERCISES[n].max_points, "") for n, p in points.items()])


def test_the_class_csv_has_a_row_per_student_a_column_per_exercise_and_totals():
    graded = [_graded("ana", {"decode_flops": 4, "weight_bytes": 2}), _graded("ben", {"decode_flops": 1}),
              _graded("ana", {"decode_flops": 2, "weight_bytes": 0}),  # a second copy: the higher score counts
              _graded("cleo", {"draft": 8}, "ex03_speculative_step.ipynb")]
    rows = list(csv.reader(io.StringIO(class_csv(graded, list(EXERCISES)))))
    assert rows[0] == ["student", "decode_flops", "weight_bytes", "draft", "total", "max"]
    top = EXERCISES["decode_flops"].max_points + EXERCISES["weight_bytes"].max_points + EXERCISES["draft"].max_points
    assert rows[1:] == [["ana", "4", "2", "", "6", str(top)], ["ben", "1", "", "", "1", str(top)],
                        ["cleo", "", "", "8", "8", str(top)]]


# ---- Gradescope ---------------------------------------------------------------------------------------------------------

def _a_graded_notebook() -> Graded:
    g = _graded("-", {"decode_flops": 1, "weight_bytes": 2})
    g.results = {"decode_flops": {"points": 1, "max": 4, "cases": [
        {"name": "70B parameters", "status": "fail", "points": 0, "max_points": 1, "expected": "1.4e+11",
         "received": "7e+10", "hint": "2 FLOPs per weight"},
        {"name": "random sizes", "status": "pass", "points": 1, "max_points": 1, "received": "ok"}]}}
    return g


def test_gradescope_results_follow_the_documented_format():
    results = gradescope_results([_a_graded_notebook()], seconds=12.3)
    jsonschema.validate(results, GRADESCOPE_SCHEMA)
    assert results["score"] == 3.0 and results["execution_time"] == 12
    names = [t["name"] for t in results["tests"]]
    assert names == ["ex02_memory_bound.ipynb: decode_flops: 70B parameters",
                     "ex02_memory_bound.ipynb: decode_flops: random sizes", "ex02_memory_bound.ipynb: weight_bytes"]
    failed = results["tests"][0]
    assert failed["status"] == "failed" and "7e+10" in failed["output"] and "2 FLOPs" in failed["output"]
    with pytest.raises(jsonschema.ValidationError):  # the schema is strict enough to catch a misspelt field
        jsonschema.validate({**results, "tests": [{**failed, "max_points": 1}]}, GRADESCOPE_SCHEMA)


def test_the_gradescope_bundle_holds_the_scripts_the_package_and_the_release_only(tmp_path):
    out = tmp_path / "autograder.zip"
    names = gradescope_bundle(out, ["ex02_memory_bound"])
    with zipfile.ZipFile(out) as z:
        listed = z.namelist()
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
    assert listed == names and {"setup.sh", "run_autograder"} <= set(listed)
    assert modes["run_autograder"] & 0o111 and modes["setup.sh"] & 0o111
    assert "course/pyproject.toml" in listed and "course/minigpt/grade.py" in listed
    assert "course/minigpt/checkpoints/target.pt" in listed
    assert [n for n in listed if n.startswith("release/")] == ["release/ex02_memory_bound.ipynb"]
    assert not [n for n in listed if "solutions" in n or "checkpoints/smollm2" in n or "__pycache__" in n]
    with pytest.raises(ValueError, match="no release notebook"):
        gradescope_bundle(tmp_path / "x.zip", ["ex99_nothing"])


@pytest.mark.slow
def test_run_autograder_grades_a_submission_into_results_json(tmp_path):
    with zipfile.ZipFile(gradescope_bundle(tmp_path / "a.zip", ["ex02_memory_bound"]) and tmp_path / "a.zip") as z:
        z.extractall(tmp_path / "autograder" / "source")
    solved = nbformat.read(str(ROOT / "solutions" / "ex02_memory_bound.ipynb"), as_version=4)
    (tmp_path / "autograder" / "submission").mkdir()
    nbformat.write(solved, str(tmp_path / "autograder" / "submission" / "ex02_memory_bound (2).ipynb"))
    script = tmp_path / "autograder" / "source" / "run_autograder"
    env = {**os.environ, "AUTOGRADER_ROOT": str(tmp_path / "autograder"), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "autograder" / "results" / "results.json").read_text())
    jsonschema.validate(results, GRADESCOPE_SCHEMA)
    top = sum(EXERCISES[n].max_points for n in EX02)
    assert results["score"] == top == sum(t["max_score"] for t in results["tests"]), results["output"]
    assert all(t["status"] == "passed" for t in results["tests"])


# ---- GitHub Classroom ---------------------------------------------------------------------------------------------------

def _workflow() -> dict:
    return yaml.safe_load((PLATFORMS / "classroom.yml").read_text())


def _grade_step(workflow: dict) -> dict:
    steps = workflow["jobs"]["run-autograding-tests"]["steps"]
    return next(s for s in steps if s.get("id") == "grade")


def test_the_workflow_grades_on_push_and_reports_the_grading_step():
    wf = _workflow()
    assert "push" in wf["on"] and wf["permissions"]["checks"] == "write"
    steps = wf["jobs"]["run-autograding-tests"]["steps"]
    assert steps[0]["uses"].startswith("actions/checkout@")
    grade = _grade_step(wf)
    assert "python -m minigpt.grade" in grade["run"] and '--github-classroom "$GITHUB_OUTPUT"' in grade["run"]
    reporter = next(s for s in steps if "autograding-grading-reporter" in s.get("uses", ""))
    assert reporter["with"]["runners"] == "grade"  # the reporter reads GRADE_RESULTS: the grade step's output
    assert reporter["env"]["GRADE_RESULTS"] == "${{ steps.grade.outputs.result }}"
    assert steps.index(reporter) > steps.index(grade)


def test_the_workflow_passes_the_github_workflow_schema(tmp_path):
    pytest.importorskip("check_jsonschema")  # pip install check-jsonschema (its schema is vendored: no network)
    run = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows"]
    ok = subprocess.run([*run, str(PLATFORMS / "classroom.yml")], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = _workflow()
    del broken["jobs"]["run-autograding-tests"]["runs-on"]  # the check can fail: a job without runs-on
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(broken))
    bad = subprocess.run([*run, str(tmp_path / "broken.yml")], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0


def test_the_classroom_result_is_what_the_reporter_adds_up():
    result = classroom_result([_a_graded_notebook()])
    assert result["status"] == "fail" and result["max_score"] == EXERCISES["decode_flops"].max_points + EXERCISES[
        "weight_bytes"].max_points
    # the reporter's notify step: points = sum of the tests' scores over the max_score of each runner
    assert sum(t["score"] for t in result["tests"]) == 3
    assert {t["status"] for t in result["tests"]} == {"pass", "fail"}


@pytest.mark.slow
def test_the_workflows_grading_command_runs_here(tmp_path):
    repo = tmp_path / "student-repo"
    repo.mkdir()
    (repo / ".course").symlink_to(ROOT)  # what the workflow's install step clones
    solved = nbformat.read(str(ROOT / "solutions" / "ex02_memory_bound.ipynb"), as_version=4)
    nbformat.write(solved, str(repo / "ex02_memory_bound.ipynb"))
    output = tmp_path / "github_output"
    env = {**os.environ, "GITHUB_OUTPUT": str(output), "NOTEBOOKS": "ex02_memory_bound", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["bash", "-e", "-c", _grade_step(_workflow())["run"]], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(ln for ln in output.read_text().splitlines() if ln.startswith("result="))
    result = json.loads(base64.b64decode(line.split("=", 1)[1]))
    top = sum(EXERCISES[n].max_points for n in EX02)
    assert result["status"] == "pass" and result["max_score"] == top == sum(t["score"] for t in result["tests"])
    assert (repo / "feedback").is_dir()


# ---- the learners' release -----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_release_ships_without_solutions(tmp_path):
    folder = tmp_path / "release"
    written = build_release(ROOT, folder)
    assert not (folder / "solutions").exists() and not (folder / "tests").exists()
    assert "minigpt/grade.py" in written and "README.md" in written
    for path in sorted((ROOT / "solutions").glob("ex0*.ipynb")):  # the exercises, generated afresh
        assert (folder / "exercises" / path.name).read_text() == make_exercise(path.read_text(), path.name)
    assert release_problems(folder, ROOT / "solutions") == []
    shutil.copy(ROOT / "solutions" / "ex02_memory_bound.ipynb", folder / "exercises" / "ex02_memory_bound.ipynb")
    problems = release_problems(folder, ROOT / "solutions")
    assert any("solution marker" in p for p in problems) and any("line(s) of a solution" in p for p in problems)
    (folder / "course" / "solutions").mkdir()
    assert any("solutions exists" in p for p in release_problems(folder, ROOT / "solutions"))
    with pytest.raises(ValueError, match="not empty"):
        build_release(ROOT, folder)
