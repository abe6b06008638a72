"""Grade exercise notebooks headless: ``python -m minigpt.grade PATH [--json FILE] [--timeout SECONDS]``.

PATH is one notebook or a folder (searched recursively, so a class's ``submissions/<student>/`` tree works).
Each notebook runs top to bottom in a fresh kernel, in its own folder, with a per-cell timeout; a cell that
raises does not stop the run (later check cells still execute). The ``check(...)`` calls found in the
notebook's source say which exercises to expect; their scores are read back from the lines ``check`` prints
(``[[minigpt-grade]] {...}``). Every problem -- learner code that raises or hangs, a dead kernel, a file that is
not a notebook -- becomes one row of the table with its reason, and grading goes on with the rest.

Exit status: 0 only when every expected exercise of every notebook earned full marks.

This runs the learner's code with your permissions: grade untrusted submissions inside a container.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

MARKER = "[[minigpt-grade]]"  # same as minigpt.grading.core.MARKER (kept here so the CLI starts without torch)
CHECK_CALL = re.compile(r"""\bcheck\(\s*["']([^"'\s]+)["']""")


@dataclass
class Row:
    notebook: str
    exercise: str
    points: int
    max: int | None  # None when the exercise name is unknown
    status: str

    @property
    def full_marks(self) -> bool:
        return self.max is not None and self.max > 0 and self.points == self.max


def _one_line(text: str, limit: int = 160) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _max_points(name: str) -> int | None:
    from .grading import EXERCISES  # imports torch: done once, after the arguments were parsed
    return EXERCISES[name].max_points if name in EXERCISES else None


def find_notebooks(path: Path) -> list[Path]:
    """The notebooks under a folder (recursively, skipping hidden folders such as .ipynb_checkpoints)."""
    found = [p for p in path.rglob("*.ipynb") if not any(part.startswith(".") for part in p.relative_to(path).parts)]
    return sorted(found)


def expected_exercises(nb) -> list[tuple[str, int]]:
    """(exercise name, cell index) of every ``check("name", ...)`` call in the notebook's code cells."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        for line in cell.source.splitlines():
            if line.lstrip().startswith("#"):
                continue
            found += [(name, index) for name in CHECK_CALL.findall(line)]
    return found


def _kernel_manager():
    """A kernel manager that starts ipykernel with *this* Python, whatever kernels Jupyter has registered (the
    same idea as nbval's --nbval-current-env): the notebook sees the grader's torch and minigpt."""
    import ipykernel.kernelspec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class ThisPython(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES,
                                          **ipykernel.kernelspec.get_kernel_dict())

    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ThisPython())


