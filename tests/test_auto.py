"""The speculation controller (minigpt.decoding.auto): exact whatever it chooses, and its choices follow cost.

The controller's decisions follow measured time. To test them without depending on this machine's speed, a fake
clock is advanced by the models themselves (a forward hook adds a fixed cost per pass): a "memory-bound" device
where a target pass costs the same at any width and drafting is cheap, where speculation must win, and a device
where drafting is dear and a wide pass is slow, where plain decoding must win."""
from __future__ import annotations

import copy
import random

from collections import Counter

import pytest
import torch

from conftest import perturbed_copy, random_model
from minigpt.decoding.auto import (PLAIN, Auto, DepthAcceptance, Memory, RoundTimes, TreeCalibration,
                                   depth_probabilities, reached_depth)
from minigpt.decoding.candidates import Proposal
from minigpt.decoding.eagle import Eagle
from minigpt.decoding.session import Proposer
from minigpt.eagle_head import EagleHead
from minigpt.decoding.chain import Chain
from minigpt.decoding.lookup import Lookup
from minigpt.decoding.plain import generate
from minigpt.decoding.session import decode
from minigpt.decoding.suffix import Suffix
from minigpt.exactness import tv_bound, tv_distance
from minigpt.sampling import SamplingConfig


class FakeClock:
    """Time that passes only when a model runs: ``cost(model, n_tokens)`` seconds per forward pass."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def charge(self, model, cost):
        """Add ``cost(n_tokens)`` to the clock at every forward pass of ``model``; returns the hook's handle."""
        def hook(module, args, kwargs):
            idx = args[0] if args else kwargs["idx"]
            self.t += cost(idx.shape[-1])
        return model.register_forward_pre_hook(hook, with_kwargs=True)


def _auto(draft, clock=None):
    extra = {} if clock is None else dict(clock=clock)
    return Auto({"lookup": Lookup(3, 16), "chain": Chain(draft, 4)}, **extra)


def test_a_batch_table_extrapolates_with_b_times_the_solo_slope():
    """A round of width w in a batch of B scores B * w tokens: before a batch's table has seen two widths, it
    extrapolates with B times the one-sequence table's slope per token (its own prior slope without one)."""
    m = Memory()
    solo = m.round_times(1.0)
    solo.add(1, 1.0)
    batch = m.round_times(1.0, batch=4)
    batch.add(1, 2.0)
    assert batch(3) == pytest.approx(2.0 + 2 * 0.05 * 2.0)   # no solo slope yet: the prior one
    solo.add(5, 3.0)                                          # 0.5 s per extra token for one sequence
    batch._table = None
    assert batch(3) == pytest.approx(2.0 + 2 * 4 * 0.5)
    batch.add(2, 2.5)                                         # two widths of its own: its own slope
    assert batch(4) == pytest.approx(3.5)


def test_round_times_interpolate_and_extrapolate():
    rt = RoundTimes(smoothing=1.0)
    assert rt(3) is None
    rt.add(1, 1.0)
    assert rt(5) == pytest.approx(1.0 + 4 * 0.05)  # the prior slope before a second width is seen
    rt.add(5, 2.0)
    assert rt(3) == pytest.approx(1.5)             # between two seen widths
    assert rt(9) == pytest.approx(3.0)             # the fitted slope beyond them


def test_round_times_are_the_closest_non_decreasing_fit_weighted_by_rounds():
    """A pass over more tokens never costs less: the table is non-decreasing in width, and at the seen widths it is
    the weighted isotonic fit of their averages (checked against the max-min formula: the fit at width i is the
    largest over j <= i of the smallest over k >= i of the weighted mean of widths j..k), a width's weight the
    rounds behind it, at most the moving average's effective 2 / smoothing - 1."""
    import random
    rng = random.Random(0)
    for _ in range(300):
        smoothing = rng.choice([0.3, 1.0])
        rt = RoundTimes(smoothing=smoothing)
        for _ in range(rng.randint(1, 25)):
            rt.add(rng.randint(1, 30), rng.uniform(1.0, 3.0))
        table = rt.table(34)
        assert all(a <= b + 1e-12 for a, b in zip(table[1:], table[2:]))
        ws = sorted(rt.by_width)
        weight = [min(rt.rounds[w], 2 / smoothing - 1) for w in ws]

        def mean(j, k):
            return sum(weight[i] * rt.by_width[ws[i]] for i in range(j, k + 1)) / sum(weight[j:k + 1])
        for i, w in enumerate(ws):
            fit = max(min(mean(j, k) for k in range(i, len(ws))) for j in range(i + 1))
            assert table[w] == pytest.approx(fit)
        assert all(rt(w) == table[w] for w in range(1, 35))


