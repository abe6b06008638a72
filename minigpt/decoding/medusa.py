"""Medusa decoding: the target drafts for itself with extra heads, then verifies a candidate tree.

Each round the heads read the target's hidden state at the last accepted position and propose their top
tokens for the next few positions; a fixed sparse tree (:func:`minigpt.medusa.sparse_tree_paths`) picks which
combinations to try; one target pass verifies the whole tree (:func:`.tree.verify_tree`) and also yields the
hidden state the heads read next. No draft model and no extra passes.

Acceptance, two options:
* ``"exact"`` -- the tree rules of :mod:`.verify`: greedy gives the target's greedy output token for token;
  under sampling the candidates are deterministic (one-hot q), so the output has exactly the target's
  distribution.
* ``"typical"`` -- Medusa's typical acceptance: a candidate stands if the target gives it probability above
  min(epsilon, delta * exp(-entropy)). It accepts more under sampling but is NOT exact: the output is no longer
  distributed as the target's.
"""
from __future__ import annotations

import time

import torch

from ..cache import KVCache
from ..model import GPT
from ..sampling import SamplingConfig, make_generator, sample
from .plain import as_prompt, check_length, prefill
from .stats import DecodeStats, Stream, trim
from .tree import tree_from_paths, verify_tree
from .verify import children_of


def medusa_candidates(head_logits: torch.Tensor, root: int, paths) -> tuple[list[int], list[int]]:
    """Fill the tree spelled by ``paths`` with tokens: a node at depth d with rank r gets head (d-1)'s rank-r token.

    head_logits: (K, V), the heads' logits at the last accepted position. Returns (tokens, parents) with the
    root first."""
    parents = tree_from_paths(paths)
    order = sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))
    max_rank = max(r for p in order for r in p) + 1
    top = head_logits.topk(max_rank, dim=-1).indices.tolist()  # (K, max_rank)
    tokens = [root] + [top[len(p) - 1][p[-1]] for p in order]
    return tokens, parents


def typical_acceptance(cfg: SamplingConfig, generator, epsilon: float = 0.09, delta: float = 0.3):
    """Medusa's typical acceptance as an ``accept`` rule for :func:`.tree.verify_tree` (not exact).

    A node passes when the target's probability of its token, at its parent, exceeds
    min(epsilon, delta * exp(-entropy of the target's distribution there)). The longest root-to-node path of
    passing nodes wins (the first such path among equals); the next token is sampled from the target at its end."""
    def accept(tokens, parents, logits):
        probs = cfg.probs(logits)
        entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1)
        threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))
        kids = children_of(parents)

        def longest(node) -> list[int]:
            best: list[int] = []
            for c in kids[node]:
                if float(probs[node, tokens[c]]) > float(threshold[node]):
                    below = [c] + longest(c)
                    if len(below) > len(best):
                        best = below
            return best

        path = longest(0)
        end = path[-1] if path else 0
        return path, sample(probs[end], generator)
    return accept


@torch.no_grad()
def medusa_generate(target: GPT, heads, prompt, max_new_tokens: int, paths=None, acceptance: str = "exact",
                    temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                    seed: int | None = None, eos_id: int | None = None, epsilon: float = 0.09, delta: float = 0.3,
                    stats: DecodeStats | None = None, on_tokens=None) -> tuple[list[int], DecodeStats]:
    """Generate with Medusa heads; returns (new token ids, statistics). ``paths``: the candidate tree (default:
    a chain of the heads' top-1 predictions). Typical acceptance is a rule for sampling: with ``temperature=0``
    the exact greedy rule is used either way, so greedy output is always the target's own.
    on_tokens: called with each round's tokens (streaming); ``stats.from_draft`` marks the heads' accepted ones."""
    if acceptance not in ("exact", "typical"):
        raise ValueError(f"acceptance must be 'exact' or 'typical', got {acceptance!r}")
    cfg = SamplingConfig(temperature, top_k, top_p)
    paths = [tuple(p) for p in (paths or [(0,) * d for d in range(1, len(heads.heads) + 1)])]
    if max(len(p) for p in paths) > len(heads.heads):
        raise ValueError(f"the tree is {max(len(p) for p in paths)} deep but there are only {len(heads.heads)} heads")
    idx = as_prompt(prompt, target)
    n_prompt = idx.shape[1]
    check_length(target, n_prompt, max_new_tokens)
    gen = make_generator(seed)
    accept = typical_acceptance(cfg, gen, epsilon, delta) if acceptance == "typical" and not cfg.greedy else None
    stats = stats if stats is not None else DecodeStats()
    t0 = time.perf_counter()
    cache = KVCache.for_model(target)
    hidden = None  # the target's hidden state at the position before the root
    if n_prompt > 1:
        _, h = target(idx[:, :-1], cache=cache, return_hidden=True)
        hidden = h[0, -1]
    stats.prefills += 1
    stream = Stream(stats, max_new_tokens, eos_id, on_tokens)
    seq = idx[0].tolist()
    V = target.config.vocab_size
    while len(seq) - n_prompt < max_new_tokens:
        room = max_new_tokens - (len(seq) - n_prompt) - 1
        round_paths = [p for p in paths if len(p) <= room]
        if hidden is None or not round_paths:
            tokens, parents = [seq[-1]], [-1]
        else:
            tokens, parents = medusa_candidates(heads(hidden), seq[-1], round_paths)
        q = torch.nn.functional.one_hot(torch.tensor(tokens), V).float()
        new, path, hidden = verify_tree(target, cache, tokens, parents, cfg, gen, q, accept)
        stats.add_tree_round(parents, path)
        seq.extend(new)
        stream.emit(new, len(path))
        if eos_id is not None and eos_id in new:
            break
    out = trim(seq[n_prompt:], max_new_tokens, eos_id)
    stats.new_tokens += len(out)
    stats.wall_time += time.perf_counter() - t0
    return out, stats
