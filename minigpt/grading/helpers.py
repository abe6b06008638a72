"""Checks that several exercises share: "the inputs are left unchanged" and "a seeded generator reproduces".

Every graded function that receives a list or a tensor promises (in its docstring) to leave it unchanged: the
caller still needs it (the context of the next round, the cache of the next step). :func:`call_unchanged`
calls the learner's function on copies and compares them with the originals afterwards; when one changed it
says which argument and, where the change has a recognisable shape (reversed, sorted, appended to, scaled in
place), names the operation that did it.

A function that receives a ``torch.Generator`` must draw all its randomness from it, so that a seed
reproduces a round. :func:`expect_reproducible` calls it twice with the same generator seed but different
global RNG states (a function that uses the global RNG gives different answers), and once with another seed
(a function that ignores the generator it is given, or makes its own, gives the same answer).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from .core import Mismatch


def snapshot(x):
    """A deep copy of lists, tuples, dicts and tensors (other values are returned as they are)."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, list):
        return [snapshot(v) for v in x]
    if isinstance(x, tuple):
        return tuple(snapshot(v) for v in x)
    if isinstance(x, dict):
        return {k: snapshot(v) for k, v in x.items()}
    return x


def same(a, b) -> bool:
    """Exact equality of nested lists / tuples / tensors (tensors: same shape, dtype and values)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and bool(torch.equal(a, b)))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b)))
    if isinstance(a, dict) or isinstance(b, dict):
        return isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(
            same(a[k], b[k]) for k in a)
    return a == b


def _short(x, limit: int = 60) -> str:
    text = str(x.tolist() if isinstance(x, torch.Tensor) and x.numel() <= 12 else
               f"a tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else x)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe_change(name: str, before, after) -> str:
    """A hint naming the in-place operation that most likely turned ``before`` into ``after``."""
    if isinstance(before, list) and isinstance(after, list):
        if len(after) > len(before) and after[:len(before)] == before:
            return (f"your function appended to the caller's {name}: work on a copy (list({name})) or build a "
                    f"new list ({name} + [...])")
        if len(after) < len(before):
            return f"your function removed items from the caller's {name} (pop/del/remove): work on a copy"
        if after == before[::-1]:
            return (f"{name}.reverse() reverses the caller's list in place: use {name}[::-1] or "
                    f"reversed({name}), which leave it alone")
        if len(before) == len(after) and sorted(map(repr, before)) == sorted(map(repr, after)):
            return (f"the caller's {name} was reordered in place ({name}.sort(...) or {name}.reverse()): use "
                    f"sorted({name}, ...) or {name}[::-1], which make new lists")
        return f"your function wrote into the caller's {name}: work on a copy (list({name}))"
    if isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor):
        if before.shape == after.shape and before.is_floating_point() and after.is_floating_point():
            nz = before != 0
            if bool(nz.any()):
                ratio = after[nz] / before[nz]
                if bool(torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio))) and bool((after[~nz] == 0).all()):
                    return (f"{name} was multiplied in place (an in-place operation such as {name} *= ..., "
                            f"{name}.mul_(...) or {name}.div_(...)): write {name} * scale, which makes a new tensor")
        return (f"an in-place operation (+=, *=, a method ending in _, or an assignment {name}[...] = ...) wrote "
                f"into {name}: compute a new tensor instead")
    return f"leave {name} as it was given: work on a copy"


def call_unchanged(fn: Callable, args: Sequence, names: Sequence[str]):
    """Call ``fn(*copies of args)``; raise :class:`Mismatch` if the call changed any of its arguments.

    Returns what ``fn`` returned. ``names`` are the parameter names, for the message."""
    given = [snapshot(a) for a in args]
    ret = fn(*given)
    for name, before, after in zip(names, args, given):
        if not same(before, after):
            raise Mismatch(f"the inputs left unchanged ({name} = {_short(before)})",
                           f"{name} changed to {_short(after)}", describe_change(name, before, after))
    return ret


def expect_reproducible(name: str, call: Callable[[torch.Generator], object], seeds=(7, 8)) -> str:
    """``call(generator)`` must return the same answer for the same generator seed whatever the global RNG
    state, and a different answer for another seed (``seeds[1]``; the caller picks seeds whose correct
    answers differ)."""
    def run(seed: int, global_seed: int):
        torch.manual_seed(global_seed)  # run_case restores the learner's global RNG state afterwards
        return call(torch.Generator().manual_seed(seed))

    a, b = run(seeds[0], 1), run(seeds[0], 2)
    if not same(snapshot(a), snapshot(b)):
        raise Mismatch(f"the same {name} twice from generators seeded alike", f"{_short(a)} and then {_short(b)}",
                       "draw every random number from the generator you are given (generator=generator in "
                       "torch.multinomial and torch.rand); the global RNG (torch.rand without it) differs "
                       "from call to call")
    c = run(seeds[1], 1)
    if same(snapshot(a), snapshot(c)):
        raise Mismatch(f"a different {name} for a generator with another seed", f"{_short(a)} for both seeds",
                       "the answer does not depend on the generator's seed: draw the random numbers from the "
                       "generator you are given (not from one of your own, not re-seeded), and sample rather "
                       "than take an argmax")
    return f"reproducible from the generator's seed: {_short(a)}"


def pick_hint(hints: Sequence[str]) -> str | None:
    """The hint for a wrong answer that the known mistakes ``hints`` (those reproducing it) explain: the one
    hint when one mistake does, both named when several do (so no hint points the wrong way), else None."""
    unique = list(dict.fromkeys(hints))
    if not unique:
        return None
    if len(unique) == 1:
        return unique[0]
    return "your answer is what each of these mistakes gives: " + " | OR | ".join(unique[:3])
