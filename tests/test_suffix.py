"""Suffix decoding (minigpt.decoding.suffix): the trees against brute force, the drafts' budgets and floors,
eviction, exactness (greedy on the course pair and on random models, sampled within a TV bound that a biased
rule breaks), the batch engine against decoding alone, and the stream benchmark's rule (a request never
drafts from its own output)."""
from __future__ import annotations

import random

import pytest
import torch

from conftest import random_model
from minigpt.decoding import decode, generate
from minigpt.decoding.batch import BatchEngine, PerSequence, Request
from minigpt.decoding.suffix import (ROOT, SHARE, WIDE, Draft, GlobalTree, Suffix, SuffixTree, as_dicts, cut_to_depth,
                                     grow_draft, merge_drafts, replay_suffix, suffix_generate)
from minigpt.exactness import tv_bound, tv_distance
from minigpt.sampling import SamplingConfig, sample


# ----- the tree against brute force -------------------------------------------------------------------------

def walk(tree: SuffixTree):
    """(string, node) for every node but the root."""
    stack = [((), ROOT)]
    while stack:
        s, node = stack.pop()
        for c in tree.children(node):
            stack.append((s + (tree.token[c],), c))
            yield s + (tree.token[c],), c


def occurrences(texts, s) -> int:
    return sum(1 for text in texts for i in range(len(text) - len(s) + 1) if tuple(text[i:i + len(s)]) == s)


def substrings(texts, depth) -> set:
    return {tuple(text[i:j]) for text in texts for i in range(len(text))
            for j in range(i + 1, min(i + depth, len(text)) + 1)}


def brute_longest(texts, context, depth) -> int:
    """The longest suffix of context (at most depth - 1 long) that occurs in a text followed by a token."""
    for n in range(min(depth - 1, len(context)), 0, -1):
        s = tuple(context[-n:])
        if any(tuple(t[i:i + n]) == s for t in texts for i in range(len(t) - n)):
            return n
    return 0


def dump(tree: SuffixTree) -> dict:
    return {s: tree.count[node] for s, node in walk(tree)}


def random_texts(rng, k, vocab=4, lo=1, hi=30):
    return [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(k)]


def test_insert_counts_every_substring_up_to_the_depth():
    rng = random.Random(0)
    for trial in range(40):
        depth = rng.randint(2, 7)
        texts = random_texts(rng, rng.randint(1, 4))
        tree = SuffixTree(depth)
        for t in texts:
            tree.insert(t)
        nodes = dump(tree)
        assert set(nodes) == substrings(texts, depth)
        assert all(count == occurrences(texts, s) for s, count in nodes.items())
        assert tree.n_nodes == len(nodes) + 1 and tree.count[ROOT] == sum(map(len, texts))
        assert all(tree.total[n] == sum(tree.count[c] for c in tree.children(n)) for _, n in walk(tree))


def test_a_small_tree_by_hand():
    tree = SuffixTree(4)
    tree.insert([1, 2, 3, 1, 2, 4])
    assert {tree.token[c]: tree.count[c] for c in tree.children(ROOT)} == {1: 2, 2: 2, 3: 1, 4: 1}
    node = tree.child(tree.child(ROOT, 1), 2)
    assert tree.count[node] == 2 and {tree.token[c]: tree.count[c] for c in tree.children(node)} == {3: 1, 4: 1}
    assert as_dicts(tree)[1][2] == {3: {1: {}}, 4: {}}
    assert tree.longest_match([7, 1, 2]) == (2, node)
    assert tree.longest_match([2, 4]) == (0, None)   # [2, 4] and [4] were never followed by anything


def test_appending_token_by_token_builds_the_same_tree_as_inserting():
    rng = random.Random(1)
    for _ in range(20):
        depth, text = rng.randint(2, 6), random_texts(rng, 1, hi=40)[0]
        whole, grown = SuffixTree(depth), SuffixTree(depth)
        whole.insert(text)
        for t in text:
            grown.append(t)
        assert dump(grown) == dump(whole) and grown.n_nodes == whole.n_nodes


