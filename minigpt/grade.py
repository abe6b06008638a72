"""Grade exercise notebooks headless: ``python -m minigpt.grade PATH [--jobs N] [--csv FILE] [--report DIR] ...``.

PATH is one notebook or a folder (searched recursively, hidden folders skipped), e.g. a class's
``submissions/<student>/...``, nbgrader's ``submitted/<student>/<assignment>/...`` or a flat folder of
``<student>_<notebook>.ipynb`` files. Each submission is graded against its **release** notebook in ``exercises/``
(``--release DIR`` for another folder), found by the exercise identity in its metadata, else its cells' tags,
else its file name (:mod:`minigpt.grading.submissions`; the report says which rule matched and whose it is):

1. *Assemble.* The submission's code cells are matched with the release's (by the ``metadata.minigpt`` tag the
   generator writes, else by nbformat cell id, else by content). Check cells and given cells are taken from
   the release, whatever the submission holds there ("restored" when they differ or are missing); learner
   cells (those with a solution region) and cells the learner added are kept as written; a learner cell that
   was deleted is put back as the release's stub. Outputs are never read: every cell starts empty.
2. *Run.* One fresh kernel per notebook, in the notebook's folder, per-cell and per-notebook time limits, output
   capped per cell, an address-space limit (``--memory-limit``). Each restored check cell connects to the
   **judge** in this process (:mod:`minigpt.grading.judge`), which runs the exercise's cases here: the kernel only
   calls the learner's function on the inputs the judge sends and returns the values as plain data; references
   and comparisons never run in the kernel. ``--jobs N`` grades N notebooks at a time, each with its own kernel
   and judge (in N worker processes), printing one progress line per notebook.
3. *Report.* One row per exercise of the release (a check that never ran says "not graded: <why>"), problems
   in other cells (exceptions, syntax errors with their line, timeouts), restored cells. ``--report DIR``
   writes one Markdown report per notebook, ``--json FILE`` the same detail, ``--csv FILE`` one row per
   student and one column per exercise, ``--gradescope FILE`` Gradescope's ``results.json`` and
   ``--github-classroom FILE`` the result GitHub Classroom's reporter reads (:mod:`minigpt.grading.reports`).

Exit status: 0 only when every expected exercise of every notebook earned full marks.

The learner's code runs with your permissions (in its own process): docs/grading.md, "What is protected".
"""
from __future__ import annotations

import argparse
import base64
import json
import logging
import multiprocessing
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from .grading import EXERCISES
from .grading.judge import Judge
from .grading.make_exercises import check_calls
from .grading.reports import (Graded, Row, RunCell, as_json, class_csv, classroom_result, format_report,
                              format_table, gradescope_results, one_line)
from .grading.submissions import Release, load_releases, match_release, read_notebook, student_of

ROOT = Path(__file__).resolve().parent.parent
STUB_LINE = re.compile(r"^[ \t]*raise NotImplementedError\(.*\)[ \t]*$")
STREAM_LIMIT = 64 * 1024  # characters of stdout + stderr kept per cell (kernel side and grader side)
NOTEBOOK_SIZE_LIMIT = 100 * 1024 * 1024  # a submission file larger than this is not read (saved outputs count)
MEMORY_LIMIT_MB = 6144  # address space of one kernel (Linux); torch alone reserves about 1.5 GB of it
KERNEL_STARTS = 3  # tries to start a notebook's kernel before it is reported as not run


def _one_line(text: str, limit: int = 160) -> str:
    return one_line(text, limit)


def _max_points(name: str) -> int | None:
    return EXERCISES[name].max_points if name in EXERCISES else None


def find_notebooks(path: Path) -> list[Path]:
    """The notebooks under a folder (recursively, skipping hidden folders such as .ipynb_checkpoints)."""
    found = [p for p in path.rglob("*.ipynb") if not any(part.startswith(".") for part in p.relative_to(path).parts)]
    return sorted(found)


# ---- 1. assemble: the release's protected cells, the learner's cells ----------------------------------------

