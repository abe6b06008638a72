"""Reduced-precision weights, and a batch-invariant path that keeps speculative decoding exact with them.

Speculative decoding is exact only if scoring k tokens in one pass gives the logits of k one-token passes
(Lesson 04's argument assumes it; Lesson 13 measured where it fails). A kernel may pick another reduction order
for another shape, and rounding then depends on the shape: in fp32 the difference stays at rounding level, but
at reduced precision it can flip a near-tie, and the speculative output leaves the model's own plain output.

:func:`reduce_precision` gives a model whose every pass is **batch-invariant**: row i of a pass over k tokens is
computed by the same arithmetic, in the same order, as the one-token pass at that position, so the logits are
bitwise equal for every k. Each part that reduces is made shape-independent:

* **linear layers** run through kernels whose per-row reduction order does not depend on the number of rows,
  checked on the running build by :func:`invariant_piece`: PyTorch's weight-only int4 and int8 CPU kernels, and
  its bf16 matmul run on tiles of exactly ``TILE_ROWS`` rows, the last tile filled up with zero rows (one shape,
  so one kernel) and, where the check needs it, taken over slices of the input dimension summed in fp32 in a
  fixed order. An fp32 matmul
  is *not* row-invariant: one row goes through a matrix-vector kernel. The "w8a8" layers need no check of the
  order at all: they multiply 8-bit integers and sum them in int32, and an exact sum is the same in any order;
* **attention** (:class:`InvariantAttention`) reduces every query over a key axis whose length depends only on
  that query's own position (rounded up to a multiple of ``bucket``), with its keys laid out from position 0
  in order; a token tree's node gathers its ancestors' keys into that layout. Positions beyond the query's
  keys are masked to exactly zero weight. A query row's heads meet its keys in two batched products (scores,
  then the weighted sum of values), in the model's dtype. The rows of a wide pass share one product per key
  head where :func:`grouped_rows_agree` finds this build's product gives a row the same bits beside other rows
  as alone; elsewhere each row gets products of its own, of the one-token step's shape (not one product with
  the rows as its batch: on some CPUs a batched product picks its kernel by the batch count). Either way a
  row's arithmetic is the same whatever the number of rows (a one-token step takes a shorter road to the same
  two products);
* **norms**, activations and residual additions work row by row, element by element.

Precisions: ``"fp32"`` (the course's model, unchanged), ``"bf16"`` (bf16 weights) and ``"int4"`` (the blocks' 4-bit
weights in groups of 32 with a step and a minimum per group, the layout of the GGUF's Q4_1 blocks, through
``torch.ops.aten._weight_int4pack_mm_for_cpu``; the output layer at 8 bits per row, as the file keeps it),
``"w8a8"`` (every linear layer, the output layer too, at 8 bits per weight with a scale per output row, and each
input row rounded to 8 bits with a scale of its own, summed in int32: one row through ``torch._int_mm``, several
through oneDNN's integer linear) and ``"w4a8"`` (the blocks' weights as for "int4", each group of 32 inputs rounded
to 8 bits with a scale of its own, as llama.cpp does on a CPU, through the compiled kernels of
:mod:`minigpt.kernels`: a group's products summed in int32, the groups in fp32 in one fixed order, the rows of a
pass sharing each unpacked register of weights; its attention in C too, one query row at a time; the output layer
as the file stores it, 8-bit groups of 32 with a scale each (Q8_0), times the same 8-bit activation groups,
:class:`Q8A8Linear`). "w4a8" needs a C compiler, used once to build the kernels. The int4 and int8
weight-only kernels do most of their work per input row (a 17-row call costs about six one-row calls), so a wide
verification pass is dear on the int4 path; one integer matmul layer costs about the same for 1 to 33 rows (Lesson
13b), at the price of a second rounding (the activations'). A whole w8a8 pass still costs more than a one-token step
(attention works row by row, and ``torch._int_mm`` reads the weights faster for one row than for several): on this
course's CPU, one thread, 300 cached positions, a pass over 2, 8 and 16 tokens cost 1.55, 2.24 and 3.13 one-token
steps with several rows through oneDNN's packed integer linear (:class:`~minigpt.quant.W8A8Linear`), against 1.95,
2.65 and 3.57 through ``torch._int_mm``.
Passes wider than ``max_rows`` (a long prompt's prefill) take the ordinary attention: both a plain and a
speculative run prefill the same prompt the same way.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import kernels, quant
from .cache import KVCache
from .model import GPT, CausalSelfAttention
from .quant import int4_groups  # noqa: F401  (re-exported: the Q4_1 recovery the int4 path relies on)

PRECISIONS = ("fp32", "bf16", "int4", "w8a8", "w4a8")


# Row counts at which a kernel is checked to give every row exactly as a one-row call does.
CHECK_ROWS = (2, 3, 5, 8, 9, 16, 17, 32, 33, 64)
# A bf16 layer runs its rows in tiles of this many, the last filled up with zero rows (Bf16Linear). On the course's
# CPU (a 2-core Xeon with AMX, torch 2.13, one thread) a bf16 matmul of SmolLM2's 1536 x 576 layer took about
# 0.26 ms for any row count from 1 to 16, and 0.37-0.39 ms for 24-32 rows: a tile of 16 costs a one-token step
# nothing more than one row does, and lets a pass over up to 16 tokens cost no more than one token's (a tile of
# 64 made every call a 64-row call, 0.48 ms).
TILE_ROWS = 16
_invariant_pieces: dict[tuple[str, int], int | None] = {}


def _row_differences(fn, width: int, rows, g: torch.Generator, wild: bool = False):
    """For each row count k in ``rows``, in turn: (k, the largest absolute difference between ``fn``'s output rows
    for k random input rows (of ``width`` numbers, drawn from ``g``) in one call and one call each). ``wild``:
    each number also scaled by a random power of two in 2^-8 .. 2^8, so that sums taken in another order differ
    by more than the output's rounding hides (with a bf16 output, normal numbers alone hide most such
    differences)."""
    with torch.no_grad():
        for k in rows:
            x = torch.randn(k, width, generator=g)
            if wild:
                x = x * torch.exp2(torch.randint(-8, 9, (k, width), generator=g).float())
            together, alone = fn(x).float(), torch.cat([fn(x[i:i + 1]) for i in range(k)]).float()
            yield k, float((together - alone).abs().max())


def _rows_agree(fn, width: int, g: torch.Generator) -> bool:
    """Whether ``fn`` (rows, width) -> (rows, n) gives every row as it gives that row alone, at CHECK_ROWS, on
    ordinary and on wild inputs (:func:`_row_differences`)."""
    return all(diff == 0.0 for wild in (False, True) for _, diff in _row_differences(fn, width, CHECK_ROWS, g, wild))


def rows_vs_alone(layer, width: int, rows=(2, 5, 17), seed: int = 0, wild: bool = False) -> dict[int, float]:
    """For each row count k: the largest absolute difference between ``layer``'s output rows computed in one call
    over k random input rows (of ``width`` numbers; ``wild``: spread over 2^-8 .. 2^8, see
    :func:`_row_differences`) and the same rows computed one call each. 0.0 means the layer reduced these rows
    the same way whatever the number of rows beside them."""
    return dict(_row_differences(layer, width, rows, torch.Generator().manual_seed(seed), wild))


def invariant_piece(kind: str, width: int) -> int | None:
    """The widest slice of the input dimension (``width`` itself, else for bf16 a divisor that is a multiple of 32)
    over which this build's ``kind`` kernel ("bf16" matmul, "int4", "int8") reduces every row the same way whatever
    the number of rows; None if no slice does ("w8a8" sums integers, so it passes wherever the kernel's sums are
    exact). Checked once per (kind, width) on random data: a bf16 matmul on
    a CPU, for one, changes its reduction order with the row count above some input widths."""
    key = (kind, width)
    if key not in _invariant_pieces:
        g = torch.Generator().manual_seed(0)
        _invariant_pieces[key] = None
        pieces = [width] if kind != "bf16" else sorted((p for p in range(32, width + 1, 32) if width % p == 0),
                                                       reverse=True)
        for piece in pieces:
            w = nn.Linear(piece, 64, bias=False)
            nn.init.normal_(w.weight, generator=g)
            layer = _layer(kind, w, piece)
            if _rows_agree(layer, piece, g):
                _invariant_pieces[key] = piece
                break
    return _invariant_pieces[key]


class Bf16Linear(quant.Bf16Linear):
    """:class:`minigpt.quant.Bf16Linear` with a bias, its products taken over each ``piece`` of the input
    dimension (default: all of it) in bf16 and summed in fp32 in a fixed order. ``rows``: the input rows go through
    the matmul in tiles of exactly that many, the last tile filled up with zero rows, so that every call runs the
    matmul at one shape whatever its row count: a bf16 matmul may pick its kernel, and with it the order of its
    sums, by the row count (on CPUs with AMX tiles a 1-row call and a 33-row call differ), and at one shape there
    is one kernel. A row's result then cannot depend on how many rows share the call. Calls of more than
    ``max_rows`` rows (a long prompt's prefill) run at their own shape, as the attention does."""

    def __init__(self, linear: nn.Linear, piece: int | None = None, rows: int | None = None, max_rows: int = 64):
        super().__init__(linear.weight)
        self.bias = None if linear.bias is None else linear.bias.detach().float()
        self.piece = piece or self.weight.shape[1]
        self.rows, self.max_rows = rows, max_rows

    def _product(self, xb: torch.Tensor) -> torch.Tensor:
        K = xb.shape[1]
        return sum(F.linear(xb[:, a:a + self.piece], self.weight[:, a:a + self.piece]).float()
                   for a in range(0, K, self.piece))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        K = self.weight.shape[1]
        xb = x.reshape(-1, K).to(torch.bfloat16)
        n = xb.shape[0]
        if self.rows is None or n > self.max_rows:
            y = self._product(xb)
        else:
            if n % self.rows:
                xb = torch.cat([xb, xb.new_zeros(self.rows - n % self.rows, K)])
            y = torch.cat([self._product(tile) for tile in xb.split(self.rows)])[:n]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], -1).to(x.dtype)


