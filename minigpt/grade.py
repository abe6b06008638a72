"""Grade exercise notebooks headless: ``python -m minigpt.grade PATH [--report DIR] [--json FILE] ...``.

PATH is one notebook or a folder (searched recursively, so a class's ``submissions/<student>/`` tree works).
Each submission is graded against its **release** notebook, the generated exercise of the same file name in
``exercises/`` (``--release DIR`` for another folder):

1. *Assemble.* The submission's code cells are matched with the release's (by the ``metadata.minigpt`` tag the
   generator writes, else by nbformat cell id, else by content). Check cells and given cells are taken from
   the release, whatever the submission holds there ("restored" when they differ or are missing); learner
   cells (those with a solution region) and cells the learner added are kept as written; a learner cell that
   was deleted is put back as the release's stub. Outputs are never read: every cell starts empty.
2. *Run.* One fresh kernel, in the notebook's folder, per-cell and per-notebook time limits, output capped per
   cell. A first cell of the grader's own starts :mod:`minigpt.grading.session`, a private copy of the checks;
   each check cell runs the release's source through it, and results come back in a file, one HMAC-signed line
   per result, accepted only from the check cell that was running (printed text is never parsed).
3. *Report.* One row per exercise of the release (a check that never ran says "not graded: <why>"), problems
   in other cells (exceptions, syntax errors with their line, timeouts), restored cells. ``--report DIR``
   writes one Markdown report per notebook, ``--json FILE`` the same detail as JSON.

Exit status: 0 only when every expected exercise of every notebook earned full marks.

This runs the learner's code with your permissions, in one process with the checks: grade untrusted
submissions inside a container (docs/grading.md, "What is protected").
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .grading import EXERCISES
from .grading.make_exercises import check_calls
from .grading.session import sign

ROOT = Path(__file__).resolve().parent.parent
STUB_LINE = re.compile(r"^[ \t]*raise NotImplementedError\(.*\)[ \t]*$")
STREAM_LIMIT = 64 * 1024  # characters of stdout + stderr kept per cell (kernel side and grader side)
RESULTS_READ_LIMIT = 4 * 1024 * 1024  # bytes of result lines read back per check cell
NOTEBOOK_SIZE_LIMIT = 100 * 1024 * 1024  # a submission file larger than this is not read (saved outputs count)


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


@dataclass
class RunCell:
    """One code cell of the notebook as graded: where its source came from and what happened when it ran."""
    role: str  # "given", "check", "learner" or "added" (a cell the learner added)
    source: str
    label: str  # e.g. "cell 7" (the release's numbering) or "an added cell after cell 6"
    exercises: list[str] = field(default_factory=list)  # for a check cell: the exercises it checks
    problem: str | None = None  # the first error line, a syntax error with its line, or a timeout


@dataclass
class Graded:
    """Everything known about one graded notebook: rows for the table, detail for the report."""
    notebook: str
    release: str | None = None
    rows: list[Row] = field(default_factory=list)
    results: dict[str, dict] = field(default_factory=dict)  # exercise -> Result.as_dict() from this run
    cells: list[RunCell] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stopped: str | None = None
    stop_index: int | None = None  # the cell (index into ``cells``; -1: the setup) where the run stopped


def _one_line(text: str, limit: int = 160) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _max_points(name: str) -> int | None:
    return EXERCISES[name].max_points if name in EXERCISES else None


def find_notebooks(path: Path) -> list[Path]:
    """The notebooks under a folder (recursively, skipping hidden folders such as .ipynb_checkpoints)."""
    found = [p for p in path.rglob("*.ipynb") if not any(part.startswith(".") for part in p.relative_to(path).parts)]
    return sorted(found)


def _read_notebook(path: Path):
    import nbformat
    with warnings.catch_warnings():  # e.g. nbformat's MissingIDFieldWarning on older notebooks: not our concern
        warnings.simplefilter("ignore")
        nb = nbformat.read(str(path), as_version=4)
        nbformat.validate(nb)
    return nb


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


# ---- 2. run: one kernel, the grader's session, capped outputs, time limits ----------------------------------

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


def _read_results(handle, secret: bytes, cell: int, names: list[str], graded: Graded) -> str | None:
    """Accept the signed result lines written while check cell ``cell`` ran; returns its error, if any."""
    data = handle.read(RESULTS_READ_LIMIT)
    handle.seek(0, os.SEEK_END)  # skip (and never hold) anything past the limit
    error, rejected = None, 0
    for line in data.splitlines():
        try:
            record = json.loads(line)
            payload, mac = str(record["payload"]), str(record["mac"])
            if not secrets.compare_digest(sign(secret, payload), mac):
                raise ValueError("bad signature")
            body = json.loads(payload)
        except (ValueError, KeyError, TypeError):
            rejected += 1
            continue
        if body.get("cell") != cell:
            rejected += 1
        elif "error" in body:
            error = str(body["error"])
        elif body.get("exercise") in names and isinstance(body.get("result"), dict):
            graded.results.setdefault(body["exercise"], body["result"])  # the check cell's own (first) call
    if rejected:
        graded.notes.append(f"{rejected} result line(s) that did not come from the running check were ignored")
    return error


def _discard(handle, graded: Graded) -> None:
    """Skip result lines written while a cell other than a check cell ran (noting how many there were)."""
    count = handle.read(RESULTS_READ_LIMIT).count("\n")
    handle.seek(0, os.SEEK_END)
    if count:
        graded.notes.append(f"{count} result line(s) written outside a check cell were ignored")


def execute(graded: Graded, cells: list[RunCell], folder: Path, timeout: float, notebook_timeout: float) -> None:
    """Run ``cells`` in one fresh kernel; fill ``graded.results``, each cell's ``problem`` and ``stopped``."""
    import nbformat
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    env = dict(os.environ)
    # the kernel must import the same minigpt as this grader, even when the package is not installed
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    quiet = logging.getLogger("minigpt.grade.kernel")
    quiet.setLevel(logging.CRITICAL)
    secret, tag = secrets.token_bytes(32), secrets.token_hex(8)
    name = f"_minigpt_grader_{tag}"
    with tempfile.TemporaryDirectory(prefix="minigpt-grade-") as private:
        results_path, handshake = Path(private) / "results.jsonl", Path(private) / "handshake.json"
        results_path.write_text("")
        handshake.write_text(json.dumps({"secret": secret.hex(), "results": str(results_path), "tag": tag,
                                         "name": name, "stream_limit": STREAM_LIMIT}))
        os.chmod(handshake, 0o600)
        setup = f"import minigpt.grading.session as _s; _s.start({str(handshake)!r}); del _s"
        sources = [setup] + [f"{name}({n}, {json.dumps(c.source)})" if c.role == "check" else c.source
                             for n, c in enumerate(cells)]
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
        client = _client_class()(nb, km=_kernel_manager(), timeout=timeout, allow_errors=True,
                                 record_timing=False, shutdown_kernel="immediate",
                                 resources={"metadata": {"path": str(folder)}}, log=quiet)
        client.kept = {}
        deadline = time.monotonic() + notebook_timeout
        current = "the grader's setup cell"
        try:
            with client.setup_kernel(env=env, cwd=str(folder), stderr=subprocess.DEVNULL, cleanup_kc=True), \
                    open(results_path, encoding="utf-8") as results:
                for index, cell in enumerate(nb.cells):
                    graded.stop_index = index - 1  # until the loop completes
                    run = cells[index - 1] if index else None
                    current = run.label if run else "the grader's setup cell"
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise CellTimeoutError(f"notebook limit before {current}")
                    client.timeout = int(max(1, min(timeout, left)))
                    by_notebook = left < timeout
                    try:
                        client.execute_cell(cell, index)
                    except CellTimeoutError:
                        graded.stopped = (f"the notebook ran past its {notebook_timeout:g} s limit in {current}"
                                          if by_notebook else f"{current} ran past the {timeout:g} s timeout")
                        if run:
                            run.problem = "ran past the time limit"
                        return
                    if run is None:
                        if _cell_problem(cell, setup):
                            graded.stopped = f"the grader's setup failed ({_cell_problem(cell, setup)})"
                            return
                        continue
                    if run.role == "check":
                        run.problem = (_read_results(results, secret, index - 1, run.exercises, graded)
                                       or _cell_problem(cell, run.source))
                    else:
                        _discard(results, graded)  # lines written outside a check cell count for nothing
                        run.problem = _cell_problem(cell, run.source)
                graded.stop_index = None
        except CellTimeoutError:
            graded.stopped = f"the notebook ran past its {notebook_timeout:g} s limit before {current}"
        except DeadKernelError:
            graded.stopped = f"the kernel died in {current}"
        except Exception as e:  # kernel failed to start, or died between cells
            graded.stopped = f"could not run the notebook ({type(e).__name__}: {_one_line(e)})"


