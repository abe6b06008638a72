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
* exercises carry no outputs at all.
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

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PROGRESS_MODELS = ("FloatProgressModel", "IntProgressModel")
# tqdm's text: "  0%|      | 0/272 [00:00<?, ?it/s]", "medusa heads: 0step [00:00, ?step/s]"
PROGRESS_TEXT = re.compile(r"\d+%\||\[\d+:\d\d[<,]|[?\d.]+\s?(it|s|step|tok|B|kB|MB)/s\]|it/s\]|s/it\]")
CARD_FIELDS = re.compile(r"targets_from_issue|[\"']history[\"']\s*:")
MARKER = "[[minigpt-grade]]"
ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])/(work|root|tmp|home|Users)/")
PLOT_REPR = re.compile(r"<matplotlib\.[\w.]+ (object )?at 0x[0-9a-f]+>")


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


def test_clean_outputs_pass(tmp_path):
    path = tmp_path / "clean.ipynb"
    path.write_text(json.dumps(_notebook([_stream("32 tokens cost 3.0x one token; 0.5 FLOP/byte; 12.5% of 40 GB/s\n")])))
    for rule in BAD:
        if rule != "test_exercises_have_no_outputs":
            globals()[rule](path)
