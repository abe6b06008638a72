"""Where the time of a batched, paged decoding step goes: Lesson 12's measurements, as tested functions.

* :func:`batch_step_times` -- seconds per decoding step of B sequences for several B, in interleaved rounds with
  B = 1 timed twice per round (its A/A twin, :mod:`minigpt.verdict`), every output checked against decoding alone;
* :func:`paging_throughput` -- the same requests served in the memory of ``n`` contiguous caches: ``n`` at a time
  (all a contiguous cache allows) against a paged pool of the same bytes, throughput timed in the same rounds;
* :func:`paged_step_parts` -- a paged decoding step against a contiguous one, and each piece of work the paged
  path adds (the table's bookkeeping, positions read from a tensor, writes through slot ids, the gather,
  attention on the gathered layout) next to what the contiguous path does instead, all in the same rounds;
* :func:`request_passes` and :func:`fixed_batch_pass_ratio` -- the passes each request needs, counted, and
  plain's passes over a method's when the *same* requests are decoded in fixed batches of B;
* :func:`round_split` and :func:`race_verdicts` -- a batched race's speed-ups split into the pass ratio and the
  round cost, and the batch sizes at which each verdict fell.

The paged step's pieces are timed alone, so their sum need not equal the measured difference; whatever is left
over is reported as such, never hidden in "noise".
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from .cache import KVCache
from .decoding import generate
from .decoding.batch import BatchEngine, PerSequence, Request, decode_batch, serve
from .decoding.plain import Plain
from .decoding.session import Proposer
from .device import synchronize, time_rotating
from .model import GPT
from .paged import BlockPool, PagedBatch, PagedSequence
from .verdict import twin_of

PAGED_PARTS = ("table", "positions", "writes", "gather", "attention")  # what the paged path adds, in step order


def batch_step_times(target: GPT, prompts, batch_sizes, n_steps: int = 16, repeats: int = 5,
                     warmup: int = 1) -> dict:
    """Seconds per plain decoding step of the first B ``prompts`` decoded together, for each B in
    ``batch_sizes``: ``{B: [seconds per step, one per round]}``, plus ``twin_of(1)`` (B = 1 timed a second time
    in every round, the A/A control). Each round times every B once, the order rotating; only the steps are
    timed (the prefills are not). Raises if any output differs from its prompt decoded alone."""
    sizes = sorted(set(batch_sizes))
    if not sizes or sizes[0] != 1:
        raise ValueError(f"batch_step_times needs B = 1 among the batch sizes (the baseline), got {batch_sizes}")
    if len(prompts) < sizes[-1]:
        raise ValueError(f"{len(prompts)} prompts for a batch of {sizes[-1]}")
    solo = [generate(target, p, n_steps) for p in prompts[:sizes[-1]]]

    def step_seconds(B: int) -> float:
        engine = BatchEngine(target, PerSequence(Plain), max_batch=B)
        seqs = [engine.admit(Request(list(p), n_steps)) for p in prompts[:B]]
        synchronize(target.device)
        t0 = time.perf_counter()
        while engine.active:
            engine.step()
        synchronize(target.device)
        seconds = time.perf_counter() - t0
        engine.close()
        if [s.output for s in seqs] != solo[:B]:
            raise AssertionError(f"a batch of {B} wrote other tokens than its prompts decoded alone")
        return seconds / engine.stats.target_passes

    labels = sizes[:1] + [twin_of(1)] + sizes[1:]
    for _ in range(warmup):
        step_seconds(sizes[-1])
    out: dict = {label: [] for label in labels}
    for r in range(repeats):
        k = r % len(labels)
        for label in labels[k:] + labels[:k]:
            out[label].append(step_seconds(1 if label == twin_of(1) else label))
    return out


def paging_throughput(target: GPT, requests: list[Request], same_memory: int = 4, repeats: int = 5,
                      block_size: int = 16, proposer_factory=lambda: PerSequence(Plain)) -> tuple[dict, dict]:
    """Serve ``requests`` (all waiting from the start) two ways in the memory of ``same_memory`` contiguous
    caches: "contiguous", at most ``same_memory`` at a time (each would reserve a whole context), and "paged", as
    many as a pool of ``same_memory * context / block_size`` blocks admits. Interleaved rounds, "contiguous"
    timed twice per round (its A/A twin). Returns (seconds per round, :class:`ServeReport` of each way's first
    round); every output is checked to be the same both ways."""
    n_blocks = same_memory * target.config.block_size // block_size

    def copy() -> list[Request]:
        return [Request(list(r.prompt), r.max_new_tokens, r.seed, r.eos_id, name=r.name) for r in requests]

    fns = {"contiguous": lambda: serve(target, copy(), proposer_factory(), max_batch=same_memory,
                                       block_size=block_size),
           "paged": lambda: serve(target, copy(), proposer_factory(), max_batch=len(requests), n_blocks=n_blocks,
                                  block_size=block_size)}
    seconds, reports = time_rotating(fns, target.device, repeat=repeats, aa="contiguous")
    if reports["contiguous"].outputs != reports["paged"].outputs:
        raise AssertionError("the paged engine wrote other tokens than the same requests served four at a time")
    return seconds, reports


def paged_step_parts(target: GPT, prompt, steps: int = 20, repeats: int = 15, block_size: int = 16) -> dict:
    """One-token decoding steps of one sequence after ``prompt[:-1]``, on a contiguous and on a paged cache, and
    each piece of work the paged path does differently, timed alone, all in the same interleaved rounds
    ("contiguous" twice per round: its A/A twin). Seconds per step, one per round, under these labels:

    * ``contiguous``, ``paged``: whole steps (their logits are checked to agree);
    * ``table``: :meth:`PagedBatch.begin` (room for the token, the slot ids to write and to read, positions);
    * ``positions`` / ``positions, contiguous``: the positions checked by reading the position tensor, and the
      learned position embedding looked up by ids / taken as a slice of the table;
    * ``writes`` / ``writes, contiguous``: every layer's new key and value written through slot ids
      (``index_copy_``) / into a slice;
    * ``gather``: every layer's keys and values gathered through the table (``index_select``), a copy the
      contiguous cache does not make;
    * ``attention`` / ``attention, contiguous``: every layer's attention of one query over the gathered keys
      (a (S, heads, head_size) layout, transposed) / over a view of the contiguous cache."""
    device, cfg = target.device, target.config
    prompt = [int(t) for t in prompt]
    contig = KVCache.for_model(target)
    pool = BlockPool.for_model(target, n_blocks=cfg.block_size // block_size, block_size=block_size)
    table = PagedSequence(pool)
    with torch.no_grad():
        target(torch.tensor([prompt[:-1]], device=device), cache=contig)
        target(torch.tensor([prompt[:-1]], device=device), cache=PagedBatch([table]))
    base, x = contig.length, torch.tensor([[prompt[-1]]], device=device)
    S, L, H, hs = base + 1, cfg.n_layer, cfg.kv_heads, cfg.head_size
    PagedBatch([table]).begin(1)                       # the block for position `base` is reserved from here on
    read, write = table.slots(0, S), table.slots(base, S)
    q = torch.randn(1, H, 1, hs, device=device, dtype=pool.k.dtype)
    k_new = torch.randn(1, H, 1, hs, device=device, dtype=pool.k.dtype)
    k_gathered = pool.k[0].index_select(0, read).view(1, S, H, hs).transpose(1, 2)   # (1, H, S, hs), strided
    v_gathered = pool.v[0].index_select(0, read).view(1, S, H, hs).transpose(1, 2)
    k_view, v_view = contig.k[0, :, :, :S], contig.v[0, :, :, :S]
    wpe = target.transformer["wpe"] if "wpe" in target.transformer else None
    pos = torch.tensor([[base]], device=device)

    def repeat(body):
        def run():
            out = None
            for _ in range(steps):
                out = body()
            return out
        return run

    def contiguous_step():
        logits = target(x, cache=contig)
        contig.crop(base)
        return logits

    def paged_step():
        logits = target(x, cache=PagedBatch([table]))
        table.crop(base)
        return logits

    def positions():
        int(pos.min()), int(pos.max())
        return wpe(pos) if wpe is not None else None

    def writes(through_slots: bool):
        for layer in range(L):
            for cache in ((pool.k, pool.v) if through_slots else (contig.k, contig.v)):
                if through_slots:
                    cache[layer].index_copy_(0, write, k_new.transpose(1, 2).reshape(1, H, hs))
                else:
                    cache[layer, :, :, base:S] = k_new

    def gather():
        for layer in range(L):
            pool.k[layer].index_select(0, read)
            pool.v[layer].index_select(0, read)

    def attention(k, v):
        for _ in range(L):
            F.scaled_dot_product_attention(q, k, v)

    fns = {"contiguous": repeat(contiguous_step), "paged": repeat(paged_step),
           "table": repeat(lambda: PagedBatch([table]).begin(1)),
           "positions": repeat(positions),
           "positions, contiguous": repeat(lambda: wpe.weight[base:S] if wpe is not None else None),
           "writes": repeat(lambda: writes(True)), "writes, contiguous": repeat(lambda: writes(False)),
           "gather": repeat(gather),
           "attention": repeat(lambda: attention(k_gathered, v_gathered)),
           "attention, contiguous": repeat(lambda: attention(k_view, v_view))}
    with torch.no_grad():
        seconds, results = time_rotating(fns, device, repeat=repeats, warmup=2, aa="contiguous")
    table.free()
    if not torch.allclose(results["contiguous"], results["paged"], atol=1e-5):
        raise AssertionError("the paged step's logits differ from the contiguous step's")
    return {label: [t / steps for t in times] for label, times in seconds.items()} | {"cached": base}


def added_by_paging(parts: dict) -> dict:
    """From :func:`paged_step_parts`: the median seconds each part adds to a step (the paged way's median minus
    the contiguous way's, or the whole median where the contiguous path does nothing instead), the measured
    difference of whole steps, and what the parts leave unexplained."""
    med = {label: statistics.median(v) for label, v in parts.items() if isinstance(v, list)}
    added = {p: med[p] - med.get(f"{p}, contiguous", 0.0) for p in PAGED_PARTS}
    difference = med["paged"] - med["contiguous"]
    return dict(added=added, difference=difference, unexplained=difference - sum(added.values()))


def request_passes(target: GPT, prompts, max_new_tokens: int, proposer: Proposer) -> list[int]:
    """Target passes each prompt needs for ``max_new_tokens`` greedy tokens with ``proposer``: counted in one
    untimed batch of all of them (a sequence takes part in every pass until it is done, so its count is the
    one it would need alone)."""
    _, stats, _ = decode_batch(target, prompts, max_new_tokens, proposer)
    return [s.target_passes for s in stats]


def fixed_batch_pass_ratio(passes: list[int], plain_passes: list[int], batch_size: int) -> float:
    """Plain's passes over a method's when the requests are decoded in fixed batches of ``batch_size``, in order:
    a batch runs as many passes as its slowest sequence needs. ``batch_size`` = 1: the requests' own ratio."""
    if len(passes) != len(plain_passes) or not passes:
        raise ValueError("passes and plain_passes must count the same requests")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    groups = range(0, len(passes), batch_size)
    return (sum(max(plain_passes[g:g + batch_size]) for g in groups)
            / sum(max(passes[g:g + batch_size]) for g in groups))


def round_split(records: list[dict]) -> dict:
    """For each (method, B) of a batched race (:func:`minigpt.bench.batch.run_batch_bench`'s records):
    ``(pass ratio, round cost)``. The pass ratio is plain's passes over the method's; the round cost is the
    method's median time per pass over plain's time per pass in the same race, so speed-up = ratio / cost."""
    by = {(r["batch"], r["method"]): r for r in records}

    def per_pass(r):
        return r["tokens"] / r["tokens_per_s"] / r["batch_passes"]

    return {(r["method"], r["batch"]): (by[(r["batch"], "plain")]["batch_passes"] / r["batch_passes"],
                                        per_pass(r) / per_pass(by[(r["batch"], "plain")]))
            for r in records if r["method"] != "plain"}


def race_verdicts(records: list[dict], method: str) -> dict:
    """The batch sizes at which ``method``'s verdict against plain was "faster", "slower", anything else, and its
    median below 1; ``first_slower``: the smallest B measurably slower (None if none)."""
    rows = sorted((r for r in records if r["method"] == method), key=lambda r: r["batch"])
    faster = [r["batch"] for r in rows if r["verdict"] == "faster"]
    slower = [r["batch"] for r in rows if r["verdict"] == "slower"]
    return dict(faster=faster, slower=slower,
                undecided=[r["batch"] for r in rows if r["batch"] not in faster + slower],
                below_one=[r["batch"] for r in rows if r["speedup"] < 1], first_slower=slower[0] if slower else None)
