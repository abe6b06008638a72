"""EAGLE drafting: the target's features, extrapolated by a one-layer head, grow a dynamic token tree.

Each round the head (:class:`minigpt.eagle_head.EagleHead`) first catches up on the positions the target just
cached -- their true features f_t, each paired with the token x_{t+1} -- and so predicts the feature at the
root. From there it grows a tree the way EAGLE-2 does (Li et al. 2024, arXiv:2406.16858): at every depth the
``top_k`` frontier nodes whose paths the head finds most probable each get their ``top_k`` most probable
children, and the head runs once over the new frontier (each node reads its parent's predicted feature and its
own token, attending to its ancestors only). At the end the ``total_tokens`` nodes with the highest path
probability form the tree the target verifies -- a set that is closed under "parent of", since a path is never
more probable than its prefix.

That last fact also says when to stop growing. A node's descendants are never more probable than it is, so once
``total_tokens`` nodes are found, a frontier node no more probable than the ``total_tokens``-th best of them can
add nothing to the verified tree: it is not expanded, and when no frontier node is left the growth stops early,
without the head's remaining passes. The tree verified is the one the full ``depth`` levels would have chosen;
only the passes that could not change it are skipped. A path the head is sure of keeps growing; where every
deeper guess is already less likely than the shallow nodes found, the growth stops.

Candidates are the head's top tokens, chosen deterministically, so their q is one-hot and the exact rules of
:mod:`.verify` apply: greedy output is the target's own, sampled output has the target's distribution.
"""
from __future__ import annotations

import torch

from ..eagle_head import EagleHead
from ..model import GPT
from .candidates import Proposal
from .session import Progress, Proposer, Session, Settings, decode
from .stats import DecodeStats


