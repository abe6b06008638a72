"""Fixed prompt sets from held-out files, for measuring decoders the same way every time.

Three kinds, all cut from the validation files of :mod:`minigpt.data` (never seen in training):

* :func:`code_prompts`  -- a window of code ending at a line break, followed in the file by more code;
* :func:`prose_prompts` -- a window ending a few words into a docstring or comment, so the natural
  continuation is English, not Python (alpha, accepted / tested drafted tokens, differs a lot between the two);
* :func:`edit_prompts`  -- "here is a function, now the same function with one name changed": continuing
  means mostly copying from the prompt, the case where prompt lookup shines.

Prompts are token windows of whole-file tokenizations, so they are tokenized exactly as in training (no odd
token boundary at the cut). Everything is deterministic: the same Python standard library gives the same
prompts. Each prompt is a :class:`Prompt`: a plain list of token ids that also carries a name, a kind and the
file's true continuation.
"""
from __future__ import annotations

import ast
import io
import textwrap
import tokenize
from functools import lru_cache

import numpy as np

from .data import read_text, split_files, stdlib_root
from .tokenizer import load_tokenizer

# machine-generated files that say little about code in general
SKIP_FILES = ("_sysconfigdata",)


class Prompt(list):
    """A list of token ids with a ``name`` ("file.py:line"), a ``kind`` ("code", "prose" or "edit") and
    ``reference``: the ids that really follow in the source (a few dozen), for reading, never for grading."""

    def __init__(self, ids, name: str = "", kind: str = "", reference=(), split: str = ""):
        super().__init__(int(i) for i in ids)
        self.name, self.kind, self.reference = name, kind, list(reference)
        self.split = split  # which set a prompt belongs to, e.g. "dev" or "held-out" (SmolLM2's requests)

    def __repr__(self) -> str:
        return f"Prompt({self.kind} {self.name}, {len(self)} tokens)"


