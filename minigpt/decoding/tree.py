"""Tree speculation: verify many candidate continuations in one target pass.

A chain of drafts dies at its first wrong token. A tree keeps several alternatives at uncertain positions, and
the target scores all of them at once (the tree attention mask of :mod:`.candidates`); the longest accepted
root-to-node path wins, and :func:`.verify.verify` compacts the KV cache to keep exactly that path.

In a batch (:mod:`.batch`) the draft grows every sequence's tree at once: one ragged pass of the draft per
level (:func:`draft_trees`, the same loop as for one sequence).
"""
from __future__ import annotations

import torch

from ..cache import KVCache
from ..model import GPT
from ..sampling import SamplingConfig
from .candidates import Proposal, one_hot_q, ordered_paths
from .session import Progress, Proposer, Session, Settings, decode
from .stats import DecodeStats
from .verify import score_ragged


@torch.no_grad()
def score_tree(model: GPT, cache: KVCache, tokens, parents, return_hidden: bool = False):
    """One pass of ``model`` over a flattened tree placed after the cache; returns logits (N, V), and the final
    hidden states (N, C) too with ``return_hidden``. The cache grows by N; the caller crops or compacts it."""
    tree = Proposal(list(tokens), list(parents))  # its mask and positions, as verify() builds them
    out = score_ragged(model, [cache], [tree.tokens], [tree.attention_mask()], [tree.position_ids(cache.length)],
                       return_hidden)
    return (out[0][0], out[1][0]) if return_hidden else out[0][0]


class _Growing:
    """One sequence's tree as :func:`draft_trees` grows it: nodes, the frontier, and (with fixed ``paths``) which
    rank path each node is."""

    def __init__(self, root: int, max_depth: int, shape: dict | None):
        self.tokens, self.parents, self.frontier = [root], [-1], [0]
        self.max_depth, self.shape, self.where, self.passes = max_depth, shape, {0: ()}, 0

    def grows(self, level: int, budget: int) -> bool:
        return bool(self.frontier) and len(self.tokens) - 1 < budget and level < self.max_depth

    def expand(self, logits: torch.Tensor, cfg: SamplingConfig, budget: int, branch: int, threshold: float) -> None:
        """Children for the frontier from the draft's logits at every node: one child where the draft is confident
        (top probability >= ``threshold``), its top-``branch`` tokens where it is not (or the ranks of ``shape``)."""
        new_frontier = []
        for node in self.frontier:
            probs = cfg.probs(logits[node]) if not cfg.greedy else torch.softmax(logits[node].float(), -1)
            if self.shape is not None:
                ranks = self.shape.get(self.where[node], [])
            else:
                ranks = range(1 if float(probs.max()) >= threshold else branch)
            top = torch.topk(probs, max(ranks, default=-1) + 1).indices.tolist() if ranks else []
            for r in ranks:
                if len(self.tokens) - 1 >= budget or probs[top[r]] <= 0:
                    break
                self.tokens.append(top[r])
                self.parents.append(node)
                new_frontier.append(len(self.tokens) - 1)
                if self.shape is not None:
                    self.where[len(self.tokens) - 1] = self.where[node] + (r,)
        self.frontier = new_frontier


