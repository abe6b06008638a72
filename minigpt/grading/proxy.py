"""The learner's function as a case sees it: a stand-in that runs the real one on the other side of a channel.

A case (``run(fn)`` in :mod:`.core`) calls ``fn(*args)`` as if it were the learner's function. Here ``fn`` is a
:class:`LearnerFunction`: it encodes the arguments as plain data (:mod:`.wire`), sends them through a channel,
and turns the reply back into Python values. The channel is either

* the learner's kernel, over a socket (``python -m minigpt.grade``, :mod:`.judge`): the learner's code runs in
  another process, so nothing it patches (``math.isclose``, ``torch.allclose``, the graders themselves) reaches
  the references and comparisons computed here; or
* :func:`in_process`: the notebook's own process (``check()`` in a notebook, for the learner's feedback, and the
  grader tests): the case's arguments are passed as they are, and the returned value goes through the same
  encoding, so a wrong type is reported alike.

The two behave alike, including what a call does to the caller's objects: over a socket, the arguments the
learner's function changed in place (a list it appended to, a tensor it scaled, a generator it drew from) are
changed the same way here, and the global torch RNG is shared with the learner's side for the length of a call,
so the checks that test "leaves its inputs unchanged" and "draws from the generator it is given" work unchanged
(:func:`through_the_wire` runs the socket's protocol in one process, to test that).
"""
from __future__ import annotations

import json
from typing import Callable

import torch

from . import wire


class LearnerError(Exception):
    """The learner's function raised: its type, message and the line of the learner's code that raised it."""

    def __init__(self, info: dict):
        self.type_name = str(info.get("type", "Exception"))[:60]
        self.message = str(info.get("message", ""))[:160]
        self.not_implemented = bool(info.get("not_implemented"))
        where = info.get("where")
        self.where = where if isinstance(where, dict) else None
        super().__init__(self.summary)

    @property
    def summary(self) -> str:
        return f"{self.type_name}: {self.message}" if self.message else self.type_name

    def hint(self) -> str:
        """The error and the line of the learner's code where it was raised, e.g. "ZeroDivisionError at line 3
        of your cell, in speedup: `return tokens / cost`"."""
        if not self.where:
            return f"{self.type_name} was raised inside your function (no line of your code in the traceback)"
        w = self.where
        text = f": `{w.get('text')}`" if w.get("text") else ""
        return f"{self.type_name} at line {w.get('line')} of {w.get('file')}, in {w.get('function')}{text}"


class KernelLost(Exception):
    """The channel to the learner's kernel broke during a call (the kernel died, timed out or sent garbage)."""


def _assign(target, after) -> None:
    """Make ``target`` (an argument as the judge holds it) what ``after`` says the learner's call left it as."""
    if isinstance(target, torch.Tensor) and isinstance(after, torch.Tensor):
        with torch.no_grad():
            if target.shape == after.shape and target.dtype == after.dtype:
                target.copy_(after)
            else:
                target.data = after
    elif isinstance(target, list) and isinstance(after, list):
        if len(target) == len(after):
            for i, (t, a) in enumerate(zip(target, after)):
                if isinstance(t, (torch.Tensor, list, dict, torch.Generator)) and type(t) is type(a):
                    _assign(t, a)
                else:
                    target[i] = a
        else:
            target[:] = after
    elif isinstance(target, dict) and isinstance(after, dict):
        target.clear()
        target.update(after)
    elif isinstance(target, torch.Generator) and isinstance(after, torch.Generator):
        target.set_state(after.get_state())
    elif isinstance(target, tuple) and isinstance(after, tuple) and len(target) == len(after):
        for t, a in zip(target, after):
            _assign(t, a)
    # anything else (numbers, strings, the portable callables) cannot be changed in place


class LearnerFunction:
    """What a case calls in place of the learner's function (see the module docstring)."""

    def __call__(self, *args, **kwargs):
        raise NotImplementedError

    def map(self, calls: list[tuple]):
        """The values of ``fn(*args)`` for each ``args`` in ``calls``, made in order, in one exchange with the
        learner's side: an iterator that raises :class:`LearnerError` at the call that raised (no call after it is
        made). The calls may share ``torch.Generator`` objects (each continues from the state the previous call
        left, as with calls made one by one); any other argument must belong to one call only, and the judge must
        not draw from a shared generator while the batch runs (it cannot: the batch is one exchange)."""
        outcomes = self._map([tuple(args) for args in calls])

        def each():
            for outcome in outcomes:
                if isinstance(outcome, LearnerError):
                    raise outcome
                yield outcome
        return each()

    def _map(self, calls: list[tuple]) -> list:
        raise NotImplementedError


