"""Medusa heads: extra next-next-token predictors on a frozen target, so it drafts for itself.

Cai et al. 2024 (arXiv:2401.10774). The target's own output layer predicts the token after position t from the
final hidden state h_t. Head k (k = 0, 1, ...) predicts the token k + 1 places further, from the same h_t:

    head_k(h) = W_out,k (h + SiLU(W_k h)),   W_k initialised to zero, W_out,k initialised to the target's
                                             output embedding,

so before training every head repeats the target's own next-token guess, and training only has to learn the
shift. The target stays frozen; the loss of head k is weighted by lambda^k (far heads are harder and noisier).

    python -m minigpt.medusa --minutes 15 --write    # train heads for the shipped target, measure, ship
"""
from __future__ import annotations

import argparse
import heapq
import json
import math
import platform
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .checkpoint import PACKAGE_CHECKPOINTS, CheckpointError, read_checkpoint
from .copydata import load_copy_tokens
from .model import GPT

MEDUSA_CHECKPOINT = PACKAGE_CHECKPOINTS / "medusa.pt"


class MedusaHead(nn.Module):
    """One head: a residual SiLU block and an output projection (its own, or the target's shared one)."""

    def __init__(self, n_embd: int, vocab_size: int, own_output: bool = True):
        super().__init__()
        self.fc = nn.Linear(n_embd, n_embd)
        nn.init.zeros_(self.fc.weight)   # the block starts as the identity
        nn.init.zeros_(self.fc.bias)
        self.out = nn.Linear(n_embd, vocab_size, bias=False) if own_output else None

    def forward(self, h: torch.Tensor, shared_output: nn.Module | None = None) -> torch.Tensor:
        z = h + F.silu(self.fc(h))
        return (self.out if self.out is not None else shared_output)(z)  # (..., C) -> (..., V)