def cell_role(cell) -> str:
    """A release cell's role: the generator's tag, or (for an untagged release) what its content shows."""
    role = (cell.get("metadata", {}).get("minigpt") or {}).get("role")
    if role in ("given", "check", "learner"):
        return role
    if any(STUB_LINE.match(line) for line in cell.source.split("\n")):
        return "learner"
    return "check" if check_calls(cell.source) else "given"


def _lines(source: str) -> list[str]:
    lines = [line.rstrip() for line in source.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def fits_template(release_source: str, source: str) -> bool:
    """Whether ``source`` is ``release_source`` with each stub line replaced by any lines (the learner's code):
    the text outside the solution regions is unchanged (trailing whitespace ignored)."""
    segments, current = [], []
    for line in _lines(release_source):
        if STUB_LINE.match(line):
            segments.append(current)
            current = []
        else:
            current.append(line)
    segments.append(current)
    lines = _lines(source)
    if len(segments) == 1:
        return lines == segments[0]
    head, tail = segments[0], segments[-1]
    end = len(lines) - len(tail)
    if lines[: len(head)] != head or end < len(head) or lines[end:] != tail:
        return False
    pos = len(head)
    for seg in segments[1:-1]:
        if not seg:
            continue
        found = next((i for i in range(pos, end - len(seg) + 1) if lines[i: i + len(seg)] == seg), None)
        if found is None:
            return False
        pos = found + len(seg)
    return True


def assemble(submission, release) -> tuple[list[RunCell], list[str], list[str]]:
    """The code cells to run, in order, plus (restored cells, notes) for the report. See the module docstring."""
    rel = [(i, c) for i, c in enumerate(release.cells) if c.cell_type == "code"]
    sub = [(j, c) for j, c in enumerate(submission.cells) if c.cell_type == "code"]
    roles = {i: cell_role(c) for i, c in rel}
    match: dict[int, int] = {}  # release cell index -> submission cell index
    taken: set[int] = set()

    def claim(i: int, j: int) -> None:
        match[i] = j
        taken.add(j)

    def tag(c) -> str | None:
        return (c.get("metadata", {}).get("minigpt") or {}).get("cell")

    for key in (tag, lambda c: c.get("id")):  # by the generator's tag, then by nbformat cell id
        for i, rc in rel:
            if i in match or not key(rc):
                continue
            j = next((j for j, sc in sub if j not in taken and key(sc) == key(rc)), None)
            if j is not None:
                claim(i, j)
    for i, rc in rel:  # by content
        if i in match or not rc.source.strip():
            continue
        if roles[i] == "learner":
            j = next((j for j, sc in sub if j not in taken and fits_template(rc.source, sc.source)), None)
        else:
            j = next((j for j, sc in sub if j not in taken and _lines(sc.source) == _lines(rc.source)), None)
        if j is not None:
            claim(i, j)

    sub_cells = dict(sub)
    anchor, last = {}, -1  # an added cell runs after the release cell matched just before it in the submission
    by_sub = {j: i for i, j in match.items()}
    for j, _ in sub:
        if j in by_sub:
            last = by_sub[j]
        else:
            anchor.setdefault(last, []).append(j)

    cells, restored, notes = [], [], []
    for j in anchor.get(-1, []):
        cells.append(RunCell("added", sub_cells[j].source, "an added cell before the first cell"))
    for i, rc in rel:
        label, role = f"cell {i + 1}", roles[i]
        names = check_calls(rc.source) if role == "check" else []
        what = f"check `{', '.join(names)}`" if names else "given code" if role == "given" else "your code"
        j = match.get(i)
        if role == "learner":
            if j is None:
                cells.append(RunCell("learner", rc.source, label))
                notes.append(f"{label} ({what}) is missing from the submission: the release's stub was put back "
                             "(not implemented)")
            else:
                cells.append(RunCell("learner", sub_cells[j].source, label))
                if not fits_template(rc.source, sub_cells[j].source):
                    notes.append(f"{label} ({what}) was edited outside its solution region: kept as written")
        else:
            cells.append(RunCell(role, rc.source, label, names))
            if not rc.source.strip():
                pass  # an empty cell: nothing to restore
            elif j is None:
                restored.append(f"{label} ({what}): missing or edited in the submission, the release's version ran")
            elif _lines(sub_cells[j].source) != _lines(rc.source):
                restored.append(f"{label} ({what}): edited in the submission, the release's version ran")
        for k in anchor.get(i, []):
            cells.append(RunCell("added", sub_cells[k].source, f"an added cell after cell {i + 1}"))
    return cells, restored, notes


# ---- 2. run: one kernel, the judge in this process, capped outputs, time limits ----------------------------

def _kernel_manager():
    """A kernel manager that starts ipykernel with *this* Python, whatever kernels Jupyter has registered (the
    same idea as nbval's --nbval-current-env): the notebook sees the grader's torch and minigpt."""
    import ipykernel.kernelspec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class ThisPython(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            spec = ipykernel.kernelspec.get_kernel_dict()
            spec["argv"] = [*spec["argv"], "--HistoryManager.enabled=False"]  # no input history on disk
            return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES, **spec)

    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ThisPython())


