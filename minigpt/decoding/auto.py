"""Speculation that decides, round by round, whether and how far to speculate: the ``auto`` controller.

Every method of the course is exact, so a decoder may switch between them from one round to the next without
changing its output (greedy: identical; sampled: the target's distribution), as long as each round's choice
depends only on what came before it. The controller uses that freedom to pick, each round, the option with the
highest expected **tokens per second**, from what it has measured in this generation:

* the time of a round by how many tokens its target pass scored (its width k + 1), measured from the start of
  one round to the start of the next, so the verification pass, the acceptance rule and the bookkeeping are all
  in it; widths not seen yet are interpolated (or extrapolated with the slope fitted so far);
* each drafter's time per drafted token (a draft model's passes), measured while it drafts (the pass in which the
  draft first catches up with the tokens it has not seen, once per return to the chain, is left out of it; that
  catch-up is timed on its own, per token read, and a return to the chain is charged for its backlog, spread
  over the rounds the generation has left: :meth:`Auto._catch_up_cost`);
* each drafter's acceptance at each depth d, p_d = P(token d accepted | tokens 1..d-1 accepted), counted with
  exponential forgetting, so that a copy-heavy stretch of text is noticed and so is its end; for a copying
  drafter that says how long its match was (prompt lookup's ``last_match``, the n of the n-gram), counted apart
  for each match length: a copy after a 3-token match is a far better bet than one after a single token.

With those, a chain of k drafted tokens is expected to yield E(k) = 1 + sum_{d<=k} prod_{j<=d} p_j tokens (the
speed-up model of Lesson 04b, with the measured p_j in place of one alpha) in t_draft(k) + t_round(k + 1)
seconds, and plain decoding yields 1 token in t_round(1). The options:

* **copying drafters** (prompt lookup, suffix decoding: ``cheap = True``): their proposal costs next to nothing,
  so the controller makes it first and then decides how many of its tokens to send, k = 0 (a plain step) .. all.
  Their counts are right on average, but the rounds whose counts promise most are the ones sent (the winner's
  curse: a short match's count rises after two lucky copies, is sent, and falls back), so the chance of getting
  past depth d is scaled by a c_d measured on the rounds the counts alone would have sent, sent or not (the
  decided tokens say how far the copy would have got), kept per match length like the counts (a length's c_d
  starts from the one over all lengths), as for scored trees below;
* **scored drafters** (suffix decoding's tree, ``scored = True``): also free to propose, and each proposal says
  how likely each of its nodes is (``last_probs``, from its counts), so the probability P_d that a round gets
  past depth d is the sum of its depth-d nodes'; the controller sends the tree when 1 + sum_d c_d P_d tokens in
  t(width) beat the other options, c_d being the measured (reached depth d) / (its P_d summed over rounds) at
  each depth (:class:`TreeCalibration`): the counts' estimates are not equally wrong at every depth. The rounds
  counted are those whose tree the counts alone would have sent, for the same reason as a copy's, and c_d is kept
  per match length (``last_match``, from the one over all lengths as its prior, as for a copy): on open text a
  string seen once and matched on one token says "what followed it last time" with a count of 1, which the
  counts call certain and which is seldom right, while a match of six tokens that occurred before is a copy;
* **draft chains** (:class:`~.chain.Chain`): the controller picks gamma (0 .. ``gamma_max``) before drafting;
* **any other proposer** (EAGLE's and Medusa's trees, lookup trees, lookahead) is an *arm*: its rate is measured
  as a whole (tokens per round over seconds per round).

What belongs to the machine rather than the text -- the round times and each drafter's cost -- is kept across
generations in a :class:`Memory` (per torch thread count), so a new request starts from what the last ones
measured, and so does how long a losing option still has to wait before it is re-tried (below). Acceptance
belongs to the text: a generation starts from the last one's p_d (and an arm's tokens per round) only as a prior
worth two observations per depth, which its own rounds outweigh within a few rounds.

A copying drafter's proposal is free, so the controller makes it every round and counts it against the tokens
the round decided, whether it sent it or not (a copied token is one-hot: the chance that the decided token equals
it is the chance it would have been accepted): its acceptance stays current through plain rounds. A scored tree
is counted the same way: the decided tokens walk down it as far as it has their nodes, which is how deep the
round would have accepted it (the greedy rule accepts the deepest path that agrees; the exact sampled rule
accepts a child exactly when the target's token is that child). Other options
that lose are re-tried now and then, so a change in the text is found; beside the decision itself (its bookkeeping
made a plain round about 3% slower than plain decoding's, SmolLM2 at 4 bits on this course's CPU), those probes are
the controller's cost when plain decoding is best, so they are spaced by what they cost: a draft chain or an arm is
re-tried once the rounds since its last try make what a try loses (its measured seconds per round, the draft's
catch-up included, against the plain steps that would make its tokens) its share of ``PROBE_BUDGET`` (1% of the
time, split evenly between the options that are re-tried: 0.5% each for a chain and EAGLE; :func:`probe_wait`), and
the wait left goes on into the next generation. Re-tried after 8, 16, 32, ... rounds and again early in every
request instead, SmolLM2's EAGLE head (whose first round in a request reads the whole prompt, and whose trees lose
about a plain step on open chat) made the controller 7% slower on the development chat requests at 4 bits than the
same controller without it.
``Auto.choices`` records every round (option, tokens proposed, tokens kept) and :meth:`Auto.summary` how often
each option was taken and its tokens per target pass.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from .candidates import Proposal, children_of, tree_depths
from .chain import Chain
from .lookup import Lookup
from .session import Proposer, Session
from .verify import Verified

PLAIN = "plain"
MATCH_CAP = 8  # match lengths from here on share one count (suffix decoding's matches reach 20 tokens and more)
PROBE_BUDGET = 0.01  # the share of the time the re-tries of losing options may lose, all of them together
PROBE_WAIT_MAX = 512  # ... but after at most this many rounds (the wait left is carried across generations)
CATCH_UP_MEASURED = 16  # a draft's catch-up over at least this many tokens is timed as its cost per token


class RoundTimes:
    """Seconds per round (drafting excluded) by pass width, as exponential moving averages; an unseen width is
    interpolated between the nearest seen ones, or extrapolated with the least-squares slope of those seen
    (before two widths are seen: for a batch of B sequences, whose round of width w scores B * w tokens, B times
    the slope per token of the one-sequence table ``base``, when that has one; else ``prior_slope`` times the
    one-token round per extra token). A pass over more tokens never costs less than one over fewer, so the
    measured widths are first made non-decreasing (:meth:`monotone`: the closest non-decreasing sequence, each width
    weighted by the rounds behind its average): a width timed in few rounds, in a slow moment or a fast one, is
    pooled with its neighbours rather than believed over widths timed in many rounds. (Capping each width by every
    wider one's time, as this table did before, let one lucky round at a rarely used width pull every narrower
    width down to it: on SmolLM2 at 4 bits, width 4 timed at 10.7 ms made width 3, measured at 11.6 ms, read 10.7.)

    The controller reads many widths a round and the table changes after every round, so :meth:`table` builds
    all the estimates at once in one pass over the widths, rather than each width's from scratch."""

    def __init__(self, smoothing: float = 0.3, prior_slope: float = 0.05, base: "RoundTimes | None" = None,
                 batch: int = 1):
        self.smoothing, self.prior_slope, self.base, self.batch = smoothing, prior_slope, base, batch
        self.by_width: dict[int, float] = {}
        self.rounds: dict[int, int] = {}   # rounds timed at each width
        self._table: list[float] | None = None

    def add(self, width: int, seconds: float) -> None:
        seconds = max(seconds, 1e-9)  # a coarse clock may read 0 for a round
        old = self.by_width.get(width)
        self.by_width[width] = seconds if old is None else old + self.smoothing * (seconds - old)
        self.rounds[width] = self.rounds.get(width, 0) + 1
        self._table = None

    def monotone(self) -> dict[int, float]:
        """The seen widths' times made non-decreasing in width: the non-decreasing sequence closest to them in
        weighted least squares (pool adjacent violators), a width's weight the rounds behind its moving average, at
        most the average's effective number of rounds (2 / smoothing - 1: about 5.7 at 0.3)."""
        most = 2.0 / self.smoothing - 1.0
        blocks: list[list] = []   # [weighted sum, weight, widths], their means increasing
        for w in sorted(self.by_width):
            weight = min(float(self.rounds.get(w, 1)), most)
            blocks.append([self.by_width[w] * weight, weight, [w]])
            while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
                total, weight, widths = blocks.pop()
                blocks[-1][0] += total
                blocks[-1][1] += weight
                blocks[-1][2] += widths
        return {w: total / weight for total, weight, widths in blocks for w in widths}

    def table(self, max_width: int) -> list[float] | None:
        """``[t(1), t(1), t(2), ..., t(max_width)]`` (index = width; at least that long), kept until the next
        :meth:`add` (None before any round was timed)."""
        if not self.by_width:
            return None
        if self._table is None or len(self._table) <= max_width:
            self._table = self._build(max(max_width, max(self.by_width)))
        return self._table

    def __call__(self, width: int) -> float | None:
        """Estimated seconds of a round whose pass scores ``width`` tokens (None before any round was timed)."""
        table = self.table(max(1, width))
        return None if table is None else table[max(1, width)]

    def fitted_slope(self) -> float | None:
        """Seconds per extra token of width: the least-squares slope over the widths seen (None before two are)."""
        ws, t = sorted(self.by_width), self.by_width
        if len(ws) < 2:
            return None
        mean_w = sum(ws) / len(ws)
        mean_t = sum(t[w] for w in ws) / len(ws)
        var = sum((w - mean_w) ** 2 for w in ws)
        return max(0.0, sum((w - mean_w) * (t[w] - mean_t) for w in ws) / var)

    def _build(self, top: int) -> list[float]:
        """Every width's estimate up to ``top`` (at least the widest seen): the seen widths' :meth:`monotone` times,
        interpolated between them, extrapolated beyond them."""
        t = self.monotone()
        ws = sorted(t)
        first, last = ws[0], ws[-1]
        own = [0.0] * (top + 1)
        if first > 1 or top > last:   # widths beyond those seen: extrapolated
            slope = self.fitted_slope()
            if slope is None:
                per_token = None if self.base is None else self.base.fitted_slope()
                slope = self.prior_slope * t[first] if per_token is None else self.batch * per_token
            for w in range(1, first):
                own[w] = max(1e-9, t[first] + slope * (w - first))
            for w in range(last + 1, top + 1):
                own[w] = t[last] + slope * (w - last)
        for a, b in zip(ws, ws[1:]):   # seen widths, and the widths between two seen ones interpolated
            ta, tb = t[a], t[b]
            own[a] = ta
            for w in range(a + 1, b):
                own[w] = ta + (tb - ta) * (w - a) / (b - a)
        own[last] = t[last]
        own[0] = own[1]
        return own


