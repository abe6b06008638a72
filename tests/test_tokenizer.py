"""The course tokenizer: loads offline, 4096 ids with <|endoftext|> last, and round-trips the whole corpus."""
from __future__ import annotations

import socket

import pytest

from minigpt.data import corpus_files, read_text, split_files, split_of, stdlib_root
from minigpt.tokenizer import ASSET, EOT, VOCAB_SIZE, load_tokenizer, read_tiktoken


def test_vocabulary(tokenizer):
    assert tokenizer.n_vocab == VOCAB_SIZE == 4096
    assert EOT == "<|endoftext|>"
    assert tokenizer.encode_single_token(EOT) == 4095 == tokenizer.eot_token
    assert tokenizer.encode(EOT, allowed_special={EOT}) == [4095]
    assert tokenizer.decode([4095]) == EOT
    ranks = read_tiktoken(ASSET)
    assert sorted(ranks.values()) == list(range(4095)), "ranks must be 0..4094 with no gaps"
    assert all(bytes([b]) in ranks for b in range(256)), "every single byte must be a token (byte-level BPE)"


def test_ordinary_text_never_yields_the_special_token(tokenizer):
    ids = tokenizer.encode_ordinary("x = '<|endoftext|>'\n")
    assert 4095 not in ids and tokenizer.decode(ids) == "x = '<|endoftext|>'\n"


def test_loads_without_network(monkeypatch, tmp_path):
    def refuse(*args, **kwargs):
        raise OSError("network access attempted while loading the tokenizer")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))   # an empty cache: nothing to find there either
    enc = load_tokenizer.__wrapped__()                         # bypass the lru_cache: really read the file
    assert enc.n_vocab == 4096
    assert enc.decode(enc.encode("def f(x):\n    return x\n")) == "def f(x):\n    return x\n"


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m minigpt.training.bpe"):
        load_tokenizer.__wrapped__(str(tmp_path / "nope.tiktoken"))


@pytest.fixture(scope="module")
def files():
    return corpus_files()


def test_round_trip_on_every_corpus_file(tokenizer, files):
    assert len(files) > 100
    texts = [read_text(p) for p in files]
    encoded = tokenizer.encode_ordinary_batch(texts, num_threads=2)
    bad = [str(p.relative_to(stdlib_root())) for p, text, ids in zip(files, texts, encoded)
           if tokenizer.decode(ids) != text]
    assert not bad, f"{len(bad)} files do not round-trip, e.g. {bad[:3]}"
    n_chars, n_tokens = sum(map(len, texts)), sum(map(len, encoded))
    assert n_chars / n_tokens > 2.5, "a BPE trained on this corpus should compress it well"
    assert max(max(ids, default=0) for ids in encoded) < 4095


def test_split_is_stable_and_disjoint(files):
    root = stdlib_root()
    val = split_files("val")
    assert 0 < len(val) < len(files) / 10
    assert val == [p for p in files if split_of(p.relative_to(root).as_posix()) == "val"]
    assert not any("test" in p.relative_to(root).parts or p.name.startswith("test_") for p in files)
    with pytest.raises(ValueError, match="unknown split"):
        split_files("test")
