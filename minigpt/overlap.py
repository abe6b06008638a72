"""How much of an answer repeats its request: the copied runs that prompt lookup can find.

Prompt lookup (Lesson 06) gains exactly where the answer repeats text already in the context. Whether an answer
does is a property of the answer, not of any drafter, and can be read off the tokens alone: mark every answer
token that lies in a run of at least ``n`` tokens which also occurs in the request. Lesson 09b uses it to see why
one "edit" request is a feast for lookup and another is not (the model wrote an explanation before the copy).

    mask = copied_positions(prompt, answer, n=4)   # [False, False, True, True, ...]
    copied_share(prompt, answer)                   # share of answer tokens inside such runs
    first_copied(mask)                             # index of the first one, or None
"""
from __future__ import annotations

from typing import Sequence


def copied_positions(context: Sequence[int], answer: Sequence[int], n: int = 4) -> list[bool]:
    """Per answer token: does it lie inside a run of >= ``n`` answer tokens that also occurs in ``context``?

    The runs are found as shared n-grams (any n consecutive answer tokens that appear consecutively in the
    context); overlapping n-grams join into longer runs. Shorter coincidences (a common word, a bracket) count
    as not copied."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    context, answer = list(context), list(answer)
    grams = {tuple(context[i:i + n]) for i in range(len(context) - n + 1)}
    mask = [False] * len(answer)
    for i in range(len(answer) - n + 1):
        if tuple(answer[i:i + n]) in grams:
            mask[i:i + n] = [True] * n
    return mask


def copied_share(context: Sequence[int], answer: Sequence[int], n: int = 4) -> float:
    """The share of ``answer``'s tokens that :func:`copied_positions` marks (0.0 for an empty answer)."""
    mask = copied_positions(context, answer, n)
    return sum(mask) / len(mask) if mask else 0.0


def first_copied(mask: Sequence[bool]) -> int | None:
    """Index of the first copied token of a :func:`copied_positions` mask, None when nothing is copied."""
    return next((i for i, m in enumerate(mask) if m), None)
