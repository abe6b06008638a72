"""Distilling SmolLM2's drafters from its own answers (:mod:`minigpt.real.answers`): the two-layer draft
(:func:`train_draft`, its embedding started from SmolLM2's), the Medusa heads (:func:`train_medusa`) and an
EAGLE head (:func:`train_eagle_head`), saved next to the package where :mod:`minigpt.real.loaders` finds them.
"""
from __future__ import annotations

import copy
import json
import platform
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..data import get_batch, load_tokens
from ..eagle_head import EagleHead, frequency_subset, save_eagle
from ..medusa_heads import MedusaHeads, save_heads
from ..training.train import Run, export, get_preset
from ..training.train_eagle import agreement, train_eagle
from ..training.train_heads import head_accuracy, train_heads
from .answers import HELD_OUT_NOTE, load_answers
from .loaders import SMOLLM2_EAGLE_CHECKPOINT, SMOLLM2_MEDUSA_CHECKPOINT
from .smollm import load_smollm, load_smollm_tokenizer

def projected_embedding(target, width: int) -> torch.Tensor:
    """SmolLM2's token embedding (vocab, 576) projected onto its ``width`` principal axes (vocab, width) and
    scaled to a typical initial weight size (std 0.02): a draft starting from it already knows which tokens
    are alike, which its few minutes of training could not teach it for the rare ones."""
    emb = target.transformer.wte.weight.detach().float()
    _, _, v = torch.linalg.svd(emb - emb.mean(0), full_matrices=False)
    proj = emb @ v[:width].T
    return proj * (0.02 / proj.std())


def answer_batch(tokens, answer, batch_size: int, block_size: int, g: torch.Generator):
    """Random windows of the conversations; targets outside the answers are -100 (ignored by the loss)."""
    ix = torch.randint(len(tokens) - block_size - 1, (batch_size,), generator=g).tolist()
    w = np.stack([tokens[i:i + block_size + 1] for i in ix]).astype(np.int64)
    keep = np.stack([answer[i + 1:i + block_size + 1] for i in ix]).astype(bool)
    y = np.where(keep, w[:, 1:], -100)
    return torch.from_numpy(np.ascontiguousarray(w[:, :-1])), torch.from_numpy(y)


@torch.no_grad()
def answer_agreement(draft, convs, masks) -> tuple[float, float]:
    """Teacher-forced agreement on held-out conversations: the fraction of answer tokens the draft's top
    guess gets right (the target's greedy token), and the draft's cross-entropy on them. Under greedy
    verification the agreement is roughly the chance that a drafted token is accepted."""
    draft.eval()
    hit = total = 0
    nll = 0.0
    for c, m in zip(convs, masks):
        x = torch.as_tensor(c[:-1].astype("int64"))[None]
        y = torch.as_tensor(c[1:].astype("int64"))
        sel = torch.as_tensor(m[1:].astype(bool))
        logits = draft(x)[0][sel]
        hit += int((logits.argmax(-1) == y[sel]).sum())
        nll += float(F.cross_entropy(logits, y[sel], reduction="sum"))
        total += int(sel.sum())
    draft.train()
    return hit / max(total, 1), nll / max(total, 1)


def distil_step(run, x: torch.Tensor, y: torch.Tensor) -> float:
    """One optimizer step of ``run`` (a :class:`minigpt.training.train.Run`) on targets ``y`` (-100: no target).

    The output layer (49152 x 128) costs far more than the two layers under it, so it is applied only at
    the positions that have a target: about half of them in a conversation (the prompt has none)."""
    keep = y != -100
    h = run.model.hidden_states(x)[keep]                      # (n targets, n_embd)
    loss = F.cross_entropy(run.model.lm_head(h), y[keep])
    run.optimize(loss, int(keep.sum()))
    return loss.item()


