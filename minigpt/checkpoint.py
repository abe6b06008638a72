"""Saving and loading model checkpoints safely.

A checkpoint is a plain dict of tensors, numbers and strings saved with ``torch.save``; loading uses
``torch.load(weights_only=True)``, which refuses arbitrary pickled objects, so a checkpoint cannot run code.
The shipped pair comes with a card (``card.json``, measured and written by :mod:`minigpt.card`), read here.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .device import get_device
from .model import GPT, GPTConfig
from .precision import reduce_precision

PACKAGE_CHECKPOINTS = Path(__file__).parent / "checkpoints"
PRETRAINED = ("target", "draft", "draft1")
PUBLIC_FIELDS = ("data", "models", "pair", "recipe")  # everything a card holds; nothing else is written or shown


class CheckpointError(ValueError):
    """A checkpoint file is missing, damaged, or does not fit the model it is loaded into."""


def save_checkpoint(path: str | Path, model: GPT, **extra) -> None:
    """Write ``{"config": ..., "model": state_dict, **extra}``; ``extra`` holds plain values (step, optimizer state)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save({"config": model.config.to_dict(), "model": model.state_dict(), **extra}, tmp)
    tmp.replace(path)  # never leave a half-written checkpoint under the real name


def read_checkpoint(path: str | Path) -> dict:
    """The raw checkpoint dict, with a one-line error for missing, truncated or foreign files."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several kinds for damaged zip archives and disallowed pickles
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"cannot read checkpoint {path} (truncated, corrupt or not a minigpt "
                              f"checkpoint): {first}") from None
    if not isinstance(ckpt, dict) or "config" not in ckpt or "model" not in ckpt:
        raise CheckpointError(f"{path} is not a minigpt checkpoint (expected keys 'config' and 'model')")
    return ckpt


def check_state_dict(model: GPT, state: dict, source: str) -> None:
    """A one-line CheckpointError unless ``state`` has exactly ``model``'s tensor names and shapes."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"{source} does not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, t in state.items():
        if t.shape != own[name].shape:
            raise CheckpointError(f"{source} does not match its config: {name} has shape {tuple(t.shape)}, "
                                  f"the model expects {tuple(own[name].shape)}")


def load_model(path: str | Path, device: str | torch.device | None = None) -> GPT:
    """Build a :class:`GPT` from a checkpoint's config and load its weights (fp32, eval mode)."""
    ckpt = read_checkpoint(path)
    try:
        model = GPT(GPTConfig(**ckpt["config"]))
    except TypeError as e:
        raise CheckpointError(f"{path} has an unknown model config: {e}") from None
    state = ckpt["model"]
    check_state_dict(model, state, str(path))
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.to(device or get_device()).eval()


def load_pretrained(name: str = "target", device: str | torch.device | None = None,
                    precision: str = "fp32") -> GPT:
    """One of the models shipped with the package: ``"target"``, ``"draft"`` (the pair's draft: two layers, so
    it can copy from its context) or ``"draft1"`` (the pair's earlier one-layer draft, kept for comparison: it
    cannot copy; ``checkpoints/card.json`` compares the two). ``precision``: "fp32" (as trained), or "bf16" /
    "int4" / "w8a8" weights on the batch-invariant path (:func:`minigpt.precision.reduce_precision`, CPU only)."""
    if name not in PRETRAINED:
        raise ValueError(f"unknown pretrained model {name!r}; choose one of {', '.join(PRETRAINED)}")
    model = load_model(PACKAGE_CHECKPOINTS / f"{name}.pt", device)
    return reduce_precision(model, precision)


def model_card() -> dict:
    """The card of the shipped pair: data, training, validation loss, and measured acceptance and cost
    (only the :data:`PUBLIC_FIELDS`; ``minigpt.card.describe_card`` prints it)."""
    path = PACKAGE_CHECKPOINTS / "card.json"
    if not path.exists():
        raise FileNotFoundError(f"model card {path} is missing")
    return public_card(json.loads(path.read_text()))


def _short_paths(x):
    """``x`` with every absolute file path (a string starting with "/") shortened to its last part."""
    if isinstance(x, dict):
        return {k: _short_paths(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_short_paths(v) for v in x]
    return x.rsplit("/", 1)[-1] if isinstance(x, str) and x.startswith("/") else x


def public_card(card: dict) -> dict:
    """Only the card's public fields (:data:`PUBLIC_FIELDS`), with absolute paths of the machine that
    trained or measured the models shortened to file names."""
    return _short_paths({k: card[k] for k in PUBLIC_FIELDS if k in card})
