"""The acceptance rules: given what the drafter proposed and what the target thinks, which tokens stand.

Every speculative method in this package (chain, tree, prompt lookup, Medusa) ends in one of these
functions, so the exactness argument is made once, here.

Speculative sampling (Leviathan et al. 2022, arXiv:2211.17192; Chen et al. 2023, arXiv:2302.01318): a drafted
token x, drawn from the draft's distribution q, is accepted with probability min(1, p(x) / q(x)), where p is the
target's distribution at that position. At the first rejection a replacement is drawn from the residual
max(0, p - q) / sum(max(0, p - q)), and the rest of the draft is discarded; if every drafted token is accepted,
a bonus token is drawn from the target's distribution after the last one. Each position then has exactly the
target's distribution: P(x) = min(p(x), q(x)) + (1 - sum_y min(p(y), q(y))) * max(0, p(x) - q(x)) / Z = p(x),
because Z = sum_y max(0, p(y) - q(y)) = 1 - sum_y min(p(y), q(y)).

With greedy decoding p and q are one-hot, and the rule reduces to "accept while the drafted token is the
target's argmax, then emit the target's argmax".
"""
from __future__ import annotations

import torch

from ..sampling import sample


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """max(0, p - q), normalised: what to sample from after rejecting a token drawn from q.

    If p and q agree to rounding error (so a rejection was a numerical accident), return p itself."""
    r = (p - q).clamp_min(0)
    z = r.sum()
    return r / z if z > 1e-12 else p


def accept_sampled(draft_tokens, q: torch.Tensor, p: torch.Tensor,
                   generator: torch.Generator | None = None) -> list[int]:
    """One round of speculative sampling.

    draft_tokens: gamma drafted ids; q: (gamma, V) the draft distributions they were drawn from;
    p: (gamma + 1, V) the target distributions at the same positions plus one more.
    Returns the accepted drafted tokens followed by one token from the target (the replacement at the first
    rejection, or the bonus token when all were accepted): between 1 and gamma + 1 ids."""
    draft_tokens = [int(t) for t in draft_tokens]
    gamma = len(draft_tokens)
    if q.shape[0] != gamma or p.shape[0] != gamma + 1 or q.shape[-1] != p.shape[-1]:
        raise ValueError(f"expected q of shape ({gamma}, V) and p of shape ({gamma + 1}, V) for {gamma} drafted "
                         f"tokens, got q {tuple(q.shape)} and p {tuple(p.shape)}")
    out: list[int] = []
    for i, x in enumerate(draft_tokens):
        ratio = float(p[i, x]) / float(q[i, x])  # q[i, x] > 0: x was drawn from q[i]
        if float(torch.rand((), generator=generator)) < min(1.0, ratio):
            out.append(x)
            continue
        out.append(sample(residual_distribution(p[i], q[i]), generator))
        return out
    out.append(sample(p[gamma], generator))  # all accepted: the bonus token
    return out


def accept_greedy(draft_tokens, target_argmax) -> list[int]:
    """Greedy verification: keep drafted tokens while they equal the target's argmax, then add the target's
    own choice at the first mismatch (or after the last drafted token).

    target_argmax: gamma + 1 ids, the target's argmax at each drafted position and one beyond."""
    draft_tokens = [int(t) for t in draft_tokens]
    target_argmax = [int(t) for t in target_argmax]
    if len(target_argmax) != len(draft_tokens) + 1:
        raise ValueError(f"need {len(draft_tokens) + 1} target choices for {len(draft_tokens)} drafted tokens, "
                         f"got {len(target_argmax)}")
    out: list[int] = []
    for x, t in zip(draft_tokens, target_argmax):
        if x != t:
            break
        out.append(x)
    out.append(target_argmax[len(out)])
    return out


def children_of(parents) -> list[list[int]]:
    """For a parent array (``parents[0] == -1`` is the root), the children of every node, in index order."""
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    return kids


def accept_tree_greedy(tokens, parents, target_argmax) -> tuple[list[int], int]:
    """Greedy verification of a token tree.

    tokens, parents: the flattened tree (node 0 is the root: the last token already in the sequence);
    target_argmax: the target's argmax at every node. Walk from the root, each time stepping to the child
    whose token is the target's choice. Returns (accepted node indices after the root, the target's token at
    the last accepted node) -- the path's tokens followed by that token are the round's output."""
    kids = children_of(parents)
    path, node = [], 0
    while True:
        want = int(target_argmax[node])
        nxt = next((c for c in kids[node] if int(tokens[c]) == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        node = nxt


def accept_tree_sampled(tokens, parents, q: torch.Tensor, p: torch.Tensor,
                        generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """Exact verification of a token tree under sampling: recursive rejection sampling over siblings.

    q: (N, V), q[i] is the distribution node i was proposed from (for a child drawn from the draft: the draft's
    distribution at its parent; for a deterministic candidate such as a top-k child or a prompt-lookup match:
    the one-hot vector of its own token). p: (N, V), the target's distribution at every node.
    At a node, try its children in order: accept child x with probability min(1, p(x)/q_x(x)); on rejection
    replace p by the normalised residual max(0, p - q_x) and try the next child; if all are rejected, sample
    the output token from what p has become (SpecInfer, arXiv:2305.09781). Each step then emits exactly a
    sample of the target's distribution, for the same reason the single-candidate rule does.
    Returns (accepted node indices after the root, the final token)."""
    kids = children_of(parents)
    path, node = [], 0
    while True:
        dist = p[node]
        for c in kids[node]:
            x = int(tokens[c])
            if float(torch.rand((), generator=generator)) < min(1.0, float(dist[x]) / float(q[c, x])):
                break
            dist = residual_distribution(dist, q[c])
        else:
            return path, sample(dist, generator)
        path.append(c)
        node = c
