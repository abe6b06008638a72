"""Tree speculation: verify many candidate continuations in one target pass.

A chain of drafts dies at its first wrong token. A tree keeps several alternatives at uncertain positions, and
the target scores all of them at once: the tree is flattened into one sequence, each node attends only to the
cached prefix and to its own ancestors (the tree attention mask), and sits at position ``prefix + depth``.
The longest accepted root-to-node path wins, and the KV cache is compacted to keep exactly that path.

A tree is two lists: ``tokens`` and ``parents`` (``parents[0] == -1``; every other parent index is smaller than
the node's own). Node 0, the root, is the last token of the sequence so far; its logits score the first level.
"""
from __future__ import annotations

import time

import torch

from ..cache import KVCache
from ..model import GPT
from ..sampling import SamplingConfig, make_generator
from .plain import as_prompt, check_length, prefill
from .stats import DecodeStats, Stream, trim
from .verify import accept_tree_greedy, accept_tree_sampled


def tree_depths(parents) -> list[int]:
    """Depth of every node (root 0)."""
    depth = []
    for i, p in enumerate(parents):
        if (p < 0) != (i == 0) or p >= i:
            raise ValueError(f"invalid parent array: node {i} has parent {p} (need parents[0] == -1 and "
                             f"0 <= parents[i] < i for i > 0)")
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


def tree_attention_mask(parents) -> torch.Tensor:
    """(N, N) bool: node i may attend to node j iff j is i or an ancestor of i."""
    tree_depths(parents)  # validates
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        mask[i, i] = True
        if parents[i] >= 0:
            mask[i] |= mask[parents[i]]  # parents come first, so their rows are complete
    return mask


def tree_position_ids(parents, offset: int) -> torch.Tensor:
    """Absolute positions: ``offset + depth`` (siblings share a position, like alternative futures)."""
    return offset + torch.tensor(tree_depths(parents))


def tree_from_paths(paths) -> list[int]:
    """Parent array of the tree spelled out by ``paths``: tuples of child ranks, e.g. ``[(0,), (1,), (0, 0)]``
    = the root's top-1 and top-2 children and the top-1 grandchild under the first. Node order: the root,
    then the paths sorted by (length, ranks); every prefix of a path must be present."""
    order = sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))
    index = {(): 0}
    parents = [-1]
    for path in order:
        if path[:-1] not in index:
            raise ValueError(f"path {path} has no parent path {path[:-1]} in the tree")
        index[path] = len(parents)
        parents.append(index[path[:-1]])
    return parents


@torch.no_grad()
def score_tree(model: GPT, cache: KVCache, tokens, parents, return_hidden: bool = False):
    """One pass of ``model`` over a flattened tree placed after the cache; returns logits (N, V), and the final
    hidden states (N, C) too with ``return_hidden``.

    The cache grows by N; the caller crops or compacts it."""
    mask = tree_attention_mask(parents).to(model.device)
    pos = tree_position_ids(parents, cache.length).to(model.device)
    idx = torch.tensor([list(tokens)], device=model.device)
    out = model(idx, cache=cache, position_ids=pos, attn_mask=mask, return_hidden=return_hidden)
    return (out[0][0], out[1][0]) if return_hidden else out[0]


@torch.no_grad()
def draft_tree(draft: GPT, cache: KVCache, root: int, cfg: SamplingConfig, budget: int = 16, max_depth: int = 6,
               branch: int = 2, threshold: float = 0.6, paths=None):
    """Grow a tree of candidates with the draft model.

    Level by level: the draft scores the whole tree so far in one pass; a frontier node where the draft is
    confident (top probability >= ``threshold``) gets one child, an uncertain one gets its top-``branch``
    tokens, until ``budget`` nodes (besides the root) or ``max_depth`` levels. With ``paths`` (see
    :func:`tree_from_paths`) the shape is fixed instead and the ranks pick the draft's top tokens.
    Children are the draft's top tokens (deterministic), so their proposal distributions q are one-hot.
    The draft cache is left as it was. Returns (tokens, parents, q, number of draft passes)."""
    start = cache.length
    tokens, parents, frontier = [root], [-1], [0]
    shape = None
    if paths is not None:
        shape = {}
        for p in sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p)):
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
    q = torch.nn.functional.one_hot(torch.tensor(tokens), draft.config.vocab_size).float()
    return tokens, parents, q, passes


