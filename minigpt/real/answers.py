"""The distillation data for SmolLM2's drafters: SmolLM2's own greedy answers to the request mix
(:mod:`minigpt.real.request_mix`), generated with the course's batch engine (:mod:`minigpt.decoding.batch`: a
paged KV cache, B sequences decoded together, continuous batching) and read by :mod:`minigpt.real.distill`.

    python -m minigpt.real make-answers --minutes 600       # resumable: run it again to go on
    python -m minigpt.real make-answers --worker 1/2 &      # two processes on one folder: shards 1, 3, 5, ...
    python -m minigpt.real make-answers --worker 2/2        #                              and 2, 4, 6, ...

The requests are cut into shards by their position in the mix (``shard_size`` positions each); a shard is
decoded as one continuous batch (a finished sequence leaves at once and the next request takes its place; a
follow-up's second turn joins as soon as its first answer exists) and written to
``shard-NNNNN.npz`` in :func:`answers_dir` when it is complete. A restart skips the shards on disk that hold
the same requests, so it goes on where it stopped and the data are the same as an uninterrupted run's (a
shard's batches are the same, whatever ran before); a shard whose requests changed is decoded again. ``card.json`` beside them holds the generation settings
and the data's statistics, rewritten after every shard.

A shard holds, one conversation after another: ``tokens`` (uint16: the chat prompt, each answer with its
``<|im_end|>``, a follow-up's second turn), ``answer`` (1 at an answer's tokens: what a draft learns to
predict), per conversation ``starts``, ``kinds``, ``request`` (its position in the mix), and per answer
``turn_length`` and ``turn_eos`` (it ended with ``<|im_end|>`` rather than at the length limit), and the
shard's wall-clock and CPU seconds (on a shared machine the CPU time tells what the generation itself cost).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import statistics
import time
import zlib
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..data import cache_dir
from ..decoding import BatchEngine, Plain, Request
from ..model import GPT
from .request_mix import request_mix
from .smollm import IM_END, IM_START, STOP, encode_chat, load_smollm, load_smollm_tokenizer

ANSWERS_DIR = "smollm2-answers"  # in the checkout's data/ folder, else in the minigpt cache folder
ANSWERS_ENV = "MINIGPT_ANSWERS"  # a folder of answers to use instead
HELD_OUT_NOTE = ("about 5% of the requests of every kind, chosen by a hash of their position in the mix "
                 "(minigpt.real.answers.is_held_out), never trained on")


def answers_dir() -> Path:
    """Where the shards are written and read: ``$MINIGPT_ANSWERS`` when set; else ``data/smollm2-answers/`` of
    the source checkout the package runs from, when that folder exists (the repository keeps the shards made so
    far there, so that generation resumes on a new machine and the drafters train on the same data); else
    ``<minigpt cache>/smollm2-answers/``."""
    if os.environ.get(ANSWERS_ENV):
        return Path(os.environ[ANSWERS_ENV])
    checkout = Path(__file__).resolve().parents[2] / "data" / ANSWERS_DIR
    return checkout if checkout.is_dir() else cache_dir() / ANSWERS_DIR


@dataclass
class Job:
    """One conversation to generate. ``turns[0]``: the whole prompt of the first turn (token ids); each later
    entry: the tokens that follow the previous answer (and its end-of-turn token): the next user turn and the
    assistant's header."""
    request: int
    kind: str
    turns: list[list[int]]

    def worst_length(self, max_new_tokens: int) -> int:
        return sum(len(t) for t in self.turns) + len(self.turns) * (max_new_tokens + 1)


def jobs_digest(jobs: list[Job]) -> str:
    """A fingerprint of the requests of a shard (their positions, kinds and tokens)."""
    h = hashlib.sha1()
    for j in jobs:
        h.update(f"{j.request}|{j.kind}|{j.turns}".encode())
    return h.hexdigest()[:16]


