"""Make the learner's notebooks from the solved ones: ``python -m minigpt.grading.make_exercises [--check]``;
build the release learners get, without ``solutions/``: ``... --release-folder DIR``.

``solutions/`` is the single source. In a graded cell the learner's part sits between two marker lines
(nbgrader's)::

    def crop_cache(k_cache, v_cache, length):
        \"\"\"docstring: stays in the exercise\"\"\"
        ### BEGIN SOLUTION: keep the first `length` positions (dim 2) of both tensors
        return k_cache[:, :, :length], v_cache[:, :, :length]
        ### END SOLUTION

Each region (markers included) becomes one line at the marker's indentation,
``raise NotImplementedError("<the text after 'BEGIN SOLUTION:'>")``; outputs, execution counts and execution
metadata are cleared; everything else is kept as it is, and every code cell gets a tag that the grading command
uses to match a submission's cells with the release's, ``metadata.minigpt = {"cell": <id>, "role": <role>}``:
the role is ``"learner"`` for a cell with a solution region, ``"check"`` for a cell that calls ``check(...)``
(it may not also hold a region), ``"given"`` for every other code cell; the id is the cell's nbformat id (or
``cell-<n>`` for notebooks older than nbformat 4.5). The roles come from the content, so nobody writes them.
The notebook itself gets its exercise identity, ``metadata.minigpt = {"exercise": "<file stem>"}``: the grading
command finds a submission's release notebook by it, whatever the learner renamed the file to.
The JSON is written the way nbformat writes it (sorted keys, indent 1, trailing newline), so generating twice
gives the same bytes.

``--check`` writes nothing: it exits 1 naming every exercise that is missing or out of date, every region that
is not closed, and every solution notebook with stray outputs (error outputs, unexecuted cells, paths of the
machine it ran on).

``--release-folder DIR`` copies the course as learners get it into DIR: every file git tracks (every file, outside
a git checkout) except ``solutions/``, the tests (which read the solutions) and CI files, with ``exercises/``
generated afresh from ``solutions/``. It refuses a DIR that exists and is not empty, and checks what it wrote: no
``solutions/`` folder, no exercise notebook with a solution marker or a line of a solution region.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

BEGIN = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION\b[ \t]*(?:[:\-][ \t]*(?P<hint>.*?))?[ \t]*$")
END = re.compile(r"^[ \t]*### END SOLUTION\b")
DEFAULT_HINT = "your code here (see the explanation above and the docstring)"
LOCAL_PATHS = re.compile(r"(?<![\w.])/(?:work|root|tmp|home|Users)/")
VOLATILE_CELL_METADATA = ("execution", "ExecuteTime")
VOLATILE_NOTEBOOK_METADATA = ("widgets",)
CHECK_CALL = re.compile(r"""\bcheck\(\s*["']([^"'\s]+)["']""")  # the same pattern as minigpt.grade's


def check_calls(source: str) -> list[str]:
    """The exercise names of the ``check("name", ...)`` calls in a code cell (comment lines skipped)."""
    return [name for line in source.splitlines() if not line.lstrip().startswith("#")
            for name in CHECK_CALL.findall(line)]


class MarkerError(ValueError):
    """A BEGIN/END SOLUTION region that is not closed, nested, stray, or outside a code cell."""


def stub_source(source: str, where: str = "cell") -> tuple[str, int]:
    """Replace every marked region of ``source`` by a ``raise NotImplementedError(hint)`` line.

    Returns (new source, number of regions). Raises :class:`MarkerError` for unbalanced markers."""
    out, opened, regions = [], None, 0
    for lineno, line in enumerate(source.split("\n"), start=1):
        begin = BEGIN.match(line)
        if begin:
            if opened:
                raise MarkerError(f"{where}, line {lineno}: BEGIN SOLUTION inside the region opened at line {opened}")
            opened, regions = lineno, regions + 1
            hint = begin["hint"] or DEFAULT_HINT
            out.append(f"{begin['indent']}raise NotImplementedError({json.dumps(hint, ensure_ascii=False)})")
        elif END.match(line):
            if not opened:
                raise MarkerError(f"{where}, line {lineno}: END SOLUTION without a BEGIN SOLUTION")
            opened = None
        elif "### BEGIN SOLUTION" in line or "### END SOLUTION" in line:
            raise MarkerError(f"{where}, line {lineno}: a solution marker must be alone on its line: {line.strip()!r}")
        elif not opened:
            out.append(line)
    if opened:
        raise MarkerError(f"{where}, line {opened}: BEGIN SOLUTION is never closed by END SOLUTION")
    return "\n".join(out), regions


def make_exercise(solution_text: str, name: str = "notebook") -> str:
    """The exercise notebook (as JSON text) generated from a solution notebook's JSON text; ``name`` is its file
    name, whose stem becomes the notebook's exercise identity."""
    nb = nbformat.reads(solution_text, as_version=nbformat.NO_CONVERT)
    nb.metadata["minigpt"] = {"exercise": Path(name).stem}
    total = 0
    for index, cell in enumerate(nb.cells):
        where = f"{name}, cell {index + 1}"
        if cell.cell_type != "code":
            if "### BEGIN SOLUTION" in cell.source or "### END SOLUTION" in cell.source:
                raise MarkerError(f"{where}: solution markers are only supported in code cells")
            continue
        calls = check_calls(cell.source)
        cell.source, n = stub_source(cell.source, where)
        if n and calls:
            raise MarkerError(f"{where}: a check(...) call must have a cell of its own, not share the cell of a "
                              "solution region (the grader restores check cells and keeps the learner's)")
        total += n
        role = "learner" if n else "check" if calls else "given"
        cell.metadata["minigpt"] = {"cell": cell.get("id") or f"cell-{index + 1}", "role": role}
        cell.outputs = []
        cell.execution_count = None
        for key in VOLATILE_CELL_METADATA:
            cell.metadata.pop(key, None)
    if total == 0:
        raise MarkerError(f"{name}: no ### BEGIN SOLUTION region, so nothing for the learner to write")
    for key in VOLATILE_NOTEBOOK_METADATA:
        nb.metadata.pop(key, None)
    return nbformat.writes(nb) + "\n"


def stray_outputs(solution_text: str, name: str = "notebook") -> list[str]:
    """Problems in a solution notebook's committed outputs: errors, unexecuted cells, local paths."""
    nb = nbformat.reads(solution_text, as_version=nbformat.NO_CONVERT)
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        where = f"{name}, cell {index + 1}"
        if cell.execution_count is None:
            problems.append(f"{where}: not executed (commit solutions with their outputs)")
        for out in cell.outputs:
            if out.output_type == "error":
                problems.append(f"{where}: error output {out.get('ename')}: {str(out.get('evalue'))[:80]}")
            text = json.dumps(out.get("text", "")) + json.dumps(out.get("data", {}).get("text/plain", ""))
            if LOCAL_PATHS.search(text):
                problems.append(f"{where}: output shows a path of this machine")
    return problems


def run(solutions: Path, exercises: Path, check: bool) -> int:
    if not solutions.is_dir():
        print(f"no solutions folder at {solutions}", file=sys.stderr)
        return 2
    problems, stale, written = [], [], []
    sources = sorted(solutions.glob("*.ipynb"))
    for src in sources:
        text = src.read_text(encoding="utf-8")
        try:
            generated = make_exercise(text, src.name)
        except Exception as e:  # unbalanced markers (MarkerError), or not a readable notebook
            problems.append(str(e) if isinstance(e, MarkerError) else f"{src.name}: unreadable: {e}")
            continue
        problems += stray_outputs(text, src.name) if check else []
        target = exercises / src.name
        current = target.read_text(encoding="utf-8") if target.is_file() else None
        if current != generated:
            if check:
                stale.append(f"{target} is {'missing' if current is None else 'out of date'}")
            else:
                exercises.mkdir(parents=True, exist_ok=True)
                target.write_text(generated, encoding="utf-8")
                written.append(str(target))
        if not check:
            for warning in stray_outputs(text, src.name):
                print(f"warning: {warning}", file=sys.stderr)
    names = {s.name for s in sources}
    orphans = [str(p) for p in sorted(exercises.glob("*.ipynb")) if p.name not in names] if exercises.is_dir() else []
    for orphan in orphans:
        (stale if check else problems).append(f"{orphan} has no source notebook in {solutions}")
    for line in problems + stale:
        print(line, file=sys.stderr)
    if check:
        if problems or stale:
            print("exercises are out of date: run `python -m minigpt.grading.make_exercises`" if stale else
                  "solution notebooks need fixing", file=sys.stderr)
            return 1
        print(f"{len(sources)} exercise notebooks are up to date")
        return 0
    print(f"wrote {len(written)} of {len(sources)} exercise notebooks" + (": " + ", ".join(written) if written else
                                                                          " (all were up to date)"))
    return 1 if problems else 0


RELEASE_EXCLUDE = ("solutions/", "tests/", ".ci/", ".github/")


def _course_files(root: Path) -> list[str]:
    """The course's files relative to ``root``: git's tracked files, or every file outside hidden and build folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True, timeout=60).stdout
        files = [f for f in out.decode("utf-8").split("\0") if f]
        if files:
            return [f for f in files if (root / f).is_file()]
    except (OSError, subprocess.SubprocessError):
        pass
    skip = {"__pycache__", "build", "dist", "venv", "runs"}
    return [str(p.relative_to(root)) for p in sorted(root.rglob("*")) if p.is_file() and not any(
        part.startswith(".") or part in skip or part.endswith(".egg-info") for part in p.relative_to(root).parts)]


def solution_lines(solutions: Path) -> set[str]:
    """The code lines (longer than 12 characters) inside the solution regions of ``solutions/*.ipynb``."""
    lines = set()
    for path in sorted(solutions.glob("*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        for cell in nb.cells:
            inside = False
            for line in cell.source.split("\n") if cell.cell_type == "code" else []:
                if BEGIN.match(line):
                    inside = True
                elif END.match(line):
                    inside = False
                elif inside and len(line.strip()) > 12:
                    lines.add(line.strip())
    return lines


def release_problems(folder: Path, solutions: Path) -> list[str]:
    """What makes ``folder`` unfit to give learners: a ``solutions`` folder anywhere, or an exercise notebook
    (``exercises/*.ipynb``) with a solution marker or a line of a solution region. (Lessons are not searched
    for solution lines: they teach the same algorithms, in the library's words.)"""
    problems = [f"{path} exists" for path in sorted(folder.rglob("solutions")) if path.is_dir()]
    secret = solution_lines(solutions)
    for path in sorted((folder / "exercises").glob("*.ipynb")):
        text = path.read_text(encoding="utf-8")
        if "### BEGIN SOLUTION" in text or "### END SOLUTION" in text:
            problems.append(f"{path} holds a solution marker")
        nb = nbformat.reads(text, as_version=4)
        leaked = {line.strip() for c in nb.cells if c.cell_type == "code" for line in c.source.split("\n")} & secret
        if leaked:
            problems.append(f"{path} holds {len(leaked)} line(s) of a solution, e.g. {sorted(leaked)[0]!r}")
    return problems


def build_release(root: Path, folder: Path) -> list[str]:
    """Copy the course without its solutions into ``folder`` (see the module docstring); returns the files
    written, relative to ``folder``. Raises ``ValueError`` when ``folder`` is not empty or the result leaks."""
    root, folder = root.resolve(), folder.resolve()
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"{folder} exists and is not empty")
    if folder == root or root in folder.parents:
        raise ValueError(f"{folder} is inside the course folder {root}: choose a folder outside it")
    files = [f for f in _course_files(root) if not f.startswith(RELEASE_EXCLUDE) and not f.startswith("exercises/")]
    for rel in files:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, folder / rel)
    status = run(root / "solutions", folder / "exercises", check=False)
    if status:
        raise ValueError("the exercises could not be generated from the solutions")
    problems = release_problems(folder, root / "solutions")
    if problems:
        raise ValueError("the release would give away solutions: " + "; ".join(problems))
    return sorted(files + [f"exercises/{p.name}" for p in (folder / "exercises").glob("*.ipynb")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minigpt.grading.make_exercises",
                                     description="Generate exercises/*.ipynb from solutions/*.ipynb.")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if exercises are stale")
    parser.add_argument("--solutions", type=Path, default=Path("solutions"), help="default: ./solutions")
    parser.add_argument("--exercises", type=Path, default=Path("exercises"), help="default: ./exercises")
    parser.add_argument("--release-folder", type=Path, metavar="DIR",
                        help="build the learners' release (the course without solutions/) in DIR")
    args = parser.parse_args(argv)
    if args.release_folder:
        try:
            written = build_release(args.solutions.resolve().parent, args.release_folder)
        except ValueError as e:
            print(f"release not built: {e}", file=sys.stderr)
            return 1
        print(f"wrote the release to {args.release_folder}: {len(written)} files, no solutions/")
        return 0
    return run(args.solutions, args.exercises, args.check)


if __name__ == "__main__":
    sys.exit(main())
