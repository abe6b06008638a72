"""Reduced precision (minigpt.precision): a pass over k tokens gives bitwise the logits of k one-token passes on the
batch-invariant path, so speculative greedy output equals the same precision's plain output; and the ordinary
reduced-precision path does not have that property (SmolLM2, when its file is here)."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from conftest import random_model
from minigpt.cache import KVCache
from minigpt.decoding.candidates import Proposal
from minigpt.decoding.chain import Chain
from minigpt.decoding.lookup import Lookup, LookupTree
from minigpt.decoding.plain import generate
from minigpt.decoding.session import decode
from minigpt.kernels import available as kernels_available
from minigpt.precision import (InvariantAttention, batch_consistency, int4_groups, invariant_piece,
                               reduce_precision)

# the w4a8 path runs on compiled kernels (minigpt.kernels): built here with the machine's C compiler
W4A8 = pytest.param("w4a8", marks=pytest.mark.skipif(not kernels_available(), reason="no C compiler for the kernels"))

# widths that the int4 kernel's groups of 32 divide; both architectures
ARCH = {"gpt2": dict(n_embd=64, n_head=4), "llama": dict(n_embd=64, n_head=4, norm="rmsnorm", pos="rope",
                                                        mlp="swiglu", mlp_hidden=192, n_kv_head=2, bias=False)}


def _model(arch: str, seed: int = 0):
    return random_model(seed, vocab_size=96, block_size=160, **ARCH[arch])


def test_int4_groups_recover_q4_blocks_exactly():
    """Weights that are q * step + minimum per group of 32 (as Q4_1 dequantises) give back the same integers."""
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (8, 64), generator=g)
    q[:, ::32] = 0
    q[:, 1::32] = 15                       # every block holds its minimum and maximum, as Q4_1's do
    step = torch.rand(8, 2, generator=g) + 0.1
    lo = torch.randn(8, 2, generator=g)
    w = (q.reshape(8, 2, 32) * step[..., None] + lo[..., None]).reshape(8, 64)
    q2, step2, lo2 = int4_groups(w)
    assert torch.equal(q2, q.to(torch.int32))
    assert torch.allclose(step2, step) and torch.allclose(lo2, lo)


@pytest.mark.parametrize("precision", ["bf16", "int4", "w8a8", W4A8])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_k_tokens_in_one_pass_are_bitwise_k_single_steps(arch, precision):
    """For every k a decoder uses (1 .. 32), after caches of several lengths."""
    model = reduce_precision(_model(arch), precision)
    assert model.batch_invariant and model.precision == precision
    g = torch.Generator().manual_seed(1)
    for prefix_len in (1, 7, 100):
        prefix = torch.randint(0, 96, (prefix_len,), generator=g).tolist()
        for k in (1, 2, 3, 5, 8, 16, 17, 32):
            tokens = torch.randint(0, 96, (k,), generator=g).tolist()
            r = batch_consistency(model, prefix, tokens)
            assert r["bitwise"], (arch, precision, prefix_len, k, r)


@pytest.mark.parametrize("precision", ["bf16", "int4", "w8a8", W4A8])
def test_a_tree_pass_is_bitwise_single_steps_along_each_path(precision):
    """A token tree (siblings share a position) scored in one pass: each node's logits equal those of plain
    one-token steps along the path from the root to it."""
    model = reduce_precision(_model("llama"), precision)
    prefix = list(range(3, 40))
    tokens, parents = [7, 11, 12, 13, 14, 15], [-1, 0, 0, 1, 3, 2]   # root 7; paths 7-11-13-14 and 7-12-15
    prop = Proposal(tokens, parents)
    with torch.no_grad():
        cache = KVCache.for_model(model, max_len=80)
        model(torch.tensor([prefix]), cache=cache)
        tree = model(torch.tensor([tokens]), cache=cache, position_ids=prop.position_ids(cache.length),
                     attn_mask=prop.attention_mask())[0]
        for leaf in (4, 5):
            path = [leaf]
            while parents[path[-1]] > 0:
                path.append(parents[path[-1]])
            path = [0] + path[::-1]
            cache = KVCache.for_model(model, max_len=80)
            model(torch.tensor([prefix]), cache=cache)
            for node in path:
                step = model(torch.tensor([[tokens[node]]]), cache=cache)[0, -1]
                assert torch.equal(step, tree[node]), (precision, node)


@pytest.mark.parametrize("precision", ["bf16", "int4", "w8a8", W4A8])
def test_speculative_greedy_output_is_the_same_precisions_plain_output(precision):
    target = reduce_precision(_model("llama", 3), precision)
    draft = reduce_precision(_model("llama", 4), precision)
    g = torch.Generator().manual_seed(2)
    for _ in range(4):
        prompt = torch.randint(0, 96, (int(torch.randint(3, 30, (1,), generator=g)),), generator=g).tolist()
        prompt = prompt + prompt[:8]
        plain = generate(target, prompt, 48)
        for proposer in (Lookup(2, 16), LookupTree(2, 8), Chain(draft, 5)):
            assert decode(target, prompt, 48, proposer)[0] == plain, type(proposer).__name__


def test_w8a8_sums_integers_exactly_and_stays_close_to_the_float_layer():
    """The integer matmul's int32 sums equal the exact sums (float64 holds them exactly), even at the extremes
    (every product 127 * 127); and the layer approximates the fp32 one to within what 8-bit rounding allows."""
    from minigpt.quant import W8A8Linear, int8_activations
    g = torch.Generator().manual_seed(0)
    for K in (64, 576, 1536):
        w = torch.randn(48, K, generator=g)
        layer = W8A8Linear(w)
        for rows in (1, 3, 17, 33):
            x = torch.randn(rows, K, generator=g)
            xq, s = int8_activations(x)
            assert xq.abs().max() == 127 and torch.allclose(xq.float() * s, x, atol=float(s.max()) / 2 + 1e-6)
            exact = xq.double() @ layer.q_t.double()
            assert torch.equal(torch._int_mm(xq, layer.q_t).double(), exact)
            extreme = torch.full((rows, K), 127, dtype=torch.int8)
            assert torch.equal(torch._int_mm(extreme, torch.full((K, 48), 127, dtype=torch.int8)).double(),
                               torch.full((rows, 48), 127.0 * 127 * K, dtype=torch.float64))
            ref = x @ w.T
            assert float((layer(x) - ref).abs().max()) < 0.02 * float(ref.abs().max())


def test_w8a8_packed_road_gives_the_int_mm_sums_bit_for_bit(monkeypatch):
    """Where oneDNN's packed integer linear is here, a layer built with ``packed`` sends passes of several rows
    through it and one row through torch._int_mm: both must give exactly the unpacked layer's output, at every row
    count, extremes included; and the availability check must fail on a product that is off by one."""
    import minigpt.quant as quant
    if not quant.packed_int8_available():
        pytest.skip("this build has no oneDNN integer linear: every w8a8 pass takes torch._int_mm")
    g = torch.Generator().manual_seed(4)
    for K in (64, 576, 1536):
        w = torch.randn(40, K, generator=g)
        smooth = torch.rand(K, generator=g) + 0.5
        plain, packed = quant.W8A8Linear(w, smooth), quant.W8A8Linear(w, smooth, packed=True)
        assert plain.packed is None and packed.packed is not None
        for rows in (1, 2, 3, 8, 17, 33):
            x = torch.randn(rows, K, generator=g) * torch.exp2(torch.randint(-6, 7, (rows, K), generator=g).float())
            assert torch.equal(packed(x), plain(x)), (K, rows)
        extreme = torch.full((5, K), -1e4)
        assert torch.equal(packed(extreme), plain(extreme))
        twin = copy.deepcopy(packed)                  # oneDNN's packed tensor cannot be copied: packed anew
        assert twin.packed is not None and torch.equal(twin(x), packed(x))
    real = quant._packed_product
    monkeypatch.setattr(quant, "_packed_product", lambda xq, packed: real(xq, packed) + 1)
    monkeypatch.setattr(quant, "_packed_int8", [])
    assert not quant.packed_int8_available()


def test_w8a8_smoothing_keeps_the_product_and_the_invariance():
    """Smoothing divides each input channel by a factor and multiplies the weights' column by it: the layer still
    approximates the float one, and a model smoothed on calibration text stays bitwise batch-invariant."""
    from minigpt.precision import input_maxima
    from minigpt.quant import W8A8Linear, smoothing_factors
    g = torch.Generator().manual_seed(3)
    w = torch.randn(40, 64, generator=g)
    x = torch.randn(9, 64, generator=g)
    x[:, 5] *= 50                                     # an outlier channel
    plain, smooth = W8A8Linear(w), W8A8Linear(w, smoothing_factors(w, x.abs().amax(0)))
    ref = x @ w.T
    err = lambda layer: float((layer(x) - ref).abs().max())
    assert err(smooth) < err(plain) and err(smooth) < 0.05 * float(ref.abs().max())
    model = _model("llama", 5)
    calibration = [torch.randint(0, 96, (30,), generator=g).tolist() for _ in range(3)]
    maxima = input_maxima(model, calibration)
    assert set(maxima) == {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    smoothed = reduce_precision(model, "w8a8", calibration=calibration)
    assert smoothed.smoothing == dict(alpha=0.5, sequences=3) and smoothed.batch_invariant
    assert reduce_precision(model, "w8a8").smoothing is None
    assert not torch.equal(smoothed(torch.tensor([calibration[0]])), reduce_precision(model, "w8a8")(
        torch.tensor([calibration[0]])))
    for k in (1, 5, 17, 32):
        assert batch_consistency(smoothed, calibration[1], torch.randint(0, 96, (k,), generator=g).tolist())["bitwise"]


def test_the_piece_check_finds_a_row_invariant_width():
    for width in (64, 576, 1536):
        piece = invariant_piece("bf16", width)
        assert piece is not None and width % piece == 0


def test_bad_precision_is_one_line():
    with pytest.raises(ValueError, match="precision must be one of"):
        reduce_precision(_model("gpt2"), "int3")


def test_fp32_is_the_model_itself_and_not_called_invariant():
    model = _model("gpt2")
    assert reduce_precision(model, "fp32") is model and model.batch_invariant is False


def test_the_attention_swap_leaves_the_original_model_alone():
    model = _model("gpt2")
    reduce_precision(model, "int4")
    assert not any(isinstance(m, InvariantAttention) for m in model.modules())


@pytest.mark.slow
def test_the_ordinary_int4_path_is_not_batch_invariant_on_smollm2():
    """The reason for the invariant path: on SmolLM2, 17 tokens in one pass through the ordinary int4 model
    (fp32 attention whose reduction follows the key count) give other logits than 17 single steps, and the
    invariant path gives the same bits."""
    smollm = pytest.importorskip("minigpt.real.smollm")
    if not smollm.gguf_available():
        pytest.skip("SmolLM2's file is not here: python -m minigpt.real.smollm fetch")
    base = smollm.load_smollm("cpu")
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 49152, (200,), generator=g).tolist()
    tokens = torch.randint(0, 49152, (17,), generator=g).tolist()
    assert not batch_consistency(reduce_precision(base, "int4", invariant=False), prefix, tokens)["bitwise"]
    assert batch_consistency(reduce_precision(base, "int4"), prefix, tokens)["bitwise"]


@pytest.mark.slow
@pytest.mark.skipif(not kernels_available(), reason="no C compiler for the kernels")
def test_the_w4a8_path_is_bitwise_invariant_on_smollm2_for_every_width():
    """On SmolLM2's real weights, after a cache of 300 tokens: a pass over k tokens gives bitwise the logits of k
    one-token passes for k = 1 .. 32 on the w4a8 path (its compiled layers and attention)."""
    smollm = pytest.importorskip("minigpt.real.smollm")
    if not smollm.gguf_available():
        pytest.skip("SmolLM2's file is not here: python -m minigpt.real.smollm fetch")
    model = reduce_precision(smollm.load_smollm("cpu"), "w4a8")
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 49152, (300,), generator=g).tolist()
    tokens = torch.randint(0, 49152, (32,), generator=g).tolist()
    for k in range(1, 33):
        r = batch_consistency(model, prefix, tokens[:k])
        assert r["bitwise"], (k, r)


def test_quality_measures_agreement_and_perplexity():
    from minigpt.quality import greedy_agreement, perplexity
    ref = _model("gpt2")
    same = greedy_agreement(ref, ref, [[1, 2, 3], [4, 5]], 12)
    assert same["identical"] == 2 and same["share_before_parting"] == 1.0
    other = greedy_agreement(ref, _model("gpt2", seed=9), [[1, 2, 3], [4, 5]], 12)
    assert other["identical"] < 2 and other["share_before_parting"] < 1.0
    tokens = generate(ref, [1, 2, 3], 60)   # the model's own greedy text is likely under itself
    assert perplexity(ref, tokens, window=30) < perplexity(_model("gpt2", seed=9), tokens, window=30)
    with pytest.raises(ValueError, match="two tokens"):
        perplexity(ref, [1])


def test_loaders_take_a_precision():
    import minigpt
    model = minigpt.load_pretrained("draft", "cpu", precision="bf16")
    assert model.precision == "bf16" and model.batch_invariant


def test_bench_records_say_which_precision_ran():
    from minigpt.bench import run_bench
    from minigpt.decoding import Models
    target = reduce_precision(_model("gpt2"), "int4")
    records = run_bench(["plain", "prompt_lookup"], models=Models(target), prompts=[[1, 2, 3, 1, 2, 3]],
                        max_new_tokens=12, repeats=1)
    assert all(r["precision"] == "int4" and r["batch_invariant"] and r["identical_to_plain_greedy"] for r in records)


def test_the_quality_command_writes_a_record(tmp_path, capsys):
    from minigpt.quality import main
    out = tmp_path / "q.json"
    assert main(["--prompts", "2", "--new", "6", "--text-tokens", "300", "--precision", "bf16", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert set(record["results"]) == {"fp32", "bf16"} and record["results"]["bf16"]["prompts"] == 2
    assert record["text_tokens"] == 300 and record["results"]["bf16"]["batch_invariant"]
    assert "greedy text identical to fp32" in capsys.readouterr().out
    assert main(["--precision", "fp8"]) == 2
    assert "error: precisions come from" in capsys.readouterr().err


def test_int4_keeps_the_output_layer_at_8_bits():
    from minigpt.precision import Int4Linear, Int8Linear
    model = reduce_precision(_model("gpt2"), "int4")
    assert isinstance(model.lm_head, Int8Linear) and model.batch_invariant
    assert all(isinstance(m, Int4Linear) for m in model.transformer.modules() if type(m).__name__.endswith("Linear"))
    assert invariant_piece("int8", 64) == 64


@pytest.mark.parametrize("kind", ["bf16", "int8", "int4", W4A8])
def test_dense_weight_reads_back_the_weight_a_reduced_layer_multiplies_by(kind):
    """What a drafter that reads the target's output layer row by row (EAGLE's subset read-out) gets from a layer
    that keeps no fp32 matrix: the kernel's own weight (for int4, the 4-bit levels, not the original)."""
    from minigpt.precision import _layer
    from minigpt.quant import dense_weight, int4_groups, int8_rows
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48)
    layer, x = _layer(kind, lin, None), torch.randn(5, 64)
    w = dense_weight(layer)
    assert w.shape == (48, 64) and w.dtype == torch.float32
    assert torch.allclose(layer(x), x @ w.T + lin.bias, atol=0.03)
    stored = {"bf16": lambda: lin.weight.to(torch.bfloat16).float(),
              "int8": lambda: (lambda q, s: q.float() * s.to(torch.bfloat16).float()[:, None])(*int8_rows(lin.weight)),
              "int4": lambda: (lambda q, s, m: (q.reshape(48, 2, 32) * s[..., None] + m[..., None]).reshape(48, 64))(
                  *int4_groups(lin.weight.detach()))}
    stored["w4a8"] = stored["int4"]
    stored = stored[kind]()
    gap_to_stored, gap_to_fp32 = (w - stored).abs().max(), (w - lin.weight).abs().max()
    assert gap_to_stored <= 1e-3 and gap_to_stored < gap_to_fp32 / 4   # the kernel's levels, not the fp32 weight
    assert torch.equal(dense_weight(lin), lin.weight)


