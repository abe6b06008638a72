"""Tree speculation: verify many candidate continuations in one target pass.

A chain of drafts dies at its first wrong token. A tree keeps several alternatives at uncertain positions, and
the target scores all of them at once (the tree attention mask of :mod:`.candidates`); the longest accepted
root-to-node path wins, and :func:`.verify.verify` compacts the KV cache to keep exactly that path.
"""
from __future__ import annotations

import torch

from ..cache import KVCache
from ..model import GPT
from ..sampling import SamplingConfig
from .candidates import Proposal, one_hot_q, ordered_paths
from .session import Proposer, Session, decode
from .stats import DecodeStats


@torch.no_grad()
def score_tree(model: GPT, cache: KVCache, tokens, parents, return_hidden: bool = False):
    """One pass of ``model`` over a flattened tree placed after the cache; returns logits (N, V), and the final
    hidden states (N, C) too with ``return_hidden``. The cache grows by N; the caller crops or compacts it."""
    tree = Proposal(list(tokens), list(parents))  # its mask and positions, as verify() builds them
    out = model(torch.tensor([tree.tokens], device=model.device), cache=cache,
                position_ids=tree.position_ids(cache.length).to(model.device),
                attn_mask=tree.attention_mask().to(model.device), return_hidden=return_hidden)
    return (out[0][0], out[1][0]) if return_hidden else out[0]


@torch.no_grad()
def draft_tree(draft: GPT, cache: KVCache, root: int, cfg: SamplingConfig, budget: int = 16, max_depth: int = 6,
               branch: int = 2, threshold: float = 0.6, paths=None):
    """Grow a tree of candidates with the draft model.

    Level by level: the draft scores the whole tree so far in one pass; a frontier node where the draft is
    confident (top probability >= ``threshold``) gets one child, an uncertain one gets its top-``branch``
    tokens, until ``budget`` nodes (besides the root) or ``max_depth`` levels. With ``paths`` (see
    :func:`~.candidates.tree_from_paths`) the shape is fixed instead and the ranks pick the draft's top tokens.
    Children are the draft's top tokens (deterministic), so their proposal distributions q are one-hot.
    The draft cache is left as it was. Returns (tokens, parents, q (N, V), number of draft passes)."""
    start = cache.length
    tokens, parents, frontier = [root], [-1], [0]
    shape = None
    if paths is not None:
        shape = {}
        for p in ordered_paths(paths):
            shape.setdefault(p[:-1], []).append(p[-1])
        where = {0: ()}
    passes = 0
    for _ in range(max_depth):
        if not frontier or len(tokens) - 1 >= budget:
            break
        logits = score_tree(draft, cache, tokens, parents)
        passes += 1
        cache.crop(start)
        new_frontier = []
        for node in frontier:
            probs = cfg.probs(logits[node]) if not cfg.greedy else torch.softmax(logits[node].float(), -1)
            if shape is not None:
                ranks = shape.get(where[node], [])
            else:
                ranks = range(1 if float(probs.max()) >= threshold else branch)
            top = torch.topk(probs, max(ranks, default=-1) + 1).indices.tolist() if ranks else []
            for r in ranks:
                if len(tokens) - 1 >= budget or probs[top[r]] <= 0:
                    break
                tokens.append(top[r])
                parents.append(node)
                new_frontier.append(len(tokens) - 1)
                if shape is not None:
                    where[len(tokens) - 1] = where[node] + (r,)
        frontier = new_frontier
    return tokens, parents, one_hot_q(tokens, draft.config.vocab_size), passes


class DraftTree(Proposer):
    """The draft model grows a token tree each round (:func:`draft_tree`, same parameters)."""

    def __init__(self, draft: GPT, budget: int = 16, max_depth: int = 6, branch: int = 2, threshold: float = 0.6,
                 paths=None):
        self.draft, self.budget, self.max_depth = draft, budget, max_depth
        self.branch, self.threshold, self.paths = branch, threshold, paths
        self.max_width = 1 + (budget if paths is None else len(paths))

    def propose(self, session: Session, room: int) -> Proposal:
        behind = session.seq[session.draft_cache.length:-1]  # accepted tokens the draft has not seen (not the root)
        if behind:
            self.draft(torch.tensor([behind], device=self.draft.device), cache=session.draft_cache)
        tokens, parents, _, passes = draft_tree(self.draft, session.draft_cache, session.seq[-1], session.sampling,
                                                self.budget, min(self.max_depth, room), self.branch,
                                                self.threshold, self.paths)
        return Proposal(tokens, parents, draft_passes=passes)  # top-k children: deterministic, one-hot q


def tree_generate(target: GPT, draft: GPT, prompt, max_new_tokens: int, budget: int = 16, max_depth: int = 6,
                  branch: int = 2, threshold: float = 0.6, paths=None, temperature: float = 0.0,
                  top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                  eos_id: int | None = None, stats: DecodeStats | None = None,
                  on_tokens=None) -> tuple[list[int], DecodeStats]:
    """Speculative decoding with a draft-model token tree per round (:class:`DraftTree`); returns (new token
    ids, statistics). on_tokens: called with each round's tokens (streaming); ``stats.from_draft`` marks the
    drafted ones."""
    proposer = DraftTree(draft, budget, max_depth, branch, threshold, paths)
    return decode(target, prompt, max_new_tokens, proposer, temperature, top_k, top_p, seed, eos_id, stats, on_tokens)
