"""Suffix decoding: draft from suffix trees over everything already written.

Prompt lookup (:mod:`.lookup`) copies from the current request only. A deployed model also repeats what it wrote
for *earlier* requests: the skeleton of a JSON answer, the frame of a code review, the same edit applied file
after file. SuffixDecoding (Oliaro, Jia, Campos and Qiao, "SuffixDecoding: Extreme Speculative Decoding for
Emerging AI Applications", NeurIPS 2025, arXiv:2411.04975) drafts from two suffix trees:

* a **per-request tree** over the request's own text (the prompt, then each token as it is decided), and
* a **global tree** over the outputs of earlier requests (:class:`GlobalTree`): at most ``max_requests`` of
  them, the oldest evicted first. A request's own output enters it only when the request has ended.

A :class:`SuffixTree` here is a depth-limited suffix trie: every substring of at most ``max_depth`` tokens of
the text it holds is a path from the root, and each node counts how often its string occurred. Where the
current context's suffix of length p is a path (a *match*), the node's children are what followed it, and
their counts estimate how likely each continuation is. From the match we grow a tree of candidates best first
(the most probable node next, a node's probability the product of count ratios along its path), and stop at
a budget that **follows the match length** (``factor * p + offset`` tokens, at most ``max_spec``) and at
candidates below ``min_prob``: a long match earns a long speculation, a weak guess none (the paper's adaptive
speculation; its defaults in vLLM's ``suffix`` method: depth 24, 10,000 cached requests, factor 1, minimum
probability 0.1). A draft's *score*, the sum of its nodes' probabilities, is the number of tokens it expects
to have accepted; of the match lengths and the two trees, the best score proposes.

Costs, with D = ``max_depth`` and L the tokens of a text (measured in Lesson 14):

* insert a finished output: O(L * D) node steps (one path of at most D nodes per start position);
* append one token to an open text (the per-request tree): O(D) (each of the last D - 1 suffixes grows by one);
* remove (evict) an output: O(L * D);
* look up the matches of a context: at most D - 1 walks of at most D - 1 steps, O(D^2) dictionary look-ups;
* grow a draft of k candidates: O(k log k) heap steps, each looking at at most ``SHARE`` children of a node
  (:meth:`SuffixTree.likely_children`) -- so neither step depends on how many requests the tree holds;
* memory: at most L * D nodes per text held, fewer where texts repeat (shared paths are stored once).

Every candidate is chosen deterministically, so its q is one-hot and the exact rules verify the tree as they
verify prompt lookup's chain: greedy output identical to plain decoding, sampled output the target's.
"""
from __future__ import annotations

from ..model import GPT
from .candidates import Proposal
from .session import Progress, Proposer, Session, Settings, decode
from .stats import DecodeStats
from .suffix_tree import (ROOT, SHARE, STRIDE, WIDE, Draft, GlobalTree, SuffixTree,  # noqa: F401 (re-exported)
                          as_dicts, cut_to_depth, grow_draft, merge_drafts, tree_lines)

COMBINE = ("best", "union")  # the two trees' drafts: the better one proposes, or both as one tree


