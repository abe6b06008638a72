"""``python -m minigpt.real``: rebuild SmolLM2's shipped drafters from its own answers.

    python -m minigpt.real make-answers --minutes 600  # SmolLM2 answers the request mix (batch engine; resumes)
    python -m minigpt.real train-draft --minutes 45 --max-steps 1500
    python -m minigpt.real train-medusa --minutes 18
    python -m minigpt.real train-eagle --minutes 60      # an EAGLE head on SmolLM2's features of its answers
    python -m minigpt.real train-eagle3 --minutes 600    # an EAGLE-3 head (fused layers, training-time test; resumes)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from .answers import make_answers
from .distill import train_draft, train_eagle3_head, train_eagle_head, train_medusa


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minigpt.real", description="The real-model track (Lesson 09): "
                                 "rebuild SmolLM2's shipped drafters from its own answers.")
    ap.add_argument("what", choices=["make-answers", "train-draft", "train-medusa", "train-eagle", "train-eagle3"])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (make-answers, train-eagle3: 1 unless set)")
    ap.add_argument("--fresh", action="store_true", help="train-draft, train-eagle3: start over instead of resuming runs/")
    ap.add_argument("--max-steps", type=int, default=None,
                    help="train-draft: length of the schedule; train-eagle, train-eagle3: stop after this many steps "
                         "(train-eagle3: also the end of its cosine schedule)")
    ap.add_argument("--requests", type=int, default=10000, help="make-answers: the first N requests of the mix")
    ap.add_argument("--batch-size", type=int, default=16, help="make-answers: sequences decoded together (B)")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="make-answers: the longest answer")
    ap.add_argument("--worker", default="1/1", metavar="I/N",
                    help="make-answers: decode every N-th shard from the I-th, so N processes share the folder")
    ap.add_argument("--subset", type=int, default=8192, help="train-eagle3: tokens in the frequency-ranked read-out")
    ap.add_argument("--ttt-steps", type=int, default=5, help="train-eagle3: training-time-test steps")
    ap.add_argument("--stdlib-share", type=float, default=0.0,
                    help="train-eagle3: share of batches of standard-library code (teacher-forced)")
    ap.add_argument("--out", type=Path, default=Path("runs"),
                    help="train-eagle3: its state goes to OUT/smollm2-eagle3/ (one folder per head being compared)")
    ap.add_argument("--export", type=Path, default=None,
                    help="train-eagle3: where the best head goes (default minigpt/checkpoints/smollm2-eagle3.pt)")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="train-eagle3: with no state in OUT to resume, start from this exported head (e.g. the "
                         "shipped minigpt/checkpoints/smollm2-eagle3.pt on a new machine)")
    ap.add_argument("--data", choices=["answers", "stdlib"], default="answers",
                    help="train-medusa: SmolLM2's own answers (default) or the standard library")
    args = ap.parse_args(argv)
    if args.threads or args.what in ("make-answers", "train-eagle3"):
        torch.set_num_threads(args.threads or 1)
    try:
        if args.what == "make-answers":
            try:
                worker = tuple(int(x) for x in args.worker.split("/"))
                assert len(worker) == 2 and 1 <= worker[0] <= worker[1]
            except (ValueError, AssertionError):
                raise ValueError(f"--worker {args.worker!r}: expected I/N with 1 <= I <= N, e.g. 1/2") from None
            card = make_answers(args.minutes, n_requests=args.requests, batch_size=args.batch_size,
                                max_new_tokens=args.max_new_tokens, worker=worker)
            print(json.dumps(card["stats"], indent=1))
        elif args.what == "train-eagle3":
            print(json.dumps(train_eagle3_head(args.minutes, subset_size=args.subset, ttt_steps=args.ttt_steps,
                                               max_steps=args.max_steps, stdlib_share=args.stdlib_share,
                                               fresh=args.fresh, out=args.out, export_to=args.export,
                                               init_from=args.init_from), indent=1))
        elif args.what == "train-draft":
            print(json.dumps(train_draft(args.minutes, fresh=args.fresh, max_steps=args.max_steps), indent=1))
        elif args.what == "train-medusa":
            print(json.dumps(train_medusa(args.minutes, data=args.data), indent=1))
        else:
            print(json.dumps(train_eagle_head(args.minutes, max_steps=args.max_steps), indent=1))
    except (FileNotFoundError, ImportError, ValueError) as e:
        print(f"{ap.prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
