"""Make the learner's notebooks from the solved ones: ``python -m minigpt.grading.make_exercises [--check]``.

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
The JSON is written the way nbformat writes it (sorted keys, indent 1, trailing newline), so generating twice
gives the same bytes.

``--check`` writes nothing: it exits 1 naming every exercise that is missing or out of date, every region that
is not closed, and every solution notebook with stray outputs (error outputs, unexecuted cells, paths of the
machine it ran on).
"""
from __future__ import annotations

import argparse
import json
import re
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
    """The exercise notebook (as JSON text) generated from a solution notebook's JSON text."""
    nb = nbformat.reads(solution_text, as_version=nbformat.NO_CONVERT)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minigpt.grading.make_exercises",
                                     description="Generate exercises/*.ipynb from solutions/*.ipynb.")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if exercises are stale")
    parser.add_argument("--solutions", type=Path, default=Path("solutions"), help="default: ./solutions")
    parser.add_argument("--exercises", type=Path, default=Path("exercises"), help="default: ./exercises")
    args = parser.parse_args(argv)
    return run(args.solutions, args.exercises, args.check)


if __name__ == "__main__":
    sys.exit(main())