# ---- 3. rows and reports -------------------------------------------------------------------------------------

def _row(display: str, name: str, res: dict) -> Row:
    status = str(res.get("status", ""))
    failed = [c["name"] for c in res.get("cases", []) if c.get("status") != "pass"]
    if failed and status != "not implemented yet":
        status += ": " + "; ".join(failed)
    return Row(display, name, int(res.get("points", 0)), int(res.get("max", 0)), status)


def grade_notebook(path: Path, display: str, timeout: float, notebook_timeout: float = 600.0,
                   release_dir: Path | None = None) -> Graded:
    """Assemble one submission with its release, run it, and return its rows and report detail."""
    graded = Graded(display)
    if not path.exists():
        graded.rows = [Row(display, "-", 0, None, "not found: no such file or folder")]
        return graded
    if path.suffix != ".ipynb":
        graded.rows = [Row(display, "-", 0, None, "not a notebook (expected a .ipynb file)")]
        return graded
    if path.stat().st_size > NOTEBOOK_SIZE_LIMIT:
        graded.rows = [Row(display, "-", 0, None, f"not graded: the file is larger than "
                                                  f"{NOTEBOOK_SIZE_LIMIT // 2**20} MB (clear its outputs)")]
        return graded
    try:
        submission = _read_notebook(path)
    except Exception as e:  # invalid JSON, not a notebook structure, unreadable file
        graded.rows = [Row(display, "-", 0, None, f"invalid notebook: {type(e).__name__}: {_one_line(e)}")]
        return graded
    release_dir = release_dir or ROOT / "exercises"
    release_path = release_dir / path.name
    if not release_path.is_file():
        graded.rows = [Row(display, "-", 0, None, f"not graded: no release notebook {path.name} in {release_dir}")]
        return graded
    graded.release = str(release_path)
    try:
        release = _read_notebook(release_path)
    except Exception as e:
        graded.rows = [Row(display, "-", 0, None, f"not graded: the release notebook is invalid ({_one_line(e)})")]
        return graded
    cells, graded.restored, graded.notes = assemble(submission, release)
    graded.cells = cells
    expected = [(name, n) for n, c in enumerate(cells) if c.role == "check" for name in c.exercises]
    if not expected:
        graded.rows = [Row(display, "-", 0, None, "no graded exercises: the release has no check(...) cell")]
        return graded
    execute(graded, cells, path.parent, timeout, notebook_timeout)

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
    return graded


