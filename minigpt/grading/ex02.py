"""Checks for exercise 02: the memory-bound arithmetic (reference: :mod:`minigpt.roofline`).

Every function is plain arithmetic, so each is checked on the worked example of the course (70B parameters
in 16-bit on an H100: 140 GB, >= ~42 ms per step) and on seeded random inputs, to a relative error of 1e-9.
"""
from __future__ import annotations

import random

from .. import roofline as R
from ..cache import KVCache
from .core import Exercise, Mismatch, expect_number
from .helpers import pick_hint

NOTEBOOK = "ex02_memory_bound.ipynb"
BW, FLOPS = R.H100_SXM_BANDWIDTH, R.H100_SXM_BF16_FLOPS
PRECISIONS = (4, 2, 1, 0.5)  # bytes per parameter: fp32, fp16/bf16, int8, 4-bit


def _rng(seed: int) -> random.Random:
    return random.Random(seed)


def _random_model(rng: random.Random) -> float:
    return float(rng.choice([1, 3, 7, 13, 34, 70, 405])) * 1e9 * rng.uniform(0.5, 1.5)


def _random_chip(rng: random.Random) -> tuple[float, float]:
    """(bandwidth bytes/s, FLOP/s) of a made-up accelerator."""
    return rng.uniform(0.5, 8) * 1e12, rng.uniform(50, 2000) * 1e12


# known mistakes per function: (wrong formula, the hint for it); a wrong answer that one reproduces gets its hint
_BUGS = {
    "decode_flops": [
        (lambda N, T=1: N * T, "each weight does one multiply and one add per token: 2 FLOPs, not 1"),
        (lambda N, T=1: 2 * N, "every token in the pass uses every weight: multiply by n_tokens"),
        (lambda N, T=1: 2 * N * T / 1e9, "return FLOPs, not GFLOPs (no division by 1e9)")],
    "weight_bytes": [
        (lambda N, b: N * b * 8, "bytes, not bits: no factor 8"),
        (lambda N, b: N * b / 1e9, "return bytes, not GB (no division by 1e9)"),
        (lambda N, b: N * 2, "use bytes_per_param as given, not a fixed 2 bytes")],
    "arithmetic_intensity": [
        (lambda N, T, b: N * b / (2 * N * T), "upside down: FLOPs divided by bytes, not bytes by FLOPs"),
        (lambda N, T, b: T / b, "2 FLOPs per weight and token: the FLOPs are 2 * N * T"),
        (lambda N, T, b: 2 / b, "the weights are read once per pass, whatever n_tokens: the bytes are N * b, "
                                "not N * b * n_tokens")],
    "step_time_floor": [
        (lambda N, b, B, F, T=1: N * b / B + 2 * N * T / F, "memory traffic and arithmetic overlap: the floor is "
                                                            "the larger of the two times, not their sum"),
        (lambda N, b, B, F, T=1: min(N * b / B, 2 * N * T / F), "the floor is the larger of the two times (max), "
                                                                "not the smaller"),
        (lambda N, b, B, F, T=1: N * b / B, "with many tokens the compute time 2 * N * T / flops_per_s is the "
                                            "larger one: take the max of both"),
        (lambda N, b, B, F, T=1: 2 * N * T / F, "a step must also read all the weights: bytes / bandwidth; take "
                                                "the max of both times")],
    "ridge_point": [
        (lambda F, B: B / F, "upside down: FLOP/s divided by bytes/s"),
        (lambda F, B: 2 * F / B, "no factor 2 here: the ridge is flops_per_s / bandwidth"),
        (lambda F, B: F / (8 * B), "the bandwidth is already in bytes per second: no factor 8")],
    "tokens_until_compute_bound": [
        (lambda F, B, b: F / B / 2, "bytes_per_param is missing: the intensity is 2 T / bytes_per_param"),
        (lambda F, B, b: F / B * b, "the intensity is 2 T / b: dividing by 2 is missing"),
        (lambda F, B, b: F / B / b * 2, "solving 2 T / b = ridge for T multiplies by b and divides by 2")],
    "kv_cache_bytes_per_token": [
        (lambda L, E, b: L * E * b, "each layer stores a key AND a value vector: a factor 2"),
        (lambda L, E, b: 2 * E * b, "every layer keeps its own cache: multiply by n_layer"),
        (lambda L, E, b: 2 * L * E * b * 8, "bytes, not bits: no factor 8")],
}


