"""The distillation data for SmolLM2's draft: SmolLM2's own greedy answers to the chat requests of
:func:`minigpt.real.request_sets.training_requests` (sequence-level distillation), written once by
``python -m minigpt.real make-answers`` (it needs transformers) and read by :mod:`minigpt.real.distill`.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from ..data import cache_dir
from .hf import load_hf_smollm
from .request_sets import training_requests
from .smollm import STOP, encode_chat, load_smollm_tokenizer

ANSWERS_FILE = "smollm2-answers.npz"  # in the minigpt cache folder


def answers_path() -> Path:
    return cache_dir() / ANSWERS_FILE


def make_answers(max_new_tokens: int = 160, batch_size: int = 48, n_edit: int = 400, minutes: float | None = None,
                 log=print) -> dict:
    """SmolLM2's greedy answers to :func:`minigpt.real.request_sets.training_requests`: the distillation data for its
    draft. transformers generates them in batches (left-padded), which a CPU does several times faster than
    one request at a time. Saved after every batch to ``<cache>/smollm2-answers.npz`` and resumed from there:

    * ``tokens``: every conversation (chat prompt, answer, ``<|im_end|>``) one after another (uint16);
    * ``answer``: 1 where ``tokens`` is part of an answer (the positions a draft is trained to predict);
    * ``starts``, ``kinds``: where each conversation begins, and its kind."""
    enc = load_smollm_tokenizer()
    stop = enc.encode_single_token(STOP)
    reqs = training_requests(n_edit=n_edit)
    prompts = [encode_chat(enc, text) for _, text in reqs]
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i][0], len(prompts[i])))  # similar lengths together
    path = answers_path()
    done = dict(np.load(path)) if path.exists() else None
    convs = [] if done is None else np.split(done["tokens"], done["starts"][1:])
    masks = [] if done is None else np.split(done["answer"], done["starts"][1:])
    kinds = [] if done is None else list(done["kinds"])
    model = load_hf_smollm()
    t0 = time.time()
    for b in range(len(convs), len(order), batch_size):
        if minutes is not None and time.time() - t0 > 60 * minutes:
            break
        batch = [order[i] for i in range(b, min(b + batch_size, len(order)))]
        width = max(len(prompts[i]) for i in batch)
        ids = torch.tensor([[stop] * (width - len(prompts[i])) + prompts[i] for i in batch])
        att = (torch.arange(width)[None, :] >= torch.tensor([width - len(prompts[i]) for i in batch])[:, None]).long()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=stop, pad_token_id=stop)
        for row, i in zip(out[:, width:].tolist(), batch):
            answer = row[:row.index(stop) + 1] if stop in row else row
            convs.append(np.asarray(prompts[i] + answer, dtype=np.uint16))
            masks.append(np.asarray([0] * len(prompts[i]) + [1] * len(answer), dtype=np.uint8))
            kinds.append(reqs[i][0])
        starts = np.cumsum([0] + [len(c) for c in convs[:-1]])
        np.savez(path, tokens=np.concatenate(convs), answer=np.concatenate(masks), starts=starts,
                 kinds=np.asarray(kinds))
        log(f"{len(convs)}/{len(order)} conversations, {int(sum(m.sum() for m in masks))} answer tokens, "
            f"{time.time() - t0:.0f} s")
    return dict(conversations=len(convs), answer_tokens=int(sum(m.sum() for m in masks)), path=str(path))


HELD_OUT_NOTE = ("the last conversations in generation order, which is sorted by kind and prompt length: "
                 "the edit requests with the longest prompts")


def load_answers(held_out: float = 0.05):
    """The conversations of :func:`make_answers` (a dict of arrays) and how many of the last ones are held out
    (never trained on; see ``HELD_OUT_NOTE``)."""
    path = answers_path()
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python -m minigpt.real make-answers` first")
    data = dict(np.load(path))
    return data, max(1, int(len(data["starts"]) * held_out))
