"""Verification: the target scores a proposal in one pass, an acceptance rule decides which candidates stand,
and the KV cache is rolled back to the accepted tokens.

Every speculative method in this package ends in :func:`verify`, so the exactness argument is made once, here.

Speculative sampling (Leviathan et al. 2022, arXiv:2211.17192; Chen et al. 2023, arXiv:2302.01318): a drafted
token x, drawn from the draft's distribution q, is accepted with probability min(1, p(x) / q(x)), where p is the
target's distribution at that position. At the first rejection a replacement is drawn from the residual
max(0, p - q) / sum(max(0, p - q)), and the rest of the draft is discarded; if every drafted token is accepted,
a bonus token is drawn from the target's distribution after the last one. Each position then has exactly the
target's distribution: P(x) = min(p(x), q(x)) + (1 - sum_y min(p(y), q(y))) * max(0, p(x) - q(x)) / Z = p(x),
because Z = sum_y max(0, p(y) - q(y)) = 1 - sum_y min(p(y), q(y)).

With greedy decoding p and q are one-hot, and the rule reduces to "accept while the drafted token is the
target's argmax, then emit the target's argmax".

The rollback lives here and nowhere else: :func:`verify` leaves the target's cache holding the sequence plus the
accepted candidates, which restores the session's invariant (:mod:`.session`) with the round's final token as the
next root.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..cache import KVCache
from ..model import GPT
from ..paged import PagedBatch, PagedSequence
from ..sampling import SamplingConfig, sample
from .candidates import Proposal, children_of


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


# An acceptance rule: (proposal, the target's logits at every node) -> (accepted node indices after the root,
# the round's final token). rule_for() picks the exact one; Medusa's typical acceptance is another.
Rule = Callable[[Proposal, torch.Tensor], tuple[list[int], int]]


def greedy_rule(proposal: Proposal, logits: torch.Tensor) -> tuple[list[int], int]:
    """Exact greedy acceptance: follow the target's argmax down the tree."""
    choice = logits.argmax(-1).tolist()
    if proposal.is_chain:
        out = accept_greedy(proposal.candidates, choice)
        return list(range(1, len(out))), out[-1]
    return accept_tree_greedy(proposal.tokens, proposal.parents, choice)


def sampled_rule(sampling: SamplingConfig, generator: torch.Generator | None = None) -> Rule:
    """Exact sampled acceptance under ``sampling`` (the target's temperature, top-k, top-p): speculative
    sampling for a chain, recursive rejection sampling over siblings for a tree."""
    def rule(proposal: Proposal, logits: torch.Tensor) -> tuple[list[int], int]:
        p = sampling.probs(logits)
        q = proposal.candidate_q(logits.shape[-1]).to(p.device)
        if proposal.is_chain:
            out = accept_sampled(proposal.candidates, q, p, generator)
            return list(range(1, len(out))), out[-1]
        q = torch.cat([q.new_zeros(1, q.shape[-1]), q])  # accept_tree_sampled indexes q by node
        return accept_tree_sampled(proposal.tokens, proposal.parents, q, p, generator)
    return rule


def rule_for(sampling: SamplingConfig, generator: torch.Generator | None = None) -> Rule:
    """The exact acceptance rule for these sampling settings."""
    return greedy_rule if sampling.greedy else sampled_rule(sampling, generator)


@dataclass
class Verified:
    """What a round decided. tokens: the accepted candidates, then the target's own token (the next root);
    path: the accepted node indices; hidden_kept: the target's final hidden states at the positions the cache
    kept this round -- the root and the accepted nodes -- if asked for (what Medusa and EAGLE read next);
    extra_logits: the target's logits at the proposal's extra nodes (lookahead's next guesses)."""
    tokens: list[int]
    path: list[int]
    hidden_kept: torch.Tensor | None = None
    extra_logits: torch.Tensor | None = None

    @property
    def hidden(self) -> torch.Tensor | None:
        """The final hidden state at the last accepted node: the position before the new root."""
        return None if self.hidden_kept is None else self.hidden_kept[-1]


@torch.no_grad()
def verify(target: GPT, cache: KVCache, proposal: Proposal, rule: Rule, return_hidden: bool = False) -> Verified:
    """Score ``proposal`` with the target in one pass, apply ``rule``, and roll the cache back to the sequence
    plus the accepted candidates: a chain is cropped, a tree compacted to its accepted path (extra nodes are
    scored in the same pass and dropped). One sequence's :func:`verify_batch`.

    A chain is scored with the ordinary causal mask (for a chain it is the tree mask), which is cheaper."""
    return verify_batch(target, [cache], [proposal], [rule], return_hidden)[0]


def settle(cache, start: int, proposal: Proposal, logits: torch.Tensor, hidden: torch.Tensor | None,
           rule: Rule) -> Verified:
    """After the target's pass over ``proposal`` (appended to ``cache`` at ``start``): apply ``rule`` to its
    logits (N + extra, V) and roll the cache back to the accepted candidates -- a chain cropped, a tree
    compacted to its accepted path. ``cache``: a :class:`KVCache` or one sequence's
    :class:`~minigpt.paged.PagedSequence` (same two operations)."""
    n = len(proposal.tokens)
    path, last = rule(proposal, logits[:n])
    if proposal.is_chain:
        cache.crop(start + 1 + len(path))
    else:
        cache.compact(start, [0] + path)  # keep the root and the accepted nodes, contiguous
    return Verified([int(proposal.tokens[i]) for i in path] + [int(last)], path,
                    None if hidden is None else hidden[[0] + path],
                    logits[n:] if proposal.extra_tokens else None)