def execute(nb, folder: Path, timeout: float) -> tuple[str | None, int | None]:
    """Run every code cell of ``nb`` in place (outputs are stored in it). Returns (why it stopped early, at which
    cell index), or (None, None) when every cell ran -- errors inside cells do not stop the run."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    import minigpt
    env = dict(os.environ)
    # the kernel must import the same minigpt as this grader, even when the package is not installed
    root = str(Path(minigpt.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    quiet = logging.getLogger("minigpt.grade.kernel")
    quiet.setLevel(logging.CRITICAL)
    client = NotebookClient(nb, km=_kernel_manager(), timeout=timeout, allow_errors=True, record_timing=False,
                            shutdown_kernel="immediate", resources={"metadata": {"path": str(folder)}}, log=quiet)
    try:
        # the kernel's own stderr (start-up warnings) would interleave with the table; its errors reach us anyway
        with client.setup_kernel(env=env, cwd=str(folder), stderr=subprocess.DEVNULL, cleanup_kc=True):
            for index, cell in enumerate(nb.cells):
                if cell.get("cell_type") != "code":
                    continue
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    return f"cell {index + 1} ran past the {timeout:g} s timeout", index
                except DeadKernelError:
                    return f"the kernel died in cell {index + 1}", index
    except Exception as e:  # kernel failed to start, or died between cells
        return f"could not run the notebook ({type(e).__name__}: {_one_line(e)})", 0
    return None, None


def _results_and_errors(nb) -> tuple[dict[str, dict], dict[int, str]]:
    results, errors = {}, {}
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                for line in out.get("text", "").splitlines():
                    if line.startswith(MARKER):
                        try:
                            res = json.loads(line[len(MARKER):])
                            results[str(res["exercise"])] = res  # the last call of a check counts
                        except (ValueError, KeyError, TypeError):
                            pass
            elif out.get("output_type") == "error":
                errors[index] = f"{out.get('ename', 'Error')}: {_one_line(out.get('evalue', ''))}".rstrip(": ")
    return results, errors


def grade_notebook(path: Path, display: str, timeout: float) -> list[Row]:
    """Run one notebook and return one row per exercise (or one row saying why it could not be graded)."""
    import nbformat

    if not path.exists():
        return [Row(display, "-", 0, None, "not found: no such file or folder")]
    if path.suffix != ".ipynb":
        return [Row(display, "-", 0, None, "not a notebook (expected a .ipynb file)")]
    try:
        with warnings.catch_warnings():  # e.g. nbformat's MissingIDFieldWarning on older notebooks: not our concern
            warnings.simplefilter("ignore")
            nb = nbformat.read(str(path), as_version=4)
            nbformat.validate(nb)
    except Exception as e:  # invalid JSON, not a notebook structure, unreadable file
        return [Row(display, "-", 0, None, f"invalid notebook: {type(e).__name__}: {_one_line(e)}")]
    expected = expected_exercises(nb)
    if not expected:
        return [Row(display, "-", 0, None, "no graded exercises: no check(...) call found")]
    stopped, stop_cell = execute(nb, path.parent, timeout)
    results, errors = _results_and_errors(nb)
    rows, seen = [], set()
    for name, cell in expected:
        if name in seen:
            continue
        seen.add(name)
        res = results.get(name)
        if res is not None:
            status = res.get("status", "")
            if res.get("failed") and status != "not implemented yet":
                status += ": " + "; ".join(res["failed"])
            rows.append(Row(display, name, int(res.get("points", 0)), int(res.get("max", 0)), status))
            continue
        if stopped is not None and cell >= stop_cell:
            status = f"not graded: {stopped}"
        elif cell in errors:
            status = f"no score: the check cell raised {errors[cell]}"
        else:
            status = "no score: the check cell printed no result"
        rows.append(Row(display, name, 0, _max_points(name), status))
    for name, res in results.items():  # checks called in a way the source scan did not see
        if name not in seen:
            rows.append(Row(display, name, int(res.get("points", 0)), int(res.get("max", 0)), res.get("status", "")))
    return rows


def grade(path: Path, timeout: float = 120.0) -> list[Row]:
    """Grade a notebook, or every notebook under a folder."""
    if path.is_dir():
        notebooks = find_notebooks(path)
        if not notebooks:
            return [Row(str(path), "-", 0, None, "no notebooks (*.ipynb) in this folder")]
        return [row for nb in notebooks for row in grade_notebook(nb, str(path / nb.relative_to(path)), timeout)]
    return grade_notebook(path, str(path), timeout)


def format_table(rows: list[Row]) -> str:
    header = ("notebook", "exercise", "points", "max", "status")
    body = [(r.notebook, r.exercise, str(r.points), "?" if r.max is None else str(r.max), _one_line(r.status, 100))
            for r in rows]
    widths = [max(len(x[i]) for x in [header, *body]) for i in range(4)]
    lines = []
    for cols in [header, *body]:
        lines.append("  ".join(c.rjust(w) if i in (2, 3) else c.ljust(w) for i, (c, w) in
                               enumerate(zip(cols[:4], widths))) + "  " + cols[4])
    lines.insert(1, "-" * min(max(len(ln) for ln in lines), sum(widths) + 8 + 40))
    points, total = sum(r.points for r in rows), sum(r.max or 0 for r in rows)
    full = sum(r.full_marks for r in rows)
    lines.append(f"Total: {points}/{total} points; {full} of {len(rows)} rows with full marks")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minigpt.grade",
                                     description="Run exercise notebooks headless and print a score table.")
    parser.add_argument("path", help="a notebook, or a folder of notebooks (searched recursively)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows and totals to this JSON file")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                        help="per-cell time limit (default 120)")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    rows = grade(Path(args.path), args.timeout)
    print(format_table(rows))
    ok = bool(rows) and all(r.full_marks for r in rows)
    if args.json:
        report = {"path": args.path, "points": sum(r.points for r in rows), "max": sum(r.max or 0 for r in rows),
                  "full_marks": ok, "rows": [asdict(r) for r in rows]}
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
