"""minigpt.quant: weight-only bf16, int8 and int4 linear layers on the CPU, against the fp32 product they
approximate, and a whole model through the int4 kernel."""
from __future__ import annotations

import pytest
import torch

from conftest import random_model
from minigpt.quant import (Bf16Linear, Int4Linear, Int8Linear, int4_everywhere, int4_groups, int8_rows,
                           kernel_schemas, repack_error, weight_bytes_of, with_output_layer)

HAVE_INT4 = hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
HAVE_INT8 = hasattr(torch.ops.aten, "_weight_int8pack_mm")


def weight(n: int = 64, k: int = 96, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed))


def test_int8_rows_round_trip_within_half_a_step():
    w = weight()
    q, scale = int8_rows(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    assert ((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-6).all()


def test_int4_groups_round_trip_and_layout():
    w = weight()
    q, step, lo = int4_groups(w)
    assert q.min() >= 0 and q.max() <= 15 and step.shape == lo.shape == (64, 3)
    back = (q.reshape(64, 3, 32) * step[..., None] + lo[..., None]).reshape(w.shape)
    assert ((back - w).abs() <= step.repeat_interleave(32, 1) / 2 + 1e-6).all()
    with pytest.raises(ValueError, match="divisible"):
        int4_groups(torch.randn(4, 33))


def test_repack_error_is_zero_on_values_that_already_are_4_bit_levels():
    q = torch.randint(0, 16, (8, 64), generator=torch.Generator().manual_seed(1)).float()
    q[:, ::32], q[:, 1::32] = 0, 15                     # every group spans its full range
    step = torch.rand(8, 2).repeat_interleave(32, 1) + 0.1
    lo = torch.randn(8, 2).repeat_interleave(32, 1)
    assert repack_error(q * step + lo) < 1e-5
    assert repack_error(weight()) > 1e-3


def test_bf16_linear_close_to_fp32():
    w, x = weight(), torch.randn(5, 96)
    y = Bf16Linear(w)(x)
    assert y.dtype == torch.float32 and torch.allclose(y, x @ w.T, atol=0.1, rtol=0.02)
    assert weight_bytes_of(Bf16Linear(w)) == w.numel() * 2


@pytest.mark.skipif(not HAVE_INT8, reason="this PyTorch has no _weight_int8pack_mm")
@pytest.mark.parametrize("act", [torch.float32, torch.bfloat16])
def test_int8_linear_close_to_its_dequantised_weights(act):
    w, x = weight(), torch.randn(3, 2, 96)
    q, scale = int8_rows(w)
    y = Int8Linear(w, act)(x)
    assert y.shape == (3, 2, 64) and y.dtype == torch.float32
    assert torch.allclose(y, x @ (q.float() * scale[:, None]).T, atol=0.15, rtol=0.02)


@pytest.mark.skipif(not HAVE_INT4, reason="this PyTorch has no _weight_int4pack_mm_for_cpu")
def test_int4_linear_close_to_its_dequantised_weights_and_reads_fewer_bytes():
    w, x = weight(), torch.randn(4, 96)
    q, step, lo = int4_groups(w)
    dequant = (q.reshape(64, 3, 32) * step[..., None] + lo[..., None]).reshape(w.shape)
    layer = Int4Linear(w)
    assert torch.allclose(layer(x), x @ dequant.T, atol=0.3, rtol=0.03)
    assert weight_bytes_of(layer) < w.numel() * 4 / 4      # under a byte per weight


@pytest.mark.skipif(not HAVE_INT4, reason="this PyTorch has no _weight_int4pack_mm_for_cpu")
def test_int4_everywhere_replaces_every_linear_and_leaves_the_original():
    m = random_model(0, n_embd=64, n_head=2, vocab_size=96)   # the int4 kernel needs N % 16 == 0
    m4 = int4_everywhere(m)
    assert not any(isinstance(mod, torch.nn.Linear) for mod in m4.modules())
    assert any(isinstance(mod, torch.nn.Linear) for mod in m.transformer.modules())   # a copy, not in place
    idx = torch.randint(0, m.config.vocab_size, (1, 6))
    with torch.no_grad():
        a, b = m(idx), m4(idx)
    assert a.shape == b.shape and (a - b).abs().max() < 0.5 * a.abs().max()


def test_with_output_layer_shares_the_blocks():
    m = random_model(0)
    other = with_output_layer(m, Bf16Linear(m.lm_head.weight))
    assert other.transformer is m.transformer and isinstance(other.lm_head, Bf16Linear)


def test_kernel_schemas_name_every_kernel():
    lines = kernel_schemas()
    assert len(lines) == 3 and all(("aten::" in l) or ("not callable" in l) for l in lines)