@torch.no_grad()
def score_ragged(model: GPT, tables: list[PagedSequence] | list[KVCache], token_lists: list[list[int]], masks=None,
                 positions=None, return_hidden: bool = False):
    """One pass of ``model`` over B sequences on a paged cache, sequence b appending ``token_lists[b]`` (the
    lists may differ in length: a ragged batch). masks[b]: the (n_b, n_b) mask among its new tokens (None:
    causal); positions[b]: their (n_b,) positions (None: consecutive after the sequence's length). ``tables``
    may instead be one contiguous :class:`~minigpt.cache.KVCache` (a single sequence: a plain pass, no padding),
    so that a method's drafting is written once for a session and for a batch.

    Shorter lists are padded to the longest with copies of their last token at their last position, causal,
    so they see nothing they should not and nobody sees them; the padding is dropped from the cache after the
    pass. Returns the logits (B, T, V) and, with ``return_hidden``, the final hidden states (B, T, C); row b
    is valid in its first n_b entries. Every table ends ``n_b`` positions longer."""
    B, device = len(tables), model.device
    if isinstance(tables[0], KVCache):  # one sequence in its own cache
        if B != 1:
            raise ValueError(f"a contiguous KV cache holds one sequence, not {B}: a batch needs paged block tables")
        mask, pos = (masks or [None])[0], (positions or [None])[0]
        out = model(torch.tensor(token_lists, device=device), cache=tables[0],
                    position_ids=None if pos is None else pos.to(device),
                    attn_mask=None if mask is None else mask.to(device), return_hidden=return_hidden)
        return out if return_hidden else (out, None)
    lens = [len(t) for t in token_lists]
    if min(lens) < 1:
        raise ValueError("every sequence of a ragged batch needs at least one token")
    T = max(lens)
    idx = torch.tensor([t + [t[-1]] * (T - len(t)) for t in token_lists], device=device)
    # built only when PagedBatch's defaults (consecutive positions, causal) would not do
    pos = attn = None
    if min(lens) < T or any(x is not None for x in (positions or [])):
        pos = torch.empty(B, T, dtype=torch.long)
        for b, (table, n) in enumerate(zip(tables, lens)):
            own = (torch.arange(n) + len(table)) if positions is None or positions[b] is None else positions[b].cpu()
            pos[b, :n] = own
            pos[b, n:] = own[-1]
        pos = pos.to(device)
    if any(x is not None for x in (masks or [])):
        attn = torch.ones(T, T, dtype=torch.bool).tril().repeat(B, 1, 1)
        for b, (mask, n) in enumerate(zip(masks, lens)):
            if mask is not None:
                attn[b, :n, :n] = mask.cpu()
        attn = attn.to(device)
    starts = [len(t) for t in tables]
    out = model(idx, cache=PagedBatch(tables), position_ids=pos, attn_mask=attn, return_hidden=return_hidden)
    for table, start, n in zip(tables, starts, lens):
        table.crop(start + n)  # drop the padding
    return out if return_hidden else (out, None)


@torch.no_grad()
def verify_batch(target: GPT, tables: list[PagedSequence] | list[KVCache], proposals: list[Proposal],
                 rules: list[Rule], return_hidden: bool = False) -> list[Verified]:
    """One target pass over every sequence's proposal (chains and trees may be mixed, and differ in size; see
    :func:`score_ragged`), then each sequence's own rule and rollback (:func:`settle`). Each sequence's outcome
    is what it would have been decided for it alone."""
    starts = [len(t) for t in tables]
    tokens = [p.tokens + p.extra_tokens for p in proposals]
    masks = [None if p.is_chain else p.attention_mask() for p in proposals]
    positions = [None if p.is_chain else p.position_ids(s) for p, s in zip(proposals, starts)]
    logits, hidden = score_ragged(target, tables, tokens, masks, positions, return_hidden)
    return [settle(table, start, p, logits[b, :len(tokens[b])],
                   None if hidden is None else hidden[b, :len(tokens[b])], rule)
            for b, (table, start, p, rule) in enumerate(zip(tables, starts, proposals, rules))]


def verify_chain(target: GPT, cache: KVCache, pending: int, tokens: list[int], cfg: SamplingConfig,
                 generator: torch.Generator | None = None, q: torch.Tensor | None = None) -> list[int]:
    """Score ``pending`` + the drafted ``tokens`` in one pass and apply the exact rule for ``cfg``; q: (len(tokens),
    V), the distributions they were drawn from (None: deterministic proposals, one-hot q).

    Returns the accepted drafted tokens plus one target token; the cache is rolled back to hold the sequence
    and the accepted tokens (the returned last token is the next pending one)."""
    return verify(target, cache, Proposal.chain(pending, tokens, q), rule_for(cfg, generator)).tokens


def verify_tree(target: GPT, cache: KVCache, tokens, parents, cfg: SamplingConfig,
                generator: torch.Generator | None = None, q: torch.Tensor | None = None, accept=None):
    """Score a token tree in one pass, pick the accepted path, and compact the cache to it.

    q: (N, V), q[i] the distribution node i was proposed from (row 0, the root's, unused; None: one-hot).
    ``accept`` replaces the acceptance rule: a function of (tokens, parents, target logits) -> (path, token).
    Returns (accepted tokens after the root, followed by the final token), (accepted node indices), and the
    target's final hidden state at the last accepted node (what Medusa heads read next)."""
    proposal = Proposal(list(tokens), list(parents), None if q is None else q[1:])
    rule = rule_for(cfg, generator) if accept is None else (lambda pr, logits: accept(pr.tokens, pr.parents, logits))
    v = verify(target, cache, proposal, rule, return_hidden=True)
    return v.tokens, v.path, v.hidden