def test_longest_match_agrees_with_brute_force_and_skips_the_context_itself():
    rng = random.Random(2)
    for _ in range(200):
        depth = rng.randint(2, 8)
        texts = random_texts(rng, rng.randint(0, 3), vocab=3)
        context = random_texts(rng, 1, vocab=3, lo=0, hi=12)[0]
        tree = SuffixTree(depth)
        for t in texts:
            tree.insert(t)
        assert tree.longest_match(context)[0] == brute_longest(texts, context, depth)
        own = SuffixTree(depth)   # the per-request tree holds the context itself: its last occurrence must not count
        for t in context:
            own.append(t)
        assert own.longest_match(context)[0] == brute_longest([context], context, depth)


def test_remove_undoes_insert_and_the_global_tree_evicts_the_oldest():
    rng = random.Random(3)
    a, b, c = random_texts(rng, 3, hi=25)
    tree = SuffixTree(5)
    for t in (a, b):
        tree.insert(t)
    tree.remove(a)
    only_b = SuffixTree(5)
    only_b.insert(b)
    assert dump(tree) == dump(only_b) and tree.n_nodes == only_b.n_nodes
    cache = GlobalTree(max_requests=2, max_depth=5)
    for t in (a, b, c):
        cache.add(t)
    last_two = SuffixTree(5)
    for t in (b, c):
        last_two.insert(t)
    assert len(cache) == 2 and list(cache.outputs) == [b, c] and dump(cache.tree) == dump(last_two)
    cache.clear()
    assert len(cache) == 0 and cache.tree.n_nodes == 1
    with pytest.raises(ValueError, match="max_requests"):
        GlobalTree(max_requests=0)


