"""Measuring the device you run on: memory bandwidth, matmul throughput and the time of a forward pass.

:mod:`minigpt.roofline` predicts how fast a decoding step *could* be from two numbers, bytes per second
and FLOP per second; this module measures those two numbers here, and the real time of a model's forward
pass, so Lesson 3 can put prediction and measurement side by side.

Every timing warms up first, waits for the device (:func:`minigpt.device.synchronize`) and reports the
median of several repeats; pass ``return_runs=True`` to get every repeat and judge the spread yourself.
"""
from __future__ import annotations

import platform
import statistics
import subprocess
from pathlib import Path

import torch

from .cache import KVCache
from .device import time_call
from .model import GPT, GPTConfig, evaluating
from .verdict import paired_ratios, ratio_interval

# GPT-2-style shapes from tiny to GPT-2-medium-sized, all with our 4096-token vocabulary. The position table
# is 1024 long (not the shipped models' 256) so a single pass can hold 512 new tokens after a cached prefix;
# that makes "draft" and "target" a little larger than the shipped checkpoints (see ``num_params``).
MODEL_SIZES: dict[str, GPTConfig] = {
    "tiny": GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=1024),     # ~0.1M: almost nothing to read
    "draft": GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=1024),   # the shipped draft's shape
    "target": GPTConfig(n_layer=6, n_head=8, n_embd=256, block_size=1024),  # the shipped target's shape
    "small": GPTConfig(n_layer=8, n_head=8, n_embd=512, block_size=1024),   # ~28M
    "base": GPTConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024),  # ~89M, GPT-2 small's body
    "large": GPTConfig(n_layer=24, n_head=16, n_embd=1024, block_size=1024),  # ~307M, GPT-2 medium's body
}


