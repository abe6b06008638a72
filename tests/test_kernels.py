"""The compiled kernels of the w4a8 path (minigpt.kernels): the 4-bit x 8-bit and 8-bit x 8-bit products compute
their formulas, the attention computes softmax attention, and each gives a row the same bits whatever rows share the
call; without a compiler the path says so in one sentence."""
from __future__ import annotations

import math

import pytest
import torch

from minigpt import kernels
from minigpt.quant import Q8A8Linear, W4A8Linear, int4_groups, int8_groups

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no C compiler for the kernels")


def _reference(layer_weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The formula in float64: 4-bit levels (q * step + minimum per group of 32) times the activations rounded to
    int8 per group of 32 (scale = the group's largest magnitude / 127)."""
    N, K = layer_weight.shape
    q, step, lo = int4_groups(layer_weight)
    w = (q.reshape(N, K // 32, 32) * step[..., None] + lo[..., None]).reshape(N, K).double()
    xq, scale = int8_groups(x)
    xd = (xq.double().reshape(x.shape[0], -1, 32) * scale.double()[..., None]).reshape(x.shape)
    return xd @ w.T


def _reference_q8(layer_weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Q8_0's formula in float64: int8 weights with a scale per group of 32 times the activations rounded likewise."""
    N, K = layer_weight.shape
    q, scale = int8_groups(layer_weight)
    w = (q.double().reshape(N, K // 32, 32) * scale.double()[..., None]).reshape(N, K)
    xq, xs = int8_groups(x)
    return (xq.double().reshape(x.shape[0], -1, 32) * xs.double()[..., None]).reshape(x.shape) @ w.T


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("N,K", [(48, 64), (50, 96), (7, 32), (200, 576)])
def test_the_product_is_its_formula_and_rows_do_not_meet(N, K, bits):
    """4-bit (Q4_1) and 8-bit (Q8_0) weights; sizes whose outputs do not fill a block of 16 included; every row
    count from 1 to 33 gives each row the bits that row gets alone."""
    g = torch.Generator().manual_seed(N * K + bits)
    w = torch.randn(N, K, generator=g) * 0.1
    layer = W4A8Linear(w) if bits == 4 else Q8A8Linear(w)
    x = torch.randn(33, K, generator=g) * torch.exp2(torch.randint(-4, 5, (33, K), generator=g).float())
    y = layer(x)
    ref = _reference(w, x) if bits == 4 else _reference_q8(w, x)
    assert y.shape == (33, N)
    assert (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    alone = torch.cat([layer(x[i:i + 1]) for i in range(33)])
    for rows in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33):
        assert torch.equal(layer(x[:rows]), alone[:rows]), rows


def test_the_8_bit_layer_recovers_q8_0_weights_exactly():
    """Weights that are int8 levels times an fp16 scale per group of 32 (a GGUF file's Q8_0 blocks, each with a
    level at +-127) come back as the same levels and scales, so the layer multiplies by the file's own weights;
    and a row of all -127 levels against activations at the int8 extremes stays exact (the offset of 128)."""
    g = torch.Generator().manual_seed(1)
    q = torch.randint(-127, 128, (32, 64), generator=g)
    q[:, 0], q[:, 32], q[0] = 127, -127, -127
    d = (torch.rand(32, 2, generator=g) * 0.01 + 1e-4).half().float()
    w = (q.float().reshape(32, 2, 32) * d[..., None]).reshape(32, 64)
    layer = Q8A8Linear(w)
    levels = (layer.q.to(torch.int16) - 128).permute(0, 3, 1, 2, 4).reshape(32, 64)
    assert torch.equal(levels, q.to(torch.int16))
    assert torch.equal(layer.scale.transpose(1, 2).reshape(32, 2), d)
    x = torch.tensor([[127.0, -127.0] * 32])
    exact = (q.double() * d.double().repeat_interleave(32, 1)) @ x[0].double()
    assert (layer(x)[0].double() - exact).abs().max() <= 1e-5 * exact.abs().max()


def test_a_group_of_zeros_and_extreme_activations():
    """A group of zeros (scale floored, all products zero) and a group at the int8 extremes stay exact."""
    w = torch.randn(16, 64)
    x = torch.zeros(2, 64)
    x[1, 32:] = torch.tensor([1e6, -1e6] * 16)
    ref = _reference(w, x)
    y = W4A8Linear(w)(x)
    assert torch.equal(y[0], torch.zeros(16))
    assert (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_the_layer_refuses_what_it_cannot_take():
    with pytest.raises(ValueError, match="divisible by 32"):
        W4A8Linear(torch.randn(8, 40))
    with pytest.raises(ValueError, match="inputs of size 64"):
        W4A8Linear(torch.randn(8, 64))(torch.randn(2, 32))
    with pytest.raises(ValueError, match="divisible by 32"):
        Q8A8Linear(torch.randn(8, 40))
    with pytest.raises(ValueError, match="inputs of size 64"):
        Q8A8Linear(torch.randn(8, 64))(torch.randn(2, 32))


def _attend(q, K, V, n, ofs, idx, max_len):
    B, H, T, hs = q.shape
    out = torch.empty(B, T, H, hs)
    err = kernels.library().attend_rows(B, T, H, K.shape[1], hs, max_len, q.data_ptr(), K.data_ptr(), V.data_ptr(),
                                        n.data_ptr(), ofs.data_ptr(), idx.data_ptr(), 1 / math.sqrt(hs),
                                        out.data_ptr(), 1)
    assert err == 0
    return out


@pytest.mark.parametrize("H,n_kv,hs", [(6, 2, 32), (10, 2, 80), (4, 4, 64)])
def test_the_compiled_attention_is_softmax_attention_row_by_row(H, n_kv, hs):
    """Rows that see the cache's first n slots and tree rows that see a list of slots, against softmax attention in
    float64; each row the same bits alone as beside the others; grouped heads (3 or 5 query heads on a key head:
    the kernel weighs up to 4 side by side) and heads of their own; a head size that is not a multiple of 64."""
    g = torch.Generator().manual_seed(0)
    B, max_len = 2, 300
    K = torch.randn(B, n_kv, max_len, hs, generator=g)
    V = torch.randn(B, n_kv, max_len, hs, generator=g)
    keys = [list(range(n)) for n in (1, 17, 130, 299)] + [[0, 1, 2, 5, 9], [0, 1, 2, 7, 250, 260]]
    T = len(keys)
    q = torch.randn(B, H, T, hs, generator=g) * 3
    n = torch.tensor([len(k) for k in keys], dtype=torch.int32)
    flat, offsets = [], []
    for k in keys:
        offsets.append(-1 if k[-1] == len(k) - 1 else len(flat))
        flat += k if offsets[-1] >= 0 else []
    ofs, idx = torch.tensor(offsets, dtype=torch.int32), torch.tensor(flat, dtype=torch.int32)
    out = _attend(q, K, V, n, ofs, idx, max_len)
    for t, k in enumerate(keys):
        for h in range(H):
            kk, vv = K[:, h // (H // n_kv), k].double(), V[:, h // (H // n_kv), k].double()
            p = torch.softmax(torch.einsum("bd,bld->bl", q[:, h, t].double(), kk) / math.sqrt(hs), -1)
            ref = torch.einsum("bl,bld->bd", p, vv)
            assert (out[:, t, h].double() - ref).abs().max() < 1e-5, (t, h)
        alone = _attend(q[:, :, t:t + 1].contiguous(), K, V, n[t:t + 1], torch.tensor([-1 if offsets[t] < 0 else 0],
                        dtype=torch.int32), torch.tensor(k if offsets[t] >= 0 else [0], dtype=torch.int32), max_len)
        assert torch.equal(alone[:, 0], out[:, t]), t


def test_without_a_compiler_the_path_says_so_in_one_sentence(monkeypatch, tmp_path):
    from minigpt.precision import reduce_precision
    from conftest import random_model
    monkeypatch.setattr(kernels, "_loaded", {})
    monkeypatch.setattr(kernels, "_compiler", lambda: None)
    monkeypatch.setenv("MINIGPT_CACHE", str(tmp_path))           # nothing built there yet
    with pytest.raises(kernels.KernelUnavailable, match="need a C compiler") as e:
        reduce_precision(random_model(0, vocab_size=96, block_size=64, n_embd=64, n_head=4), "w4a8")
    assert "\n" not in str(e.value)


def test_the_portable_road_computes_the_same_formula_row_invariantly(tmp_path):
    """The plain C loops (a CPU without AVX-512 VNNI, or MINIGPT_KERNELS_PORTABLE=1): the formula, rows that do not
    meet, and attention, checked in a fresh process built that way."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    script = tmp_path / "check.py"
    script.write_text(
        "import sys, torch\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import test_kernels as t\n"
        "from minigpt import kernels\n"
        "assert kernels.describe() == 'portable C', kernels.describe()\n"
        "t.test_the_product_is_its_formula_and_rows_do_not_meet(50, 96, 4)\n"
        "t.test_the_product_is_its_formula_and_rows_do_not_meet(50, 96, 8)\n"
        "t.test_the_8_bit_layer_recovers_q8_0_weights_exactly()\n"
        "t.test_a_group_of_zeros_and_extreme_activations()\n"
        "t.test_the_compiled_attention_is_softmax_attention_row_by_row(10, 2, 80)\n"
        "print('portable ok')\n")
    env = dict(os.environ, MINIGPT_KERNELS_PORTABLE="1", MINIGPT_CACHE=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0 and "portable ok" in done.stdout, done.stderr[-2000:]
