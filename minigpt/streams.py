"""Streams of similar requests in arrival order: the workload where drafting from earlier outputs can pay
(Lesson 14, ``python -m minigpt.bench --stream``).

A deployed model is rarely asked one thing once. It is asked the same kind of thing again and again: the same
edit on file after file, the same extraction on document after document. A :class:`Stream` is such a sequence
of requests, in the order they arrive. Suffix decoding (:mod:`minigpt.decoding.suffix`) may draft request k
from the outputs of requests 0 .. k-1; prompt lookup only ever sees request k itself.

The course pair's stream (:func:`course_stream`) asks for the same kind of edit on many functions of the
corpus's **held-out** files: a function, then ``# The same function, with `x` renamed to `new_x`:`` and the
first line of the copy (the format of :func:`minigpt.prompts.edit_prompts`, which the target's copy training
used). The functions the benchmark's and the lessons' edit prompts use are left out. The held-out files are
split in two by file, alternately: the development stream (``split="dev"``), on which suffix decoding's
settings may be tuned, and the held-out stream (``split="held-out"``), which is only ever reported. SmolLM2's
streams are in :mod:`minigpt.real.streams`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .prompts import Prompt, _edit_candidates, edit_prompts

SPLITS = ("dev", "held-out")


@dataclass
class Stream:
    """Requests in arrival order: ``name``, ``kind`` (what every request asks), ``split`` ("dev" or
    "held-out"), the ``requests`` (:class:`~minigpt.prompts.Prompt`\\ s, each with ``kind`` and ``split`` set),
    ``max_new_tokens`` for each, and the token that ends an answer (``eos_id``; None: none)."""
    name: str
    kind: str
    split: str
    requests: list[Prompt]
    max_new_tokens: int
    eos_id: int | None = None

    def __len__(self) -> int:
        return len(self.requests)


def check_split(split: str) -> None:
    """ValueError in one line unless ``split`` is "dev" or "held-out"."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")


@lru_cache(maxsize=1)
def _used_elsewhere() -> frozenset[str]:
    """Names of the functions that the benchmark's and the lessons' edit prompts use (any count up to 16)."""
    return frozenset(p.name for n in range(1, 17) for p in edit_prompts(n))


def rename_requests(split: str) -> list[Prompt]:
    """Every rename-edit prompt of one half of the held-out files (dev: files 0, 2, 4, ...; held-out: 1, 3,
    5, ...), in file order, without those used elsewhere."""
    check_split(split)
    per_file = [c for c in _edit_candidates(30, 72) if c]
    half = per_file[0::2] if split == "dev" else per_file[1::2]
    used = _used_elsewhere()
    return [Prompt(p, p.name, "rename", p.reference, split) for cands in half for p in cands if p.name not in used]


def course_stream(split: str = "held-out", n: int = 12, max_new_tokens: int = 48) -> Stream:
    """The course pair's stream: ``n`` rename edits from one half of the held-out files, spread evenly over
    that half's functions, in file order."""
    requests = rename_requests(split)
    if n < 1:
        raise ValueError(f"a stream needs at least one request, got n={n}")
    step = max(1, len(requests) // n)
    picked = requests[::step][:n]
    return Stream(f"course-rename-{split}", "rename", split, picked, max_new_tokens)
