"""Figures and widgets shared by the lessons, so notebooks call one line instead of pasting plotting code.

Every plotting function draws into ``ax`` when one is given (so lessons can lay out several panels) and
returns the axes it drew on. ``import minigpt`` does not import this module, so the package itself never
needs matplotlib or a display.

* :func:`token_label`, :func:`show_tokens`  -- what tokens look like (whitespace made visible);
* :func:`show_accepted`                     -- a generated text, drafted-and-accepted runs vs target-made tokens;
* :func:`plot_distribution`                 -- bars of the most likely next tokens;
* :func:`plot_lines`                        -- a measurement against a knob, one line per series;
* :func:`heatmap`                           -- a matrix (attention weights, masks, acceptance tables);
* :func:`draw_tree`                         -- a token tree: nodes by depth, an accepted branch, weights;
* :func:`explore`                           -- ``ipywidgets.interact`` with sliders that redraw on release;
* :func:`show_widget`                       -- a widget shown without a text repr in a static notebook.
* :func:`check_guess`                       -- the learner's guess next to the measured answer.
"""
from __future__ import annotations

import html
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import HTML, display

from .real.chat import IncrementalText

# How whitespace is shown in token labels: a space as a middle dot, control characters escaped.
_VISIBLE = {" ": "\u00b7", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
# Alternating backgrounds for token boundaries in show_tokens.
_COLOURS = ("#cfe8ff", "#ffe3b3", "#d7f5d0", "#f6d0e8", "#e6dcff")


def _as_numpy(x) -> np.ndarray:
    """A tensor, array or list -> a float numpy array on the CPU."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=float)


def token_label(token_id: int, tokenizer) -> str:
    """A readable label for one token: its text with spaces shown as ``·`` and newlines/tabs escaped.

    Byte-level BPE tokens can be part of a multi-byte character; those bytes show as ``\\xNN``."""
    raw = tokenizer.decode_single_token_bytes(int(token_id))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "".join(f"\\x{b:02x}" for b in raw)
    return "".join(_VISIBLE.get(c, c) for c in text)


def show_tokens(text: str, tokenizer, as_html: bool = True, max_tokens: int | None = None):
    """Render ``text`` with its token boundaries visible.

    ``as_html=True`` returns an ``IPython.display.HTML`` object (each token on its own coloured background;
    displayed when it is the last expression of a cell); otherwise a plain string with tokens separated by
    ``|``. Only the first ``max_tokens`` tokens are shown when given."""
    ids = tokenizer.encode(text, allowed_special="all")
    shown = ids if max_tokens is None else ids[:max_tokens]
    labels = [token_label(t, tokenizer) for t in shown]
    more = len(ids) - len(shown)
    if not as_html:
        return "|".join(labels) + (f"| ... (+{more} tokens)" if more else "")
    spans = []
    for i, (tid, lab) in enumerate(zip(shown, labels)):
        lab = html.escape(lab)
        if lab.endswith("\\n"):
            lab += "<br>"  # keep the line structure of code readable
        spans.append(f'<span title="id {tid}" style="background:{_COLOURS[i % len(_COLOURS)]};'
                     f'padding:1px 0;border-radius:2px">{lab}</span>')
    tail = f'<span style="color:#888"> ... (+{more} tokens)</span>' if more else ""
    return HTML('<div style="font-family:monospace;line-height:1.7;white-space:pre-wrap;color:#000">'
                + "".join(spans) + tail + f'<div style="color:#888">{len(ids)} tokens, '
                f'{len(text.encode("utf-8"))} bytes</div></div>')


DRAFTED_COLOUR, TARGET_COLOUR = "#c8f0c0", "#ffe0b0"  # show_accepted: drafted-and-accepted vs target-made


def show_accepted(tokens, record, tokenizer=None, as_html: bool = True, legend: bool = True):
    """A generated text with its accepted runs visible: tokens the drafter proposed and the target accepted,
    against tokens the target made itself (a plain step, the bonus token after a full accept, the replacement
    at a rejection).

    tokens: output token ids (with ``tokenizer``, anything with ``decode(ids) -> str``) or one string per
    token. record: a :class:`~minigpt.decoding.DecodeStats` (its ``from_draft``) or a list of booleans, one per
    token, True for drafted-and-accepted. ``as_html=True`` returns an ``IPython.display.HTML`` object
    (drafted tokens on green, target-made ones on orange); otherwise a plain string in which each run of
    drafted-and-accepted tokens is wrapped in brackets ``[...]`` (for terminals and tests). A multi-byte
    character split across tokens is shown with the token that completes it."""
    flags = [bool(f) for f in getattr(record, "from_draft", record)]
    if len(flags) != len(tokens):
        raise ValueError(f"{len(tokens)} tokens but a record of {len(flags)}: pass the stats of this one call")
    if tokens and not isinstance(tokens[0], str):
        if tokenizer is None:
            raise ValueError("token ids need a tokenizer (anything with decode) to be shown as text")
        inc = IncrementalText(lambda ids: tokenizer.decode(ids))
        texts = [inc.feed([t]) for t in tokens]
        if texts:
            texts[-1] += inc.flush()
    else:
        texts = list(tokens)
    runs: list[tuple[bool, str]] = []  # consecutive tokens of the same origin, joined
    for flag, text in zip(flags, texts):
        if runs and runs[-1][0] == flag:
            runs[-1] = (flag, runs[-1][1] + text)
        else:
            runs.append((flag, text))
    n_drafted = sum(flags)
    summary = (f"{n_drafted} of {len(flags)} tokens drafted and accepted, {len(flags) - n_drafted} made by the "
               f"target")
    if not as_html:
        body = "".join(f"[{text}]" if flag else text for flag, text in runs)
        return body + (f"\n({summary}; [...] = drafted and accepted)" if legend else "")
    spans = "".join(f'<span title="{"drafted and accepted" if flag else "made by the target"}" style="background:'
                    f'{DRAFTED_COLOUR if flag else TARGET_COLOUR};border-radius:2px">{html.escape(text)}</span>'
                    for flag, text in runs)
    key = (f'<div style="color:#555;font-family:sans-serif;font-size:90%">{summary}: '
           f'<span style="background:{DRAFTED_COLOUR}">drafted and accepted</span> '
           f'<span style="background:{TARGET_COLOUR}">made by the target</span></div>') if legend else ""
    return HTML('<div style="font-family:monospace;line-height:1.6;white-space:pre-wrap;color:#000">'
                + spans + "</div>" + key)


def plot_distribution(probs, tokenizer, top: int = 20, ax=None, ids: Sequence[int] | None = None,
                      title: str | None = None, color: str = "C0"):
    """Bar chart of a next-token distribution ``probs`` (V,): the ``top`` most likely tokens, or exactly the
    tokens ``ids`` in that order (to compare several distributions over the same tokens)."""
    p = _as_numpy(probs).reshape(-1)
    if ids is None:
        ids = np.argsort(-p, kind="stable")[:top]
    ids = [int(i) for i in ids]
    ax = ax or plt.subplots(figsize=(max(4.0, 0.45 * len(ids)), 3))[1]
    ax.bar(range(len(ids)), p[ids], color=color)
    ax.set_xticks(range(len(ids)))
    ax.set_xticklabels([token_label(i, tokenizer) for i in ids], rotation=90, fontsize=8)
    ax.set_ylabel("probability")
    ax.set_ylim(0, max(1e-9, float(p[ids].max())) * 1.1)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_lines(xs: Sequence[float], series: Mapping[str, Sequence[float]], xlabel: str = "", ylabel: str = "",
               title: str | None = None, logx: bool = False, logy: bool = False, ax=None,
               bands: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None):
    """One line (with markers) per entry of ``series`` = {name: ys}, all over the same ``xs``.

    ``bands`` = {name: (low, high)} shades a spread around a series (e.g. min and max of repeated timings)."""
    ax = ax or plt.subplots(figsize=(5.5, 3.5))[1]
    for i, (name, ys) in enumerate(series.items()):
        ax.plot(xs, _as_numpy(ys), marker="o", ms=4, label=name, color=f"C{i}")
        if bands and name in bands:
            lo, hi = bands[name]
            ax.fill_between(xs, _as_numpy(lo), _as_numpy(hi), alpha=0.2, color=f"C{i}")
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    if len(series) > 1:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


def heatmap(matrix, labels: Sequence[str] | None = None, ax=None, title: str | None = None,
            xlabels: Sequence[str] | None = None, ylabels: Sequence[str] | None = None,
            cmap: str = "viridis", annotate: bool = False, colorbar: bool = True, fmt: str = "{:.2f}"):
    """Show a 2-D ``matrix`` (rows = queries/ys, columns = keys/xs). ``labels`` names both axes of a square
    matrix; ``xlabels``/``ylabels`` override one axis. ``annotate`` writes each value in its cell."""
    m = _as_numpy(matrix)
    if m.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D matrix, got shape {m.shape}")
    ax = ax or plt.subplots(figsize=(min(9.0, 0.4 * m.shape[1] + 2), min(7.0, 0.4 * m.shape[0] + 1.2)))[1]
    im = ax.imshow(m, cmap=cmap, aspect="auto")
    xl, yl = xlabels if xlabels is not None else labels, ylabels if ylabels is not None else labels
    if xl is not None:
        ax.set_xticks(range(m.shape[1]))
        ax.set_xticklabels(xl, rotation=90, fontsize=8)
    if yl is not None:
        ax.set_yticks(range(m.shape[0]))
        ax.set_yticklabels(yl, fontsize=8)
    if annotate:
        for (r, c), v in np.ndenumerate(m):
            # dark text on light cells and light text on dark ones, whatever the colour map
            red, green, blue, _ = im.cmap(im.norm(v))
            light = 0.299 * red + 0.587 * green + 0.114 * blue > 0.5
            ax.text(c, r, fmt.format(v), ha="center", va="center", fontsize=7, color="black" if light else "white")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def draw_tree(parents: Sequence[int], labels: Sequence[str] | None = None, accepted: Sequence[int] = (),
              weights: Sequence[float] | None = None, ax=None, title: str | None = None,
              depth_labels: Sequence[str] | None = None, weight_label: str = "weight"):
    """Draw a token tree given by its parent array (``parents[0] == -1``, ``parents[i] < i``): one column per
    depth with the root on the left, leaves one per row, each parent centred on its children.

    ``labels``: the text of each node (default: its index), e.g. ``f"{i}: {token_label(t, tok)}"`` for a
    draft tree or the rank of a Medusa rank path. ``accepted``: node indices drawn green, with their edges
    (an accepted branch). ``weights``: one number per node shown as its colour, with a colour bar labelled
    ``weight_label`` (e.g. the probability that a rank path is accepted). ``depth_labels``: names of the depth
    columns (default 0, 1, ...). Trees from rank paths: ``minigpt.decoding.candidates.tree_from_paths`` gives the
    parent array, in the same node order as the sorted paths."""
    parents = [int(p) for p in parents]
    if not parents or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
        raise ValueError("draw_tree needs a parent array with parents[0] == -1 and 0 <= parents[i] < i")
    n = len(parents)
    labels = [str(i) for i in range(n)] if labels is None else [str(s) for s in labels]
    if len(labels) != n or (weights is not None and len(weights) != n):
        raise ValueError(f"draw_tree: {n} nodes but {len(labels)} labels"
                         + ("" if weights is None else f" and {len(weights)} weights"))
    kids: list[list[int]] = [[] for _ in parents]
    depth = [0] * n
    for i in range(1, n):
        kids[parents[i]].append(i)
        depth[i] = depth[parents[i]] + 1
    row: dict[int, float] = {}
    next_row = 0
    stack = [(0, False)]
    while stack:  # depth-first: leaves get consecutive rows, a parent the mean row of its children
        i, done = stack.pop()
        if done or not kids[i]:
            if kids[i]:
                row[i] = sum(row[c] for c in kids[i]) / len(kids[i])
            else:
                row[i], next_row = next_row, next_row + 1
            continue
        stack.append((i, True))
        stack.extend((c, False) for c in reversed(kids[i]))
    acc = {int(i) for i in accepted}
    d_max, n_rows = max(depth), max(row.values()) + 1
    ax = ax or plt.subplots(figsize=(1.8 * (d_max + 1) + 1.5, 0.45 * n_rows + 1))[1]
    for i in range(1, n):
        on = i in acc
        ax.plot([depth[parents[i]], depth[i]], [-row[parents[i]], -row[i]], color="C2" if on else "0.7",
                lw=2.5 if on else 1, zorder=1)
    cmap, vmax = plt.get_cmap("viridis"), 1.0
    if weights is not None:
        w = _as_numpy(weights)
        vmax = float(max(w[1:].max() if n > 1 else w.max(), 1e-12))
    for i in range(n):
        if weights is not None:
            face = cmap(min(float(w[i]) / vmax, 1.0))
            ink = "white" if float(w[i]) / vmax < 0.6 else "black"
        else:
            face, ink = ("0.85" if i == 0 else ("#b7e4b0" if i in acc else "white")), "black"
        ax.text(depth[i], -row[i], labels[i], ha="center", va="center", fontsize=8, color=ink, zorder=2,
                bbox=dict(boxstyle="round", fc=face, ec="C2" if i in acc else "0.4", lw=2 if i in acc else 1))
    if weights is not None:
        sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, vmax))
        ax.figure.colorbar(sm, ax=ax, fraction=0.046, pad=0.02, label=weight_label)
    ax.set_xlim(-0.6, d_max + 0.6)
    ax.set_ylim(-n_rows + 0.3, 0.7)
    ax.set_xticks(range(d_max + 1))
    ax.set_xticklabels(list(depth_labels)[:d_max + 1] if depth_labels is not None else range(d_max + 1))
    ax.set_xlabel("depth")
    ax.set_yticks([])
    ax.set_title(title or f"{n} nodes", fontsize=10)
    return ax


def _redraw_on_change(fn: Callable, made: dict) -> None:
    """Show the controls ``made`` with an output area below them that runs ``fn`` only when a control changes."""
    knobs = {k: v for k, v in made.items() if isinstance(v, widgets.Widget)}
    fixed = {k: v.value for k, v in made.items() if not isinstance(v, widgets.Widget)}
    out = widgets.Output()

    def redraw(_change=None) -> None:
        with out:
            out.clear_output(wait=True)
            fn(**fixed, **{k: v.value for k, v in knobs.items()})

    for v in knobs.values():
        v.observe(redraw, names="value")
    show_widget(widgets.VBox([*knobs.values(), out]))


def show_widget(w: widgets.Widget) -> None:
    """Display a widget for a live frontend only: the output carries the widget's view and no ``text/plain``
    repr, so a notebook executed headless (nbconvert, CI) or rendered statically shows nothing in its place
    rather than a line like ``VBox(children=(IntSlider(...``. Works with ipywidgets 7 and 8."""
    view = {"version_major": 2, "version_minor": 0, "model_id": w.model_id}
    display({"application/vnd.jupyter.widget-view+json": view}, raw=True)


def explore(fn: Callable, draw_now: bool = True, **controls) -> None:
    """``ipywidgets.interact(fn, **controls)`` whose sliders redraw only when released.

    A control may be a tuple ``(min, max, step)`` (an ``IntSlider`` if all three are ints, else a
    ``FloatSlider``; it starts at ``fn``'s default for that argument when that lies in range), a list of
    choices (a ``Dropdown``), an ipywidgets widget, or a fixed value. Works with ipywidgets 7 and 8.
    Lessons call ``fn`` once with fixed values as well, so the static notebook shows the same figure.
    Returns None. The controls are shown by :func:`show_widget`: a live notebook gets the sliders, a notebook
    executed headless keeps no ``interactive(...)`` text in its outputs.
    ``draw_now=False``: the lesson has just called ``fn`` with the defaults, so the explorer draws nothing until
    a control is moved (one figure on the page at first, not two)."""
    defaults = {k: p.default for k, p in inspect.signature(fn).parameters.items()
                if p.default is not inspect.Parameter.empty}
    made = {}
    for name, c in controls.items():
        if isinstance(c, tuple) and len(c) == 3:
            lo, hi, step = c
            start = defaults.get(name, lo)
            start = start if isinstance(start, (int, float)) and lo <= start <= hi else lo
            if all(isinstance(v, int) for v in c):
                made[name] = widgets.IntSlider(value=int(start), min=lo, max=hi, step=step, description=name,
                                             continuous_update=False)
            else:
                made[name] = widgets.FloatSlider(value=float(start), min=lo, max=hi, step=step, description=name,
                                               continuous_update=False)
        elif isinstance(c, list):
            start = defaults.get(name, c[0])
            made[name] = widgets.Dropdown(options=c, value=start if start in c else c[0], description=name)
        elif isinstance(c, widgets.Widget):
            made[name] = c
        else:
            made[name] = widgets.fixed(c)
    if not draw_now:
        _redraw_on_change(fn, made)
        return

    @functools.wraps(fn)
    def show(*args, **kwargs) -> None:  # interactive would also display fn's return value
        fn(*args, **kwargs)

    show_widget(widgets.interactive(show, **made))   # draws once now, into the widget's own output area


def check_guess(guess, measured, tolerance: float | None = None) -> str:
    """One line putting the learner's guess next to what a cell measured (predict, then measure), printed and
    returned. ``guess``: a number, a word, or a dict of them (one line per key of ``measured``); None: no guess
    made. Numbers: "right" within ``tolerance`` (absolute; default 10% of the measured value), else how far off;
    words: "right" when they match ignoring case, else what was measured."""
    if isinstance(measured, Mapping):
        guesses = guess if isinstance(guess, Mapping) else {}
        text = "\n".join(f"{k}: {_guess_line(guesses.get(k), v, tolerance)}" for k, v in measured.items())
    else:
        text = _guess_line(guess, measured, tolerance)
    print(text)
    return text


def _guess_line(guess, measured, tolerance: float | None) -> str:
    def fmt(x):
        return f"{x:.3g}" if isinstance(x, float) else repr(x) if isinstance(x, str) else str(x)

    if guess is None:
        return f"no guess made; measured {fmt(measured)}"
    if isinstance(measured, (int, float)) and isinstance(guess, (int, float)) and not isinstance(guess, bool):
        tol = abs(measured) * 0.1 if tolerance is None else tolerance
        off = guess - measured
        verdict = "right" if abs(off) <= tol else f"{'over' if off > 0 else 'under'} by {fmt(abs(off))}"
        return f"your guess {fmt(guess)}, measured {fmt(measured)}: {verdict}"
    right = str(guess).strip().lower() == str(measured).strip().lower()
    return f"your guess {fmt(guess)}, measured {fmt(measured)}: {'right' if right else 'not what happened'}"


def choice_strip(choices: Sequence[tuple[str, int, int]], ax=None, title: str | None = None):
    """A generation's rounds left to right, one bar per round, as wide as the tokens it made and coloured by
    what the speculation controller chose (:attr:`minigpt.decoding.auto.Auto.choices`: option, tokens proposed,
    tokens kept); the kept drafted tokens are solid, the round's own token hatched. Returns the axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 1.8))
    names = list(dict.fromkeys(name for name, _, _ in choices))
    colours = {n: plt.get_cmap("tab10")(i) for i, n in enumerate(names)}
    x = 0
    for name, _, kept in choices:
        if kept:
            ax.barh(0, kept, left=x, color=colours[name], edgecolor="white", linewidth=0.3)
        ax.barh(0, 1, left=x + kept, color=colours[name], alpha=0.45, hatch="//", edgecolor="white", linewidth=0.3)
        x += kept + 1
    ax.set_yticks([])
    ax.set_xlim(0, max(x, 1))
    ax.set_xlabel("output tokens (solid: drafted and accepted; hatched: the target's own token of the round)")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colours[n]) for n in names], labels=names,
              loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(names), frameon=False)
    if title:
        ax.set_title(title, pad=24)
    return ax
