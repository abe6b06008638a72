"""A speculative chat: answers stream out as the decoder accepts them.

:func:`stream_answer` is the streaming loop. It takes any model, a tokenizer-like ``decode`` (ids -> text) and
the id that ends an answer, runs any declared decoding method (:data:`minigpt.decoding.registry.METHODS`; the
chat offers those whose drafters are loaded, :func:`choices`) with an ``on_tokens`` callback, and writes each
round's accepted run as soon as it is verified. Text is decoded incrementally: a byte-level tokenizer can split a
multi-byte character across tokens, so text that ends in an incomplete character (decoded as U+FFFD) is held
back until the next round completes it -- what has been written is always the start of the final answer.
:func:`chat_loop` is the REPL around it (history, ``/quit``, end of input). ``python -m minigpt.real.smollm chat``
runs both on SmolLM2-135M-Instruct.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ..decoding import DecodeStats, Models
from ..decoding import decode as decode_ids
from ..decoding.registry import METHODS, available

# the chat's former names for some methods, still understood
ALIASES = {"none": "plain", "lookup": "prompt_lookup", "lookup-adaptive": "prompt_lookup_adaptive", "draft": "chain",
           "self": "self_spec"}
DEFAULT = "auto"  # the speculation controller: never knowingly slower than plain decoding
LENGTH_MESSAGE = "[stopped at the length limit of {n} tokens]"


def choices(models: Models) -> list[str]:
    """What ``--speculate`` offers with these models: every declared method whose drafters are loaded."""
    return available(models)


def decoder_for(speculate: str, models: Models, params: dict | None = None) -> Callable:
    """``fn(prompt, max_new_tokens, **kw) -> (ids, DecodeStats)`` for the declared method ``speculate`` (or one of
    the chat's former names, :data:`ALIASES`), built from ``models`` with the defaults of their family and
    ``params`` over them (those the method does not have are ignored: ``gamma`` applies to the chain methods);
    ``kw`` are the decoding settings (temperature, top_k, top_p, seed, eos_id, on_tokens). ValueError in one line
    if the choice is unknown or needs a drafter that is not loaded."""
    name = ALIASES.get(speculate, speculate)
    if name not in METHODS:
        raise ValueError(f"unknown --speculate {speculate!r}; choose one of {', '.join(choices(models))}")
    method = METHODS[name]
    own = method.defaults(models.family)
    proposer = method.make(models, **{k: v for k, v in (params or {}).items() if k in own})

    def run(prompt, n, **kw):
        return decode_ids(models.target, prompt, n, proposer, **kw)
    return run


class IncrementalText:
    """Decode a growing list of ids piece by piece, never cutting a character in two.

    ``feed(ids)`` returns the text that is now final; ``flush()`` whatever is left at the end."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode, self.ids, self.written = decode, [], 0

    def feed(self, ids) -> str:
        self.ids.extend(int(i) for i in ids)
        text = self.decode(self.ids)
        end = len(text)
        while end > self.written and text[end - 1] == "\ufffd":  # an incomplete character: wait for its bytes
            end -= 1
        piece, self.written = text[self.written:end], max(self.written, end)
        return piece

    def flush(self) -> str:
        text = self.decode(self.ids)
        piece, self.written = text[self.written:], len(text)
        return piece


@dataclass
class Answer:
    ids: list[int]          # the answer's tokens, without the end token
    text: str
    stopped: str            # "eos" (the model ended its answer) or "length" (the limit was reached)
    stats: DecodeStats
    seconds: float

    def stats_line(self) -> str:
        """tau, alpha and the speed, one line (alpha: accepted / tested drafted tokens)."""
        s = self.stats
        tau = f"{s.tokens_per_target_pass:.2f}" if s.target_passes else "-"
        alpha = (f"{s.acceptance_rate:.2f} ({s.accepted} of {s.tested} tested drafted tokens accepted)"
                 if s.tested else "- (nothing drafted)")
        return (f"[{s.new_tokens} tokens in {self.seconds:.2f} s: {s.new_tokens / max(self.seconds, 1e-9):.1f} "
                f"tokens/s, tau = {tau} tokens per target pass, alpha = {alpha}]")


def stream_answer(model, prompt: list[int], decode: Callable[[list[int]], str], eos_id: int,
                  max_new_tokens: int = 200, speculate: str = "plain", models: Models | None = None,
                  params: dict | None = None, write: Callable[[str], None] = print, temperature: float = 0.0,
                  seed: int | None = None, decoder: Callable | None = None) -> Answer:
    """Generate an answer to ``prompt`` (token ids) and ``write`` it as it is accepted; return the Answer.

    The decoder (``decoder``, or :func:`decoder_for` ``speculate`` with ``models``, default ``Models(model)``,
    and ``params``) stops after ``eos_id`` or at ``max_new_tokens`` (capped by the model's context); in the
    second case :data:`LENGTH_MESSAGE` is written on a line of its own. ``write`` receives text pieces (no
    newlines added) and, at the end, ``"\\n"``."""
    run = decoder or decoder_for(speculate, models or Models(model), params)
    limit = min(max_new_tokens, model.config.block_size - len(prompt))
    if limit < 1:
        raise ValueError(f"the conversation ({len(prompt)} tokens) fills the model's context of "
                         f"{model.config.block_size} tokens")
    text = IncrementalText(lambda ids: decode([i for i in ids if i != eos_id]))

    def on_tokens(tokens):
        piece = text.feed(tokens)
        if piece:
            write(piece)

    t0 = time.perf_counter()
    ids, stats = run(prompt, limit, temperature=temperature, seed=seed, eos_id=eos_id, on_tokens=on_tokens)
    seconds = time.perf_counter() - t0
    rest = text.flush()
    if rest:
        write(rest)
    stopped = "eos" if ids and ids[-1] == eos_id else "length"
    write("\n")
    if stopped == "length":
        write(LENGTH_MESSAGE.format(n=limit) + "\n")
    answer = ids[:-1] if stopped == "eos" else ids
    return Answer(answer, decode(answer), stopped, stats, seconds)


def chat_loop(model, encode_messages: Callable[[list[dict]], list[int]], decode: Callable[[list[int]], str],
              eos_id: int, read: Callable[[str], str] = input, write: Callable[[str], None] | None = None,
              show_stats: bool = False, **answer_kw) -> list[dict]:
    """The REPL: read a message, stream the answer, keep the history (so later turns see earlier ones); stop
    at ``/quit`` or at the end of input. ``encode_messages(messages)`` makes the prompt of the conversation so
    far. Returns the history (a list of {"role", "content"})."""
    if write is None:
        def write(s):
            print(s, end="", flush=True)
    history: list[dict] = []
    while True:
        try:
            line = read("> ")
        except (EOFError, KeyboardInterrupt):
            write("\n")
            break
        if line.strip() in ("/quit", "/exit"):
            break
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        try:
            answer = stream_answer(model, encode_messages(history), decode, eos_id, write=write, **answer_kw)
        except ValueError as e:           # the conversation no longer fits the context
            write(f"error: {e}\n")
            history.pop()
            break
        history.append({"role": "assistant", "content": answer.text})
        if show_stats:
            write(answer.stats_line() + "\n")
    return history
