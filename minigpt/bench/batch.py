"""The batch-size benchmark, ``python -m minigpt.bench --batch 1,2,4,8,16``: B requests at once on the paged cache
(:mod:`minigpt.decoding.batch`) with any declared method (default plain, chain and prompt lookup; ``--methods``
names others), each with the settings its declaration gives the single-sequence benchmark, and how the speed-up
of speculation over plain decoding changes with B.

Each batch size gets its own interleaved race (:func:`~minigpt.device.time_rotating_over`): every repeat
decodes the same B prompts with every method, plain twice (its A/A twin), the order rotating. The unit is the
whole batch: tokens per second of all B sequences together, from the first prefill to the last token. Every
sequence's output is checked against decoding its prompt alone with plain greedy decoding; a method that
differs is reported, never timed as if it were right. Verdicts follow :mod:`minigpt.verdict`: each round's ratio over plain against plain's
A/A noise band of the same B, and "too few repeats" below 5."""
from __future__ import annotations

import statistics

from ..decoding import generate
from ..decoding.batch import decode_batch
from ..device import time_rotating_over
from ..prompts import code_prompts, edit_prompts
from ..verdict import aa_band, paired_ratios, ratio_interval, speed_verdict, twin_of
from .methods import METHODS, Models
from .run import check_methods, resolve_params

DEFAULT_BATCH_METHODS = ("plain", "chain", "prompt_lookup")


def batch_prompts(n: int, edit_share: float = 0.25) -> list:
    """``n`` requests: held-out code windows and copy-heavy edit prompts, edits spread through the list (one in
    four by default), so every batch size sees the same mix."""
    n_edit = round(n * edit_share)
    code, edit = code_prompts(n - n_edit), edit_prompts(n_edit) if n_edit else []
    out, e = [], 0
    for i in range(n):
        if e < len(edit) and (i + 1) * edit_share >= e + 1:
            out.append(edit[e])
            e += 1
        else:
            out.append(code[i - e])
    return out


def run_batch_bench(batch_sizes=(1, 2, 4, 8, 16), methods=DEFAULT_BATCH_METHODS, max_new_tokens: int = 64,
                    repeats: int = 5, gamma: int | None = None, models: Models | None = None, prompts=None,
                    device=None, log=None) -> list[dict]:
    """One record per (B, method): tokens/s of the whole batch (median, min, max over repeats), the speed-up
    over plain in the same race (median and range of the per-repeat ratios), its verdict against plain's A/A
    ``noise_band`` (plain's record keeps the ``aa_ratios``), tokens per
    target pass (all sequences' tokens over the batch's passes, and per sequence), and whether every output
    equals its solo plain output. ``methods``: any declared ones (:data:`~minigpt.decoding.registry.METHODS`;
    plain is always raced); ``gamma``: the draft length (default: each method's declared one); ``prompts``: the
    requests (default :func:`batch_prompts` of the largest B); batch B takes the first B."""
    methods = tuple(check_methods(methods))
    if not batch_sizes or min(batch_sizes) < 1:
        raise ValueError(f"batch sizes must be positive, got {list(batch_sizes)}")
    models = models or Models.shipped(device or "cpu", methods=methods)
    prompts = prompts if prompts is not None else batch_prompts(max(batch_sizes))
    if len(prompts) < max(batch_sizes):
        raise ValueError(f"{len(prompts)} prompts for a batch of {max(batch_sizes)}")
    params = resolve_params(list(methods), gamma, family=models.family)
    solo = [generate(models.target, p, max_new_tokens, eos_id=models.eos_id) for p in prompts[:max(batch_sizes)]]
    records = []
    for B in batch_sizes:
        if log:
            log(f"batch {B}")
        batch = [list(p) for p in prompts[:B]]
        fns = {name: (lambda ps, prop=METHODS[name].make(models, **params[name]):
                      decode_batch(models.target, ps, max_new_tokens, prop, eos_id=models.eos_id))
               for name in methods}
        seconds, results = time_rotating_over(fns, [batch], models.target.device, repeat=repeats, warmup=1,
                                              aa="plain")
        base = [seconds["plain"][r][0] for r in range(repeats)]
        aa = paired_ratios(base, [seconds[twin_of("plain")][r][0] for r in range(repeats)])   # plain vs plain
        band = aa_band(aa)
        for name in methods:
            times = [seconds[name][r][0] for r in range(repeats)]
            outs, stats, bstats = results[name][-1][0]
            tokens = sum(len(o) for o in outs)
            ratios = [b / t for b, t in zip(base, times)]
            identical = all(results[name][r][0][0] == solo[:B] for r in range(repeats))
            records.append(dict(
                batch=B, method=name, tokens=tokens, identical_to_solo_plain=identical,
                tokens_per_s=tokens / statistics.median(times), tokens_per_s_min=tokens / max(times),
                tokens_per_s_max=tokens / min(times),
                speedup=statistics.median(ratios), speedup_min=min(ratios), speedup_max=max(ratios),
                noise_band=list(band), speedup_interval=list(ratio_interval(ratios)), repeats=repeats,
                verdict="baseline" if name == "plain" else speed_verdict(ratios, band),
                batch_passes=bstats.target_passes, tokens_per_batch_pass=tokens / bstats.target_passes,
                tokens_per_pass_per_sequence=statistics.mean(s.tokens_per_target_pass for s in stats),
                acceptance_rate=(sum(s.accepted for s in stats) / max(1, sum(s.tested for s in stats))
                                 if name != "plain" else None),
                blocks_left=bstats.blocks_left))
            if name == "plain":
                records[-1]["aa_ratios"] = aa
    return records


def report_batch(records: list[dict]) -> str:
    """The records as a table: one row per batch size, each method's tokens/s and speed-up over plain."""
    methods = list(dict.fromkeys(r["method"] for r in records))
    by = {(r["batch"], r["method"]): r for r in records}
    head = f"{'B':>3} " + "".join(f"{m + ' tok/s':>20}" for m in methods) + f"{'A/A band':>12}" + "".join(
        f"{m + ' / plain':>46}" for m in methods if m != "plain")
    lines = [head]
    for B in sorted({r["batch"] for r in records}):
        row = f"{B:>3} "
        for m in methods:
            r = by[(B, m)]
            row += f"{r['tokens_per_s']:>10.0f} ({r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f})"
        lo, hi = by[(B, "plain")]["noise_band"]
        row += f"{lo:>7.2f}-{hi:.2f}"
        for m in methods:
            if m == "plain":
                continue
            r = by[(B, m)]
            row += f"{r['speedup']:>8.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f}) {r['verdict']:>25}"
        lines.append(row)
    bad = [f"B={r['batch']} {r['method']}" for r in records if not r["identical_to_solo_plain"]]
    lines.append("every output identical to its solo plain output" if not bad
                 else "NOT identical to solo plain output: " + ", ".join(bad))
    leaked = [f"B={r['batch']} {r['method']}" for r in records if r["blocks_left"]]
    lines.append("no KV block left in use after any run" if not leaked else "blocks left in use: " + ", ".join(leaked))
    return "\n".join(lines)
