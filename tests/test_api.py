"""The public API a learner meets first: load the shipped models and tokenizer, generate, pick a device."""
from __future__ import annotations

import pytest
import torch

import minigpt


def test_public_names():
    for name in ("GPT", "GPTConfig", "KVCache", "load_pretrained", "load_model", "load_tokenizer", "generate",
                 "speculative_generate", "get_device", "probs_from_logits", "SamplingConfig", "DecodeStats",
                 "model_card", "__version__"):
        assert hasattr(minigpt, name), f"minigpt.{name} is missing"
    assert set(minigpt.__all__) <= set(dir(minigpt))


def test_load_the_shipped_models(target, draft):
    for model in (target, draft):
        assert isinstance(model, minigpt.GPT) and not model.training
        assert model.config.vocab_size == 4096
        assert next(model.parameters()).dtype == torch.float32
    assert draft.num_params() < target.num_params()
    assert draft.config.block_size >= 128 and target.config.block_size >= 128


def test_load_pretrained_on_the_default_device(target):
    model = minigpt.load_pretrained("target")
    assert model.device.type == minigpt.get_device().type
    torch.testing.assert_close(model.to("cpu").state_dict(), target.state_dict(), atol=0, rtol=0)


def test_tokenizer_and_generate_greedy_is_deterministic(target, tokenizer):
    prompt = tokenizer.encode("def add(a, b):\n")
    a = minigpt.generate(target, prompt, max_new_tokens=20)
    b = minigpt.generate(target, prompt, max_new_tokens=20)
    assert a == b and len(a) == 20 and all(0 <= t < 4096 for t in a)
    assert isinstance(tokenizer.decode(a), str)
    stats = minigpt.DecodeStats()
    minigpt.generate(target, torch.tensor(prompt), max_new_tokens=5, stats=stats)   # a tensor prompt works too
    assert stats.new_tokens == 5 and stats.prefills == 1 and stats.target_passes == 5


def test_sampling_is_reproducible_with_a_seed(target, tokenizer):
    prompt = tokenizer.encode("import os\n")
    runs = {seed: minigpt.generate(target, prompt, 16, temperature=1.0, seed=seed) for seed in (1, 1, 2, 3)}
    again = minigpt.generate(target, prompt, 16, temperature=1.0, seed=1)
    assert runs[1] == again
    assert len({tuple(v) for v in runs.values()}) == 3, "different seeds should give different samples"


def test_eos_stops_generation(target, tokenizer):
    prompt = tokenizer.encode("x = 1\n")
    full = minigpt.generate(target, prompt, 10)
    stop = full[3]
    out = minigpt.generate(target, prompt, 10, eos_id=stop)
    assert out == full[:full.index(stop) + 1]


def test_prompt_longer_than_the_context(target):
    n = target.config.block_size
    for prompt_len, new in ((n + 1, 1), (n - 3, 10)):
        with pytest.raises(ValueError) as e:
            minigpt.generate(target, [5] * prompt_len, max_new_tokens=new)
        msg = str(e.value)
        assert "exceeds the model's context" in msg and str(n) in msg and "\n" not in msg


@pytest.mark.parametrize("prompt, fragment", [([], "non-empty"), ([[1, 2], [3, 4]], "1-D"),
                                              ([1, 4096], "outside the vocabulary"), ([-1], "outside the vocabulary")])
def test_bad_prompts(target, prompt, fragment):
    with pytest.raises(ValueError, match=fragment):
        minigpt.generate(target, prompt, max_new_tokens=2)


def test_device_override(monkeypatch):
    monkeypatch.setenv("MINIGPT_DEVICE", "cpu")
    assert minigpt.get_device() == torch.device("cpu")
    monkeypatch.setenv("MINIGPT_DEVICE", "warp-drive")
    with pytest.raises(ValueError) as e:
        minigpt.get_device()
    assert "MINIGPT_DEVICE='warp-drive'" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.delenv("MINIGPT_DEVICE")
    assert minigpt.get_device().type in ("cuda", "mps", "cpu")


def test_the_card_reports_the_measured_pair_and_only_public_fields():
    from minigpt.card import check_targets, describe_card
    from minigpt.checkpoint import PUBLIC_FIELDS
    card = minigpt.model_card()
    pair = card["pair"]
    assert 0 < pair["acceptance_rate_alpha"] <= 1 and 1 <= pair["tokens_per_target_pass"] <= pair["gamma"] + 1
    assert 0 < pair["cost_ratio_c"] < 1 and pair["identical_to_plain_greedy"] is True
    assert set(card) <= set(PUBLIC_FIELDS) and {"data", "models", "pair"} <= set(card)
    text = describe_card(card)
    assert f"alpha = {pair['acceptance_rate_alpha']:.3f}" in text and "targets" not in text
    goals = check_targets(pair)  # "met" is what the numbers say, not a claim
    assert goals["met"] == (pair["tokens_per_target_pass"] >= 3.5 and pair["acceptance_rate_alpha"] >= 0.8)
    for name in ("target", "draft", "draft1"):
        training = card["models"][name]["training"]
        assert training["steps"] > 0 and training["tokens_seen"] > 0 and training["val_loss"] > 0


def test_public_card_drops_internal_fields_and_shortens_paths():
    from minigpt.checkpoint import public_card
    raw = {"data": "d", "models": {"t": {"training": {"distilled_from": "/home/someone/runs/target.pt"}}},
           "pair": {}, "targets_from_issue": {"met": False}, "history": "how the repository was managed"}
    card = public_card(raw)
    assert set(card) == {"data", "models", "pair"}
    assert card["models"]["t"]["training"]["distilled_from"] == "target.pt"