class Eagle(Proposer):
    """EAGLE-2's dynamic tree (``top_k`` children of the ``top_k`` best frontier nodes per level, ``depth``
    levels, the best ``total_tokens`` nodes verified); ``top_k=1`` gives EAGLE's chain of ``depth`` tokens.

    The head's KV cache is this proposer's own, made for each generation by :meth:`start`: entries
    t = (f_t, x_{t+1}) for every position the target has cached, plus, during a round, the tree's entries, which
    are dropped again before verification. In a batch each sequence's copy keeps its own head cache and drafts
    on its own (the head's passes are not batched); the target's verification is.

    stop_early: skip the levels that cannot change the verified tree (see the module's docstring); False grows
    all ``depth`` levels, for comparison (the tree verified is the same)."""
    needs_hidden = True

    def __init__(self, head: EagleHead, depth: int = 6, top_k: int = 8, total_tokens: int = 24,
                 stop_early: bool = True):
        if depth < 1 or top_k < 1 or total_tokens < 1:
            raise ValueError(f"depth, top_k and total_tokens must be at least 1, got {depth}, {top_k}, {total_tokens}")
        self.head, self.depth, self.top_k, self.total_tokens = head, depth, top_k, total_tokens
        self.stop_early = stop_early
        self.max_width = 1 + total_tokens
        # what the head reads from the target: its final hidden states, or (EAGLE-3) the outputs of a low, a
        # middle and a high layer, which the verification pass records as it runs (GPT.features)
        layers = getattr(head, "feature_layers", None)
        self.needs_hidden = tuple(layers) if layers else True
        self.cache = None  # the head's, made per generation by start()

    def start(self, session: Progress) -> None:
        """A new generation: a fresh head cache, with room for a round's tree entries beyond the context's
        positions."""
        self.cache = self.head.new_cache(session.target.config.block_size + self.top_k * self.depth)
        self._backlog = []  # (first position, features) the target kept in rounds the head has not read yet
        self._noted = -1    # the target's cache length when the last round's features were noted
        self._root = None   # (target cache length, predicted root feature) of the last catch-up

    def catch_up(self, session: Progress) -> None:
        """Note the features the target kept this round, for a round another method made (the speculation
        controller, :mod:`.auto`, calls this every round): the head reads all the noted rounds in one pass
        when it next proposes, so the rounds it sits out cost it nothing, and its cache misses no position."""
        if self.cache is None:
            self.start(session)
        f = session.new_hidden
        if f is not None and self._noted != session.cache.length:
            self._backlog.append((session.cache.length - len(f), f))
            self._noted = session.cache.length

    def _catch_up(self, session: Session) -> torch.Tensor | None:
        """Feed the head the positions the target cached since it last read them (this round's and any noted
        by :meth:`catch_up`), in one pass; returns the predicted feature at the root (None before any position
        is cached: a one-token prompt). A proposer used by hand, outside the loops that call :meth:`start`, is
        started here on first use."""
        self.catch_up(session)
        backlog, self._backlog = self._backlog, []
        if not backlog:  # nothing new since the last catch-up (asked twice in one round): the same root
            return self._root[1] if self._root is not None and self._root[0] == session.cache.length else None
        start = backlog[0][0]
        for (a, fa), (b, _) in zip(backlog, backlog[1:]):
            if a + len(fa) != b:
                raise RuntimeError(f"eagle: the noted rounds are not contiguous (positions {a}+{len(fa)}, then {b})")
        f = torch.cat([fb for _, fb in backlog]) if len(backlog) > 1 else backlog[0][1]
        self.cache.crop(start)  # forget the last tree's entries (and anything past the first unread position)
        tokens = torch.tensor([session.seq[start + 1:start + 1 + len(f)]], device=f.device)
        root = self.head(f[None], tokens, cache=self.cache)[0, -1]
        self._root = (session.cache.length, root)
        return root

    def propose(self, session: Session, room: int) -> Proposal:
        root = session.seq[-1]
        root_feature = self._catch_up(session)
        passes = 1 if root_feature is not None else 0
        if root_feature is None or room < 1:
            return Proposal([root], [-1], draft_passes=passes)
        base = self.cache.length  # the head's real entries; tree entries go after them
        tokens, parents, depth, score = [root], [-1], [0], [0.0]
        feature = {0: root_feature}  # node -> the head's predicted feature at that node
        entry = {}                   # node -> its entry's index in the head's cache
        frontier = [0]
        for d in range(1, min(self.depth, room) + 1):
            logp = torch.log_softmax(self.head.logits(torch.stack([feature[n] for n in frontier])).float(), -1)
            top = logp.topk(min(self.top_k, logp.shape[-1]), dim=-1)
            ids = self.head.token_ids(top.indices).tolist()
            children = []
            for row, node in enumerate(frontier):
                for lp, t in zip(top.values[row].tolist(), ids[row]):
                    tokens.append(t)
                    parents.append(node)
                    depth.append(d)
                    score.append(score[node] + lp)
                    children.append(len(tokens) - 1)
            frontier = sorted(children, key=lambda n: -score[n])[:self.top_k]
            if d == min(self.depth, room):
                break
            if self.stop_early and len(tokens) > self.total_tokens:
                # the total_tokens-th best score so far: a descendant is never more probable than its ancestor,
                # and a tie goes to the shallower node, so a frontier node at or below it has nothing to add
                bar = sorted(score[1:], reverse=True)[self.total_tokens - 1]
                frontier = [n for n in frontier if score[n] > bar]
                if not frontier:
                    break
            # one head pass over the new frontier: each node reads its parent's feature and its own token, and
            # sees the real entries and its ancestors' entries
            past = self.cache.length
            mask = torch.zeros(len(frontier), past + len(frontier), dtype=torch.bool)
            mask[:, :base] = True
            for row, node in enumerate(frontier):
                mask[row, past + row] = True
                a = parents[node]
                while a > 0:
                    mask[row, entry[a]] = True
                    a = parents[a]
            out = self.head(torch.stack([feature[parents[n]] for n in frontier])[None],
                            torch.tensor([[tokens[n] for n in frontier]], device=root_feature.device),
                            cache=self.cache, position_ids=torch.tensor([base - 1 + d] * len(frontier),
                                                                        device=root_feature.device),
                            attn_mask=mask.to(root_feature.device))[0]
            passes += 1
            for row, node in enumerate(frontier):
                feature[node], entry[node] = out[row], past + row
        self.cache.crop(base)
        # the most probable nodes (a parent before its children on ties), renumbered parents-first
        keep = sorted(range(1, len(tokens)), key=lambda n: (-score[n], depth[n], n))[:self.total_tokens]
        keep = sorted(keep, key=lambda n: (depth[n], n))
        index = {0: 0}
        out_tokens, out_parents = [root], [-1]
        for n in keep:
            index[n] = len(out_tokens)
            out_tokens.append(tokens[n])
            out_parents.append(index[parents[n]])
        return Proposal(out_tokens, out_parents, draft_passes=passes)


def eagle_generate(target: GPT, head: EagleHead, prompt, max_new_tokens: int, depth: int = 6, top_k: int = 8,
                   total_tokens: int = 24, settings: Settings | None = None, top_k_sampling: int | None = None,
                   **sampling) -> tuple[list[int], DecodeStats]:
    """Speculative decoding with an EAGLE head and EAGLE-2's dynamic tree (:class:`Eagle`); returns (new token
    ids, statistics). ``settings`` or its fields as keywords (:class:`~.session.Settings`): how the target samples
    and when it stops; ``top_k`` here is the tree's, so the target's top-k sampling is ``top_k_sampling``."""
    if top_k_sampling is not None:
        sampling["top_k"] = top_k_sampling
    return decode(target, prompt, max_new_tokens, Eagle(head, depth, top_k, total_tokens), settings, **sampling)
