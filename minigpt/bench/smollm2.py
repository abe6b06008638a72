"""The benchmark on SmolLM2-135M-Instruct (Lesson 09): its :class:`~minigpt.decoding.registry.Models` and the
``--model smollm2`` branch of the command line.

Chat requests instead of code windows (:data:`minigpt.real.request_sets.REQUESTS` and ``HELD_OUT_REQUESTS``),
each method with its defaults for the "smollm2" family (prompt lookup's chosen for SmolLM2), and only the methods
whose drafters are installed (the others are skipped in one line).
"""
from __future__ import annotations

import sys

from ..checkpoint import CheckpointError
from ..decoding.registry import wanted
from ..engines import LlamaCpp, engine_methods
from ..real.hf import load_hf_smollm
from ..real.loaders import EARLY_EXIT_LAYERS, TRAIN_COMMANDS, load_drafters
from ..real.request_sets import KINDS, real_prompts, w8a8_calibration
from ..real.smollm import STOP, load_smollm, load_smollm_tokenizer
from .methods import METHODS, Models
from .run import resolve_params, run_bench
from .table import report

# per_kind None = every request of the chosen kinds and split. Long enough for an edit request's answer, which
# returns a 10-30-line function whole.
SMOLLM2_BENCH_PRESETS = {"full": dict(per_kind=None, max_new_tokens=256, repeats=5),
                         "quick": dict(per_kind=1, max_new_tokens=32, repeats=2)}


def smollm2_models(device=None, target=None, precision: str = "fp32", needs=None) -> Models:
    """:class:`~minigpt.decoding.registry.Models` for SmolLM2 (the "smollm2" family): the model (``target``, or
    loaded at ``precision``) and its tokenizer, the installed drafters among ``needs`` (:class:`Models` fields, as
    :func:`~minigpt.decoding.registry.wanted` gives them; default: every installed one: the shipped draft, Medusa
    heads, EAGLE and EAGLE-3 heads), the depth of the self-speculation draft, and ``<|im_end|>`` as the token that
    ends an answer."""
    if target is None:   # w8a8's smoothing is calibrated on the development requests
        target = load_smollm(device, precision=precision,
                             calibration=w8a8_calibration() if precision == "w8a8" else None)
    enc = load_smollm_tokenizer()
    target.tokenizer = enc
    models = Models(target, early_exit_layers=EARLY_EXIT_LAYERS, eos_id=enc.encode_single_token(STOP),
                    family="smollm2")
    return load_drafters(models, needs)


def main_smollm2(args, prog: str, names: list[str], dev) -> int:
    """``python -m minigpt.bench --model smollm2``: the parsed ``args``, the checked method ``names`` and
    device; errors in one line on stderr (exit status 2)."""
    cfg = dict(SMOLLM2_BENCH_PRESETS["quick" if args.quick else "full"])
    for k in ("max_new_tokens", "repeats"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    kinds = tuple(k.strip() for k in (args.kinds or ",".join(KINDS)).split(",") if k.strip())
    try:
        prompts = real_prompts(kinds=kinds, per_kind=cfg.pop("per_kind"), split=args.split)
        # the draft always: the engines' and peers' course-draft runs use it
        models = smollm2_models(dev, precision=args.precision, needs=wanted(names) | {"draft"})
        if args.peers:
            models.hf_target = load_hf_smollm(dev)
        engines = None
        if args.engines:
            engines = engine_methods(LlamaCpp(n_threads=args.threads or 1), models,
                                     resolve_params(list(METHODS), args.gamma, family=models.family))
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ImportError, CheckpointError) as e:
        print(f"{prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    skipped = {n: METHODS[n].needs for n in names if METHODS[n].missing(models)}
    if skipped:
        commands = sorted({TRAIN_COMMANDS[need] for needs in skipped.values() for need in needs if need in TRAIN_COMMANDS})
        print(f"skipping {', '.join(skipped)}: no trained drafter for SmolLM2 is installed "
              f"(python -m minigpt.real {' / '.join(commands)})", file=sys.stderr)
    names = [n for n in names if n not in skipped]
    print(f"benchmarking {', '.join(names)} on SmolLM2-135M-Instruct, {dev}: {len(prompts)} chat prompts, {cfg}",
          file=sys.stderr)
    records = run_bench(names, gamma=args.gamma, models=models, prompts=prompts, peers=args.peers, engines=engines,
                        log=lambda m: print(m, file=sys.stderr), **cfg)
    return report(records, args.json)