def split_code_and_prose(source: str) -> list[tuple[str, str]]:
    """Cut Python ``source`` into consecutive ("code" | "prose", text) pieces whose texts join back to it.

    Prose is comments and docstrings (a string literal standing alone as a statement), found with the
    :mod:`tokenize` module; whitespace between two prose pieces joins them (a block of comment lines is one
    piece). Everything else is code. Source that does not tokenize is returned as one code piece."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(pos: tuple[int, int]) -> int:  # tokenize's (row, col) -> character offset in source
        return starts[pos[0] - 1] + pos[1]

    spans = []  # prose (start, end) character spans
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return [("code", source)] if source else []
    skip = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
    significant = [t for t in toks if t.type not in skip]
    for i, t in enumerate(significant):
        # a docstring: a string that starts a logical line and ends it
        before = significant[i - 1].type if i else tokenize.NEWLINE
        after = significant[i + 1].type if i + 1 < len(significant) else tokenize.ENDMARKER
        if t.type == tokenize.STRING and before == tokenize.NEWLINE and after in (tokenize.NEWLINE,
                                                                                    tokenize.ENDMARKER):
            spans.append((offset(t.start), offset(t.end)))
    spans += [(offset(t.start), offset(t.end)) for t in toks if t.type == tokenize.COMMENT]
    spans.sort()

    pieces: list[tuple[str, str]] = []
    pos = 0
    for a, b in spans:
        gap = source[pos:a]
        if gap and not (gap.isspace() and pieces and pieces[-1][0] == "prose"):
            pieces.append(("code", gap))
        elif gap:  # whitespace between two prose pieces: glue them together
            pieces[-1] = ("prose", pieces[-1][1] + gap)
        if pieces and pieces[-1][0] == "prose":
            pieces[-1] = ("prose", pieces[-1][1] + source[a:b])
        else:
            pieces.append(("prose", source[a:b]))
        pos = b
    if pos < len(source):
        pieces.append(("code", source[pos:]))
    return pieces


@lru_cache(maxsize=None)
def held_out_files() -> tuple[tuple[str, str], ...]:
    """(relative path, text) of every validation file, sorted by path."""
    root = stdlib_root()
    out = []
    for path in split_files("val"):
        rel = path.relative_to(root).as_posix()
        if not any(rel.startswith(s) for s in SKIP_FILES):
            out.append((rel, read_text(path)))
    return tuple(out)


@lru_cache(maxsize=None)
def _tokenized(rel: str, text: str):
    """The file's token ids; each token's kind ('code', 'prose', or 'space' when it is only whitespace);
    whether it ends a line; and the line number where each token starts."""
    enc = load_tokenizer()
    ids = enc.encode_ordinary(text)
    raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    prose = np.concatenate([np.full(len(piece.encode("utf-8")), kind == "prose")
                            for kind, piece in split_code_and_prose(text)] or [np.zeros(0, bool)])
    visible = ~np.isin(raw, np.frombuffer(b" \t\n\r\f\v", dtype=np.uint8))
    lengths = np.array([len(enc.decode_single_token_bytes(t)) for t in ids], dtype=np.int64)
    edges = np.concatenate([[0], np.cumsum(lengths)])
    # per token: how many visible bytes, and how many of them are prose (prefix sums, no Python loop)
    n_visible = np.diff(np.concatenate([[0], np.cumsum(visible)])[edges])
    n_prose = np.diff(np.concatenate([[0], np.cumsum(visible & prose)])[edges])
    kinds = ["space" if v == 0 else ("prose" if q else "code") for v, q in zip(n_visible, n_prose)]
    newline = raw == ord("\n")
    ends_line = newline[edges[1:] - 1].tolist() if len(ids) else []
    line_no = (np.concatenate([[0], np.cumsum(newline)])[edges[:-1]] + 1).tolist()
    return ids, kinds, ends_line, line_no


def _window_start(ends_line: list[bool], end: int, max_tokens: int) -> int:
    """Earliest line start s with end - s <= max_tokens (a line start: token s - 1 ends with a newline)."""
    s = max(0, end - max_tokens)
    while s < end and s > 0 and not ends_line[s - 1]:
        s += 1
    return s


def _spread(items: list, k: int) -> list:
    """k items evenly spread over the list (deterministic)."""
    if k >= len(items):
        return list(items)
    return [items[int((j + 0.5) * len(items) / k)] for j in range(k)]


def _pick(candidates_per_file: list[list], n: int) -> list:
    """n candidates: one each from files spread evenly over the (sorted) list, then round-robin over all
    files for more; within a file, evenly spread. Returned in file order."""
    files = [c for c in candidates_per_file if c]
    quota = [0] * len(files)
    for i in _spread(list(range(len(files))), min(n, len(files))):
        quota[i] = 1
    left = n - sum(quota)
    while left > 0 and any(q < len(c) for q, c in zip(quota, files)):
        for i, c in enumerate(files):
            if left and quota[i] < len(c):
                quota[i] += 1
                left -= 1
    return [x for q, c in zip(quota, files) for x in _spread(c, q)]


def _is_english(text: str) -> bool:
    """Mostly letters and spaces, and not a doctest (``>>>`` lines are code inside a docstring)."""
    return ">>>" not in text and sum(c.isalpha() or c.isspace() for c in text) >= 0.85 * len(text)


def _fresh(prompts: list[Prompt]) -> list[Prompt]:
    """Copies, so a caller editing its prompts cannot change the cached ones."""
    return [Prompt(p, p.name, p.kind, p.reference) for p in prompts]


@lru_cache(maxsize=16)
def _windows(kind: str, prompt_tokens: int, min_prompt_tokens: int, check_tokens: int,
             at_line_start: bool, lead_in: int) -> tuple[list[Prompt], ...]:
    """Per file, token windows ending at cut points where the next ``check_tokens`` non-space tokens are
    ``kind`` (and, with ``lead_in``, the ``lead_in`` tokens before the cut too)."""
    per_file = []
    for rel, text in held_out_files():
        ids, kinds, ends_line, line_no = _tokenized(rel, text)
        cands, last = [], -10**9
        k = np.array(kinds)
        # prefix sums of "a visible token of another kind" and "a token of this kind": O(1) range checks
        other = np.concatenate([[0], np.cumsum((k != kind) & (k != "space"))])
        same = np.concatenate([[0], np.cumsum(k == kind)])
        for e in range(max(min_prompt_tokens, lead_in + 1), len(ids) - check_tokens):
            if at_line_start and not ends_line[e - 1]:
                continue
            if other[e + check_tokens] - other[e - lead_in] or same[e + check_tokens] == same[e]:
                continue  # the continuation (and the lead-in) must be all `kind`
            if lead_in and (same[e] - same[e - lead_in] < lead_in // 2 or kinds[e - lead_in - 1] == kind):
                continue  # prose: cut a few words after the start of the docstring/comment
            if kind == "prose" and not _is_english(load_tokenizer().decode(ids[e - lead_in:e + check_tokens])):
                continue
            s = _window_start(ends_line, e, prompt_tokens)
            if e - s >= min_prompt_tokens and e - last >= prompt_tokens // 2:  # windows far enough apart
                cands.append(Prompt(ids[s:e], f"{rel}:{line_no[e]}", kind, ids[e:e + check_tokens]))
                last = e
        per_file.append(cands)
    return tuple(per_file)


def code_prompts(n: int = 8, prompt_tokens: int = 128, min_prompt_tokens: int = 64,
                 continuation_tokens: int = 48) -> list[Prompt]:
    """``n`` windows of held-out code, each ending at a line break, with at least ``continuation_tokens``
    tokens of code (no comment, no docstring) after the cut. Between ``min_prompt_tokens`` and
    ``prompt_tokens`` tokens long, starting at a line start."""
    return _fresh(_pick(_windows("code", prompt_tokens, min_prompt_tokens, continuation_tokens, True, 0), n))


def prose_prompts(n: int = 8, prompt_tokens: int = 128, min_prompt_tokens: int = 64,
                  continuation_tokens: int = 24, words_in: int = 6) -> list[Prompt]:
    """``n`` windows of held-out source that end about ``words_in`` tokens into a docstring or comment,
    which goes on for at least ``continuation_tokens`` more tokens: the continuation is English prose."""
    return _fresh(_pick(_windows("prose", prompt_tokens, min_prompt_tokens, continuation_tokens, False, words_in), n))


def _renamable(fn: ast.FunctionDef) -> str | None:
    """A parameter or local name of ``fn`` that appears at least twice in its body, else None."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs if a.arg not in ("self", "cls")]
    used = [node.id for stmt in fn.body for node in ast.walk(stmt) if isinstance(node, ast.Name)]
    for name in params + sorted(set(used)):
        if len(name) > 1 and name not in ("self", "cls") and used.count(name) >= 2:
            return name
    return None