@dataclass
class DepthAcceptance:
    """p_d = P(drafted token d accepted | tokens 1..d-1 accepted), from counts that decay by ``decay`` at each
    observation, with a prior worth ``prior_weight`` observations: ``prior`` at depth 1 and p_{d-1} below it --
    or, with a ``parent``, the parent's p_d (a count for one match length starts from the count over all of
    them)."""
    decay: float = 0.9
    prior: float = 0.5
    prior_weight: float = 1.0
    accepted: list[float] = field(default_factory=list)
    tested: list[float] = field(default_factory=list)
    parent: "DepthAcceptance | None" = None
    _expected: dict = field(default_factory=dict, repr=False, compare=False)  # expected_tokens(k), until observe

    def p(self, depth: int) -> float:
        return self.ps(depth)[-1]

    def ps(self, k: int) -> list[float]:
        """[p_1 .. p_k]. Each depth's count starts from a prior: the parent's p_d if there is a parent, else
        ``prior`` at depth 1 and p_{d-1} deeper, so that a depth the controller has not sent tokens to yet is
        expected to do as the one before it (with a fixed prior instead, a depth that failed twice early would
        look worse than plain decoding and never be tried again)."""
        parent = self.parent.ps(k) if self.parent is not None else None
        out, prior = [], self.prior
        for i in range(k):
            a = self.accepted[i] if i < len(self.accepted) else 0.0
            n = self.tested[i] if i < len(self.tested) else 0.0
            if parent is not None:
                prior = parent[i]
            prior = (a + prior * self.prior_weight) / (n + self.prior_weight)
            out.append(prior)
        return out

    def observe(self, proposed: int, accepted: int, censored: bool = False) -> None:
        """A chain of ``proposed`` tokens of which the first ``accepted`` stood (depths 1..accepted accepted, the
        next one tested and rejected, deeper ones never tested). ``censored``: the first ``accepted`` stood and
        nothing is known of the next one (a proposal checked against fewer decided tokens than it has)."""
        tested = accepted if censored else min(proposed, accepted + 1)
        self._expected.clear()
        while len(self.tested) < tested:
            self.tested.append(0.0)
            self.accepted.append(0.0)
        for i in range(tested):
            self.tested[i] = self.decay * self.tested[i] + 1.0
            self.accepted[i] = self.decay * self.accepted[i] + float(i < accepted)

    def carried(self, weight: float = 2.0, parent: "DepthAcceptance | None" = None) -> "DepthAcceptance":
        """A prior for the next generation: the same p_d, each depth worth at most ``weight`` observations."""
        out = DepthAcceptance(self.decay, self.prior, self.prior_weight, parent=parent)
        for a, n in zip(self.accepted, self.tested):
            scale = min(1.0, weight / n) if n > 0 else 0.0
            out.accepted.append(a * scale)
            out.tested.append(n * scale)
        return out

    def expected_tokens(self, k: int) -> list[float]:
        """E(0..k): the tokens a round yields with a chain of 0..k drafted tokens (the target's own included).
        Kept until the next :meth:`observe` when there is no parent (a draft chain's count changes only in the
        rounds it drafts, and the controller reads it every round)."""
        if k in self._expected:
            return self._expected[k]
        out, e, reach = [1.0], 1.0, 1.0
        for p in self.ps(k):
            reach *= p
            e += reach
            out.append(e)
        if self.parent is None:
            self._expected[k] = out
        return out