def test_a_wide_node_keeps_every_likely_child_at_hand_through_inserts_and_evictions():
    """likely_children(n, share) must hold every child with at least that share of n's continuations (share >=
    2 / SHARE) whatever the history; it looks at its short list, not at every child."""
    rng = random.Random(4)
    cache = GlobalTree(max_requests=15, max_depth=3)
    for step in range(120):
        skew = rng.randrange(1, 5)   # some outputs favour a few tokens: shares rise and fall as they come and go
        cache.add([min(rng.randrange(60), rng.randrange(60 // skew)) for _ in range(rng.randint(5, 30))])
        tree = cache.tree
        wide = [n for n in [ROOT] + [n for _, n in walk(tree)] if len(tree.children(n)) > WIDE]
        for n in wide:
            for share in (2 / SHARE, 0.1, 0.3):
                must = {c for c in tree.children(n) if tree.count[c] >= share * tree.total[n]}
                assert must <= set(tree.likely_children(n, share)), (step, n, share)
    assert wide and len(tree.likely_children(ROOT, 0.1)) < len(tree.children(ROOT))


# ----- drafts: probabilities from counts, the adaptive budget, the floor ----------------------------------------

def test_draft_probabilities_come_from_the_counts():
    tree = SuffixTree(6)
    for t in ([1, 2, 3, 5], [1, 2, 3, 6], [1, 2, 4]):
        tree.insert(t)
    d = tree.speculate([9, 1, 2], max_spec=10, factor=None, min_prob=0.0)
    assert d.match_length == 2
    assert list(zip(d.tokens, d.parents)) == [(3, -1), (4, -1), (5, 0), (6, 0)]
    assert d.probs == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3]) and d.score == pytest.approx(5 / 3)
    floored = tree.speculate([9, 1, 2], max_spec=10, factor=None, min_prob=0.5)
    assert floored.tokens == [3]
    path = grow_draft(tree, tree.child(tree.child(ROOT, 1), 2), 10, 0.0, branching=False)
    assert path.tokens == [3, 5] and path.parents == [-1, 0]


def test_the_adaptive_budget_follows_the_match_length():
    tree = SuffixTree(24)
    tree.insert(list(range(30)))
    for length in (1, 2, 5, 9):
        d = tree.speculate([99] + list(range(10 - length, 10)), max_spec=24, factor=1.0, min_prob=0.1)
        assert (d.match_length, d.tokens) == (length, list(range(10, 10 + length)))
    assert len(tree.speculate([8, 9], max_spec=24, factor=2.0, offset=3).tokens) == 7
    assert len(tree.speculate([8, 9], max_spec=5, factor=None).tokens) == 5   # fixed size
    # the depth (24) bounds match + speculation: after a 20-token match only 4 levels are left, so the best
    # score, min(p, 24 - p), comes from the 12 last tokens
    long = SuffixTree(24)
    long.insert(list(range(60)))
    d = long.speculate(list(range(20)), max_spec=24, factor=1.0)
    assert (d.match_length, d.tokens, d.score) == (12, list(range(20, 32)), 12)


def test_cut_to_depth_keeps_parents_before_children():
    d = Draft([3, 4, 5, 6, 7], [-1, -1, 0, 2, 1], [0.6, 0.4, 0.6, 0.6, 0.4])
    cut = cut_to_depth(d, 2)
    assert cut.tokens == [3, 4, 5, 7] and cut.parents == [-1, -1, 0, 1]
    assert cut_to_depth(d, 0).tokens == []


def _paths(d: Draft) -> dict:
    """path (tuple of tokens) -> probability, for every node of a draft."""
    out, paths = {}, []
    for t, p, q in zip(d.tokens, d.parents, d.probs):
        paths.append((paths[p] if p >= 0 else ()) + (t,))
        out[paths[-1]] = q
    return out


@pytest.mark.parametrize("seed", range(6))
def test_merged_drafts_hold_both_trees_best_nodes(seed):
    rng = random.Random(seed)
    local, other = SuffixTree(8), SuffixTree(8)
    for t in random_texts(rng, 4, vocab=3, lo=8, hi=20):
        local.insert(t)
    for t in random_texts(rng, 6, vocab=3, lo=8, hi=20):
        other.insert(t)
    context = [rng.randrange(3) for _ in range(4)]
    a, b = local.speculate(context, 12, None, min_prob=0.0), other.speculate(context, 12, None, min_prob=0.0)
    assert a.tokens and b.tokens
    for budget in (1, 5, 12, 30):
        m = merge_drafts(a, b, budget)
        union = {}
        for path, q in [*_paths(a).items(), *_paths(b).items()]:
            union[path] = max(union.get(path, 0.0), q)
        got = _paths(m)
        assert len(got) == len(m.tokens) == min(budget, len(union))    # no path twice
        assert all(union[path] == q for path, q in got.items())          # each node: the larger estimate
        assert all(path[:-1] in got for path in got if len(path) > 1)    # parents kept, and listed first
        assert all(p < i for i, p in enumerate(m.parents))
        left_out = set(union) - set(got)
        assert not left_out or max(union[x] for x in left_out) <= min(got.values()) + 1e-12   # the likeliest kept
    a.source, b.source = "prompt", "global"
    alone = merge_drafts(Draft(), b, 5)
    best5 = sorted(b.probs, reverse=True)[:5]
    assert alone.source == "global" and sorted(_paths(alone).values(), reverse=True) == pytest.approx(best5)
    assert _paths(alone).items() <= _paths(b).items()
    assert merge_drafts(a, b, 5).source == "both"
    # products of count ratios round: a child may come out a hair above its parent, and is still kept after it
    close = merge_drafts(Draft(), Draft([1, 2, 3], [-1, 0, 1], [0.8, 0.8, 0.8000000000000002]), 3)
    assert close.tokens == [1, 2, 3] and close.parents == [-1, 0, 1]


# ----- exactness ---------------------------------------------------------------------------------------------

SETTINGS = [dict(), dict(adaptive=False, max_spec=8), dict(tree=False, offset=3), dict(max_depth=6, min_prob=0.3),
            dict(combine="union")]


@pytest.mark.parametrize("settings", SETTINGS)
def test_greedy_output_is_plain_on_the_course_pair(target, settings):
    from minigpt.prompts import code_prompts, edit_prompts
    cache = GlobalTree(max_depth=settings.get("max_depth", 24))
    accepted = 0
    for prompt in edit_prompts(2) + code_prompts(2) + edit_prompts(2):   # the edits twice: the second time drafts
        ids, stats = suffix_generate(target, prompt, 32, cache=cache, **settings)  # from their earlier outputs
        assert ids == generate(target, prompt, 32), prompt.name
        accepted += stats.accepted
    assert accepted > 0 and len(cache) == 6


@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_output_is_plain_on_random_models(seed):
    model = random_model(seed)
    rng = random.Random(seed)
    cache = GlobalTree(max_depth=8)
    rejected = accepted = 0
    for _ in range(8):
        motif = [rng.randrange(97) for _ in range(4)]
        prompt = motif * 3 + [rng.randrange(97) for _ in range(rng.randint(0, 4))]
        ids, stats = suffix_generate(model, prompt, 24, cache=cache, max_depth=8, offset=2)
        assert ids == generate(model, prompt, 24)
        accepted += stats.accepted
        rejected += stats.tested - stats.accepted
    assert accepted > 0 and rejected > 0   # both outcomes were exercised


def test_replay_makes_the_rounds_decoding_makes(target):
    from minigpt.prompts import edit_prompts
    live, replayed = GlobalTree(), GlobalTree()
    for prompt in edit_prompts(2) * 2:
        ids, stats = suffix_generate(target, prompt, 32, cache=live)
        rounds = replay_suffix(prompt, ids, replayed)
        assert len(rounds) == stats.target_passes and sum(a for _, a in rounds) == stats.accepted


def _resample_from_p(sampling, generator):
    """A biased tree rule: tries the root's candidates like the exact rule, but after rejecting them all it
    samples from p itself instead of the residual."""
    def rule(proposal, logits):
        p = sampling.probs(logits)
        for c in [i for i, par in enumerate(proposal.parents) if par == 0]:
            if float(torch.rand((), generator=generator)) < float(p[0, proposal.tokens[c]]):
                return [c], sample(p[c], generator)
        return [], sample(p[0], generator)
    return rule


def test_sampled_suffix_decoding_has_the_targets_distribution_and_the_test_can_fail():
    """The first token (6 outcomes, 1200 samples) within the TV bound (delta 1e-4) of the target's distribution
    when the draft is a tree with two candidates at the root (one-hot q each, together 94% of p); the same test
    fails a rule that samples from p itself after rejecting them."""
    model = random_model(3, vocab_size=6)
    prompt, n = [2, 1, 0, 2, 1, 2, 2, 1], 1200   # after [2, 1] came 0 once and 2 once: two siblings
    # (2 new tokens: with 1 there would be no room for a candidate, and the round would be a plain step)
    make = lambda: Suffix(max_depth=4, adaptive=False, max_spec=4)  # noqa: E731
    first = make().best_draft(_Seq(prompt))
    assert sorted(t for t, p in zip(first.tokens, first.parents) if p == -1) == [0, 2]
    with torch.no_grad():
        exact = SamplingConfig(1.0).probs(model(torch.tensor([prompt]))[0, -1])
    assert exact[0] > 0.4 and exact[2] > 0.4

    def freq(rule=None):
        counts = torch.zeros(6)
        for seed in range(n):
            counts[decode(model, prompt, 2, make(), temperature=1.0, seed=seed, rule=rule)[0][0]] += 1
        return counts / n
    bound = tv_bound(n, 6, delta=1e-4)
    good, biased = tv_distance(freq(), exact), tv_distance(freq(_resample_from_p), exact)
    assert good < bound, f"TV {good:.4f} >= bound {bound:.4f}"
    assert biased > bound, f"the biased rule passed: TV {biased:.4f} < bound {bound:.4f}"


class _Seq:
    """The little of a Progress that Suffix.best_draft reads."""
    def __init__(self, seq):
        self.seq = list(seq)


# ----- the batch engine: one global tree shared, an output joins only when its request ends ---------------------

class Watching(Suffix):
    """Suffix, recording the global tree's outputs at each of its proposals."""
    def propose(self, session, room):
        self.seen = getattr(self, "seen", []) + [[tuple(o) for o in self.cache.outputs]]
        return super().propose(session, room)


def test_the_batch_engine_is_solo_and_an_output_joins_the_shared_tree_only_when_its_request_ends(target):
    from minigpt.prompts import code_prompts, edit_prompts
    prompts = [list(p) for p in edit_prompts(2) + code_prompts(2)]
    lengths = [8, 30, 16, 30]
    cache = GlobalTree()
    engine = BatchEngine(target, PerSequence(lambda: Watching(cache)), max_batch=4)
    seqs = [engine.admit(Request(p, n)) for p, n in zip(prompts, lengths)]
    while engine.active:
        engine.step()
    engine.close()
    outs = [s.output for s in seqs]
    assert outs == [generate(target, p, n) for p, n in zip(prompts, lengths)] and engine.stats.blocks_left == 0
    assert sorted(map(tuple, cache.outputs)) == sorted(map(tuple, outs))   # one tree, every output in it
    for s in seqs:
        seen = s.proposer.seen
        assert seen[0] == [] and all(tuple(s.output) not in snap for snap in seen)  # never its own output
    assert tuple(outs[0]) in seqs[1].proposer.seen[-1]   # a long request drafted with the short one's output


# ----- the stream benchmark's rule: a request never drafts from its own output ----------------------------------

def _twice(target, repeats=2):
    from minigpt.bench.methods import Models
    from minigpt.bench.stream import run_stream_bench
    from minigpt.prompts import code_prompts
    from minigpt.streams import Stream
    prompt = code_prompts(1)[0]          # open continuation: the prompt itself offers little to copy
    stream = Stream("the same request twice", "code", "test", [prompt, prompt], 24)
    records = run_stream_bench([stream], ["plain", "suffix", "suffix_local"], Models(target), repeats=repeats)
    return {r["method"]: r for r in records}


def test_a_stream_of_identical_requests_speeds_up_the_second_and_not_the_first(target):
    by = _twice(target)
    s, local = by["suffix"], by["suffix_local"]
    assert s["identical_to_plain_greedy"] and s["same_every_repeat"] and local["same_every_repeat"]
    assert s["tau_by_position"][0] == local["tau_by_position"][0]   # the first: nothing earlier to draft from
    assert s["tau_by_position"][1] > 2 * local["tau_by_position"][1]  # the second: the first's answer
    assert s["verdict"] in ("faster", "slower", "no measurable difference", "too few repeats")
    assert all(r["other_cpu_cores"] is None or r["other_cpu_cores"] >= 0 for r in by.values())


def test_the_controller_drafts_from_earlier_outputs_of_the_stream_under_the_same_rule(target):
    from minigpt.bench.methods import Models
    from minigpt.bench.stream import run_stream_bench
    from minigpt.prompts import code_prompts
    from minigpt.streams import Stream
    prompt = code_prompts(1)[0]
    stream = Stream("the same request twice", "code", "test", [prompt, prompt], 24)
    by = {r["method"]: r for r in run_stream_bench([stream], ["plain", "auto"], Models(target), repeats=2)}
    auto = by["auto"]
    assert auto["identical_to_plain_greedy"] and auto["same_every_repeat"]
    first, second = auto["tau_by_position"]
    assert first < 2 and second > 2 * first   # the first drafts from nothing earlier; the second, from the first
    assert "suffix" in auto["choices"] and "choices" not in by["plain"]   # what it chose, for the record


def test_the_rule_is_checked_a_tree_never_cleared_is_caught(target, monkeypatch):
    monkeypatch.setattr(GlobalTree, "clear", lambda self: None)   # outputs of the warm-up and earlier repeats leak
    by = _twice(target)
    s, local = by["suffix"], by["suffix_local"]
    assert s["tau_by_position"][0] > local["tau_by_position"][0]   # the first request drafted from its own answer


def test_the_command_line_runs_a_stream_and_refuses_bad_input_in_one_line(capsys):
    from minigpt.bench.cli import main
    assert main(["--stream", "dev", "--methods", "plain,nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown method 'nope'" in err[0]
    assert main(["--stream", "dev", "--quick", "--n-requests", "2", "--max-new-tokens", "8",
                 "--methods", "plain,prompt_lookup,suffix"]) == 0
    out = capsys.readouterr().out
    assert "course-rename-dev: 2 requests x 8 tokens, 2 repeats" in out and "suffix" in out


def test_a_score_floor_turns_weak_drafts_into_plain_steps():
    seq = _Seq([5, 6, 7, 5, 6, 8, 5, 6])            # after [5, 6]: 7 once, 8 once
    draft = Suffix().best_draft(seq)
    assert draft.tokens and 0 < draft.score
    assert Suffix(min_score=draft.score).best_draft(seq).tokens == draft.tokens
    assert Suffix(min_score=draft.score + 0.01).best_draft(seq).tokens == []