def model_of_size(name: str, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> GPT:
    """A randomly initialised GPT with the shape of ``MODEL_SIZES[name]``, in eval mode.

    Random weights are enough for timing: a forward pass does the same matmuls on the same number of
    bytes whatever the values are (no layer here skips work based on its input)."""
    if name not in MODEL_SIZES:
        raise ValueError(f"unknown model size {name!r}; choose one of {', '.join(MODEL_SIZES)}")
    torch.manual_seed(0)
    with torch.device(device):  # initialise on the device itself: a 300M-parameter init is slow on a CPU
        model = GPT(MODEL_SIZES[name])
    return model.to(dtype=dtype).eval()


def _rate(amount: float, times: list[float], return_runs: bool) -> float | list[float]:
    rates = [amount / t for t in times]
    return rates if return_runs else statistics.median(rates)


def measure_bandwidth(device: torch.device | str, n_bytes: int | None = None, repeat: int = 5,
                      return_runs: bool = False) -> float | list[float]:
    """Memory bandwidth in bytes/s, from copying one large fp32 tensor into another (``dst.copy_(src)``).

    A copy of ``n_bytes`` reads ``n_bytes`` and writes ``n_bytes``, so it moves ``2 * n_bytes``; that is
    the figure divided by the time (the convention of the STREAM "copy" benchmark). The default, 512 MiB per
    tensor, outgrows even server CPUs' last-level caches (a few hundred MiB) and GPUs' (tens of MiB), so the
    bytes really come from main memory."""
    device = torch.device(device)
    if n_bytes is None:
        n_bytes = 2**29
    src = torch.ones(n_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    times = time_call(lambda: dst.copy_(src), device, warmup=1, repeat=repeat)
    return _rate(2 * src.numel() * 4, times, return_runs)


def measure_matmul_flops(device: torch.device | str, n: int | None = None, dtype: torch.dtype = torch.float32,
                         repeat: int = 5, return_runs: bool = False) -> float | list[float]:
    """Arithmetic throughput in FLOP/s of an (n, n) @ (n, n) matmul, which costs 2 n^3 FLOPs
    (n^3 multiplies and n^3 adds). Defaults: n = 1024 on a CPU, 8192 on a GPU -- big enough to keep every
    arithmetic unit busy, so this is close to the device's practical peak for ``dtype``."""
    device = torch.device(device)
    if n is None:
        n = 1024 if device.type == "cpu" else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = time_call(lambda: a @ b, device, warmup=1, repeat=repeat)
    return _rate(2 * n**3, times, return_runs)


@torch.no_grad()
def forward_time(model: GPT, n_tokens: int, batch_size: int = 1, cached: int = 0, repeat: int = 5,
                 warmup: int = 1, return_runs: bool = False) -> float | list[float]:
    """Seconds for one forward pass over ``n_tokens`` new tokens per sequence, ``batch_size`` sequences,
    after a KV cache already holding ``cached`` positions (median of ``repeat`` runs).

    With ``cached > 0`` this is exactly a verification pass. The cached keys and values are left at zero
    instead of running a real prefill: their values change no work (no kernel here branches on data), and
    prefilling many sequences is slow on a CPU. Before every run the cache is cropped back to ``cached``, so
    each run appends the same ``n_tokens``."""
    cfg, device = model.config, model.device
    if cached + n_tokens > cfg.block_size:
        raise ValueError(f"cached ({cached}) + n_tokens ({n_tokens}) exceeds the context of {cfg.block_size}")
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(cfg.vocab_size, (batch_size, n_tokens), generator=gen).to(device)
    if cached == 0:
        fn = lambda: model(idx)  # noqa: E731
    else:
        cache = KVCache.for_model(model, batch_size=batch_size, max_len=cached + n_tokens)
        cache.advance(cached)  # its first `cached` positions (zeros) now count as the prefix

        def fn():
            cache.crop(cached)
            return model(idx, cache=cache)
    with evaluating(model):
        times = time_call(fn, device, warmup=warmup, repeat=repeat)
    return times if return_runs else statistics.median(times)


def forward_time_sweep(model: GPT, shapes: list[tuple[int, int]], cached: int = 0, repeat: int = 5,
                       warmup: int = 1) -> dict[tuple[int, int], list[float]]:
    """Seconds of ``repeat`` forward passes for every ``(n_tokens, batch_size)`` in ``shapes``.

    The repeats are interleaved: each of ``repeat`` rounds times every shape once, right after ``warmup``
    untimed passes of that same shape (the first pass after a different shape is slower: memory has to be
    allocated again and caches refilled). A burst of interference from other programs then costs one repeat
    of a few shapes, and each shape's median survives it."""
    runs: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
    for _ in range(repeat):
        for n_tokens, batch_size in shapes:
            runs[(n_tokens, batch_size)].append(
                forward_time(model, n_tokens, batch_size=batch_size, cached=cached, repeat=1, warmup=warmup))
    return runs


def forward_time_rounds(passes: dict, cached: int = 0, repeat: int = 5, warmup: int = 1) -> dict[object, list[float]]:
    """Seconds of ``repeat`` rounds of named passes, ``{name: (model, n_tokens, batch_size)}`` or ``{name: (model,
    n_tokens, batch_size, threads)}``, possibly of different models: each round times every pass once (after
    ``warmup`` untimed passes of it), in order. ``threads``: the CPU threads torch may use for that pass (set
    before it, and the previous setting restored after the rounds); the first pass after a change of thread count
    gets two more untimed passes, since the thread pool's first operations after a change run slow.

    Repeat i of every pass then comes from the same round, so a ratio of two passes can be taken round by round
    (:func:`round_ratio`): a load that slows a whole round slows both of its times and cancels, which the ratio of
    two fastest repeats, taken from different rounds, cannot promise."""
    runs: dict[object, list[float]] = {name: [] for name in passes}
    before = torch.get_num_threads()
    try:
        for _ in range(repeat):
            for name, (model, n_tokens, batch_size, *threads) in passes.items():
                changed = bool(threads) and threads[0] is not None and threads[0] != torch.get_num_threads()
                if changed:
                    torch.set_num_threads(threads[0])
                runs[name].append(forward_time(model, n_tokens, batch_size=batch_size, cached=cached, repeat=1,
                                               warmup=warmup + 2 * changed))
    finally:
        torch.set_num_threads(before)
    return runs


def round_ratio(numerator: list[float], denominator: list[float]) -> tuple[float, float, float]:
    """``(median, low, high)`` of the per-round ratios of two passes' times from :func:`forward_time_rounds`:
    the median, and the interval that holds it with 90% probability (:func:`minigpt.verdict.ratio_interval`; the
    range for 5-7 rounds). E.g. r(k) = ``round_ratio(runs[k tokens], runs[1 token])``."""
    ratios = paired_ratios(numerator, denominator)
    return (statistics.median(ratios), *ratio_interval(ratios))


def count_torch_calls(model: GPT, n_tokens: int = 1) -> int:
    """How many torch functions and tensor methods one forward pass calls (linear, layer_norm, view, add,
    ...). Each call pays a fixed Python + dispatch (+ kernel launch, on a GPU) cost however small its tensors;
    multiplied by this count, that cost is the floor of a tiny model's forward time."""
    calls = 0

    class Counter(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            nonlocal calls
            calls += 1
            return func(*args, **(kwargs or {}))

    idx = torch.zeros(1, n_tokens, dtype=torch.long, device=model.device)
    with torch.no_grad(), Counter():
        model(idx)
    return calls


def measure_call_overhead(device: torch.device | str, repeat: int = 5, calls: int = 1000) -> float:
    """Seconds per call of a torch op on a one-element tensor: almost no bytes and no FLOPs, so this is the
    fixed cost every op pays (Python, PyTorch's dispatcher and, on a GPU, the kernel launch)."""
    x = torch.ones(1, device=device)

    def many_adds():
        for _ in range(calls):
            torch.add(x, x)
    return statistics.median(time_call(many_adds, device, warmup=1, repeat=repeat)) / calls


SYSFS_CPU_CACHE = "/sys/devices/system/cpu/cpu0/cache"   # Linux: one folder index0, index1, ... per cache
_SIZE_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def parse_cache_size(text: str) -> int:
    """Bytes from a cache size as Linux's sysfs writes it: ``"32K"`` -> 32768, ``"1M"``, ``"512"`` (bytes)."""
    text = text.strip()
    if not text:
        raise ValueError("empty cache size")
    unit = _SIZE_UNITS.get(text[-1].upper(), 1)
    digits = text[:-1] if text[-1].upper() in _SIZE_UNITS else text
    if not digits.isdigit():
        raise ValueError(f"not a cache size: {text!r} (expected digits with an optional K, M or G)")
    return int(digits) * unit


def largest_cpu_cache(sysfs_dir: str | None = None) -> tuple[str, int] | None:
    """``(name, bytes)`` of the CPU's largest cache (e.g. ``("L3", 33554432)``), as the operating system
    reports it, or None where it does not say.

    Linux: every folder ``index*`` under ``sysfs_dir`` (default :data:`SYSFS_CPU_CACHE`) describes one cache
    with a ``level`` file (1, 2, 3) and a ``size`` file (``"32K"``); unreadable or malformed folders are
    skipped. macOS: ``sysctl hw.l3cachesize`` (then ``hw.l2cachesize``)."""
    if sysfs_dir is None and platform.system() == "Darwin":
        for key in ("hw.l3cachesize", "hw.l2cachesize"):
            out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True).stdout.strip()
            if out.isdigit() and int(out):
                return key.split(".")[1][:2].upper(), int(out)
        return None
    best: tuple[str, int] | None = None
    for d in sorted(Path(sysfs_dir or SYSFS_CPU_CACHE).glob("index*")):
        try:
            level, size = (d / "level").read_text().strip(), parse_cache_size((d / "size").read_text())
        except (OSError, ValueError):
            continue
        if best is None or size > best[1]:
            best = (f"L{level}", size)
    return best
