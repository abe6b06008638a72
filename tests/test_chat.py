"""The speculative chat: streamed text equals the full answer, the stop and length messages, the stats line,
the REPL, and the command's one-line errors -- on tiny random models with a byte tokenizer (no SmolLM2 file)."""
from __future__ import annotations

import pytest

from conftest import perturbed_copy, random_model
from minigpt.real import chat
from minigpt.decoding import METHODS, Models, generate
from minigpt.eagle_head import Eagle3Head, EagleHead
from minigpt.medusa_heads import MedusaHeads

EOS = 256                                       # byte ids 0..255, then the end token
MODEL = random_model(4, vocab_size=257, n_layer=3, block_size=160)
MODELS = Models(MODEL, draft=perturbed_copy(MODEL, 0.05), medusa_heads=MedusaHeads.for_target(MODEL, n_heads=2),
                medusa_paths=[(0,), (1,), (0, 0)], eagle_head=EagleHead(MODEL).eval(),
                eagle3_head=Eagle3Head(MODEL).eval(), early_exit_layers=1)
PARAMS = dict(gamma=3, max_ngram=3, num_pred=4, max_pred=8)   # each method takes those it has


def decode(ids) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def prompt_of(text: str) -> list[int]:
    return list(text.encode("utf-8"))


PROMPT = prompt_of("abc abc abc ab")


def run(prompt, eos_id, max_new_tokens=40, **kw):
    pieces = []
    answer = chat.stream_answer(MODEL, prompt, decode, eos_id, max_new_tokens, write=pieces.append,
                                models=MODELS, params=PARAMS, **kw)
    return answer, pieces


def test_the_chat_offers_every_declared_method_whose_drafters_are_loaded():
    assert chat.choices(MODELS) == list(METHODS)
    assert chat.choices(Models(MODEL)) == [n for n, m in METHODS.items() if not m.needs]
    assert set(chat.ALIASES.values()) <= set(METHODS)


@pytest.mark.parametrize("speculate", list(METHODS) + list(chat.ALIASES))
def test_streamed_text_is_the_full_generation(speculate):
    free = generate(MODEL, PROMPT, 40)
    never = next(t for t in range(256) if t not in free)     # an end token the model does not produce here
    answer, pieces = run(PROMPT, never, speculate=speculate)
    assert answer.ids == free and answer.stopped == "length"
    assert "".join(pieces) == decode(free) + "\n" + chat.LENGTH_MESSAGE.format(n=40) + "\n"
    assert answer.text == decode(free)


@pytest.mark.parametrize("speculate", ["none", "lookup-adaptive", "draft"])
def test_stops_at_the_end_token_without_the_length_message(speculate):
    free = generate(MODEL, PROMPT, 40)
    eos = free[12]
    answer, pieces = run(PROMPT, eos, speculate=speculate)
    cut = free[:free.index(eos)]
    assert answer.stopped == "eos" and answer.ids == cut
    assert "".join(pieces) == decode(cut) + "\n"
    assert not any("length limit" in p for p in pieces)


def test_length_limit_message_names_the_limit():
    answer, pieces = run(PROMPT, EOS, max_new_tokens=7)
    assert answer.stopped == "length" and len(answer.ids) == 7
    assert pieces[-1] == "[stopped at the length limit of 7 tokens]\n"
    long_prompt = [1] * 150                             # the context (160) leaves room for 10 tokens only
    answer, pieces = run(long_prompt, EOS, max_new_tokens=50)
    assert len(answer.ids) == 10 and pieces[-1] == "[stopped at the length limit of 10 tokens]\n"


def test_multibyte_characters_come_out_whole():
    text = "h\u00e9llo w\u00f6rld \u2713 \u65e5\u672c \U0001f600!"
    inc = chat.IncrementalText(decode)
    pieces = [inc.feed([b]) for b in text.encode("utf-8")] + [inc.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert "\u65e5" in pieces                           # a 3-byte character, written once its last byte came


def test_stats_line_has_tau_alpha_and_speed():
    answer, _ = run(PROMPT, EOS, speculate="lookup")
    s = answer.stats
    line = answer.stats_line()
    assert s.tested > 0
    assert f"tau = {s.tokens_per_target_pass:.2f} tokens per target pass" in line
    assert f"alpha = {s.accepted / s.tested:.2f} ({s.accepted} of {s.tested} tested drafted tokens accepted)" in line
    assert "tokens/s" in line and f"{s.new_tokens} tokens in" in line
    plain, _ = run(PROMPT, EOS, speculate="none")
    assert "tau = 1.00" in plain.stats_line() and "alpha = - (nothing drafted)" in plain.stats_line()


def test_sampled_answers_are_reproducible_with_a_seed():
    a, _ = run(PROMPT, EOS, speculate="lookup-adaptive", temperature=1.0, seed=3)
    b, _ = run(PROMPT, EOS, speculate="lookup-adaptive", temperature=1.0, seed=3)
    assert a.ids == b.ids


def test_repl_keeps_the_history_and_ends_at_quit_or_end_of_input():
    seen = []

    def encode_messages(messages):
        seen.append([m["content"] for m in messages])
        return prompt_of("".join(f"{m['role']}: {m['content']}\n" for m in messages))

    lines = iter(["first question", "", "second", "/quit", "never read"])
    out = []
    history = chat.chat_loop(MODEL, encode_messages, decode, EOS, read=lambda _: next(lines), write=out.append,
                             max_new_tokens=5, show_stats=True)
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    assert seen[1] == ["first question", history[1]["content"], "second"]   # the second turn sees the first
    assert sum("tau =" in o for o in out) == 2
    assert next(lines) == "never read"

    def eof(_):
        raise EOFError
    assert chat.chat_loop(MODEL, encode_messages, decode, EOS, read=eof, write=out.append) == []


def test_unknown_or_missing_drafters_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown --speculate 'beam'; choose one of plain, "):
        chat.decoder_for("beam", Models(MODEL))
    with pytest.raises(ValueError, match="the chain method needs a draft model, and none is loaded"):
        chat.decoder_for("draft", Models(MODEL))
    with pytest.raises(ValueError, match="needs Medusa heads"):
        chat.decoder_for("medusa", Models(MODEL))


def test_chat_command_without_the_file_is_one_line(monkeypatch, tmp_path, capsys):
    from minigpt.real import smollm
    monkeypatch.setenv("MINIGPT_SMOLLM_GGUF", str(tmp_path / "absent.gguf"))
    with pytest.raises(SystemExit) as e:
        smollm.main(["chat", "--prompt", "hi"])
    msg = str(e.value.code)
    assert "\n" not in msg and "python -m minigpt.real.smollm fetch" in msg


@pytest.mark.slow
def test_transformers_loader_shows_no_progress_bar(capfd):
    pytest.importorskip("transformers")
    from minigpt import real
    from minigpt.real import smollm
    if smollm.gguf_path() is None:
        pytest.skip("needs the SmolLM2 file (python -m minigpt.real.smollm fetch)")
    from transformers.utils import logging as hf_logging
    real.load_hf_smollm()
    captured = capfd.readouterr()
    assert "de-quantizing" not in captured.err + captured.out
    assert hf_logging.is_progress_bar_enabled()           # restored afterwards
