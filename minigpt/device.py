"""Choosing where to run (CUDA, then Apple's MPS, then the CPU; ``MINIGPT_DEVICE`` overrides), and timing on it.

:func:`time_call` times one call; :func:`time_rotating` times competing calls in rotating order, with the
baseline timed twice per round as an A/A control when asked (``aa="plain"``: feed the paired timings to
:mod:`minigpt.verdict` for a verdict), :func:`time_rotating_over` the same on several inputs (the benchmark's
loop). :class:`OtherLoad` measures how much CPU other processes used while a benchmark ran: a neighbour on
another core changes speed-ups, not only times (a one-token step, bound by memory bandwidth, shares that
bandwidth with it), so the records say how busy the machine was."""
from __future__ import annotations

import gc
import os
import time

import torch


def twin_of(label: str) -> str:
    """The label under which :func:`time_rotating` (``aa=label``) times ``label``'s A/A twin: the same call timed a
    second time in every round, the control :mod:`minigpt.verdict` judges a verdict against."""
    return f"{label} (A/A)"


def get_device() -> torch.device:
    """The best available device, or the one named by the environment variable ``MINIGPT_DEVICE``."""
    name = os.environ.get("MINIGPT_DEVICE", "").strip()
    if name:
        try:
            dev = torch.device(name)
            torch.empty(1, device=dev)
        except Exception:
            raise ValueError(f"MINIGPT_DEVICE={name!r} is not a usable torch device here") from None
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


class OtherLoad:
    """A context manager: how many CPU cores, on average, processes other than this one kept busy while the block
    ran (``cores``; None where the machine does not say: it reads Linux's ``/proc/stat``). The machine's busy time
    over the block, less this process's own CPU time (``os.times``), over the block's wall time. A benchmark alone
    on the machine reads close to 0; one with a busy neighbour on another core about 1."""
    STAT = "/proc/stat"

    def __init__(self):
        self.cores: float | None = None

    def _busy_seconds(self) -> float | None:
        try:
            with open(self.STAT) as f:
                fields = f.readline().split()
        except OSError:
            return None
        if not fields or fields[0] != "cpu" or len(fields) < 8:
            return None
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
        steal = int(fields[8]) if len(fields) > 8 else 0
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_seconds() -> float:
        t = os.times()
        return t.user + t.system

    def __enter__(self) -> "OtherLoad":
        self._start = (self._busy_seconds(), self._own_seconds(), time.perf_counter())
        return self

    def __exit__(self, *exc) -> None:
        busy, own, wall = self._busy_seconds(), self._own_seconds(), time.perf_counter()
        if busy is None or self._start[0] is None or wall <= self._start[2]:
            return
        others = (busy - self._start[0]) - (own - self._start[1])
        self.cores = max(0.0, others / (wall - self._start[2]))


def busy_machine_note(cores: float | None, threshold: float = 0.25) -> str | None:
    """A line for a benchmark's report when other processes kept more than ``threshold`` cores busy during it."""
    if cores is None or cores <= threshold:
        return None
    return (f"note: other processes kept {cores:.2f} cores busy on average during this run; speed-ups measured "
            "beside a busy neighbour can differ from those of a quiet machine (run alone to compare)")


def synchronize(device: torch.device | str) -> None:
    """Wait for queued GPU work, so a timer measures the work and not just its launch."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_call(fn, device, warmup: int = 2, repeat: int = 7) -> list[float]:
    """Run ``fn()`` ``warmup`` times untimed, then ``repeat`` times; return the seconds of each timed run."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return times