@torch.no_grad()
def verify_tree(target: GPT, cache: KVCache, tokens, parents, cfg: SamplingConfig,
                generator: torch.Generator | None = None, q: torch.Tensor | None = None, accept=None):
    """Score the tree with the target in one pass, pick the accepted path, and compact the cache to it.

    Before: ``cache`` holds the sequence without its last token (the root). After: it holds the sequence plus
    the accepted path, and the returned token is the new pending one. ``accept`` replaces the acceptance rule
    (a function of (tokens, parents, target logits) -> (path, token); Medusa's typical acceptance uses it).
    Returns (accepted tokens after the root, followed by the final token), (accepted node indices), and the
    target's final hidden state at the last accepted node (what Medusa heads read next)."""
    start = cache.length
    logits, hidden = score_tree(target, cache, tokens, parents, return_hidden=True)
    if accept is not None:
        path, last = accept(tokens, parents, logits)
    elif cfg.greedy:
        path, last = accept_tree_greedy(tokens, parents, logits.argmax(-1).tolist())
    else:
        path, last = accept_tree_sampled(tokens, parents, q, cfg.probs(logits), generator)
    cache.compact(start, [0] + path)  # keep the root and the accepted nodes, contiguous
    return [int(tokens[i]) for i in path] + [last], path, hidden[path[-1] if path else 0]


@torch.no_grad()
def tree_generate(target: GPT, draft: GPT, prompt, max_new_tokens: int, budget: int = 16, max_depth: int = 6,
                  branch: int = 2, threshold: float = 0.6, paths=None, temperature: float = 0.0,
                  top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                  eos_id: int | None = None, stats: DecodeStats | None = None,
                  on_tokens=None) -> tuple[list[int], DecodeStats]:
    """Speculative decoding with a draft-model token tree per round; returns (new token ids, statistics).
    on_tokens: called with each round's tokens (streaming); ``stats.from_draft`` marks the drafted ones."""
    cfg = SamplingConfig(temperature, top_k, top_p)
    idx = as_prompt(prompt, target)
    n_prompt = idx.shape[1]
    check_length(target, n_prompt, max_new_tokens)
    gen = make_generator(seed)
    stats = stats if stats is not None else DecodeStats()
    t0 = time.perf_counter()
    tcache, dcache = KVCache.for_model(target), KVCache.for_model(draft)
    prefill(target, tcache, idx)
    prefill(draft, dcache, idx.to(draft.device))
    stats.prefills += 1
    stream = Stream(stats, max_new_tokens, eos_id, on_tokens)
    seq = idx[0].tolist()
    while len(seq) - n_prompt < max_new_tokens:
        # the draft cache catches up on accepted tokens it has not seen (all but the root)
        behind = seq[dcache.length:-1]
        if behind:
            draft(torch.tensor([behind], device=draft.device), cache=dcache)
        depth = min(max_depth, max_new_tokens - (len(seq) - n_prompt) - 1)
        tokens, parents, q, passes = draft_tree(draft, dcache, seq[-1], cfg, budget, depth, branch, threshold, paths)
        stats.draft_passes += passes
        new, path, _ = verify_tree(target, tcache, tokens, parents, cfg, gen, q)
        stats.add_tree_round(parents, path)
        seq.extend(new)
        stream.emit(new, len(path))
        if eos_id is not None and eos_id in new:
            break
    out = trim(seq[n_prompt:], max_new_tokens, eos_id)
    stats.new_tokens += len(out)
    stats.wall_time += time.perf_counter() - t0
    return out, stats
