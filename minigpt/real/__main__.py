"""``python -m minigpt.real``: rebuild SmolLM2's shipped drafters from its own answers.

    python -m minigpt.real make-answers --minutes 30  # SmolLM2 answers ~1000 requests (needs transformers)
    python -m minigpt.real train-draft --minutes 45 --max-steps 1500
    python -m minigpt.real train-medusa --minutes 18
    python -m minigpt.real train-eagle --minutes 60      # an EAGLE head on SmolLM2's features of its answers
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from .answers import make_answers
from .distill import train_draft, train_eagle_head, train_medusa


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minigpt.real", description="The real-model track (Lesson 09): "
                                 "rebuild SmolLM2's shipped drafters from its own answers.")
    ap.add_argument("what", choices=["make-answers", "train-draft", "train-medusa", "train-eagle"])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--fresh", action="store_true", help="train-draft: start over instead of resuming runs/")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="train-draft: length of the schedule; train-eagle: stop after this many steps")
    ap.add_argument("--data", choices=["answers", "stdlib"], default="answers",
                    help="train-medusa: SmolLM2's own answers (default) or the standard library")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.what == "make-answers":
            print(json.dumps(make_answers(minutes=args.minutes)))
        elif args.what == "train-draft":
            print(json.dumps(train_draft(args.minutes, fresh=args.fresh, max_steps=args.max_steps), indent=1))
        elif args.what == "train-medusa":
            print(json.dumps(train_medusa(args.minutes, data=args.data), indent=1))
        else:
            print(json.dumps(train_eagle_head(args.minutes, max_steps=args.max_steps), indent=1))
    except (FileNotFoundError, ImportError) as e:
        print(f"{ap.prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