def _bug_hint(name: str, got, args) -> str | None:
    if isinstance(got, bool) or not isinstance(got, (int, float)) or got != got:
        return None
    hints = []
    for bug, hint in _BUGS.get(name, []):
        try:
            want = bug(*args)
        except (TypeError, ZeroDivisionError):
            continue
        if want == want and abs(got - want) <= 1e-9 * max(abs(want), 1e-300):
            hints.append(hint)
    return pick_hint(hints)


def _expect(name: str, fn, args: tuple, ref: float | None = None) -> float:
    """fn(*args) must equal the library's function of that name (or ``ref``); a known mistake gets its hint."""
    ref = getattr(R, name)(*args) if ref is None else ref
    got = fn(*args)
    try:
        return expect_number(f"{name}{_fmt_args(args)}", got, ref)
    except Mismatch as m:
        m.hint = _bug_hint(name, float(got) if hasattr(got, "__float__") and not isinstance(got, bool) else got,
                           args) or m.hint
        raise


def _compare_all(name, calls, fn, reference) -> str:
    for args in calls:
        _expect(name, fn, tuple(args), reference(*args))
    return f"{len(calls)} inputs agree"


def _fmt_args(args) -> str:
    return "(" + ", ".join(f"{a:.4g}" if isinstance(a, float) else str(a) for a in args) + ")"


flops = Exercise("decode_flops", NOTEBOOK, "FLOPs of one pass: 2 * n_params * n_tokens")


@flops.case("70B parameters, one token", 1, "each weight does one multiply and one add per token: 2 FLOPs")
def _flops_example(fn):
    return f"{_expect('decode_flops', fn, (70e9, 1), 1.4e11):.3g} FLOPs"


@flops.case("random model sizes, one token", 1, "2 FLOPs per parameter per token")
def _flops_random(fn):
    rng = _rng(201)
    return _compare_all("decode_flops", [(_random_model(rng), 1) for _ in range(5)], fn, R.decode_flops)


@flops.case("several tokens in one pass", 1, "every token in the pass uses every weight: multiply by n_tokens")
def _flops_tokens(fn):
    rng = _rng(202)
    return _compare_all("decode_flops", [(_random_model(rng), rng.choice([2, 5, 8, 64])) for _ in range(5)],
                        fn, R.decode_flops)


@flops.case("n_tokens defaults to 1", 1, "keep the signature decode_flops(n_params, n_tokens=1)")
def _flops_default(fn):
    return f"{_expect('decode_flops', fn, (7e9,), 1.4e10):.3g} FLOPs"


wbytes = Exercise("weight_bytes", NOTEBOOK, "bytes of weights: n_params * bytes_per_param")


@wbytes.case("70B parameters in 16-bit (2 bytes each)", 1, "bytes, not bits: 2 bytes per 16-bit parameter")
def _bytes_example(fn):
    return f"{_expect('weight_bytes', fn, (70e9, 2), 140e9) / 1e9:.4g} GB"


@wbytes.case("random models in fp32, fp16, int8 and 4-bit", 1,
             "use bytes_per_param as given (4, 2, 1 or 0.5); return bytes, not GB")
def _bytes_random(fn):
    rng = _rng(203)
    return _compare_all("weight_bytes", [(_random_model(rng), b) for b in PRECISIONS], fn, R.weight_bytes)


intensity = Exercise("arithmetic_intensity", NOTEBOOK, "FLOPs per byte of weights read in one pass")


@intensity.case("one token, 16-bit and 8-bit weights", 1, "FLOPs divided by bytes (2N / 2N = 1 FLOP per byte)")
def _intensity_example(fn):
    a = _expect('arithmetic_intensity', fn, (70e9, 1, 2), 1.0)
    b = _expect('arithmetic_intensity', fn, (70e9, 1, 1), 2.0)
    return f"{a:.3g} and {b:.3g} FLOP/byte"


@intensity.case("random models, tokens per pass and precisions", 1,
                "the weights are read once per pass, whatever n_tokens: 2 * N * T / (N * b)")
def _intensity_random(fn):
    rng = _rng(204)
    calls = [(_random_model(rng), rng.choice([1, 4, 16, 300]), b) for b in PRECISIONS]
    return _compare_all("arithmetic_intensity", calls, fn, R.arithmetic_intensity)


floor = Exercise("step_time_floor", NOTEBOOK, "max(bytes / bandwidth, FLOPs / peak FLOP/s)")


@floor.case("70B in 16-bit on an H100, one token (about 42 ms)", 1,
            "one step has to read all 140 GB of weights: bytes / bandwidth")
