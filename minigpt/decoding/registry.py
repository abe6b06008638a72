"""Every decoding method, declared once: its name, what it proposes with, its settings, what it needs.

A method is a proposer (:class:`~.session.Proposer`) and one :func:`declare` call, which says

* how to build its proposer from what is loaded (:class:`Models`: the target, a draft, Medusa heads, an EAGLE
  head) and its parameters, with their defaults for the course's pair and, where they differ, per model family
  (``families={"smollm2": ...}``);
* what it needs loaded (``needs``: ``"draft"``, ``"medusa_heads"``, ``"eagle_head"``, ``"eagle3_head"``; nothing
  for a drafter that copies); whether it reads the target's hidden states and whether a batch drafts its sequences
  together come with its proposer class (``needs_hidden``, ``batched``);
* only where they exist, its counterparts in other engines: the transformers decoder it races
  (:mod:`minigpt.peers`) and the llama.cpp method that runs it (:mod:`minigpt.engines`).

Everything else reads :data:`METHODS`: the single-sequence benchmark and ``bench --batch`` (every method runs in
the batch engine), ``bench --model smollm2`` (a method whose drafter is not installed is skipped in one line),
the race against transformers, llama.cpp's draft adapter, the chat's ``--speculate`` choices, and the tests::

    declare("repeat_last", RepeatLast, "propose the last token again", params=dict(n=2))
    run_bench(["repeat_last"])        # raced against plain decoding; decode_batch, the chat: the same name
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..checkpoint import load_pretrained
from ..eagle_head import load_eagle
from ..medusa_heads import load_medusa
from ..tokenizer import load_tokenizer
from .auto import Auto, Memory
from .chain import Chain, SelfSpec
from .eagle import Eagle
from .lookahead import Lookahead
from .lookup import Lookup
from .medusa import Medusa
from .plain import Plain
from .session import Proposer, Settings, decode
from .stats import DecodeStats
from .suffix import Suffix
from .tree import DraftTree

# what a method may need loaded, as a Models field -> how a message names it
NEEDS = {"draft": "a draft model", "medusa_heads": "Medusa heads", "eagle_head": "an EAGLE head",
         "eagle3_head": "an EAGLE-3 head"}


@dataclass
class Models:
    """What is loaded, for the methods to build their proposers from: the target, a draft, Medusa heads (with the
    heads' tree), an EAGLE head, an EAGLE-3 head (SmolLM2's; the course's pair has none), the depth of the
    target's own early-exit draft (self-speculation; default a third of its layers), transformers' own model of
    the same weights (for the race against transformers, if it has one), the token that ends an answer (every
    method stops after it; None: never stop early), the model ``family`` whose parameter defaults apply
    ("course": the shipped pair; "smollm2"), and ``memory``: what a method keeps across generations of these
    models (the controller's round times, :class:`~.auto.Memory`)."""
    target: torch.nn.Module
    draft: torch.nn.Module | None = None
    medusa_heads: torch.nn.Module | None = None
    medusa_paths: list | None = None
    eagle_head: torch.nn.Module | None = None
    eagle3_head: torch.nn.Module | None = None
    early_exit_layers: int | None = None
    hf_target: object | None = None
    eos_id: int | None = None
    family: str = "course"
    # what methods keep across generations of these models on this machine (the controller's Memory)
    memory: dict = field(default_factory=dict)

    @classmethod
    def shipped(cls, device, medusa: bool = False, eagle: bool = False, methods=(), precision: str = "fp32",
                draft: str = "draft") -> "Models":
        """The course's shipped target and draft on ``device`` (each carrying the course's tokenizer, which the
        vocabulary check compares), its Medusa heads if ``medusa``, its EAGLE head if ``eagle`` or if one of
        ``methods`` (names) needs or uses them (:func:`wanted`); ``precision``: the target's and draft's weights
        (:mod:`minigpt.precision`); ``draft``: which shipped draft ("draft", the pair's; "draft1", the earlier
        one-layer draft)."""
        needs = wanted(methods)
        models = cls(load_pretrained("target", device, precision), load_pretrained(draft, device, precision))
        models.target.tokenizer = models.draft.tokenizer = load_tokenizer()
        if medusa or "medusa_heads" in needs:
            models.medusa_heads, models.medusa_paths = load_medusa(models.target)
        if eagle or "eagle_head" in needs:
            models.eagle_head = load_eagle(models.target)
        return models


@dataclass(frozen=True)
class Method:
    """A declared decoding method (see :func:`declare`)."""
    name: str
    proposer: type                          # its Proposer class
    description: str
    build: Callable[..., Proposer]          # build(models, **params) -> a proposer
    params: dict = field(default_factory=dict)    # defaults for the course's pair
    needs: tuple[str, ...] = ()             # Models fields that must be loaded (see NEEDS)
    families: dict = field(default_factory=dict)  # family -> the parameters whose defaults differ there
    transformers: str | None = None         # the transformers decoder it races (minigpt.peers)
    llama_cpp: str | None = None            # the llama.cpp method that runs it (minigpt.engines)
    uses: tuple[str, ...] = ()              # Models fields it uses when they are loaded, never required

    @property
    def batched(self) -> bool:
        """Whether a batch drafts its sequences together (a draft model's passes shared), or each on its own."""
        return self.proposer.batched

    @property
    def needs_hidden(self) -> bool:
        """Whether it reads the target's hidden states."""
        return self.proposer.needs_hidden

    def defaults(self, family: str = "course") -> dict:
        """Its parameters' defaults for a model family."""
        return {**self.params, **self.families.get(family, {})}

    def missing(self, models: Models) -> list[str]:
        """What it needs that ``models`` lacks, as words ("a draft model"); empty when it can run."""
        return [NEEDS.get(n, n) for n in self.needs if getattr(models, n, None) is None]

    def make(self, models: Models, **params) -> Proposer:
        """Its proposer for ``models``: the family's defaults, ``params`` over them. ValueError in one line when
        something it needs is not loaded or a parameter is not one of its own."""
        missing = self.missing(models)
        if missing:
            raise ValueError(f"the {self.name} method needs {' and '.join(missing)}, and none is loaded")
        settings = self.defaults(models.family)
        unknown = sorted(set(params) - set(settings))
        if unknown:
            raise ValueError(f"method {self.name!r} has no parameter {unknown[0]!r}; it has {sorted(settings)}")
        return self.build(models, **{**settings, **params})

    def run(self, models: Models, prompt, max_new_tokens: int, settings: Settings | None = None,
            **params) -> tuple[list[int], DecodeStats]:
        """Decode ``prompt`` with this method (:func:`~.session.decode`): greedy and stopping after
        ``models.eos_id`` unless ``settings`` say otherwise; returns (new ids, statistics)."""
        return decode(models.target, prompt, max_new_tokens, self.make(models, **params),
                      settings or Settings(eos_id=models.eos_id))


METHODS: dict[str, Method] = {}


def declare(name: str, proposer: type, description: str, build: Callable[..., Proposer] | None = None,
            params: dict | None = None, needs: tuple[str, ...] = (), families: dict | None = None,
            transformers: str | None = None, llama_cpp: str | None = None, uses: tuple[str, ...] = ()) -> Method:
    """Add a decoding method to :data:`METHODS` (the order of declaration is the benchmark's order) and return it.

    ``proposer``: its :class:`~.session.Proposer` class; ``build(models, **params)``: its proposer from what is
    loaded (default: ``proposer(**params)``, for a method that needs nothing loaded); ``params``: the parameters'
    defaults for the course's pair; ``needs``: the :class:`Models` fields it needs (``"draft"``,
    ``"medusa_heads"``, ``"eagle_head"``); ``families``: per model family, the defaults that differ there;
    ``transformers`` / ``llama_cpp``: the names of its counterparts in those engines, where they exist;
    ``uses``: the :class:`Models` fields it uses when they are loaded but runs without (the controller's
    drafters), loaded with its needs wherever they are installed (:func:`wanted`)."""
    unknown = (set(needs) | set(uses)) - set(NEEDS)
    if unknown:
        raise ValueError(f"unknown need {sorted(unknown)[0]!r}; a method may need {', '.join(NEEDS)}")
    method = Method(name, proposer, description, build or (lambda models, **p: proposer(**p)), dict(params or {}),
                    tuple(needs), dict(families or {}), transformers, llama_cpp, tuple(uses))
    METHODS[name] = method
    return method


def wanted(names) -> set[str]:
    """The :class:`Models` fields to load for the methods ``names`` (unknown names skipped): what each needs and
    what each uses when installed, so that a method such as ``auto`` has the same options whichever other
    methods are loaded beside it."""
    return {n for name in names if name in METHODS for n in (*METHODS[name].needs, *METHODS[name].uses)}


def available(models: Models) -> list[str]:
    """The declared methods that can run with ``models`` (everything they need is loaded)."""
    return [name for name, m in METHODS.items() if not m.missing(models)]


# ---------------------------------------------------------------------------------------- the course's methods

declare("plain", Plain, "one target pass per token, with a KV cache",
        transformers="hf_plain", llama_cpp="llama_plain")
declare("chain", Chain, "draft model proposes gamma tokens, target verifies them in one pass",
        build=lambda m, gamma: Chain(m.draft, gamma), params=dict(gamma=4), needs=("draft",),
        transformers="hf_assisted", llama_cpp="llama_course_draft")
declare("tree", DraftTree, "draft model grows a token tree (top-k at uncertain positions), target verifies it in one "
        "pass", build=lambda m, **p: DraftTree(m.draft, **p), params=dict(budget=12, max_depth=6, branch=2,
                                                                           threshold=0.6), needs=("draft",))
declare("prompt_lookup", Lookup, "copy what followed the last earlier occurrence of the current suffix; no draft model",
        params=dict(max_ngram=3, num_pred=8),
        # chosen for SmolLM2 on its development requests by replay (Lesson 09b): 16 copied tokens beat 8 on edits
        families={"smollm2": dict(num_pred=16)}, transformers="hf_prompt_lookup", llama_cpp="llama_course_lookup")
declare("prompt_lookup_adaptive", Lookup, "prompt lookup whose proposal length follows acceptance: +2 after a full "
        "accept, -1 after a miss, from num_pred within [1, max_pred]",
        build=lambda m, **p: Lookup(adaptive=True, **p), params=dict(max_ngram=3, num_pred=8, max_pred=32))
declare("self_spec", SelfSpec, "the target's own first layers draft gamma tokens (early exit), the full target "
        "verifies", build=lambda m, gamma: SelfSpec(m.target, m.early_exit_layers or max(1, m.target.config.n_layer // 3),
                                                    gamma), params=dict(gamma=4))
declare("medusa", Medusa, "Medusa heads on the target propose a sparse candidate tree; exact (tree) verification",
        build=lambda m: Medusa(m.medusa_heads, m.medusa_paths), needs=("medusa_heads",))
declare("eagle", Eagle, "an EAGLE head extrapolates the target's features and grows a dynamic tree (EAGLE-2); "
        "exact tree verification", build=lambda m, **p: Eagle(m.eagle_head, **p),
        params=dict(depth=6, top_k=4, total_tokens=16), needs=("eagle_head",))
declare("eagle3", Eagle, "an EAGLE-3 head (low, middle and high layers fused; trained on its own drafts) grows the "
        "same dynamic tree; exact tree verification", build=lambda m, **p: Eagle(m.eagle3_head, **p),
        params=dict(depth=6, top_k=4, total_tokens=16), needs=("eagle3_head",))
declare("lookahead", Lookahead, "Jacobi iteration over a window of guesses feeds an n-gram pool; pool candidates are "
        "verified in the same target pass; no draft model", params=dict(window=5, ngram=4, candidates=5))
# chosen by replaying each family's development stream (minigpt.streams, minigpt.real.streams) with its measured
# pass costs: SmolLM2's multi-token passes cost 1.6-1.9 one-token passes on this CPU, so it drafts only what is
# likely (vLLM's budget, factor 1; a higher floor) and only when a draft expects >= 1.5 accepted tokens. Across a
# stream, bench --stream adds the global tree of earlier outputs (bench/stream.py)
declare("suffix", Suffix, "suffix trees over the request's own text (in bench --stream also over earlier requests' "
        "outputs) propose a tree of continuations scored by counts, sized by the match length; no draft model",
        params=dict(max_depth=24, max_spec=24, factor=4.0, offset=2.0, min_prob=0.1, min_score=0.0, tree=True,
                    combine="best"),
        families={"smollm2": dict(factor=1.0, offset=0.0, max_spec=16, min_prob=0.3, min_score=1.5)})


# The speculation controller: each round, whichever of the methods it can run (those whose drafters are loaded)
# promises the most tokens per second by its own measurements in this generation, plain decoding included.
AUTO_OPTIONS = {"prompt_lookup": dict(num_pred=32), "suffix": {}, "chain": {}, "eagle": {}}


def auto_options(models: Models) -> dict[str, Proposer]:
    """The controller's options for ``models``: every method of :data:`AUTO_OPTIONS` that is declared and whose
    drafters are loaded (prompt lookup with up to 32 copied tokens, which the controller cuts to its best length;
    suffix decoding's tree, which it sends or not by the tree's own expected acceptance, calibrated as it goes)."""
    return {name: METHODS[name].make(models, **over) for name, over in AUTO_OPTIONS.items()
            if name in METHODS and not METHODS[name].missing(models)}


def make_auto(models: Models, suffix: Proposer | None = None, **params) -> Auto:
    """The controller over :func:`auto_options`, keeping its measurements in ``models.memory``; ``suffix``: a
    suffix-decoding proposer to take that option's place (the stream bench's, which drafts from a global tree)."""
    options = auto_options(models)
    if suffix is not None and "suffix" in options:
        options["suffix"] = suffix
    return Auto(options, memory=models.memory.setdefault("auto", Memory()), **params)


declare("auto", Auto, "the speculation controller: each round the option with the most expected tokens per second "
        "(plain, prompt lookup cut to its best length, a draft chain's gamma, EAGLE's tree), from this generation's "
        "own measurements (round times and drafting costs kept across generations)",
        build=make_auto,
        params=dict(gamma_max=8, max_send=32), uses=tuple(sorted(wanted(AUTO_OPTIONS))))
