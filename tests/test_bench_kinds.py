"""SmolLM2's request sets (kinds, dev and held-out), the benchmark's per-set report, and lookup's replay."""
from __future__ import annotations

import importlib.util
import re

import pytest
import torch

from conftest import random_model
from minigpt import bench, real
from minigpt.decoding import generate
from minigpt.decoding.lookup import lookup_generate, replay_lookup
from minigpt.prompts import Prompt
from minigpt.real.smollm import gguf_path

CODE_BLOCK = re.compile(r"```python\n(.*?)\n```", re.S)


def test_request_sets_have_every_kind_and_do_not_overlap():
    for requests in (real.REQUESTS, real.HELD_OUT_REQUESTS):
        kinds = [k for k, _ in requests]
        assert set(kinds) == set(real.KINDS)
        assert kinds.count("edit") >= 3 and kinds.count("document") >= 3
    assert not {t for _, t in real.REQUESTS} & {t for _, t in real.HELD_OUT_REQUESTS}


@pytest.mark.parametrize("requests", [real.REQUESTS, real.HELD_OUT_REQUESTS])
def test_edit_requests_hold_a_10_to_30_line_function_that_parses(requests):
    import ast
    for kind, text in requests:
        if kind != "edit":
            continue
        code = CODE_BLOCK.search(text).group(1)
        assert 10 <= len(code.splitlines()) <= 30, text[:60]
        tree = ast.parse(code)
        assert any(isinstance(node, ast.FunctionDef) for node in tree.body)


def test_document_requests_hold_a_long_text_to_repeat():
    for kind, text in real.REQUESTS + real.HELD_OUT_REQUESTS:
        if kind == "document":
            instruction, document = text.split("\n\n", 1)
            assert len(document.split()) >= 60 and len(instruction.split()) <= 30


def test_training_requests_leave_out_both_sets():
    from minigpt.real.request_sets import training_requests
    texts = {t for _, t in training_requests(n_edit=20)}
    assert not texts & {t for _, t in real.REQUESTS + real.HELD_OUT_REQUESTS}


@pytest.mark.skipif(gguf_path() is None or importlib.util.find_spec("gguf") is None,
                    reason="needs the SmolLM2 file (python -m minigpt.real.smollm fetch) and gguf (pip install -e \".[real]\")")
def test_real_prompts_select_kinds_and_sets():
    dev = real.real_prompts(kinds=("edit", "document"))
    held = real.real_prompts(kinds=("edit",), split="held-out", per_kind=2)
    both = real.real_prompts(split="all")
    assert {p.split for p in dev} == {"dev"} and {p.kind for p in dev} == {"edit", "document"}
    assert [p.name for p in held] == ["edit-held-1", "edit-held-2"] and {p.split for p in held} == {"held-out"}
    assert len(both) == len(real.REQUESTS) + len(real.HELD_OUT_REQUESTS)
    assert len({p.name for p in both}) == len(both)
    with pytest.raises(ValueError, match="split"):
        real.real_prompts(split="test")
    with pytest.raises(ValueError, match="kind"):
        real.real_prompts(kinds=("poetry",))


def test_bench_reports_each_set_and_its_kinds():
    target = random_model(0, vocab_size=97, n_layer=2)
    g = torch.Generator().manual_seed(1)
    ids = [torch.randint(97, (8,), generator=g).tolist() * 2 for _ in range(4)]
    prompts = [Prompt(x, f"p{i}", kind, split=split)
               for i, (x, kind, split) in enumerate(zip(ids, "abab", ["dev", "dev", "held-out", "held-out"]))]
    records = bench.run_bench(["prompt_lookup", "prompt_lookup_adaptive"], models=bench.Models(target),
                              prompts=prompts, max_new_tokens=8, repeats=2,
                              method_params={"prompt_lookup": dict(num_pred=4)})
    for r in records:
        dev, held = r["by_split"]["dev"], r["by_split"]["held-out"]
        assert dev["n_prompts"] == held["n_prompts"] == 2
        assert dev["new_tokens"] + held["new_tokens"] == r["new_tokens"]
        assert set(dev["by_kind"]) == set(held["by_kind"]) == {"a", "b"}
        assert dev["by_kind"]["a"]["n_prompts"] == 1 and r["identical_to_plain_greedy"]
    assert records[1]["params"]["num_pred"] == 4
    assert "held-out b" in bench.format_table(records)
    with pytest.raises(ValueError, match="no parameter"):
        bench.run_bench(["prompt_lookup"], models=bench.Models(target), prompts=prompts, max_new_tokens=4,
                        repeats=1, method_params={"prompt_lookup": dict(gamma=3)})


@pytest.mark.parametrize("kw", [dict(), dict(num_pred=16, max_ngram=2), dict(adaptive=True, num_pred=2, max_pred=8)])
def test_replay_gives_the_decoders_rounds(kw):
    target = random_model(2, vocab_size=12, n_layer=2, block_size=128)
    g = torch.Generator().manual_seed(4)
    for _ in range(8):
        block = torch.randint(12, (6,), generator=g).tolist()
        prompt, n = block + [3] + block, int(torch.randint(5, 40, (1,), generator=g))
        out, stats = lookup_generate(target, prompt, n, **kw)
        rounds = replay_lookup(prompt, generate(target, prompt, n), **kw)
        assert [p for p, _ in rounds] == stats.gammas and sum(a for _, a in rounds) == stats.accepted
        assert len(rounds) == stats.target_passes
