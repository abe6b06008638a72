"""Decoding many sequences at once on a paged KV cache, and serving a queue of requests.

A :class:`Session` decodes one sequence. A serving engine decodes many: one target pass scores every active
sequence's proposal together, so the weights are read once for the whole batch. With speculation the batch is
*ragged*: each sequence proposes its own candidates (a lookup match here, none there), accepts its own
number of them, stops at its own length, and its cache grows and rolls back by its own amount. A
:class:`~minigpt.paged.PagedSequence` per sequence makes that cheap: rolling back frees whole blocks, a
finished sequence gives all of its blocks back, and a new request can take them at once.

* :class:`Request` -- a prompt, how many tokens, a seed, an arrival time (for :func:`serve`);
* :class:`Sequence` -- one request being decoded: what a :class:`~.session.Session` is for one generation
  (its tokens, its generator and acceptance rule, its statistics, its stream, its block tables, its own copy
  of the proposer);
* :class:`BatchEngine` -- the loop: admit (prefill, sharing a registered prefix; the proposer's copy for the
  sequence, started), step (the proposer's :meth:`~.session.Proposer.propose_batch` for all active sequences --
  a draft model's passes batched where the proposer does so --, one target pass for all through
  :func:`~.verify.verify_batch`, each sequence's own rule and rollback), retire;
* :func:`decode_batch` -- B prompts decoded together; :func:`serve` -- continuous batching of requests that
  arrive over time, with time to first token, per-token latency and throughput.

Each sequence's acceptance is decided by the same rule as alone, on its own rows of the target's logits, so
greedy output is identical to decoding it alone and sampled output has the target's distribution.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from ..model import GPT
from ..paged import BlockPool, PagedBatch, PagedSequence
from ..sampling import SamplingConfig, make_generator
from .chain import Chain
from .plain import Plain
from .session import Progress, Proposer, Settings, Stream, as_prompt, check_length, check_vocabularies
from .stats import DecodeStats
from .verify import rule_for, verify_batch


@dataclass
class Request:
    """One generation to serve: ``prompt`` ids, up to ``max_new_tokens`` new ones, stopping after ``eos_id``;
    ``seed``: its own generator's (sampling); ``arrival``: seconds after :func:`serve` starts."""
    prompt: list[int]
    max_new_tokens: int
    seed: int | None = None
    eos_id: int | None = None
    arrival: float = 0.0
    name: str = ""


class Sequence(Progress):
    """A request in the batch: its tokens, generator, acceptance rule, statistics, stream and block tables.

    Proposers read it as they read a :class:`~.session.Session` (``target``, ``seq``, ``sampling``,
    ``generator``, ``n_new``, ``cache`` -- its block table --, ``draft_cache`` -- its draft's --, and for a
    proposer that ``needs_hidden``, ``new_hidden`` and ``hidden``); ``proposer`` is its own copy of the batch's
    proposer. Times are seconds on the engine's clock: ``t_admitted``, ``t_first`` (first new token),
    ``t_done``."""

    def __init__(self, request: Request, sampling: SamplingConfig, table: PagedSequence,
                 draft_table: PagedSequence | None, rule_factory=rule_for, target: GPT | None = None,
                 new_hidden: torch.Tensor | None = None):
        self.request, self.target, self.new_hidden = request, target, new_hidden
        self.seq = [int(t) for t in request.prompt]
        self.n_prompt = len(self.seq)
        self.max_new_tokens, self.eos_id = request.max_new_tokens, request.eos_id
        self.sampling = sampling
        self.generator = make_generator(request.seed)
        self.rule = rule_factory(sampling, self.generator)
        self.stats = DecodeStats(prefills=1)
        self.stream = Stream(self.stats, request.max_new_tokens, request.eos_id)
        self.table, self.draft_table = table, draft_table
        self.proposer: Proposer | None = None  # its own copy, set when the engine admits it
        self.ended = False
        self.t_admitted = self.t_first = self.t_done = None

    @property
    def cache(self) -> PagedSequence:
        return self.table

    @property
    def draft_cache(self) -> PagedSequence | None:
        return self.draft_table

    def free(self) -> None:
        for t in (self.table, self.draft_table):
            if t is not None:
                t.free()


def PerSequence(factory) -> Proposer:
    """Lesson 12's spelling of "this proposer in a batch": the engine takes any proposer now, and gives each
    sequence its own copy, so ``PerSequence(Plain)`` is ``Plain()``."""
    return factory()


BatchedChain = Chain  # Lesson 12's name: the chain batches its draft's passes in a batch itself