def _client_class():
    from nbclient import NotebookClient
    from nbformat.v4 import output_from_msg

    class CappedClient(NotebookClient):
        """Keeps at most ``STREAM_LIMIT`` characters of stream output per cell, the text of rich outputs only
        (no images: the executed notebook is not saved), and error outputs with a short traceback."""

        kept: dict = {}

        def output(self, outs, msg, display_id, cell_index):
            kind = msg["msg_type"]
            try:
                out = output_from_msg(msg)
            except ValueError:
                return None
            if kind == "stream":
                used = self.kept.get(cell_index, 0)
                room = STREAM_LIMIT - used
                self.kept[cell_index] = used + len(out.text)
                if room <= 0:
                    return None
                if len(out.text) > room:
                    out.text = out.text[:room] + "\n[the grader dropped the rest of this cell's output]\n"
            elif kind in ("display_data", "execute_result"):
                out.data = {"text/plain": str(out.data.get("text/plain", ""))[:2000]}
                if len(outs) > 100:
                    return None
            elif kind == "error":
                out.evalue = str(out.evalue)[:2000]
                out.traceback = [str(t)[:2000] for t in out.traceback[-20:]]
            outs.append(out)
            return out

        def handle_comm_msg(self, outs, msg, cell_index):
            return None  # widget state is not needed to grade, and a learner could flood it

    return CappedClient


def _syntax_error(source: str) -> str | None:
    """'syntax error at line L: message: `text`' if the cell does not compile (IPython magics allowed)."""
    from IPython.core.inputtransformer2 import TransformerManager
    try:
        compile(TransformerManager().transform_cell(source), "<cell>", "exec")
    except SyntaxError as e:
        text = f": `{e.text.strip()}`" if e.text and e.text.strip() else ""
        return f"{type(e).__name__} at line {e.lineno}: {e.msg}{text}"
    except Exception:  # the transformer itself failed: leave it to the kernel's own message
        return None
    return None


def _cell_problem(cell, source: str) -> str | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            ename = out.get("ename", "Error")
            if ename in ("SyntaxError", "IndentationError", "TabError"):
                return _syntax_error(source) or f"{ename}: {_one_line(out.get('evalue', ''))}"
            return f"{ename}: {_one_line(out.get('evalue', ''))}".rstrip(": ")
    return None


class _NoKernel(Exception):
    """The kernel did not start: nothing of the notebook ran (its cause is the error that said so)."""


def execute(graded: Graded, cells: list[RunCell], folder: Path, timeout: float, notebook_timeout: float,
            memory_limit_mb: int = MEMORY_LIMIT_MB) -> None:
    """Run ``cells`` in one fresh kernel, each check cell against a :class:`~minigpt.grading.judge.Judge` in this
    process; fill ``graded.results``, each cell's ``problem`` and ``stopped``. A kernel that fails to start (on a
    machine busy with a class's other jobs, it may not answer in time) is started again, up to ``KERNEL_STARTS``
    times: none of the notebook's code has run then, so nothing a learner wrote can cause or use it."""
    for _ in range(KERNEL_STARTS):
        try:
            return _execute_once(graded, cells, folder, timeout, notebook_timeout, memory_limit_mb)
        except _NoKernel as e:
            error = e.__cause__
    graded.stopped = f"could not run the notebook ({type(error).__name__}: {_one_line(error)})"


