"""Copy-heavy training text: teach the target to repeat what is already in its context.

Prompt lookup (Lesson 06) can only pay when the model's continuation repeats its context: an edit returns a
function with one name changed, a docstring pass returns the same code with one line more, a quote repeats a
paragraph. A model learns that by forming *induction heads* (attention that finds the previous occurrence of
the current token and copies what followed it), and it forms them fastest on text where copying is the way to
predict. This module builds such text from the **training** files of the corpus (the edit prompts of
:mod:`minigpt.prompts` come from the held-out files, so the copies the lessons measure were never trained on).

Each example is a function (or a paragraph of docstring prose) followed by an instruction comment and its
edited copy. Every edit is made on the source text and checked, so an example's copy really is its source
with exactly the stated change:

* ``rename``    -- one parameter or local renamed (attributes such as ``x.old`` keep their name);
* ``docstring`` -- a one-line docstring inserted after the ``def`` line;
* ``line``      -- one line of the body deleted (the instruction quotes it);
* ``repeat``    -- the function again, unchanged;
* ``quote``     -- a paragraph of prose repeated with ``> `` before every line;
* ``word``      -- a paragraph of prose repeated with one word replaced.

The instruction comments come in several phrasings, so the model learns to copy, not one template.
``python -m minigpt.training.copydata`` prints a few examples.
"""
from __future__ import annotations

import ast
import random
import re
import textwrap
from dataclasses import dataclass

import numpy as np
import torch

from ..data import cached_token_stream, read_text, split_files, stdlib_root
from ..model import evaluating
from ..prompts import _renamable, _replace_names, split_code_and_prose

KINDS = ("rename", "docstring", "line", "repeat", "quote", "word")

RENAME_PHRASES = ("# The same function, with `{old}` renamed to `{new}`:",
                  "# Rename `{old}` to `{new}`:",
                  "# Now with `{new}` instead of `{old}`:",
                  "# Refactored: `{old}` is called `{new}` now.")
DOCSTRING_PHRASES = ("# The same function, with a docstring:",
                     "# Add a docstring:",
                     "# Documented version:")
LINE_PHRASES = ("# The same function, without the line `{line}`:",
                "# Delete the line `{line}`:",
                "# Remove `{line}`:")
REPEAT_PHRASES = ("# Again, unchanged:", "# A copy of the function above:", "# Once more:")
QUOTE_PHRASES = ("# Quoted:", "# As a quotation:")
WORD_PHRASES = ("# The same text, with `{old}` replaced by `{new}`:", "# Replace `{old}` with `{new}`:")
NEW_NAME_STYLES = ("new_{}", "{}2", "{}_value", "the_{}", "my_{}", "{}_")


@dataclass
class Example:
    kind: str
    source: str   # the original function or paragraph
    prompt: str   # source, blank line, the instruction comment, newline
    copy: str     # the edited copy (what a model that copies should write)

    @property
    def text(self) -> str:
        return self.prompt + self.copy


def _gap(rng: random.Random) -> str:
    """The blank lines between a source and its instruction: one or two, as people write them."""
    return rng.choice(("\n", "\n\n"))


