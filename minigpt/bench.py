"""Benchmark every decoding method on the same held-out prompts: ``python -m minigpt.bench``.

    python -m minigpt.bench                       # all methods, 8 code + 4 edit prompts, 64 new tokens
    python -m minigpt.bench --quick               # a smaller run (under a minute on a laptop CPU)
    python -m minigpt.bench --methods plain,chain --gamma 6 --json results.json --device cpu

All methods decode greedily (temperature 0), so each must reproduce plain greedy decoding token for token;
the benchmark checks that on every prompt. Timing is fair by construction: the methods run interleaved,
prompt by prompt (their order rotating), after a warm-up, and each speed is a median over repeats. Plain
decoding always runs, since it is the baseline of ``speedup_vs_plain`` and of the exactness check.

A new decoder joins by registering a function ``run(models, prompt, max_new_tokens, **params) ->
(new ids, DecodeStats)``::

    @register("prompt_lookup", max_ngram=3, num_pred=8)
    def _prompt_lookup(models, prompt, max_new_tokens, max_ngram, num_pred):
        return lookup_generate(models.target, prompt, max_new_tokens, max_ngram=max_ngram, num_pred=num_pred)
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .checkpoint import load_pretrained
from .decoding import DecodeStats, generate, speculative_generate
from .decoding.lookup import lookup_generate
from .decoding.medusa import medusa_generate
from .decoding.tree import tree_generate
from .device import get_device, synchronize
from .prompts import Prompt, code_prompts, edit_prompts


@dataclass
class Models:
    """What a method may use: the target, a draft, Medusa heads (with the heads' tree), the depth of the
    target's own early-exit draft (self-speculation; default a third of its layers), and the token that ends
    an answer (every method stops after it; None: never stop early)."""
    target: torch.nn.Module
    draft: torch.nn.Module | None = None
    medusa_heads: torch.nn.Module | None = None
    medusa_paths: list | None = None
    early_exit_layers: int | None = None
    hf_target: object | None = None  # transformers' own model of the same weights (for --peers), if it has one
    eos_id: int | None = None

    @classmethod
    def shipped(cls, device, medusa: bool = False) -> "Models":
        models = cls(load_pretrained("target", device), load_pretrained("draft", device))
        if medusa:
            from .medusa import load_medusa
            models.medusa_heads, models.medusa_paths = load_medusa(models.target)
        return models


@dataclass
class Method:
    name: str
    run: Callable  # run(models, prompt, max_new_tokens, **params) -> (new ids, DecodeStats)
    params: dict = field(default_factory=dict)
    description: str = ""


METHODS: dict[str, Method] = {}


def register(name: str, description: str = "", **params):
    """Decorator: add a decoding method to the benchmark under ``name`` with default ``params``."""
    def deco(fn):
        METHODS[name] = Method(name, fn, dict(params), description or (fn.__doc__ or "").strip())
        return fn
    return deco


@register("plain", "one target pass per token, with a KV cache")
def _plain(models: Models, prompt, max_new_tokens: int):
    stats = DecodeStats()
    return generate(models.target, prompt, max_new_tokens, eos_id=models.eos_id, stats=stats), stats


@register("chain", "draft model proposes gamma tokens, target verifies them in one pass", gamma=4)
def _chain(models: Models, prompt, max_new_tokens: int, gamma: int):
    return speculative_generate(models.target, models.draft, prompt, max_new_tokens, gamma=gamma, eos_id=models.eos_id)


@register("tree", "draft model grows a token tree (top-k at uncertain positions), target verifies it in one pass",
          budget=12, max_depth=6, branch=2, threshold=0.6)
def _tree(models: Models, prompt, max_new_tokens: int, budget: int, max_depth: int, branch: int, threshold: float):
    return tree_generate(models.target, models.draft, prompt, max_new_tokens, budget=budget, max_depth=max_depth,
                         branch=branch, threshold=threshold, eos_id=models.eos_id)


@register("prompt_lookup", "copy what followed the last earlier occurrence of the current suffix; no draft model",
          max_ngram=3, num_pred=8)
def _prompt_lookup(models: Models, prompt, max_new_tokens: int, max_ngram: int, num_pred: int):
    return lookup_generate(models.target, prompt, max_new_tokens, max_ngram=max_ngram, num_pred=num_pred,
                           eos_id=models.eos_id)


@register("prompt_lookup_adaptive", "prompt lookup whose proposal length follows acceptance: +2 after a full "
          "accept, -1 after a miss, from num_pred within [1, max_pred]", max_ngram=3, num_pred=8, max_pred=32)
def _prompt_lookup_adaptive(models: Models, prompt, max_new_tokens: int, max_ngram: int, num_pred: int, max_pred: int):
    return lookup_generate(models.target, prompt, max_new_tokens, max_ngram=max_ngram, num_pred=num_pred,
                           adaptive=True, max_pred=max_pred, eos_id=models.eos_id)


@register("self_spec", "the target's own first layers draft gamma tokens (early exit), the full target verifies",
          gamma=4)
def _self_spec(models: Models, prompt, max_new_tokens: int, gamma: int):
    from .selfspec import early_exit_draft
    n = models.early_exit_layers or max(1, models.target.config.n_layer // 3)
    return speculative_generate(models.target, early_exit_draft(models.target, n), prompt, max_new_tokens, gamma=gamma,
                                eos_id=models.eos_id)


@register("medusa", "Medusa heads on the target propose a sparse candidate tree; exact (tree) verification")
def _medusa(models: Models, prompt, max_new_tokens: int):
    return medusa_generate(models.target, models.medusa_heads, prompt, max_new_tokens, paths=models.medusa_paths,
                           eos_id=models.eos_id)


COUNTS = ("new_tokens", "target_passes", "draft_passes", "proposed", "tested", "accepted", "rounds")
PRESETS = {"full": dict(n_code=8, n_edit=4, max_new_tokens=64, repeats=5),
           "quick": dict(n_code=3, n_edit=1, max_new_tokens=32, repeats=3)}
# SmolLM2 (--model smollm2): chat requests instead of code windows (minigpt.real.REQUESTS and
# HELD_OUT_REQUESTS); per_kind None = every request of the chosen kinds and split. Long enough for an edit
# request's answer, which returns a 10-30-line function whole.
REAL_PRESETS = {"full": dict(per_kind=None, max_new_tokens=256, repeats=5),
                "quick": dict(per_kind=1, max_new_tokens=32, repeats=2)}


def check_device(name: str | None) -> torch.device:
    """The device to run on (``None``: :func:`minigpt.get_device`); ValueError in one line if unusable."""
    if name is None:
        return get_device()
    try:
        dev = torch.device(name)
        torch.empty(1, device=dev)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"device {name!r} is not usable here ({first})") from None
    return dev


def check_methods(names) -> list[str]:
    """Validate method names; plain is always included first (it is the baseline)."""
    names = [n.strip() for n in names if n.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; available: {', '.join(METHODS)}")
    return ["plain"] + [n for n in dict.fromkeys(names) if n != "plain"]


def _finite(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def bench_prompts(n_code: int, n_edit: int) -> list[Prompt]:
    """The benchmark's prompts: held-out code windows, then copy-heavy edit prompts."""
    return code_prompts(n_code) + edit_prompts(n_edit)


def run_bench(methods=("plain", "chain"), n_code: int = 8, n_edit: int = 4, max_new_tokens: int = 64,
              repeats: int = 5, gamma: int | None = None, device: str | torch.device | None = None,
              models: Models | None = None, prompts: list | None = None, peers: bool = False,
              method_params: dict | None = None, log=None) -> list[dict]:
    """Run ``methods`` (greedy) on the prompt set; return one record per method (see the module docstring).

    ``gamma`` overrides the draft length of every method that has one; ``method_params`` overrides any
    method's parameters (``{"prompt_lookup": {"num_pred": 16}}``). ``models``/``prompts`` replace the
    shipped pair / the default prompt set (tests use this). ``peers``: also run Hugging Face transformers'
    decoders (:mod:`minigpt.peers`) on the same weights, with our matching methods (plain, chain,
    prompt_lookup) added if missing; their records get ``ours_over_theirs`` (our method's tokens/s over theirs,
    median over repeats) and ``identical_to_ours``. ``log``: a function to report progress to.

    Each record's ``by_kind`` repeats the counts, times and speedups for the prompts of each kind alone (the
    ``kind`` of a :class:`~minigpt.prompts.Prompt`), from the same interleaved runs; when the prompts come
    from named sets (a Prompt's ``split``, e.g. "dev" and "held-out"), ``by_split`` does the same for each set,
    with that set's own ``by_kind``."""
    names = check_methods(methods)
    dev = check_device(device) if models is None else models.target.device
    if models is None:
        models = Models.shipped(dev, medusa="medusa" in names)
    if peers:  # our side of each pair joins the race (the chain only when there is a draft to assist with)
        from .peers import PAIRS
        names += [ours for ours in PAIRS.values()
                  if ours in METHODS and ours not in names and (ours != "chain" or models.draft is not None)]
    prompts = prompts if prompts is not None else bench_prompts(n_code, n_edit)
    if not prompts:
        raise ValueError("no prompts to run")
    params = {n: {k: (gamma if k == "gamma" and gamma is not None else v) for k, v in METHODS[n].params.items()}
              for n in names}
    for n, over in (method_params or {}).items():
        if n in params:
            unknown = set(over) - set(params[n])
            if unknown:
                raise ValueError(f"method {n!r} has no parameter {sorted(unknown)[0]!r}; it has {sorted(params[n])}")
            params[n].update(over)
    peer_fns = {}
    if peers:
        from .peers import PAIRS, peer_methods, settings_from_bench
        peer_fns = {n: fn for n, fn in peer_methods(models.target, models.draft, hf_target=models.hf_target,
                                                    eos_id=models.eos_id, **settings_from_bench(params)).items()
                    if PAIRS[n] in names}
        names += list(peer_fns)
        params.update({n: fn.params for n, fn in peer_fns.items()})

    def call(name, prompt):
        synchronize(dev)
        t0 = time.perf_counter()
        if name in peer_fns:
            ids = peer_fns[name](prompt, max_new_tokens)
            stats = peer_fns[name].stats
        else:
            ids, stats = METHODS[name].run(models, prompt, max_new_tokens, **params[name])
        synchronize(dev)
        return ids, stats, time.perf_counter() - t0

    for name in names:  # warm-up: first calls pay for allocations and kernel selection
        call(name, prompts[0])
    outputs = {n: [None] * len(prompts) for n in names}       # first repeat's output per prompt
    stats = {n: [None] * len(prompts) for n in names}
    identical = {n: [True] * len(prompts) for n in names}
    times = {n: [[0.0] * len(prompts) for _ in range(repeats)] for n in names}  # seconds per repeat and prompt
    for r in range(repeats):
        if log:
            log(f"repeat {r + 1}/{repeats}")
        for i, prompt in enumerate(prompts):
            k = (i + r) % len(names)
            for name in names[k:] + names[:k]:  # rotate the order so no method always goes first
                ids, st, dt = call(name, prompt)
                times[name][r][i] = dt
                if r == 0:
                    outputs[name][i], stats[name][i] = ids, st
                elif ids != outputs[name][i]:
                    identical[name][i] = False  # greedy decoding must not change between repeats
    new_tokens = {n: sum(len(o) for o in outputs[n]) for n in names}
    for n in names:
        for i in range(len(prompts)):
            if outputs[n][i] != outputs["plain"][i]:
                identical[n][i] = False

    def totals(name, idx):
        s = DecodeStats()
        for i in idx:
            st = stats[name][i]
            for f in COUNTS:
                setattr(s, f, getattr(s, f) + getattr(st, f))
        return s

    kind_of = [getattr(p, "kind", "") or "prompt" for p in prompts]  # "code", "edit", ... per prompt
    of_kind = {kind: [i for i, k in enumerate(kind_of) if k == kind] for kind in sorted(set(kind_of))}
    split_of = [getattr(p, "split", "") for p in prompts]             # "dev", "held-out", or "" (no sets)
    of_split = {sp: [i for i, x in enumerate(split_of) if x == sp] for sp in dict.fromkeys(split_of) if sp}
    every = range(len(prompts))

    def timing(name, idx):  # per repeat: the seconds spent on the prompts idx, and the speedup over plain
        t = [sum(times[name][r][i] for i in idx) for r in range(repeats)]
        return t, [sum(times["plain"][r][i] for i in idx) / tr for r, tr in enumerate(t)]

    records = []
    for n in names:
        s = totals(n, every)
        total_times, speedups = timing(n, every)
        tps = [new_tokens[n] / t for t in total_times]
        def group(idx):  # the counts, times and speedups of the prompts idx alone
            sk = totals(n, idx)
            tk, spk = timing(n, idx)
            return dict(n_prompts=len(idx), new_tokens=sum(len(outputs[n][i]) for i in idx),
                        tokens_per_target_pass=_finite(sk.tokens_per_target_pass),
                        acceptance_rate=_finite(sk.acceptance_rate) if sk.tested else None,
                        share_of_proposed_accepted=_finite(sk.share_of_proposed_accepted) if sk.proposed else None,
                        time_s_median=statistics.median(tk), speedup_vs_plain=statistics.median(spk),
                        speedup_min=min(spk), speedup_max=max(spk),
                        identical_to_plain_greedy=all(identical[n][i] for i in idx))
        by_kind = {kind: group(idx) for kind, idx in of_kind.items()}
        by_split = {sp: dict(group(idx), by_kind={kind: group([i for i in idx if kind_of[i] == kind])
                                                  for kind in of_kind if any(kind_of[i] == kind for i in idx)})
                    for sp, idx in of_split.items()}
        records.append(dict(
            method=n, description=peer_fns[n].description if n in peer_fns else METHODS[n].description,
            params=params[n], gamma=params[n].get("gamma"),
            device=str(dev), dtype=str(next(models.target.parameters()).dtype).replace("torch.", ""),
            torch_threads=torch.get_num_threads(), n_prompts=len(prompts), max_new_tokens=max_new_tokens,
            new_tokens=new_tokens[n], repeats=repeats,
            target_passes=s.target_passes, draft_passes=s.draft_passes, rounds=s.rounds,
            tokens_per_target_pass=_finite(s.tokens_per_target_pass),
            acceptance_rate=_finite(s.acceptance_rate) if s.tested else None,
            share_of_proposed_accepted=_finite(s.share_of_proposed_accepted) if s.proposed else None,
            tokens_per_s=statistics.median(tps), tokens_per_s_min=min(tps), tokens_per_s_max=max(tps),
            time_s_median=statistics.median(total_times), time_s_min=min(total_times), time_s_max=max(total_times),
            speedup_vs_plain=statistics.median(speedups), speedup_min=min(speedups), speedup_max=max(speedups),
            identical_to_plain_greedy=all(identical[n]),
            mismatched_prompts=[p.name if isinstance(p, Prompt) else i
                                for i, (p, ok) in enumerate(zip(prompts, identical[n])) if not ok],
            by_kind=by_kind, by_split=by_split,
        ))
        if n in peer_fns:  # transformers' method next to our matching one, timed in the same loop
            ours = PAIRS[n]

            def against_ours(idx):
                return dict(identical_to_ours=all(outputs[n][i] == outputs[ours][i] for i in idx),
                            ours_over_theirs=statistics.median(
                                t / o for t, o in zip(timing(n, idx)[0], timing(ours, idx)[0])))
            records[-1].update(ours=ours, **against_ours(every))
            for kind, idx in of_kind.items():
                by_kind[kind].update(against_ours(idx))
            for sp, idx in of_split.items():
                by_split[sp].update(against_ours(idx))
    return records


def format_table(records: list[dict]) -> str:
    """A plain-text table of the records."""
    head = f"{'method':<24}{'gamma':>6}{'tok/pass':>10}{'alpha':>8}{'tok/s (min-max)':>22}" \
           f"{'speedup (min-max)':>22}{'identical':>11}"
    lines = [head, "-" * len(head)]
    for r in records:
        a = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.3f}"
        g = "-" if r["gamma"] is None else str(r["gamma"])
        tps = f"{r['tokens_per_s']:.1f} ({r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f})"
        sp = f"{r['speedup_vs_plain']:.2f}x ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})"
        lines.append(f"{r['method']:<24}{g:>6}{r['tokens_per_target_pass']:>10.2f}{a:>8}{tps:>22}{sp:>22}"
                     f"{str(r['identical_to_plain_greedy']):>11}")
    r0 = records[0]
    for r in records:
        if "ours_over_theirs" in r:
            lines.append(f"{r['method']}: ours ({r['ours']}) / theirs = {r['ours_over_theirs']:.2f}x tokens/s, "
                         f"identical tokens: {r['identical_to_ours']}")
    groups = [(kind, lambda r, k=kind: r["by_kind"][k]) for kind in r0["by_kind"]] if len(r0["by_kind"]) > 1 else []
    for sp, g in r0.get("by_split", {}).items():
        groups.append((sp, lambda r, s=sp: r["by_split"][s]))
        if len(g["by_kind"]) > 1:
            groups += [(f"{sp} {kind}", lambda r, s=sp, k=kind: r["by_split"][s]["by_kind"][k]) for kind in g["by_kind"]]
    if groups:
        lines.append("per group: tokens per target pass, alpha, speedup over plain (median, min-max over repeats)")
        for label, get in groups:
            lines.append(f"  {label} ({get(r0)['n_prompts']} prompts)")
            for r in records:
                g = get(r)
                a = "-" if g["acceptance_rate"] is None else f"{g['acceptance_rate']:.3f}"
                lines.append(f"    {r['method']:<24}{g['tokens_per_target_pass']:>7.2f}{a:>8}    "
                             f"{g['speedup_vs_plain']:.2f}x ({g['speedup_min']:.2f}-{g['speedup_max']:.2f})"
                             f"{'' if g['identical_to_plain_greedy'] else '   NOT identical'}")
    lines.append(f"{r0['n_prompts']} prompts, {r0['max_new_tokens']} new tokens each (at most), greedy, "
                 f"{r0['repeats']} repeats (medians), device {r0['device']}, {r0['dtype']}, "
                 f"{r0['torch_threads']} threads; alpha = accepted / tested drafted tokens (for tree, medusa and a lookup tree: "
                 f"accepted / tree levels tested, their level acceptance)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minigpt.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer prompts, tokens and repeats")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of: {', '.join(METHODS)}")
    ap.add_argument("--device", default=None, help="cpu, cuda, mps ... (default: minigpt.get_device())")
    ap.add_argument("--json", metavar="FILE", help="also write the records as JSON")
    ap.add_argument("--gamma", type=int, default=None, help="draft length for methods that have one")
    ap.add_argument("--n-code", type=int, help="number of code prompts")
    ap.add_argument("--n-edit", type=int, help="number of edit (copy-heavy) prompts")
    ap.add_argument("--max-new-tokens", type=int, help="tokens generated per prompt")
    ap.add_argument("--repeats", type=int, help="timed repeats (medians are reported)")
    ap.add_argument("--peers", action="store_true",
                    help="also run Hugging Face transformers' decoders on the same weights (hf_plain, hf_assisted, "
                         "hf_prompt_lookup); needs pip install -e '.[peers]'")
    ap.add_argument("--model", choices=["course", "smollm2"], default="course",
                    help="course: the shipped target and drafters (default); smollm2: the real model of Lesson 09 "
                         "(fetch it first: python -m minigpt.smollm fetch)")
    ap.add_argument("--kinds", default=None,
                    help="smollm2 only: comma-separated request kinds (default all: edit,document,code,chat)")
    ap.add_argument("--split", choices=["dev", "held-out", "all"], default="all",
                    help="smollm2 only: the development requests, the held-out ones, or both (default; reported "
                         "per set)")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads for torch (default 1: the models are tiny, and on a busy machine more "
                         "threads were measured to slow decoding down many times over; 0 = torch's default)")
    args = ap.parse_args(argv)
    try:
        names = check_methods(args.methods.split(","))
        dev = check_device(args.device)
        if args.peers:
            from .hf import require_transformers
            try:
                require_transformers()
            except ImportError as e:
                raise ValueError(str(e)) from None
    except ValueError as e:  # one line, no usage dump: the message says what to do
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 2
    if args.threads < 0:
        ap.error("threads must be 0 (torch's default) or more")
    if args.threads and dev.type == "cpu":
        torch.set_num_threads(args.threads)
    if args.gamma is not None and args.gamma < 1:
        ap.error("gamma must be at least 1")
    if args.model == "smollm2":
        return _main_smollm2(args, ap, names, dev)
    cfg = dict(PRESETS["quick" if args.quick else "full"])
    for k in cfg:
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    if cfg["repeats"] < 1 or cfg["max_new_tokens"] < 1 or cfg["n_code"] + cfg["n_edit"] < 1:
        ap.error("repeats, max-new-tokens and the number of prompts must be positive")
    print(f"benchmarking {', '.join(names)} on {dev}: {cfg}", file=sys.stderr)
    records = run_bench(names, gamma=args.gamma, device=dev, peers=args.peers,
                        log=lambda m: print(m, file=sys.stderr), **cfg)
    return _report(records, args.json)


