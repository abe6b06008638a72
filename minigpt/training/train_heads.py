"""Training Medusa heads (:mod:`minigpt.medusa_heads`) on a frozen target, and measuring how often they are right.

The target stays frozen; head k is trained to predict the token k + 2 places after each hidden state's own
token, and its loss is weighted by lambda^k (far heads are harder and noisier). Two targets for that prediction:
the text's own token (Medusa-1's recipe, :func:`medusa_loss`), or the target's distribution there
(self-distillation, Medusa-2's recipe and EAGLE's token loss, :func:`medusa_distill_loss`): under greedy
verification a head is right when it names the *target's* choice, whatever the text says.

    python -m minigpt.training.train_heads --minutes 15 --write             # train heads, measure, ship
    python -m minigpt.training.train_heads --minutes 40 --distill --copy-data --write   # on the target's distribution
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..checkpoint import PACKAGE_CHECKPOINTS, load_model, load_pretrained
from ..data import get_batch, load_tokens
from ..medusa_heads import MEDUSA_CHECKPOINT, MedusaHeads, load_heads, save_heads
from ..model import GPT, frozen
from .copydata import load_copy_tokens


def weighted_head_losses(head_logits: torch.Tensor, first_shift: int, loss_at,
                         decay: float = 0.8) -> tuple[torch.Tensor, list[float]]:
    """The heads' loss, weighted decay^k: head k at positions t = 0 .. T - shift - 1 with shift = first_shift + k,
    scored by ``loss_at(logits (B, T - shift, V), shift)``; a head with no such position (T <= shift) and every
    later one are skipped. Returns (the weighted sum, each head's loss)."""
    K, B, T, V = head_logits.shape
    total, per_head = 0.0, []
    for k in range(K):
        shift = first_shift + k
        if T <= shift:
            break
        loss = loss_at(head_logits[k, :, :T - shift], shift)
        total = total + decay ** k * loss
        per_head.append(loss.item())
    return total, per_head


def medusa_loss(head_logits: torch.Tensor, idx: torch.Tensor, decay: float = 0.8) -> tuple[torch.Tensor, list[float]]:
    """Weighted cross-entropy of every head. head_logits: (K, B, T, V) from hidden states of ``idx`` (B, T).

    Head k at position t is scored against idx[t + k + 2]; positions without such a token are skipped."""
    V = head_logits.shape[-1]
    return weighted_head_losses(
        head_logits, 2, lambda logits, shift: F.cross_entropy(logits.reshape(-1, V), idx[:, shift:].reshape(-1)),
        decay)


def medusa_distill_loss(head_logits: torch.Tensor, target_logits: torch.Tensor,
                        decay: float = 0.8) -> tuple[torch.Tensor, list[float]]:
    """Self-distillation: head k at position t against the target's own distribution of the token k + 2 places
    ahead, which the target computes at position t + k + 1 (on the true text before it). head_logits:
    (K, B, T, V); target_logits: (B, T, V). Cross-entropy with the target's probabilities, weighted by decay^k."""
    def against_target(logits, shift):
        p = torch.softmax(target_logits[:, shift:].float(), -1)
        return -(p * torch.log_softmax(logits.float(), -1)).sum(-1).mean()
    return weighted_head_losses(head_logits, 1, against_target, decay)


@torch.no_grad()
def head_accuracy(target: GPT, heads: MedusaHeads, data, block_size: int = 256, batches: int = 8,
                  batch_size: int = 8, max_rank: int = 10, reference: str = "text") -> torch.Tensor:
    """rank_acc[k, r]: how often head k's rank-r prediction (0 = its top choice) is right, on held-out windows of
    ``data``: the text's own token k + 2 places ahead (``reference="text"``), or the target's choice there, its
    argmax at position t + k + 1 (``"target"``: what greedy verification accepts). top-1 accuracy is
    rank_acc[k, 0]; top-5 is rank_acc[k, :5].sum()."""
    if reference not in ("text", "target"):
        raise ValueError(f"reference must be 'text' or 'target', got {reference!r}")
    g = torch.Generator().manual_seed(4321)
    K = heads.num_heads
    hits, count = torch.zeros(K, max_rank), torch.zeros(K)
    for _ in range(batches):
        x, _ = get_batch(data, batch_size, block_size - 1, g)
        x = x.to(target.device)
        h = target.hidden_states(x)
        logits = heads(h)  # (K, B, T, V)
        choice = target.lm_head(h).argmax(-1) if reference == "target" else None   # (B, T): the target's picks
        T = x.shape[1]
        for k in range(K):
            shift = k + 2
            top = logits[k, :, :T - shift].topk(max_rank, dim=-1).indices      # (B, T-shift, R)
            truth = x[:, shift:, None] if choice is None else choice[:, shift - 1:T - 1, None]
            hits[k] += (top == truth).float().sum(dim=(0, 1)).cpu()
            count[k] += truth.numel()
    return hits / count[:, None]


def train_heads(target: GPT, heads: MedusaHeads, minutes: float, lr: float = 1e-3, batch_size: int = 16,
                block_size: int = 256, decay: float = 0.8, eval_every: int = 50, data=None,
                progress: bool = True, distill: bool = False) -> dict:
    """Train ``heads`` with the target frozen, for ``minutes`` of wall time, on ``data`` (token ids; default:
    the training split of the corpus in the course tokenizer). ``distill``: against the target's distribution
    (:func:`medusa_distill_loss`) instead of the text's tokens. ``progress=False``: no progress bar (lessons,
    whose saved outputs must not keep one)."""
    train = load_tokens("train") if data is None else data
    with frozen(target):  # the target is read, never trained; given back as it came
        heads.train()
        opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
        g = torch.Generator().manual_seed(7)
        t0, step, tokens, history = time.time(), 0, 0, []
        bar = tqdm(desc="medusa heads", unit="step", disable=not progress)
        while time.time() - t0 < minutes * 60:
            x, _ = get_batch(train, batch_size, block_size, g)
            x = x.to(target.device)
            with torch.no_grad():
                h = target.hidden_states(x)  # the frozen target's final hidden states
            if distill:
                with torch.no_grad():
                    want = target.lm_head(h)
                loss, per_head = medusa_distill_loss(heads(h), want, decay)
            else:
                loss, per_head = medusa_loss(heads(h), x, decay)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            tokens += x.numel()
            if step % eval_every == 0:
                history.append(dict(step=step, per_head_loss=[round(v, 3) for v in per_head]))
            bar.set_postfix(loss=f"{loss.item():.3f}", heads=" ".join(f"{v:.2f}" for v in per_head))
            bar.update(1)
        bar.close()
        heads.eval()
    return dict(steps=step, tokens_seen=tokens, train_seconds=round(time.time() - t0), lr=lr, decay=decay,
                batch_size=batch_size, block_size=block_size, distilled=distill, history=history)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--resume", action="store_true", help="continue from the shipped heads")
    ap.add_argument("--write", action="store_true", help="save into minigpt/checkpoints/ with a card")
    ap.add_argument("--target", type=Path, default=None,
                    help="train for this target checkpoint instead of the shipped one (e.g. a run's ckpt.pt)")
    ap.add_argument("--out", type=Path, default=PACKAGE_CHECKPOINTS,
                    help="folder --write saves medusa.pt and medusa_card.json into (default: the package's)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--distill", action="store_true",
                    help="train against the target's distribution (self-distillation) instead of the text's tokens")
    ap.add_argument("--copy-data", action="store_true",
                    help="train on the corpus and the copy-heavy examples of minigpt.training.copydata, joined")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(args.target, "cpu") if args.target else load_pretrained("target", "cpu")
    heads = load_heads(target) if args.resume else MedusaHeads.for_target(target, args.heads)
    data = None
    if args.copy_data:
        data = np.concatenate([load_tokens("train"), load_copy_tokens("train")])
    info = train_heads(target, heads, args.minutes, data=data, distill=args.distill)
    acc = head_accuracy(target, heads, load_tokens("val"))
    agree = head_accuracy(target, heads, load_tokens("val"), reference="target")
    card = dict(
        target="minigpt/checkpoints/target.pt (frozen)",
        data="training split of the standard-library corpus"
             + (" and its copy-heavy examples (minigpt.training.copydata)" if args.copy_data else ""),
        n_heads=heads.num_heads, **{k: v for k, v in info.items() if k != "history"},
        hardware=f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}",
        held_out_top1=[round(float(a[0]), 4) for a in acc], held_out_top5=[round(float(a[:5].sum()), 4) for a in acc],
        held_out_top1_vs_target=[round(float(a[0]), 4) for a in agree],
        # the sparse tree is built from these: for distilled heads, their agreement with the target's choices
        rank_accuracy_reference="target" if args.distill else "text",
        rank_accuracy=[[round(float(v), 4) for v in row] for row in (agree if args.distill else acc)],
        history=info["history"])
    print(json.dumps({k: v for k, v in card.items() if k not in ("rank_accuracy", "history")}, indent=1))
    if args.write:
        args.out.mkdir(parents=True, exist_ok=True)
        save_heads(heads, args.out / MEDUSA_CHECKPOINT.name, rank_accuracy=agree if args.distill else acc)
        (args.out / "medusa_card.json").write_text(json.dumps(card, indent=1) + "\n")


if __name__ == "__main__":
    main()
