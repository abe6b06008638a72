"""minigpt.costs: pass times recorded inside the decoding loop, and passes timed alone in two contexts."""
import pytest
import torch

from minigpt.costs import CallTimer, PassTimer, costs_in_loop, pass_contexts
from minigpt.sampling import SamplingConfig
from minigpt.decoding import DecodeStats, generate, speculative_generate

from conftest import perturbed_copy, random_model


def test_pass_timer_records_every_pass_with_its_tokens_and_stops_when_closed():
    model = random_model(0)
    prompt = list(range(1, 9))
    with PassTimer(model) as timer:
        st = DecodeStats()
        generate(model, prompt, 5, stats=st)
    # one one-token pass per new token (the prefill runs model.hidden_states, not a forward pass: not recorded)
    assert [n for n, _, _ in timer.passes] == [1] * st.target_passes == [1] * 5
    assert all(s > 0 for _, s, _ in timer.passes)
    starts = [t0 for _, _, t0 in timer.passes]
    assert starts == sorted(starts) and all(b - a >= s for (_, s, a), b in zip(timer.passes, starts[1:]))
    assert timer.seconds(1) == [s for n, s, _ in timer.passes if n == 1]
    assert timer.seconds(at_most=1) == timer.seconds(1)
    n = len(timer.passes)
    generate(model, prompt, 3)                       # outside the block: nothing recorded
    assert len(timer.passes) == n
    with PassTimer(model) as t2:                     # keyword call of the model is recorded too
        with torch.no_grad():
            model(idx=torch.tensor([prompt]))
    assert [k for k, _, _ in t2.passes] == [len(prompt)]


def test_costs_in_loop_counts_the_passes_the_decoders_make():
    target = random_model(0)
    draft = perturbed_copy(target, 0.05, seed=1)
    prompts = [list(range(3, 15)), list(range(20, 30))]
    out = costs_in_loop(target, draft, prompts, max_new_tokens=12, gamma=3, repeat=2)
    # the counts are those of real decoding (greedy, so every repeat makes the same passes)
    plain_steps = sum(_plain_passes(target, p, 12) for p in prompts)
    assert out["passes"]["target_steps"] == 2 * plain_steps
    spec = [DecodeStats() for _ in prompts]
    for p, st in zip(prompts, spec):
        speculative_generate(target, draft, p, 12, gamma=3, stats=st)
    assert sum(out["passes"]["verify"].values()) == 2 * sum(st.target_passes for st in spec)
    p = out["passes"]
    assert p["draft_after_target"] + p["draft_after_draft"] == 2 * sum(st.draft_passes for st in spec)
    # each round that drafts starts right after a target pass (a verification, or the previous prompt's last)
    rounds_drafting = sum(sum(g > 0 for g in st.gammas) for st in spec)
    assert p["draft_after_target"] == 2 * rounds_drafting
    assert set(out["r"]) <= {1, 2, 3, 4} and out["c"] > 0
    lo, hi = sorted((out["c_after_target"], out["c_after_draft"]))
    assert lo <= out["c"] <= hi                      # a weighted mean of the two kinds
    assert out["target_step_ms"] > 0 and out["draft_pass_ms"] > 0


def _plain_passes(model, prompt, n) -> int:
    st = DecodeStats()
    generate(model, prompt, n, stats=st)
    return st.target_passes


def test_costs_in_loop_refuses_nothing_to_measure():
    m = random_model(0)
    with pytest.raises(ValueError, match="repeat"):
        costs_in_loop(m, m, [list(range(5))], repeat=0)
    with pytest.raises(ValueError, match="prompts"):
        costs_in_loop(m, m, [], repeat=1)


def test_pass_contexts_times_four_contexts_interleaved():
    target, draft = random_model(0), random_model(1, n_layer=1)
    runs = pass_contexts(target, draft, cached=8, repeat=3)
    assert list(runs) == ["target after target", "draft after draft", "target after draft", "draft after target"]
    assert all(len(v) == 3 and min(v) > 0 for v in runs.values())
    with pytest.raises(ValueError, match="context"):
        pass_contexts(target, draft, cached=target.config.block_size)


def test_call_timer_times_the_sampler_inside_the_decoders_and_restores_it():
    model = random_model(0)
    original = SamplingConfig.probs
    st = DecodeStats()
    with CallTimer(SamplingConfig, "probs") as timer:
        timed_out = generate(model, list(range(1, 9)), 6, temperature=1.0, top_p=0.9, seed=0, stats=st)
    assert SamplingConfig.probs is original
    assert len(timer.calls) == st.target_passes                       # plain sampling: one call per token
    assert all(shape[-1] == model.config.vocab_size for shape, _ in timer.calls)
    assert timer.seconds() == sum(s for _, s in timer.calls) > 0
    # the same sampled text with and without the timer: the wrapper changes nothing
    assert timed_out == generate(model, list(range(1, 9)), 6, temperature=1.0, top_p=0.9, seed=0)
    draft = perturbed_copy(model, 0.05, seed=1)
    spec = DecodeStats()
    with CallTimer(SamplingConfig, "probs") as timer:
        speculative_generate(model, draft, list(range(1, 9)), 6, gamma=3, temperature=1.0, seed=0, stats=spec)
    # speculative sampling: one call per draft pass (the q it samples from), one per verification pass (p)
    assert len(timer.calls) == spec.draft_passes + spec.target_passes