def _floor_example(fn):
    t = _expect("step_time_floor", fn, (70e9, 2, BW, FLOPS), 140e9 / BW)
    return f"{t * 1e3:.1f} ms per step, at most {1 / t:.1f} tokens/s"


@floor.case("memory-bound: random models and chips, a few tokens", 1,
            "memory and arithmetic overlap: the floor is the larger of the two times, not their sum")
def _floor_memory(fn):
    rng = _rng(205)
    calls = []
    for b in PRECISIONS:
        bw, f = _random_chip(rng)
        calls.append((_random_model(rng), b, bw, f, rng.choice([1, 2, 4])))
    return _compare_all("step_time_floor", calls, fn, R.step_time_floor)


@floor.case("compute-bound: 4096 tokens in one pass", 1,
            "with many tokens the FLOPs term 2 * N * T / flops_per_s is the larger one")
def _floor_compute(fn):
    rng = _rng(206)
    calls = []
    for b in (2, 1):
        bw, f = _random_chip(rng)
        calls.append((_random_model(rng), b, bw, f, 4096))
    return _compare_all("step_time_floor", calls, fn, R.step_time_floor)


@floor.case("n_tokens defaults to 1", 1,
            "keep the signature step_time_floor(n_params, bytes_per_param, bandwidth, flops, n_tokens=1)")
def _floor_default(fn):
    t = _expect("step_time_floor", fn, (7e9, 2, 1e12, 1e14), 14e9 / 1e12)
    return f"{t * 1e3:.1f} ms"


ridge = Exercise("ridge_point", NOTEBOOK, "FLOP/byte where the roofline bends: flops_per_s / bandwidth")


@ridge.case("H100: 989 TFLOP/s over 3.35 TB/s", 1, "FLOP/s divided by bytes/s gives FLOP per byte")
def _ridge_example(fn):
    return f"{_expect('ridge_point', fn, (FLOPS, BW), FLOPS / BW):.1f} FLOP/byte"


@ridge.case("random chips", 1, "ridge = peak FLOP/s / peak bytes/s")
def _ridge_random(fn):
    rng = _rng(207)
    calls = [tuple(reversed(_random_chip(rng))) for _ in range(5)]
    return _compare_all("ridge_point", calls, fn, R.ridge_point)


tokens = Exercise("tokens_until_compute_bound", NOTEBOOK, "tokens per pass where 2T/b reaches the ridge")


@tokens.case("H100 in 16-bit", 1, "solve 2 * T / bytes_per_param = ridge for T")
def _tokens_example(fn):
    t = _expect("tokens_until_compute_bound", fn, (FLOPS, BW, 2), FLOPS / BW)
    return f"{t:.0f} tokens per pass"


@tokens.case("random chips in fp32, fp16, int8 and 4-bit", 1,
             "T = ridge * bytes_per_param / 2: fewer bytes per weight means more tokens before the bend")
def _tokens_random(fn):
    rng = _rng(208)
    calls = [(*reversed(_random_chip(rng)), b) for b in PRECISIONS]
    return _compare_all("tokens_until_compute_bound", calls, fn, R.tokens_until_compute_bound)


kv = Exercise("kv_cache_bytes_per_token", NOTEBOOK, "2 * n_layer * n_embd * bytes_per_el")


@kv.case("6 layers, 256 wide, fp32", 1, "each layer stores a key AND a value vector of n_embd numbers per token")
def _kv_example(fn):
    return f"{_expect('kv_cache_bytes_per_token', fn, (6, 256, 4), 2 * 6 * 256 * 4):.0f} bytes"


@kv.case("agrees with minigpt's KVCache.bytes_per_token() on random shapes", 1,
         "count both K and V, in every layer, n_embd = n_head * head_size numbers each")
def _kv_random(fn):
    rng = _rng(209)
    for _ in range(4):
        n_layer, n_head, hs = rng.randint(1, 12), rng.choice([1, 2, 4, 8]), rng.choice([4, 8, 16, 32])
        cache = KVCache(n_layer, n_head, hs, max_len=1)
        _expect("kv_cache_bytes_per_token", fn, (n_layer, n_head * hs, 4), cache.bytes_per_token())
    return "4 cache shapes agree"


@kv.case("random configurations in 16-bit", 1, "bytes_per_el scales everything (2 for fp16)")
def _kv_fp16(fn):
    rng = _rng(210)
    calls = [(rng.randint(12, 96), rng.choice([2048, 4096, 8192]), 2) for _ in range(4)]
    return _compare_all("kv_cache_bytes_per_token", calls, fn, R.kv_cache_bytes_per_token)