class RemoteFunction(LearnerFunction):
    """Call the learner's function through ``channel`` (a function: (call, blobs) -> (reply, blobs); see
    :func:`.wire.serve_call`). Raises :class:`LearnerError` when the learner's code raised, :class:`KernelLost`
    when the channel broke; a reply that is not valid wire data counts as a wrong-type answer."""

    def __init__(self, channel: Callable[[dict, list], tuple[dict, list]]):
        self._channel, self._synced_rng = channel, None

    def __call__(self, *args, **kwargs):
        rng, blobs = wire.rng_state(), []
        call = {"args": [wire.encode(a, blobs) for a in args],
                "kwargs": {k: wire.encode(v, blobs) for k, v in kwargs.items()}, "rng": None}
        if self._synced_rng is None or not torch.equal(rng, self._synced_rng):
            blobs.append(wire.tensor_bytes(rng))
            call["rng"] = len(blobs) - 1
        reply, got = self._channel(call, blobs)
        try:
            for target, after in zip(args, reply.get("args") or []):
                if after is not None:
                    _assign(target, wire.decode(after, got))
            for key, after in (reply.get("kwargs") or {}).items():
                if key in kwargs and after is not None:
                    _assign(kwargs[key], wire.decode(after, got))
            if reply.get("rng") is not None:
                rng = wire.decode({"t": "generator_state", "blob": reply["rng"]}, got)
                torch.set_rng_state(rng)
            self._synced_rng = rng
            if reply.get("raised"):
                raise LearnerError(reply["raised"] if isinstance(reply["raised"], dict) else {})
            return wire.decode(reply.get("value"), got)
        except (wire.WireError, KeyError, TypeError, ValueError, RuntimeError) as e:  # not LearnerError
            self._synced_rng = None
            return wire.wrong_type("object", f"an answer that is not plain data ({type(e).__name__})")

    def _map(self, calls: list[tuple]) -> list:
        rng, blobs, gens = wire.rng_state(), [], {}
        batch = {"op": "map", "calls": [[wire.encode(a, blobs, gens=gens) for a in args] for args in calls],
                 "rng": None}
        shared = sorted(gens.values(), key=lambda item: item[0])
        batch["gens"] = [len(blobs) + i for i in range(len(shared))]
        blobs += [wire.tensor_bytes(g.get_state()) for _, g in shared]
        if self._synced_rng is None or not torch.equal(rng, self._synced_rng):
            blobs.append(wire.tensor_bytes(rng))
            batch["rng"] = len(blobs) - 1
        reply, got = self._channel(batch, blobs)
        try:
            for (_, g), index in zip(shared, reply.get("gens") or []):
                g.set_state(wire.decode({"t": "generator_state", "blob": index}, got))
            if reply.get("rng") is not None:
                rng = wire.decode({"t": "generator_state", "blob": reply["rng"]}, got)
                torch.set_rng_state(rng)
            self._synced_rng = rng
            outcomes = []
            for value in list(reply.get("values") or [])[:len(calls)]:
                try:
                    outcomes.append(wire.decode(value, got))
                except (wire.WireError, KeyError, TypeError, ValueError) as e:
                    outcomes.append(wire.wrong_type("object", f"an answer that is not plain data ({type(e).__name__})"))
        except (wire.WireError, KeyError, TypeError, ValueError, RuntimeError) as e:
            self._synced_rng = None
            return [wire.wrong_type("object", f"an answer that is not plain data ({type(e).__name__})")] * len(calls)
        if reply.get("raised") and len(outcomes) < len(calls):
            outcomes.append(LearnerError(reply["raised"] if isinstance(reply["raised"], dict) else {}))
        elif len(outcomes) < len(calls):  # a learner's side that answered fewer calls than it was sent
            outcomes += [wire.wrong_type("object", "no answer")] * (len(calls) - len(outcomes))
        return outcomes


class LocalFunction(LearnerFunction):
    """The learner's function called in this process (a notebook's ``check``): the arguments are the case's own
    objects, and the returned value goes through the same encoding as a kernel's (so a wrong type is reported
    alike, and nothing the function returns keeps a link to the learner's objects)."""

    def __init__(self, fn: Callable):
        self._fn = fn

    def __call__(self, *args, **kwargs):
        try:
            value = self._fn(*args, **kwargs)
        except (Exception, SystemExit) as e:
            raise LearnerError(wire.raised_info(e)) from None
        blobs: list = []
        return wire.decode(wire.encode(value, blobs), blobs)

    def _map(self, calls: list[tuple]) -> list:
        outcomes = []
        for args in calls:
            try:
                outcomes.append(self(*args))
            except LearnerError as e:
                outcomes.append(e)
                break
        return outcomes


def in_process(fn: Callable) -> LearnerFunction:
    """``fn`` as a case calls it in this process (a notebook's ``check``, the grader tests)."""
    return LocalFunction(fn)


def through_the_wire(fn: Callable) -> LearnerFunction:
    """``fn`` behind the whole kernel protocol, in this process: every call encoded, served by
    :func:`.wire.serve_call`, and the reply decoded, as over a socket (a test that both paths agree)."""
    def channel(call: dict, blobs: list) -> tuple[dict, list]:
        serve = wire.serve_map if call.get("op") == "map" else wire.serve_call
        reply, out = serve(fn, json.loads(json.dumps(call)), list(blobs))
        return json.loads(json.dumps(reply)), out

    return RemoteFunction(channel)