class MedusaHeads(nn.Module):
    """``n_heads`` heads; head k predicts the token k + 2 positions after the hidden state's own token.

    With ``shared_output`` (the target's output layer) the heads have no output matrices of their own and
    all read out through the target's, frozen: for a large vocabulary (SmolLM2: 49152 x 576 = 28M numbers per
    matrix) that keeps the heads small enough to train and ship. The shared layer is not part of the heads'
    parameters or state dict."""

    def __init__(self, n_embd: int, vocab_size: int, n_heads: int = 4, shared_output: nn.Module | None = None):
        super().__init__()
        self.heads = nn.ModuleList(MedusaHead(n_embd, vocab_size, own_output=shared_output is None)
                                   for _ in range(n_heads))
        self.__dict__["shared_output"] = shared_output  # deliberately not registered as a submodule

    @classmethod
    def for_target(cls, target: GPT, n_heads: int = 4, share_output: bool = False) -> "MedusaHeads":
        heads = cls(target.config.n_embd, target.config.vocab_size, n_heads,
                    shared_output=target.lm_head if share_output else None)
        if not share_output:
            for head in heads.heads:  # start from the target's own output embedding
                head.out.weight.data.copy_(target.lm_head.weight.data)
        return heads.to(target.device)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: (..., C) final hidden states -> logits (n_heads, ..., V)."""
        return torch.stack([head(h, self.shared_output) for head in self.heads])


def medusa_loss(head_logits: torch.Tensor, idx: torch.Tensor, decay: float = 0.8) -> tuple[torch.Tensor, list[float]]:
    """Weighted cross-entropy of every head. head_logits: (K, B, T, V) from hidden states of ``idx`` (B, T).

    Head k at position t is scored against idx[t + k + 2]; positions without such a token are skipped."""
    K, B, T, V = head_logits.shape
    total, per_head = 0.0, []
    for k in range(K):
        shift = k + 2
        if T <= shift:
            break
        loss = F.cross_entropy(head_logits[k, :, :T - shift].reshape(-1, V), idx[:, shift:].reshape(-1))
        total = total + decay ** k * loss
        per_head.append(loss.item())
    return total, per_head


@torch.no_grad()
def head_accuracy(target: GPT, heads: MedusaHeads, data, block_size: int = 256, batches: int = 8,
                  batch_size: int = 8, max_rank: int = 10) -> torch.Tensor:
    """rank_acc[k, r]: how often head k's rank-r prediction (0 = its top choice) is the true token, on held-out
    windows of ``data``. top-1 accuracy is rank_acc[k, 0]; top-5 is rank_acc[k, :5].sum()."""
    from .data import get_batch
    g = torch.Generator().manual_seed(4321)
    K = len(heads.heads)
    hits, count = torch.zeros(K, max_rank), torch.zeros(K)
    for _ in range(batches):
        x, _ = get_batch(data, batch_size, block_size - 1, g)
        x = x.to(target.device)
        h = target.hidden_states(x)
        logits = heads(h)  # (K, B, T, V)
        T = x.shape[1]
        for k in range(K):
            shift = k + 2
            top = logits[k, :, :T - shift].topk(max_rank, dim=-1).indices      # (B, T-shift, R)
            truth = x[:, shift:, None]
            hits[k] += (top == truth).float().sum(dim=(0, 1)).cpu()
            count[k] += truth.numel()
    return hits / count[:, None]


def sparse_tree_paths(rank_acc: torch.Tensor, budget: int = 16, max_branch: int = 10) -> list[tuple[int, ...]]:
    """The ``budget`` candidate paths with the largest expected acceptance, as in the Medusa paper.

    A path (r_1, ..., r_d) takes head 0's rank-r_1 token, then head 1's rank-r_2 token, ...; assuming heads
    are right independently, it survives verification with probability prod_d rank_acc[d-1, r_d]. Every
    prefix of a path is at least as likely as the path, so greedily taking the most likely paths always
    yields a tree (each path's parent is already in it)."""
    K, R = rank_acc.shape
    R = min(R, max_branch)
    chosen: list[tuple[int, ...]] = []
    frontier = [(-float(rank_acc[0, r]), (r,)) for r in range(R)]
    heapq.heapify(frontier)
    while frontier and len(chosen) < budget:
        neg, path = heapq.heappop(frontier)
        chosen.append(path)
        if len(path) < K:
            for r in range(R):
                heapq.heappush(frontier, (neg * float(rank_acc[len(path), r]), path + (r,)))
    return chosen


def expected_accept_length(paths, rank_acc: torch.Tensor) -> float:
    """Expected number of accepted candidate tokens per round for a tree of ``paths`` (under independence):
    the sum over nodes of the probability that the node's whole path is right."""
    return sum(math.prod(float(rank_acc[d, r]) for d, r in enumerate(p)) for p in paths)


def save_heads(heads: MedusaHeads, path: Path = MEDUSA_CHECKPOINT, **extra) -> None:
    K, shared = len(heads.heads), heads.shared_output is not None
    n_embd = heads.heads[0].fc.in_features
    vocab = (heads.shared_output if shared else heads.heads[0].out).out_features
    tmp = Path(path).with_suffix(".tmp")
    config = dict(n_heads=K, n_embd=n_embd, vocab_size=vocab, shared_output=shared)
    torch.save({"config": config, "heads": heads.state_dict(), **extra}, tmp)
    tmp.replace(path)


def load_heads(target: GPT, path: Path | str = MEDUSA_CHECKPOINT) -> MedusaHeads:
    """The Medusa heads saved at ``path`` (default: those shipped for the shipped target)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"Medusa heads not found: {path} (train them with `python -m minigpt.medusa`)")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
        cfg = ck["config"]
        heads = MedusaHeads(cfg["n_embd"], cfg["vocab_size"], cfg["n_heads"],
                            shared_output=target.lm_head if cfg.get("shared_output") else None)
        heads.load_state_dict(ck["heads"])
    except Exception as e:
        raise CheckpointError(f"cannot load Medusa heads from {path}: {str(e).splitlines()[0]}") from None
    if cfg["n_embd"] != target.config.n_embd or cfg["vocab_size"] != target.config.vocab_size:
        raise CheckpointError(f"Medusa heads in {path} are for width {cfg['n_embd']} / vocabulary "
                              f"{cfg['vocab_size']}, not this target's {target.config.n_embd} / {target.config.vocab_size}")
    return heads.to(target.device).eval()


def load_medusa(target: GPT, budget: int = 16, path: Path | str = MEDUSA_CHECKPOINT):
    """The shipped heads and their sparse candidate tree (chosen from the head accuracies measured on held-out
    files when the heads were trained, stored beside them): returns (heads, paths)."""
    heads = load_heads(target, path)
    ck = torch.load(path, map_location="cpu", weights_only=True)
    if "rank_accuracy" not in ck:
        raise CheckpointError(f"{path} has no measured head accuracies to build a tree from")
    return heads, sparse_tree_paths(ck["rank_accuracy"], budget)


def train_heads(target: GPT, heads: MedusaHeads, minutes: float, lr: float = 1e-3, batch_size: int = 16,
                block_size: int = 256, decay: float = 0.8, eval_every: int = 50, data=None,
                progress: bool = True) -> dict:
    """Train ``heads`` with the target frozen, for ``minutes`` of wall time, on ``data`` (token ids; default:
    the training split of the corpus in the course tokenizer). ``progress=False``: no progress bar (lessons,
    whose saved outputs must not keep one)."""
    from tqdm.auto import tqdm
    from .data import get_batch, load_tokens
    train = load_tokens("train") if data is None else data
    was_trainable = [p.requires_grad for p in target.parameters()]
    target.eval().requires_grad_(False)
    heads.train()
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(7)
    t0, step, tokens, history = time.time(), 0, 0, []
    bar = tqdm(desc="medusa heads", unit="step", disable=not progress)
    while time.time() - t0 < minutes * 60:
        x, _ = get_batch(train, batch_size, block_size, g)
        x = x.to(target.device)
        with torch.no_grad():
            h = target.hidden_states(x)  # the frozen target's final hidden states (no logits needed)
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
    for p, flag in zip(target.parameters(), was_trainable):  # leave the caller's target as it was
        p.requires_grad_(flag)
    return dict(steps=step, tokens_seen=tokens, train_seconds=round(time.time() - t0), lr=lr, decay=decay,
                batch_size=batch_size, block_size=block_size, history=history)


def main(argv=None) -> None:
    from .checkpoint import load_model, load_pretrained
    from .data import load_tokens
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
    ap.add_argument("--copy-data", action="store_true",
                    help="train on the corpus and the copy-heavy examples of minigpt.copydata, joined")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(args.target, "cpu") if args.target else load_pretrained("target", "cpu")
    heads = load_heads(target) if args.resume else MedusaHeads.for_target(target, args.heads)
    data = None
    if args.copy_data:
        data = np.concatenate([load_tokens("train"), load_copy_tokens("train")])
    info = train_heads(target, heads, args.minutes, data=data)
    acc = head_accuracy(target, heads, load_tokens("val"))
    card = dict(
        target="minigpt/checkpoints/target.pt (frozen)",
        data="training split of the standard-library corpus" + (" and its copy-heavy examples (minigpt.copydata)"
                                                               if args.copy_data else ""),
        n_heads=len(heads.heads), **{k: v for k, v in info.items() if k != "history"},
        hardware=f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}",
        held_out_top1=[round(float(a[0]), 4) for a in acc], held_out_top5=[round(float(a[:5].sum()), 4) for a in acc],
        rank_accuracy=[[round(float(v), 4) for v in row] for row in acc], history=info["history"])
    print(json.dumps({k: v for k, v in card.items() if k not in ("rank_accuracy", "history")}, indent=1))
    if args.write:
        args.out.mkdir(parents=True, exist_ok=True)
        save_heads(heads, args.out / MEDUSA_CHECKPOINT.name, rank_accuracy=acc)
        (args.out / "medusa_card.json").write_text(json.dumps(card, indent=1) + "\n")


if __name__ == "__main__":
    main()
