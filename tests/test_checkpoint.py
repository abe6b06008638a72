"""Loading checkpoints: every broken file is refused with a one-line CheckpointError naming the file and the
problem, and nothing in a checkpoint can run code."""
from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import minigpt
from conftest import random_model
from minigpt.checkpoint import CheckpointError, load_model, read_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def one_line_error(path, fragment: str, loader=load_model) -> str:
    with pytest.raises(CheckpointError) as e:
        loader(path)
    msg = str(e.value)
    assert "\n" not in msg, f"message is not one line: {msg!r}"
    assert fragment in msg, f"{fragment!r} not in {msg!r}"
    assert Path(path).name in msg, f"message does not name the file: {msg!r}"
    return msg


@pytest.fixture
def saved(tmp_path) -> Path:
    path = tmp_path / "small.pt"
    save_checkpoint(path, random_model(0), step=7, note="hello")
    return path


def test_round_trip(saved):
    model = load_model(saved, device="cpu")
    torch.testing.assert_close(model.state_dict(), random_model(0).state_dict(), atol=0, rtol=0)
    assert not model.training
    ckpt = read_checkpoint(saved)
    assert ckpt["step"] == 7 and ckpt["note"] == "hello" and ckpt["config"]["n_embd"] == 32
    assert not list(saved.parent.glob("*.tmp")), "the temporary file must be renamed away"


def test_missing_file(tmp_path):
    one_line_error(tmp_path / "absent.pt", "not found")


def test_truncated_file(saved, tmp_path):
    data = saved.read_bytes()
    cut = tmp_path / "truncated.pt"
    cut.write_bytes(data[: len(data) // 2])
    one_line_error(cut, "cannot read checkpoint")


def test_random_bytes(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(0),
                                   dtype=torch.uint8).numpy().tobytes())
    one_line_error(junk, "cannot read checkpoint")


def test_empty_file(tmp_path):
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    one_line_error(empty, "cannot read checkpoint")


CALLED = []


def _side_effect():
    CALLED.append(True)
    return {"config": {}, "model": {}}


class Payload:
    """Unpickling this object calls _side_effect: the kind of thing weights_only loading must refuse."""

    def __reduce__(self):
        return (_side_effect, ())


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_arbitrary_pickles_are_refused_and_never_run(tmp_path, how):
    path = tmp_path / f"payload-{how}.pt"
    if how == "torch.save":
        torch.save({"config": {}, "model": Payload()}, path)
    else:
        path.write_bytes(pickle.dumps(Payload(), protocol=2))
    one_line_error(path, "cannot read checkpoint")
    assert not CALLED, "loading a checkpoint executed code from it"


def test_a_dict_without_the_expected_keys(tmp_path):
    path = tmp_path / "tensors.pt"
    torch.save({"weights": torch.zeros(3)}, path)
    one_line_error(path, "not a minigpt checkpoint", loader=read_checkpoint)
    torch.save([torch.zeros(3)], path)
    one_line_error(path, "not a minigpt checkpoint")


def test_shapes_that_do_not_match_the_config(tmp_path):
    wide = random_model(0, n_embd=64)
    path = tmp_path / "mismatch.pt"
    torch.save({"config": {**wide.config.to_dict(), "n_embd": 32}, "model": wide.state_dict()}, path)
    one_line_error(path, "does not match its config")


def test_missing_and_unexpected_weights(tmp_path):
    model = random_model(0)
    state = model.state_dict()
    state.pop("transformer.ln_f.weight")
    state["extra.weight"] = torch.zeros(2)
    path = tmp_path / "keys.pt"
    torch.save({"config": model.config.to_dict(), "model": state}, path)
    msg = one_line_error(path, "does not match the model")
    assert "transformer.ln_f.weight" in msg and "extra.weight" in msg


def test_unknown_config_field(tmp_path):
    model = random_model(0)
    path = tmp_path / "config.pt"
    torch.save({"config": {**model.config.to_dict(), "n_experts": 8}, "model": model.state_dict()}, path)
    one_line_error(path, "unknown model config")


def test_unknown_pretrained_name():
    with pytest.raises(ValueError) as e:
        minigpt.load_pretrained("nope")
    msg = str(e.value)
    assert "'nope'" in msg and "target" in msg and "draft" in msg and "\n" not in msg


def test_unknown_training_preset():
    r = subprocess.run([sys.executable, "-m", "minigpt.training.train", "--preset", "nope"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode != 0
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1, f"expected a one-line error, got {err!r}"
    assert "nope" in err and "target" in err and "Traceback" not in err


def test_the_pairs_draft_copies_and_the_one_layer_draft_cannot():
    """The pair's draft has two layers, is greedy-exact as a chain, and continues a repeated span of random tokens;
    draft1, the one-layer draft it replaced, cannot (an induction head needs two layers)."""
    from minigpt import load_pretrained
    from minigpt.decoding import speculative_generate
    from minigpt.decoding.plain import generate
    from minigpt.training.copydata import repeat_accuracy
    target, draft, draft1 = (load_pretrained(n, "cpu") for n in ("target", "draft", "draft1"))
    assert draft.config.n_layer == 2 and draft1.config.n_layer == 1
    assert draft.config.vocab_size == draft1.config.vocab_size == target.config.vocab_size
    prompt = list(range(100, 140))
    assert speculative_generate(target, draft, prompt, 24, gamma=4)[0] == generate(target, prompt, 24)
    copied = {name: repeat_accuracy(model) for name, model in (("draft", draft), ("draft1", draft1))}
    assert copied["draft"] >= 7 / 8 and copied["draft1"] <= 1 / 8, copied