def train_draft(minutes: float, stdlib_every: int = 3, stdlib_positions: float = 0.25, held_out: float = 0.05,
                fresh: bool = False, out: str = "runs", max_steps: int | None = None, log=print) -> dict:
    """Distil the SmolLM2 draft from SmolLM2's own answers (:func:`make_answers`, run first).

    Every ``stdlib_every``-th batch is plain standard-library code in SmolLM2's tokens instead (hard labels
    at a random ``stdlib_positions`` of its positions), to keep general code in view. The last ``held_out`` of
    the conversations are never trained on: the draft's agreement with SmolLM2 on them is measured as it
    trains, and the best state is exported."""
    data, n_val = load_answers(held_out)
    convs, masks = np.split(data["tokens"], data["starts"][1:]), np.split(data["answer"], data["starts"][1:])
    val_convs, val_masks = convs[-n_val:], masks[-n_val:]
    n_train_tokens = int(data["starts"][-n_val])
    tokens, answer = data["tokens"][:n_train_tokens], data["answer"][:n_train_tokens]
    stdlib = load_tokens("train", load_smollm_tokenizer())
    preset = get_preset("smollm2-draft")
    if max_steps:
        preset = replace(preset, max_steps=max_steps)   # the length of the learning-rate schedule
    run = Run("smollm2-draft", preset, Path(out), fresh)
    if run.step == 0:
        run.model.transformer.wte.weight.data.copy_(projected_embedding(load_smollm("cpu"), preset.config.n_embd))
    g = torch.Generator().manual_seed(run.step)
    best, best_state, best_step, best_val = -1.0, None, None, None
    t0 = time.time()
    while run.step < preset.max_steps and time.time() - t0 < 60 * minutes:
        t = time.time()
        if stdlib_every and run.step % stdlib_every == stdlib_every - 1:
            x, y = get_batch(stdlib, preset.batch_size, preset.block_size, g)
            y[torch.rand(y.shape, generator=g) > stdlib_positions] = -100  # a sample of the positions is enough
        else:
            x, y = answer_batch(tokens, answer, preset.batch_size, preset.block_size, g)
        loss = distil_step(run, x, y)
        run.seconds += time.time() - t
        if run.step % 100 == 0 or run.step == preset.max_steps or time.time() - t0 >= 60 * minutes:
            agree, val = answer_agreement(run.model, val_convs, val_masks)
            run.history.append(dict(step=run.step, tokens=run.tokens, seconds=round(run.seconds),
                                    train_loss=round(loss, 4), val_loss=round(val, 4),
                                    held_out_agreement=round(agree, 4)))
            run.save()
            log(f"step {run.step}: train loss {loss:.3f}, held-out loss {val:.3f}, agreement {agree:.3f}, "
                f"{run.seconds / 60:.1f} min")
            if agree > best:
                best, best_state, best_step, best_val = agree, copy.deepcopy(run.model.state_dict()), run.step, val
    if best_state is None:
        raise RuntimeError("no evaluation happened: train for longer")
    run.model.load_state_dict(best_state)
    info = dict(data=f"SmolLM2's greedy answers to {len(convs) - n_val} chat requests (minigpt.real.request_sets), "
                     f"1 batch in {stdlib_every} standard-library code", exported_step=best_step,
                held_out_conversations=n_val, held_out=HELD_OUT_NOTE, held_out_agreement=round(best, 4),
                embedding_init=f"SmolLM2 token embedding projected onto its {preset.config.n_embd} principal axes",
                hardware=f"{platform.machine()} CPU, {torch.get_num_threads()} threads", torch=torch.__version__)
    dest = export(run, best_val, info)  # val_loss: cross-entropy on the held-out answers
    log(f"exported the state of step {best_step} (held-out agreement {best:.3f}) to {dest}")
    return info


