"""Choosing where to run (CUDA, then Apple's MPS, then the CPU; ``MINIGPT_DEVICE`` overrides), and timing on it.

:func:`time_call` times one call; :func:`time_rotating` times competing calls in rotating order;
:func:`compare_times` turns paired timings into a :class:`Speedup` whose verdict follows the course's rule
(at least 5 repeats and a ratio outside the run's noise band, else "no measurable difference")."""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

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


MIN_REPEATS = 5  # the course's rule: no verdict from fewer repeats


@dataclass(frozen=True)
class Speedup:
    """A paired timing comparison: ``ratios[i]`` = baseline seconds / candidate seconds in repeat i.

    ``noise`` is the run's noise band, half the relative spread of the baseline's own repeats
    ((max - min) / (2 * median)): two runs of the *same* code differ by about that much here."""
    ratios: tuple[float, ...]
    noise: float

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def low(self) -> float:
        return min(self.ratios)

    @property
    def high(self) -> float:
        return max(self.ratios)

    @property
    def verdict(self) -> str:
        """"faster" / "slower" only with >= MIN_REPEATS repeats and every ratio outside 1 ± noise, else
        "no measurable difference" (or "too few repeats")."""
        if len(self.ratios) < MIN_REPEATS:
            return f"too few repeats ({len(self.ratios)}) for a verdict"
        if self.low > 1 + self.noise:
            return "faster"
        if self.high < 1 - self.noise:
            return "slower"
        return "no measurable difference"

    def __str__(self) -> str:
        return (f"{self.median:.2f}x ({self.low:.2f}-{self.high:.2f} over {len(self.ratios)} repeats, "
                f"noise band ±{self.noise:.0%}): {self.verdict}")


def compare_times(baseline: list[float], candidate: list[float]) -> Speedup:
    """Speed-up of ``candidate`` over ``baseline`` from paired repeats (e.g. both lists from :func:`time_rotating`)."""
    if len(baseline) != len(candidate) or not baseline:
        raise ValueError(f"need the same number (>= 1) of baseline and candidate timings, got {len(baseline)} "
                         f"and {len(candidate)}")
    med = statistics.median(baseline)
    noise = (max(baseline) - min(baseline)) / (2 * med)
    return Speedup(tuple(b / c for b, c in zip(baseline, candidate)), noise)
