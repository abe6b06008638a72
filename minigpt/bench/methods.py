"""The benchmark's methods: what a method may use (:class:`Models`), the registry (:data:`METHODS`,
:func:`register`) and the course's decoders registered in it.

A new decoder joins by registering a function ``run(models, prompt, max_new_tokens, **params) ->
(new ids, DecodeStats)``::

    @register("prompt_lookup", max_ngram=3, num_pred=8)
    def _prompt_lookup(models, prompt, max_new_tokens, max_ngram, num_pred):
        return lookup_generate(models.target, prompt, max_new_tokens, max_ngram=max_ngram, num_pred=num_pred)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..checkpoint import load_pretrained
from ..decoding import DecodeStats, generate, speculative_generate
from ..decoding.eagle import eagle_generate
from ..decoding.lookahead import lookahead_generate
from ..decoding.lookup import lookup_generate
from ..decoding.medusa import medusa_generate
from ..decoding.tree import tree_generate
from ..eagle_head import load_eagle
from ..medusa_heads import load_medusa
from ..model import early_exit_draft


@dataclass
class Models:
    """What a method may use: the target, a draft, Medusa heads (with the heads' tree), an EAGLE head, the depth
    of the target's own early-exit draft (self-speculation; default a third of its layers), and the token that
    ends an answer (every method stops after it; None: never stop early)."""
    target: torch.nn.Module
    draft: torch.nn.Module | None = None
    medusa_heads: torch.nn.Module | None = None
    medusa_paths: list | None = None
    eagle_head: torch.nn.Module | None = None
    early_exit_layers: int | None = None
    hf_target: object | None = None  # transformers' own model of the same weights (for --peers), if it has one
    eos_id: int | None = None

    @classmethod
    def shipped(cls, device, medusa: bool = False, eagle: bool = False) -> "Models":
        """The course's shipped target and draft on ``device``, its Medusa heads if ``medusa``, its EAGLE head if
        ``eagle``."""
        models = cls(load_pretrained("target", device), load_pretrained("draft", device))
        if medusa:
            models.medusa_heads, models.medusa_paths = load_medusa(models.target)
        if eagle:
            models.eagle_head = load_eagle(models.target)
        return models


@dataclass
class Method:
    """A registered decoding method: its name, its function, its default parameters, one line about it."""
    name: str
    run: Callable  # run(models, prompt, max_new_tokens, **params) -> (new ids, DecodeStats)
    params: dict = field(default_factory=dict)
    description: str = ""


METHODS: dict[str, Method] = {}


def register(name: str, description: str = "", **params):
    """Decorator: add a decoding method to the benchmark under ``name`` with default ``params``."""
    def deco(fn):
        METHODS[name] = Method(name, fn, dict(params), description or (fn.__doc__ or "").strip())
        return fn
    return deco


@register("plain", "one target pass per token, with a KV cache")
def _plain(models: Models, prompt, max_new_tokens: int):
    stats = DecodeStats()
    return generate(models.target, prompt, max_new_tokens, eos_id=models.eos_id, stats=stats), stats


@register("chain", "draft model proposes gamma tokens, target verifies them in one pass", gamma=4)
def _chain(models: Models, prompt, max_new_tokens: int, gamma: int):
    return speculative_generate(models.target, models.draft, prompt, max_new_tokens, gamma=gamma, eos_id=models.eos_id)


@register("tree", "draft model grows a token tree (top-k at uncertain positions), target verifies it in one pass",
          budget=12, max_depth=6, branch=2, threshold=0.6)
def _tree(models: Models, prompt, max_new_tokens: int, budget: int, max_depth: int, branch: int, threshold: float):
    return tree_generate(models.target, models.draft, prompt, max_new_tokens, budget=budget, max_depth=max_depth,
                         branch=branch, threshold=threshold, eos_id=models.eos_id)


@register("prompt_lookup", "copy what followed the last earlier occurrence of the current suffix; no draft model",
          max_ngram=3, num_pred=8)
def _prompt_lookup(models: Models, prompt, max_new_tokens: int, max_ngram: int, num_pred: int):
    return lookup_generate(models.target, prompt, max_new_tokens, max_ngram=max_ngram, num_pred=num_pred,
                           eos_id=models.eos_id)


@register("prompt_lookup_adaptive", "prompt lookup whose proposal length follows acceptance: +2 after a full "
          "accept, -1 after a miss, from num_pred within [1, max_pred]", max_ngram=3, num_pred=8, max_pred=32)
def _prompt_lookup_adaptive(models: Models, prompt, max_new_tokens: int, max_ngram: int, num_pred: int, max_pred: int):
    return lookup_generate(models.target, prompt, max_new_tokens, max_ngram=max_ngram, num_pred=num_pred,
                           adaptive=True, max_pred=max_pred, eos_id=models.eos_id)


@register("self_spec", "the target's own first layers draft gamma tokens (early exit), the full target verifies",
          gamma=4)
def _self_spec(models: Models, prompt, max_new_tokens: int, gamma: int):
    n = models.early_exit_layers or max(1, models.target.config.n_layer // 3)
    return speculative_generate(models.target, early_exit_draft(models.target, n), prompt, max_new_tokens, gamma=gamma,
                                eos_id=models.eos_id)


@register("medusa", "Medusa heads on the target propose a sparse candidate tree; exact (tree) verification")
def _medusa(models: Models, prompt, max_new_tokens: int):
    return medusa_generate(models.target, models.medusa_heads, prompt, max_new_tokens, paths=models.medusa_paths,
                           eos_id=models.eos_id)


@register("eagle", "an EAGLE head extrapolates the target's features and grows a dynamic tree (EAGLE-2); "
          "exact tree verification", depth=6, top_k=4, total_tokens=16)
def _eagle(models: Models, prompt, max_new_tokens: int, depth: int, top_k: int, total_tokens: int):
    return eagle_generate(models.target, models.eagle_head, prompt, max_new_tokens, depth=depth, top_k=top_k,
                          total_tokens=total_tokens, eos_id=models.eos_id)


@register("lookahead", "Jacobi iteration over a window of guesses feeds an n-gram pool; pool candidates are "
          "verified in the same target pass; no draft model", window=5, ngram=4, candidates=5)
def _lookahead(models: Models, prompt, max_new_tokens: int, window: int, ngram: int, candidates: int):
    return lookahead_generate(models.target, prompt, max_new_tokens, window=window, ngram=ngram,
                              candidates=candidates, eos_id=models.eos_id)