def decode_shard(target: GPT, jobs: list[Job], eos_id: int, max_new_tokens: int, batch_size: int,
                 block_size: int = 16) -> dict:
    """Greedy answers to ``jobs`` as one continuous batch of up to ``batch_size`` sequences on a paged cache;
    returns the shard's arrays (see the module's docstring) and its ``seconds`` and ``answer_tokens``."""
    t0, c0 = time.perf_counter(), time.process_time()
    worst = max(math.ceil(j.worst_length(max_new_tokens) / block_size) for j in jobs)
    engine = BatchEngine(target, Plain(), n_blocks=batch_size * (worst + 1), block_size=block_size,
                         max_batch=batch_size)
    parts: dict[int, list[tuple[list[int], int]]] = {i: [] for i in range(len(jobs))}  # (tokens, is answer)
    turns: dict[int, list[tuple[int, bool]]] = {i: [] for i in range(len(jobs))}      # (length, ended)
    pending = deque((i, 0, list(j.turns[0])) for i, j in enumerate(jobs))
    running = {}
    while pending or engine.active:
        while pending and len(engine.active) < batch_size:
            i, k, ids = pending[0]
            request = Request(ids, max_new_tokens, eos_id=eos_id, name=f"{jobs[i].request}/{k}")
            if not engine.can_admit(request):
                break
            pending.popleft()
            running[id(engine.admit(request))] = (i, k, ids)
        if not engine.active:
            raise MemoryError("a request needs more KV blocks than the pool has")  # cannot happen: sized above
        for seq in engine.step():
            i, k, ids = running.pop(id(seq))
            out = list(seq.output)
            ended = bool(out) and out[-1] == eos_id
            parts[i] += [(list(jobs[i].turns[k]), 0), (out, 1)]
            turns[i].append((len(out), ended))
            if k + 1 < len(jobs[i].turns):
                close = [] if ended else [eos_id]  # a cut answer still ends its turn before the next one
                parts[i].append((close, 0))
                pending.append((i, k + 1, ids + out + close + list(jobs[i].turns[k + 1])))
    engine.close()
    tokens = [np.concatenate([np.asarray(t, dtype=np.uint16) for t, _ in parts[i]]) for i in range(len(jobs))]
    masks = [np.concatenate([np.full(len(t), a, dtype=np.uint8) for t, a in parts[i]]) for i in range(len(jobs))]
    flat = [t for i in range(len(jobs)) for t in turns[i]]
    return dict(tokens=np.concatenate(tokens), answer=np.concatenate(masks),
                starts=np.cumsum([0] + [len(t) for t in tokens[:-1]]).astype(np.int64),
                kinds=np.asarray([j.kind for j in jobs]), request=np.asarray([j.request for j in jobs], dtype=np.int64),
                turn_length=np.asarray([n for n, _ in flat], dtype=np.int32),
                turn_eos=np.asarray([e for _, e in flat], dtype=bool),
                seconds=np.float64(time.perf_counter() - t0), cpu_seconds=np.float64(time.process_time() - c0),
                answer_tokens=np.int64(sum(n for n, _ in flat)))


# The settings that decide what the data are: a restart with other values would mix two data sets.
FIXED_SETTINGS = ("model", "precision", "decoding", "max_new_tokens", "eos_id", "shard_size", "mix")