def _execute_once(graded: Graded, cells: list[RunCell], folder: Path, timeout: float, notebook_timeout: float,
                  memory_limit_mb: int) -> None:
    """:func:`execute`, one kernel; raises :class:`_NoKernel` if that kernel did not start."""
    import nbformat
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    env = dict(os.environ)
    # the kernel must import the same minigpt as this grader, even when the package is not installed
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")  # one kernel per job: N jobs should use N cores, not N x all of them
    quiet = logging.getLogger("minigpt.grade.kernel")
    quiet.setLevel(logging.CRITICAL)
    token, name = secrets.token_hex(16), f"_minigpt_grader_{secrets.token_hex(8)}"
    with tempfile.TemporaryDirectory(prefix="minigpt-grade-") as private:
        os.chmod(private, 0o700)
        handshake = Path(private) / "handshake.json"
        handshake.write_text(json.dumps({"token": token, "name": name, "stream_limit": STREAM_LIMIT,
                                         "memory_limit_mb": memory_limit_mb}))
        os.chmod(handshake, 0o600)
        judge = Judge(Path(private), token)
        setup = f"import minigpt.grading.session as _s; _s.start({str(handshake)!r}); del _s"
        sources = [setup] + ["" if c.role == "check" else c.source for c in cells]  # check cells: set when run
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
        client = _client_class()(nb, km=_kernel_manager(), timeout=timeout, allow_errors=True,
                                 record_timing=False, shutdown_kernel="immediate",
                                 resources={"metadata": {"path": str(folder)}}, log=quiet)
        client.kept = {}
        deadline = time.monotonic() + notebook_timeout
        current = "the grader's setup cell"
        started = False
        try:
            with client.setup_kernel(env=env, cwd=str(folder), stderr=subprocess.DEVNULL, cleanup_kc=True):
                started = True
                for index, cell in enumerate(nb.cells):
                    graded.stop_index = index - 1  # until the loop completes
                    run = cells[index - 1] if index else None
                    current = run.label if run else "the grader's setup cell"
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise CellTimeoutError(f"notebook limit before {current}")
                    client.timeout = int(max(1, min(timeout, left)))
                    by_notebook = left < timeout
                    if run is not None and run.role == "check":
                        address = judge.open_cell(index - 1, run.label, run.exercises)
                        cell.source = f"{name}({index - 1}, {json.dumps(run.source)}, {json.dumps(address)})"
                    try:
                        client.execute_cell(cell, index)
                    except CellTimeoutError:
                        graded.stopped = (f"the notebook ran past its {notebook_timeout:g} s limit in {current}"
                                          if by_notebook else f"{current} ran past the {timeout:g} s timeout")
                        if run:
                            run.problem = "ran past the time limit"
                        return
                    finally:
                        judge.close_cell()
                    if run is None:
                        if _cell_problem(cell, setup):
                            graded.stopped = f"the grader's setup failed ({_cell_problem(cell, setup)})"
                            return
                        continue
                    run.problem = _cell_problem(cell, run.source)
                graded.stop_index = None
        except CellTimeoutError:
            graded.stopped = f"the notebook ran past its {notebook_timeout:g} s limit before {current}"
        except DeadKernelError as e:
            if not started:
                raise _NoKernel() from e
            graded.stopped = f"the kernel died in {current}"
        except Exception as e:  # kernel failed to start, or died between cells
            if not started:
                raise _NoKernel() from e
            graded.stopped = f"could not run the notebook ({type(e).__name__}: {_one_line(e)})"
        finally:
            judge.close_cell()
            graded.results = dict(judge.results)
            graded.notes += judge.notes


