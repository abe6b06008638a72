"""What the grading command knows about a graded notebook, and the forms an instructor reads it in.

:class:`Graded` holds one notebook's rows (one per exercise of its release), the per-case detail, the cells that
raised, the restored cells, the student and the rule that matched the release. From a list of them:

* :func:`format_table`: the terminal table; :func:`format_report`: one Markdown report per notebook;
* :func:`as_json`: the same detail as JSON (``--json``);
* :func:`class_csv`: one row per student, one column per exercise, then the total and the maximum (``--csv``);
* :func:`gradescope_results`: Gradescope's ``results.json`` (``--gradescope``): a test per case with its score,
  maximum, output and visibility (format: the Gradescope autograder specifications, "Output format");
* :func:`classroom_result`: the result a GitHub Classroom reporter reads (``--github-classroom``): the JSON
  its ``autograding-grading-reporter`` decodes from ``<RUNNER>_RESULTS`` (``max_score`` and a ``score`` per
  test, which it adds up into the points it reports).
"""
from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, field
from pathlib import Path


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
    student: str = "-"
    matched_by: str | None = None  # the rule that matched the release notebook (see .submissions)
    rows: list[Row] = field(default_factory=list)
    results: dict[str, dict] = field(default_factory=dict)  # exercise -> Result.as_dict() from this run
    cells: list[RunCell] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stopped: str | None = None
    stop_index: int | None = None  # the cell (index into ``cells``; -1: the setup) where the run stopped
    seconds: float = 0.0

    @property
    def points(self) -> int:
        return sum(r.points for r in self.rows)

    @property
    def max_points(self) -> int:
        return sum(r.max or 0 for r in self.rows)


def one_line(text: str, limit: int = 160) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def format_table(rows: list[Row]) -> str:
    header = ("notebook", "exercise", "points", "max", "status")
    body = [(r.notebook, r.exercise, str(r.points), "?" if r.max is None else str(r.max), one_line(r.status, 100))
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
    out = [f"# Grading report: {g.notebook}", "", f"**Total: {g.points}/{g.max_points} points.**"]
    if g.release:
        out.append(f"Graded against the release notebook `{Path(g.release).name}` (matched by {g.matched_by}); "
                   f"student: {g.student}.")
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


def as_json(path: str, graded: list[Graded]) -> dict:
    """The table's rows, the totals and each notebook's detail, as the ``--json`` file holds them."""
    rows = [row for g in graded for row in g.rows]
    return {"path": path, "points": sum(r.points for r in rows), "max": sum(r.max or 0 for r in rows),
            "full_marks": bool(rows) and all(r.full_marks for r in rows), "rows": [asdict(r) for r in rows],
            "notebooks": [{"notebook": g.notebook, "student": g.student, "release": g.release,
                           "matched_by": g.matched_by, "stopped": g.stopped, "seconds": round(g.seconds, 2),
                           "exercises": [{**asdict(r), "cases": g.results.get(r.exercise, {}).get("cases", [])}
                                         for r in g.rows],
                           "cell_problems": [{"cell": c.label, "role": c.role, "problem": c.problem}
                                             for c in g.cells if c.problem],
                           "restored": g.restored, "notes": g.notes} for g in graded]}


def class_csv(graded: list[Graded], exercises: list[str]) -> str:
    """One row per student, one column per exercise (in ``exercises``' order, those graded at all), then
    ``total`` and ``max``. A student's exercise without a submission is left empty (and counts 0 in the total);
    where a student submitted the same exercise twice, the higher score counts."""
    seen = {r.exercise for g in graded for r in g.rows if r.max is not None}
    columns = [e for e in exercises if e in seen]
    maxima = {r.exercise: r.max for g in graded for r in g.rows if r.max is not None}
    table: dict[str, dict[str, int]] = {}
    for g in graded:
        scores = table.setdefault(g.student, {})
        for r in g.rows:
            if r.exercise in maxima:
                scores[r.exercise] = max(scores.get(r.exercise, 0), r.points)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["student", *columns, "total", "max"])
    total_max = sum(maxima[c] for c in columns)
    for student in sorted(table):
        scores = table[student]
        writer.writerow([student, *(scores.get(c, "") for c in columns), sum(scores.get(c, 0) for c in columns),
                         total_max])
    return out.getvalue()


def _case_output(case: dict) -> str:
    if case.get("status") == "pass":
        return f"PASS: {case.get('received') or case.get('detail', '')}"
    text = f"FAIL: expected {case.get('expected', '')}\nreceived {case.get('received', '')}"
    return text + (f"\nhint: {case['hint']}" if case.get("hint") else "")


def _tests(graded: list[Graded]):
    """(name, score, max_score, passed, output) per case, or per exercise row that has no case detail."""
    for g in graded:
        where = Path(g.notebook).name
        for row in g.rows:
            cases = g.results.get(row.exercise, {}).get("cases", [])
            if not cases:
                yield f"{where}: {row.exercise}", row.points, row.max or 0, row.full_marks, row.status
            for c in cases:
                yield (f"{where}: {row.exercise}: {c.get('name', '')}", int(c.get("points", 0)),
                       int(c.get("max_points", 0)), c.get("status") == "pass", _case_output(c))


def gradescope_results(graded: list[Graded], seconds: float, visibility: str = "visible") -> dict:
    """Gradescope's ``results.json``: the total score, a test per case (name, score, max_score, status, output,
    visibility) and the table as the submission's output."""
    rows = [r for g in graded for r in g.rows]
    tests = [{"name": name, "score": float(score), "max_score": float(top), "status": "passed" if ok else "failed",
              "output": output, "visibility": visibility} for name, score, top, ok, output in _tests(graded)]
    return {"score": float(sum(r.points for r in rows)), "execution_time": int(round(seconds)),
            "output": format_table(rows) if rows else "no notebook was graded", "visibility": visibility,
            "stdout_visibility": "hidden", "tests": tests}


def classroom_result(graded: list[Graded]) -> dict:
    """The result GitHub Classroom's grading reporter reads: ``status``, ``max_score`` and a test per case
    with its ``score`` (the reporter adds the scores up into "Points x/y")."""
    tests = [{"name": name, "status": "pass" if ok else "fail", "score": score, "message": "" if ok else output,
              "line_no": 0, "execution_time": "0s", "test_code": ""} for name, score, top, ok, output in _tests(graded)]
    rows = [r for g in graded for r in g.rows]
    ok = bool(rows) and all(r.full_marks for r in rows)
    return {"version": 1, "status": "pass" if ok else "fail", "max_score": sum(r.max or 0 for r in rows),
            "tests": tests}
