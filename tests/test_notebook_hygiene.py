"""Hygiene of the committed notebooks: what a learner sees in their saved outputs.

Lessons (course/) and solutions (solutions/) are committed with outputs, exercises (exercises/) without.
Every rule is its own test, run on every notebook, and a failure names the notebook and the cell:

* no progress bars (tqdm widgets or their text lines) left in outputs;
* no internal fields of the model card (``targets_from_issue``, ``history``);
* no grader marker lines (``[[minigpt-grade]]``, which the grader reads from a notebook's output);
* no absolute paths of the machine that executed the notebook (/work/, /root/, /tmp/, /home/, /Users/);
* no cell that raised (error outputs);
* every code cell of a lesson or a solution executed;
* no ``<matplotlib.lines.Line2D at 0x...>``-style reprs of plot objects;
* exercises carry no outputs at all;
* no widget repr (``VBox(...)``, ``HBox(...)``, ``interactive(children=...)``) as an output's text with no figure
  beside it: a static render shows a figure or nothing, never the repr;
* no words about how the course was made ("the issue behind this lesson", "commissioned", tickets, "the seed
  articles", "the seeds'") in a lesson, an exercise, a solution or README.md: a learner has no issue and no seed
  articles. Another project's GitHub issue may be cited (``vLLM #27433``, a github.com address);
* Lesson 00's plan links every lesson in course/, and nothing that is not there;
* no lesson code cell over 40 lines (code that long belongs in ``minigpt``, tested).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXECUTED = sorted(ROOT.glob("course/*.ipynb")) + sorted(ROOT.glob("solutions/*.ipynb"))
EXERCISES = sorted(ROOT.glob("exercises/*.ipynb"))
ALL = EXECUTED + EXERCISES
LESSONS = sorted(ROOT.glob("course/*.ipynb"))
README = ROOT / "README.md"
PLAN = ROOT / "course" / "00_start_here.ipynb"
MAX_CELL_LINES = 40

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PROGRESS_MODELS = ("FloatProgressModel", "IntProgressModel")
# tqdm's text: "  0%|      | 0/272 [00:00<?, ?it/s]", "medusa heads: 0step [00:00, ?step/s]"
PROGRESS_TEXT = re.compile(r"\d+%\||\[\d+:\d\d[<,]|[?\d.]+\s?(it|s|step|tok|B|kB|MB)/s\]|it/s\]|s/it\]")
CARD_FIELDS = re.compile(r"targets_from_issue|[\"']history[\"']\s*:")
MARKER = "[[minigpt-grade]]"
ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])/(work|root|tmp|home|Users)/")
PLOT_REPR = re.compile(r"<matplotlib\.[\w.]+ (object )?at 0x[0-9a-f]+>")
WIDGET_REPR = re.compile(r"^\s*(VBox|HBox|Box|GridBox|Tab|Accordion|interactive|Output)\(")
# How the course was made is not the learner's business. "the seeds 0..n-1", "seed=0", "a seed" (of a random
# generator) are fine; so is another project's issue cited by number or address (CITATION, near the match).
PROCESS_WORDS = re.compile(r"""(?ix)
      \bseed[ -]articles?\b                        # "the seed articles", "the second seed article's FAQ"
    | \bthe\ seeds?['’]                       # "the seeds' argument", "the seed's advice"
    | \bthe\ seeds\b(?!\s*[=(\d])                 # "as the seeds say" (not "the seeds 0..n-1")
    | \b(?:the|this|our)\ issue(?:['’]s)?\b    # "the issue behind this lesson", "checked the issue's goal"
    | \bissues?\ (?:behind|that\ (?:commissioned|asked))\b
    | \bcommissioned\b
    | (?<!lottery\ )\btickets?\b
""")
CITATION = re.compile(r"#\d+|github\.com/|/issues/\d+")


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _join(text) -> str:
    return "".join(text) if isinstance(text, list) else str(text)


def output_texts(output: dict) -> list[str]:
    """The text a reader sees in one output: stream text, text/* renderings (plain, html, markdown, latex),
    JSON renderings, and an error's name, value and traceback. Images are not text and are skipped."""
    kind = output.get("output_type")
    if kind == "stream":
        return [_join(output.get("text", ""))]
    if kind == "error":
        return [output.get("ename", ""), output.get("evalue", ""), "\n".join(output.get("traceback", []))]
    texts = []
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/"):
            texts.append(_join(value))
        elif mime.endswith("json") and mime != WIDGET_VIEW:
            texts.append(json.dumps(value))
    return texts


def cell_texts(nb: dict):
    """(cell index, output text) for every text an output of a code cell shows."""
    for i, cell in enumerate(nb["cells"]):
        for output in cell.get("outputs", []):
            for text in output_texts(output):
                yield i, text


def widget_models(nb: dict) -> dict:
    """model_id -> saved widget model (``model_name``, ``state``) from the notebook's widget state, if saved."""
    return nb.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})


def _is_progress(model_id: str, models: dict, depth: int = 0) -> bool:
    model = models.get(model_id)
    if model is None or depth > 8:
        return False
    if model.get("model_name") in PROGRESS_MODELS:
        return True
    children = model.get("state", {}).get("children", [])
    return any(_is_progress(str(c).removeprefix("IPY_MODEL_"), models, depth + 1) for c in children)


def _excerpt(text: str, match: re.Match) -> str:
    return text[max(0, match.start() - 40):match.end() + 40].replace("\n", "\\n")


def _fail(path: Path, problems: list[str], rule: str) -> None:
    if problems:
        pytest.fail(f"{_name(path)}: {rule}:\n  " + "\n  ".join(problems), pytrace=False)


def _scan(path: Path, pattern: re.Pattern) -> list[str]:
    return [f"cell {i}: ...{_excerpt(text, m)}..." for i, text in cell_texts(_load(path))
            for m in [pattern.search(text)] if m]


@pytest.mark.parametrize("path", ALL, ids=_name)
def test_no_progress_bars_in_outputs(path):
    nb = _load(path)
    models = widget_models(nb)
    problems = _scan(path, PROGRESS_TEXT)
    for i, cell in enumerate(nb["cells"]):
        for output in cell.get("outputs", []):
            view = output.get("data", {}).get(WIDGET_VIEW)
            if view and _is_progress(view.get("model_id", ""), models):
                problems.append(f"cell {i}: a progress-bar widget (model {view['model_id']})")
    _fail(path, problems, "progress bars left in the outputs (call the library with progress=False)")


@pytest.mark.parametrize("path", ALL, ids=_name)
def test_no_internal_card_fields_in_outputs(path):
    _fail(path, _scan(path, CARD_FIELDS), "the model card's internal fields (targets_from_issue, history) in "
          "the outputs (show minigpt.model_card(), which keeps only the public fields)")


@pytest.mark.parametrize("path", ALL, ids=_name)
def test_no_grader_marker_lines_in_outputs(path):
    _fail(path, _scan(path, re.compile(re.escape(MARKER))), f"grader marker lines ({MARKER}) in the outputs")


@pytest.mark.parametrize("path", ALL, ids=_name)
def test_no_absolute_paths_of_this_machine_in_outputs(path):
    _fail(path, _scan(path, ABSOLUTE_PATH), "absolute paths of the executing machine in the outputs")


@pytest.mark.parametrize("path", ALL, ids=_name)
def test_no_cell_raised(path):
    problems = [f"cell {i}: {o.get('ename')}: {o.get('evalue', '')[:120]}"
                for i, cell in enumerate(_load(path)["cells"]) for o in cell.get("outputs", [])
                if o.get("output_type") == "error"]
    _fail(path, problems, "cells that raised")


@pytest.mark.parametrize("path", EXECUTED, ids=_name)
def test_every_code_cell_executed(path):
    problems = [f"cell {i}: never executed ({_join(cell['source']).strip().splitlines()[0][:60]!r})"
                for i, cell in enumerate(_load(path)["cells"])
                if cell["cell_type"] == "code" and _join(cell["source"]).strip() and cell.get("execution_count") is None]
    _fail(path, problems, "unexecuted code cells (execute the whole notebook before committing it)")


@pytest.mark.parametrize("path", ALL, ids=_name)
def test_no_plot_object_reprs_in_outputs(path):
    _fail(path, _scan(path, PLOT_REPR), "reprs of matplotlib objects (end the plotting line with plt.show() or ;)")


@pytest.mark.parametrize("path", EXERCISES, ids=_name)
def test_exercises_have_no_outputs(path):
    problems = [f"cell {i}: {len(cell['outputs'])} output(s)" for i, cell in enumerate(_load(path)["cells"])
                if cell.get("outputs")]
    _fail(path, problems, "outputs in an exercise notebook (exercises are committed without outputs)")


def _is_widget_repr(output: dict) -> bool:
    """An output whose text/plain is a widget's repr and which has no figure (image) a static render could show."""
    data = output.get("data", {})
    return bool(WIDGET_REPR.match(_join(data.get("text/plain", "")))) and not any(m.startswith("image/") for m in data)


@pytest.mark.parametrize("path", ALL, ids=_name)
def test_no_widget_reprs_in_outputs(path):
    problems = [f"cell {i}: {_join(o['data']['text/plain'])[:60]!r}..."
                for i, cell in enumerate(_load(path)["cells"]) for o in cell.get("outputs", []) if _is_widget_repr(o)]
    _fail(path, problems, "widget reprs in the outputs (display widgets with minigpt.plots.show_widget, which keeps "
          "no text/plain repr, and call the function behind them once so a figure is saved)")


def texts_of(path: Path):
    """(where, text) for everything a learner reads in a file: README.md's text; a notebook's cell sources
    (markdown, code and its comments) and output texts."""
    if path.suffix == ".md":
        yield "text", path.read_text(encoding="utf-8")
        return
    for i, cell in enumerate(_load(path)["cells"]):
        yield f"cell {i}", _join(cell.get("source", ""))
        for output in cell.get("outputs", []):
            for text in output_texts(output):
                yield f"cell {i} (output)", text


def process_words(path: Path) -> list[str]:
    """Each use of a process word in ``path``, with a little context, unless a citation stands next to it."""
    problems = []
    for where, text in texts_of(path):
        for m in PROCESS_WORDS.finditer(text):
            if "issue" in m.group(0).lower() and CITATION.search(text[max(0, m.start() - 60):m.end() + 60]):
                continue
            problems.append(f"{where}: ...{_excerpt(text, m)}...")
    return problems


@pytest.mark.parametrize("path", ALL + [README], ids=_name)
def test_no_process_words(path):
    _fail(path, process_words(path), "words about how the course was made, which a learner cannot resolve (state "
          "the goal as the course's own question; cite papers by authors, title and year)")


@pytest.mark.parametrize("path", LESSONS, ids=_name)
def test_no_lesson_code_cell_over_40_lines(path):
    problems = [f"cell {i}: {n} lines ({_join(cell['source']).strip().splitlines()[0][:60]!r})"
                for i, cell in enumerate(_load(path)["cells"]) if cell["cell_type"] == "code"
                for n in [len(_join(cell["source"]).rstrip().splitlines())] if n > MAX_CELL_LINES]
    _fail(path, problems, f"code cells over {MAX_CELL_LINES} lines (move the code into minigpt, tested, and call it)")


def plan_problems(plan: Path, lessons: list[Path]) -> list[str]:
    """What Lesson 00's plan (its markdown cell headed "## The plan") misses or lists in vain: every lesson but
    Lesson 00 itself must be linked there by file name, and every notebook linked there must exist."""
    cells = [_join(c["source"]) for c in _load(plan)["cells"] if c["cell_type"] == "markdown"]
    table = next((c for c in cells if re.search(r"^#+\s*The plan", c, re.M)), None)
    if table is None:
        return ["no markdown cell headed '## The plan'"]
    linked = set(re.findall(r"\]\(([\w.-]+\.ipynb)\)", table))
    names = {p.name for p in lessons}
    return ([f"{n} is not in the plan" for n in sorted(names - linked - {plan.name})]
            + [f"the plan links {n}, which is not in course/" for n in sorted(linked - names)])


def test_lesson_00_plan_lists_every_lesson():
    _fail(PLAN, plan_problems(PLAN, LESSONS), "Lesson 00's plan is out of date with course/")


# The rules must be able to fail: each is shown catching a made-up notebook that breaks it.

def _notebook(outputs: list[dict], execution_count=1, metadata=None) -> dict:
    return {"cells": [{"cell_type": "code", "source": ["x = 1\n"], "execution_count": execution_count,
                       "outputs": outputs, "metadata": {}}], "metadata": metadata or {}, "nbformat": 4,
            "nbformat_minor": 5}


def _stream(text: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": [text]}


BAD = {
    "test_no_progress_bars_in_outputs": _notebook([_stream("Converting:   0%|          | 0/272 [00:00<?, ?it/s]")]),
    "test_no_internal_card_fields_in_outputs": _notebook([_stream('{\n "targets_from_issue": {"met": false}\n}')]),
    "test_no_grader_marker_lines_in_outputs": _notebook([_stream('[[minigpt-grade]] {"exercise": "x"}\n')]),
    "test_no_absolute_paths_of_this_machine_in_outputs": _notebook([_stream("loaded /home/me/ckpt.pt\n")]),
    "test_no_cell_raised": _notebook([{"output_type": "error", "ename": "ValueError", "evalue": "bad",
                                       "traceback": []}]),
    "test_every_code_cell_executed": _notebook([], execution_count=None),
    "test_no_plot_object_reprs_in_outputs": _notebook([{"output_type": "execute_result", "execution_count": 1,
                                                        "metadata": {}, "data": {"text/plain": [
                                                            "[<matplotlib.lines.Line2D at 0x7f3a2c1d90>]"]}}]),
    "test_exercises_have_no_outputs": _notebook([_stream("hello\n")]),
    "test_no_widget_reprs_in_outputs": _notebook([{"output_type": "display_data", "metadata": {}, "data": {
        WIDGET_VIEW: {"model_id": "m"}, "text/plain": ["VBox(children=(IntSlider(value=8, description='k'),))"]}}]),
    "test_no_process_words": {**_notebook([]), "cells": [{"cell_type": "markdown", "metadata": {}, "source": [
        "The issue behind this lesson asked for a goal of 4 tokens per pass."]}]},
    "test_no_lesson_code_cell_over_40_lines": {**_notebook([]), "cells": [
        {"cell_type": "code", "execution_count": 1, "metadata": {}, "outputs": [],
         "source": [f"x{i} = {i}\n" for i in range(41)]}]},
}
PROGRESS_WIDGET = _notebook(
    [{"output_type": "display_data", "metadata": {}, "data": {WIDGET_VIEW: {"model_id": "box"},
                                                               "text/plain": ["HBox(...)"]}}],
    metadata={"widgets": {WIDGET_STATE: {"state": {
        "box": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_bar"]}},
        "bar": {"model_name": "FloatProgressModel", "state": {}}}}}})


@pytest.mark.parametrize("rule", sorted(BAD))
def test_each_rule_fails_on_a_notebook_that_breaks_it(rule, tmp_path):
    path = tmp_path / "bad.ipynb"
    path.write_text(json.dumps(BAD[rule]))
    with pytest.raises(pytest.fail.Exception, match="bad.ipynb"):
        globals()[rule](path)


def test_a_saved_progress_widget_is_caught_through_its_children(tmp_path):
    path = tmp_path / "widget.ipynb"
    path.write_text(json.dumps(PROGRESS_WIDGET))
    with pytest.raises(pytest.fail.Exception, match="progress-bar widget"):
        test_no_progress_bars_in_outputs(path)


@pytest.mark.parametrize("text", ["as one of the seed articles puts it", "the seeds' argument holds",
                                  "That is the seed's advice", "as the seeds say", "checked the issue's goal",
                                  "The issue that commissioned this lesson", "this ticket asks"])
def test_process_words_are_caught(text, tmp_path):
    path = tmp_path / "words.md"
    path.write_text(f"Some prose.\n{text}, and more prose.\n")
    assert process_words(path), text


def test_citations_and_random_seeds_are_not_process_words(tmp_path):
    path = tmp_path / "fine.md"
    path.write_text("This is a known issue in vLLM #27433; see the issue at github.com/vllm-project/vllm/issues/1.\n"
                    "Over seeds 0..n-1, with seed=0, the seeds (0, 1, 2) and a seed, the draft issues 4 tokens.\n")
    assert process_words(path) == []


def test_a_stale_plan_is_caught(tmp_path):
    plan = tmp_path / "00_start_here.ipynb"
    plan.write_text(json.dumps({**_notebook([]), "cells": [{"cell_type": "markdown", "metadata": {}, "source": [
        "## The plan\n", "| 01 | [One](01_one.ipynb) | x |\n", "| 03 | [Gone](03_gone.ipynb) | x |\n"]}]}))
    lessons = [plan, tmp_path / "01_one.ipynb", tmp_path / "02_two.ipynb"]
    assert plan_problems(plan, lessons) == ["02_two.ipynb is not in the plan",
                                            "the plan links 03_gone.ipynb, which is not in course/"]
    assert plan_problems(plan, lessons[:2] + [tmp_path / "03_gone.ipynb"]) == []


def test_clean_outputs_pass(tmp_path):
    path = tmp_path / "clean.ipynb"
    path.write_text(json.dumps(_notebook([_stream("32 tokens cost 3.0x one token; 0.5 FLOP/byte; 12.5% of 40 GB/s\n")])))
    for rule in BAD:
        if rule != "test_exercises_have_no_outputs":
            globals()[rule](path)
