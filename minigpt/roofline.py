"""The arithmetic of the memory-bound argument: why decoding one token at a time leaves the GPU idle.

A decoding step multiplies one new token's activations by every weight matrix of the model. Each weight is
read from memory once and used for one multiply and one add, so with N parameters a step does about 2·N
floating-point operations (FLOPs) on N·b bytes of weights (b bytes per parameter). A chip can fetch at most
B bytes/s and compute at most F FLOP/s, so a step takes at least

    t >= max(N·b / B, 2·N·T / F)        (T tokens scored in the same pass)

The ratio FLOPs / bytes is the *arithmetic intensity* of the pass, 2·T / b: it does not depend on the model
size, only on how many tokens share one read of the weights. The chip is busy computing (not waiting for
memory) only when that intensity reaches its *ridge point* F / B, i.e. once T >= (F / B)·b / 2 tokens are
scored per pass. Decoding scores T = 1, far below; prefill and speculative verification score many tokens
per pass, which is why they are nearly free on a memory-bound chip.

These functions are plain arithmetic on floats (SI units: bytes, seconds, FLOP/s), so a lesson can use them
on any numbers, e.g. the worked example of a 70B-parameter model in 16-bit on 3.35 TB/s GPUs of 80 GB each. Its
140 GB of weights need two such GPUs; split between them (tensor parallelism), each reads half the weights per
step and does half the arithmetic, so the floor is a per-GPU one (communication between the GPUs left out)::

    >>> weight_bytes(70e9, 2) / 1e9                                   # GB of weights
    140.0
    >>> gpus_to_hold(70e9, 2, 80e9)                                   # GPUs of 80 GB needed to hold them
    2
    >>> round(step_time_floor(70e9 / 2, 2, 3.35e12, 1e15) * 1e3, 1)  # ms per decoding step on each, at least
    20.9

The KV cache adds its own reads (2·n_layer·n_embd·b bytes per cached token, :func:`kv_cache_bytes_per_token`);
the weights dominate for short contexts and are what this first-order model counts.
"""
from __future__ import annotations

import math

# Published peak figures of an NVIDIA H100 SXM (dense, no sparsity), the GPU of the worked example.
H100_SXM_BANDWIDTH = 3.35e12   # bytes/s of HBM3
H100_SXM_BF16_FLOPS = 989e12   # FLOP/s on bf16/fp16 tensor cores
H100_SXM_MEMORY = 80e9         # bytes of HBM3 on one GPU


def decode_flops(n_params: float, n_tokens: int = 1) -> float:
    """FLOPs of one forward pass scoring ``n_tokens`` tokens: 2·N·T (one multiply + one add per weight per token).

    Attention over the cached context adds a term that grows with the context length; for the models and
    contexts of this course the weight matmuls dominate, as in the usual 2·N rule of thumb."""
    return 2 * n_params * n_tokens


def weight_bytes(n_params: float, bytes_per_param: float) -> float:
    """Bytes read to stream every weight through the chip once: N·b (b = 4 for fp32, 2 for fp16/bf16, 1 for int8)."""
    return n_params * bytes_per_param


def arithmetic_intensity(n_params: float, n_tokens: int, bytes_per_param: float) -> float:
    """FLOPs per byte of weights read in one pass scoring ``n_tokens`` tokens: 2·N·T / (N·b) = 2·T / b.

    The weights are read once per pass, whatever the number of tokens, so the intensity grows with T."""
    return decode_flops(n_params, n_tokens) / weight_bytes(n_params, bytes_per_param)


def step_time_floor(n_params: float, bytes_per_param: float, bandwidth_bytes_per_s: float, flops_per_s: float,
                    n_tokens: int = 1) -> float:
    """Lower bound on the seconds of one pass: max(N·b / bandwidth, 2·N·T / peak FLOP/s).

    Memory traffic and arithmetic overlap on a GPU, so the pass takes at least the longer of the two
    (a *max*, not a sum); real kernels reach a fraction of either peak, so measured times are higher."""
    memory_s = weight_bytes(n_params, bytes_per_param) / bandwidth_bytes_per_s
    compute_s = decode_flops(n_params, n_tokens) / flops_per_s
    return max(memory_s, compute_s)


def gpus_to_hold(n_params: float, bytes_per_param: float, memory_bytes_per_gpu: float = H100_SXM_MEMORY) -> int:
    """The fewest GPUs whose memory holds the weights: ceil(N·b / memory per GPU) (the KV cache needs room too).

    Split over g GPUs (tensor parallelism), each GPU reads N·b / g bytes and does 2·N·T / g FLOPs per pass: its
    floor is :func:`step_time_floor` of N / g parameters, and the ridge (a ratio of the two) stays where it is."""
    if n_params <= 0 or bytes_per_param <= 0 or memory_bytes_per_gpu <= 0:
        raise ValueError("gpus_to_hold needs positive sizes")
    return max(1, math.ceil(weight_bytes(n_params, bytes_per_param) / memory_bytes_per_gpu))


def ridge_point(flops_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """The arithmetic intensity (FLOP/byte) at which the roofline bends: F / B.

    Below it a pass is memory-bound (time set by bytes / bandwidth), above it compute-bound."""
    return flops_per_s / bandwidth_bytes_per_s


def tokens_until_compute_bound(flops_per_s: float, bandwidth_bytes_per_s: float, bytes_per_param: float) -> float:
    """Tokens per pass at which the intensity 2·T / b reaches the ridge F / B: T = (F / B)·b / 2.

    Up to about this many tokens, scoring more tokens in one pass costs (almost) no extra time."""
    return ridge_point(flops_per_s, bandwidth_bytes_per_s) * bytes_per_param / 2


def kv_cache_bytes_per_token(n_layer: int, n_embd: int, bytes_per_el: float) -> float:
    """Bytes of KV cache per cached position (batch of one): 2 (a key and a value) · n_layer · n_embd · b.

    Every layer stores one key vector and one value vector of n_embd = n_head · head_size numbers per token."""
    return 2 * n_layer * n_embd * bytes_per_el
