"""Train the course models on the standard-library corpus.

    python -m minigpt.training.train --preset target --minutes 60       # train (or resume) the target
    python -m minigpt.training.train --preset draft --teacher runs/target/ckpt.pt   # distil a draft from it
    python -m minigpt.training.train --preset pair --minutes 60         # both at once (the draft learns from
                                                                        # the live target)
    python -m minigpt.training.train --preset target --init minigpt/checkpoints/target.pt --copy-mix 0.5 --lr 1e-3 \
        --max-steps 400 --out runs/copy                           # go on training the target on copy-heavy text

``--copy-mix F`` draws a fraction F of every batch from :mod:`minigpt.training.copydata` (functions and paragraphs
followed by an edited copy), so that the model learns to copy from its context, the case prompt lookup needs.

A run keeps ``runs/<name>/ckpt.pt`` (weights, optimizer, step) and resumes from it when started again, so a
long schedule can be spread over several sessions. ``--export`` writes the weights alone into the package.

Distillation: the draft is trained to match the target's next-token distribution (soft cross-entropy on
the target's probabilities) rather than the raw data. Speculative decoding accepts a drafted token when the
target would have produced it, so imitating the target is exactly the draft's job.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..checkpoint import PACKAGE_CHECKPOINTS, load_model, read_checkpoint, save_checkpoint
from ..data import get_batch, load_tokens
from ..model import GPT, GPTConfig, evaluating
from ..prompts import edit_prompts
from ..tokenizer import EOT, load_tokenizer
from .copydata import copy_accuracy, copy_batch, example_starts, load_copy_tokens, repeat_accuracy


@dataclass
class Preset:
    config: GPTConfig
    lr: float = 3e-3
    batch_size: int = 32
    block_size: int = 256
    max_steps: int = 2000
    warmup: int = 50
    ship_dtype: str = "float32"  # dtype of the exported weights (a bfloat16 draft is half the download)


TRAIN_PRESETS = {
    # ~5.8M parameters: the model we speed up
    "target": Preset(GPTConfig(n_layer=6, n_head=8, n_embd=256)),
    # ~0.95M parameters, two layers: the pair's draft. Two, because a draft that can copy from its context needs
    # them (an induction head needs a layer to find the earlier occurrence and a second to read what followed
    # it); distilled from the copy-trained target
    "draft": Preset(GPTConfig(n_layer=2, n_head=4, n_embd=128)),
    # ~0.5M parameters, one thin layer: the pair's earlier draft (as few operations as possible, because on a
    # CPU a tiny model's cost is mostly per-operation overhead), kept for comparison: it cannot copy
    "draft1": Preset(GPTConfig(n_layer=1, n_head=3, n_embd=96)),
    # a draft for SmolLM2-135M (Lesson 09), trained by `python -m minigpt.real train-draft` (not by this
    # module's command) on SmolLM2's own answers: a two-layer Llama of width 128 in SmolLM2's 49152-token
    # vocabulary (two layers, since copying from the prompt as induction heads do takes two), its embedding
    # started from SmolLM2's, projected onto 128 axes
    "smollm2-draft": Preset(GPTConfig(vocab_size=49152, block_size=2048, n_layer=2, n_head=4, n_embd=128,
                                      norm="rmsnorm", pos="rope", mlp="swiglu", mlp_hidden=384, bias=False),
                            lr=2e-3, batch_size=16, block_size=256, max_steps=3000, warmup=50, ship_dtype="bfloat16"),
    # a few seconds of training, for tests
    "tiny": Preset(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64), batch_size=8, block_size=64,
                   max_steps=20, warmup=2),
}


def get_preset(name: str) -> Preset:
    if name not in TRAIN_PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(TRAIN_PRESETS)}")
    return TRAIN_PRESETS[name]


def lr_at(step: int, p: Preset) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak at ``max_steps``."""
    if step < p.warmup:
        return p.lr * (step + 1) / p.warmup
    frac = min(1.0, (step - p.warmup) / max(1, p.max_steps - p.warmup))
    return p.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model: GPT, lr: float) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]      # matrices and embeddings
    no_decay = [p for p in model.parameters() if p.dim() < 2]    # biases and LayerNorm gains
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


