"""Medusa heads: extra next-next-token predictors on a frozen target, so it drafts for itself.

Cai et al. 2024 (arXiv:2401.10774). The target's own output layer predicts the token after position t from the
final hidden state h_t. Head k (k = 0, 1, ...) predicts the token k + 1 places further, from the same h_t:

    head_k(h) = W_out,k (h + SiLU(W_k h)),   W_k initialised to zero, W_out,k initialised to the target's
                                             output embedding,

so before training every head repeats the target's own next-token guess, and training
(:mod:`minigpt.training.train_heads`) only has to learn the shift. Here: the heads, saving and loading them,
and the sparse candidate tree chosen from their measured accuracies.
"""
from __future__ import annotations

import heapq
import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from .checkpoint import PACKAGE_CHECKPOINTS, CheckpointError
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

    @property
    def num_heads(self) -> int:
        """How many heads, i.e. how many positions beyond the target's own next token they predict."""
        return len(self.heads)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: (..., C) final hidden states -> logits (n_heads, ..., V)."""
        return torch.stack([head(h, self.shared_output) for head in self.heads])


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
    K, shared = heads.num_heads, heads.shared_output is not None
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
        raise CheckpointError(f"Medusa heads not found: {path} "
                              f"(train them with `python -m minigpt.training.train_heads`)")
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