def time_rotating(fns: dict, device, repeat: int = 5, warmup: int = 1, aa: str | None = None) -> tuple[dict, dict]:
    """Time several competing calls fairly: ``fns`` = {label: fn}; every repeat calls each ``fn()`` once, in an
    order that rotates from repeat to repeat, so a change in the machine's load hits all of them alike.
    ``aa``: a label (the baseline, e.g. "plain") to time twice per repeat, the second time under
    :func:`twin_of` ``(aa)``: the A/A control a verdict is judged against.

    Each call is synchronised on ``device`` before and after the clock is read. Returns (seconds, results):
    ``seconds[label]`` is the list of ``repeat`` timings, ``results[label]`` what the first timed call returned.
    (:func:`time_rotating_over` with a single input.)"""
    seconds, results = time_rotating_over({label: (lambda _, fn=fn: fn()) for label, fn in fns.items()}, [None],
                                          device, repeat, warmup, aa=aa)
    return ({label: [row[0] for row in rows] for label, rows in seconds.items()},
            {label: rows[0][0] for label, rows in results.items()})


def time_rotating_over(fns: dict, inputs: list, device, repeat: int = 5, warmup: int = 1,
                       log=None, aa: str | None = None) -> tuple[dict, dict]:
    """Time competing calls on several inputs fairly: ``fns`` = {label: fn(input)}; every repeat calls each fn
    once on every input, input by input, and the order of the fns rotates (on input ``i`` of repeat ``r`` it
    starts with fn number ``(i + r) % len(fns)``), so no fn always goes first and a change in the machine's
    load hits all of them alike. First ``warmup`` untimed rounds: each fn once on the first input.

    ``aa``: the label of the baseline to time twice in every round, the second time as its A/A twin
    (:func:`twin_of`, e.g. "plain (A/A)", returned after the other labels). The twin sits half
    way round the cycle from the baseline, so it is as near to or far from it as a typical method is.

    Each call is synchronised on ``device`` before and after the clock is read. Returns (seconds, results):
    ``seconds[label][r][i]`` and ``results[label][r][i]`` are the time and the return value of the call on
    ``inputs[i]`` in repeat ``r``. ``log``: a function told "repeat r/R" as each repeat begins.

    Python's garbage collector runs between repeats and is paused while the calls run, as ``timeit`` does: a full
    collection walks every object of the process (123 ms in Lesson 15's notebook kernel, against 80 ms for the
    call it landed in) and falls on whichever call happens to allocate when one is due."""
    labels = list(fns)
    if not labels:
        raise ValueError("time_rotating needs at least one function to time")
    if aa is not None:
        if aa not in fns:
            raise ValueError(f"aa={aa!r} names no function to time; labels: {', '.join(map(str, labels))}")
        base = labels[labels.index(aa):] + labels[:labels.index(aa)]   # the baseline first, then the cycle
        half = (len(labels) + 1) // 2
        labels, fns = base[:half] + [twin_of(aa)] + base[half:], {**fns, twin_of(aa): fns[aa]}
    if not inputs:
        raise ValueError("time_rotating needs at least one input to time the functions on")
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    for _ in range(warmup):  # first calls pay for allocations and kernel selection
        for label in labels:
            if aa is None or label != twin_of(aa):   # the twin is the baseline: warm once
                fns[label](inputs[0])
    seconds = {label: [[0.0] * len(inputs) for _ in range(repeat)] for label in labels}
    results = {label: [[None] * len(inputs) for _ in range(repeat)] for label in labels}
    enabled = gc.isenabled()
    gc.disable()   # paused while the calls run; a full collection between repeats, untimed (see the docstring)
    try:
        for r in range(repeat):
            if log:
                log(f"repeat {r + 1}/{repeat}")
            gc.collect()
            for i, x in enumerate(inputs):
                k = (i + r) % len(labels)
                for label in labels[k:] + labels[:k]:
                    synchronize(device)
                    t0 = time.perf_counter()
                    results[label][r][i] = fns[label](x)
                    synchronize(device)
                    seconds[label][r][i] = time.perf_counter() - t0
    finally:
        if enabled:
            gc.enable()
    order = [label for label in fns if label in seconds]   # the caller's order, the twin last
    return {label: seconds[label] for label in order}, {label: results[label] for label in order}