class Suffix(Proposer):
    """Suffix decoding on the shared loop: each round, the better :class:`Draft` of the request's own tree
    (its prompt and every token decided so far) and of ``cache``'s tree of earlier outputs, as one
    :class:`~.candidates.Proposal` tree (or chain) verified in one target pass. When the generation ends, the
    loop calls :meth:`finish` (a :class:`~.session.Session` at the end of ``run``, the batch engine as the
    sequence retires) and its output joins ``cache``: never earlier, so no request drafts from its own answer.

    adaptive: budget ``factor * match length + offset`` (at most ``max_spec``) and ``min_prob``, as in the
    paper; False: a fixed ``max_spec`` candidates, no probability floor. tree: False proposes one path.
    min_score: propose nothing (a plain step) unless the draft expects at least this many accepted tokens. Where
    any pass over several tokens costs much more than a one-token pass, a weak draft loses more than it can
    gain: SmolLM2 on this course's CPU took 1.6-1.9 one-token passes for 2-8 tokens (Lesson 14). combine:
    "best", the draft of the request's own tree or of the global tree, whichever scores higher; "union", both
    as one tree (:func:`~.suffix_tree.merge_drafts`: shared paths once, at most ``max_spec`` candidates), so
    that a JSON answer's keys can come from earlier answers and its values from the prompt in the same round.
    ``rounds`` records each round's (source, match length, candidates) -- source "prompt", "global" or "".

    The defaults are vLLM's (depth 24, at most 24 candidates, probability floor 0.1) except the budget: factor 4
    and offset 2 instead of 1 and 0, chosen for the course pair by replaying its development stream
    (:func:`replay_suffix`, :mod:`minigpt.streams`), never the held-out one. SmolLM2's (the registry's "smollm2"
    family) were chosen the same way on its development streams, with the pass costs measured on this CPU."""

    def __init__(self, cache: GlobalTree | None = None, max_depth: int = 24, max_spec: int = 24,
                 factor: float = 4.0, offset: float = 2.0, min_prob: float = 0.1, adaptive: bool = True,
                 tree: bool = True, min_score: float = 0.0, combine: str = "best"):
        if max_spec < 1:
            raise ValueError(f"max_spec must be at least 1, got {max_spec}")
        if combine not in COMBINE:
            raise ValueError(f"combine must be one of {', '.join(COMBINE)}, got {combine!r}")
        if cache is not None and cache.tree.max_depth != max_depth:
            raise ValueError(f"the global tree's depth ({cache.tree.max_depth}) differs from max_depth ({max_depth})")
        self.cache, self.max_depth, self.max_spec = cache, max_depth, max_spec
        self.factor = factor if adaptive else None
        self.offset, self.min_prob = offset, (min_prob if adaptive else 0.0)
        self.tree, self.min_score, self.combine = tree, min_score, combine
        self.cheap = not tree  # a path costs no model pass and may be cut to any length (decoding.auto's option)
        self.scored = True     # every proposal says how likely each candidate is (last_probs, summed: last_score)
        self.max_width = 1 + max_spec
        self.local: SuffixTree | None = None
        self.last_match, self.last_score, self.last_probs = 0, 0.0, []
        self._session, self._seen = None, 0
        self.rounds: list[tuple[str, int, int]] = []

    def start(self, progress: Progress) -> None:
        """A generation begins: its own tree starts empty (the global tree is kept, and shared by forks)."""
        self.local, self._session, self._seen = SuffixTree(self.max_depth), progress, 0
        self.rounds = []

    def _sync(self, progress: Progress) -> None:
        """Bring the request's own tree up to ``progress.seq``: O(max_depth) per token it has not seen."""
        if progress is not self._session:
            self.start(progress)
        for t in progress.seq[self._seen:]:
            self.local.append(t)
        self._seen = len(progress.seq)

    def best_draft(self, progress: Progress) -> Draft:
        """This round's best draft, before it is cut to the room left."""
        self._sync(progress)
        context = progress.seq[-(self.max_depth - 1):]
        args = (self.max_spec, self.factor, self.offset, self.min_prob, self.tree)
        best = self.local.speculate(context, *args)
        best.source = "prompt" if best.tokens else ""
        if self.cache is not None and len(self.cache):
            other = self.cache.tree.speculate(context, *args)
            other.source = "global" if other.tokens else ""
            if self.combine == "union" and self.tree:
                best = merge_drafts(best, other, self.max_spec)
            elif other.score > best.score:
                best = other
        return best if best.score >= self.min_score else Draft()

    def propose(self, session: Session, room: int) -> Proposal:
        best = cut_to_depth(self.best_draft(session), room)
        self.rounds.append((best.source, best.match_length, len(best.tokens)))
        self.last_match = best.match_length  # how long a suffix matched (the controller counts acceptance by it)
        self.last_score = best.score          # the candidates' expected accepted tokens, by the counts
        self.last_probs = best.probs          # each candidate's estimated probability of being reached
        return Proposal([session.seq[-1]] + best.tokens, [-1] + [p + 1 for p in best.parents])

    def finish(self, progress: Progress) -> None:
        """The generation has ended: its output joins the global tree (never before: while it runs, its own
        tree already holds it)."""
        if self.cache is not None:
            self.cache.add(progress.output)


def suffix_generate(target: GPT, prompt, max_new_tokens: int, cache: GlobalTree | None = None,
                    max_depth: int = 24, max_spec: int = 24, factor: float = 4.0, offset: float = 2.0,
                    min_prob: float = 0.1, adaptive: bool = True, tree: bool = True, min_score: float = 0.0,
                    combine: str = "best", settings: Settings | None = None, **sampling) -> tuple[list[int], DecodeStats]:
    """Speculative decoding with suffix-tree drafts (:class:`Suffix`); returns (new token ids, statistics).

    cache: the :class:`GlobalTree` of earlier outputs (None: the request's own tree only); this generation's
    output joins it at the end. max_depth: the trees' depth (match plus speculation); max_spec: the most
    candidates per round; factor, offset: the budget per matched token; min_prob: the floor of a candidate's
    estimated probability; adaptive False: always ``max_spec`` candidates; tree False: one path per round;
    min_score: the fewest accepted tokens a draft must expect to be proposed; combine: "best" (the better of the
    two trees' drafts) or "union" (both, merged into one tree). ``settings`` or its fields as
    keywords (:class:`~.session.Settings`): how the target samples and when it stops."""
    proposer = Suffix(cache, max_depth, max_spec, factor, offset, min_prob, adaptive, tree, min_score, combine)
    return decode(target, prompt, max_new_tokens, proposer, settings, **sampling)


def replay_suffix(prompt, output, cache: GlobalTree | None = None, **settings) -> list[tuple[int, int]]:
    """Greedy suffix decoding replayed on a known greedy ``output``, without the model: (candidates, accepted)
    per round. Greedy verification accepts the deepest path of the draft that agrees with the output, so the
    rounds are those :func:`suffix_generate` would make (settings: :class:`Suffix`'s); ``output`` joins ``cache``
    at the end, as it would. Settings can be swept for free, like :func:`~.lookup.replay_lookup`."""
    proposer = Suffix(cache, **settings)
    progress = Progress()
    progress.seq = [int(t) for t in prompt]
    output = [int(t) for t in output]
    done, rounds = 0, []
    while done < len(output):
        draft = cut_to_depth(proposer.best_draft(progress), len(output) - done - 1)
        node, n = -1, 0
        while True:  # follow the output down the draft tree
            node = next((i for i, (t, p) in enumerate(zip(draft.tokens, draft.parents))
                         if p == node and t == output[done + n]), None)
            if node is None:
                break
            n += 1
        rounds.append((len(draft.tokens), n))
        progress.seq += output[done:done + n + 1]
        done += n + 1
    if cache is not None:
        cache.add(output)
    return rounds
