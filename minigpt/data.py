"""The corpus: the Python standard library of the running interpreter.

It is on every machine that runs Python, needs no download, and is mostly code -- where speculation shines --
with docstrings and comments as prose to contrast. The file list is fixed and sorted, test suites are left
out, and files go to train or validation by a stable hash of their path, so the split does not depend on
the order files are found in or on which other files exist.
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
import zlib
from pathlib import Path

import numpy as np
import torch

from .tokenizer import EOT, load_tokenizer

EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
VAL_FRACTION_PER_MILLE = 50   # 5% of files are held out


def stdlib_root() -> Path:
    """Folder of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path | None = None) -> list[Path]:
    """Every ``.py`` file of the standard library except test suites, sorted by relative path."""
    root = Path(root or stdlib_root())
    files = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if any(p in EXCLUDED_DIRS or p.startswith("test_") for p in parts):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def split_of(relpath: str) -> str:
    """'val' for about 5% of files (chosen by a CRC of the relative path), else 'train'."""
    return "val" if zlib.crc32(relpath.encode()) % 1000 < VAL_FRACTION_PER_MILLE else "train"


def split_files(split: str, root: Path | None = None) -> list[Path]:
    if split not in ("train", "val"):
        raise ValueError(f"unknown split {split!r}; use 'train' or 'val'")
    root = Path(root or stdlib_root())
    return [p for p in corpus_files(root) if split_of(p.relative_to(root).as_posix()) == split]


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def cache_dir() -> Path:
    d = Path(os.environ.get("MINIGPT_CACHE", Path.home() / ".cache" / "minigpt"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def load_tokens(split: str, tokenizer=None) -> np.ndarray:
    """All files of a split, tokenized and joined with ``<|endoftext|>`` between files, as uint16.

    Cached on disk (keyed by the Python version, the split and the tokenizer) after the first call."""
    return cached_token_stream(f"tokens-{split}", f"{stdlib_root()}|{split}",
                               lambda: [read_text(p) for p in split_files(split)], tokenizer)


def cached_token_stream(name: str, key: str, texts, tokenizer=None) -> np.ndarray:
    """The texts returned by ``texts()`` tokenized and joined, each followed by ``<|endoftext|>``, as uint16.

    Saved as ``<cache>/<name>-<hash>.npy``, the hash taken over ``key`` and the tokenizer, and read back from
    there on later calls (``texts`` is then never called)."""
    enc = tokenizer or load_tokenizer()
    digest = hashlib.sha1(f"{key}|{enc.name}|{enc.n_vocab}".encode()).hexdigest()[:12]
    path = cache_dir() / f"{name}-{digest}.npy"
    if path.exists():
        return np.load(path)
    eot = enc.encode_single_token(EOT)
    ids: list[int] = []
    for toks in enc.encode_ordinary_batch(list(texts()), num_threads=2):
        ids.extend(toks)
        ids.append(eot)
    arr = np.asarray(ids, dtype=np.uint16)
    np.save(path, arr)
    return arr


def get_batch(data: np.ndarray, batch_size: int, block_size: int, generator: torch.Generator | None = None):
    """Random windows of ``block_size + 1`` tokens -> inputs x and next-token targets y, each (B, block_size)."""
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=generator)
    windows = np.stack([data[i:i + block_size + 1] for i in ix.tolist()]).astype(np.int64)
    x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1]))
    y = torch.from_numpy(np.ascontiguousarray(windows[:, 1:]))
    return x, y