def grade_all(path: Path, timeout: float = 120.0, notebook_timeout: float = 600.0,
              release_dir: Path | None = None) -> list[Graded]:
    """Grade a notebook, or every notebook under a folder."""
    if path.is_dir():
        notebooks = find_notebooks(path)
        if not notebooks:
            return [Graded(str(path), rows=[Row(str(path), "-", 0, None, "no notebooks (*.ipynb) in this folder")])]
        return [grade_notebook(nb, str(path / nb.relative_to(path)), timeout, notebook_timeout, release_dir)
                for nb in notebooks]
    return [grade_notebook(path, str(path), timeout, notebook_timeout, release_dir)]


def grade(path: Path, timeout: float = 120.0) -> list[Row]:
    """The table's rows for a notebook or a folder (see :func:`grade_all` for the full detail)."""
    return [row for g in grade_all(path, timeout) for row in g.rows]


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


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def format_report(g: Graded) -> str:
    """One notebook's Markdown report: total, every case with expected/received and hint, cell problems,
    restored cells, notes."""
    points, total = sum(r.points for r in g.rows), sum(r.max or 0 for r in g.rows)
    out = [f"# Grading report: {g.notebook}", "", f"**Total: {points}/{total} points.**"]
    if g.release:
        out.append(f"Graded against the release notebook `{Path(g.release).name}`.")
    if g.stopped:
        out += ["", f"The run stopped early: {g.stopped}."]
    out += ["", "## Exercises"]
    for row in g.rows:
        out += ["", f"### {row.exercise}: {row.points}/{'?' if row.max is None else row.max} points", "",
                f"Status: {row.status}"]
        res = g.results.get(row.exercise)
        if not res:
            continue
        out += ["", "| case | points | result | expected | received | hint |", "|---|---|---|---|---|---|"]
        for c in res.get("cases", []):
            verdict = "PASS" if c.get("status") == "pass" else "FAIL"
            if c.get("status") == "pass":
                cols = (c["name"], f"{c['points']}/{c['max_points']}", verdict, "", c.get("received") or
                        c.get("detail", ""), "")
            else:
                cols = (c["name"], f"{c['points']}/{c['max_points']}", verdict, c.get("expected", ""),
                        c.get("received") or c.get("detail", ""), c.get("hint", ""))
            out.append("| " + " | ".join(_md(x) for x in cols) + " |")
    problems = [c for c in g.cells if c.problem and c.role != "check"]
    out += ["", "## Problems outside the checks", ""]
    who = {"learner": "your code", "added": "a cell you added", "given": "given code"}
    out += [f"- {c.label} ({who.get(c.role, c.role)}): {c.problem}" for c in problems] or \
        ["None: every other cell ran without an error."]
    out += ["", "## Restored cells", ""]
    out += [f"- {r}" for r in g.restored] or ["None: the check cells and given cells were as released."]
    if g.notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in g.notes]
    return "\n".join(out) + "\n"


