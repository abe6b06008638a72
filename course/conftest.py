"""Lessons 09, 09b, 13 and 13b run a real model (SmolLM2-135M) whose weights are fetched separately, once
(``python -m minigpt.real.smollm fetch``) and read with the optional ``gguf`` package. Where either is missing (CI,
a fresh clone), those lessons are skipped with the reason instead of failing; every other lesson runs as usual.
the llama.cpp cells of Lessons 13 and 13b also need the ``[engines]`` extra; without it they say so and skip themselves."""
from __future__ import annotations

import pytest

REAL_MODEL_LESSONS = ("09_real_model.ipynb", "09b_real_model_drafters.ipynb", "13_production.ipynb",
                      "13b_exact_at_4_bits.ipynb")


def _why_not_runnable() -> str | None:
    """None when Lessons 09 and 09b can run here, else the reason it cannot."""
    from minigpt.real import smollm
    if smollm.gguf_path() is None:
        return smollm.MISSING_REASON
    if not smollm.gguf_available():
        return f"the gguf package is absent: {smollm.INSTALL_HINT}"
    return None


def pytest_collection_modifyitems(config, items):
    lessons = [item for item in items if item.path.name in REAL_MODEL_LESSONS]
    if not lessons:
        return
    reason = _why_not_runnable()
    if reason is not None:
        for item in lessons:
            item.add_marker(pytest.mark.skip(reason=reason))
