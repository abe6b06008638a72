"""The copy-heavy training text (minigpt.training.copydata): every example's copy is its source with exactly
the stated change, so a model trained on it learns to copy, not to guess."""
from __future__ import annotations

import ast
import difflib
import random
import re

import pytest

from minigpt.training import copydata

SAMPLE = '''def area(width, height):
    """Area of a rectangle."""
    result = width * height
    print(width.real)
    return result
'''

UNDOCUMENTED = '''def scale(values, factor):
    out = [v * factor for v in values]
    total = sum(out)
    return out, total
'''


@pytest.fixture(scope="module")
def examples():
    return copydata.build_examples("val", seed=0)


def test_every_kind_is_built(examples):
    kinds = {ex.kind for ex in examples}
    assert kinds == set(copydata.KINDS)
    assert len(examples) > 500


def test_rename_changes_the_name_and_nothing_else():
    ex = copydata.rename_example(SAMPLE, random.Random(0))
    assert ex is not None and ex.kind == "rename"
    old, new = re.search(r"`(\w+)`.*`(\w+)`", ex.prompt.splitlines()[-1]).groups()
    if "instead of" in ex.prompt.splitlines()[-1]:
        old, new = new, old
    assert old in ("width", "height", "result") and new != old
    # undo the rename token by token: the source comes back exactly; attributes keep their name
    assert re.sub(rf"\b{new}\b", old, ex.copy) == SAMPLE
    assert f"{old}.real" in ex.copy or old != "width"


@pytest.mark.parametrize("n", range(40))
def test_renamed_copies_from_the_corpus_are_the_source_with_one_name_changed(examples, n):
    renames = [ex for ex in examples if ex.kind == "rename"]
    ex = renames[n * len(renames) // 40]
    line = ex.prompt.splitlines()[-1]
    a, b = re.findall(r"`(\w+)`", line)
    old, new = (b, a) if "instead of" in line else (a, b)
    assert ex.prompt.startswith(ex.source)
    assert ex.copy != ex.source
    assert re.sub(rf"\b{new}\b", old, ex.copy) == ex.source
    assert old not in _code_names(ex.copy), "every use of the old name is renamed"
    ast.parse(ex.copy)


def _code_names(source: str) -> set[str]:
    """The names of the source that are not attributes (``x.name``), strings or comments."""
    import io
    import tokenize
    toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    return {t.string for i, t in enumerate(toks) if t.type == tokenize.NAME and not (i and toks[i - 1].string == ".")}


def test_docstring_line_repeat_quote_and_word_edits_are_exact(examples):
    for kind in ("docstring", "line", "repeat", "quote", "word"):
        for ex in [e for e in examples if e.kind == kind][:25]:
            src, copy = ex.source.splitlines(), ex.copy.splitlines()
            diff = [d for d in difflib.ndiff(src, copy) if d[:1] in "+-"]
            if kind == "repeat":
                assert copy == src
            elif kind == "docstring":
                assert len(diff) == 1 and diff[0].startswith('+') and '"""' in diff[0]
                ast.parse(ex.copy)
            elif kind == "line":
                assert len(diff) == 1 and diff[0].startswith("-")
                assert diff[0][2:].strip() in ex.prompt.splitlines()[-1]
                ast.parse(ex.copy)
            elif kind == "quote":
                assert copy == ["> " + ln for ln in src]
            else:
                old, new = re.findall(r"`(\w+)`", ex.prompt.splitlines()[-1])
                assert re.sub(rf"\b{old}\b", new, ex.source) == ex.copy != ex.source


def test_docstring_example_on_an_undocumented_function():
    ex = copydata.docstring_example(UNDOCUMENTED, random.Random(1), ["Scale the values."])
    assert ex.copy.splitlines()[1] == '    """Scale the values."""'
    assert ex.copy.replace('    """Scale the values."""\n', "") == UNDOCUMENTED
    assert copydata.docstring_example(SAMPLE, random.Random(1), ["x."]) is None  # already documented


def test_examples_are_deterministic_and_from_the_named_split():
    a = copydata.build_examples("val", seed=3)
    b = copydata.build_examples("val", seed=3)
    assert [e.text for e in a] == [e.text for e in b]
    held_out = {p.name.split(":")[0] for p in __import__("minigpt.prompts", fromlist=["x"]).edit_prompts(8)}
    assert held_out  # the lessons' edit prompts come from held-out files, never from the training copies
    train_sources = {e.source for e in copydata.build_examples("train", seed=0)[:2000]}
    val_sources = {e.source for e in a}
    assert not (train_sources & val_sources) or len(train_sources & val_sources) < 5  # trivial duplicates only


def test_copy_probes_leave_the_model_in_the_mode_they_found_it():
    from minigpt.model import GPT, GPTConfig, evaluating
    model = GPT(GPTConfig(vocab_size=64, block_size=96, n_layer=1, n_head=2, n_embd=16))
    for training in (True, False):
        model.train(training)
        copydata.repeat_accuracy(model)
        assert model.training is training
        seen = []
        with evaluating(model):
            seen.append(model.training)
        assert seen == [False] and model.training is training
