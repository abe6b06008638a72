"""What a reduced precision costs in quality, next to the model it approximates: the same greedy text or not,
and the perplexity of held-out text (:mod:`minigpt.precision` gives the models; Lesson 13 reads the numbers).

    python -m minigpt.quality --model smollm2 --precision bf16,int4 --json quality.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from .checkpoint import load_pretrained
from .decoding.plain import generate
from .model import GPT
from .precision import PRECISIONS, reduce_precision
from .prompts import code_prompts, held_out_files
from .real.request_sets import real_prompts, w8a8_calibration
from .real.smollm import load_smollm, load_smollm_tokenizer
from .tokenizer import load_tokenizer


def greedy_agreement(reference: GPT, model: GPT, prompts: list[list[int]], n_new: int) -> dict:
    """Greedy continuations of ``n_new`` tokens from both models: how many prompts gave the same text, where
    the others first parted (0-based token index), and the share of all tokens produced before a parting."""
    firsts = []
    for p in prompts:
        a, b = generate(reference, p, n_new), generate(model, p, n_new)
        firsts.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), n_new))
    return dict(prompts=len(prompts), identical=sum(f == n_new for f in firsts), first_parting=firsts,
                share_before_parting=sum(firsts) / (n_new * len(prompts)))


@torch.no_grad()
def perplexity(model: GPT, tokens: list[int], window: int = 256, max_windows: int = 16) -> float:
    """exp(mean next-token cross-entropy) over up to ``max_windows`` consecutive windows of ``tokens``."""
    if len(tokens) < 2:
        raise ValueError("perplexity needs at least two tokens")
    window = min(window, model.config.block_size, len(tokens) - 1)
    total, count = 0.0, 0
    for start in range(0, min(len(tokens) - 1, window * max_windows), window):
        chunk = torch.tensor([tokens[start:start + window + 1]], device=model.device)
        if chunk.shape[1] < 2:
            break
        logits = model(chunk[:, :-1])[0].float()
        total += float(F.cross_entropy(logits, chunk[0, 1:], reduction="sum"))
        count += chunk.shape[1] - 1
    return math.exp(total / count)


# ------------------------------------------------------------------------------------------ the command line

def held_out_text(enc, max_tokens: int = 4096, per_file: int = 257) -> list[int]:
    """The first ``per_file`` tokens of each of the Python standard library's validation files
    (:func:`minigpt.prompts.held_out_files`, in path order), tokenized with ``enc``, until ``max_tokens``: text the
    course pair never trained on (SmolLM2 may have seen it; it is a fixed text to compare precisions on, not a
    measure of the model)."""
    ids: list[int] = []
    for _, text in held_out_files():
        ids += enc.encode_ordinary(text)[:per_file]
        if len(ids) >= max_tokens:
            break
    return ids[:max_tokens]


def compare_precisions(reference: GPT, models: dict[str, GPT], prompts: list[list[int]], n_new: int,
                       text: list[int], window: int = 257, log=None) -> dict:
    """A record per precision against ``reference`` (fp32): greedy agreement on ``prompts`` and perplexity of
    ``text`` for each model and for the reference."""
    out = {"fp32": dict(perplexity=perplexity(reference, text, window))}
    for name, model in models.items():
        if log:
            log(f"{name}: greedy agreement on {len(prompts)} prompts, perplexity of {len(text)} tokens")
        out[name] = dict(**greedy_agreement(reference, model, prompts, n_new),
                         perplexity=perplexity(model, text, window),
                         batch_invariant=bool(getattr(model, "batch_invariant", False)))
    return out


def main(argv=None) -> int:
    """``python -m minigpt.quality``: what bf16 and int4 (batch-invariant path) cost in quality against fp32,
    on the course target or SmolLM2."""
    ap = argparse.ArgumentParser(prog="python -m minigpt.quality", description=main.__doc__)
    ap.add_argument("--model", choices=["course", "smollm2"], default="course")
    ap.add_argument("--precision", default="bf16,int4", help="comma-separated, from " + ", ".join(PRECISIONS[1:]))
    ap.add_argument("--split", choices=["dev", "held-out"], default="held-out",
                    help="smollm2: which requests to continue (default held-out)")
    ap.add_argument("--prompts", type=int, default=12, help="course: how many held-out code windows")
    ap.add_argument("--new", type=int, default=64, help="greedy tokens per prompt")
    ap.add_argument("--text-tokens", type=int, default=4096, help="tokens of held-out text for the perplexity")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the record here")
    args = ap.parse_args(argv)
    names = [p.strip() for p in args.precision.split(",") if p.strip()]
    bad = [p for p in names if p not in PRECISIONS[1:]]
    if bad or not names or args.new < 1 or args.prompts < 1 or args.text_tokens < 2:
        print(f"{ap.prog}: error: precisions come from {', '.join(PRECISIONS[1:])}; --new, --prompts and "
              "--text-tokens must be positive", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    try:
        if args.model == "smollm2":
            reference, enc = load_smollm("cpu"), load_smollm_tokenizer()
            prompts = [list(p) for p in real_prompts(split=args.split)]
            calibration = w8a8_calibration()   # w8a8's smoothing: the development requests, as everywhere
        else:
            reference, enc = load_pretrained("target", "cpu"), load_tokenizer()
            prompts = [list(p) for p in code_prompts(args.prompts)]
            calibration = None
    except (FileNotFoundError, ImportError, ValueError) as e:
        print(f"{ap.prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    models = {p: reduce_precision(reference, p, calibration=calibration if p == "w8a8" else None) for p in names}
    text = held_out_text(enc, args.text_tokens)
    record = dict(model=args.model, split=args.split if args.model == "smollm2" else "held-out", new_tokens=args.new,
                  text_tokens=len(text), torch=torch.__version__,
                  results=compare_precisions(reference, models, prompts, args.new, text,
                                             log=lambda m: print(m, file=sys.stderr)))
    for name, r in record["results"].items():
        line = f"{name:>5}: perplexity {r['perplexity']:.3f}"
        if "identical" in r:
            line += (f" | greedy text identical to fp32 on {r['identical']}/{r['prompts']} prompts, "
                     f"{r['share_before_parting']:.0%} of tokens before the first parting")
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
