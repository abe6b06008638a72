"""Self-speculation: the target's own first layers are its draft.

A model's early layers already point roughly where the whole stack will go. Skip the rest and read the
result with the model's final norm and output layer ("early exit"): that is a draft which needs no training,
no extra weights and no separate tokenizer, and which costs ``n_layers / n_layer`` of a target pass
(LayerSkip, Elhoushi et al. 2024; Draft & Verify, Zhang et al. 2023, skip layers instead of truncating).

The draft built here shares the target's modules (no copy: changing one changes the other), so it plugs
into every chain or tree decoder as an ordinary draft model. Verification by the full model keeps the output
exact, however poor the early exit's guesses are; how poor they are decides the speed.
"""
from __future__ import annotations

from dataclasses import replace

import torch.nn as nn

from .model import GPT


def early_exit_draft(model: GPT, n_layers: int) -> GPT:
    """A GPT made of ``model``'s embedding, its first ``n_layers`` blocks, its final norm and its output layer
    (shared, not copied). It has its own config (``n_layer = n_layers``), so it gets its own, smaller KV cache."""
    total = model.config.n_layer
    if not 1 <= n_layers < total:
        raise ValueError(f"an early-exit draft needs 1 <= n_layers < {total} (the target's layers), got {n_layers}")
    draft = GPT.__new__(GPT)       # skip GPT.__init__: no new weights are made, the target's are reused
    nn.Module.__init__(draft)
    draft.config = replace(model.config, n_layer=n_layers)
    draft.transformer = nn.ModuleDict({name: (nn.ModuleList(list(m)[:n_layers]) if name == "h" else m)
                                       for name, m in model.transformer.items()})
    draft.lm_head = model.lm_head
    return draft