def generate_answers(target: GPT, jobs: list[Job], out_dir: Path, settings: dict, eos_id: int,
                     max_new_tokens: int = 256, batch_size: int = 16, shard_size: int = 64,
                     minutes: float | None = None, max_shards: int | None = None, log=print,
                     worker: tuple[int, int] = (1, 1)) -> dict:
    """Decode ``jobs`` shard by shard into ``out_dir`` (see the module's docstring; shard k: the jobs whose
    ``request`` lies in [k * shard_size, (k + 1) * shard_size)), skipping the shards already there with the same
    requests; stop before a new shard once ``minutes`` have passed or ``max_shards`` were decoded by this call.
    ``worker`` (i, n): this process decodes only every n-th of the shards in order, starting at the i-th (1-based),
    so that n processes fill one folder together without meeting. ``settings`` (a dict) describes the run for
    the card. Returns the card."""
    i_worker, n_workers = worker
    if not 1 <= i_worker <= n_workers:
        raise ValueError(f"worker {i_worker}/{n_workers}: expected i/n with 1 <= i <= n")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = dict(settings, decoding="greedy", max_new_tokens=max_new_tokens, eos_id=eos_id, shard_size=shard_size)
    card_path = out_dir / "card.json"
    if card_path.exists():
        old = json.loads(card_path.read_text())["settings"]
        changed = [k for k in FIXED_SETTINGS if k in old and old.get(k) != settings.get(k)]
        if changed:
            raise ValueError(f"{out_dir} holds answers made with other settings ({', '.join(changed)}: "
                             f"{old[changed[0]]!r}, now {settings[changed[0]]!r}); use another folder")
    shards: dict[int, list[Job]] = {}
    for job in jobs:  # by position in the mix: a request left out or added changes its own shard only
        shards.setdefault(job.request // shard_size, []).append(job)
    n_shards = len(shards)
    t0, made = time.time(), 0
    for done, (s, shard_jobs) in enumerate(sorted(shards.items()), start=1):
        if (done - 1) % n_workers != i_worker - 1:
            continue
        path = out_dir / f"shard-{s:05d}.npz"
        digest = jobs_digest(shard_jobs)
        if path.exists():
            with np.load(path) as old:
                if str(old["digest"]) == digest:
                    continue
            log(f"{path.name}: its requests are not the mix's now (the mix grew or changed): decoding it again")
        if (minutes is not None and time.time() - t0 > 60 * minutes) or (max_shards is not None and made >= max_shards):
            break
        data = decode_shard(target, shard_jobs, eos_id, max_new_tokens, batch_size)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **data, digest=np.asarray(digest), batch_size=np.int64(batch_size),
                 threads=np.int64(torch.get_num_threads()))
        tmp.replace(path)
        made += 1
        card = write_card(out_dir, settings, n_shards)
        st = card["stats"]
        log(f"shard {done}/{n_shards}: {len(shard_jobs)} conversations, {int(data['answer_tokens'])} answer tokens "
            f"in {float(data['seconds']):.0f} s ({int(data['answer_tokens']) / float(data['seconds']):.1f} tokens/s); "
            f"in all {st['conversations']} conversations, {st['answer_tokens']} answer tokens")
    return write_card(out_dir, settings, n_shards)


def shard_paths(out_dir: Path) -> list[Path]:
    return sorted(Path(out_dir).glob("shard-[0-9][0-9][0-9][0-9][0-9].npz"))


def write_card(out_dir: Path, settings: dict, n_shards: int) -> dict:
    """The data's card from the shards on disk: the settings, the requests by kind, the answers' lengths, the
    share ending with the end-of-turn token, and the generation speed; written to ``card.json``."""
    kinds: Counter = Counter()
    lengths, eos, seconds, cpu, batch, threads = [], [], 0.0, 0.0, set(), set()
    tokens = 0
    paths = shard_paths(out_dir)
    for p in paths:
        with np.load(p) as d:
            kinds.update(d["kinds"].tolist())
            lengths += d["turn_length"].tolist()
            eos += d["turn_eos"].tolist()
            seconds += float(d["seconds"])
            cpu += float(d["cpu_seconds"])
            tokens += int(d["answer_tokens"])
            batch.add(int(d["batch_size"]))
            threads.add(int(d["threads"]))
    stats = dict(shards=len(paths), shards_planned=n_shards, conversations=sum(kinds.values()),
                 conversations_by_kind=dict(sorted(kinds.items())), answers=len(lengths), answer_tokens=tokens,
                 mean_answer_length=round(statistics.fmean(lengths), 1) if lengths else None,
                 median_answer_length=statistics.median(lengths) if lengths else None,
                 eos_share=round(sum(eos) / len(eos), 4) if eos else None,
                 generation_seconds=round(seconds), answer_tokens_per_s=round(tokens / seconds, 1) if seconds else None,
                 answer_tokens_per_cpu_s=round(tokens / cpu, 1) if cpu else None,
                 batch_sizes=sorted(batch), threads=sorted(threads))
    card = dict(data="the target's own greedy answers (sequence-level distillation); answer=1 marks the tokens a "
                     "draft learns to predict", held_out=HELD_OUT_NOTE, settings=settings, stats=stats,
                hardware=f"{platform.machine()} CPU, torch {torch.__version__}")
    tmp = Path(out_dir) / f"card.json.{os.getpid()}.tmp"   # one per process: workers share the folder
    tmp.write_text(json.dumps(card, indent=1) + "\n")
    tmp.replace(Path(out_dir) / "card.json")
    return card