# ---- 3. rows, reports, a class --------------------------------------------------------------------------------

def _row(display: str, name: str, res: dict) -> Row:
    status = str(res.get("status", ""))
    failed = [c["name"] for c in res.get("cases", []) if c.get("status") != "pass"]
    if failed and status != "not implemented yet":
        status += ": " + "; ".join(failed)
    return Row(display, name, int(res.get("points", 0)), int(res.get("max", 0)), status)


def release_exercises(release_nb) -> list[str]:
    """The exercises a release notebook checks, in the order of its check cells."""
    names = [n for c in release_nb.cells if c.cell_type == "code" and cell_role(c) == "check"
             for n in check_calls(c.source)]
    return list(dict.fromkeys(names))


def grade_notebook(path: Path, display: str, timeout: float, notebook_timeout: float = 600.0,
                   release_dir: Path | None = None, releases: list[Release] | None = None, root: Path | None = None,
                   memory_limit_mb: int = MEMORY_LIMIT_MB) -> Graded:
    """Find the release of one submission, assemble the two, run it, and return its rows and report detail."""
    started = time.monotonic()
    graded = Graded(display)
    try:
        _grade_into(graded, Path(path), display, timeout, notebook_timeout, release_dir, releases, root,
                    memory_limit_mb)
    finally:
        graded.seconds = time.monotonic() - started
    return graded


def _grade_into(graded: Graded, path: Path, display: str, timeout: float, notebook_timeout: float,
                release_dir: Path | None, releases: list[Release] | None, root: Path | None,
                memory_limit_mb: int) -> None:
    if not path.exists():
        graded.rows = [Row(display, "-", 0, None, "not found: no such file or folder")]
        return
    if path.suffix != ".ipynb":
        graded.rows = [Row(display, "-", 0, None, "not a notebook (expected a .ipynb file)")]
        return
    if path.stat().st_size > NOTEBOOK_SIZE_LIMIT:
        graded.rows = [Row(display, "-", 0, None, f"not graded: the file is larger than "
                                                  f"{NOTEBOOK_SIZE_LIMIT // 2**20} MB (clear its outputs)")]
        return
    release_dir = release_dir or ROOT / "exercises"
    releases = load_releases(release_dir) if releases is None else releases
    try:
        submission = read_notebook(path)
    except Exception as e:  # invalid JSON, not a notebook structure, unreadable file
        _, graded.matched_by = match_release(path, None, releases)
        graded.student = student_of(path, root, _)
        graded.rows = [Row(display, "-", 0, None, f"invalid notebook: {type(e).__name__}: {_one_line(e)}")]
        return
    release_info, graded.matched_by = match_release(path, submission, releases)
    graded.student = student_of(path, root, release_info)
    if release_info is None:
        graded.rows = [Row(display, "-", 0, None, f"not graded: {graded.matched_by} (releases in {release_dir})")]
        return
    graded.release = str(release_info.path)
    try:
        release = read_notebook(release_info.path)
    except Exception as e:
        graded.rows = [Row(display, "-", 0, None, f"not graded: the release notebook is invalid ({_one_line(e)})")]
        return
    cells, graded.restored, graded.notes = assemble(submission, release)
    graded.cells = cells
    expected = [(name, n) for n, c in enumerate(cells) if c.role == "check" for name in c.exercises]
    if not expected:
        graded.rows = [Row(display, "-", 0, None, "no graded exercises: the release has no check(...) cell")]
        return
    execute(graded, cells, path.parent, timeout, notebook_timeout, memory_limit_mb)

    for name, n in dict.fromkeys(expected):  # one row per exercise, in the order of the first check
        if name in {r.exercise for r in graded.rows}:
            continue
        if name in graded.results:
            graded.rows.append(_row(display, name, graded.results[name]))
            continue
        cell = cells[n]
        if cell.problem and cell.problem != "ran past the time limit":
            status = f"no score: the check cell raised {cell.problem}"
            earlier = [c for c in cells[:n] if c.role in ("learner", "added") and c.problem]
            if earlier and cell.problem.startswith("NameError"):
                status += f" (after {earlier[-1].label} failed: {earlier[-1].problem})"
        elif graded.stopped is not None and (graded.stop_index is None or n >= graded.stop_index):
            status = f"not graded: {graded.stopped}"
        else:
            status = "no score: the check cell recorded no result"
        graded.rows.append(Row(display, name, 0, _max_points(name), status))