class Run:
    """One model being trained: its weights, optimizer, step count and history, saved under ``runs/<name>``."""

    def __init__(self, name: str, preset: Preset, out: Path, fresh: bool):
        self.name, self.preset, self.path = name, preset, out / name / "ckpt.pt"
        self.model = GPT(preset.config)
        self.opt = make_optimizer(self.model, preset.lr)
        self.step, self.tokens, self.seconds, self.history = 0, 0, 0.0, []
        if self.path.exists() and not fresh:
            ck = read_checkpoint(self.path)
            self.model.load_state_dict(ck["model"])
            self.opt.load_state_dict(ck["optimizer"])
            self.step, self.tokens, self.seconds = ck["step"], ck["tokens"], ck["seconds"]
            self.history = json.loads(ck["history"])
            print(f"[{name}] resumed at step {self.step}")

    def save(self) -> None:
        save_checkpoint(self.path, self.model, optimizer=self.opt.state_dict(), step=self.step, tokens=self.tokens,
                        seconds=self.seconds, history=json.dumps(self.history))

    def train_step(self, x, y, soft_targets: torch.Tensor | None = None) -> tuple[float, torch.Tensor]:
        logits = self.model(x)
        if soft_targets is None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        else:  # distillation: cross-entropy against the teacher's probabilities
            loss = -(soft_targets * F.log_softmax(logits, -1)).sum(-1).mean()
        self.optimize(loss, x.numel())
        return loss.item(), logits.detach()

    def optimize(self, loss: torch.Tensor, n_tokens: int) -> None:
        """One optimizer step on ``loss`` at the schedule's learning rate (gradients clipped to norm 1), which
        counts as a step and as ``n_tokens`` trained on."""
        for g in self.opt.param_groups:
            g["lr"] = lr_at(self.step, self.preset)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.step += 1
        self.tokens += n_tokens


@torch.no_grad()
def evaluate(model: GPT, val: np.ndarray, block_size: int, batches: int = 8, batch_size: int = 16) -> float:
    """Mean next-token cross-entropy (nats/token) on fixed validation windows."""
    g = torch.Generator().manual_seed(1234)
    losses = []
    with evaluating(model):
        for _ in range(batches):
            x, y = get_batch(val, batch_size, block_size, g)
            logits = model(x)
            losses.append(F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1)).item())
    return float(np.mean(losses))