@dataclass
class TreeCalibration:
    """How far a scored drafter's own estimates are to be trusted, depth by depth: at depth d, the rounds whose
    tree was found to get past depth d (``reached``) over the sum of the tree's own probability of getting there
    (``expected``, the sum of its depth-d nodes' probabilities), both with exponential forgetting (``decay`` per
    observation) and a prior of ``prior_weight`` expected tokens at ratio 1 (the counts believed until measured),
    or, with a ``parent``, at the parent's ratio (a calibration for one match length starts from the one over all
    of them). A depth the round's decided tokens did not reach is left out (censored): nothing is known there."""
    decay: float = 0.9
    prior_weight: float = 1.0
    reached: list[float] = field(default_factory=list)
    expected: list[float] = field(default_factory=list)
    parent: "TreeCalibration | None" = None

    def ratio(self, depth: int) -> float:
        """c_d for depth ``depth`` (1-based); a depth never observed takes the deepest ratio known (or the
        parent's ratio at that depth)."""
        prior = 1.0 if self.parent is None else self.parent.ratio(depth)
        i = min(depth, len(self.reached)) - 1
        if i < 0:
            return prior
        if self.parent is not None and depth > len(self.reached):
            return prior
        return (self.reached[i] + self.prior_weight * prior) / (self.expected[i] + self.prior_weight)

    def expected_tokens(self, by_depth: list[float]) -> float:
        """The accepted tokens a tree is expected to yield: sum_d c_d P_d, P_d = ``by_depth[d - 1]``."""
        return sum(self.ratio(d + 1) * p for d, p in enumerate(by_depth))

    def observe(self, by_depth: list[float], reached: int, known: int) -> None:
        """One tree with depth probabilities ``by_depth``: it got past depths 1..``reached``, and depths up to
        ``known`` (>= reached) are known (deeper ones: censored)."""
        known = min(known, len(by_depth))
        while len(self.reached) < known:
            self.reached.append(0.0)
            self.expected.append(0.0)
        for i in range(known):
            self.reached[i] = self.decay * self.reached[i] + float(i < reached)
            self.expected[i] = self.decay * self.expected[i] + by_depth[i]

    def overall(self) -> float:
        """The trees' reached depths over their own expectation, all depths together (what Lesson 15 prints)."""
        return (sum(self.reached) + self.prior_weight) / (sum(self.expected) + self.prior_weight)

    def carried(self, weight: float = 2.0, parent: "TreeCalibration | None" = None) -> "TreeCalibration":
        """A prior for the next generation: the same ratios, each depth worth at most ``weight`` expected tokens."""
        out = TreeCalibration(self.decay, self.prior_weight, parent=parent)
        for r, e in zip(self.reached, self.expected):
            scale = min(1.0, weight / e) if e > 0 else 0.0
            out.reached.append(r * scale)
            out.expected.append(e * scale)
        return out


def depth_probabilities(proposal: Proposal, probs: list[float]) -> list[float]:
    """P_d for d = 1, 2, ...: the sum of the probabilities ``probs`` (one per candidate, in order) of the
    ``proposal``'s candidates at depth d."""
    depths = tree_depths(proposal.parents)[1:]
    out = [0.0] * max(depths, default=0)
    for d, q in zip(depths, probs):
        out[d - 1] += q
    return out


def reached_depth(proposal: Proposal, decided: list[int]) -> int:
    """How deep the decided tokens walk down the ``proposal``'s tree from its root: the depth a round that sent
    it would have accepted."""
    kids = children_of(proposal.parents)
    node, depth = 0, 0
    for t in decided:
        node = next((c for c in kids[node] if proposal.tokens[c] == t), None)
        if node is None:
            break
        depth += 1
    return depth


@dataclass
class Option:
    """One way to make a round: ``kind`` is ``"cheap"`` (a copying drafter whose proposal is made first and then
    cut to the best length), ``"chain"`` (a draft model whose gamma is chosen before it drafts) or ``"arm"``
    (any other proposer, used as it is)."""
    name: str
    proposer: Proposer
    kind: str
    acceptance: DepthAcceptance = field(default_factory=DepthAcceptance)
    by_match: dict = field(default_factory=dict)  # cheap: match length -> its own DepthAcceptance
    seconds_per_token: float | None = None   # chain: drafting time per drafted token
    catch_up_seconds: float | None = None    # chain: the draft's catch-up time per token read (a long backlog)
    arm_tokens: float | None = None          # arm: tokens per round (moving average)
    arm_seconds: float | None = None         # arm: seconds per round (moving average)
    calibration: TreeCalibration = field(default_factory=TreeCalibration)  # cheap, scored: its estimates' reliability
    calibration_by_match: dict = field(default_factory=dict)  # match length -> its own TreeCalibration
    last_round: int = -1                     # the round it was last taken in
    backoff: int = 8                         # rounds before it is re-tried while it loses
    try_loss: float | None = None            # chain: seconds a round of it loses against plain (moving average)

    def acceptance_for(self, match: int | None) -> DepthAcceptance:
        """The acceptance counted for proposals after a match of this length (None: the count over all of them,
        which is each match length's prior)."""
        if match is None:
            return self.acceptance
        if match not in self.by_match:
            self.by_match[match] = DepthAcceptance(parent=self.acceptance)
        return self.by_match[match]

    def observe_calibration(self, match: int | None, by_depth: list[float], reached: int, known: int) -> None:
        """Count one proposal in the calibration over all match lengths and, if it says one, in its match
        length's (:meth:`TreeCalibration.observe`), as its acceptance is counted in both."""
        self.calibration.observe(by_depth, reached, known)
        if match is not None:
            self.calibration_for(match).observe(by_depth, reached, known)

    def calibration_for(self, match: int | None) -> TreeCalibration:
        """A copying or scored option's calibration for proposals made after a match of this length (None: over all
        of them, the prior of each match length's): on open text a copy or a tree grown from a one-token match is a
        far weaker bet than its counts say, one grown from a long match nearly as good as they say."""
        if match is None:
            return self.calibration
        if match not in self.calibration_by_match:
            self.calibration_by_match[match] = TreeCalibration(parent=self.calibration)
        return self.calibration_by_match[match]


