"""Medusa decoding: the target drafts for itself with extra heads, then verifies a candidate tree.

Each round the heads read the target's hidden state at the last accepted position and propose their top
tokens for the next few positions; a fixed sparse tree (:func:`minigpt.medusa_heads.sparse_tree_paths`) picks which
combinations to try; one target pass verifies the whole tree (:func:`.verify.verify`) and also yields the
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

from functools import partial

import torch

from ..model import GPT
from ..sampling import SamplingConfig, sample
from .candidates import Proposal, children_of, ordered_paths, tree_from_paths
from .session import Proposer, Session, Settings, decode
from .stats import DecodeStats
from .verify import greedy_rule


def medusa_candidates(head_logits: torch.Tensor, root: int, paths) -> tuple[list[int], list[int]]:
    """Fill the tree spelled by ``paths`` with tokens: a node at depth d with rank r gets head (d-1)'s rank-r token.

    head_logits: (K, V), the heads' logits at the last accepted position. Returns (tokens, parents) with the
    root first."""
    parents = tree_from_paths(paths)
    order = ordered_paths(paths)
    max_rank = max(r for p in order for r in p) + 1
    top = head_logits.topk(max_rank, dim=-1).indices.tolist()  # (K, max_rank)
    tokens = [root] + [top[len(p) - 1][p[-1]] for p in order]
    return tokens, parents


def typical_acceptance(cfg: SamplingConfig, generator, epsilon: float = 0.09, delta: float = 0.3):
    """Medusa's typical acceptance as an ``accept`` rule of (tokens, parents, logits) for
    :func:`.verify.verify_tree` (not exact).

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


class Medusa(Proposer):
    """The heads, reading the target's hidden state before the root, fill the candidate tree ``paths``
    (:func:`medusa_candidates`; default: a chain of the heads' top-1 predictions); levels beyond the room left
    are dropped. ``heads``: anything with ``num_heads`` that maps a hidden state (C,) to logits (num_heads, V),
    such as :class:`minigpt.medusa_heads.MedusaHeads`. ``acceptance``: "exact", or "typical" (Medusa's typical
    acceptance under sampling, with ``epsilon`` and ``delta``; not exact). Each sequence of a batch reads its own
    hidden state and drafts on its own."""
    needs_hidden = True

    def __init__(self, heads, paths=None, acceptance: str = "exact", epsilon: float = 0.09, delta: float = 0.3):
        if acceptance not in ("exact", "typical"):
            raise ValueError(f"acceptance must be 'exact' or 'typical', got {acceptance!r}")
        paths = paths or [(0,) * d for d in range(1, heads.num_heads + 1)]
        if acceptance == "typical":
            self.rule = partial(_typical_rule, epsilon, delta)
        self.heads, self.paths = heads, [tuple(p) for p in paths]
        self.max_width = 1 + len(self.paths)
        if max(len(p) for p in self.paths) > heads.num_heads:
            raise ValueError(f"the tree is {max(len(p) for p in self.paths)} deep but there are only "
                             f"{heads.num_heads} heads")

    def propose(self, session: Session, room: int) -> Proposal:
        paths = [p for p in self.paths if len(p) <= room]
        if session.hidden is None or not paths:  # a one-token prompt has no hidden state yet
            return Proposal([session.seq[-1]], [-1])
        return Proposal(*medusa_candidates(self.heads(session.hidden), session.seq[-1], paths))


def _typical_rule(epsilon: float, delta: float, sampling: SamplingConfig, generator):
    """Typical acceptance as a session rule; greedy decoding keeps the exact greedy rule."""
    if sampling.greedy:
        return greedy_rule
    accept = typical_acceptance(sampling, generator, epsilon, delta)
    return lambda proposal, logits: accept(proposal.tokens, proposal.parents, logits)


def medusa_generate(target: GPT, heads, prompt, max_new_tokens: int, paths=None, acceptance: str = "exact",
                    epsilon: float = 0.09, delta: float = 0.3, settings: Settings | None = None,
                    **sampling) -> tuple[list[int], DecodeStats]:
    """Generate with Medusa heads (:class:`Medusa`); returns (new token ids, statistics). ``paths``: the candidate
    tree (default: a chain of the heads' top-1 predictions). Typical acceptance is a rule for sampling: with
    ``temperature=0`` the exact greedy rule is used either way, so greedy output is always the target's own.
    ``settings`` or its fields as keywords (:class:`~.session.Settings`): how the target samples and when it
    stops; ``stats.from_draft`` marks the heads' accepted tokens."""
    return decode(target, prompt, max_new_tokens, Medusa(heads, paths, acceptance, epsilon, delta), settings,
                  **sampling)