def _report(records: list[dict], json_path: str | None) -> int:
    print(format_table(records))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(records, f, indent=2)
        print(f"wrote {json_path}", file=sys.stderr)
    return 0 if all(r["identical_to_plain_greedy"] for r in records) else 1


def _main_smollm2(args, ap, names: list[str], dev) -> int:
    """The benchmark on SmolLM2-135M-Instruct (Lesson 09) with the drafters that exist for it."""
    from . import real
    from .checkpoint import CheckpointError
    cfg = dict(REAL_PRESETS["quick" if args.quick else "full"])
    for k in ("max_new_tokens", "repeats"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    kinds = tuple(k.strip() for k in (args.kinds or ",".join(real.KINDS)).split(",") if k.strip())
    try:
        prompts = real.real_prompts(kinds=kinds, per_kind=cfg.pop("per_kind"), split=args.split)
        models = real.smollm2_models(dev, draft=True, medusa="medusa" in names)
        if args.peers:
            models.hf_target = real.load_hf_smollm(dev)
    except ValueError as e:
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ImportError, CheckpointError) as e:
        print(f"{ap.prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    missing = {"chain": models.draft, "tree": models.draft, "medusa": models.medusa_heads}
    skipped = [n for n in names if n in missing and missing[n] is None]
    if skipped:
        print(f"skipping {', '.join(skipped)}: no trained drafter for SmolLM2 is installed "
              f"(python -m minigpt.real train-draft / train-medusa)", file=sys.stderr)
    names = [n for n in names if n not in skipped]
    print(f"benchmarking {', '.join(names)} on SmolLM2-135M-Instruct, {dev}: {len(prompts)} chat prompts, {cfg}",
          file=sys.stderr)
    records = run_bench(names, gamma=args.gamma, models=models, prompts=prompts, peers=args.peers,
                        method_params=real.LOOKUP_SETTINGS, log=lambda m: print(m, file=sys.stderr), **cfg)
    return _report(records, args.json)


if __name__ == "__main__":
    sys.exit(main())