@pytest.mark.parametrize("precision", ["bf16", "int4", "w8a8", W4A8])
def test_every_declared_method_keeps_its_precisions_plain_output_on_the_shipped_models(precision):
    """The shipped pair and heads at reduced precision: every declared method, the heads that read the target's
    output layer (EAGLE, Medusa) included, runs and gives that precision's plain greedy output."""
    from minigpt.bench.run import bench_prompts
    from minigpt.decoding import Models
    from minigpt.decoding.registry import METHODS, available
    torch.set_num_threads(1)
    models = Models.shipped("cpu", methods=list(METHODS), precision=precision)
    assert models.target.precision == precision
    names = available(models)
    assert set(METHODS) - set(names) == {"eagle3"}   # the only head the course's pair has none of (SmolLM2's)
    for prompt in bench_prompts(2, 1):
        plain = generate(models.target, list(prompt), 16)
        for name in names:
            assert METHODS[name].run(models, list(prompt), 16)[0] == plain, (precision, name, prompt.name)


def test_eagles_subset_read_out_follows_a_reduced_precision_target():
    """With a frequency-ranked subset, EAGLE reads the target's output layer row by row; at int4 (an 8-bit output
    layer) those rows are read back through the kernel, and the subset's logits are the full read-out's there."""
    from minigpt.eagle_head import EagleHead
    target = reduce_precision(_model("llama", 5), "int4")
    subset = torch.tensor([5, 90, 3, 41])
    head, full = EagleHead(target, vocab_subset=subset).eval(), EagleHead(target).eval()
    f = torch.randn(3, target.config.n_embd)
    assert torch.allclose(head.logits(f), full.logits(f)[:, subset], atol=0.05)
    assert head.readout_weight() is head.readout_weight()