@dataclass
class BatchChoice:
    """For a batch of one size (two sequences or more): whether its sequences speculate this round or all step
    plainly, chosen as an arm by the whole batch's measured tokens per second per sequence (moving averages). In a
    batch one sequence's wide proposal makes every sequence's pass wider, a cost that sequence's own controller
    does not see; the batch's rate does (the mean over its sequences while requests wait for a place, else its
    slowest sequence's: :meth:`Auto._book_batch_round`). Plain is measured first, then speculation; the mode that
    loses is re-tried as an arm is (:meth:`Auto._update_arm_backoff`): once the rounds since its last try make what
    a try loses ``PROBE_BUDGET`` of the time, between 8 and ``PROBE_WAIT_MAX`` rounds (``probing`` says a round is
    such a re-try: a re-tried speculation offers only the options whose proposals cost no model pass,
    :meth:`Auto.propose_batch`). A size not seen yet starts from the nearest size's choice
    (:meth:`Auto._batch_choice`).
    A batch of one has none: its sequence's controller already weighs the whole cost."""
    rate: dict = field(default_factory=dict)        # "plain" / "speculate" -> tokens per second per sequence
    tokens: dict = field(default_factory=dict)      # mode -> tokens per sequence per round
    last: dict = field(default_factory=dict)        # mode -> the round it was last taken in
    backoff: int = 8
    round: int = 0
    probing: bool = False   # whether the mode just chosen is a re-try of the mode that lost
    taken: dict = field(default_factory=dict)       # mode -> rounds it was taken in

    def book(self, mode: str, rate: float, smoothing: float, tokens: float = 1.0) -> None:
        """The batch's tokens per second per sequence in a round taken in ``mode``, which made ``tokens`` per
        sequence; then the losing mode's wait: a try of it makes n_o tokens in n_o / r_o seconds, which the best mode
        makes in n_o / r_b, and the rounds of the best mode between two tries (n_b / r_b seconds each) make that loss
        ``PROBE_BUDGET`` of the time."""
        for d, x in ((self.rate, rate), (self.tokens, tokens)):
            d[mode] = x if mode not in d else d[mode] + smoothing * (x - d[mode])
        if len(self.rate) == 2:
            best = self.best()
            other = _other(best)
            loss = self.tokens[other] * (1.0 / self.rate[other] - 1.0 / self.rate[best])
            self.backoff = probe_wait(loss, self.tokens[best] / self.rate[best])

    def best(self) -> str:
        return max(self.rate, key=self.rate.get) if self.rate else "speculate"

    def choose(self) -> str:
        self.round += 1
        self.probing = False
        for mode in (PLAIN, "speculate"):
            if mode not in self.rate:          # each mode is measured once before either is trusted
                return self._take(mode)
        best, other = self.best(), _other(self.best())
        if self.round - self.last.get(other, 0) >= self.backoff:
            self.probing = True
            return self._take(other)           # a probe; if it wins, its mode is taken from now on
        return self._take(best)

    def _take(self, mode: str) -> str:
        self.last[mode] = self.round
        self.taken[mode] = self.taken.get(mode, 0) + 1
        return mode


def probe_wait(loss: float, round_seconds: float, budget: float = PROBE_BUDGET) -> int:
    """Rounds to wait before re-trying an option whose try loses ``loss`` seconds against the best option, whose
    rounds take ``round_seconds``: the rounds in between make the loss ``budget`` of the time (at least 8
    rounds, at most ``PROBE_WAIT_MAX``; 8 when a try does not lose)."""
    if loss <= 0:
        return 8
    return int(min(max(8.0, loss / (budget * round_seconds)), PROBE_WAIT_MAX))


def _other(mode: str) -> str:
    return PLAIN if mode == "speculate" else "speculate"


@dataclass
class Memory:
    """What the controller keeps across generations on one machine: the round times by pass width (one table per
    torch thread count and batch size, since both change them; a batch's table starts from the one-sequence
    table's slope, :class:`RoundTimes`), each chain's drafting and catch-up seconds per token and each arm's
    seconds per round, by option name and batch size (:func:`_drafting_key`); and, as priors for the next
    generation, the last generation's acceptance (by option and match length), each arm's tokens per round, each
    option's back-off and each scored option's :class:`TreeCalibration`; and for each batch size, whether its
    sequences speculate (:class:`BatchChoice`). Share one between controllers of the same models (the registry
    keeps one per :class:`~.registry.Models`); :meth:`clear` forgets it all."""
    times: dict = field(default_factory=dict)
    seconds_per_token: dict = field(default_factory=dict)
    catch_up_seconds: dict = field(default_factory=dict)
    arm_seconds: dict = field(default_factory=dict)
    arm_tokens: dict = field(default_factory=dict)
    acceptance: dict = field(default_factory=dict)   # (option, match length or None) -> DepthAcceptance
    backoff: dict = field(default_factory=dict)
    try_loss: dict = field(default_factory=dict)
    calibration: dict = field(default_factory=dict)
    calibration_by_match: dict = field(default_factory=dict)   # (option, match length) -> TreeCalibration
    batch: dict = field(default_factory=dict)        # (threads, batch size) -> BatchChoice

    def round_times(self, smoothing: float, batch: int = 1) -> RoundTimes:
        """The table of round times for this thread count and ``batch`` sequences decoded together."""
        key = (torch.get_num_threads(), batch)
        if key not in self.times:
            base = None if batch == 1 else self.round_times(smoothing)
            self.times[key] = RoundTimes(smoothing, base=base, batch=batch)
        return self.times[key]

    def clear(self) -> None:
        for d in (self.times, self.seconds_per_token, self.catch_up_seconds, self.arm_seconds, self.arm_tokens,
                  self.acceptance, self.backoff, self.try_loss, self.calibration, self.calibration_by_match,
                  self.batch):
            d.clear()


def _drafting_key(name: str, batch: int):
    """Where :class:`Memory` keeps a chain's drafting time per position and an arm's seconds per round: under the
    option's name for one sequence, under (name, B) for a batch of B (one draft pass then serves B sequences, and
    an arm's round is the whole batch's pass, padded to the widest proposal: a solo round's seconds would make an
    arm look B times cheaper than the batch's plain round it is compared with)."""
    return name if batch == 1 else (name, batch)


def _match(o: Option) -> int | None:
    """The match length of a copying option's last proposal (capped at MATCH_CAP), or None if it says none."""
    match = getattr(o.proposer, "last_match", None)
    return None if match is None else min(match, MATCH_CAP)


