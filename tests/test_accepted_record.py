"""Every decoder records which output tokens were drafted and accepted (DecodeStats.from_draft) and can stream
its rounds (on_tokens) without changing what it computes."""
from __future__ import annotations

import pytest
import torch

from conftest import perturbed_copy, random_model
from minigpt.decoding import generate, speculative_generate
from minigpt.decoding.lookup import lookup_generate
from minigpt.decoding.medusa import medusa_generate
from minigpt.decoding.stats import DecodeStats
from minigpt.decoding.tree import tree_generate
from minigpt.medusa_heads import MedusaHeads
from minigpt.model import early_exit_draft

TARGET = random_model(3, vocab_size=16, n_layer=3, block_size=96)
DRAFT = perturbed_copy(TARGET, 0.05)
HEADS = MedusaHeads.for_target(TARGET, n_heads=3)

DECODERS = {
    "plain": lambda p, n, **kw: (generate(TARGET, p, n, stats=(s := DecodeStats()), **kw), s),
    "chain": lambda p, n, **kw: speculative_generate(TARGET, DRAFT, p, n, gamma=3, **kw),
    "chain_adaptive": lambda p, n, **kw: speculative_generate(TARGET, DRAFT, p, n, gamma=2, adaptive=True, **kw),
    "tree": lambda p, n, **kw: tree_generate(TARGET, DRAFT, p, n, budget=8, **kw),
    "lookup": lambda p, n, **kw: lookup_generate(TARGET, p, n, **kw),
    "lookup_adaptive": lambda p, n, **kw: lookup_generate(TARGET, p, n, adaptive=True, num_pred=2, **kw),
    "lookup_tree": lambda p, n, **kw: lookup_generate(TARGET, p, n, tree=True, **kw),
    "medusa": lambda p, n, **kw: medusa_generate(TARGET, HEADS, p, n, paths=[(0,), (1,), (0, 0)], **kw),
    "self_spec": lambda p, n, **kw: speculative_generate(TARGET, early_exit_draft(TARGET, 1), p, n, gamma=3, **kw),
}
PROMPTS = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7, 5, 6, 7, 5, 6, 7, 5], [9, 1, 9, 2, 9, 3, 9]]


@pytest.mark.parametrize("name", list(DECODERS))
@pytest.mark.parametrize("sampling", [{}, dict(temperature=1.0, seed=7)])
def test_the_record_agrees_with_the_counts_and_streaming_changes_nothing(name, sampling):
    drafted = 0
    for prompt in PROMPTS:
        out, stats = DECODERS[name](prompt, 30, **sampling)
        assert len(stats.from_draft) == len(out) == stats.new_tokens
        assert sum(stats.from_draft) == stats.accepted      # without an end token nothing accepted is cut off
        pieces = []
        out2, stats2 = DECODERS[name](prompt, 30, on_tokens=pieces.append, **sampling)
        assert out2 == out and stats2.from_draft == stats.from_draft
        assert [t for piece in pieces for t in piece] == out   # the streamed pieces are the output
        assert all(piece for piece in pieces)
        drafted += stats.accepted
    if name != "plain":
        assert drafted > 0          # the drafted branch of the record was exercised
    else:
        assert drafted == 0


@pytest.mark.parametrize("name", list(DECODERS))
def test_streaming_stops_where_the_output_does(name):
    """With an end token, the streamed pieces end with it, exactly as the returned output."""
    prompt = PROMPTS[0]
    full, _ = DECODERS[name](prompt, 30)
    eos = full[len(full) // 2]
    pieces = []
    out, stats = DECODERS[name](prompt, 30, eos_id=eos, on_tokens=pieces.append)
    assert out[-1] == eos and [t for piece in pieces for t in piece] == out
    assert len(stats.from_draft) == len(out) and sum(stats.from_draft) <= stats.accepted


# ---- the view of the record: minigpt.plots.show_accepted ---------------------------------------------------
class ByteTokenizer:
    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def test_show_accepted_brackets_the_drafted_runs():
    from minigpt.plots import show_accepted
    assert show_accepted(list("abcd"), [True, True, False, True], as_html=False, legend=False) == "[ab]c[d]"
    assert show_accepted(list("xy"), [False, False], as_html=False).startswith(
        "xy\n(0 of 2 tokens drafted and accepted")
    ids = list("é<b>".encode("utf-8"))                 # a two-byte character split across two tokens
    assert show_accepted(ids, [True, True, False, False, False], ByteTokenizer(), as_html=False,
                         legend=False) == "[é]<b>"
    with pytest.raises(ValueError, match="record"):
        show_accepted(list("ab"), [True])


def test_show_accepted_on_a_real_decoding():
    from minigpt.plots import DRAFTED_COLOUR, TARGET_COLOUR, show_accepted
    target = random_model(5, vocab_size=256, n_layer=2, block_size=96)
    prompt = list(b"<a><b><c><a><b><c><a><b>")
    out, stats = lookup_generate(target, prompt, 40, adaptive=True, num_pred=2)
    assert 0 < stats.accepted < len(out)
    text = show_accepted(out, stats, ByteTokenizer(), as_html=False, legend=False)
    unbracket = lambda t: t.replace("[", "").replace("]", "")  # noqa: E731
    assert unbracket(text) == unbracket(ByteTokenizer().decode(out)) and text.count("[") >= 1
    page = show_accepted(out, stats, ByteTokenizer()).data
    assert DRAFTED_COLOUR in page and TARGET_COLOUR in page
    assert f"{stats.accepted} of {len(out)} tokens drafted and accepted" in page
