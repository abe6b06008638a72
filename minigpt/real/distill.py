"""Distilling SmolLM2's drafters from its own answers (:mod:`minigpt.real.answers`): the two-layer draft
(:func:`train_draft`, its embedding started from SmolLM2's), the Medusa heads (:func:`train_medusa`), an
EAGLE head (:func:`train_eagle_head`) and an EAGLE-3 head (:func:`train_eagle3_head`: low, middle and high
layers fused, tokens predicted directly, trained with its own outputs fed back; checkpointed and resumed), saved
next to the package where :mod:`minigpt.real.loaders` finds them.
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
from ..decoding.plain import Plain
from ..decoding.session import Settings, decode
from ..eagle_head import Eagle3Head, EagleHead, frequency_subset, load_eagle, load_eagle3, save_eagle, save_eagle3
from ..medusa_heads import MedusaHeads, save_heads
from ..model import frozen
from ..training.train import Run, export, get_preset
from ..training.train_eagle import agreement, train_eagle
from ..training.train_eagle3 import chain_hits, chain_summary, step_inputs, target_pass, ttt_loss
from ..training.train_heads import head_accuracy, train_heads
from .answers import HELD_OUT_NOTE, load_answers
from .loaders import SMOLLM2_EAGLE3_CHECKPOINT, SMOLLM2_EAGLE_CHECKPOINT, SMOLLM2_MEDUSA_CHECKPOINT
from .request_sets import real_prompts
from .smollm import STOP, load_smollm, load_smollm_tokenizer

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



# ------------------------------------------------------------------------------------------------- EAGLE-3

def eagle3_batch(tokens: np.ndarray, answer: np.ndarray, batch_size: int, block_size: int, g: torch.Generator,
                 stdlib: np.ndarray | None = None, stdlib_share: float = 0.0):
    """Windows x (B, block_size) of the conversations and ``counts`` (B, block_size) bool: position j counts when
    the token after it is an answer's. With ``stdlib_share``, that share of the batches are windows of the
    standard library in SmolLM2's tokens instead (teacher-forced: every position counts, the label being the
    target's own choice there)."""
    if stdlib is not None and float(torch.rand((), generator=g)) < stdlib_share:
        return get_batch(stdlib, batch_size, block_size, g)[0], None
    x, y = answer_batch(tokens, answer, batch_size, block_size, g)
    return x, y != -100


def eval_windows(data: dict, n_val: int, conversations: int, block_size: int):
    """The first ``conversations`` held-out conversations, each cut to ``block_size`` tokens: (x (1, T), counts)."""
    convs = np.split(data["tokens"], data["starts"][1:])[-n_val:][:conversations]
    masks = np.split(data["answer"], data["starts"][1:])[-n_val:][:conversations]
    out = []
    for c, m in zip(convs, masks):
        x = torch.as_tensor(c[:block_size].astype(np.int64))[None]
        counts = torch.as_tensor(np.append(m[1:block_size], 0).astype(bool))[None]
        out.append((x, counts))
    return out


def request_windows(target, prompts, max_new_tokens: int, eos_id: int | None, path: Path | None = None):
    """Windows (x (1, T), counts) of ``prompts`` followed by the target's greedy answers (at most
    ``max_new_tokens``, stopping after ``eos_id``); position j counts when the token after it is an answer's.
    Kept in ``path`` (computed once: the target is frozen) when given. These are requests of the kind the
    benchmark serves, which the training mix's own held-out conversations may not resemble."""
    how = dict(prompts=[list(map(int, p)) for p in prompts], max_new_tokens=max_new_tokens, eos_id=eos_id)
    if path is not None and Path(path).exists():
        kept = torch.load(path, map_location="cpu", weights_only=True)
        if json.loads(kept["how"]) == how:
            return list(zip(kept["x"], kept["counts"]))
    out = []
    for p in prompts:
        answer, _ = decode(target, list(p), max_new_tokens, Plain(), Settings(eos_id=eos_id))
        x = torch.tensor([list(p) + answer])
        counts = torch.zeros_like(x, dtype=torch.bool)
        counts[0, len(p) - 1:-1] = True
        out.append((x, counts))
    if path is not None:
        torch.save(dict(how=json.dumps(how), x=[x for x, _ in out], counts=[c for _, c in out]), path)
    return out


def measure_chain(head, windows, depth: int, cached: dict | None = None) -> dict:
    """:func:`~minigpt.training.train_eagle3.chain_summary` of ``head`` over ``windows`` (an EAGLE or EAGLE-3
    head alike), counting only positions whose next ``depth`` tokens all count."""
    hits, valid = [], []
    for i, (x, counts) in enumerate(windows):
        _, labels = cached[i] if cached is not None else target_pass(head, x, counts)
        hits.append(chain_hits(head, x, labels, depth))
        lab = torch.stack([step_inputs(x, labels, k)[1][0] for k in range(depth)], dim=1)
        valid.append((lab != -100).all(1))
    return chain_summary(torch.cat(hits), torch.cat(valid))