def _progress(done: int, total: int, g: Graded) -> str:
    what = f"{g.points}/{g.max_points} points" if g.release else (g.rows[0].status if g.rows else "nothing graded")
    how = f"; student {g.student}, matched by {g.matched_by}" if g.release else ""
    return f"[{done}/{total}] {g.notebook}: {one_line(what, 80)}{how} ({g.seconds:.1f} s)"


def _grade_task(kwargs: dict) -> Graded:
    return grade_notebook(**kwargs)


def grade_all(path: Path, timeout: float = 120.0, notebook_timeout: float = 600.0,
              release_dir: Path | None = None, jobs: int = 1, memory_limit_mb: int = MEMORY_LIMIT_MB,
              progress=None) -> list[Graded]:
    """Grade a notebook, or every notebook under a folder, ``jobs`` at a time (each in a worker process with its
    own kernel and judge). ``progress(line)`` gets one line per notebook as it finishes. Returns the notebooks in
    path order."""
    path = Path(path)
    release_dir = release_dir or ROOT / "exercises"
    releases = load_releases(release_dir)
    if path.is_dir():
        notebooks = find_notebooks(path)
        if not notebooks:
            return [Graded(str(path), rows=[Row(str(path), "-", 0, None, "no notebooks (*.ipynb) in this folder")])]
        tasks = [dict(path=nb, display=str(path / nb.relative_to(path)), root=path) for nb in notebooks]
    else:
        tasks = [dict(path=path, display=str(path), root=None)]
    common = dict(timeout=timeout, notebook_timeout=notebook_timeout, release_dir=release_dir, releases=releases,
                  memory_limit_mb=memory_limit_mb)
    tasks = [{**t, **common} for t in tasks]
    results: list[Graded | None] = [None] * len(tasks)
    if jobs <= 1 or len(tasks) == 1:
        for i, task in enumerate(tasks):
            results[i] = _grade_task(task)
            if progress:
                progress(_progress(i + 1, len(tasks), results[i]))
        return results
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_grade_task, task): i for i, task in enumerate(tasks)}
        for done, future in enumerate(as_completed(futures), start=1):
            i = futures[future]
            try:
                results[i] = future.result()
            except Exception as e:  # a worker that died (killed for memory, ...): the notebook gets a row
                t = tasks[i]
                results[i] = Graded(t["display"], rows=[Row(t["display"], "-", 0, None, f"not graded: the worker "
                                                             f"failed ({type(e).__name__}: {_one_line(e)})")])
            if progress:
                progress(_progress(done, len(tasks), results[i]))
    return results


def grade(path: Path, timeout: float = 120.0) -> list[Row]:
    """The table's rows for a notebook or a folder (see :func:`grade_all` for the full detail)."""
    return [row for g in grade_all(path, timeout) for row in g.rows]


def missing(graded: list[Graded], release_dir: Path, required: list[str]) -> list[Graded]:
    """A "not submitted" entry, with a 0-point row per exercise, for each required release notebook (``["all"]``:
    every release notebook in ``release_dir``) that no submission matched."""
    releases = load_releases(release_dir)
    wanted = releases if "all" in required else [r for r in releases if r.identity in required or
                                                   r.path.stem in required]
    have = {Path(g.release).resolve() for g in graded if g.release}
    out = []
    for r in wanted:
        if r.path.resolve() in have:
            continue
        names = release_exercises(read_notebook(r.path))
        display = f"{r.path.name} (not submitted)"
        out.append(Graded(display, release=str(r.path), matched_by="required", student=graded[0].student
                          if graded else "-", rows=[Row(display, n, 0, _max_points(n), "not submitted")
                                                    for n in names]))
    return out