def _kind(proposer: Proposer) -> str:
    if getattr(proposer, "cheap", False) or isinstance(proposer, Lookup):
        return "cheap"
    if getattr(proposer, "scored", False):
        return "scored"
    if isinstance(proposer, Chain):
        return "chain"
    return "arm"


class Auto(Proposer):
    """The controller: each round, the option with the highest expected tokens per second (see the module
    docstring), plain decoding included. ``options``: name -> proposer (at most one with a draft model, since a
    session keeps one draft cache); ``gamma_max``: the longest chain a draft model is asked for; ``max_send``: the
    most copied tokens sent in one round; ``smoothing``: weight of the newest round in the moving averages;
    ``clock``: the timer (``time.perf_counter``; tests pass a fake one); ``memory``: the :class:`Memory` to keep
    the machine's measurements in across generations (default: this controller's own); ``calibrate_copies``:
    scale a copying option's promise by how the rounds its counts would send really fared (the module docstring;
    False: trust the counts). Choices follow measured time, so a seeded sampled run is distributed as the
    target's but not reproducible from its seed alone."""
    batched = True   # in a batch, the sequences that chose the draft chain draft together (_draft_chains)
    timed = True     # its choices follow measured time: the same request, decoded twice, may take other rounds
    lazy_draft = True  # the draft catches up when the chain is first chosen (Chain.feed_batch), if it ever is

    def __init__(self, options: dict[str, Proposer], gamma_max: int = 8, max_send: int = 32, smoothing: float = 0.3,
                 clock=time.perf_counter, memory: Memory | None = None, calibrate_copies: bool = True):
        drafts = {id(p.draft) for p in options.values() if p.draft is not None}
        if len(drafts) > 1:
            raise ValueError("auto: at most one option may use a draft model (a session keeps one draft cache)")
        if PLAIN in options:
            raise ValueError(f"auto: {PLAIN!r} is always an option; don't pass it")
        self.options = [Option(name, p, _kind(p)) for name, p in options.items()]
        self.gamma_max, self.max_send, self.smoothing, self.clock = gamma_max, max_send, smoothing, clock
        self.calibrate_copies = calibrate_copies
        # the options that are re-tried (a chain, the arms) share the budget of time their losing tries may cost
        self.probe_budget = PROBE_BUDGET / max(1, sum(o.kind in ("chain", "arm") for o in self.options))
        self.memory = Memory() if memory is None else memory
        self.draft = next((p.draft for p in options.values() if p.draft is not None), None)
        wanted = {p.needs_hidden for p in options.values() if p.needs_hidden}
        if len(wanted) > 1:
            raise ValueError(f"auto: the options read different target features ({sorted(map(str, wanted))}); "
                             "a pass records one kind")
        self.needs_hidden = wanted.pop() if wanted else False
        widths = [1]
        for o in self.options:
            widths.append(1 + gamma_max if o.kind == "chain" else
                          min(o.proposer.max_width, 1 + max_send) if o.kind == "cheap" else o.proposer.max_width)
        self.max_width = max(widths)
        self.reset()

    def reset(self) -> None:
        """A new generation: round times and drafting costs from :attr:`memory`; acceptance, an arm's tokens per
        round and the back-offs from it as priors (:meth:`DepthAcceptance.carried`)."""
        self.times = self.memory.round_times(self.smoothing)
        self.round = 0
        self.choices: list[tuple[str, int, int]] = []  # per round: option, tokens proposed, tokens kept
        self._pending = None  # (option or None, width, t_start, t_drafted, round-time table) of the round in flight
        self._copies = {}     # this round's copying proposals: name -> (proposal, match length)
        self._tokens = 1
        self.probe_only = False  # set by the batch's choice: a re-try of speculation, with no model drafter
        self._chosen = None      # (chain option, round start) while its drafting is pending
        self._batch_round = None  # the batch round in flight: (mode, start, sequences, BatchChoice or None)
        self._batch = 1           # how many sequences this one's rounds are decoded with (set by propose_batch)
        self._catch_ups = [o.proposer.catch_up for o in self.options if hasattr(o.proposer, "catch_up")]
        for o in self.options:
            m = self.memory
            o.acceptance = m.acceptance[o.name, None].carried() if (o.name, None) in m.acceptance else DepthAcceptance()
            o.by_match = {match: a.carried(parent=o.acceptance) for (name, match), a in m.acceptance.items()
                          if name == o.name and match is not None}
            o.seconds_per_token = m.seconds_per_token.get(o.name)
            o.catch_up_seconds = m.catch_up_seconds.get(o.name)
            o.arm_seconds = m.arm_seconds.get(o.name)
            o.arm_tokens = m.arm_tokens.get(o.name)
            o.last_round, o.backoff = -1, m.backoff.get(o.name, 8)   # the wait it had left
            o.try_loss = m.try_loss.get(o.name)
            o.calibration = m.calibration[o.name].carried() if o.name in m.calibration else TreeCalibration()
            o.calibration_by_match = {match: c.carried(parent=o.calibration) for (name, match), c in
                                      m.calibration_by_match.items() if name == o.name}

    def start(self, session) -> None:
        """A new generation: every option started, the measurements taken from :attr:`memory` (:meth:`reset`)."""
        self.reset()
        for o in self.options:
            o.proposer.start(session)

    def finish(self, progress) -> None:
        """The generation ended: its last round is booked, what it measured goes to :attr:`memory` as the next
        generation's priors, and every option hears it (suffix decoding keeps the output for later requests)."""
        self._close_round(self.clock())
        for o in self.options:
            if o.acceptance.tested:
                self.memory.acceptance[o.name, None] = o.acceptance
            for match, a in o.by_match.items():
                self.memory.acceptance[o.name, match] = a
            if o.arm_tokens is not None:
                self.memory.arm_tokens[o.name] = o.arm_tokens
            self.memory.backoff[o.name] = max(0, o.backoff - (self.round - max(o.last_round, 0)))  # the wait left
            if o.try_loss is not None:
                self.memory.try_loss[o.name] = o.try_loss
            self.memory.calibration[o.name] = o.calibration
            for match, c in o.calibration_by_match.items():
                self.memory.calibration_by_match[o.name, match] = c
            o.proposer.finish(progress)

    def fork(self) -> "Auto":
        """A copy for another sequence of a batch, with copies of the options (each its own measurements)."""
        twin = copy.copy(self)
        twin.options = [Option(o.name, o.proposer.fork(), o.kind) for o in self.options]  # memory: shared
        return twin

    def propose_batch(self, seqs, rooms) -> list[Proposal]:
        """Each sequence's own copy decides, from the round times of batches of this size (a table of its own in
        :attr:`memory`, shared by the copies); then every copy books this round at the batch's widest proposal:
        the batch's pass is padded to it, so the table holds what a batch round that wide costs, whichever
        sequence made it wide."""
        now, B = self.clock(), len(seqs)
        self._book_batch_round(now, seqs)
        if B == 1:   # no other sequence pays for its proposal: its own controller weighs the whole cost
            mode, choice, probe_only = "speculate", None, False
        else:
            choice = self._batch_choice(B)
            mode = choice.choose()
            # a re-try of speculation after it lost offers only the options whose proposals cost no model pass:
            # the copying and scored drafters (prompt lookup, suffix decoding). A model drafter that sat out the last
            # rounds must first catch up on every token since (for every sequence: at B = 8 several plain rounds'
            # time), which pays only if the batch goes on speculating; it is offered again once speculation is the
            # batch's choice
            probe_only = choice.probing and mode != PLAIN
        self._batch_round = (mode, now, list(seqs), choice)
        times = self.memory.round_times(self.smoothing, batch=B)   # a batch of B sequences has its own table
        for s in seqs:
            s.proposer.times, s.proposer.probe_only, s.proposer._batch = times, probe_only, B
        if mode == PLAIN:   # every sequence steps plainly: only the bookkeeping every round needs
            for s in seqs:
                s.proposer._begin_round(s, now)
            return [s.proposer._start(None, Proposal([s.seq[-1]], [-1]), now) for s in seqs]
        for s in seqs:
            for o in s.proposer.options:   # drafting for B sequences at once costs its own time per position
                if o.kind == "chain":   # until timed at this size, one sequence's times are the prior
                    o.seconds_per_token = self.memory.seconds_per_token.get(
                        _drafting_key(o.name, B), self.memory.seconds_per_token.get(o.name))
                    o.catch_up_seconds = self.memory.catch_up_seconds.get(
                        _drafting_key(o.name, B), self.memory.catch_up_seconds.get(o.name))
                elif o.kind == "arm":
                    o.arm_seconds = self.memory.arm_seconds.get(_drafting_key(o.name, B))
        decided = [s.proposer._decide(s, r) for s, r in zip(seqs, rooms)]
        drafting = [i for i, d in enumerate(decided) if d is None]   # those that chose the chain
        if drafting:
            made = self._draft_chains([seqs[i].proposer for i in drafting], [seqs[i] for i in drafting],
                                      [rooms[i] for i in drafting], B)
            for i, p in zip(drafting, made):
                decided[i] = p
        proposals = decided
        widest = max(len(p.tokens) + len(p.extra_tokens) for p in proposals)
        for s in seqs:
            pending = getattr(s.proposer, "_pending", None)
            if pending is not None:
                s.proposer._pending = (pending[0], widest, *pending[2:])
        return proposals

    def _book_batch_round(self, now: float, seqs) -> None:
        """Book the last batch round into the choice that made it, if nothing but its own work came since (no
        sequence admitted, whose prefill would be in the time): its tokens per sequence (those that finished in it
        included) per second. With requests waiting, a sequence that finishes early gives its place to the next
        one, so the batch's throughput counts: the mean over its sequences. With none waiting (a fixed batch, or
        a queue run dry) the batch ends with its slowest sequence, and one that gets ahead frees nothing: the
        least any of its sequences made."""
        if self._batch_round is None:
            return
        mode, start, last, choice = self._batch_round
        ids = {id(s) for s in last}
        if choice is not None and all(id(s) in ids for s in seqs):
            made = [s.proposer._tokens for s in last]
            tokens = sum(made) / len(made) if self.waiting else min(made)
            choice.book(mode, tokens / max(now - start, 1e-9), self.smoothing, tokens)

    def _batch_choice(self, B: int) -> "BatchChoice":
        """The choice for batches of B sequences; a size not seen yet starts as a copy of the nearest size seen (a
        batch whose sequences finish one by one goes on from what it learnt, instead of measuring both modes
        again at every size; its own rounds soon replace the copied rates)."""
        threads = torch.get_num_threads()
        key = (threads, B)
        if key not in self.memory.batch:
            seen = [b for t, b in self.memory.batch if t == threads]
            nearest = min(seen, key=lambda b: (abs(b - B), b)) if seen else None
            self.memory.batch[key] = (BatchChoice() if nearest is None
                                      else copy.deepcopy(self.memory.batch[threads, nearest]))
        return self.memory.batch[key]

    # -- deciding ---------------------------------------------------------------------------------------------
    def _due(self, o: Option) -> bool:
        """Whether a losing option is re-tried this round (a copying or scored option never needs to be: it is
        checked every round, :meth:`_observe_copy` and :meth:`_observe_tree`)."""
        return o.kind not in ("cheap", "scored") and self.round - o.last_round >= o.backoff

    def _best_length(self, acceptance: DepthAcceptance, most: int, draft_cost: float,
                     fixed_cost: float = 0.0) -> tuple[float, int]:
        """(expected tokens per second, k) of the best chain length k in 1..most under ``acceptance``, drafting
        costing ``draft_cost`` per token plus ``fixed_cost`` per round."""
        best = (0.0, 0)
        times = self.times.table(most + 1)
        if times is None:
            return best
        for k, e in enumerate(acceptance.expected_tokens(most)):
            if k:
                best = max(best, (e / (times[k + 1] + draft_cost * k + fixed_cost), k))
        return best

    def _copy_lengths(self, acceptance: DepthAcceptance, most: int, calibration: TreeCalibration | None):
        """A copying option's best length in 1..most, in one pass over its depths: ((rate, k) by its counts alone,
        (rate, k) with the chance of getting past each depth d scaled by the ``calibration``'s c_d (None: the
        counts' own again), and [P_1 .. P_k] of the counts' own k, on which the calibration is measured)."""
        raw = scaled = (0.0, 0)
        times = self.times.table(most + 1)
        if times is None:
            return raw, scaled, []
        e_raw = e_scaled = reach = 1.0
        reaches = []
        for k, p in enumerate(acceptance.ps(most), start=1):
            reach *= p
            reaches.append(reach)
            e_raw += reach
            raw = max(raw, (e_raw / times[k + 1], k))
            if calibration is not None:
                e_scaled += calibration.ratio(k) * reach
                scaled = max(scaled, (e_scaled / times[k + 1], k))
        return raw, (raw if calibration is None else scaled), reaches[:raw[1]]

    def _catch_up_cost(self, o: Option, session, room: int) -> float:
        """What a return to the chain adds to its round: first the draft reads every token it has not seen
        (:meth:`~.chain.Chain.feed_batch`). After one round of another option that is one more draft pass, charged
        to this round. After a long absence, or at the start of a generation (the draft is fed lazily), it is the
        whole backlog -- at first the prompt -- a cost paid once and recovered only over the chain rounds that
        follow: that part is spread over the rounds left in this generation if the chain made them all (``room`` ÷
        the chain's expected tokens per round, at least one round). At the start of a long generation of one
        sequence it adds little; in a batch, whose every sequence waits for all the backlogs, or near the end of a
        generation, it can outweigh what the chain would save."""
        if o.last_round == self.round - 1:
            return 0.0                      # the draft saw every token but the newest: nothing to catch up
        cost = o.seconds_per_token
        if o.catch_up_seconds is not None:
            behind = len(session.draft_backlog)
            rounds_left = max(1.0, room / o.acceptance.expected_tokens(self.gamma_max)[-1])
            # in a batch every sequence waits for the catch-up pass, which reads the backlogs of all the sequences
            # that return to the chain: counted as if all B did (the round times are the batch's too)
            cost += o.catch_up_seconds * behind * self._batch / rounds_left
        return cost

    def propose(self, session: Session, room: int) -> Proposal:
        proposal = self._decide(session, room)
        return self._draft_chains([self], [session], [room], 1)[0] if proposal is None else proposal

    def _begin_round(self, session, now: float) -> None:
        """What every round does first, whatever it sends: book the last round's time, count this one, and let the
        options that read every round's hidden states (EAGLE's head) note them, so they keep up when not chosen."""
        self._close_round(now)
        self._stats = session.stats
        self.round += 1
        self._copies = {}
        for catch_up in self._catch_ups:
            catch_up(session)

    def _decide(self, session: Session, room: int) -> Proposal | None:
        """This round's choice, as the proposal to send; None when it is the draft chain (its gamma set on it),
        which :meth:`_draft_chains` drafts, for all the sequences of a batch that chose it at once."""
        now = self.clock()
        self._begin_round(session, now)
        root = session.seq[-1]
        # a plain round: no room left, or the first round, which measures t(1)
        t_plain = None if room < 1 else self.times(1)
        if t_plain is None:
            return self._start(None, Proposal([root], [-1]), now)
        best_rate, best = 1.0 / t_plain, None
        cheap_proposals = self._copies
        for o in self.options:
            if self.probe_only and o.kind not in ("cheap", "scored"):
                continue
            if o.kind == "cheap":
                prop = o.proposer.propose(session, min(room, self.max_send))
                if len(prop.candidates) == 0:
                    continue
                if not prop.is_chain:
                    raise ValueError(f"auto: the cheap option {o.name!r} must propose a chain")
                (raw_rate, _), (rate, k), reach = self._copy_lengths(
                    o.acceptance_for(_match(o)), len(prop.candidates),
                    o.calibration_for(_match(o)) if self.calibrate_copies else None)
                # a round its own counts would send is one the counts look best in: its calibration is measured
                # on those rounds, sent or not (see _observe_copy), and scales the counts' promise
                judged = self.calibrate_copies and raw_rate > 1.0 / t_plain
                cheap_proposals[o.name] = (prop, _match(o), reach if judged else None)
                if rate > best_rate:
                    best_rate, best = rate, (o, k)
            elif o.kind == "scored":
                prop = o.proposer.propose(session, room)
                if len(prop.candidates) == 0:
                    continue
                width = len(prop.tokens) + len(prop.extra_tokens)
                by_depth = depth_probabilities(prop, o.proposer.last_probs)
                t_width = self.times(width)
                rate = (1 + o.calibration_for(_match(o)).expected_tokens(by_depth)) / t_width
                # calibrated on the rounds its own counts would send (all rounds without calibrate_copies)
                judged = not self.calibrate_copies or (1 + sum(by_depth)) / t_width > 1.0 / t_plain
                cheap_proposals[o.name] = (prop, by_depth if judged else None, _match(o))
                if rate > best_rate:
                    best_rate, best = rate, (o, None)
            elif o.kind == "chain":
                most = min(self.gamma_max, room)
                if o.seconds_per_token is None:   # never drafted yet: try a short chain to measure it
                    rate, k = float("inf"), min(2, most)
                else:
                    rate, k = self._best_length(o.acceptance, most, o.seconds_per_token,
                                                self._catch_up_cost(o, session, room))
                    if self._due(o) and rate <= best_rate:
                        rate, k = best_rate * (1 + 1e-9), min(2, most)
                if rate > best_rate:
                    best_rate, best = rate, (o, k)
            else:
                # never measured at this batch size: tried once to measure it
                rate = float("inf") if o.arm_tokens is None or o.arm_seconds is None else o.arm_tokens / o.arm_seconds
                if self._due(o) and rate <= best_rate:
                    rate = best_rate * (1 + 1e-9)
                if rate > best_rate:
                    best_rate, best = rate, (o, None)
        if best is None:
            return self._start(None, Proposal([root], [-1]), now)
        o, k = best
        if o.kind == "cheap":
            return self._start(o, Proposal.chain(root, cheap_proposals[o.name][0].candidates[:k]), now)
        if o.kind == "scored":
            return self._start(o, cheap_proposals[o.name][0], now)
        if o.kind == "chain":
            o.proposer.gamma = k
            self._chosen = (o, now)
            return None
        return self._start(o, o.proposer.propose(session, room), now)

    def _draft_chains(self, controllers: list["Auto"], seqs: list, rooms: list[int], batch: int) -> list[Proposal]:
        """The chains that ``controllers`` (this one, or the copies of a batch's sequences) chose this round, drafted
        together: first one draft pass catches every draft up on the tokens it has not seen (timed neither as
        drafting nor in the round: it is paid once per return to the chain), then one draft pass per drafted
        position serves all of them (:meth:`~.chain.Chain.propose_batch`). The drafting time per position is
        booked for batches of this size (``batch``; solo under the option's name) and every round starts."""
        chains = [c._chosen[0].proposer for c in controllers]
        behind = sum(len(s.draft_backlog) for s in seqs)
        t_feed = self.clock()
        chains[0].feed_batch(seqs)
        t0 = self.clock()
        if behind >= CATCH_UP_MEASURED:   # a long backlog's time per token (a short one is one draft pass)
            self._book_drafting(controllers, "catch_up_seconds", (t0 - t_feed) / behind, batch)
        proposals = chains[0].propose_batch_for(chains, seqs, rooms)
        drafted_at = self.clock()
        most = max(len(p.candidates) for p in proposals)
        if most:
            self._book_drafting(controllers, "seconds_per_token", (drafted_at - t0) / most, batch)
        return [c._start(c._chosen[0], p, c._chosen[1], drafted_at=drafted_at) for c, p in zip(controllers, proposals)]

    def _book_drafting(self, controllers: list["Auto"], what: str, seconds: float, batch: int) -> None:
        """Fold one measurement of the chain's ``what`` (``"seconds_per_token"`` or ``"catch_up_seconds"``) into its
        moving average, kept in :attr:`memory` for batches of this size and on every controller that drafted."""
        first = controllers[0]._chosen[0]
        old = getattr(first, what)
        new = seconds if old is None else old + self.smoothing * (seconds - old)
        getattr(self.memory, what)[_drafting_key(first.name, batch)] = new
        for c in controllers:
            setattr(c._chosen[0], what, new)

    def _start(self, o: Option | None, proposal: Proposal, t_start: float, drafted_at: float | None = None) -> Proposal:
        width = len(proposal.tokens) + len(proposal.extra_tokens)
        self._pending = (o, width, t_start, drafted_at, self.times)   # booked in the table the round was decided by
        return proposal

    # -- learning ---------------------------------------------------------------------------------------------
    def observe(self, proposal: Proposal, verified: Verified) -> None:
        o = self._pending[0]
        kept = len(verified.path)
        self._tokens = kept + 1   # what this round made (a batch books its rounds by it, plain ones included)
        self.choices.append((PLAIN if o is None else o.name, len(proposal.tokens) - 1, kept))
        self._stats.choices.append((self.choices[-1][0], kept + 1))
        for other in self.options:  # every copying option's whole proposal, sent or not, against what was decided
            if other.name in self._copies:
                if other.kind == "cheap":
                    self._observe_copy(other, *self._copies[other.name], verified.tokens)
                elif other.kind == "scored" and self._copies[other.name][1] is not None:
                    self._observe_tree(other, *self._copies[other.name], verified.tokens)
        if o is None:
            return
        o.last_round = self.round
        if o.kind == "scored":
            o.proposer.observe(proposal, verified)
        elif o.kind == "chain":
            o.acceptance.observe(len(proposal.candidates), kept)
        elif o.kind != "cheap":
            o.proposer.observe(proposal, verified)

    def _observe_copy(self, o: Option, proposal: Proposal, match: int | None, reach: list[float] | None,
                      decided: list[int]) -> None:
        """Count a copying option's acceptance by depth from its whole proposal of this round, whether it was sent
        (and cut) or not: its candidates against the tokens the round decided (the accepted ones and the target's
        own). A copied candidate is one-hot, so the chance that the target's decided token equals it is the
        chance it would have been accepted (greedy: it is accepted exactly when it equals the target's argmax), and
        counting it against the decided tokens measures acceptance without sending the candidate. Depths past the
        decided tokens stay untested (a censored count). Such an option is never probed: it is measured every
        round, including the plain ones."""
        cands = proposal.candidates
        j = 0
        while j < len(cands) and j < len(decided) and cands[j] == decided[j]:
            j += 1
        censored = j == len(decided) and j < len(cands)
        o.acceptance.observe(len(cands), j, censored)   # over all match lengths
        if match is not None:
            o.acceptance_for(match).observe(len(cands), j, censored)
        if reach is not None:   # its counts would have sent k = len(reach) tokens: how far would they have got?
            k = len(reach)
            reached = min(j, k)
            o.observe_calibration(match, reach, reached, reached if reached == len(decided) < k else k)

    @staticmethod
    def _observe_tree(o: Option, proposal: Proposal, by_depth: list[float], match: int | None,
                      decided: list[int]) -> None:
        """Count a scored option's tree of this round, sent or not, against the tokens the round decided (see
        :meth:`_observe_copy` for why that is its acceptance): the depth they walk down it is reached; below that
        one depth is known missed, unless the decided tokens ran out first (then deeper depths are censored)."""
        reached = reached_depth(proposal, decided)
        o.observe_calibration(match, by_depth, reached, reached if reached == len(decided) else len(by_depth))

    def _close_round(self, now: float) -> None:
        """Book the time of the round that just ended (from its start to now)."""
        if self._pending is None:
            return
        o, width, t_start, drafted_at, times = self._pending
        self._pending = None
        if o is not None and o.kind == "arm":
            secs, toks = max(now - t_start, 1e-9), self._tokens
            o.arm_seconds = secs if o.arm_seconds is None else o.arm_seconds + self.smoothing * (secs - o.arm_seconds)
            o.arm_tokens = toks if o.arm_tokens is None else o.arm_tokens + self.smoothing * (toks - o.arm_tokens)
            self.memory.arm_seconds[_drafting_key(o.name, self._batch)] = o.arm_seconds
            self._update_arm_backoff(o)
            return
        times.add(width, now - (drafted_at if drafted_at is not None else t_start))
        t_plain = self.times(1) if o is not None and o.kind == "chain" else None
        if t_plain is not None:   # the chain's whole round, the draft's catch-up included, against plain steps
            loss = (now - t_start) - self._tokens * t_plain
            o.try_loss = loss if o.try_loss is None else o.try_loss + self.smoothing * (loss - o.try_loss)
            o.backoff = probe_wait(o.try_loss, t_plain, self.probe_budget)

    def _update_arm_backoff(self, o: Option) -> None:
        """An option's wait before its next try, from what a try costs: an arm's round takes ``arm_seconds`` and
        makes ``arm_tokens`` (moving averages), which plain steps would make in ``arm_tokens`` t(1), so a losing
        try costs the difference (a chain's the same, from its ``try_loss``, :meth:`_close_round`). The wait makes
        those losses its share of ``PROBE_BUDGET`` (:attr:`probe_budget`, :func:`probe_wait`): an option that
        loses by little is re-tried soon, one that loses by a lot (a model drafter whose first round of a request
        reads the whole prompt, or whose passes cost more than what it is accepted for) rarely. The wait left goes
        on into the next generation."""
        t_plain = self.times(1)
        if t_plain is not None:
            o.backoff = probe_wait(o.arm_seconds - o.arm_tokens * t_plain, t_plain, self.probe_budget)

    # -- reporting --------------------------------------------------------------------------------------------
    def summary(self) -> dict[str, dict]:
        """Per option (plain included): rounds taken, their share, tokens made, tokens per target pass."""
        return choice_summary([(name, kept + 1) for name, _, kept in self.choices])


def choice_summary(choices: list[tuple[str, int]]) -> dict[str, dict]:
    """(option, tokens the round made) per round -> per option: rounds, share of the rounds, tokens, tokens per
    target pass (:attr:`~.stats.DecodeStats.choices` of one or several generations)."""
    out: dict[str, dict] = {}
    for name, tokens in choices:
        s = out.setdefault(name, dict(rounds=0, tokens=0))
        s["rounds"] += 1
        s["tokens"] += tokens
    for s in out.values():
        s["share"] = s["rounds"] / max(1, len(choices))
        s["tokens_per_pass"] = s["tokens"] / s["rounds"]
    return out