def export(run: Run, val_loss: float, extra: dict | None = None) -> Path:
    """Write the weights (no optimizer) and the training facts into the package's checkpoint folder."""
    path = PACKAGE_CHECKPOINTS / f"{run.name}.pt"
    info = dict(preset=run.name, steps=run.step, tokens_seen=run.tokens, train_seconds=round(run.seconds),
                val_loss=round(val_loss, 4), params=run.model.num_params(), batch_size=run.preset.batch_size,
                block_size=run.preset.block_size, peak_lr=run.preset.lr, **(extra or {}))
    model = run.model if run.preset.ship_dtype == "float32" else \
        copy.deepcopy(run.model).to(getattr(torch, run.preset.ship_dtype))
    save_checkpoint(path, model, train_info=json.dumps(info))
    return path


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="target", help=f"one of: {', '.join(TRAIN_PRESETS)}, pair")
    ap.add_argument("--teacher", type=Path, help="checkpoint to distil from (draft preset)")
    ap.add_argument("--init", type=Path, help="start a new run from these weights (e.g. the shipped target)")
    ap.add_argument("--copy-mix", type=float, default=0.0,
                    help="fraction of each batch drawn from copy-heavy examples (minigpt.training.copydata)")
    ap.add_argument("--random-repeat", type=float, default=0.125,
                    help="share of the copy rows that are random tokens repeated (induction-head data)")
    ap.add_argument("--lr", type=float, default=None, help="peak learning rate (overrides the preset)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps (overrides the preset)")
    ap.add_argument("--minutes", type=float, default=None, help="stop after this much wall time (resumable)")
    ap.add_argument("--max-steps", type=int, default=None, help="length of the schedule (overrides the preset)")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--out", type=Path, default=Path("runs"))
    ap.add_argument("--fresh", action="store_true", help="ignore an existing run and start over")
    ap.add_argument("--export", action="store_true", help="copy the final weights into minigpt/checkpoints/")
    ap.add_argument("--export-only", action="store_true", help="export the runs as they are, without training")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        names = ["target", "draft"] if args.preset == "pair" else [args.preset]
        presets = {n: get_preset(n) for n in names}
    except ValueError as e:
        sys.exit(f"error: {e}")
    if "smollm2-draft" in names:
        sys.exit("error: the SmolLM2 draft learns from SmolLM2's answers: train it with "
                 "`python -m minigpt.real train-draft`")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if not 0.0 <= args.copy_mix <= 1.0:
        sys.exit("error: --copy-mix is a fraction between 0 and 1")
    overrides = {k: v for k, v in dict(max_steps=args.max_steps, lr=args.lr, warmup=args.warmup).items() if v}
    presets = {n: dataclasses.replace(p, **overrides) for n, p in presets.items()}
    runs = [Run(n, p, args.out, args.fresh) for n, p in presets.items()]
    if args.init is not None:
        if len(runs) != 1:
            sys.exit("error: --init goes with a single preset")
        if runs[0].step == 0:
            init = load_model(args.init, "cpu")
            if init.config != runs[0].model.config:
                sys.exit(f"error: {args.init} has another configuration than the preset {names[0]!r}")
            runs[0].model.load_state_dict(init.state_dict())
            runs[0].history.append(dict(step=0, init=str(args.init)))
    teacher = load_model(args.teacher, "cpu") if args.teacher else None
    if teacher is not None and len(runs) != 1:
        sys.exit("error: --teacher goes with a single preset (use --preset pair to train both together)")
    lead = runs[0]
    train_data, val_data = load_tokens("train"), load_tokens("val")
    copy_train = load_copy_tokens("train") if args.copy_mix else None
    copy_val = load_copy_tokens("val") if args.copy_mix else None
    n_copy = round(lead.preset.batch_size * args.copy_mix)
    if n_copy:
        copy_starts = example_starts(copy_train, load_tokenizer().encode_single_token(EOT))
    g = torch.Generator().manual_seed(args.seed + lead.step)  # a resumed run sees new batches
    t_start, budget = time.time(), (args.minutes * 60 if args.minutes else float("inf"))
    bar = tqdm(total=lead.preset.max_steps, initial=lead.step, desc=args.preset, dynamic_ncols=True)
    val = {r.name: float("nan") for r in runs}
    if args.export_only:
        budget = 0.0
        args.export = True
    while lead.step < lead.preset.max_steps and time.time() - t_start < budget:
        t0 = time.time()
        x, y = get_batch(train_data, lead.preset.batch_size - n_copy, lead.preset.block_size, g)
        if n_copy:
            cx, cy = copy_batch(copy_train, copy_starts, n_copy, lead.preset.block_size, g,
                                random_repeat=args.random_repeat, vocab_size=lead.preset.config.vocab_size)
            x, y = torch.cat([x, cx]), torch.cat([y, cy])
        soft = None
        if teacher is not None:
            with torch.no_grad():
                soft = F.softmax(teacher(x), -1)
        losses = {}
        for r in runs:  # in a pair, the target goes first and the draft learns from its fresh logits
            losses[r.name], logits = r.train_step(x, y, soft)
            if args.preset == "pair" and r.name == "target":
                soft = F.softmax(logits, -1)
        for r in runs:
            r.seconds += time.time() - t0
        if lead.step % args.eval_every == 0 or lead.step == lead.preset.max_steps:
            for r in runs:
                val[r.name] = evaluate(r.model, val_data, r.preset.block_size)
                r.history.append(dict(step=r.step, tokens=r.tokens, seconds=round(r.seconds),
                                      train_loss=round(losses[r.name], 4), val_loss=round(val[r.name], 4)))
                if copy_val is not None:
                    r.history[-1].update(copy_val_loss=round(evaluate(r.model, copy_val, r.preset.block_size), 4),
                                         copy_accuracy=round(copy_accuracy(r.model, edit_prompts(24)), 4),
                                         repeat_accuracy=round(repeat_accuracy(r.model), 4))
                    print(f"[{r.name}] step {r.step}: {r.history[-1]}", flush=True)
                r.save()
        bar.set_postfix({f"{n}_loss": f"{v:.3f}" for n, v in losses.items()} |
                        {f"{n}_val": f"{v:.3f}" for n, v in val.items()})
        bar.update(1)
    bar.close()
    for r in runs:
        if args.export_only and r.history:  # the run's last validation, measured when it was saved
            v = r.history[-1]["val_loss"]
        else:
            v = evaluate(r.model, val_data, r.preset.block_size)
        if not args.export_only:
            r.history.append(dict(step=r.step, tokens=r.tokens, seconds=round(r.seconds), val_loss=round(v, 4)))
            r.save()
        print(f"[{r.name}] step {r.step}, {r.tokens / 1e6:.1f}M tokens, {r.seconds / 60:.1f} min, val loss {v:.3f}")
        if args.export:
            hw = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
            extra = dict(hardware=hw, torch=torch.__version__, python=platform.python_version(),
                         distilled_from=("target (trained together)" if args.preset == "pair" else
                                         str(args.teacher) if args.teacher else None))
            if args.init:
                extra["continued_from"] = str(args.init)
            if args.copy_mix:
                extra.update(copy_mix=args.copy_mix, random_repeat=args.random_repeat)
            print(f"[{r.name}] exported to {export(r, v, extra)}")


if __name__ == "__main__":
    main()
