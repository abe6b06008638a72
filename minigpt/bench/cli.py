"""The command line of the benchmark, ``python -m minigpt.bench`` (its options: ``--help``)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ..checkpoint import PRETRAINED
from ..decoding import Models
from ..engines import require_llama_cpp
from ..precision import PRECISIONS
from ..real.hf import require_transformers
from .batch import DEFAULT_BATCH_METHODS, report_batch, run_batch_bench
from .methods import METHODS
from .run import check_device, check_methods, run_bench
from .smollm2 import main_smollm2
from .stream import main_stream
from .table import report

DESCRIPTION = "Benchmark every decoding method on the same held-out prompts: ``python -m minigpt.bench``."
BENCH_PRESETS = {"full": dict(n_code=8, n_edit=4, max_new_tokens=64, repeats=5),
                 "quick": dict(n_code=3, n_edit=1, max_new_tokens=32, repeats=3)}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a.split("=")[0] == "--stream" for a in argv):  # a stream's requests in order: minigpt.bench.stream
        return main_stream(argv)
    ap = argparse.ArgumentParser(prog="python -m minigpt.bench", description=DESCRIPTION)
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
    ap.add_argument("--engines", action="store_true",
                    help="smollm2 only: also race llama.cpp on the same GGUF file (plain, its prompt lookup, the "
                         "course's lookup and draft inside it); needs pip install -e '.[engines]'")
    ap.add_argument("--model", choices=["course", "smollm2"], default="course",
                    help="course: the shipped target and drafters (default); smollm2: the real model of Lesson 09 "
                         "(fetch it first: python -m minigpt.real.smollm fetch)")
    ap.add_argument("--kinds", default=None,
                    help="smollm2 only: comma-separated request kinds (default all: edit,document,code,chat)")
    ap.add_argument("--split", choices=["dev", "held-out", "all"], default="all",
                    help="smollm2 only: the development requests, the held-out ones, or both (default; reported "
                         "per set)")
    ap.add_argument("--batch", default=None, metavar="B,B,...",
                    help="decode B requests at once on the paged KV cache (plain, chain, prompt_lookup; any methods "
                         "named in --methods) for each batch size listed, e.g. 1,2,4,8,16, and report each "
                         "method's speed-up over plain")
    ap.add_argument("--stream", choices=["dev", "held-out"], default=None,
                    help="a stream of similar requests in arrival order (Lesson 14): plain, prompt_lookup, suffix; "
                         "its options: python -m minigpt.bench --stream dev --help")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads for torch (default 1: the models are tiny, and on a busy machine more "
                         "threads were measured to slow decoding down many times over; 0 = torch's default)")
    ap.add_argument("--draft", choices=[n for n in PRETRAINED if n != "target"], default="draft",
                    help="course only: the draft model of the methods that use one (default the pair's two-layer "
                         "draft; draft1: the earlier one-layer draft, to race the two)")
    ap.add_argument("--precision", choices=PRECISIONS, default="fp32",
                    help="the target's (and draft's) weights: fp32 (default), or bf16 / int4 / w8a8 / w4a8 on the "
                         "batch-invariant path (minigpt.precision; CPU only); with --engines, llama.cpp races our "
                         "methods at this precision in the same runs; every record says which ran")
    args = ap.parse_args(argv)
    try:
        if args.precision != "fp32" and (args.batch is not None or args.peers):
            raise ValueError(f"--precision {args.precision} goes with the single-sequence race (and --engines), "
                             "not with --batch or --peers")
        names = check_methods(args.methods.split(","))
        dev = check_device(args.device)
        if args.peers:
            try:
                require_transformers()
            except ImportError as e:
                raise ValueError(str(e)) from None
        if args.draft != "draft" and (args.model != "course" or args.batch is not None):
            raise ValueError("--draft chooses the course pair's draft in the single-sequence race: drop --model "
                             "smollm2 and --batch")
        if args.engines:
            if args.model != "smollm2":
                raise ValueError("--engines runs llama.cpp on SmolLM2's GGUF file: add --model smollm2")
            try:
                require_llama_cpp()
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
    if args.batch is not None:
        return main_batch(args, ap, dev)
    if args.model == "smollm2":
        return main_smollm2(args, ap.prog, names, dev)
    cfg = dict(BENCH_PRESETS["quick" if args.quick else "full"])
    for k in cfg:
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    if cfg["repeats"] < 1 or cfg["max_new_tokens"] < 1 or cfg["n_code"] + cfg["n_edit"] < 1:
        ap.error("repeats, max-new-tokens and the number of prompts must be positive")
    models = Models.shipped(dev, methods=names, precision=args.precision, draft=args.draft)
    missing = [n for n in names if METHODS[n].missing(models)]   # e.g. eagle3: the course's pair has no such head
    if missing and args.methods != ",".join(METHODS):
        print(f"{ap.prog}: error: the course's pair has no drafter for {', '.join(missing)}", file=sys.stderr)
        return 2
    names = [n for n in names if n not in missing]
    print(f"benchmarking {', '.join(names)} on {dev}: {cfg}", file=sys.stderr)
    records = run_bench(names, gamma=args.gamma, device=dev, peers=args.peers, models=models,
                        log=lambda m: print(m, file=sys.stderr), **cfg)
    for r in records:
        r["draft_model"] = args.draft   # which shipped draft the methods that use one ran with
    return report(records, args.json)


def main_batch(args, ap, dev) -> int:
    """``--batch``: the batch-size race of :mod:`.batch`."""
    try:
        sizes = [int(b) for b in args.batch.split(",")]
    except ValueError:
        ap.error(f"--batch takes comma-separated batch sizes such as 1,2,4,8, got {args.batch!r}")
    if min(sizes) < 1:
        ap.error("batch sizes must be positive")
    if args.model != "course":
        ap.error("--batch runs the course's models only")
    named = args.methods != ",".join(METHODS)  # --methods given: race those; else the default three
    chosen = [m for m in args.methods.split(",") if m.strip()] if named else list(DEFAULT_BATCH_METHODS)
    quick = args.quick
    records = run_batch_bench(sizes, chosen,
                              max_new_tokens=args.max_new_tokens or (32 if quick else 64),
                              repeats=args.repeats or (3 if quick else 5), gamma=args.gamma, device=dev,
                              log=lambda m: print(m, file=sys.stderr))
    print(report_batch(records))
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    return 0 if all(r["identical_to_solo_plain"] and not r["blocks_left"] for r in records) else 1
