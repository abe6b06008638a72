"""Checks for exercise 02: the memory-bound arithmetic (reference: :mod:`minigpt.roofline`).

Every function is plain arithmetic, so each is checked on the worked example of the course (70B parameters
in 16-bit on an H100: 140 GB, >= ~42 ms per step) and on seeded random inputs, to a relative error of 1e-9.
"""
from __future__ import annotations

import random

from .. import roofline as R
from ..cache import KVCache
from .core import Exercise, expect_number

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


def _compare_all(name, calls, fn, reference) -> str:
    for args in calls:
        expect_number(f"{name}{_fmt_args(args)}", fn(*args), reference(*args))
    return f"{len(calls)} inputs agree"


def _fmt_args(args) -> str:
    return "(" + ", ".join(f"{a:.4g}" if isinstance(a, float) else str(a) for a in args) + ")"


flops = Exercise("decode_flops", NOTEBOOK, "FLOPs of one pass: 2 * n_params * n_tokens")


@flops.case("70B parameters, one token", 1, "each weight does one multiply and one add per token: 2 FLOPs")
def _flops_example(fn):
    return f"{expect_number('decode_flops(70e9, 1)', fn(70e9, 1), 1.4e11):.3g} FLOPs"


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
    return f"{expect_number('decode_flops(7e9)', fn(7e9), 1.4e10):.3g} FLOPs"


wbytes = Exercise("weight_bytes", NOTEBOOK, "bytes of weights: n_params * bytes_per_param")


@wbytes.case("70B parameters in 16-bit (2 bytes each)", 1, "bytes, not bits: 2 bytes per 16-bit parameter")
def _bytes_example(fn):
    return f"{expect_number('weight_bytes(70e9, 2)', fn(70e9, 2), 140e9) / 1e9:.4g} GB"


@wbytes.case("random models in fp32, fp16, int8 and 4-bit", 1,
             "use bytes_per_param as given (4, 2, 1 or 0.5); return bytes, not GB")
def _bytes_random(fn):
    rng = _rng(203)
    return _compare_all("weight_bytes", [(_random_model(rng), b) for b in PRECISIONS], fn, R.weight_bytes)


intensity = Exercise("arithmetic_intensity", NOTEBOOK, "FLOPs per byte of weights read in one pass")


@intensity.case("one token, 16-bit weights", 1, "FLOPs divided by bytes (2N / 2N = 1 FLOP per byte)")
def _intensity_example(fn):
    return f"{expect_number('arithmetic_intensity(70e9, 1, 2)', fn(70e9, 1, 2), 1.0):.3g} FLOP/byte"


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
    t = expect_number("step_time_floor(70e9, 2, 3.35e12, 989e12)", fn(70e9, 2, BW, FLOPS), 140e9 / BW)
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
    t = expect_number("step_time_floor(7e9, 2, 1e12, 1e14)", fn(7e9, 2, 1e12, 1e14), 14e9 / 1e12)
    return f"{t * 1e3:.1f} ms"


ridge = Exercise("ridge_point", NOTEBOOK, "FLOP/byte where the roofline bends: flops_per_s / bandwidth")


@ridge.case("H100: 989 TFLOP/s over 3.35 TB/s", 1, "FLOP/s divided by bytes/s gives FLOP per byte")
def _ridge_example(fn):
    return f"{expect_number('ridge_point(989e12, 3.35e12)', fn(FLOPS, BW), FLOPS / BW):.1f} FLOP/byte"


@ridge.case("random chips", 1, "ridge = peak FLOP/s / peak bytes/s")
def _ridge_random(fn):
    rng = _rng(207)
    calls = [tuple(reversed(_random_chip(rng))) for _ in range(5)]
    return _compare_all("ridge_point", calls, fn, R.ridge_point)


tokens = Exercise("tokens_until_compute_bound", NOTEBOOK, "tokens per pass where 2T/b reaches the ridge")


@tokens.case("H100 in 16-bit", 1, "solve 2 * T / bytes_per_param = ridge for T")
def _tokens_example(fn):
    t = expect_number("tokens_until_compute_bound(989e12, 3.35e12, 2)", fn(FLOPS, BW, 2), FLOPS / BW)
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
    return f"{expect_number('kv_cache_bytes_per_token(6, 256, 4)', fn(6, 256, 4), 2 * 6 * 256 * 4):.0f} bytes"


@kv.case("agrees with minigpt's KVCache.bytes_per_token() on random shapes", 1,
         "count both K and V, in every layer, n_embd = n_head * head_size numbers each")
def _kv_random(fn):
    rng = _rng(209)
    for _ in range(4):
        n_layer, n_head, hs = rng.randint(1, 12), rng.choice([1, 2, 4, 8]), rng.choice([4, 8, 16, 32])
        cache = KVCache(n_layer, n_head, hs, max_len=1)
        expect_number(f"kv_cache_bytes_per_token({n_layer}, {n_head * hs}, 4)", fn(n_layer, n_head * hs, 4),
                      cache.bytes_per_token())
    return "4 cache shapes agree"


@kv.case("random configurations in 16-bit", 1, "bytes_per_el scales everything (2 for fp16)")
def _kv_fp16(fn):
    rng = _rng(210)
    calls = [(rng.randint(12, 96), rng.choice([2048, 4096, 8192]), 2) for _ in range(4)]
    return _compare_all("kv_cache_bytes_per_token", calls, fn, R.kv_cache_bytes_per_token)