class _Bias:
    """The bias of the linear layer a weight-only kernel replaced, added in fp32 after the kernel."""

    def _keep_bias(self, linear: nn.Linear) -> None:
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y if self.bias is None else (y.float() + self.bias).to(x.dtype)


class Int8Linear(_Bias, quant.Int8Linear):
    """:class:`minigpt.quant.Int8Linear` (torch's weight-only int8 CPU kernel, one scale per output row, bf16
    input) with a bias: the output layer of the "int4" path."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear.weight.detach().float().cpu())
        self._keep_bias(linear)


class Int4Linear(_Bias, quant.Int4Linear):
    """:class:`minigpt.quant.Int4Linear` (torch's weight-only int4 CPU kernel on groups of 32) with a bias."""

    def __init__(self, linear: nn.Linear, group: int = 32):
        super().__init__(linear.weight.detach().float().cpu(), group)
        self._keep_bias(linear)


class W4A8Linear(_Bias, quant.W4A8Linear):
    """:class:`minigpt.quant.W4A8Linear` (4-bit weights in Q4_1 groups, 8-bit activation groups, the compiled
    row-invariant kernel) with a bias."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear.weight)
        self._keep_bias(linear)


class Q8A8Linear(_Bias, quant.Q8A8Linear):
    """:class:`minigpt.quant.Q8A8Linear` (8-bit weights in Q8_0 groups, 8-bit activation groups, the compiled
    row-invariant kernel) with a bias."""

    def __init__(self, linear: nn.Linear):
        super().__init__(linear.weight)
        self._keep_bias(linear)


class W8A8Linear(_Bias, quant.W8A8Linear):
    """:class:`minigpt.quant.W8A8Linear` (8-bit weights and activations, integer products and sums) with a bias;
    ``packed``: passes of several rows through oneDNN's integer linear where the build has it (the same sums)."""

    def __init__(self, linear: nn.Linear, smooth: torch.Tensor | None = None, packed: bool = False):
        super().__init__(linear.weight.detach().float().cpu(), smooth, packed)
        self._keep_bias(linear)


@torch.no_grad()
def input_maxima(model: GPT, sequences) -> dict[str, torch.Tensor]:
    """For each linear layer of ``model`` (by its name in ``named_modules``): the largest |input| seen in each
    input channel over ``sequences`` (lists of token ids, one forward pass each, without a cache)."""
    maxima, hooks = {}, []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            def record(mod, inputs, output, name=name):
                m = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(0).float().cpu()
                maxima[name] = m if name not in maxima else torch.maximum(maxima[name], m)
            hooks.append(module.register_forward_hook(record))
    try:
        for seq in sequences:
            model(torch.tensor([list(seq)[-model.config.block_size:]], device=model.device))
    finally:
        for h in hooks:
            h.remove()
    return maxima


def _layer(kind: str, linear: nn.Linear, piece: int | None, smooth: torch.Tensor | None = None) -> nn.Module:
    """``linear`` through the ``kind`` kernel ("bf16" summed in slices of ``piece`` inputs, "int4", "int8",
    "w8a8" with the smoothing factors ``smooth``, if any, "w4a8", "q8a8")."""
    if kind == "bf16":
        # wider calls (prefills) run at their own shape, as the attention does
        return Bf16Linear(linear, piece, rows=TILE_ROWS, max_rows=InvariantAttention.max_rows)
    if kind == "w8a8":
        return W8A8Linear(linear, smooth, packed=True)
    if kind == "w4a8":
        return W4A8Linear(linear)
    if kind == "q8a8":
        return Q8A8Linear(linear)
    return Int4Linear(linear) if kind == "int4" else Int8Linear(linear)


_grouped_checks: dict[tuple, bool] = {}


def grouped_rows_agree(batch: int, g: int, hs: int, L: int, dtype: torch.dtype = torch.float32) -> bool:
    """Whether this build's batched product gives a query row's ``g`` heads the same bits when the rows of several
    queries share one product (``k * g`` rows against the same ``L`` keys of ``hs`` numbers, ``batch`` products at
    once) as when each query's ``g`` rows go alone, for both of attention's products (scores, then the weighted
    sum of values), at k in CHECK_ROWS, with this thread count. Checked once per shape on random data; where it
    holds, a wide pass shares each key head's keys between its rows instead of copying them per row."""
    key = (batch, g, hs, L, dtype, torch.get_num_threads())
    if key not in _grouped_checks:
        gen = torch.Generator().manual_seed(0)
        keys = torch.randn(batch, L, hs, generator=gen).to(dtype).transpose(1, 2)   # as the scores read K
        values = torch.randn(batch, L, hs, generator=gen).to(dtype)
        ok = True
        with torch.no_grad():
            for k in CHECK_ROWS:
                for right, width in ((keys, hs), (values, L)):
                    rows = torch.randn(batch, k * g, width, generator=gen).to(dtype)
                    together = torch.bmm(rows, right)
                    alone = torch.cat([torch.bmm(rows[:, i * g:(i + 1) * g], right) for i in range(k)], 1)
                    ok = ok and torch.equal(together, alone)
        _grouped_checks[key] = ok
    return _grouped_checks[key]


_last_keys: list = [None, None]  # (mask, start) of the last pass and its key lists: every layer asks the same


def _key_lists(mask: torch.Tensor | None, start: int) -> list[list[int]]:
    """For each new token of a pass, the cache indices of the keys it may see (its own included), in order."""
    if mask is None:                       # one new token after the cache: it sees everything
        return [list(range(start + 1))]
    if _last_keys[0] is not None and _last_keys[0][0] is mask and _last_keys[0][1] == start:
        return _last_keys[1]
    keys = [row.nonzero().flatten().tolist() for row in mask.cpu()]
    _last_keys[:] = [(mask, start), keys]
    return keys


_last_compiled: list = [None, None]  # the same for the compiled road: (mask, start, T) and its (n, ofs, idx)


def _compiled_keys(mask: torch.Tensor | None, start: int, T: int):
    """The keys of each new token as the compiled attention takes them: ``n`` (T,) int32, how many; ``ofs`` (T,)
    int32, -1 where they are the cache's slots 0 .. n - 1, else where the row's slots begin in ``idx``."""
    if _last_compiled[0] is not None and _last_compiled[0][0] is mask and _last_compiled[0][1:] == (start, T):
        return _last_compiled[1]
    rows = [list(range(start + t + 1)) for t in range(T)] if mask is None else _key_lists(mask, start)
    n, ofs, idx = [], [], []
    for keys in rows:
        n.append(len(keys))
        if keys[-1] == len(keys) - 1:                              # sorted, distinct, ending at n - 1: 0 .. n - 1
            ofs.append(-1)
        else:
            ofs.append(len(idx))
            idx.extend(keys)
    as32 = lambda xs: torch.tensor(xs or [0], dtype=torch.int32)  # noqa: E731
    _last_compiled[:] = [(mask, start, T), (as32(n), as32(ofs), as32(idx))]
    return _last_compiled[1]


class InvariantAttention(CausalSelfAttention):
    """Attention whose result for a query depends only on that query and its keys, never on the pass's shape
    (see the module docstring). ``bucket``: the key axis of a query at position p has ceil((p + 1) / bucket) *
    bucket slots; ``max_rows``: wider passes (prefills) use the ordinary attention. ``compiled`` (set on the w4a8
    path): every pass up to ``max_rows`` tokens goes through ``attend_rows`` of :mod:`minigpt.kernels` instead,
    one query row at a time in C, its sums in an order of that row's own, one call per layer."""
    bucket: int = 128
    max_rows: int = 64
    compiled: bool = False

    def forward(self, x, mask=None, cache=None, layer=0, rope=None):
        if not isinstance(cache, KVCache) or x.shape[1] > self.max_rows:
            return super().forward(x, mask, cache, layer, rope)
        B, T, C = x.shape
        q, k, v = self.qkv(x, rope)
        start = cache.length
        cache.update(layer, k, v)
        K, V = cache.k[layer], cache.v[layer]                      # (B, n_kv, max_len, hs): the whole buffer
        if self.compiled and K.dtype == torch.float32 and K.device.type == "cpu":
            return self.c_proj(self._attend_compiled(q, K, V, mask, start, cache.max_len))
        g, hs = self.n_head // self.n_kv_head, self.head_size
        if mask is None and T == 1:                                # one new token: it sees keys 0 .. start
            y = self._attend_all(q.reshape(B * self.n_kv_head, g, hs), K, V, start + 1, cache.max_len)
            return self.c_proj(y.reshape(B, 1, C))
        keys = _key_lists(mask, start)                             # per row: its keys' cache indices, in order
        y = torch.empty(B, self.n_head, T, hs, dtype=q.dtype, device=x.device)
        qb = q.view(B, self.n_kv_head, g, T, hs)
        groups: dict[int, list[int]] = {}                          # contiguous rows, by key-axis length
        for r, idx in enumerate(keys):
            n = len(idx)
            if idx[-1] == n - 1:                                   # keys 0 .. n-1: the cache's own layout
                groups.setdefault(self._slots(n, cache.max_len), []).append(r)
            else:                                                  # a tree node: gather its keys in order
                L = self._slots(n, cache.max_len)
                sel = torch.zeros(L, dtype=torch.long, device=x.device)
                sel[:n] = torch.as_tensor(idx, device=x.device)
                y[:, :, r] = self._attend(qb[:, :, :, [r]], K.index_select(2, sel), V.index_select(2, sel),
                                          torch.tensor([n], device=x.device)).reshape(B, self.n_head, hs)
        for L, rows in groups.items():
            lengths = torch.tensor([len(keys[r]) for r in rows], device=x.device)
            out = self._attend(qb[:, :, :, rows], K[:, :, :L], V[:, :, :L], lengths)   # (B, n_kv, g, m, hs)
            y[:, :, rows] = out.reshape(B, self.n_head, len(rows), hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def _attend_compiled(self, q, K, V, mask, start: int, max_len: int) -> torch.Tensor:
        """Every query row of ``q`` (B, n_head, T, hs) against its keys, by the compiled kernel: (B, T, C)."""
        B, H, T, hs = q.shape
        n, ofs, idx = _compiled_keys(mask, start, T)
        q = q.contiguous()
        out = torch.empty(B, T, H, hs)
        err = kernels.library().attend_rows(B, T, H, self.n_kv_head, hs, max_len, q.data_ptr(), K.data_ptr(),
                                            V.data_ptr(), n.data_ptr(), ofs.data_ptr(), idx.data_ptr(),
                                            1.0 / math.sqrt(hs), out.data_ptr(), torch.get_num_threads())
        if err:
            raise ValueError(f"the compiled attention refused heads of {hs} numbers or a row of {int(n.max())} keys")
        return out.view(B, T, H * hs)

    def _slots(self, n: int, max_len: int) -> int:
        return min(math.ceil(n / self.bucket) * self.bucket, max_len)

    def _attend_all(self, rows, K, V, n: int, max_len: int):
        """:meth:`_attend` for one query row per (sequence, key head), ``rows`` (B n_kv, g, hs), that sees the
        cache's first ``n`` keys: the same two products over the same slots, without the bookkeeping of several
        rows. Returns (B n_kv, g, hs)."""
        B, H, _, hs = K.shape
        L = self._slots(n, max_len)
        unseen = torch.arange(L, device=rows.device) >= n                       # (L,)
        return _two_products(rows, K[:, :, :L].reshape(B * H, L, hs), V[:, :, :L].reshape(B * H, L, hs), unseen)

    def _attend(self, q, K, V, lengths):
        """q (B, n_kv, g, m, hs) against the first slots of K, V (B, n_kv, L, hs); row i sees its first
        ``lengths[i]`` slots. Each query row's arithmetic must not depend on how many rows the pass has. Where
        this build's batched product is checked to give a row the same bits beside other rows
        (:func:`grouped_rows_agree`), the m rows of a key head share one product against its keys; otherwise
        each row has products of its own, shaped as a one-token step's. Returns (B, n_kv, g, m, hs)."""
        B, H, g, m, hs = q.shape
        L = K.shape[2]
        unseen = torch.arange(L, device=q.device)[None, :] >= lengths[:, None]  # (m, L)
        if m > 1 and grouped_rows_agree(B * H, g, hs, L, q.dtype):
            rows = q.permute(0, 1, 3, 2, 4).reshape(B * H, m * g, hs)         # (B n_kv, m g, hs): row by row
            out = _two_products(rows, K.reshape(B * H, L, hs), V.reshape(B * H, L, hs),
                                unseen.repeat_interleave(g, 0))                # (B n_kv, m g, hs)
        else:   # one product per row, each of the one-token step's own shape (a batched product may pick its
            # kernel by the batch count, so rows made batch elements of one product could differ from steps)
            Kf, Vf = K.reshape(B * H, L, hs), V.reshape(B * H, L, hs)
            out = torch.stack([_two_products(q[:, :, :, i].reshape(B * H, g, hs), Kf, Vf, unseen[i])
                               for i in range(m)], 1)                           # (B n_kv, m, g, hs)
        return out.reshape(B, H, m, g, hs).permute(0, 1, 3, 2, 4)


def _two_products(rows: torch.Tensor, K: torch.Tensor, V: torch.Tensor, unseen: torch.Tensor) -> torch.Tensor:
    """Attention's arithmetic, the same on every road of :class:`InvariantAttention`: ``rows`` (N, R, hs) against
    K, V (N, L, hs), softmax(rows K^T / sqrt(hs)) V, with the slots where ``unseen`` (broadcast to (N, R, L)) is
    True at exactly zero weight. Returns (N, R, hs)."""
    scores = torch.bmm(rows, K.transpose(1, 2)) / math.sqrt(rows.shape[-1])
    scores = scores.masked_fill(unseen, float("-inf"))
    return torch.bmm(torch.softmax(scores, dim=-1), V)


def reduce_precision(model: GPT, precision: str, invariant: bool = True, calibration=None,
                     alpha: float = 0.5) -> GPT:
    """A copy of ``model`` with its linear layers (and the output layer) in ``precision`` ("bf16", "int4", "w8a8" or
    "w4a8"; "fp32" returns the model itself) and, with ``invariant``, every attention layer an
    :class:`InvariantAttention`. "int4" puts the blocks' layers at 4 bits and the output layer at 8 bits, one scale
    per row (:class:`Int8Linear`), as llama.cpp's files keep it: SmolLM2's file stores it at 8 bits, and rounded to
    4 its greedy text parted from fp32's within 5 tokens on 6 of 11 held-out requests (perplexity 19.07 against
    fp32's 18.13; ``python -m minigpt.quality``). The embeddings, norms and KV cache stay in the model's dtype. CPU
    only: the int4 and int8 kernels are PyTorch's CPU kernels, and "w4a8"'s are C code compiled here
    (:mod:`minigpt.kernels`; :class:`~minigpt.kernels.KernelUnavailable`, one sentence, without a compiler). A bf16
    layer runs its rows in tiles of ``TILE_ROWS`` (the last filled up with zero rows) and sums its input dimension
    in the widest pieces this build then reduces row-invariantly (:func:`invariant_piece`). For "w8a8",
    ``calibration`` (token id lists: text like what the model will read, never the text it is judged on) turns on
    SmoothQuant's smoothing with ``alpha`` (:func:`minigpt.quant.smoothing_factors`): on SmolLM2's development
    requests it took the greedy text's share before its first parting from fp32's (64 tokens, 13 requests) from 0.40
    without smoothing to 0.58 at alpha 0.5 and 0.63 at 0.8, and down to 0.39 at 0.9 and 0.25 at 1.0.
    ``model.precision``, ``model.batch_invariant`` and ``model.smoothing`` record what was built
    (batch_invariant is False when a kernel of this build failed the check)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        model.precision, model.batch_invariant = "fp32", False
        return model
    if precision in ("w8a8", "w4a8") and not hasattr(torch, "_int_mm"):
        raise ValueError(f"the {precision} path needs torch._int_mm, which torch {torch.__version__} does not have")
    if precision == "w4a8":
        kernels.library()     # KernelUnavailable, one sentence, where the compiled kernel cannot be built here
    if model.device.type != "cpu":
        raise ValueError(f"the {precision} path uses PyTorch's CPU kernels: move the model to the CPU first")
    out = copy.deepcopy(model).float().eval()
    maxima = input_maxima(out, calibration) if precision == "w8a8" and calibration else {}
    invariant_kernels = True
    for prefix, module in list(out.named_modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                width = child.weight.shape[1]
                kind = precision                                                   # w8a8: all layers
                if child is out.lm_head and precision in ("int4", "w4a8"):   # the output layer at 8 bits
                    kind = "int8" if precision == "int4" else "q8a8"
                piece = invariant_piece(kind, width) if invariant else None
                invariant_kernels &= piece is not None
                full = f"{prefix}.{name}" if prefix else name
                smooth = quant.smoothing_factors(child.weight, maxima[full], alpha) if full in maxima else None
                setattr(module, name, _layer(kind, child, piece, smooth))
            elif invariant and type(child) is CausalSelfAttention:
                child.__class__ = InvariantAttention
                child.compiled = precision == "w4a8"      # its attention in C too (minigpt.kernels)
    for p in out.parameters():
        p.requires_grad_(False)
    out.precision = precision
    out.batch_invariant = invariant and invariant_kernels
    out.kernels = None
    if precision == "w4a8":
        out.kernels = kernels.describe()                   # the compiled kernels' road on this CPU, for the records
    out.smoothing = dict(alpha=alpha, sequences=len(calibration)) if maxima else None
    return out


@torch.no_grad()
def batch_consistency(model: GPT, prefix: list[int], tokens: list[int]) -> dict:
    """Score ``tokens`` after ``prefix`` in one pass and again one token per pass (same prefill): the largest
    absolute difference of the logits, whether they are bitwise equal, and how many argmaxes differ."""
    dev = model.device
    runs = []
    for chunks in ([tokens], [[t] for t in tokens]):
        cache = KVCache.for_model(model, max_len=len(prefix) + len(tokens) + 1)
        model(torch.tensor([prefix], device=dev), cache=cache)
        runs.append(torch.cat([model(torch.tensor([c], device=dev), cache=cache)[0] for c in chunks]))
    one, steps = runs
    return dict(max_diff=float((one.float() - steps.float()).abs().max()), bitwise=bool(torch.equal(one, steps)),
                argmax_differs=int((one.argmax(-1) != steps.argmax(-1)).sum()))
