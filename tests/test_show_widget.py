"""minigpt.plots.show_widget and explore: a widget leaves its view in a notebook's outputs, never a text repr
(a notebook executed headless would otherwise keep lines like ``VBox(children=(IntSlider(...``)."""
from __future__ import annotations

import ipywidgets as w

import minigpt.plots as plots


def _displayed(monkeypatch):
    shown = []
    monkeypatch.setattr(plots, "display", lambda obj, raw=False: shown.append((obj, raw)))
    return shown


def test_show_widget_sends_the_view_without_a_text_repr(monkeypatch):
    shown = _displayed(monkeypatch)
    slider = w.IntSlider()
    plots.show_widget(slider)
    [(bundle, raw)] = shown
    assert raw and list(bundle) == ["application/vnd.jupyter.widget-view+json"]
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == slider.model_id


def test_explore_shows_its_controls_without_a_text_repr(monkeypatch):
    shown = _displayed(monkeypatch)
    calls = []

    def fn(a=2):
        calls.append(a)

    plots.explore(fn, draw_now=False, a=(0, 5, 1))
    plots.explore(fn, a=(0, 5, 1))               # draws once now (into the widget's own output)
    assert calls == [2]
    assert len(shown) == 2
    assert all(list(b) == ["application/vnd.jupyter.widget-view+json"] for b, _ in shown)


def test_check_guess_compares_instead_of_echoing(capsys):
    assert plots.check_guess(None, 0.62) == "no guess made; measured 0.62"
    assert plots.check_guess(0.6, 0.62).endswith("right")                      # within 10% of 0.62
    assert plots.check_guess(0.3, 0.62).endswith("under by 0.32")
    assert plots.check_guess(5, 3, tolerance=1).endswith("over by 2")
    assert plots.check_guess("Slower", "slower").endswith(": right")
    assert plots.check_guess("faster", "slower").endswith("not what happened")
    lines = plots.check_guess({"code": "faster"}, {"code": "slower", "edit": "faster"}).splitlines()
    assert lines == ["code: your guess 'faster', measured 'slower': not what happened",
                     "edit: no guess made; measured 'faster'"]
    assert "measured" in capsys.readouterr().out
