"""The library pieces Lessons 04, 04b and 05 stand on: fair timing (minigpt.device.time_rotating), the exactness
tests (minigpt.exactness), the draft's own sampling settings in speculative_generate, and plots.draw_tree."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from minigpt import generate, speculative_generate
from minigpt.decoding.verify import accept_tree_sampled
from minigpt.device import time_rotating
from minigpt.exactness import (accept_tree_per_path, emitted_distribution, exact_first_two, first_token_frequencies,
                               samples_needed, toy_chain_first_two, toy_markov_pair, toy_tree_first_two,
                               tv_bound, tv_distance)
from minigpt.plots import draw_tree
from minigpt.sampling import SamplingConfig

from conftest import perturbed_copy, random_model


# ---- timing -------------------------------------------------------------------------------------------------

def test_time_rotating_rotates_the_order_and_keeps_the_first_result():
    calls = []

    def make(label):
        def fn():
            calls.append(label)
            return f"{label}{len(calls)}"
        return fn

    seconds, results = time_rotating({"a": make("a"), "b": make("b"), "c": make("c")}, "cpu", repeat=3, warmup=1)
    assert calls[:3] == ["a", "b", "c"]                                   # warm-up
    assert calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]     # each repeat starts one later
    assert {k: len(v) for k, v in seconds.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(t >= 0 for v in seconds.values() for t in v)
    assert results == {"a": "a4", "b": "b5", "c": "c6"}                   # first timed call of each
    with pytest.raises(ValueError, match="at least one"):
        time_rotating({}, "cpu")
    with pytest.raises(ValueError, match="repeat"):
        time_rotating({"a": make("a")}, "cpu", repeat=0)


def test_the_garbage_collector_is_paused_while_timed_calls_run_and_runs_between_repeats():
    import gc
    seen, collections = [], []
    callback = lambda phase, info: collections.append(phase) if phase == "start" else None   # noqa: E731
    gc.callbacks.append(callback)
    try:
        time_rotating({"a": lambda: seen.append(gc.isenabled()), "b": lambda: seen.append(gc.isenabled())}, "cpu",
                      repeat=3, warmup=0)
    finally:
        gc.callbacks.remove(callback)
    assert seen == [False] * 6 and gc.isenabled()
    assert len(collections) >= 3                       # one full collection before each repeat, untimed
    gc.disable()
    try:                                               # a caller that had it off finds it off
        time_rotating({"a": lambda: None}, "cpu", repeat=2, warmup=0)
        assert not gc.isenabled()
    finally:
        gc.enable()


# ---- exactness ----------------------------------------------------------------------------------------------

def test_samples_needed_is_the_smallest_n_meeting_the_margin():
    for distance, k in ((0.3, 8), (0.1, 4), (0.05, 25)):
        n = samples_needed(distance, k, margin=2)
        assert tv_bound(n, k) <= distance / 2 < tv_bound(n - 1, k)
    with pytest.raises(ValueError):
        samples_needed(0.0, 4)
    with pytest.raises(ValueError):
        tv_bound(0, 4)


def _toy_pq():
    g = torch.Generator().manual_seed(3)
    logits_p, logits_q = torch.randn(8, generator=g, dtype=torch.float64), torch.randn(8, generator=g, dtype=torch.float64)
    return logits_p, logits_q


def test_emitted_distribution_is_p_with_the_true_q_and_biased_with_another():
    lp, lq = _toy_pq()
    p = torch.softmax(lp, 0)
    for t in (0.5, 1.0, 1.5):  # the draft may sample at any temperature: exact as long as the rule knows q
        q_t = torch.softmax(lq / t, 0)
        assert torch.allclose(emitted_distribution(p, q_t), p, atol=1e-12)
    q1, q15 = torch.softmax(lq, 0), torch.softmax(lq / 1.5, 0)
    assert tv_distance(emitted_distribution(p, q15, q_rule=q1), p) > 0.01


def test_the_sampled_test_passes_the_right_rule_and_catches_a_wrong_q():
    lp, lq = _toy_pq()
    p, q1, q15 = torch.softmax(lp, 0), torch.softmax(lq, 0), torch.softmax(lq / 1.5, 0)
    bias = tv_distance(emitted_distribution(p, q15, q_rule=q1), p)
    n = samples_needed(bias, 8)
    right = first_token_frequencies(p, q15, n, seed=0)
    wrong = first_token_frequencies(p, q15, n, seed=0, q_rule=q1)
    assert tv_distance(right, p) < tv_bound(n, 8) < tv_distance(wrong, p)


def test_toy_chain_is_exact_and_the_draft_alone_is_not():
    P, Q = toy_markov_pair(5, seed=1)
    exact = exact_first_two(P, 0)
    assert abs(float(exact.sum()) - 1) < 1e-12
    draft_alone = exact_first_two(Q, 0)
    n = samples_needed(tv_distance(draft_alone, exact), 25)
    freq = toy_chain_first_two(P, Q, 0, n, gamma=1, seed=0)
    assert tv_distance(freq, exact) < tv_bound(n, 25) < tv_distance(draft_alone, exact)


def test_tree_sibling_rule_is_exact_and_the_per_path_rule_is_caught():
    P = torch.tensor([[0.10, 0.20, 0.30, 0.40], [0.55, 0.15, 0.15, 0.15],
                      [0.05, 0.05, 0.60, 0.30], [0.25, 0.25, 0.25, 0.25]])
    Q = torch.tensor([[0.50, 0.30, 0.10, 0.10], [0.10, 0.10, 0.40, 0.40],
                      [0.40, 0.40, 0.10, 0.10], [0.70, 0.10, 0.10, 0.10]])
    exact = exact_first_two(P, 0)
    n = 2000
    right, acc_right = toy_tree_first_two(accept_tree_sampled, P, Q, 0, n, seed=0)
    wrong, acc_wrong = toy_tree_first_two(accept_tree_per_path, P, Q, 0, n, seed=0)
    assert tv_distance(right, exact) < tv_bound(n, 16) < tv_distance(wrong, exact)
    assert acc_wrong > acc_right  # the bias is over-acceptance
    with pytest.raises(ValueError, match="P and Q"):
        toy_tree_first_two(accept_tree_sampled)


# ---- the draft's own sampling settings ----------------------------------------------------------------------

def test_a_draft_with_other_settings_keeps_greedy_output_identical():
    target = random_model(0)
    draft = perturbed_copy(target, 0.3)
    prompt = [5, 17, 3]
    want = generate(target, prompt, 12)
    for ds in (SamplingConfig(1.0), SamplingConfig(1.5, top_k=5), SamplingConfig(0.0)):
        got, st = speculative_generate(target, draft, prompt, 12, gamma=3, seed=1, draft_sampling=ds)
        assert got == want and st.tested > 0
    with pytest.raises(TypeError, match="SamplingConfig"):
        speculative_generate(target, draft, prompt, 4, draft_sampling=1.5)


@pytest.mark.slow
def test_a_draft_sampling_hotter_stays_exact_and_is_accepted_less():
    """Target samples at T=1, top-k 4; the draft samples at T=2 (its true q goes to the rule). The first token
    must follow the target's p; the acceptance rate at this position must fall to sum min(p, q_T)."""
    target = random_model(0)
    draft = perturbed_copy(target, 0.5)
    prompt = [5, 17, 3]
    settings = dict(temperature=1.0, top_k=4)
    with torch.no_grad():
        p = SamplingConfig(**settings).probs(target(torch.tensor([prompt]))[0, -1]).double()
        dl = draft(torch.tensor([prompt]))[0, -1]
    p = p / p.sum()
    hot = SamplingConfig(2.0)
    q_hot = hot.probs(dl).double()
    n = 1500
    counts = torch.zeros_like(p)
    accepted = tested = 0
    for seed in range(n):
        ids, st = speculative_generate(target, draft, prompt, 2, gamma=1, seed=seed, draft_sampling=hot, **settings)
        counts[ids[0]] += 1
        accepted, tested = accepted + st.accepted, tested + st.tested
    assert tv_distance(counts / n, p) < tv_bound(n, 4)
    beta = float(torch.minimum(p, q_hot / q_hot.sum()).sum())
    assert abs(accepted / tested - beta) < 4 * (beta * (1 - beta) / n) ** 0.5 + 1e-3