def _report_path(folder: Path, g: Graded, base: Path) -> Path:
    nb = Path(g.notebook)
    try:
        rel = nb.relative_to(base) if base.is_dir() else Path(nb.name)
    except ValueError:
        rel = Path(nb.name)
    return folder / rel.with_suffix(".md")


def _write(path: str, text: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minigpt.grade",
                                     description="Run exercise notebooks headless against their release "
                                                 "notebooks and print a score table.")
    parser.add_argument("path", help="a notebook, or a folder of notebooks (searched recursively)")
    parser.add_argument("--release", metavar="DIR", type=Path, default=None,
                        help="the folder of release notebooks to restore check and given cells from "
                             "(default: the course's exercises/)")
    parser.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                        help="grade N notebooks at a time, each with its own kernel and judge (0: one per core)")
    parser.add_argument("--report", metavar="DIR", help="write one Markdown report per notebook into DIR")
    parser.add_argument("--json", metavar="FILE", help="also write the rows, totals and per-case detail to FILE")
    parser.add_argument("--csv", metavar="FILE", help="write a class table: one row per student, one column per "
                                                      "exercise, the total and the maximum")
    parser.add_argument("--gradescope", metavar="FILE", help="write Gradescope's results.json to FILE "
                                                             "(implies --require all)")
    parser.add_argument("--github-classroom", metavar="FILE",
                        help="append `result=<base64 JSON>` for GitHub Classroom's grading reporter to FILE (in a "
                             "workflow: $GITHUB_OUTPUT; implies --require all)")
    parser.add_argument("--require", nargs="+", metavar="NOTEBOOK", default=None,
                        help="release notebooks (stems, or `all`) that must be submitted: a missing one gets 0 "
                             "points, \"not submitted\"")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                        help="per-cell time limit (default 120)")
    parser.add_argument("--notebook-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="time limit for a whole notebook (default 600)")
    parser.add_argument("--memory-limit", type=int, default=MEMORY_LIMIT_MB, metavar="MB",
                        help=f"address space of each kernel, Linux only (default {MEMORY_LIMIT_MB}; 0: none)")
    args = parser.parse_args(argv)
    if args.timeout <= 0 or args.notebook_timeout <= 0:
        parser.error("--timeout and --notebook-timeout must be positive")
    if args.jobs < 0 or args.memory_limit < 0:
        parser.error("--jobs and --memory-limit must be 0 or more")
    if args.release is not None and not args.release.is_dir():
        parser.error(f"--release {args.release}: no such folder")
    if args.release is None and not (ROOT / "exercises").is_dir():
        parser.error(f"no release folder {ROOT / 'exercises'} (minigpt is installed without the course): "
                     "pass --release DIR")
    release_dir = args.release or ROOT / "exercises"
    jobs = args.jobs or os.cpu_count() or 1
    started = time.monotonic()
    graded = grade_all(Path(args.path), args.timeout, args.notebook_timeout, release_dir, jobs, args.memory_limit,
                       progress=lambda line: print(line, file=sys.stderr, flush=True))
    required = args.require or (["all"] if args.gradescope or args.github_classroom else [])
    if required:
        graded += missing(graded, release_dir, required)
    rows = [row for g in graded for row in g.rows]
    print(format_table(rows))
    ok = bool(rows) and all(r.full_marks for r in rows)
    if args.report:
        for g in graded:
            _write(str(_report_path(Path(args.report), g, Path(args.path))), format_report(g))
    if args.json:
        _write(args.json, json.dumps(as_json(args.path, graded), indent=1) + "\n")
    if args.csv:
        _write(args.csv, class_csv(graded, list(EXERCISES)))
    if args.gradescope:
        _write(args.gradescope, json.dumps(gradescope_results(graded, time.monotonic() - started), indent=1) + "\n")
    if args.github_classroom:
        encoded = base64.b64encode(json.dumps(classroom_result(graded)).encode()).decode("ascii")
        with open(args.github_classroom, "a", encoding="utf-8") as out:
            out.write(f"result={encoded}\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
