"""Training an EAGLE-3 head (:class:`minigpt.eagle_head.Eagle3Head`) with training-time test, and measuring any
EAGLE head the way a chain draft meets it.

Li et al. 2025 (EAGLE-3, arXiv:2503.01840): a head trained only on the target's true features meets its own,
imperfect outputs from the second drafted token on, and does worse there than training suggested. Training-time
test feeds it its own outputs during training: step 0 reads the target's fused layers at every position t and
the token x_{t+1}, and predicts x_{t+2}; step k reads the head's step-(k-1) output at t (standing for position
t + k) and the token x_{t+1+k}, sits at position t + k, and predicts x_{t+2+k}. Its attention sees the step-0
entries up to t and its own entries of the earlier steps at t -- exactly what a node at depth k + 1 of a draft
tree sees: the real entries, then its ancestors. The loss is the cross-entropy of each step's read-out against
the target's own next token (weights ``decay**k``); no feature regression.

The labels are the target's argmax at the positions that count (an answer's tokens): under greedy
verification a drafted token is accepted exactly when it is that argmax.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..eagle_head import Eagle3Head


def target_pass(head, x: torch.Tensor, counts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen target over ``x`` (B, T): what ``head`` reads at every position (:meth:`target_features`: an
    EAGLE-3 head's fused layers, an EAGLE head's final hidden states) and ``labels`` (B, T): the target's argmax
    after position j where ``counts`` (B, T) bool says so (all positions when None), -100 elsewhere."""
    target = head.target
    with torch.no_grad():
        layers = getattr(head, "feature_layers", None)
        if layers is None:
            final = features = target.hidden_states(x)
        else:
            final, states = target.layer_states(x, layers)
            features = torch.cat(states, dim=-1)
        counts = torch.ones_like(x, dtype=torch.bool) if counts is None else counts.to(x.device)
        labels = torch.full_like(x, -100)
        labels[counts] = target.lm_head(final[counts]).argmax(-1)
    return features, labels


def subset_index(head) -> torch.Tensor:
    """(vocab,) long: each token's index in the head's read-out, -1 for a token it cannot draft."""
    V = head.target.config.vocab_size
    if head.vocab_subset is None:
        return torch.arange(V, device=head.target.device)
    index = torch.full((V,), -1, dtype=torch.long, device=head.vocab_subset.device)
    index[head.vocab_subset] = torch.arange(len(head.vocab_subset), device=index.device)
    return index


def step_inputs(x: torch.Tensor, labels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step k's token input x_{t+1+k} and label (the target's token after position t + 1 + k) for the entries
    t = 0 .. T - 2 of windows x (B, T); past the window's end: token 0 and label -100."""
    T = x.shape[1]
    tokens = F.pad(x[:, 1 + k:], (0, k))
    lab = F.pad(labels[:, 1 + k:], (0, k), value=-100)
    return tokens[:, :T - 1], lab[:, :T - 1]


def step_mask(L: int, k: int, device=None) -> torch.Tensor:
    """(L, (k + 1) L) bool: step k's entry t sees the step-0 entries 0..t and each later step's entry t."""
    blocks = [torch.ones(L, L, dtype=torch.bool, device=device).tril()]
    blocks += [torch.eye(L, dtype=torch.bool, device=device)] * k
    return torch.cat(blocks, dim=1)


def ttt_loss(head: Eagle3Head, features: torch.Tensor, x: torch.Tensor, labels: torch.Tensor, steps: int = 5,
             decay: float = 0.8) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Training-time test on windows x (B, T) with the target's ``features`` (B, T, layers * C) and ``labels``
    (:func:`target_pass`): ``steps`` passes of the head, each reading the previous one's outputs. Returns the
    loss (sum over steps of ``decay**k`` x the step's mean cross-entropy, over the entries whose label the
    read-out holds) and, per step, (hits, counted entries): the head's top-1 agreement with the target, a label
    outside the read-out counted as a miss."""
    L = x.shape[1] - 1
    index = subset_index(head)
    h, earlier = features[:, :L], []
    loss = features.new_zeros(())
    record = []
    for k in range(steps):
        tokens, lab = step_inputs(x, labels, k)
        h, kv = head.step(h, tokens, torch.arange(L, device=x.device) + k, step_mask(L, k, x.device), earlier=earlier)
        earlier.append(kv)
        valid = lab != -100
        target_index = index[lab.clamp(min=0)]
        inside = valid & (target_index >= 0)
        if inside.any():
            logits = head.logits(h[inside]).float()
            loss = loss + decay ** k * F.cross_entropy(logits, target_index[inside])
            hits = int((logits.argmax(-1) == target_index[inside]).sum())
        else:
            hits = 0
        record.append((hits, int(valid.sum())))
    return loss, record


@torch.no_grad()
def chain_hits(head, x: torch.Tensor, labels: torch.Tensor, depth: int) -> torch.Tensor:
    """Teacher-forced chain drafting at every position of x (1, T), through the head's KV cache as the proposer
    drives it: (T - 1, depth) bool, entry [t, d] whether the head's token at depth d + 1 after position t + 1 is
    the target's, its inputs at depth d + 1 being its own outputs and the true tokens (those of an accepted
    chain). Works for an EAGLE head and an EAGLE-3 head alike. Labels of -100 give False."""
    L = x.shape[1] - 1
    features = head.target_features(x)
    cache = head.new_cache(max_len=depth * L)
    hits = torch.zeros(L, depth, dtype=torch.bool)
    h = None
    for k in range(depth):
        tokens, lab = step_inputs(x, labels, k)
        pos = torch.arange(L, device=x.device) + k
        if k == 0:
            h = head(features[:, :L], tokens, cache=cache, position_ids=pos)
        else:
            h = head(h, tokens, cache=cache, position_ids=pos, attn_mask=step_mask(L, k, x.device))
        drafted = head.token_ids(head.logits(h[0]).argmax(-1))
        hits[:, k] = ((drafted == lab[0]) & (lab[0] != -100)).cpu()
    return hits


def chain_summary(hits: torch.Tensor, valid: torch.Tensor) -> dict:
    """From :func:`chain_hits` rows whose labels are all valid (``valid`` (N,) bool): ``agreement_by_depth``
    (the share of chains reaching depth d whose depth-d token is the target's: what a chain's round meets) and
    ``chain_tau`` (1 + the mean number of leading hits: tokens per target pass of a greedy chain of this depth
    when every round drafts the full depth)."""
    rows = hits[valid]
    if not len(rows):
        return dict(agreement_by_depth=[], chain_tau=float("nan"), entries=0)
    lead = rows.int().cumprod(dim=1)             # 1 while every token so far was the target's
    reached = torch.cat([torch.ones(len(rows), 1, dtype=torch.int), lead[:, :-1]], dim=1)
    by_depth = [round(float(lead[:, d].sum() / reached[:, d].sum()), 4) if reached[:, d].sum() else float("nan")
                for d in range(rows.shape[1])]
    return dict(agreement_by_depth=by_depth, chain_tau=round(1 + float(lead.sum(1).float().mean()), 4),
                entries=len(rows))
