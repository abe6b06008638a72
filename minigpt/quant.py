"""Weight-only low-precision linear layers on the CPU: the same ``x @ W.T`` reading fewer bytes per weight.

A decoding step of a small model reads every weight once (Lesson 03), so storing the weights in fewer bytes can
make it faster, if a kernel computes with them directly. Three formats, each through a kernel of PyTorch:

* :class:`Bf16Linear` -- 2 bytes per weight, PyTorch's ordinary matmul in bf16;
* :class:`Int8Linear` -- 1 byte per weight and one scale per output row (:func:`int8_rows`), through the
  private operator ``aten::_weight_int8pack_mm``; the input is cast to ``act`` first, and which kernel runs
  depends on that dtype;
* :class:`Int4Linear` -- 4 bits per weight in groups of 32 inputs with a bf16 step and zero point per group
  (:func:`int4_groups`, GGUF's Q4_1 layout: 0.625 bytes per weight), through ``aten::_weight_int4pack_mm_for_cpu``;
* :class:`W8A8Linear` -- 1 byte per weight, and the input rounded to 8 bits too, row by row: the products and
  their sums are integers (``aten::_int_mm``, int8 x int8 -> int32), so no rounding happens inside the matmul.

The int8 and int4 operators and ``_int_mm`` are private (the leading underscore): they carry no stability promise,
so :func:`kernel_schemas` shows what this PyTorch has of the first three before a lesson relies on them.
:func:`int4_everywhere` puts every linear layer of a :class:`~minigpt.model.GPT` (its output layer too) through the
int4 kernel. None of these is the course's exact path: they change the logits, and with them, at near-ties, the
greedy text.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import kernels
from .model import GPT

KERNELS = ("_weight_int8pack_mm", "_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu")


def kernel_schemas() -> list[str]:
    """The signature of each private operator in :data:`KERNELS` on this PyTorch, or one line saying it is not
    callable here."""
    lines = []
    for op in KERNELS:
        try:
            lines.append(str(getattr(torch.ops.aten, op).default._schema))
        except (AttributeError, RuntimeError) as e:
            lines.append(f"{op}: not callable in torch {torch.__version__}: {str(e).splitlines()[0]}")
    return lines


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric 8-bit integers with one scale per output row: ``(q (N, K) int8, scale (N,))``,
    ``weight ~ q * scale[:, None]``, ``|q| <= 127``."""
    scale = weight.abs().amax(1).clamp(min=1e-12) / 127
    return torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def int4_groups(weight: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """4-bit integers 0..15 with a step and a minimum per group of ``group`` inputs (Q4_1's layout):
    ``(q (N, K) int32, step (N, K / group), minimum (N, K / group))``, ``weight ~ q * step + minimum``."""
    N, K = weight.shape
    if K % group:
        raise ValueError(f"int4 groups of {group} need an input size divisible by {group}, got {K}")
    w = weight.reshape(N, K // group, group)
    lo, hi = w.amin(-1), w.amax(-1)
    step = ((hi - lo) / 15).clamp(min=1e-12)
    q = torch.round((w - lo[..., None]) / step[..., None]).clamp(0, 15).to(torch.int32)
    return q.reshape(N, K), step, lo


def repack_error(weight: torch.Tensor, group: int = 32) -> float:
    """The largest change :func:`int4_groups` makes to a weight (before the step and minimum go to bf16): zero for
    weights that already are 16 evenly spaced levels per group, such as a GGUF Q4_1 file's dequantised values."""
    q, step, lo = int4_groups(weight.detach().float(), group)
    back = q.reshape(step.shape + (-1,)) * step[..., None] + lo[..., None]
    return (back.reshape(weight.shape) - weight.detach().float()).abs().max().item()


class Bf16Linear(nn.Module):
    """``x @ W.T`` with W in bf16 (the input cast to bf16, the output back to the input's dtype)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = weight.detach().to(torch.bfloat16)
        self.in_features, self.device = weight.shape[1], weight.device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(torch.bfloat16), self.weight).to(x.dtype)


class Int8Linear(nn.Module):
    """``x @ W.T`` with W as int8 rows (:func:`int8_rows`), torch's weight-only int8 CPU kernel; ``act``: the
    dtype the input is cast to (the kernel behind the operator is chosen by it)."""

    def __init__(self, weight: torch.Tensor, act: torch.dtype = torch.bfloat16):
        super().__init__()
        self.q, scale = int8_rows(weight.detach().float())
        self.scale, self.act = scale.to(act), act
        self.in_features, self.device = weight.shape[1], weight.device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).to(self.act), self.q, self.scale)
        return y.reshape(*x.shape[:-1], -1).to(x.dtype)


class Int4Linear(nn.Module):
    """``x @ W.T`` with W as 4-bit groups (:func:`int4_groups`), torch's weight-only int4 CPU kernel (bf16 input
    and output, the result cast back to the input's dtype)."""

    def __init__(self, weight: torch.Tensor, group: int = 32):
        super().__init__()
        q, step, lo = int4_groups(weight.detach().float(), group)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)      # two 4-bit values per byte
        # torch's convention per group: w = (q - 8) * scale + zero; ours: w = q * step + minimum
        self.scales_and_zeros = torch.stack([step, lo + 8 * step], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
        self.group, self.out_features = group, weight.shape[0]
        self.in_features, self.device = weight.shape[1], weight.device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, x.shape[-1]).to(torch.bfloat16), self.packed,
                                                        self.group, self.scales_and_zeros)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def int8_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of ``x`` (rows, K) rounded to int8 with a scale of its own, its largest magnitude / 127:
    ``(q (rows, K) int8, scale (rows, 1) fp32)``. A row's numbers depend on that row alone."""
    xf = x.float()
    scale = xf.abs().amax(1, keepdim=True).div_(127).clamp_(min=1e-30)
    return xf.div(scale).round_().to(torch.int8), scale


