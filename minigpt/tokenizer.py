"""Our tokenizer: a byte-level BPE trained on the standard-library corpus, used through tiktoken.

The merges (learned by :mod:`minigpt.training.bpe`) are stored as a ``.tiktoken`` file (one
``base64(token bytes) rank`` per line) and loaded as a ``tiktoken.Encoding``: fast encoding, and no
downloads ever.
"""
from __future__ import annotations

import base64
from functools import lru_cache
from pathlib import Path

import tiktoken

ASSET = Path(__file__).parent / "assets" / "stdlib_bpe.tiktoken"
EOT = "<|endoftext|>"
VOCAB_SIZE = 4096  # 256 bytes + 3839 merges + <|endoftext|>
# Chunking rule (the one GPT-4's cl100k uses): words with a leading space, numbers of up to three digits,
# punctuation runs, newlines and other whitespace are separate chunks.
PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|"""
           r"""\s*[\r\n]|\s+(?!\S)|\s+""")


def read_tiktoken(path: Path) -> dict[bytes, int]:
    ranks = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line:
            continue
        try:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
        except ValueError:
            raise ValueError(f"{path}: line {n} is not 'base64-token rank': {line[:60]!r}") from None
    return ranks


@lru_cache(maxsize=None)
def load_tokenizer(path: str | None = None) -> tiktoken.Encoding:
    """The course tokenizer as a ``tiktoken.Encoding`` (4096 ids; the last is ``<|endoftext|>``)."""
    path = Path(path or ASSET)
    if not path.exists():
        raise FileNotFoundError(f"tokenizer file {path} is missing; rebuild it with `python -m minigpt.training.bpe`")
    ranks = read_tiktoken(path)
    return tiktoken.Encoding(name="minigpt-stdlib-bpe", pat_str=PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: len(ranks)})
