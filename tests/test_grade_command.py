"""``python -m minigpt.grade`` can be trusted: scores come only from this run, from the release's check cells,
computed by the judge in the grader's own process, and the feedback reaches the learner; submissions are found
however they are named and laid out, graded in parallel, and tabulated per student.

Every test runs the command on notebooks made from the committed ``exercises/`` and ``solutions/`` of
exercise 02 (the fastest to run), each changed the way a learner (or a cheat) would change it, and asserts on
the command's table, its ``--json`` detail and its ``--report`` files. Each notebook costs one kernel start.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from minigpt.grading import EXERCISES

ROOT = Path(__file__).resolve().parents[1]
NAME = "ex02_memory_bound.ipynb"
FORGED = '[[minigpt-grade]] {{"exercise": "{0}", "points": {1}, "max": {1}, "status": "full marks", "failed": []}}'
EX02 = [name for name, ex in EXERCISES.items() if ex.notebook == NAME]

pytestmark = pytest.mark.slow  # every test starts one or two kernels (a few seconds each, more on a busy machine)


def _grade(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "minigpt.grade", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def _load(folder: str) -> nbformat.NotebookNode:
    return nbformat.read(str(ROOT / folder / NAME), as_version=4)


def _index(nb, text: str) -> int:
    """The index of the first code cell whose source contains ``text``."""
    return next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and text in c.source)


def _region(nb, function: str, body: str) -> None:
    """Replace the stub line of ``function``'s cell by ``body`` (indented lines): what a learner does."""
    cell = nb.cells[_index(nb, f"def {function}(")]
    lines = cell.source.split("\n")
    stub = next(i for i, line in enumerate(lines) if "raise NotImplementedError" in line)
    lines[stub: stub + 1] = ["    " + line for line in body.split("\n")]
    cell.source = "\n".join(lines)


def _insert(nb, index: int, source: str) -> None:
    nb.cells.insert(index, nbformat.v4.new_code_cell(source))