@dataclass
class BatchStats:
    """What a batched run did, all sequences together: target passes (each scores every active sequence),
    draft passes, the tokens of every sequence, the wall time, and the batch size of every pass."""
    target_passes: int = 0
    draft_passes: int = 0
    new_tokens: int = 0
    wall_time: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)
    blocks_left: int | None = None  # blocks still in use after the run closed (0 unless a block leaked)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time else float("nan")

    @property
    def mean_batch(self) -> float:
        return sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else float("nan")


def worst_blocks(prompt_len: int, max_new_tokens: int, max_width: int, block_size: int) -> int:
    """The KV blocks a request can need at worst: its prompt, its new tokens and one proposal past them."""
    return math.ceil((prompt_len + max_new_tokens + max_width) / block_size)


class BatchEngine:
    """Decodes the sequences it has admitted together, one round per :meth:`step`, on a paged KV cache.

    ``n_blocks`` blocks of ``block_size`` positions make the target's pool (and the draft's, if the proposer has
    a draft model). A request is admitted only when the blocks it could need at worst (prompt + new tokens +
    one proposal's width) are not promised to others, so a running sequence never runs out of blocks.
    :meth:`add_prefix` prefills a prompt prefix once (a system prompt); requests that start with it fork its
    table instead of storing it again. ``waiting``: how many requests wait for a place (:func:`serve` sets it
    each round; the proposer is told it before each round, :attr:`~.session.Proposer.waiting`)."""

    def __init__(self, target: GPT, proposer: Proposer, sampling: SamplingConfig | None = None,
                 n_blocks: int | None = None, block_size: int = 16, max_batch: int = 8, rule=None):
        self.target, self.proposer = target, proposer
        self.sampling = sampling if sampling is not None else SamplingConfig()
        self.max_batch, self.block_size = max_batch, block_size
        per_seq = math.ceil((target.config.block_size + proposer.max_width) / block_size)
        self.n_blocks = n_blocks or per_seq * max_batch
        self.pool = BlockPool.for_model(target, self.n_blocks, block_size)
        self.draft = proposer.draft
        if self.draft is not None:
            check_vocabularies(target, self.draft)
        self.draft_pool = None if self.draft is None else BlockPool.for_model(self.draft, self.n_blocks, block_size)
        self.rule_factory = rule or proposer.rule or rule_for
        self.active: list[Sequence] = []
        self.needs_hidden = proposer.needs_hidden
        # registered prefixes: (ids, target table, draft table, the target's hidden states there if needed)
        self.prefixes: list[tuple[list[int], PagedSequence, PagedSequence | None, torch.Tensor | None]] = []
        self.stats = BatchStats()
        self.waiting = 0
        self.t0 = time.perf_counter()

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    # -- memory ---------------------------------------------------------------------------------------------
    def _worst_blocks(self, request: Request) -> int:
        return worst_blocks(len(request.prompt), request.max_new_tokens, self.proposer.max_width, self.block_size)

    def blocks_promised(self) -> int:
        """Blocks the active sequences may still need at worst, plus the registered prefixes'."""
        return (sum(self._worst_blocks(s.request) for s in self.active)
                + sum(len(t.blocks) for _, t, _, _ in self.prefixes))

    def can_admit(self, request: Request) -> bool:
        return (len(self.active) < self.max_batch
                and self.blocks_promised() + self._worst_blocks(request) <= self.n_blocks)

    # -- prefill --------------------------------------------------------------------------------------------
    @torch.no_grad()
    def _prefill(self, model: GPT, table: PagedSequence, ids: list[int], layers=True) -> torch.Tensor | None:
        """Append ``ids`` to ``table``; returns what a drafting head reads there (``layers``: True, the final hidden
        states, (len(ids), C); a tuple of block numbers, those blocks' outputs side by side), or None for none."""
        if not ids:
            return None
        return model.features(torch.tensor([ids], device=model.device), layers, cache=PagedBatch([table]))[0]

    def add_prefix(self, ids) -> None:
        """Prefill ``ids`` once; later requests whose prompt starts with them (and is longer) share its blocks."""
        ids = [int(t) for t in ids]
        table = PagedSequence(self.pool)
        hidden = self._prefill(self.target, table, ids, self.needs_hidden or True)
        draft_table = None
        if self.draft is not None:
            draft_table = PagedSequence(self.draft_pool)
            self._prefill(self.draft, draft_table, ids)
        self.prefixes.append((ids, table, draft_table, hidden if self.needs_hidden else None))

    def _shared_prefix(self, prompt: list[int]):
        best = None
        for entry in self.prefixes:
            ids = entry[0]
            if len(ids) <= len(prompt) and prompt[:len(ids)] == ids and (best is None or len(ids) > len(best[0])):
                best = entry
        return best

    def admit(self, request: Request) -> Sequence:
        """Check ``request``, give it block tables (forked from the longest registered prefix it starts with),
        prefill all of its prompt but the last token, and add it to the batch."""
        ids = as_prompt(request.prompt, self.target)[0].tolist()
        check_length(self.target, len(ids), request.max_new_tokens)
        if request.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {request.max_new_tokens}")
        if not self.can_admit(request):
            raise MemoryError(f"cannot admit request {request.name or ''}: the batch is full or its blocks are "
                              f"promised ({self.blocks_promised()} of {self.n_blocks}); check can_admit() first")
        shared = self._shared_prefix(ids[:-1])  # the last prompt token stays out of the cache
        start, hidden = 0, []
        if shared is not None:
            start = len(shared[0])
            table = shared[1].fork()
            draft_table = shared[2].fork() if shared[2] is not None else None
            hidden.append(shared[3])
        else:
            table = PagedSequence(self.pool)
            draft_table = PagedSequence(self.draft_pool) if self.draft is not None else None
        hidden.append(self._prefill(self.target, table, ids[start:-1], self.needs_hidden or True))
        if draft_table is not None and not self.proposer.lazy_draft:
            self._prefill(self.draft, draft_table, ids[start:-1])
        hidden = [h for h in hidden if h is not None]
        new_hidden = torch.cat(hidden) if self.needs_hidden and hidden else None
        seq = Sequence(Request(ids, request.max_new_tokens, request.seed, request.eos_id, request.arrival,
                               request.name), self.sampling, table, draft_table, self.rule_factory, self.target,
                       new_hidden)
        seq.t_admitted = self.clock()
        seq.proposer = self.proposer.fork()
        seq.proposer.start(seq)
        self.active.append(seq)
        return seq

    # -- one round ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> list[Sequence]:
        """One round for every active sequence: propose, one target pass for all, each sequence's rule and
        rollback, stream, retire the finished ones (their blocks go back to the pool). Returns those."""
        seqs = self.active
        if not seqs:
            return []
        self.proposer.waiting = self.waiting
        proposals = self.proposer.propose_batch(seqs, [s.max_new_tokens - s.n_new - 1 for s in seqs])
        verified = verify_batch(self.target, [s.table for s in seqs], proposals, [s.rule for s in seqs],
                                return_hidden=self.needs_hidden)
        self.stats.target_passes += 1
        self.stats.batch_sizes.append(len(seqs))
        self.stats.draft_passes += max((p.draft_passes for p in proposals), default=0)
        now = self.clock()
        done = []
        for s, p, v in zip(seqs, proposals, verified):
            s.proposer.observe(p, v)
            s.record(p, v, self.proposer.speculative, s.draft_table)
            if s.t_first is None:
                s.t_first = now
            if s.finished:
                s.t_done = now
                s.stats.new_tokens = len(s.output)
                s.stats.wall_time = now - s.t_admitted
                self.stats.new_tokens += s.stats.new_tokens
                s.proposer.finish(s)
                s.free()
                done.append(s)
        self.active = [s for s in seqs if not s.finished]
        return done

    def close(self) -> None:
        """Free the registered prefixes and every active sequence; afterwards every block is back in the pool."""
        for s in self.active:
            s.free()
        self.active = []
        for _, table, draft_table, _ in self.prefixes:
            table.free()
            if draft_table is not None:
                draft_table.free()
        self.prefixes = []
        self.stats.blocks_left = self.pool.blocks_in_use + (self.draft_pool.blocks_in_use if self.draft_pool else 0)