def _report_path(folder: Path, g: Graded, base: Path) -> Path:
    nb = Path(g.notebook)
    try:
        rel = nb.relative_to(base) if base.is_dir() else Path(nb.name)
    except ValueError:
        rel = Path(nb.name)
    return folder / rel.with_suffix(".md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minigpt.grade",
                                     description="Run exercise notebooks headless against their release "
                                                 "notebooks and print a score table.")
    parser.add_argument("path", help="a notebook, or a folder of notebooks (searched recursively)")
    parser.add_argument("--release", metavar="DIR", type=Path, default=None,
                        help="the folder of release notebooks to restore check and given cells from "
                             "(default: the course's exercises/)")
    parser.add_argument("--report", metavar="DIR", help="write one Markdown report per notebook into DIR")
    parser.add_argument("--json", metavar="FILE", help="also write the rows, totals and per-case detail to FILE")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                        help="per-cell time limit (default 120)")
    parser.add_argument("--notebook-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="time limit for a whole notebook (default 600)")
    args = parser.parse_args(argv)
    if args.timeout <= 0 or args.notebook_timeout <= 0:
        parser.error("--timeout and --notebook-timeout must be positive")
    if args.release is not None and not args.release.is_dir():
        parser.error(f"--release {args.release}: no such folder")
    if args.release is None and not (ROOT / "exercises").is_dir():
        parser.error(f"no release folder {ROOT / 'exercises'} (minigpt is installed without the course): "
                     "pass --release DIR")
    graded = grade_all(Path(args.path), args.timeout, args.notebook_timeout, args.release)
    rows = [row for g in graded for row in g.rows]
    print(format_table(rows))
    ok = bool(rows) and all(r.full_marks for r in rows)
    if args.report:
        for g in graded:
            target = _report_path(Path(args.report), g, Path(args.path))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(format_report(g), encoding="utf-8")
    if args.json:
        report = {"path": args.path, "points": sum(r.points for r in rows), "max": sum(r.max or 0 for r in rows),
                  "full_marks": ok, "rows": [asdict(r) for r in rows],
                  "notebooks": [{"notebook": g.notebook, "release": g.release, "stopped": g.stopped,
                                 "exercises": [{**asdict(r), "cases": g.results.get(r.exercise, {}).get("cases", [])}
                                               for r in g.rows],
                                 "cell_problems": [{"cell": c.label, "role": c.role, "problem": c.problem}
                                                   for c in g.cells if c.problem],
                                 "restored": g.restored, "notes": g.notes} for g in graded]}
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
