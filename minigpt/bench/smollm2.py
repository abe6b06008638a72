"""The benchmark on SmolLM2-135M-Instruct (Lesson 09): its :class:`~minigpt.bench.methods.Models` and the
``--model smollm2`` branch of the command line.

Chat requests instead of code windows (:data:`minigpt.real.request_sets.REQUESTS` and ``HELD_OUT_REQUESTS``),
prompt lookup with the settings chosen for SmolLM2 (:data:`minigpt.real.loaders.LOOKUP_SETTINGS`), and only
the drafters that exist for it.
"""
from __future__ import annotations

import sys

from ..checkpoint import CheckpointError
from ..engines import LlamaCpp, engine_methods
from ..real.hf import load_hf_smollm
from ..real.loaders import (EARLY_EXIT_LAYERS, LOOKUP_SETTINGS, SMOLLM2_DRAFT_CHECKPOINT, SMOLLM2_EAGLE_CHECKPOINT,
                            SMOLLM2_MEDUSA_CHECKPOINT, load_smollm2_draft, load_smollm2_eagle, load_smollm2_medusa)
from ..real.request_sets import KINDS, real_prompts
from ..real.smollm import STOP, load_smollm, load_smollm_tokenizer
from .methods import Models
from .run import run_bench
from .table import report

# per_kind None = every request of the chosen kinds and split. Long enough for an edit request's answer, which
# returns a 10-30-line function whole.
SMOLLM2_BENCH_PRESETS = {"full": dict(per_kind=None, max_new_tokens=256, repeats=5),
                         "quick": dict(per_kind=1, max_new_tokens=32, repeats=2)}


def smollm2_models(device=None, draft: bool = True, medusa: bool = True, target=None, eagle: bool = True) -> Models:
    """:class:`~minigpt.bench.methods.Models` for SmolLM2: the model (``target``, or loaded), the shipped draft,
    Medusa heads and EAGLE head when present, the depth of the self-speculation draft, and ``<|im_end|>`` as the
    token that ends an answer."""
    target = load_smollm(device) if target is None else target
    models = Models(target, early_exit_layers=EARLY_EXIT_LAYERS,
                    eos_id=load_smollm_tokenizer().encode_single_token(STOP))
    if draft and SMOLLM2_DRAFT_CHECKPOINT.exists():
        models.draft = load_smollm2_draft(target.device)
    if medusa and SMOLLM2_MEDUSA_CHECKPOINT.exists():
        models.medusa_heads, models.medusa_paths = load_smollm2_medusa(target)
    if eagle and SMOLLM2_EAGLE_CHECKPOINT.exists():
        models.eagle_head = load_smollm2_eagle(target)
    return models


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
        models = smollm2_models(dev, draft=True, medusa="medusa" in names, eagle="eagle" in names)
        if args.peers:
            models.hf_target = load_hf_smollm(dev)
        engines = None
        if args.engines:
            lookup = LOOKUP_SETTINGS.get("prompt_lookup", {})
            engines = engine_methods(LlamaCpp(n_threads=args.threads or 1), models.draft, models.eos_id,
                                     gamma=args.gamma or 4, **{k: lookup[k] for k in ("max_ngram", "num_pred")
                                                               if k in lookup})
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ImportError, CheckpointError) as e:
        print(f"{prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    missing = {"chain": models.draft, "tree": models.draft, "medusa": models.medusa_heads, "eagle": models.eagle_head}
    skipped = [n for n in names if n in missing and missing[n] is None]
    if skipped:
        print(f"skipping {', '.join(skipped)}: no trained drafter for SmolLM2 is installed "
              f"(python -m minigpt.real train-draft / train-medusa / train-eagle)", file=sys.stderr)
    names = [n for n in names if n not in skipped]
    print(f"benchmarking {', '.join(names)} on SmolLM2-135M-Instruct, {dev}: {len(prompts)} chat prompts, {cfg}",
          file=sys.stderr)
    records = run_bench(names, gamma=args.gamma, models=models, prompts=prompts, peers=args.peers,
                        method_params=LOOKUP_SETTINGS, engines=engines, log=lambda m: print(m, file=sys.stderr),
                        **cfg)
    return report(records, args.json)