def _lr(step: int, lr: float, warmup: int, max_steps: int | None) -> float:
    """Linear warm-up, then constant, or a cosine down to a tenth by ``max_steps`` when it is given."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if not max_steps:
        return lr
    t = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * t)))


def train_eagle3_head(minutes: float, subset_size: int = 8192, batch_size: int = 4, block_size: int = 512,
                      ttt_steps: int = 5, lr: float = 5e-4, warmup: int = 100, max_steps: int | None = None,
                      stdlib_share: float = 0.0, feature_layers=None, eval_every: int = 200, save_every: int = 25,
                      eval_conversations: int = 32, eval_depth: int = 6, fresh: bool = False, out: Path = Path("runs"),
                      export_to: Path | None = None, init_from: Path | None = None, dev_prompts=None,
                      dev_tokens: int = 128, log=print) -> dict:
    """Train an EAGLE-3 head for SmolLM2 on its own answers (:func:`minigpt.real.answers.make_answers`) with
    ``ttt_steps`` steps of training-time test, for ``minutes`` (or up to ``max_steps``), resuming from
    ``out/smollm2-eagle3/state.pt`` (weights, optimizer, data generator, history) unless ``fresh``. The read-out
    holds the ``subset_size`` tokens most frequent in the training answers (FR-Spec). Every ``eval_every`` steps
    the head is measured on held-out conversations (teacher-forced chains of ``eval_depth``: agreement per depth
    and τ, beside the shipped EAGLE head's on the same windows) and on the development requests of the benchmark
    (``dev_prompts``, default :func:`~minigpt.real.request_sets.real_prompts` of the "dev" split, with SmolLM2's
    greedy answers of up to ``dev_tokens`` tokens; the same chains). The best so far by τ on the development
    requests is exported with its card to ``export_to`` (default: the package's ``smollm2-eagle3.pt``), in
    bfloat16: the mix's own conversations can flatter a head that does worse on the requests it will serve.
    ``init_from``: where there is no state to resume (a new machine: ``out`` is gone, an exported head is not),
    start from that exported head's weights and read-out, with a new optimizer, at the step its card records (so
    the schedule goes on)."""
    data, n_val = load_answers()
    cut = int(data["starts"][-n_val])
    tokens, answer = data["tokens"][:cut], data["answer"][:cut].astype(bool)
    target = load_smollm("cpu")
    run_dir = Path(out) / "smollm2-eagle3"
    run_dir.mkdir(parents=True, exist_ok=True)
    state_path, export_to = run_dir / "state.pt", Path(export_to or SMOLLM2_EAGLE3_CHECKPOINT)
    if state_path.exists() and not fresh:
        head = load_eagle3(target, state_path).train()
        st = torch.load(state_path, map_location="cpu", weights_only=True)
        log(f"resumed at step {st['step']}")
    else:
        counts = np.bincount(tokens[answer].astype(np.int64), minlength=target.config.vocab_size)
        step0, card = 0, {}
        if init_from is not None and not fresh:
            head = load_eagle3(target, init_from).float().train()  # exported in bfloat16: train in float32
            card = json.loads(torch.load(init_from, map_location="cpu", weights_only=True).get("card") or "{}")
            step0 = int(card.get("exported_step", 0))
            log(f"started from {init_from} (its step {step0}; a new optimizer)")
        else:
            with torch.random.fork_rng():  # the same head's initial weights every time
                torch.manual_seed(29)
                head = Eagle3Head(target, frequency_subset(torch.from_numpy(counts).float(), subset_size),
                                  feature_layers)
        st = dict(step=step0, tokens=int(card.get("tokens_seen", 0)), seconds=float(card.get("train_seconds", 0)),
                  cpu_seconds=float(card.get("train_cpu_seconds", 0)), history="[]", best_tau=-1.0, baseline="{}",
                  subset_share=float(counts[head.vocab_subset.numpy()].sum() / counts.sum()))
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(29)
    if "optimizer" in st:
        opt.load_state_dict(st["optimizer"])
        g.set_state(st["generator"])
    step, seen, seconds, best = int(st["step"]), int(st["tokens"]), float(st["seconds"]), float(st["best_tau"])
    cpu = float(st.get("cpu_seconds", 0.0))
    history, baseline = json.loads(st["history"]), json.loads(st["baseline"])
    stdlib = load_tokens("train", load_smollm_tokenizer()) if stdlib_share else None
    windows = eval_windows(data, n_val, eval_conversations, block_size)
    with frozen(target):
        if dev_prompts is None:
            enc = load_smollm_tokenizer()
            dev_prompts, dev_eos = real_prompts(split="dev"), enc.encode_single_token(STOP)
        else:
            dev_eos = None
        dev = request_windows(target, dev_prompts, dev_tokens, dev_eos, run_dir / "dev_windows.pt")
        dev_cached = [target_pass(head, x, c) for x, c in dev]
        cached = [target_pass(head, x, c) for x, c in windows]
        how = f"{len(windows)} conversations, {block_size} tokens, depth {eval_depth}"
        if baseline.get("windows") != how:  # measured on other windows (or never): the best so far is not comparable
            best, baseline = -1.0, dict(windows=how)
            if SMOLLM2_EAGLE_CHECKPOINT.exists():
                baseline.update(measure_chain(load_eagle(target, SMOLLM2_EAGLE_CHECKPOINT), windows, eval_depth))
                log(f"the shipped EAGLE head on the same windows: {baseline}")
        dev_how = f"{len(dev)} development requests, greedy answers of up to {dev_tokens} tokens, depth {eval_depth}"
        if baseline.get("dev", {}).get("windows") != dev_how:  # selected by the held-out mix before: start over
            best, baseline["dev"] = -1.0, dict(windows=dev_how)
            if SMOLLM2_EAGLE_CHECKPOINT.exists():
                baseline["dev"].update(measure_chain(load_eagle(target, SMOLLM2_EAGLE_CHECKPOINT), dev, eval_depth))
                log(f"the shipped EAGLE head on the development requests: {baseline['dev']}")

        def save_state():
            save_eagle3(head, state_path, optimizer=opt.state_dict(), generator=g.get_state(), step=step,
                        tokens=seen, seconds=seconds, cpu_seconds=cpu, history=json.dumps(history), best_tau=best,
                        baseline=json.dumps(baseline), subset_share=st["subset_share"])

        t0, last = time.time(), None
        while time.time() - t0 < 60 * minutes and (max_steps is None or step < max_steps):
            t, c = time.time(), time.process_time()
            x, counts = eagle3_batch(tokens, answer, batch_size, block_size, g, stdlib, stdlib_share)
            features, labels = target_pass(head, x, counts)
            head.train()
            loss, record = ttt_loss(head, features, x, labels, ttt_steps)
            for group in opt.param_groups:
                group["lr"] = _lr(step, lr, warmup, max_steps)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            step, seen, seconds = step + 1, seen + x.numel(), seconds + time.time() - t
            cpu += time.process_time() - c
            last = dict(step=step, loss=round(loss.item(), 4),
                        train_top1=[round(h / max(n, 1), 4) for h, n in record])
            if step % eval_every == 0 or step == max_steps:
                head.eval()
                measured = measure_chain(head, windows, eval_depth, cached)
                on_dev = measure_chain(head, dev, eval_depth, dev_cached)
                history.append(dict(last, tokens=seen, seconds=round(seconds), cpu_seconds=round(cpu), held_out=measured,
                                    dev_requests=on_dev))
                log(f"step {step}: loss {last['loss']:.3f}, train top-1 by step {last['train_top1']}, held-out "
                    f"agreement by depth {measured['agreement_by_depth']}, chain tau {measured['chain_tau']}; "
                    f"development requests: agreement by depth {on_dev['agreement_by_depth']}, chain tau "
                    f"{on_dev['chain_tau']}; {seen / max(cpu, 1e-9):.0f} tokens per CPU second")
                if on_dev["chain_tau"] > best:
                    best = on_dev["chain_tau"]
                    export_eagle3(head, export_to, dict(
                        target="SmolLM2-135M-Instruct (frozen)", exported_step=step, tokens_seen=seen,
                        train_seconds=round(seconds), train_cpu_seconds=round(cpu), held_out=measured,
                        dev_requests=dict(on_dev, windows=dev_how), selected_by="chain tau on the development requests",
                        shipped_eagle_head=baseline,
                        data=f"SmolLM2's greedy answers to the request mix (minigpt.real.answers), "
                             f"{len(data['starts']) - n_val} conversations trained on; held out: {HELD_OUT_NOTE}"
                             + (f"; {stdlib_share:.0%} of batches standard-library code" if stdlib_share else ""),
                        held_out_how=f"the first {len(windows)} held-out conversations cut to {block_size} tokens; "
                                     f"teacher-forced chains of depth {eval_depth} at every position whose next "
                                     f"{eval_depth} tokens are answer tokens (minigpt.training.train_eagle3)",
                        vocab_subset=f"the {len(head.vocab_subset)} tokens most frequent in the training answers "
                                     f"({st['subset_share']:.1%} of their tokens)",
                        feature_layers=list(head.feature_layers), ttt_steps=ttt_steps, lr=lr, batch=[batch_size,
                                                                                                    block_size],
                        hardware=f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch "
                                 f"{torch.__version__}"))
                save_state()
            elif step % save_every == 0:
                save_state()
        save_state()
    head.eval()
    return dict(steps=step, tokens_seen=seen, train_seconds=round(seconds), train_cpu_seconds=round(cpu), last=last,
                best_chain_tau=best,
                shipped_eagle_head=baseline, state=str(state_path), exported=str(export_to) if best >= 0 else None)


def export_eagle3(head: Eagle3Head, path: Path, card: dict) -> None:
    """The head's weights in bfloat16 (loaded back as the target's dtype) with its card."""
    save_eagle3(head, path, dtype=torch.bfloat16, card=json.dumps(card))