# ---- draw_tree ----------------------------------------------------------------------------------------------

def test_draw_tree_labels_accepted_branch_and_weights():
    import matplotlib.pyplot as plt
    parents = [-1, 0, 0, 1, 1, 3]
    ax = draw_tree(parents, labels=[f"n{i}" for i in range(6)], accepted=[1, 3, 5], title="t")
    assert sorted(t.get_text() for t in ax.texts) == [f"n{i}" for i in range(6)]
    assert ax.get_title() == "t" and len(ax.lines) == 5
    assert sum(1 for ln in ax.lines if ln.get_color() == "C2") == 3   # the edges into accepted nodes
    plt.close(ax.figure)
    ax = draw_tree(parents, weights=[1, 0.5, 0.4, 0.3, 0.2, 0.1], depth_labels=["root", "h0", "h1", "h2"])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["root", "h0", "h1", "h2"]
    assert len(ax.figure.axes) == 2                                     # the colour bar
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="parent array"):
        draw_tree([0, 0])
    with pytest.raises(ValueError, match="labels"):
        draw_tree([-1, 0], labels=["a"])


def test_explore_without_a_first_draw_redraws_only_when_a_control_moves():
    import ipywidgets as w
    from minigpt.plots import explore
    calls = []

    def fn(a=2, b=0.5, c="x"):
        calls.append((a, b, c))

    slider = w.IntSlider(value=2, min=0, max=5)
    explore(fn, draw_now=False, a=slider, b=(0.0, 1.0, 0.1), c="fixed")
    assert calls == []                       # nothing drawn at first: the lesson drew it just above
    slider.value = 4
    assert calls == [(4, 0.5, "fixed")]
