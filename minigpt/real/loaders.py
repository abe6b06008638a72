"""The drafters for SmolLM2 (a distilled two-layer draft, Medusa heads, an EAGLE head, an EAGLE-3 head), which of
them are installed, and the settings every SmolLM2 decoder shares: the self-speculation depth, the chat's draft
length. Prompt lookup's settings for SmolLM2 are declared with the method (the "smollm2" family of
:mod:`minigpt.decoding.registry`).

The files are trained by ``python -m minigpt.real train-draft`` / ``train-medusa`` / ``train-eagle`` /
``train-eagle3`` (:mod:`minigpt.real.distill`) and live in ``minigpt/checkpoints/``, next to the course's own pair.
"""
from __future__ import annotations

from ..checkpoint import PACKAGE_CHECKPOINTS, load_model
from ..decoding.registry import METHODS, Models
from ..eagle_head import Eagle3Head, EagleHead, load_eagle, load_eagle3
from ..medusa_heads import load_medusa
from ..model import GPT

SMOLLM2_DRAFT_CHECKPOINT = PACKAGE_CHECKPOINTS / "smollm2-draft.pt"
SMOLLM2_MEDUSA_CHECKPOINT = PACKAGE_CHECKPOINTS / "smollm2-medusa.pt"
SMOLLM2_EAGLE_CHECKPOINT = PACKAGE_CHECKPOINTS / "smollm2-eagle.pt"
SMOLLM2_EAGLE3_CHECKPOINT = PACKAGE_CHECKPOINTS / "smollm2-eagle3.pt"
# of 30: the depth of the self-speculation draft. Lesson 09 measures every depth: exits before about layer 24
# almost never agree with the full model on chat answers, and on a CPU no depth is faster than plain decoding
EARLY_EXIT_LAYERS = 24
# the draft length of the chat's draft and self-speculation (python -m minigpt.real.smollm chat): Lesson 09's
# race chose gamma 1 for the shipped two-layer draft on a CPU
CHAT_GAMMA = 1
# Prompt lookup's settings for SmolLM2, chosen on the development requests only (replayed greedy outputs,
# :func:`minigpt.decoding.lookup.replay_lookup`): on their edits, 16 copied tokens beat 8 and longer n-grams
# changed nothing; the adaptive rule's cap made no difference between 16 and 64. Declared with the methods.
LOOKUP_SETTINGS = {n: METHODS[n].defaults("smollm2") for n in ("prompt_lookup", "prompt_lookup_adaptive")}
# each drafter trained for SmolLM2, as the need it meets (a Models field) -> its file
DRAFTER_FILES = {"draft": SMOLLM2_DRAFT_CHECKPOINT, "medusa_heads": SMOLLM2_MEDUSA_CHECKPOINT,
                 "eagle_head": SMOLLM2_EAGLE_CHECKPOINT, "eagle3_head": SMOLLM2_EAGLE3_CHECKPOINT}
TRAIN_COMMANDS = {"draft": "train-draft", "medusa_heads": "train-medusa", "eagle_head": "train-eagle",
                  "eagle3_head": "train-eagle3"}


def load_smollm2_draft(device=None) -> GPT:
    """The shipped two-layer draft in SmolLM2's vocabulary (stored in bfloat16, loaded as fp32)."""
    return load_model(SMOLLM2_DRAFT_CHECKPOINT, device)


def load_smollm2_medusa(target: GPT):
    """The shipped Medusa heads for SmolLM2 and their candidate tree: (heads, paths)."""
    return load_medusa(target, path=SMOLLM2_MEDUSA_CHECKPOINT)


def load_smollm2_eagle(target: GPT) -> EagleHead:
    """The EAGLE head trained for SmolLM2 (with its frequency-ranked read-out)."""
    return load_eagle(target, SMOLLM2_EAGLE_CHECKPOINT)


def load_smollm2_eagle3(target: GPT) -> Eagle3Head:
    """The EAGLE-3 head trained for SmolLM2 (three layers fused, frequency-ranked read-out)."""
    return load_eagle3(target, SMOLLM2_EAGLE3_CHECKPOINT)


def installed() -> set[str]:
    """The drafters trained for SmolLM2 whose files are here, as the needs they meet ("draft", ...)."""
    return {need for need, path in DRAFTER_FILES.items() if path.exists()}


def smollm2_methods() -> list[str]:
    """The declared methods SmolLM2 has every drafter for (those that need none, and those whose files are here)."""
    have = installed()
    return [name for name, m in METHODS.items() if set(m.needs) <= have]


def load_drafters(models: Models, needs=None) -> Models:
    """Load into ``models`` (SmolLM2's, its ``target`` set) the installed drafters among ``needs`` (default: all
    installed); the others stay None. Returns ``models``."""
    for need in installed() & set(DRAFTER_FILES if needs is None else needs):
        if need == "draft":
            models.draft = load_smollm2_draft(models.target.device)
            models.draft.tokenizer = getattr(models.target, "tokenizer", None)
        elif need == "medusa_heads":
            models.medusa_heads, models.medusa_paths = load_smollm2_medusa(models.target)
        elif need == "eagle3_head":
            models.eagle3_head = load_smollm2_eagle3(models.target)
        else:
            models.eagle_head = load_smollm2_eagle(models.target)
    return models
