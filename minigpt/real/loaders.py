"""The drafters for SmolLM2 (a distilled two-layer draft, Medusa heads, an EAGLE head) and the settings every
SmolLM2 decoder shares: the self-speculation depth, the chat's draft length, prompt lookup's settings.

The files are trained by ``python -m minigpt.real train-draft`` / ``train-medusa`` / ``train-eagle``
(:mod:`minigpt.real.distill`) and live in ``minigpt/checkpoints/``, next to the course's own pair.
"""
from __future__ import annotations

from ..checkpoint import PACKAGE_CHECKPOINTS, load_model
from ..eagle_head import EagleHead, load_eagle
from ..medusa_heads import load_medusa
from ..model import GPT

SMOLLM2_DRAFT_CHECKPOINT = PACKAGE_CHECKPOINTS / "smollm2-draft.pt"
SMOLLM2_MEDUSA_CHECKPOINT = PACKAGE_CHECKPOINTS / "smollm2-medusa.pt"
SMOLLM2_EAGLE_CHECKPOINT = PACKAGE_CHECKPOINTS / "smollm2-eagle.pt"
# of 30: the depth of the self-speculation draft. Lesson 09 measures every depth: exits before about layer 24
# almost never agree with the full model on chat answers, and on a CPU no depth is faster than plain decoding
EARLY_EXIT_LAYERS = 24
# the draft length of the chat's draft and self-speculation (python -m minigpt.real.smollm chat): Lesson 09's
# race chose gamma 1 for the shipped two-layer draft on a CPU
CHAT_GAMMA = 1
# Prompt lookup's settings for SmolLM2, chosen on the development requests only (replayed greedy outputs,
# :func:`minigpt.decoding.lookup.replay_lookup`): on their edits, 16 copied tokens beat 8 and longer n-grams
# changed nothing; the adaptive rule's cap made no difference between 16 and 64.
LOOKUP_SETTINGS = {"prompt_lookup": dict(max_ngram=3, num_pred=16),
                   "prompt_lookup_adaptive": dict(max_ngram=3, num_pred=8, max_pred=32)}


def load_smollm2_draft(device=None) -> GPT:
    """The shipped two-layer draft in SmolLM2's vocabulary (stored in bfloat16, loaded as fp32)."""
    return load_model(SMOLLM2_DRAFT_CHECKPOINT, device)


def load_smollm2_medusa(target: GPT):
    """The shipped Medusa heads for SmolLM2 and their candidate tree: (heads, paths)."""
    return load_medusa(target, path=SMOLLM2_MEDUSA_CHECKPOINT)


def load_smollm2_eagle(target: GPT) -> EagleHead:
    """The EAGLE head trained for SmolLM2 (with its frequency-ranked read-out)."""
    return load_eagle(target, SMOLLM2_EAGLE_CHECKPOINT)

