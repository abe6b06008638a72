"""minigpt.engine_compare: Lesson 13's side-by-side measurements, with a stand-in for llama.cpp (a second minigpt
model behind LlamaCpp's interface) so that they run without the [engines] extra."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import random_model
from minigpt.cache import KVCache
from minigpt.decoding import DecodeStats, generate
from minigpt.device import time_rotating_over
from minigpt.engine_compare import pass_costs, race_lines, race_records, teacher_forced, top2, with_twins
from minigpt.verdict import twin_of


class StandInLlm:
    """What LlamaCpp.llm offers that the functions read: eval, reset, n_tokens, scores."""

    def __init__(self, model):
        self.model, self.cache, self.scores, self.n_tokens = model, None, [], 0
        self.reset()

    def reset(self):
        self.cache, self.scores, self.n_tokens = KVCache.for_model(self.model), [], 0

    @torch.no_grad()
    def eval(self, tokens):
        self.cache.crop(self.n_tokens)
        del self.scores[self.n_tokens:]
        logits = self.model(torch.tensor([list(tokens)]), cache=self.cache)[0]
        self.scores.extend(logits.numpy())
        self.n_tokens += len(tokens)


class StandInLlama:
    def __init__(self, model):
        self.llm = StandInLlm(model)

    def logits_of(self, prompt, chunks):
        self.llm.reset()
        self.llm.eval(prompt)
        rows = []
        for chunk in chunks:
            start = self.llm.n_tokens
            self.llm.eval(chunk)
            rows.append(np.array(self.llm.scores[start:start + len(chunk)], dtype=np.float32))
        return np.concatenate(rows)


def test_top2():
    assert top2(np.array([0.1, 3.0, 2.5, -1.0])) == [(1, 3.0), (2, 2.5)]


def test_teacher_forced_same_model_agrees_and_another_one_differs():
    m, prompt = random_model(0), [3, 14, 15, 92, 6]
    tokens = generate(m, prompt, 6)
    same = teacher_forced(m, StandInLlama(m), prompt, tokens)
    assert same["mine"].shape == same["other"].shape == (6, m.config.vocab_size)
    assert same["max_diff"] < 1e-3 and same["flips"] == [] and same["min_gap"] > 0
    assert list(same["mine"].argmax(-1)) == tokens                        # the rows that predicted each token
    other = teacher_forced(m, StandInLlama(random_model(1)), prompt, tokens)
    assert other["max_diff"] > 0.1 and other["flips"]


def test_with_twins_puts_each_twin_after_its_engine():
    f = {k: (lambda p: None) for k in ("a plain", "a fast", "b plain", "b fast")}
    base = {"a plain": "a plain", "a fast": "a plain", "b plain": "b plain", "b fast": "b plain"}
    assert list(with_twins(f, base)) == ["a plain", "a fast", twin_of("a plain"), "b plain", "b fast",
                                         twin_of("b plain")]


def test_race_records_judge_each_method_against_its_own_baseline():
    m = random_model(0)
    prompts = [[3, 14, 15, 92, 6], [2, 7, 1, 8, 2, 8]]

    def plain(p):
        stats = DecodeStats()
        return generate(m, p, 4, stats=stats), stats

    def slow(p):
        out = plain(p)
        generate(m, p, 8)            # the same output, more work
        return out

    base = {"plain": "plain", "slow": "plain"}
    fns = with_twins({"plain": plain, "slow": slow}, base)
    seconds, results = time_rotating_over(fns, prompts, "cpu", repeat=3)
    rec = race_records(seconds, results, ["p0", "p1"], base)
    assert rec["plain", "p0"]["verdict"] == "-" and rec["slow", "p0"]["same"]
    assert rec["slow", "p1"]["verdict"] == "too few repeats"          # 3 repeats: no verdict
    assert rec["slow", "all"]["ratio"] < 1
    lines = race_lines(rec, ["p0", "p1"], base)
    assert any("(the reference)" in l for l in lines) and sum(l.startswith("---") for l in lines) == 2


def test_pass_costs_minigpt_and_stand_in():
    m, d = random_model(0), random_model(1, n_layer=1)
    prompt, cont = list(range(3, 20)), list(range(20, 40))
    costs = pass_costs(m, prompt, cont, ks=(1, 4), repeats=2, llama=StandInLlama(m), draft=d)
    assert set(costs["prefill"]) == {"minigpt", "llama.cpp"} and len(costs["draft"]) == 2
    assert costs["r"]["minigpt"][1] == 1.0 and all(len(v) == 2 for v in costs["passes"].values())
    with pytest.raises(ValueError, match="continuation"):
        pass_costs(m, prompt, cont[:3], ks=(1, 4))