def longest_common_prefix(prompts) -> int:
    n = min(len(p) for p in prompts)
    for i in range(n):
        if len({int(p[i]) for p in prompts}) > 1:
            return i
    return n


def decode_batch(target: GPT, prompts, max_new_tokens: int, proposer: Proposer | None = None,
                 settings: Settings | None = None, share_prefix: bool = False, block_size: int = 16,
                 **sampling) -> tuple[list[list[int]], list[DecodeStats], BatchStats]:
    """Decode ``prompts`` together (B = len(prompts)) with any proposer (default: plain decoding); returns
    (outputs, each sequence's DecodeStats, the batch's BatchStats). ``settings`` or its fields as keywords
    (``temperature``, ``top_k``, ``top_p``, ``seed``, ``eos_id``; :class:`~.session.Settings`): sequence i samples
    with seed ``seed + i``. share_prefix: the prompts' longest common prefix is prefilled once and shared (copy on
    write). Greedy: every output identical to decoding that prompt alone."""
    s = Settings.of(settings, **sampling)
    if s.stats is not None or s.on_tokens is not None:
        raise ValueError("decode_batch returns each sequence's statistics and streams nothing: no stats or on_tokens")
    seed, eos_id = s.seed, s.eos_id
    proposer = proposer or Plain()
    prompts = [as_prompt(p, target)[0].tolist() for p in prompts]
    # blocks for what these requests can need at worst (and a shared prefix), not for B whole contexts
    worst = sum(worst_blocks(len(p), max_new_tokens, proposer.max_width, block_size) for p in prompts)
    prefix = math.ceil(max(map(len, prompts)) / block_size)
    engine = BatchEngine(target, proposer, s.sampling, n_blocks=worst + prefix, max_batch=len(prompts),
                         block_size=block_size)
    if share_prefix and len(prompts) > 1:
        n = min(longest_common_prefix(prompts), min(len(p) for p in prompts) - 1)
        if n:
            engine.add_prefix(prompts[0][:n])
    seqs = [engine.admit(Request(p, max_new_tokens, None if seed is None else seed + i, eos_id))
            for i, p in enumerate(prompts)]
    while engine.active:
        engine.step()
    engine.stats.wall_time = engine.clock()
    engine.close()
    return [s.output for s in seqs], [s.stats for s in seqs], engine.stats