def _replace_names(source: str, old: str, new: str) -> str:
    """``source`` with every name ``old`` replaced by ``new`` (attributes such as ``x.old`` are kept)."""
    lines = source.splitlines(keepends=True)
    edits, prev = [], None
    for t in tokenize.generate_tokens(io.StringIO(source).readline):
        if t.type == tokenize.NAME and t.string == old and not (prev is not None and prev.string == "."):
            edits.append(t.start)
        if t.type not in (tokenize.NL, tokenize.COMMENT, tokenize.NEWLINE):
            prev = t
    for row, col in reversed(edits):  # right to left, so earlier columns stay valid
        line = lines[row - 1]
        lines[row - 1] = line[:col] + new + line[col + len(old):]
    return "".join(lines)


def edit_prompts(n: int = 4, min_function_tokens: int = 30, max_function_tokens: int = 72) -> list[Prompt]:
    """``n`` copy-heavy prompts: a held-out function, a comment asking for it with one name renamed, and the
    first line of the rewritten copy. ``reference`` holds the rest of the correct copy.

    With functions of at most ``max_function_tokens`` tokens the prompt stays under ~150 tokens."""
    return _fresh(_pick(_edit_candidates(min_function_tokens, max_function_tokens), n))


@lru_cache(maxsize=4)
def _edit_candidates(min_function_tokens: int, max_function_tokens: int) -> tuple[list[Prompt], ...]:
    enc = load_tokenizer()
    per_file = []
    for rel, text in held_out_files():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            per_file.append([])
            continue
        lines = text.splitlines(keepends=True)
        cands = []
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef) or len(fn.body) < 2:
                continue
            src = textwrap.dedent("".join(lines[fn.lineno - 1:fn.end_lineno]))
            try:
                ast.parse(src)
            except SyntaxError:
                continue
            if not min_function_tokens <= len(enc.encode_ordinary(src)) <= max_function_tokens:
                continue
            old = _renamable(fn)
            if old is None:
                continue
            new = f"new_{old}"
            copy = _replace_names(src, old, new)
            first, rest = copy.split("\n", 1)
            head = f"{src}\n\n# The same function, with `{old}` renamed to `{new}`:\n{first}\n"
            ids = enc.encode_ordinary(head + rest)
            n_head = len(enc.encode_ordinary(head))
            # the cut must be a token boundary of the whole text, as it is after a newline ending a line
            if enc.decode(ids[:n_head]) != head:
                continue
            cands.append(Prompt(ids[:n_head], f"{rel}:{fn.lineno}", "edit", ids[n_head:]))
        cands.sort(key=lambda p: int(p.name.rsplit(":", 1)[1]))
        per_file.append(cands)
    return tuple(per_file)
