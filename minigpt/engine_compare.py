"""minigpt next to a production engine (llama.cpp, :mod:`minigpt.engines`) on the same SmolLM2 file: Lesson 13's
measurements as tested functions.

* :func:`teacher_forced` -- both engines' logits for the same tokens, how far they differ, where their argmax
  differs, and the smallest gap between minigpt's two largest logits;
* :func:`with_twins` and :func:`race_records` -- a race of several engines' methods in which every engine's
  plain decoding is timed twice per round (its A/A twin, :mod:`minigpt.verdict`), and each method judged against
  *its own engine's* plain decoding, request by request and over all requests;
* :func:`pass_costs` -- a prefill, and one pass over k new tokens after it, in each engine, and one step of a
  draft model: the r(k) and c that explain what speculation costs in each engine.

llama.cpp is optional here as everywhere: pass ``llama=None`` and only minigpt's side is measured.
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from .cache import KVCache
from .model import GPT
from .verdict import aa_band, noise_band, paired_ratios, speed_verdict, twin_of


def top2(row) -> list[tuple[int, float]]:
    """The two largest logits of one row: ``[(token id, logit), (token id, logit)]``, largest first."""
    row = np.asarray(row)
    i = np.argsort(row)[::-1][:2]
    return [(int(j), float(row[j])) for j in i]


@torch.no_grad()
def teacher_forced(model: GPT, llama, prompt, tokens) -> dict:
    """Feed ``prompt`` then ``tokens`` to both engines and compare the logits that predicted each token: minigpt
    in one pass, llama.cpp (a :class:`minigpt.engines.LlamaCpp`) on its own greedy path (the prompt in one pass,
    then one token per pass). Returns ``mine`` and ``other`` ((len(tokens), V) arrays), ``max_diff``,
    ``mean_diff``, ``flips`` (positions whose argmax differs) and ``min_gap`` (minigpt's smallest top-2 gap)."""
    prompt, tokens = [int(t) for t in prompt], [int(t) for t in tokens]
    ids = torch.tensor([prompt + tokens], device=model.device)
    mine = model(ids)[0, len(prompt) - 1:-1].float().cpu().numpy()
    rest = llama.logits_of(prompt, [[t] for t in tokens[:-1]]) if len(tokens) > 1 else np.zeros((0, mine.shape[1]))
    first = np.array(llama.llm.scores[len(prompt) - 1], dtype=np.float32)[None]   # the prefill's last row
    other = np.concatenate([first, rest]).astype(np.float32)
    top = np.sort(mine, -1)
    return dict(mine=mine, other=other, max_diff=float(np.abs(mine - other).max()),
                mean_diff=float(np.abs(mine - other).mean()),
                flips=[int(j) for j in np.flatnonzero(mine.argmax(-1) != other.argmax(-1))],
                min_gap=float((top[:, -1] - top[:, -2]).min()))


def with_twins(fns: dict, baseline_of: dict) -> dict:
    """``fns`` with an A/A twin of every baseline (``baseline_of``: method label -> its baseline's label) under
    :func:`minigpt.verdict.twin_of`, placed after the last method judged against that baseline."""
    out = {}
    labels = list(fns)
    for i, label in enumerate(labels):
        out[label] = fns[label]
        base = baseline_of[label]
        if all(baseline_of[later] != base for later in labels[i + 1:]):
            out[twin_of(base)] = fns[base]
    return out


def race_records(seconds: dict, results: dict, names: list[str], baseline_of: dict) -> dict:
    """For a race timed with :func:`minigpt.device.time_rotating_over` over inputs called ``names`` (functions
    returning ``(ids, DecodeStats)``, baselines' twins included, :func:`with_twins`): ``{(method, name): record}``
    with tokens/s (median, min, max), tokens per target pass, the paired speed ratios against the method's own
    baseline, their verdict against that baseline's A/A band on this input, and whether its output equals the
    baseline's (the same in every repeat); plus ``{(method, "all"): record}`` for all inputs together."""
    out = {}
    repeats = len(next(iter(seconds.values())))
    for method, base in baseline_of.items():
        for i, name in enumerate(names):
            ids, stats = results[method][0][i]
            ts = [seconds[method][r][i] for r in range(repeats)]
            tb = [seconds[base][r][i] for r in range(repeats)]
            band = aa_band(paired_ratios(tb, [seconds[twin_of(base)][r][i] for r in range(repeats)]))
            ratios = paired_ratios(tb, ts)
            stable = all(results[method][r][i][0] == ids for r in range(repeats))
            base_ids = results[base][0][i][0]
            first = next((j for j, (a, b) in enumerate(zip(base_ids, ids)) if a != b), None)
            out[method, name] = dict(
                ids=ids, tps=statistics.median(len(ids) / s for s in ts), tps_min=len(ids) / max(ts),
                tps_max=len(ids) / min(ts), tau=stats.tokens_per_target_pass, ratios=ratios,
                ratio=statistics.median(ratios), band=band, same=stable and ids == base_ids, first_divergence=first,
                verdict="-" if method == base else speed_verdict(ratios, band))
        ratios = paired_ratios(seconds[base], seconds[method])      # a round's inputs summed
        band = noise_band(seconds[base], seconds[twin_of(base)])
        out[method, "all"] = dict(ratios=ratios, ratio=statistics.median(ratios), band=band,
                                  verdict="-" if method == base else speed_verdict(ratios, band))
    return out


def race_lines(records: dict, names: list[str], baseline_of: dict) -> list[str]:
    """:func:`race_records` as printable lines: per input, one row per method."""
    lines = []
    for name in names:
        lines.append(f"--- {name}")
        lines.append(f"  {'method':<22}{'tokens/s (range)':>18}{'tok/pass':>9}{'vs own plain (range)':>23}  "
                     f"{'verdict':<26}vs own plain output")
        for method, base in baseline_of.items():
            r = records[method, name]
            same = ("(the reference)" if method == base else "identical" if r["same"]
                    else f"differs from token {r['first_divergence']}")
            lines.append(f"  {method:<22}{r['tps']:>6.1f} ({r['tps_min']:>4.1f}-{r['tps_max']:>4.1f}){r['tau']:>9.2f}"
                         f"{r['ratio']:>10.2f}x ({min(r['ratios']):.2f}-{max(r['ratios']):.2f})  {r['verdict']:<26}{same}")
    return lines


@torch.no_grad()
def pass_costs(model: GPT, prompt, continuation, ks=(1, 4, 17), repeats: int = 5, llama=None,
               draft: GPT | None = None) -> dict:
    """Seconds, ``repeats`` times: the prefill of ``prompt`` and then one pass over the first k tokens of
    ``continuation`` for each k in ``ks`` (the cache cropped back after each), in minigpt and, given ``llama``, in
    llama.cpp; and one one-token step of ``draft`` after the same prompt. Returns ``prefill`` {engine: [s]},
    ``passes`` {(engine, k): [s]}, ``draft`` [s] and ``r`` {engine: {k: median k-pass / median 1-pass}}."""
    prompt, cont = [int(t) for t in prompt], [int(t) for t in continuation]
    if len(cont) < max(ks):
        raise ValueError(f"a pass over {max(ks)} tokens needs that many continuation tokens, got {len(cont)}")
    engines = ["minigpt"] + (["llama.cpp"] if llama is not None else [])
    prefill = {e: [] for e in engines}
    passes = {(e, k): [] for e in engines for k in ks}
    draft_s = []

    def clock(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    for _ in range(repeats):
        if draft is not None:
            dcache = KVCache.for_model(draft)
            draft.hidden_states(torch.tensor([prompt], device=draft.device), cache=dcache)
            draft_s.append(clock(lambda: draft(torch.tensor([cont[:1]], device=draft.device), cache=dcache)))
        cache = KVCache.for_model(model)
        prefill["minigpt"].append(clock(lambda: model.hidden_states(torch.tensor([prompt], device=model.device),
                                                                     cache=cache)))
        for k in ks:
            passes["minigpt", k].append(clock(lambda: model(torch.tensor([cont[:k]], device=model.device), cache=cache)))
            cache.crop(len(prompt))
        if llama is not None:
            llama.llm.reset()
            prefill["llama.cpp"].append(clock(lambda: llama.llm.eval(prompt)))
            for k in ks:
                passes["llama.cpp", k].append(clock(lambda: llama.llm.eval(cont[:k])))
                llama.llm.n_tokens = len(prompt)    # rewind: the next eval overwrites the cache after the prompt
    r = {e: {k: statistics.median(passes[e, k]) / statistics.median(passes[e, ks[0]]) for k in ks} for e in engines}
    return dict(prefill=prefill, passes=passes, draft=draft_s, r=r)