_packed_int8: list = []  # [bool]: whether oneDNN's packed integer product is here and agrees with torch._int_mm


def packed_int8_available() -> bool:
    """Whether this build has oneDNN's integer linear with pre-packed weights (``torch.ops.onednn.qlinear_prepack``
    and ``qlinear_pointwise``, x86 CPUs) and it gives ``torch._int_mm``'s result bit for bit: checked once, on
    random and on extreme inputs (sums past 2^24, where the conversion of the int32 sum to fp32 rounds)."""
    if not _packed_int8:
        ok = hasattr(torch, "_int_mm") and hasattr(torch.ops.onednn, "qlinear_prepack")
        if ok:
            try:
                g = torch.Generator().manual_seed(0)
                for k, n, rows in ((64, 48, 3), (1536, 40, 7), (576, 32, 17)):
                    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
                    xs = [torch.randint(-128, 128, (rows, k), generator=g, dtype=torch.int8),
                          torch.full((rows, k), -128, dtype=torch.int8)]
                    w_max = torch.full((n, k), -127, dtype=torch.int8)
                    for x, ww in ((xs[0], w), (xs[1], w), (xs[1], w_max)):
                        ok = ok and torch.equal(_packed_product(x, _pack_int8(ww)), torch._int_mm(x, ww.t()).float())
            except (RuntimeError, NotImplementedError):
                ok = False
        _packed_int8.append(bool(ok))
    return _packed_int8[0]


def _pack_int8(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, K) int8 weights in oneDNN's own layout for its integer linear, with the unit scale and zero zero point
    of each of the N output channels that the call wants beside them (made once here, not at every call)."""
    n = q.shape[0]
    return torch.ops.onednn.qlinear_prepack(q, None), torch.ones(n), torch.zeros(n, dtype=torch.long)


def _packed_product(xq: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The int32 sums ``xq @ q.T`` (``packed`` from :func:`_pack_int8`), as fp32, through oneDNN. Its integer
    linear takes unsigned activations with a zero point: ``xq + 128`` as uint8 (the sign bit flipped) with zero
    point 128 is ``xq`` again, and unit scales leave the integer sum (its conversion to fp32 aside) untouched."""
    weights, ones, zeros = packed
    return torch.ops.onednn.qlinear_pointwise(xq.view(torch.uint8).bitwise_xor(128), 1.0, 128, weights, ones, zeros,
                                              None, 1.0, 0, torch.float32, "none", [], "")