def test_one_fast_round_at_a_rare_width_does_not_make_narrower_rounds_cheap():
    """Widths 1 and 2 timed in many rounds, width 4 once and faster than both (noise): the fit pools width 4 with
    width 2, weighted by their rounds, and leaves width 1 alone; capping every width by the wider ones' times
    read all three as 8.5."""
    rt = RoundTimes(smoothing=0.3)
    for _ in range(20):
        rt.add(1, 9.0)
        rt.add(2, 10.5)
    rt.add(4, 8.5)
    most = 2 / 0.3 - 1
    pooled = (10.5 * most + 8.5) / (most + 1)
    assert rt(1) == pytest.approx(9.0)
    assert rt(2) == pytest.approx(pooled) and rt(3) == pytest.approx(pooled) and rt(4) == pytest.approx(pooled)


def test_depth_acceptance_counts_only_tested_depths():
    acc = DepthAcceptance(decay=1.0, prior_weight=0.0)
    acc.observe(proposed=4, accepted=1)   # depth 1 accepted, depth 2 rejected, 3-4 never tested
    acc.observe(proposed=4, accepted=4)
    assert acc.p(1) == 1.0 and acc.p(2) == 0.5 and acc.p(3) == 1.0
    assert acc.expected_tokens(2) == pytest.approx([1.0, 2.0, 2.5])