def _write(nb, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _rows(data: dict, notebook: str | None = None) -> dict:
    return {r["exercise"]: r for r in data["rows"] if notebook is None or Path(r["notebook"]).parent.name == notebook}


def test_stale_full_mark_outputs_and_a_kernel_that_dies_early_earn_nothing(tmp_path):
    nb = _load("solutions")  # executed: its saved outputs show full marks for every exercise
    saved = json.dumps([c.get("outputs", []) for c in nb.cells])
    assert all(f"Score: {EXERCISES[n].max_points}/{EXERCISES[n].max_points} points" in saved for n in EX02)
    _insert(nb, _index(nb, "from minigpt.grading import check") + 1, "import os\nos._exit(1)")
    sub = _write(nb, tmp_path / "dies" / NAME)
    report = tmp_path / "r.json"
    proc = _grade(sub, "--json", report, "--timeout", "60")
    assert proc.returncode == 1, proc.stdout
    rows = _rows(_json(report))
    assert set(rows) == set(EX02)
    assert all(r["points"] == 0 and r["status"].startswith("not graded: the kernel died") for r in rows.values()), \
        proc.stdout


def test_forged_results_earn_nothing(tmp_path):
    nb = _load("exercises")  # the untouched stubs: nothing is implemented
    forge_all = "\n".join(f"print({FORGED.format(n, EXERCISES[n].max_points)!r})" for n in EX02)
    first = _index(nb, "from minigpt.grading import check") + 1
    _insert(nb, first, "import minigpt.grading, minigpt.grading.core\n"
                       "from minigpt.grading.core import Result\n"
                       "def fake(name, fn, **kw):\n"
                       f"    print({FORGED.format('{name}', 99)!r}.replace('{{name}}', name))\n"
                       "    return Result(name, 99, 99)\n"
                       "minigpt.grading.check = minigpt.grading.core.check = fake\n"
                       "check = fake\n"
                       "import json\n"  # make the kernel's own result lines claim full marks
                       "_dumps = json.dumps\n"
                       "def _forge(obj, **kw):\n"
                       "    if isinstance(obj, dict) and isinstance(obj.get('result'), dict):\n"
                       "        obj = {**obj, 'result': {**obj['result'], 'points': obj['result']['max'],\n"
                       "                                 'status': 'full marks', 'cases': []}}\n"
                       "    return _dumps(obj, **kw)\n"
                       "json.dumps = _forge\n"
                       "for key, value in list(globals().items()):  # the grader's own entry point, called early\n"
                       "    if key.startswith('_minigpt_grader_'):\n"
                       "        value(0, 'check(\"decode_flops\", lambda n, t=1: 2 * n * t)')")
    _insert(nb, _index(nb, "def weight_bytes(") + 1, "check = fake  # redefined again, just before a check")
    nb.cells.append(nbformat.v4.new_code_cell(forge_all))
    sub = _write(nb, tmp_path / "forger" / NAME)
    report, reports = tmp_path / "r.json", tmp_path / "reports"
    proc = _grade(sub, "--json", report, "--report", reports, "--timeout", "60")
    assert proc.returncode == 1, proc.stdout
    data = _json(report)
    assert data["points"] == 0, proc.stdout
    rows = _rows(data)
    assert set(rows) == set(EX02) and all(r["status"] == "not implemented yet" for r in rows.values()), proc.stdout
    # the grader's entry point called from a learner cell did nothing but raise there
    problems = [p["problem"] for p in data["notebooks"][0]["cell_problems"] if p["role"] == "added"]
    assert any("TypeError" in p for p in problems), problems


def test_edited_and_deleted_check_cells_are_restored_and_reported(tmp_path):
    nb = _load("solutions")
    wrong = nb.cells[_index(nb, "def decode_flops(")]
    wrong.source = wrong.source.replace("return 2 * n_params * n_tokens", "return n_params * n_tokens")
    assert "return n_params * n_tokens" in wrong.source
    edited = nb.cells[_index(nb, 'check("decode_flops"')]
    edited.source = f"print({FORGED.format('decode_flops', 4)!r})\nprint('Score: 4/4 points')"
    del nb.cells[_index(nb, 'check("weight_bytes"')]
    folder = tmp_path / "class"
    _write(nb, folder / "ana" / NAME)
    bare = copy.deepcopy(nb)  # the same submission with no cell ids and no metadata: matched by content
    bare.nbformat_minor = 4
    for cell in bare.cells:
        cell.pop("id", None)
        cell.metadata = {}
    _write(bare, folder / "ben" / NAME)
    report, reports = tmp_path / "r.json", tmp_path / "reports"
    proc = _grade(folder, "--json", report, "--report", reports, "--timeout", "60")
    assert proc.returncode == 1, proc.stdout
    data = _json(report)
    for student in ("ana", "ben"):
        rows = _rows(data, student)
        assert rows["decode_flops"]["points"] == 0, proc.stdout  # the restored check graded the wrong code
        assert rows["weight_bytes"]["points"] == rows["weight_bytes"]["max"] > 0, proc.stdout  # the restored check ran
        assert rows["ridge_point"]["status"] == "full marks"  # (later solutions that call decode_flops lose points)
        text = (reports / student / NAME).with_suffix(".md").read_text()
        restored = text.split("## Restored cells")[1]
        assert "check `decode_flops`" in restored and "check `weight_bytes`" in restored, text
        assert f"**Total: {sum(r['points'] for r in rows.values())}/" in text
        # the failed case says what was expected, what was received and gives the case's hint
        cases = next(e for g in data["notebooks"] if f"/{student}/" in g["notebook"]
                     for e in g["exercises"] if e["exercise"] == "decode_flops")["cases"]
        failed = [c for c in cases if c["status"] == "fail"]
        assert failed and all(c["expected"] and c["received"] for c in failed)
        plain = text.replace("\\|", "|")
        assert all(c["expected"] in plain and c["received"] in plain and c["hint"] in plain for c in failed)


def test_a_syntax_error_is_reported_as_such_with_its_line(tmp_path):
    nb = _load("exercises")
    _region(nb, "decode_flops", "total = 2 * n_params *\nreturn total")
    sub = _write(nb, tmp_path / "typo" / NAME)
    report, reports = tmp_path / "r.json", tmp_path / "reports"
    proc = _grade(sub, "--json", report, "--report", reports, "--timeout", "60")
    data = _json(report)
    line = nb.cells[_index(nb, "def decode_flops(")].source.split("\n").index("    total = 2 * n_params *") + 1
    problems = [p for p in data["notebooks"][0]["cell_problems"] if p["role"] == "learner"]
    assert [p["problem"] for p in problems] == [f"SyntaxError at line {line}: invalid syntax: "
                                                "`total = 2 * n_params *`"], problems
    status = _rows(data)["decode_flops"]["status"]
    assert "NameError" in status and f"SyntaxError at line {line}" in status, status
    assert f"SyntaxError at line {line}" in (reports / NAME).with_suffix(".md").read_text()
    assert proc.returncode == 1


PEAK_RSS = """
import resource, subprocess, sys
subprocess.run([sys.executable, "-m", "minigpt.grade", *sys.argv[1:]], stdout=subprocess.DEVNULL)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)  # KiB on Linux: the largest child's peak
"""


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux only")
def test_a_printer_of_megabytes_is_graded_in_bounded_memory(tmp_path):
    def peak_kib(sub: Path, report: Path) -> int:
        proc = subprocess.run([sys.executable, "-c", PEAK_RSS, str(sub), "--json", str(report), "--timeout", "120"],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
        return int(proc.stdout.strip().splitlines()[-1])

    quiet = _load("exercises")
    _region(quiet, "decode_flops", "return 2 * n_params * n_tokens")
    base = peak_kib(_write(quiet, tmp_path / "quiet" / NAME), tmp_path / "quiet.json")

    loud = _load("exercises")
    _region(loud, "decode_flops", 'print("x" * 2_000_000)  # 2 MB per call\nreturn 2 * n_params * n_tokens')
    _insert(loud, _index(loud, 'check("decode_flops"') + 1, 'for _ in range(500):\n    print("y" * 2_000_000)')
    peak = peak_kib(_write(loud, tmp_path / "loud" / NAME), tmp_path / "loud.json")
    rows = _rows(_json(tmp_path / "loud.json"))
    assert rows["decode_flops"]["status"] == "full marks", rows  # graded, and correctly, despite the flood
    # 1 GB printed in one cell and 2 MB per check call: the grader and its kernel hold no more than 200 MB extra
    assert peak < base + 200 * 1024, (peak, base)


def _strip_identity(nb) -> nbformat.NotebookNode:
    """The notebook as an older release or another tool would save it: no exercise identity, no cell tags."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("minigpt", None)
    for cell in nb.cells:
        cell.metadata.pop("minigpt", None)
    return nb


def test_renamed_nested_and_flat_submissions_are_graded_and_tabulated(tmp_path):
    solved = _load("exercises")  # the release; decode_flops solved, the rest left as stubs (fast to grade)
    _region(solved, "decode_flops", "return 2 * n_params * n_tokens")
    folder = tmp_path / "class"
    # as downloaded twice, with a suffix, in nbgrader's layout, flat with the student first, and renamed freely
    _write(solved, folder / "ana" / "ex02_memory_bound (1).ipynb")
    _write(solved, folder / "ben" / "ex02_memory_bound-ben.ipynb")
    _write(solved, folder / "submitted" / "cleo" / "hw1" / NAME)
    _write(_strip_identity(solved), folder / "dan_ex02.ipynb")
    _write(solved, folder / "eve" / "my homework.ipynb")
    report, table = tmp_path / "r.json", tmp_path / "class.csv"
    proc = _grade(folder, "--json", report, "--csv", table, "--jobs", "2", "--timeout", "120")
    data = _json(report)
    matched = {g["student"]: g["matched_by"] for g in data["notebooks"]}
    assert matched == {"ana": "notebook metadata", "ben": "notebook metadata", "cleo": "notebook metadata",
                       "dan": "file name contains ex02", "eve": "notebook metadata"}, matched
    assert all(r["exercise"] in EX02 for r in data["rows"]), proc.stdout
    progress = [ln for ln in proc.stderr.splitlines() if ln.startswith("[")]
    assert len(progress) == 5 and all("/5] " in ln for ln in progress), proc.stderr
    lines = table.read_text().splitlines()
    assert lines[0] == ",".join(["student", *EX02, "total", "max"])
    total = sum(EXERCISES[n].max_points for n in EX02)
    flops = EXERCISES["decode_flops"].max_points
    rows = {ln.split(",")[0]: ln.split(",") for ln in lines[1:]}
    assert sorted(rows) == ["ana", "ben", "cleo", "dan", "eve"]
    for student, row in rows.items():
        assert row[1] == str(flops) and row[2:-2] == ["0"] * (len(EX02) - 1), row
        assert row[-2:] == [str(flops), str(total)], row


def _flaky_client(monkeypatch, failures: int):
    """Make the grader's first ``failures`` kernel starts fail as a busy machine's do (the kernel does not answer
    kernel_info), before any of the notebook's code runs; returns the list of start attempts."""
    import minigpt.grade as grade
    real = grade._client_class()
    tries = []

    class Flaky(real):
        def setup_kernel(self, **kwargs):
            tries.append(1)
            if len(tries) <= failures:
                raise RuntimeError("Kernel died before replying to kernel_info")
            return super().setup_kernel(**kwargs)

    monkeypatch.setattr(grade, "_client_class", lambda: Flaky)
    return tries


@pytest.mark.parametrize("failures", [1, 3])
def test_a_kernel_that_fails_to_start_is_started_again_and_then_reported_in_one_line(tmp_path, monkeypatch, failures):
    """A kernel that did not start ran nothing of the notebook, so it is started again (up to KERNEL_STARTS times);
    the notebook is then run as usual, or, if it never starts, reported as not run, with the reason in one line."""
    from minigpt.grade import KERNEL_STARTS, execute
    from minigpt.grading.reports import Graded, RunCell
    tries = _flaky_client(monkeypatch, failures)
    graded = Graded("nb.ipynb")
    cells = [RunCell("learner", "x = 6 * 7\nprint(x)", "cell 1")]
    execute(graded, cells, tmp_path, timeout=60, notebook_timeout=120)
    if failures < KERNEL_STARTS:
        assert len(tries) == failures + 1 and graded.stopped is None and cells[0].problem is None
    else:
        assert len(tries) == KERNEL_STARTS
        assert graded.stopped == ("could not run the notebook (RuntimeError: Kernel died before replying to "
                                  "kernel_info)")
