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
    is_chain (derived): every node has at most one child, so the target scores it with its ordinary causal
    mask (for a chain, the tree mask is the causal mask) and the cache is cropped rather than compacted."""
    tokens: list[int]
    parents: list[int]
    q: torch.Tensor | None = None
    draft_passes: int = 0
    is_chain: bool = field(init=False)

    def __post_init__(self):
        self.is_chain = all(p == i - 1 for i, p in enumerate(self.parents))

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