def test_rows_vs_alone_sees_a_shape_dependent_kernel():
    """0 for a layer that treats each row alone; more than 0 for one whose result depends on the rows beside it."""
    from minigpt.precision import rows_vs_alone
    lin = torch.nn.Linear(64, 8)
    assert rows_vs_alone(lambda x: torch.stack([lin(r) for r in x]), 64) == {2: 0.0, 5: 0.0, 17: 0.0}
    shifty = lambda x: lin(x) + 1e-3 * x.shape[0]        # noqa: E731 (depends on how many rows come together)
    assert all(d > 0 for d in rows_vs_alone(shifty, 64).values())


def test_the_shared_keys_road_gives_the_per_row_roads_bits(monkeypatch):
    """Where the build's batched product passes the check (grouped_rows_agree), a wide pass shares each key head's
    keys between its rows; its logits must be bitwise those of the per-row road (each row with its own copy of
    the keys), which the k-token tests tie to single steps."""
    import minigpt.precision as precision
    model = reduce_precision(_model("llama"), "int4")
    attn = next(m for m in model.modules() if isinstance(m, InvariantAttention))
    g, hs = attn.n_head // attn.n_kv_head, attn.head_size
    if not precision.grouped_rows_agree(attn.n_kv_head, g, hs, attn.bucket):
        pytest.skip("this build's batched product fails the check: every wide pass takes the per-row road")
    gen = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, 96, (40,), generator=gen).tolist()
    tokens = torch.randint(0, 96, (17,), generator=gen).tolist()

    def wide_pass():
        cache = KVCache.for_model(model, max_len=80)
        with torch.no_grad():
            model(torch.tensor([prefix]), cache=cache)
            return model(torch.tensor([tokens]), cache=cache)[0]

    shared = wide_pass()
    monkeypatch.setattr(precision, "grouped_rows_agree", lambda *args, **kw: False)
    assert torch.equal(shared, wide_pass())