def _functions(text: str) -> list[str]:
    """Every function of a module's source that parses on its own once dedented."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    lines = text.splitlines(keepends=True)
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(fn.body) >= 2:
            start = fn.decorator_list[0].lineno if fn.decorator_list else fn.lineno
            src = textwrap.dedent("".join(lines[start - 1:fn.end_lineno]))
            try:
                ast.parse(src)
            except SyntaxError:
                continue
            out.append(src.rstrip("\n") + "\n")
    return out


def _paragraphs(text: str, min_words: int = 12) -> list[str]:
    """Docstring and comment paragraphs of a module, each as plain lines of English."""
    out = []
    for kind, piece in split_code_and_prose(text):
        if kind != "prose":
            continue
        body = textwrap.dedent(piece.strip().strip('"').strip("'").strip("#"))
        for para in re.split(r"\n\s*\n", body):
            para = "\n".join(ln.strip().lstrip("# ") for ln in para.strip().splitlines())
            words = para.split()
            letters = sum(c.isalpha() or c.isspace() for c in para)
            if len(words) >= min_words and ">>>" not in para and letters >= 0.85 * len(para):
                out.append(para + "\n")
    return out


def rename_example(src: str, rng: random.Random) -> Example | None:
    fn = next((n for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    old = _renamable(fn) if fn is not None else None
    if old is None:
        return None
    new = rng.choice(NEW_NAME_STYLES).format(old)
    if re.search(rf"\b{re.escape(new)}\b", src):
        return None
    copy = _replace_names(src, old, new)
    if copy == src:
        return None
    return Example("rename", src, f"{src}{_gap(rng)}{rng.choice(RENAME_PHRASES).format(old=old, new=new)}\n", copy)


def docstring_example(src: str, rng: random.Random, docstrings: list[str]) -> Example | None:
    lines = src.splitlines(keepends=True)
    tree = ast.parse(src)
    fn = tree.body[0]
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or ast.get_docstring(fn) is not None:
        return None
    first_body = fn.body[0].lineno  # 1-based line of the first statement: the docstring goes before it
    indent = re.match(r"[ \t]*", lines[first_body - 1]).group(0)
    doc = rng.choice(docstrings)
    copy = "".join(lines[:first_body - 1]) + f'{indent}"""{doc}"""\n' + "".join(lines[first_body - 1:])
    try:
        ast.parse(copy)
    except SyntaxError:
        return None
    return Example("docstring", src, f"{src}{_gap(rng)}{rng.choice(DOCSTRING_PHRASES)}\n", copy)


def line_example(src: str, rng: random.Random) -> Example | None:
    lines = src.splitlines(keepends=True)
    fn = ast.parse(src).body[0]
    # one-line statements of the body (not the first: keep the def and its docstring)
    simple = [s.lineno for s in fn.body[1:] if s.lineno == s.end_lineno and not isinstance(s, ast.Return)]
    if not simple:
        return None
    row = rng.choice(simple)
    copy = "".join(lines[:row - 1] + lines[row:])
    try:
        ast.parse(copy)
    except SyntaxError:
        return None
    line = lines[row - 1].strip()
    if "`" in line or len(line) > 60 or sum(ln.strip() == line for ln in lines) > 1:
        return None  # the instruction must name the line unambiguously, and fit on one comment line
    return Example("line", src, f"{src}{_gap(rng)}{rng.choice(LINE_PHRASES).format(line=line)}\n", copy)


def repeat_example(src: str, rng: random.Random) -> Example:
    return Example("repeat", src, f"{src}{_gap(rng)}{rng.choice(REPEAT_PHRASES)}\n", src)


def quote_example(para: str, rng: random.Random) -> Example:
    quoted = "".join(f"> {ln}\n" for ln in para.splitlines())
    return Example("quote", para, f"{para}{_gap(rng)}{rng.choice(QUOTE_PHRASES)}\n", quoted)


def word_example(para: str, rng: random.Random) -> Example | None:
    words = sorted({w for w in re.findall(r"\b[a-z]{4,}\b", para)})
    if len(words) < 2:
        return None
    old, new = rng.sample(words, 2)
    copy = re.sub(rf"\b{old}\b", new, para)
    return Example("word", para, f"{para}{_gap(rng)}{rng.choice(WORD_PHRASES).format(old=old, new=new)}\n", copy)


def build_examples(split: str = "train", seed: int = 0, max_function_chars: int = 900) -> list[Example]:
    """Copy examples from every file of ``split``, in a deterministic shuffled order."""
    rng = random.Random(seed)
    functions, paragraphs = [], []
    for path in split_files(split):
        text = read_text(path)
        functions += [f for f in _functions(text) if 80 <= len(f) <= max_function_chars]
        paragraphs += [p for p in _paragraphs(text) if len(p) <= 600]
    docstrings = [p.splitlines()[0].rstrip(".") + "." for p in paragraphs if 20 <= len(p.splitlines()[0]) <= 70
                  and '"' not in p.splitlines()[0] and "\\" not in p.splitlines()[0]]
    examples: list[Example] = []
    for src in functions:
        kind = rng.choice(("rename", "rename", "rename", "docstring", "line", "repeat"))
        ex = {"rename": lambda: rename_example(src, rng), "docstring": lambda: docstring_example(src, rng, docstrings),
              "line": lambda: line_example(src, rng), "repeat": lambda: repeat_example(src, rng)}[kind]()
        examples.append(ex or repeat_example(src, rng))
    for para in paragraphs[::2]:
        ex = word_example(para, rng) if rng.random() < 0.5 else quote_example(para, rng)
        examples.append(ex or quote_example(para, rng))
    rng.shuffle(examples)
    return examples


def load_copy_tokens(split: str = "train", tokenizer=None, seed: int = 0) -> np.ndarray:
    """The examples of ``split`` tokenized and joined with ``<|endoftext|>``, as uint16 (cached on disk)."""
    return cached_token_stream(f"copy-tokens-{split}", f"{stdlib_root()}|copy-v2|{split}|{seed}",
                               lambda: [ex.text for ex in build_examples(split, seed)], tokenizer)


def example_starts(data: np.ndarray, eot: int) -> np.ndarray:
    """Offsets of the examples in a joined array of :func:`load_copy_tokens` (after each end-of-text)."""
    ends = np.flatnonzero(data == eot)
    return np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)


def copy_batch(data: np.ndarray, starts: np.ndarray, batch_size: int, block_size: int,
               generator: torch.Generator | None = None, random_repeat: float = 0.125, vocab_size: int = 4096):
    """A batch of windows that each begin at an example's start, so every copy has its source in view
    (a window at a random offset often cuts the source off and leaves a copy nothing can predict).

    A fraction ``random_repeat`` of the rows are random tokens repeated (a span of 8-48 ids, then again and
    again): text that only copying can predict, the classic way to grow induction heads quickly."""
    rows = []
    n_random = int(round(batch_size * random_repeat))
    for i in torch.randint(len(starts), (batch_size - n_random,), generator=generator).tolist():
        s = int(min(starts[i], len(data) - block_size - 1))
        rows.append(data[s:s + block_size + 1].astype(np.int64))
    for _ in range(n_random):
        span = int(torch.randint(8, 49, (1,), generator=generator))
        piece = torch.randint(vocab_size, (span,), generator=generator).numpy()
        rows.append(np.resize(piece, block_size + 1).astype(np.int64))
    windows = np.stack(rows)
    return torch.from_numpy(windows[:, :-1].copy()), torch.from_numpy(windows[:, 1:].copy())


@torch.no_grad()
def copy_accuracy(model, prompts) -> float:
    """Teacher-forced top-1 accuracy of ``model`` on the true copies of edit prompts: the share of the
    copy's tokens that are the model's argmax given the prompt and the copy so far (a model that copies
    perfectly scores 1)."""
    hits = total = 0
    device = next(model.parameters()).device
    with evaluating(model):
        for p in prompts:
            ids = list(p) + list(p.reference)
            ids = ids[-model.config.block_size:]
            n_ref = min(len(p.reference), len(ids) - 1)
            logits = model(torch.tensor([ids[:-1]], device=device))[0, -n_ref:]
            hits += int((logits.argmax(-1).cpu() == torch.tensor(ids[-n_ref:])).sum())
            total += n_ref
    return hits / max(total, 1)


@torch.no_grad()
def repeat_accuracy(model, span: int = 40, rows: int = 16, seed: int = 0) -> float:
    """Top-1 accuracy on the second copy of a span of random tokens: near 0 without induction heads (nothing
    else can predict random tokens), near 1 once the model copies from its context."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(model.config.vocab_size, (rows, span), generator=g)
    seq = torch.cat([x, x], 1).to(next(model.parameters()).device)
    with evaluating(model):
        pred = model(seq[:, :-1]).argmax(-1)[:, span:]
    return float((pred == seq[:, span + 1:]).float().mean())


if __name__ == "__main__":
    exs = build_examples()
    counts = {k: sum(e.kind == k for e in exs) for k in KINDS}
    print(f"{len(exs)} examples: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    shown = set()
    for ex in exs:
        if ex.kind not in shown:
            shown.add(ex.kind)
            print(f"---- {ex.kind} " + "-" * 60 + "\n" + ex.text)