class W8A8Linear(nn.Module):
    """``x @ W.T`` in integers: W as int8 rows (:func:`int8_rows`), each input row rounded to int8 with a scale of
    its own (:func:`int8_activations`), the products summed in int32, and the sum scaled back (the row's scale
    times the weight row's). An integer sum is exact, so it is the same in whatever order a kernel adds: a row's
    result cannot depend on how many rows share the call, whichever kernel the shape picks. One row goes through
    ``torch._int_mm`` (a matrix-vector kernel); several rows, with ``packed`` and where
    :func:`packed_int8_available`, through oneDNN's integer linear on weights packed once in its own layout
    (``torch._int_mm``'s kernel for several rows re-reads the weights in a slower way: on this course's CPU the
    49,152 x 576 output layer took 0.5 ms for one row and 3 ms for 2 to 16, oneDNN's 1-1.7 ms), the same sums.
    The rounding of the activations is a second approximation on top of the weights' (W8A8: 8-bit weights and
    activations); ``smooth`` (one factor per input channel, :func:`smoothing_factors`) moves part of the
    activations' range into the weights, where the rounding is finer."""

    def __init__(self, weight: torch.Tensor, smooth: torch.Tensor | None = None, packed: bool = False):
        super().__init__()
        weight = weight.detach().float()
        # smoothing (Xiao et al. 2023, SmoothQuant): input channel j divided by smooth[j], its weights multiplied by
        # it, the same product; a channel with outliers then rounds less coarsely beside the others
        self.inv_smooth = None if smooth is None else (1.0 / smooth.float())
        q, scale = int8_rows(weight if smooth is None else weight * smooth.float()[None, :])
        self.q_t = q.t()                   # (K, N) read column by column: the layout torch._int_mm reads fastest
        self.packed = _pack_int8(q) if packed and weight.device.type == "cpu" and packed_int8_available() else None
        self.scale = scale.float()
        self.in_features, self.out_features, self.device = weight.shape[1], weight.shape[0], weight.device

    def __deepcopy__(self, memo):
        """A copy with weights packed anew: oneDNN's packed tensor has no storage that Python can copy."""
        twin = self.__class__.__new__(self.__class__)
        memo[id(self)] = twin
        twin.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items() if k != "packed"})
        twin.packed = None if self.packed is None else _pack_int8(twin.q_t.t())
        return twin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        xq, s = int8_activations(x2 if self.inv_smooth is None else x2.float() * self.inv_smooth)
        if self.packed is not None and xq.shape[0] > 1:
            y = _packed_product(xq, self.packed)
        else:
            y = torch._int_mm(xq, self.q_t).float()
        y = y.mul_(s).mul_(self.scale)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def int8_groups(x: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Each group of ``group`` inputs of each row of ``x`` (rows, K) rounded to int8 with a scale of its own, the
    group's largest magnitude / 127 (llama.cpp's Q8 blocks): ``(q (rows, K) int8, scale (rows, K / group) fp32)``.
    A row's numbers depend on that row alone."""
    rows, K = x.shape
    xg = x.float().reshape(rows, K // group, group)
    scale = xg.abs().amax(-1).div_(127).clamp_(min=1e-30)
    return xg.div(scale[..., None]).round_().to(torch.int8).reshape(rows, K), scale


class _GroupKernelLinear(nn.Module):
    """What the compiled grouped layers share: an input size divisible by 32, outputs in blocks of 16 (the last
    filled with zeros), per-group numbers laid out (block, group, 16), and a forward pass that hands the kernel the
    rows in fp32 (it rounds each row's groups to int8 itself)."""
    kind = ""

    def _shape(self, weight: torch.Tensor, group: int) -> tuple[int, int, int, int]:
        """Checks and records the layer's sizes: (N, K, groups per row, N rounded up to blocks of 16)."""
        kernels.library()                     # KernelUnavailable, one sentence, where it cannot be built
        N, K = weight.shape
        if group != 32 or K % 32:
            raise ValueError(f"the {self.kind} kernel takes groups of 32 and an input size divisible by 32, got {K}")
        self.group, self.in_features, self.out_features = group, K, N
        self.device = weight.device
        return N, K, K // 32, -(-N // 16) * 16

    @staticmethod
    def _by_block(t: torch.Tensor, Np: int) -> torch.Tensor:
        """(N, groups) numbers -> (blocks, groups, 16) fp32: lane i of a block is its output i."""
        return F.pad(t.float(), (0, 0, 0, Np - t.shape[0])).reshape(Np // 16, 16, -1).transpose(1, 2).contiguous()

    def _product(self, x2: torch.Tensor, y: torch.Tensor) -> int:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        K = self.in_features
        if x.shape[-1] != K:
            raise ValueError(f"{type(self).__name__} expects inputs of size {K}, got {tuple(x.shape)}")
        x2 = x.reshape(-1, K).float().contiguous()
        y = torch.empty(x2.shape[0], self.out_features)
        if self._product(x2, y):
            raise MemoryError(f"the {self.kind} kernel could not allocate its buffers for {x2.shape[0]} rows")
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class W4A8Linear(_GroupKernelLinear):
    """``x @ W.T`` with W as 4-bit groups of 32 (:func:`int4_groups`, Q4_1's layout) and each group of 32 inputs of
    a row rounded to int8 with a scale of its own (:func:`int8_groups`), through the compiled kernel of
    ``minigpt/kernels/invariant.c``: a group's 32 products summed in int32 (exact, so in any order), the groups' scaled
    sums added in fp32 in one fixed order. A row's result therefore does not depend on how many rows share the
    call, and the rows share each unpacked register of weights: a pass over several tokens costs less than that many
    one-token passes. This is llama.cpp's own recipe for a Q4_1 layer on a CPU (its activations go to 8-bit blocks
    of 32 too); what the kernel adds is an order of the floating-point sums that the row count cannot change.
    Needs an input size divisible by 32; :class:`minigpt.kernels.KernelUnavailable` where the kernel cannot be
    built."""
    kind = "w4a8"

    def __init__(self, weight: torch.Tensor, group: int = 32):
        super().__init__()
        N, K, G, Np = self._shape(weight, group)
        q, step, lo = int4_groups(weight.detach().float().cpu(), group)
        q = F.pad(q.to(torch.uint8), (0, 0, 0, Np - N)).reshape(Np // 16, 2, 8, G, 8, 4)
        q = q.permute(0, 3, 4, 1, 2, 5).reshape(Np // 16, G, 8, 2, 32)        # (block, group, quad, half, 32)
        # byte 4i + t of a quad: output i's weight for input 4j + t in the low 4 bits, output 8 + i's in the high
        self.q = (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).contiguous()
        self.step, self.lo = self._by_block(step, Np), self._by_block(lo, Np)

    def _product(self, x2: torch.Tensor, y: torch.Tensor) -> int:
        return kernels.library().w4a8_linear(x2.shape[0], self.out_features, self.in_features, x2.data_ptr(),
                                             self.q.data_ptr(), self.step.data_ptr(), self.lo.data_ptr(),
                                             y.data_ptr(), torch.get_num_threads())


class Q8A8Linear(_GroupKernelLinear):
    """``x @ W.T`` with W in 8-bit groups of 32 inputs (one scale per group, a GGUF file's Q8_0 blocks: where the
    file stores a layer so, as SmolLM2's stores its output layer, the groups are recovered exactly) and each group of
    32 inputs of a row rounded to int8 with a scale of its own (:func:`int8_groups`), through the compiled kernel of
    ``minigpt/kernels/invariant.c``: a group's products summed in int32, the groups' scaled sums added in fp32 in
    one fixed order, so a row's result does not depend on how many rows share the call (llama.cpp's Q8_0 x Q8
    product). Needs an input size divisible by 32."""
    kind = "q8a8"

    def __init__(self, weight: torch.Tensor, group: int = 32):
        super().__init__()
        N, K, G, Np = self._shape(weight, group)
        q, scale = int8_groups(weight.detach().float().cpu(), group)      # (N, K) int8, (N, G)
        u = (F.pad(q.to(torch.int16), (0, 0, 0, Np - N)) + 128).to(torch.uint8)     # q + 128: 0..255
        # (block, output i, group, quad j, t) -> (block, group, quad, 4i + t): lane i holds output i's quad
        self.q = u.reshape(Np // 16, 16, G, 8, 4).permute(0, 2, 3, 1, 4).contiguous()
        self.scale = self._by_block(scale, Np)

    def _product(self, x2: torch.Tensor, y: torch.Tensor) -> int:
        return kernels.library().q8a8_linear(x2.shape[0], self.out_features, self.in_features, x2.data_ptr(),
                                             self.q.data_ptr(), self.scale.data_ptr(), y.data_ptr(),
                                             torch.get_num_threads())


def smoothing_factors(weight: torch.Tensor, input_max: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """SmoothQuant's per-input-channel factors (Xiao et al. 2023): ``input_max[j] ** alpha / max_i |W[i, j]| **
    (1 - alpha)``, where ``input_max`` is the largest |input| seen in channel j on calibration text. Dividing the
    inputs by them and multiplying the weights' columns by them leaves the product unchanged and evens out the
    two roundings (alpha = 1: all of the range goes to the weights; 0: none)."""
    w_max = weight.detach().float().abs().amax(0).clamp(min=1e-5)
    return (input_max.float().clamp(min=1e-5) ** alpha / w_max ** (1 - alpha)).clamp(min=1e-5)


def weight_bytes_of(module: nn.Module) -> int:
    """Bytes of the tensors a linear layer reads per pass: its parameters, or the packed weights, scales and zero
    points a quantised layer keeps as plain attributes."""
    return sum(t.numel() * t.element_size() for t in module.__dict__.values() if isinstance(t, torch.Tensor)) + \
        sum(p.numel() * p.element_size() for p in module.parameters())


@torch.no_grad()
def dense_weight(layer: nn.Module) -> torch.Tensor:
    """The (out, in) weight a linear layer applies, in fp32, whatever kernel it runs through: an ``nn.Linear``'s
    own, else read back through the layer itself (the identity matrix in, less what zeros give, which is its
    bias), so it is exactly what the layer's kernel multiplies by, rounding of its input to bf16 aside."""
    if isinstance(layer, nn.Linear):
        return layer.weight.detach().float()
    eye = torch.eye(layer.in_features, device=layer.device)
    return (layer(eye) - layer(torch.zeros_like(eye[:1]))).float().T.contiguous()


def with_output_layer(model: GPT, head: nn.Module) -> GPT:
    """The same model, its blocks shared (not copied), with ``head`` as its output layer."""
    return GPT.sharing(model.config, model.transformer, head).eval()


def int4_everywhere(model: GPT, group: int = 32) -> GPT:
    """A copy of ``model`` whose every ``nn.Linear`` (the output layer too) runs through :class:`Int4Linear`;
    norms, embeddings, attention and the KV cache stay as they are."""
    m4 = GPT.sharing(model.config, copy.deepcopy(model.transformer), Int4Linear(model.lm_head.weight, group)).eval()
    for module in list(m4.transformer.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Int4Linear(child.weight, group))
    return m4
