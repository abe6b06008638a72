"""The real-model track's training pieces that need no model file: the distillation requests, the answer
batches, the masked distillation step, the projected embedding, and the output layer skipped where unused."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import ARCHS, random_model
from minigpt import real
from minigpt.real import distill
from minigpt.decoding import generate
from minigpt.decoding.session import prefill
from minigpt.eagle_head import load_eagle
from minigpt.cache import KVCache
from minigpt.real.request_sets import stdlib_functions, training_requests


def test_training_requests_are_deterministic_varied_and_hold_out_the_lesson():
    reqs = training_requests(n_edit=30)
    assert reqs == training_requests(n_edit=30)
    kinds = {k for k, _ in reqs}
    assert kinds == {"edit", "code", "chat"} and sum(k == "edit" for k, _ in reqs) == 30
    assert len({t for _, t in reqs}) == len(reqs)                      # no request twice
    assert not {t for _, t in reqs} & {t for _, t in real.REQUESTS}  # the lesson's requests are the test set
    edits = [t for k, t in reqs if k == "edit"]
    assert all("```python\n" in t and t.rstrip().endswith("```") for t in edits)


def test_stdlib_functions_are_small_dedented_and_parse():
    import ast
    funcs = stdlib_functions(limit=20)
    assert len(funcs) == 20
    for code, names in funcs:
        assert code.startswith(("def ", "@")) and 4 <= len(code.splitlines())
        ast.parse(code)                      # dedented: a method parses on its own
        assert all(n.isidentifier() for n in names)


def test_answer_batch_targets_only_answer_tokens():
    tokens = np.arange(200, dtype=np.uint16)
    answer = ((np.arange(200) // 10) % 2).astype(np.uint8)    # alternating runs of 10 prompt / 10 answer tokens
    x, y = distill.answer_batch(tokens, answer, 4, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16)
    kept = y != -100
    assert kept.any() and (~kept).any()
    assert torch.equal(y[kept], x[kept] + 1)                   # the next token, where there is a target
    assert all(answer[int(t)] == 1 for t in y[kept])            # ... and only inside answers
    assert all(answer[int(t) + 1] == 0 for t in x[~kept])      # a target is dropped only outside answers


def test_distil_step_is_cross_entropy_at_the_target_positions(tmp_path):
    from minigpt.training.train import Run, get_preset
    run = Run("tiny", get_preset("tiny"), tmp_path, fresh=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(run.model.config.vocab_size, (2, 12), generator=g)
    y = x.roll(-1, 1)
    y[:, :5] = -100
    with torch.no_grad():
        expect = F.cross_entropy(run.model(x).flatten(0, 1), y.flatten(), ignore_index=-100).item()
    before = run.model.transformer.wte.weight.clone()
    assert distill.distil_step(run, x, y) == pytest.approx(expect, rel=1e-5)
    assert run.step == 1 and run.tokens == 2 * 7                # tokens counted: positions with a target
    assert not torch.equal(before, run.model.transformer.wte.weight)


def test_projected_embedding_keeps_the_main_directions():
    target = random_model(0, **ARCHS["llama"])
    emb = target.transformer.wte.weight.detach()
    proj = distill.projected_embedding(target, 8)
    assert proj.shape == (emb.shape[0], 8) and proj.std().item() == pytest.approx(0.02, rel=1e-3)
    # a linear image of the embedding: the same least-squares fit of proj from emb leaves nothing over
    sol = torch.linalg.lstsq(emb, proj).solution
    assert torch.allclose(emb @ sol, proj, atol=1e-5)


def test_hidden_states_then_output_layer_is_forward():
    model = random_model(1, **ARCHS["llama"])
    idx = torch.randint(97, (2, 9))
    torch.testing.assert_close(model.lm_head(model.hidden_states(idx)), model(idx))


def test_prefill_skips_the_output_layer_and_decoding_is_unchanged():
    model = random_model(2)
    calls = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: calls.append(o.shape))
    try:
        prefill(model, KVCache.for_model(model), torch.randint(97, (1, 10)))
        assert calls == []                    # keys and values only: no logits over the prompt
    finally:
        hook.remove()
    prompt = torch.randint(97, (12,)).tolist()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(6):                    # greedy without a cache, the slow way
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert generate(model, prompt, 6) == ids[len(prompt):]


def test_train_eagle_head_reads_out_the_answers_most_frequent_tokens(monkeypatch, tmp_path):
    """SmolLM2's EAGLE trainer on a stand-in model and made-up conversations: it trains, counts only answer
    tokens for its vocabulary subset, measures held-out agreement and saves a head that loads back."""
    target = random_model(1, **ARCHS["llama"])  # rotary positions, as SmolLM2
    rng = np.random.default_rng(0)
    convs = [rng.integers(0, 97, 300) for _ in range(20)]
    answer = [np.r_[np.zeros(100, bool), np.ones(200, bool)] for _ in convs]
    for c, a in zip(convs, answer):
        c[a] = rng.integers(0, 10, int(a.sum()))  # answers use only tokens 0-9
    data = dict(tokens=np.concatenate(convs).astype(np.uint16), answer=np.concatenate(answer),
                starts=np.cumsum([0] + [len(c) for c in convs])[:-1])
    monkeypatch.setattr(distill, "load_answers", lambda held_out=0.05: (data, 2))
    monkeypatch.setattr(distill, "load_smollm", lambda device=None: target)
    monkeypatch.setattr(distill, "SMOLLM2_EAGLE_CHECKPOINT", tmp_path / "eagle.pt")
    card = distill.train_eagle_head(1.0, subset_size=10, batch_size=2, block_size=64, max_steps=3)
    assert card["steps"] == 3 and 0 <= card["held_out_top1"] <= 1 and "100.0%" in card["vocab_subset"]
    head = load_eagle(target, tmp_path / "eagle.pt")
    assert sorted(head.vocab_subset.tolist()) == list(range(10))