def train_medusa(minutes: float, n_heads: int = 4, batch_size: int = 4, block_size: int = 128,
                 data: str = "answers") -> dict:
    """Train Medusa heads (sharing SmolLM2's output layer) on SmolLM2's own answers (``data="answers"``, from
    :func:`make_answers`) or on the standard library in SmolLM2's tokens (``"stdlib"``), measure them on
    held-out text, and save them with their measured accuracies next to the package."""
    if data == "answers":
        answers, n_val = load_answers()
        cut = int(answers["starts"][-n_val])
        train, val = answers["tokens"][:cut], answers["tokens"][cut:]
        about = (f"SmolLM2's greedy conversations (minigpt.real.request_sets), {len(answers['starts']) - n_val} "
                 f"trained on; held out: {n_val}, {HELD_OUT_NOTE}")
    elif data == "stdlib":
        enc = load_smollm_tokenizer()
        train, val = load_tokens("train", enc), load_tokens("val", enc)
        about = "standard-library training split, SmolLM2 tokens; held out: the validation files"
    else:
        raise ValueError(f"data must be 'answers' or 'stdlib', got {data!r}")
    target = load_smollm("cpu")
    heads = MedusaHeads.for_target(target, n_heads, share_output=True)
    info = train_heads(target, heads, minutes, batch_size=batch_size, block_size=block_size, data=train)
    acc = head_accuracy(target, heads, val, block_size=block_size, batches=4, batch_size=4)
    card = dict(target="SmolLM2-135M-Instruct (frozen)", data=about,
                n_heads=n_heads, shared_output=True, **{k: v for k, v in info.items() if k != "history"},
                hardware=f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}",
                held_out_top1=[round(float(a[0]), 4) for a in acc],
                held_out_top5=[round(float(a[:5].sum()), 4) for a in acc])
    save_heads(heads, SMOLLM2_MEDUSA_CHECKPOINT, rank_accuracy=acc, card=json.dumps(card))
    return card


def train_eagle_head(minutes: float, subset_size: int = 8192, batch_size: int = 4, block_size: int = 256,
                     max_steps: int | None = None) -> dict:
    """Train an EAGLE head for SmolLM2 on its own answers (:func:`make_answers`, run first), its read-out over the
    ``subset_size`` tokens most frequent in those answers (a sixth of the vocabulary reads out at about a sixth of
    the cost; a token outside can never be drafted). Only entries that predict an answer's token count. The held-out
    agreement is measured on the last conversations; the head is saved with its card next to the package."""
    data, n_val = load_answers()
    cut = int(data["starts"][-n_val])
    tokens, answer = data["tokens"][:cut], data["answer"][:cut].astype(bool)
    target = load_smollm("cpu")
    counts = np.bincount(tokens[answer].astype(np.int64), minlength=target.config.vocab_size)
    head = EagleHead(target, vocab_subset=frequency_subset(torch.from_numpy(counts).float(), subset_size))

    def batches(g: torch.Generator):
        x, y = answer_batch(tokens, answer, batch_size, block_size, g)
        return x, y[:, 1:] != -100  # entry t predicts x_{t+2}: it counts when that token is an answer's

    info = train_eagle(target, head, minutes, batches=batches, max_steps=max_steps, save_to=SMOLLM2_EAGLE_CHECKPOINT)
    convs, masks = np.split(data["tokens"], data["starts"][1:]), np.split(data["answer"], data["starts"][1:])
    # entry t of a conversation (cut to the context) predicts x_{t+2}: it counts when that token exists and is an
    # answer's
    n = target.config.block_size
    val = [(torch.as_tensor(c[:n].astype(np.int64))[None], torch.as_tensor(np.append(m[2:n], False).astype(bool))[None])
           for c, m in zip(convs[-n_val:], masks[-n_val:])]
    share = float(counts[head.vocab_subset.numpy()].sum() / counts.sum())
    card = dict(target="SmolLM2-135M-Instruct (frozen)",
                data=f"SmolLM2's greedy conversations (minigpt.real.request_sets), {len(convs) - n_val} trained on; "
                     f"held out: {n_val}, {HELD_OUT_NOTE}; only entries predicting an answer's token count",
                vocab_subset=f"the {subset_size} tokens most frequent in the training answers ({share:.1%} of "
                             f"their tokens)",
                **{k: v for k, v in info.items() if k != "history"},
                hardware=f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}",
                held_out_top1=round(agreement(target, head, val), 4), history=info["history"])
    save_eagle(head, SMOLLM2_EAGLE_CHECKPOINT, card=json.dumps(card))
    return {k: v for k, v in card.items() if k != "history"}