# ------------------------------------------------------------------------------------------------ SmolLM2

def smollm2_jobs(n_requests: int, seed: int = 0, max_prompt_tokens: int = 768) -> list[Job]:
    """The request mix (:func:`minigpt.real.request_mix.request_mix`) in SmolLM2's chat format; requests whose
    first prompt is longer than ``max_prompt_tokens`` are left out."""
    enc = load_smollm_tokenizer()
    jobs = []
    for r in request_mix(n_requests, seed):
        first = encode_chat(enc, r.turns[0])
        later = [enc.encode(f"\n{IM_START}user\n{t}{IM_END}\n{IM_START}assistant\n",
                            allowed_special={IM_START, IM_END}, disallowed_special=()) for t in r.turns[1:]]
        if len(first) <= max_prompt_tokens:
            jobs.append(Job(r.index, r.kind, [first, *later]))
    return jobs


def make_answers(minutes: float | None = None, n_requests: int = 10000, seed: int = 0, batch_size: int = 16,
                 shard_size: int = 64, max_new_tokens: int = 256, out_dir: Path | None = None,
                 max_shards: int | None = None, log=print, worker: tuple[int, int] = (1, 1)) -> dict:
    """SmolLM2's greedy answers to the first ``n_requests`` of the request mix, shard by shard, resumed from what
    ``out_dir`` (default ``<cache>/smollm2-answers``) holds (:func:`generate_answers`). Returns the card."""
    target = load_smollm("cpu")
    eos_id = load_smollm_tokenizer().encode_single_token(STOP)
    jobs = smollm2_jobs(n_requests, seed)
    settings = dict(model="SmolLM2-135M-Instruct (Q4_1 GGUF dequantised)", precision="fp32",
                    mix=f"minigpt.real.request_mix.request_mix(seed={seed})", n_requests=n_requests,
                    conversations_planned=len(jobs), batch_engine=f"minigpt.decoding.BatchEngine, Plain, paged cache "
                                                                  f"of 16-position blocks, B={batch_size}")
    return generate_answers(target, jobs, out_dir or answers_dir(), settings, eos_id, max_new_tokens, batch_size,
                            shard_size, minutes, max_shards, log, worker)


def is_held_out(request: int, share: float = 0.05) -> bool:
    """Whether the request at this position of the mix is held out (a hash of the position, so every kind)."""
    return zlib.crc32(f"request {request}".encode()) % 10_000 < share * 10_000


def load_answers(held_out: float = 0.05, out_dir: Path | None = None):
    """Every conversation of the shards (a dict of arrays: ``tokens``, ``answer``, ``starts``, ``kinds``,
    ``request``), the held-out ones (:func:`is_held_out`) last, and how many those are."""
    out_dir = Path(out_dir or answers_dir())
    paths = shard_paths(out_dir)
    if not paths:
        raise FileNotFoundError(f"no answers in {out_dir}: run `python -m minigpt.real make-answers` first")
    convs, masks, kinds, reqs = [], [], [], []
    for p in paths:
        with np.load(p) as d:
            convs += np.split(d["tokens"], d["starts"][1:])
            masks += np.split(d["answer"], d["starts"][1:])
            kinds += d["kinds"].tolist()
            reqs += d["request"].tolist()
    order = sorted(range(len(convs)), key=lambda i: is_held_out(reqs[i], held_out))  # stable: train, then held out
    n_val = sum(is_held_out(r, held_out) for r in reqs)
    data = dict(tokens=np.concatenate([convs[i] for i in order]), answer=np.concatenate([masks[i] for i in order]),
                starts=np.cumsum([0] + [len(convs[i]) for i in order[:-1]]).astype(np.int64),
                kinds=np.asarray([kinds[i] for i in order]), request=np.asarray([reqs[i] for i in order]))
    return data, max(1, n_val)
