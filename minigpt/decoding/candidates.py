"""What a drafter proposes: candidate continuations, as a token tree.

Every speculative method proposes the same kind of object, a :class:`Proposal`: a tree whose node 0, the root,
is the last token of the sequence so far, and whose other nodes are candidate next tokens, each after its
parent. A chain of drafted tokens is the tree in which every node has one child; plain decoding proposes the
root alone. With each candidate comes the distribution q it was drawn from, which the exact sampled
acceptance rule needs; a candidate chosen deterministically (a draft's top-k token, a copied n-gram, a Medusa
head's top token) has the one-hot q of its own token.

A tree is two lists, ``tokens`` and ``parents`` (``parents[0] == -1``; every other parent index is smaller than
the node's own). The target scores it in one pass: flattened into one sequence, each node attends only to the
cached prefix and to its own ancestors (the tree attention mask) and sits at position ``prefix + depth``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


def tree_depths(parents) -> list[int]:
    """Depth of every node (root 0); ValueError for a parent array that is not a tree in this order."""
    depth = []
    for i, p in enumerate(parents):
        if (p < 0) != (i == 0) or p >= i:
            raise ValueError(f"invalid parent array: node {i} has parent {p} (need parents[0] == -1 and "
                             f"0 <= parents[i] < i for i > 0)")
        depth.append(0 if p < 0 else depth[p] + 1)
    return depth


def children_of(parents) -> list[list[int]]:
    """For a parent array (``parents[0] == -1`` is the root), the children of every node, in index order."""
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    return kids


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


def ordered_paths(paths) -> list[tuple[int, ...]]:
    """Rank paths (tuples of child ranks, e.g. ``(0, 1)`` = the top-2 child of the root's top-1 child), without
    repeats, in node order: by length, then by ranks -- the order in which :func:`tree_from_paths` numbers them."""
    return sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))


def tree_from_paths(paths) -> list[int]:
    """Parent array of the tree spelled out by ``paths``, e.g. ``[(0,), (1,), (0, 0)]`` = the root's top-1 and
    top-2 children and the top-1 grandchild under the first. Node order: the root, then
    :func:`ordered_paths`; every prefix of a path must be present."""
    index = {(): 0}
    parents = [-1]
    for path in ordered_paths(paths):
        if path[:-1] not in index:
            raise ValueError(f"path {path} has no parent path {path[:-1]} in the tree")
        index[path] = len(parents)
        parents.append(index[path[:-1]])
    return parents


def merge_continuations(root: int, conts) -> tuple[list[int], list[int]]:
    """Continuations of ``root`` (token lists) merged into one tree that shares their common prefixes: (tokens,
    parents), the root first. Prompt lookup's tree of several matches and lookahead's pool n-grams are built so."""
    tokens, parents, child = [int(root)], [-1], {}
    for cont in conts:
        node = 0
        for tok in cont:
            if (node, int(tok)) not in child:
                child[(node, int(tok))] = len(tokens)
                tokens.append(int(tok))
                parents.append(node)
            node = child[(node, int(tok))]
    return tokens, parents


def adapt_length(k: int, proposed: int, accepted: int, k_max: int) -> int:
    """The next proposal length after a round that proposed ``proposed`` tokens and had ``accepted`` accepted:
    +2 after a full accept, -1 after a rejection, within [1, ``k_max``]; a round that proposed nothing leaves it
    (the heuristic of Hugging Face's assisted generation, used by the adaptive chain and adaptive lookup)."""
    if not proposed:
        return k
    return min(k + 2, k_max) if accepted == proposed else max(1, k - 1)


def one_hot_q(tokens, vocab_size: int) -> torch.Tensor:
    """(len(tokens), V): the proposal distribution of deterministic candidates, all mass on their own token."""
    return torch.nn.functional.one_hot(torch.as_tensor(list(tokens), dtype=torch.long), vocab_size).float()


@dataclass
class Proposal:
    """One round's candidates: a token tree rooted at the sequence's last token.

    tokens, parents: the tree (node 0 = the root, not a candidate).
    q: (N - 1, V), row i the distribution candidate i + 1 was drawn from; None when every candidate was chosen
       deterministically (then q is one-hot, and is built only if a sampled rule needs it).
    draft_passes: forward passes of a draft model that making the proposal took.
    extra_tokens, extra_depths, extra_mask: nodes the target scores in the same pass that are not candidates
    (lookahead decoding's window of guesses): extra node i sits at the root's position + ``extra_depths[i]``,
    sees the cache, the root and the extra nodes j with ``extra_mask[i, j]``; candidates never see extra nodes
    nor extra nodes candidates, and nothing of them stays in the cache.
    is_chain (derived): every node has at most one child and there are no extra nodes, so the target scores it
    with its ordinary causal mask (for a chain, the tree mask is the causal mask) and the cache is cropped."""
    tokens: list[int]
    parents: list[int]
    q: torch.Tensor | None = None
    draft_passes: int = 0
    extra_tokens: list[int] = field(default_factory=list)
    extra_depths: list[int] = field(default_factory=list)
    extra_mask: torch.Tensor | None = None
    is_chain: bool = field(init=False)

    def __post_init__(self):
        if len(self.extra_depths) != len(self.extra_tokens) or (
                self.extra_tokens and (self.extra_mask is None
                                       or self.extra_mask.shape != (len(self.extra_tokens),) * 2)):
            raise ValueError(f"{len(self.extra_tokens)} extra tokens need as many depths and an "
                             f"({len(self.extra_tokens)}, {len(self.extra_tokens)}) mask")
        self.is_chain = not self.extra_tokens and all(p == i - 1 for i, p in enumerate(self.parents))

    def attention_mask(self) -> torch.Tensor:
        """(N + E, N + E) bool over the candidates' tree and the extra nodes (see the class docstring)."""
        n, e = len(self.tokens), len(self.extra_tokens)
        mask = torch.zeros(n + e, n + e, dtype=torch.bool)
        mask[:n, :n] = tree_attention_mask(self.parents)
        if e:
            mask[n:, 0] = True
            mask[n:, n:] = self.extra_mask
        return mask

    def position_ids(self, offset: int) -> torch.Tensor:
        """Positions of every node, the root at ``offset``: tree nodes at their depth, extra nodes at theirs."""
        return offset + torch.tensor(tree_depths(self.parents) + list(self.extra_depths))

    @classmethod
    def chain(cls, root: int, drafted, q: torch.Tensor | None = None, draft_passes: int = 0) -> "Proposal":
        """The chain ``root -> drafted[0] -> drafted[1] -> ...``; q (len(drafted), V) or None."""
        drafted = [int(t) for t in drafted]
        return cls([int(root)] + drafted, list(range(-1, len(drafted))), q, draft_passes)

    @property
    def candidates(self) -> list[int]:
        """The proposed tokens (every node but the root)."""
        return self.tokens[1:]

    def candidate_q(self, vocab_size: int) -> torch.Tensor:
        """(N - 1, V): q, or the one-hot q of deterministic candidates."""
        return self.q if self.q is not None else one_hot_q(self.candidates, vocab_size)
