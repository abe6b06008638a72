"""The stream benchmark, ``python -m minigpt.bench --stream dev|held-out``: the requests of a stream
(:class:`minigpt.streams.Stream`) decoded one after the other in arrival order, every method on the same
requests, timed interleaved (:func:`minigpt.device.time_rotating_over`, plain timed twice per round as the A/A
control of :mod:`minigpt.verdict`).

**The rule that keeps it honest.** Suffix decoding drafts from a global tree of earlier outputs. In this
benchmark that tree starts empty at each repeat of a stream and holds only the outputs of earlier, different
requests of the same stream: request k is decoded with the outputs of requests 0 .. k-1 of this repeat, and
never with its own output from a previous repeat (or the warm-up), which would be the very answer it is asked
for. (A stream may hold two requests with the same text: the second may then draft from the first's answer, as
a server would.) Every repeat therefore makes exactly the same rounds; ``same_every_repeat`` checks it.

A method is plain decoding, a declared method (:data:`minigpt.decoding.registry.METHODS`, run with its model
family's parameters, each request on its own), or one of :data:`STREAM_METHODS`, which keep state along the
stream, with the declared ``suffix`` method's parameters: ``suffix`` (the request's own tree and the global
tree), ``suffix_local`` (the request's own tree only: the declared method itself), ``suffix_fixed`` (a fixed
number of candidates per round, no probability floor) and ``suffix_union`` (the two trees' drafts merged into
one tree each round, instead of the better one alone). The speculation controller ``auto`` keeps state along
the stream too: its suffix-decoding option drafts from the same kind of global tree, under the same rule, with
the same settings as ``suffix``. Its rounds follow measured time, so for it ``same_every_repeat`` checks the
output only (for every other method, the output and the number of target passes).
Records: one per (stream, method) with tokens per target pass overall and by position in the stream, the
speed-up over plain (median and the paired ratios' interval), its verdict, and for suffix decoding the same
against prompt lookup.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from ..decoding import DecodeStats
from ..decoding.auto import choice_summary
from ..decoding.registry import make_auto, wanted
from ..decoding.session import Settings, decode
from ..decoding.suffix import GlobalTree, Suffix, suffix_generate
from ..device import OtherLoad, busy_machine_note, time_rotating_over
from ..precision import PRECISIONS
from ..real.streams import KINDS as SMOLLM2_KINDS
from ..real.streams import smollm2_streams
from ..streams import Stream, course_stream
from ..verdict import aa_band, paired_ratios, ratio_interval, speed_verdict, twin_of
from .methods import METHODS, Models
from .run import resolve_params
from .smollm2 import smollm2_models
from .table import format_choices

TWIN = twin_of("plain")
# the suffix variants' settings beyond the model family's own (SUFFIX_SETTINGS): what makes each one itself
STREAM_METHODS = {"suffix": dict(use_global=True),
                  "suffix_local": dict(use_global=False),
                  "suffix_fixed": dict(use_global=True, adaptive=False),
                  "suffix_union": dict(use_global=True, combine="union")}
DEFAULT_STREAM_METHODS = ("plain", "prompt_lookup", "suffix")


def check_stream_methods(names) -> list[str]:
    """Plain first, then the others; ValueError in one line for a name that is neither registered nor a
    stream method."""
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in METHODS and n not in STREAM_METHODS]
    if unknown:
        known = ", ".join(dict.fromkeys([*METHODS, *STREAM_METHODS]))
        raise ValueError(f"unknown method {unknown[0]!r}; available: {known}")
    return ["plain"] + [n for n in dict.fromkeys(names) if n != "plain"]


def parse_suffix_settings(text: str | None) -> dict:
    """``"max_spec=24,factor=4"`` -> {"max_spec": 24, "factor": 4.0}, typed as the declared ``suffix`` method's
    parameters (and ``max_requests``, an int); ValueError in one line for an unknown name or a bad value."""
    if not text:
        return {}
    known = {**METHODS["suffix"].defaults(), "max_requests": 10_000}
    out = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        name = name.strip()
        if name not in known or not value.strip():
            raise ValueError(f"--suffix-settings takes NAME=VALUE pairs with names from {', '.join(known)}; "
                             f"got {item.strip()!r}")
        kind = type(known[name])
        try:
            out[name] = value.strip().lower() in ("1", "true", "yes") if kind is bool else kind(value)
        except ValueError:
            raise ValueError(f"--suffix-settings: {name} takes a {kind.__name__}, got {value.strip()!r}") from None
    return out


def stream_fns(names: list[str], models: Models, stream: Stream, params: dict, suffix_settings: dict) -> dict:
    """label -> ``fn((position, prompt)) -> (ids, stats)``. A suffix method's global tree is cleared at position
    0 (the start of every repeat, and of the warm-up) and takes each request's output when it has ended
    (:meth:`~minigpt.decoding.suffix.Suffix.finish`); so does the suffix option of ``auto``, the speculation
    controller. ``suffix_settings``: the suffix methods' parameters (the declared ``suffix`` method's, plus
    ``max_requests`` for the global tree), ``auto``'s suffix option's included."""
    n, eos = stream.max_new_tokens, stream.eos_id

    def registered(name):
        return lambda item: METHODS[name].run(models, item[1], n, **params[name])

    def global_tree(settings):
        return GlobalTree(settings.pop("max_requests", 10_000), settings.get("max_depth", 24))

    def suffix(variant):
        settings = {**suffix_settings, **{k: v for k, v in variant.items() if k != "use_global"}}
        cache = global_tree(settings) if variant["use_global"] else None

        def fn(item):
            position, prompt = item
            if cache is not None and position == 0:
                cache.clear()  # a repeat starts from an empty tree: never a request's own earlier output
            return suffix_generate(models.target, prompt, n, cache=cache, eos_id=eos, **settings)
        return fn

    def auto():
        settings = dict(suffix_settings)
        cache = global_tree(settings)

        def fn(item):
            position, prompt = item
            if position == 0:
                cache.clear()  # the same rule as suffix decoding's
            proposer = make_auto(models, suffix=Suffix(cache, **settings), **params["auto"])
            return decode(models.target, prompt, n, proposer, Settings(eos_id=eos))
        return fn

    fns = {}
    for name in names:
        fns[name] = suffix(STREAM_METHODS[name]) if name in STREAM_METHODS else auto() if name == "auto" \
            else registered(name)
    return fns


def _tau(stats: DecodeStats, tokens: int) -> float:
    return tokens / stats.target_passes if stats.target_passes else float("nan")


def stream_records(stream: Stream, seconds: dict, results: dict, names: list[str], params: dict,
                   target=None, other_cpu_cores: float | None = None) -> list[dict]:
    """One record per method: counts from the first repeat, timing and verdicts from all of them; the
    ``target``'s precision and whether its path is batch-invariant; ``other_cpu_cores``, the cores other processes
    kept busy while the stream was timed (:class:`~minigpt.device.OtherLoad`)."""
    plain_out = [ids for ids, _ in results["plain"][0]]
    aa = paired_ratios(seconds["plain"], seconds[TWIN])
    band = aa_band(aa)
    repeats = len(seconds["plain"])
    precision, invariant = getattr(target, "precision", "fp32"), getattr(target, "batch_invariant", False)
    records = []
    for name in names:
        runs = results[name]
        outs = [ids for ids, _ in runs[0]]
        stats = [st for _, st in runs[0]]
        tokens = [len(o) for o in outs]
        passes = sum(st.target_passes for st in stats)
        ratios = paired_ratios(seconds["plain"], seconds[name])
        timed = name in METHODS and METHODS[name].proposer.timed  # rounds that follow measured time may differ
        same = all([ids for ids, _ in run] == outs and (timed or [st.target_passes for _, st in run] ==
                   [st.target_passes for st in stats]) for run in runs)
        totals = [sum(row) for row in seconds[name]]
        rec = dict(stream=stream.name, kind=stream.kind, split=stream.split, method=name, precision=precision,
                   batch_invariant=invariant, kernels=getattr(target, "kernels", None), other_cpu_cores=other_cpu_cores,
                   params=params.get(name, {}), n_requests=len(stream), max_new_tokens=stream.max_new_tokens,
                   repeats=repeats, torch_threads=torch.get_num_threads(), new_tokens=sum(tokens),
                   target_passes=passes, tokens_per_target_pass=sum(tokens) / passes if passes else None,
                   tau_by_position=[_tau(st, k) for st, k in zip(stats, tokens)],
                   accepted=sum(st.accepted for st in stats), proposed=sum(st.proposed for st in stats),
                   time_s_median=statistics.median(totals), time_s_min=min(totals), time_s_max=max(totals),
                   speedup_vs_plain=statistics.median(ratios), speedup_interval=list(ratio_interval(ratios)),
                   speedup_ratios=ratios, noise_band=list(band),
                   verdict="baseline" if name == "plain" else speed_verdict(ratios, band),
                   identical_to_plain_greedy=outs == plain_out, same_every_repeat=same)
        rounds = [c for st in stats for c in st.choices]
        if rounds:   # a method that chooses round by round (auto): how often each option was taken (first repeat)
            rec["choices"] = choice_summary(rounds)
        if name == "plain":
            rec["aa_ratios"] = aa
        if name != "plain" and "prompt_lookup" in seconds and name != "prompt_lookup":
            vs = paired_ratios(seconds["prompt_lookup"], seconds[name])
            rec.update(vs_prompt_lookup=statistics.median(vs), vs_prompt_lookup_interval=list(ratio_interval(vs)),
                       vs_prompt_lookup_verdict=speed_verdict(vs, band))
        records.append(rec)
    return records


def run_stream_bench(streams: list[Stream], methods=DEFAULT_STREAM_METHODS, models: Models | None = None,
                     repeats: int = 5, suffix_settings: dict | None = None, method_params: dict | None = None,
                     device=None, log=None) -> list[dict]:
    """Every method on every stream (greedy), each stream timed on its own (:func:`stream_fns`, the rule of the
    module docstring); returns the records of :func:`stream_records`, stream by stream. ``models``: default the
    course's shipped pair (with what the named methods need); ``suffix_settings``: changes to the suffix methods'
    parameters (the declared ``suffix`` method's for the models' family, plus ``max_requests``, default 10,000);
    ``method_params``: overrides of declared methods' parameters, as :func:`~minigpt.bench.run.run_bench` takes
    them."""
    names = check_stream_methods(methods)
    if not streams or any(len(s) == 0 for s in streams):
        raise ValueError("every stream needs at least one request")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    models = models or Models.shipped(device or "cpu", methods=[n for n in names if n in METHODS])
    params = resolve_params([n for n in names if n in METHODS and n not in STREAM_METHODS], None, method_params,
                            family=models.family)
    suffix = {**METHODS["suffix"].defaults(models.family), **(suffix_settings or {})}
    records = []
    for stream in streams:
        if log:
            log(f"stream {stream.name}: {len(stream)} requests x {stream.max_new_tokens} tokens")
        fns = stream_fns(names, models, stream, params, suffix)
        inputs = list(enumerate(stream.requests))
        with OtherLoad() as load:
            seconds, results = time_rotating_over(fns, inputs, models.target.device, repeat=repeats, warmup=1,
                                                  log=log, aa="plain")
        variants = {n: {**suffix, **STREAM_METHODS[n]} for n in names if n in STREAM_METHODS}
        records += stream_records(stream, seconds, results, names, {**params, **variants}, models.target,
                                  other_cpu_cores=load.cores)
    return records


def format_stream_table(records: list[dict]) -> str:
    """The records as a table: per stream, each method's tokens per pass, speed-up over plain and verdict, and
    tokens per pass by position in the stream."""
    lines = []
    for name in dict.fromkeys(r["stream"] for r in records):
        group = [r for r in records if r["stream"] == name]
        r0 = group[0]
        path = r0.get("precision", "fp32") + (" (batch-invariant path)" if r0.get("batch_invariant") else "")
        lines.append(f"{name}: {r0['n_requests']} requests x {r0['max_new_tokens']} tokens, {r0['repeats']} "
                     f"repeats, weights {path}, A/A noise band {r0['noise_band'][0]:.2f}-{r0['noise_band'][1]:.2f}")
        for r in group:
            lo, hi = r["speedup_interval"]
            tau = "-" if r["tokens_per_target_pass"] is None else f"{r['tokens_per_target_pass']:.2f}"
            extra = "" if "vs_prompt_lookup" not in r else (
                f"; vs prompt lookup {r['vs_prompt_lookup']:.2f}x ({r['vs_prompt_lookup_interval'][0]:.2f}-"
                f"{r['vs_prompt_lookup_interval'][1]:.2f}) {r['vs_prompt_lookup_verdict']}")
            flags = ("" if r["identical_to_plain_greedy"] else "  NOT identical") + (
                "" if r["same_every_repeat"] else "  CHANGED between repeats")
            lines.append(f"  {r['method']:<16} tau {tau:>5}  {r['speedup_vs_plain']:.2f}x ({lo:.2f}-{hi:.2f}) "
                         f"{r['verdict']}{extra}{flags}")
            lines.append(f"  {'':<16} tau by position: " + " ".join(f"{t:.2f}" for t in r["tau_by_position"]))
            if "choices" in r:
                lines.append(f"  {'':<16} chose: {format_choices(r['choices'])}")
        busy = busy_machine_note(r0.get("other_cpu_cores"))
        if busy:
            lines.append(f"  {busy}")
    return "\n".join(lines)


def tree_costs(texts: list[list[int]], sizes, contexts: dict[str, list[list[int]]], max_requests: int | None = None,
               max_depth: int = 24, repeat: int = 5) -> list[dict]:
    """Memory and time of a global tree against the number of requests it was given: for each n in ``sizes``
    (increasing), the tree after the first n of ``texts`` (capped at ``max_requests``, oldest evicted): its
    nodes and bytes, the mean seconds of one insert so far, and for each named set of ``contexts`` the median
    seconds of one lookup and draft (:meth:`~minigpt.decoding.suffix.SuffixTree.speculate` with the declared
    ``suffix`` method's settings; best of ``repeat``) and the mean number of candidates it proposed."""
    s = METHODS["suffix"].defaults()
    args = (s["max_spec"], s["factor"], s["offset"], s["min_prob"], True)
    cache = GlobalTree(max_requests or max(sizes), max_depth)
    out, done, insert_s = [], 0, 0.0
    for n in sorted(sizes):
        t0 = time.perf_counter()
        for text in texts[done:n]:
            cache.add(text)
        insert_s += time.perf_counter() - t0
        done = n
        row = dict(requests_given=n, requests_held=len(cache), nodes=cache.tree.n_nodes,
                   bytes=cache.tree.memory_bytes(), insert_s_mean=insert_s / n if n else 0.0)
        for name, ctxs in contexts.items():
            times, sizes_ = [], []
            for ctx in ctxs:
                best = float("inf")
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    draft = cache.tree.speculate(ctx, *args)
                    best = min(best, time.perf_counter() - t0)
                times.append(best)
                sizes_.append(len(draft.tokens))
            row[f"lookup_s_{name}"] = statistics.median(times)
            row[f"candidates_{name}"] = statistics.mean(sizes_)
        out.append(row)
    return out


def main_stream(argv: list[str]) -> int:
    """``python -m minigpt.bench --stream dev|held-out ...`` (``argv``: those arguments): the stream race on the
    course pair or SmolLM2, a table on stdout, the records as JSON with ``--json`` (with the command line)."""
    ap = argparse.ArgumentParser(prog="python -m minigpt.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stream", dest="split", choices=["dev", "held-out"], required=True,
                    help="the development stream(s), or the held-out one(s)")
    ap.add_argument("--model", choices=["course", "smollm2"], default="course")
    ap.add_argument("--methods", default=",".join(DEFAULT_STREAM_METHODS))
    ap.add_argument("--kinds", default=None, help="smollm2: comma-separated stream kinds (default all)")
    ap.add_argument("--n-requests", type=int, default=None, help="requests per stream (default: all / 10)")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", choices=PRECISIONS, default="fp32",
                    help="smollm2: the target's weights, fp32 (default) or bf16 / int4 / w8a8 / w4a8 on the batch-invariant "
                         "path (minigpt.precision; CPU only); every speed-up is over plain decoding at the same precision")
    ap.add_argument("--suffix-settings", default=None, metavar="K=V,...",
                    help="changes to the suffix methods' parameters, e.g. max_spec=24,factor=4,min_score=0 (tune them "
                         "on the development streams only)")
    ap.add_argument("--quick", action="store_true", help="3 requests per stream, 32 tokens, 2 repeats (no verdicts)")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    if args.quick:
        args.n_requests, args.max_new_tokens = args.n_requests or 3, args.max_new_tokens or 32
        args.repeats = 2
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        names = check_stream_methods(args.methods.split(","))
        changes = parse_suffix_settings(args.suffix_settings)
        if args.model == "course":
            streams = [course_stream(args.split, args.n_requests or 10, args.max_new_tokens or 48)]
            models = None if args.precision == "fp32" else Models.shipped(
                "cpu", methods=[n for n in names if n in METHODS], precision=args.precision)
        else:
            kinds = tuple(k.strip() for k in (args.kinds or ",".join(SMOLLM2_KINDS)).split(","))
            streams = smollm2_streams(args.split, kinds, args.max_new_tokens or 96, args.n_requests)
            # what the methods need, and what auto uses when it is installed
            models = smollm2_models("cpu", precision=args.precision, needs=wanted(names))
    except (ValueError, FileNotFoundError, ImportError) as e:
        print(f"{ap.prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    records = run_stream_bench(streams, names, models, args.repeats, suffix_settings=changes,
                               log=lambda m: print(m, file=sys.stderr))
    print(format_stream_table(records))
    if args.json:
        command = "python -m minigpt.bench " + " ".join(argv)
        Path(args.json).write_text(json.dumps(dict(command=command, records=records), indent=1) + "\n")
    return 0 if all(r["identical_to_plain_greedy"] and r["same_every_repeat"] for r in records) else 1