@pytest.mark.parametrize("regime", ["speculation pays", "plain pays", "real clock"])
def test_greedy_output_is_the_targets_whatever_the_controller_chooses(regime):
    target, draft = random_model(0), random_model(1, n_layer=1)
    clock = FakeClock()
    if regime == "speculation pays":
        clock.charge(target, lambda n: 1.0)
        clock.charge(draft, lambda n: 0.01)
    elif regime == "plain pays":
        clock.charge(target, lambda n: 1.0 + 0.5 * (n - 1))
        clock.charge(draft, lambda n: 2.0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(6):
        prompt = torch.randint(0, 97, (int(torch.randint(2, 12, (1,), generator=gen)),), generator=gen).tolist()
        prompt = prompt + prompt[:5]  # a repeat, so that prompt lookup finds matches
        auto = _auto(draft, clock) if regime != "real clock" else _auto(draft)
        t0 = clock.t
        out, _ = decode(target, prompt, 40, auto)
        t_auto, t0 = clock.t - t0, clock.t
        assert out == generate(target, prompt, 40), regime
        t_plain = clock.t - t0
        shares = auto.summary()
        if regime == "speculation pays":
            assert shares.get(PLAIN, {}).get("share", 0) < 0.2, shares
        if regime == "plain pays":
            # only the first tries, the backed-off probes and copies measured to pay speculate: the chain's two
            # first tries (a draft pass costs two target passes here) cost about 14 of the 40 units of a plain
            # generation; speculating without measuring would cost far more
            assert shares[PLAIN]["share"] > 0.45 and t_auto < 1.45 * t_plain, (shares, t_auto, t_plain)


def test_only_plain_costs_few_probes_on_a_long_generation():
    """When speculation never pays, the probes that keep checking back off: few rounds in 200 speculate."""
    target, draft = random_model(0, block_size=256), random_model(1, n_layer=1, block_size=256)
    clock = FakeClock()
    clock.charge(target, lambda n: 1.0 + 0.5 * (n - 1))
    clock.charge(draft, lambda n: 2.0)
    auto = Auto({"chain": Chain(draft, 4)}, clock=clock)
    decode(target, [1, 2, 3], 200, auto)
    s = auto.summary()
    assert s[PLAIN]["rounds"] >= 190, s


class LosingArm(Proposer):
    """An arm (neither copying nor a chain) whose proposal costs ``cost`` fake seconds and is always rejected: its
    round makes one token, as a plain step does, and loses ``cost`` against it."""

    def __init__(self, clock, reference, cost):
        self.clock, self.reference, self.cost, self.tries = clock, reference, cost, 0

    def propose(self, session, room):
        self.clock.t += self.cost
        self.tries += 1
        wrong = (self.reference[len(session.seq)] + 1) % 50
        return Proposal.chain(session.seq[-1], [wrong, wrong])

    def observe(self, proposal, verified):
        assert not verified.path


@pytest.mark.parametrize("cost, most, least", [(3.0, 3, 1), (0.05, 40, 12)])
def test_a_losing_arm_is_retried_as_often_as_its_loss_allows(cost, most, least):
    """An arm that loses is re-tried once the rounds since its last try make its loss PROBE_BUDGET (1%) of the time,
    and the wait carries over to the next request: over 5 requests of 40 tokens, an arm that loses 3 plain rounds'
    time per try is tried once or twice (re-tried at every request, it was tried at least 5 times), one that loses
    5% of a round every 8 rounds."""
    target = random_model(0)
    clock = FakeClock()
    clock.charge(target, lambda n: 1.0)
    memory, tries = Memory(), 0
    for request in range(5):
        prompt = [5 + request, 6, 7, 8, 9]
        reference = prompt + generate(target, prompt, 40)
        arm = LosingArm(clock, reference, cost)
        auto = Auto({"arm": arm}, clock=clock, memory=memory)
        out, _ = decode(target, prompt, 40, auto)
        assert out == reference[len(prompt):]
        tries += arm.tries
    assert least <= tries <= most, tries


def _three_token_law(model, prompt, cfg: SamplingConfig) -> dict[tuple, float]:
    """The exact distribution of the first three sampled tokens (a support of at most top_k ** 3 outcomes)."""
    law = {(): 1.0}
    with torch.no_grad():
        for _ in range(3):
            nxt = {}
            for seq, pr in law.items():
                p = cfg.probs(model(torch.tensor([prompt + list(seq)]))[0, -1])
                for t in p.nonzero().flatten().tolist():
                    nxt[seq + (t,)] = pr * float(p[t])
            law = nxt
    return law


@pytest.mark.slow
def test_sampled_output_follows_the_target_when_the_controller_speculates():
    """Sampled decoding through the controller, on a device where speculation pays (so the chain drafts from the
    second round on), must draw three tokens from the target's own joint law (top_k=2: 8 outcomes); TV within
    tv_bound(N, 8). A wrong rule that keeps every drafted token fails the same test."""
    target = random_model(8, n_layer=1)
    draft = perturbed_copy(target, 0.8, seed=3)
    cfg = SamplingConfig(1.0, top_k=2)
    prompt = [5, 9, 13]
    law = _three_token_law(target, prompt, cfg)
    outcomes = sorted(law)
    p = torch.tensor([law[o] for o in outcomes] + [0.0])  # the last entry: any outcome outside the support

    def run(n, rule=None):
        clock = FakeClock()
        hooks = [clock.charge(target, lambda k: 1.0), clock.charge(draft, lambda k: 0.01)]
        counts, spec_rounds = Counter(), 0
        bad = 0
        for seed in range(n):
            auto = Auto({"chain": Chain(draft, 4)}, clock=clock)
            out, _ = decode(target, prompt, 3, auto, temperature=1.0, top_k=2, seed=seed, rule=rule)
            counts[tuple(out)] += 1
            bad += tuple(out) not in law
            spec_rounds += sum(name != PLAIN for name, _, _ in auto.choices)
        for h in hooks:
            h.remove()
        assert spec_rounds >= n // 2, "the controller did not speculate: the test would not test it"
        return torch.tensor([counts[o] / n for o in outcomes] + [bad / n])

    n = 1200
    bound = tv_bound(n, len(outcomes))
    good = run(n)
    assert tv_distance(good, p) < bound, f"TV {tv_distance(good, p):.4f} >= bound {bound:.4f}"
    bad = run(n, rule=_accept_everything)
    assert tv_distance(bad, p) > bound, "the wrong rule passed the exactness test"


def _accept_everything(sampling, generator):
    """A wrong rule: every drafted token stands (the output would follow the draft, not the target)."""
    def rule(proposal, logits):
        return list(range(1, len(proposal.tokens))), int(logits[-1].argmax())
    return rule


def test_the_choice_strip_draws_every_round():
    import matplotlib
    matplotlib.use("Agg")
    from minigpt.plots import choice_strip
    ax = choice_strip([(PLAIN, 0, 0), ("lookup", 8, 5), ("chain", 4, 0)])
    assert len(ax.patches) == 1 + 2 + 1       # a bar per round, plus one for the kept drafted tokens
    assert ax.get_xlim()[1] == 1 + 6 + 1


def test_the_bench_record_of_auto_says_what_it_chose():
    """run_bench's record of auto carries, per option, its share of the rounds and its tokens per target pass, over
    all prompts and for each kind of prompt alone."""
    from minigpt.bench import run_bench
    from minigpt.decoding import Models
    from minigpt.prompts import Prompt
    target, draft = random_model(0), random_model(1, n_layer=1)
    prompts = [Prompt([1, 2, 3, 4, 1, 2, 3], kind="edit"), Prompt([5, 6, 7, 5, 6, 7], kind="chat"),
               Prompt([9, 3, 8, 2], kind="chat")]
    records = run_bench(["plain", "auto"], models=Models(target, draft), prompts=prompts, max_new_tokens=16,
                        repeats=1)
    auto = next(r for r in records if r["method"] == "auto")
    assert auto["identical_to_plain_greedy"]
    shares = auto["choices"]
    assert sum(c["rounds"] for c in shares.values()) == auto["target_passes"]   # every round is one target pass
    assert abs(sum(c["share"] for c in shares.values()) - 1) < 1e-9
    by_kind = {kind: sum(c["rounds"] for c in r["choices"].values()) for kind, r in auto["by_kind"].items()}
    assert set(by_kind) == {"edit", "chat"} and sum(by_kind.values()) == auto["target_passes"]  # each kind its own
    assert "choices" not in next(r for r in records if r["method"] == "plain")
    assert all("choices" not in r for r in next(r for r in records if r["method"] == "plain")["by_kind"].values())


def test_the_machines_measurements_carry_over_to_the_next_generation():
    """Round times and drafting costs are the machine's: a second controller sharing the Memory starts speculating
    at once instead of spending its first round on a plain step to measure them; acceptance starts afresh."""
    target, draft = random_model(0), random_model(1, n_layer=1)
    clock = FakeClock()
    clock.charge(target, lambda n: 1.0)
    clock.charge(draft, lambda n: 0.01)
    memory = Memory()
    first = Auto({"chain": Chain(draft, 4)}, clock=clock, memory=memory)
    decode(target, [1, 2, 3], 20, first)
    assert first.choices[0][0] == PLAIN and memory.times and "chain" in memory.seconds_per_token
    second = Auto({"chain": Chain(draft, 4)}, clock=clock, memory=memory)
    out, _ = decode(target, [4, 5, 6], 20, second)
    assert second.choices[0][0] == "chain" and out == generate(target, [4, 5, 6], 20)
    assert second.options[0].acceptance.tested[0] <= 20  # counted in this generation only (decayed counts)
    memory.clear()
    third = Auto({"chain": Chain(draft, 4)}, clock=clock, memory=memory)
    decode(target, [4, 5, 6], 20, third)
    assert third.choices[0][0] == PLAIN


class SitsOut(Proposer):
    """Plain rounds, except every ``every``-th: there the lazy EAGLE (told of the other rounds through catch_up,
    as the controller does) and one that reads every round must predict the same root feature."""
    needs_hidden = True
    max_width = 1

    def __init__(self, head, every=4):
        self.lazy, self.eager, self.every, self.rounds, self.compared = Eagle(head), Eagle(head), every, 0, 0

    def start(self, session):
        self.lazy.start(session)
        self.eager.start(session)

    def propose(self, session, room):
        self.rounds += 1
        self.lazy.catch_up(session)
        eager = self.eager._catch_up(session)
        if self.rounds % self.every == 0:
            lazy = self.lazy._catch_up(session)
            assert torch.allclose(lazy, eager, atol=1e-5), (lazy - eager).abs().max()
            assert self.lazy.cache.length == self.eager.cache.length == session.cache.length
            self.compared += 1
        return Proposal([session.seq[-1]], [-1])

    def observe(self, proposal, verified):
        pass


def test_eagle_reads_the_rounds_it_sat_out_in_one_pass():
    target = random_model(0)
    head = EagleHead(target).eval()
    passes = []
    hook = head.register_forward_pre_hook(lambda m, a: passes.append(1))
    sits = SitsOut(head)
    out, _ = decode(target, [5, 6, 7, 8, 9], 24, sits)
    hook.remove()
    assert out == generate(target, [5, 6, 7, 8, 9], 24) and sits.compared >= 5
    assert len(passes) == sits.rounds + sits.compared  # the eager head: one pass a round; the lazy one: one per 4


def test_copies_are_judged_by_the_length_of_their_match():
    """Prompt lookup says which n-gram it matched; the controller counts acceptance apart for each n, so a copy
    after a long match and one after a single token are not averaged into one bet."""
    target = random_model(0)
    text = list(range(10, 40))
    prompt = text + [7] + text[:3]          # 3-gram matches ahead, then the model's own continuation
    clock = FakeClock()
    clock.charge(target, lambda n: 1.0)
    auto = Auto({"lookup": Lookup(3, 16)}, clock=clock)
    out, _ = decode(target, prompt, 30, auto)
    assert out == generate(target, prompt, 30)
    o = auto.options[0]
    assert set(o.by_match) <= {1, 2, 3} and o.by_match  # counted by match length
    assert all(a.parent is o.acceptance for a in o.by_match.values())   # each starting from the count over all
    assert o.acceptance.tested[0] >= max(a.tested[0] for a in o.by_match.values())
    lookup = Lookup(3, 8)
    lookup.propose(type("S", (), {"seq": [1, 2, 3, 9, 1, 2, 3]})(), 8)
    assert lookup.last_match == 3
    lookup.propose(type("S", (), {"seq": [5, 6, 8]})(), 8)
    assert lookup.last_match == 0


class CoinCopier(Proposer):
    """A copying drafter (``cheap``) whose one copied token is the target's next greedy token with probability
    ``p``, independently each round, and which reports a random match length from 1 to 8: each length's count
    sees few rounds, so its estimate is noisy, and the rounds whose counts look best are sent."""
    cheap = True

    def __init__(self, reference, p, seed):
        self.reference, self.p, self.rng = reference, p, random.Random(seed)

    def propose(self, session, room):
        right = self.reference[len(session.seq)]
        self.last_match = self.rng.randint(1, 8)
        return Proposal.chain(session.seq[-1], [right if self.rng.random() < self.p else (right + 1) % 50])


def _coin_race(p, calibrate, seeds=range(4), n=300):
    """Rounds that sent the copier and fake seconds, summed over ``seeds``: a target pass costs 1 + 0.5 (width - 1),
    so a copied token pays only if it is accepted more than half the time."""
    target = random_model(0, block_size=512)
    prompt = [5, 6, 7, 8, 9]
    reference = prompt + generate(target, prompt, n)
    sent = seconds = 0.0
    for seed in seeds:
        clock = FakeClock()
        hook = clock.charge(target, lambda w: 1.0 + 0.5 * (w - 1))
        auto = Auto({"coin": CoinCopier(reference, p, seed)}, clock=clock, calibrate_copies=calibrate)
        out, _ = decode(target, prompt, n, auto)
        hook.remove()
        assert out == reference[len(prompt):]
        sent += sum(name == "coin" for name, _, _ in auto.choices)
        seconds += clock.t
    return sent, seconds


def test_a_copier_is_sent_on_what_the_rounds_its_counts_would_send_keep():
    """The winner's curse: a copy accepted 40% of the time loses here (1.4 tokens for 1.5 passes), but with noisy
    counts per match length some length always looks above 50%, and the controller sent it in a quarter of its
    rounds. Calibrated on the rounds its counts would send (sent or not, judged against the decided tokens), it is
    sent far less and the generation takes less time; a copy accepted 80% of the time (1.8 tokens for 1.5 passes)
    is still sent nearly as often as before."""
    cal_sent, cal_seconds = _coin_race(0.4, True)
    raw_sent, raw_seconds = _coin_race(0.4, False)
    assert cal_sent < 0.6 * raw_sent and cal_seconds < raw_seconds
    good_cal, _ = _coin_race(0.8, True, seeds=range(2))
    good_raw, _ = _coin_race(0.8, False, seeds=range(2))
    assert good_cal >= 0.9 * good_raw


class CoinTree(Proposer):
    """A scored drafter (suffix decoding's kind) whose one candidate claims probability 0.9 every round, but is the
    target's next greedy token with probability 0.2 after a one-token match and 0.95 after a six-token match, the
    two alternating at random; ``tell_match`` False hides the match length (one calibration for all rounds)."""
    scored = True
    max_width = 2

    def __init__(self, reference, seed, tell_match=True):
        self.reference, self.rng, self.tell_match = reference, random.Random(seed), tell_match
        self.last_probs = [0.9]
        self.matches = []   # each round's match length, told or not

    def propose(self, session, room):
        right = self.reference[len(session.seq)]
        match = self.rng.choice([1, 6])
        self.last_match = match if self.tell_match else None
        good = self.rng.random() < (0.2 if match == 1 else 0.95)
        self.matches.append(match)
        return Proposal([session.seq[-1], right if good else (right + 1) % 50], [-1, 0])


def _tree_race(tell_match, seeds=range(3), n=240):
    """(rounds sent after a one-token match, after a six-token one, fake seconds), summed over ``seeds``; a target
    pass costs 1 + 0.5 (width - 1), so a candidate pays only if it is accepted more than half the time."""
    target = random_model(0, block_size=512)
    prompt = [5, 6, 7, 8, 9]
    reference = prompt + generate(target, prompt, n)
    short = long = seconds = 0.0
    for seed in seeds:
        clock = FakeClock()
        hook = clock.charge(target, lambda w: 1.0 + 0.5 * (w - 1))
        coin = CoinTree(reference, seed, tell_match)
        auto = Auto({"coin": coin}, clock=clock)
        out, _ = decode(target, prompt, n, auto)
        hook.remove()
        assert out == reference[len(prompt):]
        for (name, _, _), match in zip(auto.choices[1:], coin.matches):   # the first round is plain, unasked
            short += name == "coin" and match == 1
            long += name == "coin" and match == 6
        seconds += clock.t
    return short, long, seconds


def test_a_scored_tree_is_calibrated_per_match_length():
    """A tree grown after a one-token match is a far weaker bet than its counts say, one after a long match nearly
    as good: calibrated per match length, the weak ones (accepted 20% of the time, a loss) are sent rarely and the
    strong ones (95%, a gain) in most of their rounds, and the generation takes less time than with one calibration
    for every round, which, averaging the two, sends both."""
    short, long, seconds = _tree_race(True)
    short_one, long_one, seconds_one = _tree_race(False)
    assert short < 0.2 * long and long > 0.8 * long_one
    assert short_one > 0.5 * long_one      # one calibration for all: the weak trees go out too
    assert seconds < seconds_one


@pytest.mark.parametrize("regime", ["plain pays", "speculation pays"])
def test_a_batch_chooses_plain_steps_when_its_wide_passes_cost_more_than_they_make(regime):
    """In a batch, one sequence's wide proposal widens every sequence's pass; the batch's own tokens per second
    decides whether its sequences speculate (BatchChoice), so a batch where width is expensive steps plainly in
    most rounds, and one where it is cheap speculates in most, with every output the target's own."""
    from minigpt.decoding.auto import BatchChoice
    from minigpt.decoding.batch import decode_batch
    target = random_model(0, block_size=256)
    draft = copy.deepcopy(target)       # a draft that always agrees: whether speculation pays is the clock's doing
    clock = FakeClock()
    if regime == "plain pays":
        clock.charge(target, lambda n: 1.0 + 2.0 * (n - 1))
    else:
        clock.charge(target, lambda n: 1.0)
    clock.charge(draft, lambda n: 0.01)
    prompts = [[1, 2, 3, 1, 2, 3], [4, 5, 6], [7, 8, 7, 8], [9, 3, 9]]
    auto = Auto({"lookup": Lookup(3, 16), "chain": Chain(draft, 4)}, clock=clock)
    draft_passes = []
    hook = draft.register_forward_pre_hook(lambda module, args: draft_passes.append(1))
    outs, stats, bstats = decode_batch(target, prompts, 80, auto)
    hook.remove()
    assert outs == [generate(target, p, 80) for p in prompts]
    # the sequences that chose the chain draft together: a catch-up pass and one pass per drafted position a round
    assert len(draft_passes) <= bstats.target_passes * (auto.gamma_max + 1), (len(draft_passes), bstats.target_passes)
    modes = auto.memory.batch[torch.get_num_threads(), 4]
    assert isinstance(modes, BatchChoice) and set(modes.rate) == {"plain", "speculate"}
    plain_share = sum(name == PLAIN for s in stats for name, _ in s.choices) / sum(len(s.choices) for s in stats)
    assert plain_share > 0.7 if regime == "plain pays" else plain_share < 0.3, plain_share
    assert (modes.rate[PLAIN] > modes.rate["speculate"]) == (regime == "plain pays"), modes.rate
    if regime == "plain pays":   # a plain round makes one token per sequence in one time unit, whatever came before
        assert modes.rate[PLAIN] == pytest.approx(1.0), modes.rate


def test_a_batch_of_one_is_decided_by_its_own_controller_alone():
    """With one sequence no other pays for its proposal: no batch-level choice is kept, and the batch engine's
    rounds are the ones a solo controller takes on the same fake clock (same options, tokens, output)."""
    from minigpt.decoding.batch import decode_batch
    target = random_model(0, block_size=256)
    draft = copy.deepcopy(target)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    runs = []
    for batched in (False, True):
        clock = FakeClock()
        clock.charge(target, lambda n: 1.0 + 0.2 * (n - 1))
        clock.charge(draft, lambda n: 0.3)
        auto = Auto({"lookup": Lookup(3, 16), "chain": Chain(draft, 4)}, clock=clock)
        if batched:
            outs, stats, _ = decode_batch(target, [prompt], 60, auto)
            runs.append((outs[0], stats[0].choices))
            assert auto.memory.batch == {}
        else:
            out, st = decode(target, prompt, 60, auto)
            runs.append((out, st.choices))
    assert runs[0][0] == runs[1][0] == generate(target, prompt, 60)
    assert runs[0][1] == runs[1][1] and {name for name, _ in runs[0][1]} - {PLAIN}, runs[0][1]


def test_a_shrinking_batch_keeps_its_choice_as_sequences_finish():
    """Sequences that finish one round apart shrink the batch every round: each new size starts from the nearest
    size's choice instead of measuring both modes again (a forced speculating round at every size), and a round
    is booked into the choice that made it, those that finished in it included, so where plain pays every size
    keeps stepping plainly."""
    from minigpt.decoding.batch import Request, serve
    target = random_model(0, block_size=256)
    draft = copy.deepcopy(target)
    clock = FakeClock()
    clock.charge(target, lambda n: 1.0 + 2.0 * (n - 1))
    clock.charge(draft, lambda n: 0.01)
    prompts = [[1, 2, 3, 1, 2, 3], [4, 5, 6], [7, 8, 7, 8], [9, 3, 9], [2, 2, 5], [6, 1], [3, 3, 3, 3], [8, 4]]
    auto = Auto({"lookup": Lookup(3, 16), "chain": Chain(draft, 4)}, clock=clock)
    widths = []   # the width of every target pass (a batch's pass: the widest proposal, padded)
    hook = target.register_forward_pre_hook(lambda module, args: widths.append(args[0].shape[1]))
    report = serve(target, [Request(p, 30 + i) for i, p in enumerate(prompts)], auto, max_batch=8)
    hook.remove()
    assert report.outputs == [generate(target, p, 30 + i) for i, p in enumerate(prompts)]
    threads = torch.get_num_threads()
    sizes = {b for t, b in auto.memory.batch if t == threads}
    assert len(sizes) >= 5 and sizes <= set(range(2, 9)), sizes
    for b in sizes:
        choice = auto.memory.batch[threads, b]
        assert choice.rate[PLAIN] > choice.rate["speculate"], (b, choice.rate)
    assert widths[-6:] == [1] * 6, widths[-10:]   # the shrinking tail stepped plainly


@pytest.mark.parametrize("slow, wait", [(6.0, 66), (3.0, 233)])
def test_the_batch_choice_retries_the_losing_mode_as_rarely_as_its_loss_asks(slow, wait):
    """Both modes measured first; then the better one, with the other re-tried once the rounds since its last try
    make what a try loses 1% of the time (only those re-tries are flagged ``probing``): a speculating round at 6
    tokens/s per sequence against plain's 10 loses 1/6 - 1/10 s, a plain round takes 1/10 s, so it waits 66 rounds;
    at 3 tokens/s, 233. A probe that wins makes its mode the one taken."""
    from minigpt.decoding.auto import BatchChoice
    choice, taken, probing = BatchChoice(), [], []
    for _ in range(420):
        mode = choice.choose()
        taken.append(mode)
        probing.append(choice.probing)
        choice.book(mode, 10.0 if mode == PLAIN else slow, smoothing=0.3)
    tries = [i for i, p in enumerate(probing) if p]
    assert tries == list(range(wait + 1, 420, wait)), tries
    assert taken[:2] == [PLAIN, "speculate"] and [i for i, m in enumerate(taken) if m == "speculate"][1:] == tries
    for _ in range(wait + 3):                                # speculation becomes the better mode
        mode = choice.choose()
        choice.book(mode, 20.0 if mode == "speculate" else 10.0, smoothing=1.0)
    assert choice.best() == "speculate"


def test_a_tree_is_walked_by_the_decided_tokens_and_its_depths_are_summed():
    #        root
    #       /    \
    #     5 (.6)  6 (.3)
    #     |        |
    #     7 (.5)   8 (.2)
    #     |
    #     9 (.4)
    tree = Proposal([1, 5, 6, 7, 8, 9], [-1, 0, 0, 1, 2, 3])   # node 0 is the root (token 1)
    probs = [0.6, 0.3, 0.5, 0.2, 0.4]                          # one per candidate
    assert depth_probabilities(tree, probs) == pytest.approx([0.9, 0.7, 0.4])
    assert reached_depth(tree, [5, 7, 9, 1]) == 3
    assert reached_depth(tree, [6, 8, 9]) == 2
    assert reached_depth(tree, [6, 7]) == 1     # 7 hangs under 5, not under 6
    assert reached_depth(tree, [4]) == 0
    cal = TreeCalibration(decay=1.0, prior_weight=0.0)
    cal.observe([0.9, 0.7, 0.4], reached=1, known=3)        # got past depth 1, missed depth 2 (so 3 too)
    cal.observe([0.9, 0.7, 0.4], reached=1, known=1)        # one decided token, matched: deeper unknown
    assert cal.reached == [2.0, 0.0, 0.0] and cal.expected == pytest.approx([1.8, 0.7, 0.4])
    assert cal.ratio(1) == pytest.approx(2 / 1.8) and cal.ratio(2) == 0.0
    assert cal.expected_tokens([0.9, 0.7]) == pytest.approx(0.9 * 2 / 1.8)
    assert TreeCalibration().expected_tokens([0.5, 0.25]) == pytest.approx(0.75)   # unmeasured: the counts' own


def test_suffix_trees_are_counted_every_round_as_deep_as_a_sent_round_accepts():
    """The controller counts suffix decoding's tree against every round's decided tokens, sent or not; in the
    rounds it was sent, that count is exactly the depth the target accepted."""
    target = random_model(3)
    text = list(range(10, 26))
    clock = FakeClock()
    clock.charge(target, lambda n: 1.0 + 0.1 * (n - 1))
    auto = Auto({"suffix": Suffix()}, clock=clock)
    rounds = []   # (sent, depth the decided tokens walk down the tree, tokens decided)
    observe = auto._observe_tree

    def spy(o, proposal, by_depth, match, decided):
        depth = reached_depth(proposal, decided)
        rounds.append((auto._pending[0] is o, depth, len(decided)))
        observe(o, proposal, by_depth, match, decided)

    auto._observe_tree = spy
    for prompt in (text * 2 + [3], text + [7] + text[:4], [1, 2, 3, 4] * 6):
        assert decode(target, prompt, 24, auto)[0] == generate(target, prompt, 24)
    sent = [r for r in rounds if r[0]]
    assert sent and len(sent) < len(rounds)          # counted in the rounds it was sent and in the others
    assert all(depth == decided - 1 for _, depth, decided in sent)   # a sent tree: its walk is what was kept
    assert auto.options[0].calibration.expected[0] > 0


def test_a_return_to_the_chain_pays_for_the_drafts_backlog_spread_over_the_rounds_left():
    """After one round of another option the chain's catch-up is one draft pass; a long backlog (the prompt, at
    the start) costs its measured time per token, spread over the chain rounds the generation has left, and in a
    batch of B counted for every sequence (they all wait for it); none right after a chain round."""
    target = random_model(0, block_size=256)
    auto = Auto({"chain": Chain(copy.deepcopy(target), 4)})
    o = auto.options[0]
    o.seconds_per_token, o.catch_up_seconds = 0.5, 0.01
    o.acceptance = DepthAcceptance()
    E = o.acceptance.expected_tokens(auto.gamma_max)[-1]
    from minigpt.decoding.session import Progress
    session = type("S", (Progress,), {"seq": list(range(101)), "draft_cache": type("C", (), {"length": 0})()})()
    auto.round, o.last_round = 10, 9
    assert auto._catch_up_cost(o, session, 40) == 0.0
    o.last_round = 5
    assert auto._catch_up_cost(o, session, 40) == pytest.approx(0.5 + 0.01 * 100 / max(1.0, 40 / E))
    assert auto._catch_up_cost(o, session, 1) == pytest.approx(0.5 + 0.01 * 100)      # the last round: all of it
    auto._batch = 8
    assert auto._catch_up_cost(o, session, 1) == pytest.approx(0.5 + 0.01 * 100 * 8)
    session.draft_cache.length = 99                                                     # one token behind
    assert auto._catch_up_cost(o, session, 1) == pytest.approx(0.5 + 0.01 * 8)


def test_a_batchs_retry_of_speculation_offers_no_model_drafter():
    """When the batch re-tries speculation after it lost, its sequences may send what a copying (or scored)
    drafter proposes, but not start a draft chain (its catch-up would be paid for a single round)."""
    target = random_model(0, block_size=256)
    draft = copy.deepcopy(target)
    clock = FakeClock()
    auto = Auto({"lookup": Lookup(3, 16), "chain": Chain(draft, 4)}, clock=clock)
    from minigpt.decoding.session import Session
    session = Session(target, list(range(10, 30)) + [7] + list(range(10, 13)), 20, proposer=auto)
    auto.start(session)
    auto.times.add(1, 1.0)
    auto.times.add(5, 1.0)                      # wide passes free: the chain (never timed) would be tried
    assert auto._decide(session, 10) is None    # the chain chosen (drafted by _draft_chains)
    auto._chosen = None
    auto.probe_only = True
    proposal = auto._decide(session, 10)
    assert proposal is not None and auto._pending[0].name == "lookup"        # a 3-gram match copies 16 ahead
    assert proposal.candidates == list(range(13, 23))      # as far as the room (10) allows


def test_an_arms_round_is_timed_apart_for_each_batch_size():
    """An arm's seconds per round are its whole round's: in a batch of B the batch's pass. They are kept apart for
    each B, so a solo round's seconds never make the arm look B times cheaper than the batch's plain round."""
    from minigpt.decoding.batch import decode_batch
    from minigpt.decoding.tree import DraftTree
    target = random_model(0, block_size=256)
    clock = FakeClock()
    clock.charge(target, lambda n: 1.0)
    auto = Auto({"tree": DraftTree(copy.deepcopy(target), budget=4)}, clock=clock)
    prompts = [[1, 2, 3], [4, 5, 6, 4]]
    assert decode(target, prompts[0], 12, auto)[0] == generate(target, prompts[0], 12)
    outs, _, _ = decode_batch(target, prompts, 12, auto)
    assert outs == [generate(target, p, 12) for p in prompts]
    assert {"tree", ("tree", 2)} <= set(auto.memory.arm_seconds), auto.memory.arm_seconds


def test_a_batch_round_counts_its_slowest_sequence_unless_requests_wait():
    """A fixed batch ends with its slowest sequence, so a round is worth the least any sequence made; while
    requests wait, a sequence that finishes early hands its place on, so the mean counts (the batch engine says
    how many wait: serve's queue)."""
    from types import SimpleNamespace
    from minigpt.decoding.auto import BatchChoice
    from minigpt.decoding.batch import Request, serve
    auto = Auto({"lookup": Lookup(3, 8)})
    seqs = [SimpleNamespace(proposer=SimpleNamespace(_tokens=n)) for n in (4, 1, 1)]
    for waiting, rate in ((0, 1.0), (2, 2.0)):
        choice = BatchChoice()
        auto.waiting, auto._batch_round = waiting, ("speculate", 0.0, seqs, choice)
        auto._book_batch_round(1.0, seqs)
        assert choice.rate == {"speculate": pytest.approx(rate)}
    target = random_model(0, block_size=256)
    told = []
    class Told(Auto):
        def propose_batch(self, seqs, rooms):
            told.append(self.waiting)
            return super().propose_batch(seqs, rooms)
    requests = [Request([1, 2, 3, i], 6) for i in range(4)]
    report = serve(target, requests, Told({"lookup": Lookup(3, 8)}), max_batch=2)
    assert report.outputs == [generate(target, r.prompt, 6) for r in requests]
    assert told[0] == 2 and told[-1] == 0
