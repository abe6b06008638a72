"""Choosing where to run (CUDA, then Apple's MPS, then the CPU; ``MINIGPT_DEVICE`` overrides), and timing on it.

:func:`time_call` times one call; :func:`time_rotating` times competing calls in rotating order (feed its
paired timings to :mod:`minigpt.verdict` for a verdict)."""
from __future__ import annotations

import os
import time

import torch


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


def time_rotating(fns: dict, device, repeat: int = 5, warmup: int = 1) -> tuple[dict, dict]:
    """Time several competing calls fairly: ``fns`` = {label: fn}; every repeat calls each ``fn()`` once, in an
    order that rotates from repeat to repeat, so a change in the machine's load hits all of them alike.

    Each call is synchronised on ``device`` before and after the clock is read. Returns (seconds, results):
    ``seconds[label]`` is the list of ``repeat`` timings, ``results[label]`` what the first timed call returned."""
    labels = list(fns)
    if not labels:
        raise ValueError("time_rotating needs at least one function to time")
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    for _ in range(warmup):
        for label in labels:
            fns[label]()
    seconds: dict = {label: [] for label in labels}
    results: dict = {}
    for r in range(repeat):
        k = r % len(labels)
        for label in labels[k:] + labels[:k]:
            synchronize(device)
            t0 = time.perf_counter()
            out = fns[label]()
            synchronize(device)
            seconds[label].append(time.perf_counter() - t0)
            results.setdefault(label, out)
    return seconds, results