@torch.no_grad()
def draft_trees(draft: GPT, caches: list, roots: list[int], cfgs: list[SamplingConfig], budget: int = 16,
                max_depths: list[int] | None = None, branch: int = 2, threshold: float = 0.6, paths=None):
    """Grow a tree of candidates after ``roots[b]`` with the draft model, for every sequence b at once.

    Level by level: the draft scores each sequence's whole tree so far, all sequences in one pass
    (:func:`~.verify.score_ragged`); a frontier node where the draft is confident (top probability >=
    ``threshold``) gets one child, an uncertain one gets its top-``branch`` tokens, until ``budget`` nodes (besides
    the root) or ``max_depths[b]`` levels. With ``paths`` (see :func:`~.candidates.tree_from_paths`) the shape is
    fixed instead and the ranks pick the draft's top tokens. Children are the draft's top tokens (deterministic),
    so their proposal distributions q are one-hot. The draft caches are left as they were. Returns, per
    sequence, (tokens, parents, number of draft passes)."""
    shape = None
    if paths is not None:
        shape = {}
        for p in ordered_paths(paths):
            shape.setdefault(p[:-1], []).append(p[-1])
    trees = [_Growing(r, d, shape) for r, d in zip(roots, max_depths or [6] * len(roots))]
    level = 0
    while True:
        live = [b for b, t in enumerate(trees) if t.grows(level, budget)]
        if not live:
            break
        starts = [caches[b].length for b in live]
        grown = [Proposal(list(trees[b].tokens), list(trees[b].parents)) for b in live]
        logits, _ = score_ragged(draft, [caches[b] for b in live], [g.tokens for g in grown],
                                 [g.attention_mask() for g in grown],
                                 [g.position_ids(s) for g, s in zip(grown, starts)])
        for row, (b, start) in enumerate(zip(live, starts)):
            caches[b].crop(start)
            trees[b].passes += 1
            trees[b].expand(logits[row, :len(grown[row].tokens)], cfgs[b], budget, branch, threshold)
        level += 1
    return [(t.tokens, t.parents, t.passes) for t in trees]


def draft_tree(draft: GPT, cache: KVCache, root: int, cfg: SamplingConfig, budget: int = 16, max_depth: int = 6,
               branch: int = 2, threshold: float = 0.6, paths=None):
    """Grow one sequence's tree of candidates with the draft model (:func:`draft_trees`, same parameters).
    Returns (tokens, parents, q (N, V) one-hot, number of draft passes)."""
    tokens, parents, passes = draft_trees(draft, [cache], [root], [cfg], budget, [max_depth], branch, threshold,
                                          paths)[0]
    return tokens, parents, one_hot_q(tokens, draft.config.vocab_size), passes


class DraftTree(Proposer):
    """The draft model grows a token tree each round (:func:`draft_trees`, same parameters); in a batch, one draft
    pass per level for all sequences."""
    batched = True

    def __init__(self, draft: GPT, budget: int = 16, max_depth: int = 6, branch: int = 2, threshold: float = 0.6,
                 paths=None):
        self.draft, self.budget, self.max_depth = draft, budget, max_depth
        self.branch, self.threshold, self.paths = branch, threshold, paths
        self.max_width = 1 + (budget if paths is None else len(paths))

    def propose(self, session: Session, room: int) -> Proposal:
        return self.propose_batch([session], [room])[0]

    def propose_batch(self, seqs: list[Progress], rooms: list[int]) -> list[Proposal]:
        # first the accepted tokens each draft has not seen (not the root): one ragged pass
        behind = [s for s in seqs if s.draft_backlog]
        if behind:
            score_ragged(self.draft, [s.draft_cache for s in behind], [s.draft_backlog for s in behind])
        trees = draft_trees(self.draft, [s.draft_cache for s in seqs], [s.seq[-1] for s in seqs],
                            [s.sampling for s in seqs], self.budget, [min(self.max_depth, r) for r in rooms],
                            self.branch, self.threshold, self.paths)
        return [Proposal(tokens, parents, draft_passes=passes)  # top-k children: deterministic, one-hot q
                for tokens, parents, passes in trees]


def tree_generate(target: GPT, draft: GPT, prompt, max_new_tokens: int, budget: int = 16, max_depth: int = 6,
                  branch: int = 2, threshold: float = 0.6, paths=None, settings: Settings | None = None,
                  **sampling) -> tuple[list[int], DecodeStats]:
    """Speculative decoding with a draft-model token tree per round (:class:`DraftTree`); returns (new token
    ids, statistics). ``settings`` or its fields as keywords (:class:`~.session.Settings`): how the target
    samples and when it stops; ``stats.from_draft`` marks the drafted tokens of the output."""
    proposer = DraftTree(draft, budget, max_depth, branch, threshold, paths)
    return decode(target, prompt, max_new_tokens, proposer, settings, **sampling)
