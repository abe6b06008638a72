"""Training the course tokenizer: ``python -m minigpt.training.bpe [--vocab-size N] [--out PATH]``.

The textbook byte-level BPE: split text into chunks with a regular expression (so merges never cross a
word/space/punctuation boundary), start from the 256 single bytes, and repeatedly merge the most frequent
adjacent pair into a new token. The merges are saved in tiktoken's file format, which
:func:`minigpt.tokenizer.load_tokenizer` reads.
"""
from __future__ import annotations

import argparse
import base64
import time
from collections import Counter, defaultdict
from pathlib import Path

import regex

from ..data import read_text, split_files
from ..tokenizer import ASSET, EOT, PATTERN, VOCAB_SIZE


def train_bpe(texts, vocab_size: int = VOCAB_SIZE, verbose: bool = False) -> dict[bytes, int]:
    """Learn ``vocab_size - 1`` byte-level BPE tokens (one id is left for ``<|endoftext|>``).

    Returns ``{token bytes: rank}``; lower rank = merged earlier, which is how tiktoken applies merges."""
    pat = regex.compile(PATTERN)
    chunk_counts = Counter(m for t in texts for m in pat.findall(t))
    words = [list(c.encode("utf-8")) for c in chunk_counts]       # each chunk as a list of token ids
    freqs = list(chunk_counts.values())
    vocab = [bytes([i]) for i in range(256)]

    pair_counts: Counter = Counter()
    where = defaultdict(set)  # pair -> indices of words containing it
    for w, (word, f) in enumerate(zip(words, freqs)):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += f
            where[pair].add(w)

    while len(vocab) < vocab_size - 1 and pair_counts:
        best = max(pair_counts, key=lambda p: (pair_counts[p], -p[0], -p[1]))  # ties: lowest ids first
        if pair_counts[best] < 2:
            break
        new_id = len(vocab)
        vocab.append(vocab[best[0]] + vocab[best[1]])
        for w in list(where[best]):
            word, f = words[w], freqs[w]
            for pair in zip(word, word[1:]):      # remove this word's old pairs ...
                pair_counts[pair] -= f
                if pair_counts[pair] <= 0:
                    del pair_counts[pair]
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    merged.append(new_id)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            words[w] = merged
            for pair in zip(merged, merged[1:]):  # ... and add its new ones
                pair_counts[pair] += f
                where[pair].add(w)
        where.pop(best, None)
        if verbose and new_id % 500 == 0:
            print(f"merge {new_id}: {vocab[-1]!r}")
    ranks: dict[bytes, int] = {}
    for tok in vocab:  # a byte string can arise from two different merges; keep its first rank
        ranks.setdefault(tok, len(ranks))
    return ranks


def save_tiktoken(ranks: dict[bytes, int], path: Path = ASSET) -> None:
    """Write ``ranks`` in tiktoken's file format, which :func:`minigpt.tokenizer.read_tiktoken` reads back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{base64.b64encode(tok).decode()} {rank}" for tok, rank in sorted(ranks.items(), key=lambda x: x[1])]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description="Train the course BPE on the standard library's training split.")
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    ap.add_argument("--out", type=Path, default=ASSET)
    args = ap.parse_args()
    t0 = time.time()
    ranks = train_bpe([read_text(p) for p in split_files("train")], args.vocab_size, verbose=True)
    save_tiktoken(ranks, args.out)
    print(f"{len(ranks)} tokens + {EOT} written to {args.out} in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