@dataclass
class ServeReport:
    """What :func:`serve` measured. Per request (in arrival order): arrival, admission, first token and finish
    times (seconds from the start), and its tokens; the run's throughput and the pool's peak use."""
    requests: list[dict]
    outputs: list[list[int]]
    wall_time: float
    new_tokens: int
    stats: BatchStats
    peak_blocks: int

    @property
    def throughput(self) -> float:
        """Tokens per second of the whole run, all requests together."""
        return self.new_tokens / self.wall_time if self.wall_time else float("nan")

    def ttft(self) -> list[float]:
        """Time to first token of each request: from its arrival to its first new token (queueing included)."""
        return [r["first"] - r["arrival"] for r in self.requests]

    def per_token_latency(self) -> list[float]:
        """Seconds per new token after the first, for each request with more than one."""
        return [(r["done"] - r["first"]) / (r["tokens"] - 1) for r in self.requests if r["tokens"] > 1]


def serve(target: GPT, requests: list[Request], proposer: Proposer | None = None, max_batch: int = 8,
          temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
          n_blocks: int | None = None, block_size: int = 16, prefix=None) -> ServeReport:
    """Continuous batching: requests arrive at their ``arrival`` times (seconds after the start, on the wall
    clock); each round, every request that has arrived is admitted while the batch has room (``max_batch``,
    and blocks for its worst case), the active ones take one round together, and a finished one leaves at
    once, its blocks free for the next. ``prefix``: token ids prefilled once and shared by the requests that
    start with them (a system prompt)."""
    proposer = proposer or Plain()
    engine = BatchEngine(target, proposer, SamplingConfig(temperature, top_k, top_p), n_blocks, block_size,
                         max_batch)
    if prefix is not None:
        engine.add_prefix(prefix)
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    for i in order:
        if engine._worst_blocks(requests[i]) + engine.blocks_promised() > engine.n_blocks:
            raise ValueError(f"request {requests[i].name or i} needs more KV blocks than the pool has "
                             f"({engine.n_blocks} of {block_size} positions)")
    queue = list(order)
    seqs: dict[int, Sequence] = {}
    peak = engine.pool.blocks_in_use
    engine.t0 = time.perf_counter()
    while queue or engine.active:
        now = engine.clock()
        while queue and requests[queue[0]].arrival <= now and engine.can_admit(requests[queue[0]]):
            i = queue.pop(0)
            seqs[i] = engine.admit(requests[i])
        if not engine.active:  # idle until the next arrival
            time.sleep(max(0.0, requests[queue[0]].arrival - engine.clock()))
            continue
        engine.waiting = len(queue)
        engine.step()
        peak = max(peak, engine.pool.blocks_in_use)
    wall = engine.clock()
    engine.close()
    records = [dict(name=requests[i].name, arrival=requests[i].arrival, admitted=seqs[i].t_admitted,
                    first=seqs[i].t_first, done=seqs[i].t_done, tokens=len(seqs[i].output)) for i in order]
    return ServeReport(records, [seqs[i].output for i in order], wall, sum(r["tokens"] for r in records),
                       engine.stats, peak)