def test_a_bf16_layer_runs_every_call_in_tiles_of_one_shape(monkeypatch):
    """The bf16 path's layer sends the matmul tiles of exactly TILE_ROWS rows whatever the call's row count (a
    one-token step, a pass over 1 to 3 tiles of tokens), and gives each row the bits it gives that row alone; a
    call wider than max_rows (a prefill) runs at its own shape."""
    import torch.nn.functional as F

    import minigpt.precision as precision
    lin = torch.nn.Linear(64, 24)
    layer = precision.Bf16Linear(lin, rows=precision.TILE_ROWS, max_rows=64)
    shapes = []
    real_linear = F.linear

    def spy(x, w, *args):
        shapes.append(tuple(x.shape))
        return real_linear(x, w, *args)
    monkeypatch.setattr(precision.F, "linear", spy)
    x = torch.randn(3 * precision.TILE_ROWS, 64)
    alone = torch.cat([layer(r[None]) for r in x])
    for n in (1, 2, precision.TILE_ROWS, precision.TILE_ROWS + 1, 3 * precision.TILE_ROWS):
        shapes.clear()
        together = layer(x[:n])
        assert set(shapes) == {(precision.TILE_ROWS, 64)} and len(shapes) == -(-n // precision.TILE_ROWS), (n, shapes)
        assert torch.equal(together, alone[:n]), n
    shapes.clear()
    layer(torch.randn(65, 64))
    assert shapes == [(65, 64)]
