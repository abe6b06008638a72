"""What a trained EAGLE head (:mod:`minigpt.eagle_head`) has learned, measured on held-out text.

* :func:`head_agreement`  -- how often the head's top guess is the target's own choice, and how close its
  predicted features come to the true ones (beside Medusa's head 0 on the same positions, if given);
* :func:`input_ablation`  -- the same agreement with the head's inputs withheld: the token x_{t+1} replaced,
  the earlier entries hidden (each entry run alone), or both;
* :func:`rank_hit_rates`  -- how often the target's choice is the head's rank-r guess, and :class:`StaticEagle`,
  EAGLE-1's static tree built from those rates (Li et al. 2024), to set beside EAGLE-2's dynamic one;
* :func:`eagle_round`     -- one real round with every node's path probability under the head;
* :class:`TimedEagle`     -- the library's proposer with a stopwatch around its drafting.

Every "agreement" here is against the target's argmax at t + 1 after the *true* x_{t+1}: what greedy
verification accepts. The windows are :func:`held_out_windows`, the ones :func:`~.train_eagle.eagle_top1` uses.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from ..cache import KVCache
from ..data import get_batch
from ..decoding.candidates import Proposal, ordered_paths
from ..decoding.eagle import Eagle
from ..decoding.session import Session
from ..decoding.verify import Verified, verify
from ..device import synchronize
from ..eagle_head import EagleHead
from ..model import GPT

WINDOW_SEED = 4321  # eagle_top1's windows


def held_out_windows(data: np.ndarray, batches: int = 2, batch_size: int = 4, block_size: int = 256) -> list[torch.Tensor]:
    """``batches`` fixed random windows (B, T) of ``data`` (token ids): the ones :func:`eagle_top1` scores."""
    g = torch.Generator().manual_seed(WINDOW_SEED)
    return [get_batch(data, batch_size, block_size, g)[0] for _ in range(batches)]


@torch.no_grad()
def head_agreement(target: GPT, head: EagleHead, windows, medusa_heads=None) -> dict:
    """On every position of ``windows``: the share where the head's top guess for x_{t+2} (from the true f_t
    and x_{t+1}) is the target's own choice (``"eagle"``), Medusa's head 0's share on the same positions (from
    f_t alone; ``"medusa"``, when ``medusa_heads`` is given), the mean cosine between the predicted and the
    true f_{t+1} (``"cos_predicted"``) and between f_t and f_{t+1} (``"cos_copy"``: "the next feature is this
    one"), and the number of ``"positions"``."""
    hits, medusa_hits, n, cos_pred, cos_copy = 0, 0, 0, [], []
    for x in windows:
        x = x.to(target.device)
        f = target.hidden_states(x)                       # (B, T, C): f_t
        want = target.lm_head(f[:, 1:]).argmax(-1)        # the target's choice of x_{t+2}
        pred = head(f[:, :-1], x[:, 1:])                  # (B, T-1, C): predicted f_{t+1}
        hits += int((head.token_ids(head.logits(pred).argmax(-1)) == want).sum())
        if medusa_heads is not None:
            medusa_hits += int((medusa_heads(f[:, :-1])[0].argmax(-1) == want).sum())
        n += want.numel()
        cos_pred.append(torch.cosine_similarity(pred, f[:, 1:], dim=-1).flatten())
        cos_copy.append(torch.cosine_similarity(f[:, :-1], f[:, 1:], dim=-1).flatten())
    out = dict(eagle=hits / n, positions=n, cos_predicted=float(torch.cat(cos_pred).mean()),
               cos_copy=float(torch.cat(cos_copy).mean()))
    if medusa_heads is not None:
        out["medusa"] = medusa_hits / n
    return out


def token_swapped(head: EagleHead, feats: torch.Tensor, toks: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """Entry t reads ``other[:, t]`` in place of x_{t+1} and attends to the earlier entries exactly as the head
    has them (the true ones, cached first); feats (B, n, C), toks and other (B, n). Returns (B, n, C)."""
    B, n = toks.shape
    dev = feats.device
    cache = KVCache.for_model(head, batch_size=B, max_len=2 * n)
    head(feats, toks, cache=cache)                                            # the true entries 0 .. n-1
    sees = torch.cat([torch.ones(n, n, dtype=torch.bool, device=dev).tril(-1),  # the cached entries before t
                      torch.eye(n, dtype=torch.bool, device=dev)], dim=1)       # and itself
    return head(feats, other, cache=cache, position_ids=torch.arange(n, device=dev), attn_mask=sees)


def entries_alone(head: EagleHead, feats: torch.Tensor, toks: torch.Tensor) -> torch.Tensor:
    """Every entry on its own: T = 1, no cache, at its own position t, so no earlier entry to attend to."""
    return torch.cat([head(feats[:, t:t + 1], toks[:, t:t + 1], position_ids=torch.tensor([t], device=feats.device))
                      for t in range(feats.shape[1])], dim=1)


@torch.no_grad()
def input_ablation(target: GPT, head: EagleHead, windows, fixed_token: int, medusa_heads=None) -> dict:
    """The head's agreement with the target (as in :func:`head_agreement`) with its inputs withheld.

    ``"table"[(token, context)]``: token is ``"x_(t+1)"`` (as trained), ``"x_t"`` (the token already inside f_t
    in its place) or ``"fixed"`` (``fixed_token`` everywhere); context is ``"context"`` (the earlier entries
    kept) or ``"alone"`` (each entry run alone). ``"own"``: the share of positions where x_{t+1} was the
    target's own top choice at t; ``"split"[name] = (agreement there, agreement elsewhere)`` for the head as
    trained and, if given, Medusa's head 0."""
    tokens = {"x_(t+1)": lambda x: x[:, 1:], "x_t": lambda x: x[:, :-1],
              "fixed": lambda x: torch.full_like(x[:, 1:], fixed_token)}
    hits = {(k, c): 0 for k in tokens for c in ("context", "alone")}
    split = {name: [0, 0] for name in (["EAGLE head"] + (["Medusa head 0"] if medusa_heads is not None else []))}
    n = n_own = 0
    for x in windows:
        x = x.to(target.device)
        f = target.hidden_states(x)
        feats, want = f[:, :-1], target.lm_head(f[:, 1:]).argmax(-1)
        own = target.lm_head(feats).argmax(-1) == x[:, 1:]          # f_t's top choice was the token that came
        right = {}
        for k, make in tokens.items():
            other = make(x)
            with_context = head(feats, other) if k == "x_(t+1)" else token_swapped(head, feats, x[:, 1:], other)
            for c, pred in (("context", with_context), ("alone", entries_alone(head, feats, other))):
                right[k, c] = head.token_ids(head.logits(pred).argmax(-1)) == want
                hits[k, c] += int(right[k, c].sum())
        rights = [right["x_(t+1)", "context"]]
        if medusa_heads is not None:
            rights.append(medusa_heads(feats)[0].argmax(-1) == want)
        for name, r in zip(split, rights):
            split[name][0] += int(r[own].sum())
            split[name][1] += int(r[~own].sum())
        n, n_own = n + want.numel(), n_own + int(own.sum())
    return dict(table={key: h / n for key, h in hits.items()}, own=n_own / n, positions=n,
                split={name: (a / max(n_own, 1), b / max(n - n_own, 1)) for name, (a, b) in split.items()})


@torch.no_grad()
def rank_hit_rates(target: GPT, head: EagleHead, windows, max_rank: int = 10) -> torch.Tensor:
    """(max_rank,): how often the target's choice is the head's rank-r guess (r = 0: its top guess)."""
    hits, n = torch.zeros(max_rank), 0
    for x in windows:
        x = x.to(target.device)
        f = target.hidden_states(x)
        want = target.lm_head(f[:, 1:]).argmax(-1)
        ranked = head.token_ids(head.logits(head(f[:, :-1], x[:, 1:])).topk(max_rank, dim=-1).indices)
        hits += (ranked == want[..., None]).float().sum(dim=(0, 1)).cpu()
        n += want.numel()
    return hits / n


class StaticEagle(Eagle):
    """EAGLE-1's static tree: a fixed set of rank paths (e.g. ``(0, 1)`` = "the head's top guess, then its
    second guess after it"), filled every round with the head's guesses. It runs the head once per internal
    node (a chain from the root down to it), so only its tokens per pass are meaningful, not its speed."""

    def __init__(self, head: EagleHead, paths):
        super().__init__(head, depth=max(map(len, paths)), top_k=1, total_tokens=len(paths))
        self.paths = ordered_paths(paths)

    def propose(self, session: Session, room: int) -> Proposal:
        root = session.seq[-1]
        f_root = self._catch_up(session)                        # the library's catch-up, as EAGLE-2's
        if f_root is None or room < 1:
            return Proposal([root], [-1], draft_passes=int(f_root is not None))
        base = self.cache.length
        feature, index, tokens, parents, passes = {(): f_root}, {(): 0}, [root], [-1], 1
        for path in self.paths:                                 # shorter paths first: parents before children
            parent = path[:-1]
            if len(path) > room or parent not in index:
                continue
            if parent not in feature:                           # the parent's predicted feature: one head call
                chain = [parent[:k] for k in range(len(parent))]  # the parent's ancestors, root first
                out = self.head(torch.stack([feature[a] for a in chain])[None],
                                torch.tensor([[tokens[index[a]] for a in chain[1:] + [parent]]], device=f_root.device),
                                cache=self.cache)
                self.cache.crop(base)
                feature[parent], passes = out[0, -1], passes + 1
            index[path] = len(tokens)
            ranked = self.head.logits(feature[parent]).topk(path[-1] + 1).indices
            tokens.append(int(self.head.token_ids(ranked[-1])))
            parents.append(index[parent])
        return Proposal(tokens, parents, draft_passes=passes)


def path_to(node: int, parents) -> list[int]:
    """The nodes from the root's child down to ``node`` (the root itself, node 0, excluded)."""
    out = []
    while node > 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


@torch.no_grad()
def eagle_round(target: GPT, head: EagleHead, prompt, max_new_tokens: int, depth: int, top_k: int,
                total_tokens: int) -> tuple[Proposal, list[float], Verified]:
    """One EAGLE round right after ``prompt``: (the proposal, each node's path probability under the head --
    1 for the root --, the verified outcome). The probabilities are recomputed node by node, each path run as
    a chain after the head's real entries: the same inputs the tree gave it."""
    session = Session(target, prompt, max_new_tokens, needs_hidden=True, max_width=1 + total_tokens)
    proposer = Eagle(head, depth, top_k, total_tokens)
    proposal = proposer.propose(session, max_new_tokens - 1)
    base = proposer.cache.length                                # the head's real entries (the prompt's pairs)
    dev = target.device
    f_root = head(session.new_hidden[None], torch.tensor([session.seq[1:]], device=dev))[0, -1]
    probs = [1.0]
    for i in range(1, len(proposal.tokens)):
        path_tokens = [proposal.tokens[k] for k in path_to(i, proposal.parents)]
        log_p, feat = 0.0, f_root
        for j, t in enumerate(path_tokens):
            logq = torch.log_softmax(head.logits(feat).float(), -1)
            ids = head.token_ids(torch.arange(logq.shape[-1], device=dev))
            log_p += float(logq[(ids == t).nonzero()[0, 0]])
            if j + 1 < len(path_tokens):
                feat = head(feat[None, None], torch.tensor([[t]], device=dev), cache=proposer.cache)[0, -1]
        proposer.cache.crop(base)
        probs.append(math.exp(log_p))
    return proposal, probs, verify(target, session.cache, proposal, session.rule)


class TimedEagle(Eagle):
    """The library's proposer (EAGLE-2's dynamic tree) with a stopwatch around each proposal: ``seconds``
    accumulates the drafting time (the head's catch-up, its passes over the tree's levels, the tree's
    bookkeeping), synchronised on the head's device."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds = 0.0

    def propose(self, session: Session, room: int) -> Proposal:
        device = self.head.fuse.weight.device
        synchronize(device)
        t0 = time.perf_counter()
        proposal = super().propose(session, room)
        synchronize(device)
        self.seconds += time.perf_counter() - t0
        return proposal
