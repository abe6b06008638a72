"""A production engine on the same file: llama.cpp (through ``llama-cpp-python``) running SmolLM2's GGUF.

Lesson 09 loads SmolLM2-135M-Instruct from its GGUF file into the course's own model, dequantised to fp32.
llama.cpp, the engine most people run on a CPU, reads the very same file and computes with the quantised
weights in C. This module puts the two side by side:

* :class:`LlamaCpp` -- the file loaded in llama.cpp; :meth:`LlamaCpp.greedy` decodes greedily, alone or with a
  *draft model* in llama.cpp's own protocol (a callable ``input_ids -> proposed ids``), and counts the target
  passes (llama.cpp's ``eval`` calls after the prompt) so that tokens per pass are comparable with ours;
* :func:`llama_lookup` -- llama.cpp's own prompt lookup (``LlamaPromptLookupDecoding``), and the course's drafters
  behind the same protocol: :class:`CourseDraft` runs any course proposer that proposes a chain from the tokens
  alone (prompt lookup: :class:`CourseLookupDraft`; a draft model with its own KV cache, such as the course's
  distilled SmolLM2 draft: :class:`CourseModelDraft`); :func:`engine_methods` offers every method whose
  declaration names a llama.cpp counterpart (``llama_cpp=`` in :mod:`minigpt.decoding.registry`);
* :func:`agreement` -- where two greedy outputs part (llama.cpp's tokens against minigpt's);
* :func:`batch_consistency` -- the property speculative decoding rests on: scoring k tokens in one pass must
  give the logits of k one-token passes. minigpt's fp32 path keeps it to rounding; llama.cpp's batched
  kernels do not always, which is why its speculative output can differ from its own plain output.

llama.cpp is a speed peer, never the reference for exactness: the course's exactness tests compare minigpt
with minigpt. Install: ``pip install -e ".[engines]"`` (builds llama.cpp from source: minutes).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .cache import KVCache
from .decoding import Chain, DecodeStats, Lookup, Proposer
from .decoding.registry import METHODS, Models
from .model import GPT
from .real.smollm import gguf_path
from .sampling import SamplingConfig

ENGINES_VERSION = "0.3.36"   # the llama-cpp-python version this module was tested with
GREEDY = SamplingConfig()     # temperature 0: the drafts llama.cpp verifies are greedy
INSTALL_HINT = f'pip install -e ".[engines]"  (llama-cpp-python=={ENGINES_VERSION}; builds llama.cpp, minutes)'


def require_llama_cpp():
    """The ``llama_cpp`` module, or ImportError with the install command in one line."""
    try:
        import llama_cpp
    except ImportError:
        raise ImportError(f"llama.cpp is not installed: {INSTALL_HINT}") from None
    return llama_cpp


def llama_cpp_available() -> bool:
    try:
        require_llama_cpp()
    except ImportError:
        return False
    return True


class LlamaCpp:
    """SmolLM2's GGUF (default: the file :func:`minigpt.real.smollm.fetch` stored) loaded in llama.cpp.

    ``n_threads``: CPU threads (1 to compare with the course's one-thread timings). ``logits_all=True``: keep the
    logits of every evaluated position (what :func:`batch_consistency` reads; llama-cpp-python turns it on
    anyway when a draft model is set, and 0.3.36 crashed on contexts over 512 tokens with a draft model
    without it).

    ``extra_buffers``: llama.cpp's "extra buffer types" (weights repacked for the CPU's widest kernels, AMX
    tiles on CPUs that have them). Off by default: on the course's machine (a CPU with AMX, in a sandbox) every
    pass over more than one token crashed with them (a segmentation fault in ``llama_decode``), and a pass over
    one token did not. Off, llama.cpp runs its ordinary quantised kernels; llama-cpp-python's constructor has no
    argument for it, so the model's default parameters are changed while the model loads."""

    def __init__(self, path=None, n_ctx: int = 2048, n_threads: int = 1, n_batch: int = 512, seed: int = 0,
                 extra_buffers: bool = False):
        llama_cpp = require_llama_cpp()
        import llama_cpp.llama as binding
        path = path or gguf_path()
        if path is None:
            raise FileNotFoundError("SmolLM2's GGUF is not here: python -m minigpt.real.smollm fetch")
        self.path = str(path)
        defaults = binding.llama_cpp.llama_model_default_params

        def model_params():
            params = defaults()
            params.use_extra_bufts = extra_buffers
            return params
        binding.llama_cpp.llama_model_default_params = model_params
        try:
            self.llm = llama_cpp.Llama(model_path=self.path, n_ctx=n_ctx, n_threads=n_threads,
                                       n_threads_batch=n_threads, n_batch=n_batch, logits_all=True, seed=seed,
                                       verbose=False)
        finally:
            binding.llama_cpp.llama_model_default_params = defaults
        self.evals = 0
        inner = self.llm.eval

        def counted_eval(tokens):  # one call = one pass of the model over these tokens (<= n_batch of them)
            self.evals += 1
            return inner(tokens)
        self.llm.eval = counted_eval

    @property
    def vocab_size(self) -> int:
        return self.llm.n_vocab()

    def greedy(self, prompt, max_new_tokens: int, eos_id: int | None = None, draft=None,
               stats: DecodeStats | None = None) -> tuple[list[int], DecodeStats]:
        """Greedy decoding of ``prompt`` (token ids, the same as minigpt's: same tokenizer) for up to
        ``max_new_tokens``, stopping after ``eos_id``; with ``draft`` (llama.cpp's draft-model protocol), its
        speculative decoding. Returns (new ids, stats): ``target_passes`` counts llama.cpp's eval calls after
        the prompt's, ``wall_time`` the whole call. llama.cpp verifies a draft by comparing its own greedy token
        with the drafted one at each position, the greedy rule."""
        stats = stats if stats is not None else DecodeStats()
        prompt = [int(t) for t in prompt]
        self.llm.draft_model = draft
        self.llm.reset()                       # no prefix reuse between calls: every call pays its prefill
        t0 = time.perf_counter()
        self.evals = 0
        out: list[int] = []
        for token in self.llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                       reset=True):
            out.append(int(token))
            if len(out) >= max_new_tokens or (eos_id is not None and token == eos_id):
                break
        stats.wall_time += time.perf_counter() - t0
        stats.prefills += 1
        stats.target_passes += max(0, self.evals - 1)
        stats.new_tokens += len(out)
        self.llm.draft_model = None
        return out, stats

    def logits_of(self, prompt, chunks, prompt_rows: bool = False) -> np.ndarray:
        """The logits llama.cpp computes after feeding ``prompt`` in one pass and then ``chunks`` (lists of ids),
        one pass each: (sum of chunk lengths, V), the rows of the chunks' positions, after the prompt's own rows
        when ``prompt_rows`` (its plain decoding takes its first token from the prompt's last row)."""
        self.llm.reset()
        self.llm.eval([int(t) for t in prompt])
        rows = [np.array(self.llm.scores[:len(prompt)], dtype=np.float32)] if prompt_rows else []
        for chunk in chunks:
            start = self.llm.n_tokens
            self.llm.eval([int(t) for t in chunk])
            rows.append(np.array(self.llm.scores[start:start + len(chunk)], dtype=np.float32))
        return np.concatenate(rows)


@dataclass
class _Tokens:
    """What a proposer reads of a generation when llama.cpp drives it: the tokens so far, the draft's cache (if
    it has a draft model), greedy sampling (llama.cpp verifies greedily), no generator."""
    seq: list[int]
    draft_cache: KVCache | None
    sampling: SamplingConfig = GREEDY
    generator: None = None


class CourseDraft:
    """A course proposer drafting for llama.cpp, in its draft-model protocol (``input_ids -> proposed ids``).

    Any proposer that proposes a chain from the tokens alone can: prompt lookup, a draft model's chain. A draft
    model keeps its KV cache between calls: each call crops it to the part of ``input_ids`` it has already seen
    and feeds only the rest. ``context``: the longest sequence it may draft up to (default: the draft model's,
    unlimited without one). ``passes`` counts the draft model's passes."""

    def __init__(self, proposer: Proposer, context: int | None = None):
        if proposer.needs_hidden:
            raise ValueError(f"{type(proposer).__name__} reads the target's hidden states, which llama.cpp's draft "
                             f"protocol does not pass (token ids only)")
        self.proposer, self.draft = proposer, proposer.draft
        self.context = context or (self.draft.config.block_size if self.draft is not None else None)
        self.cache = None if self.draft is None else KVCache.for_model(self.draft)
        self.seen: list[int] = []   # what the draft's cache holds
        self.passes = 0
        proposer.start(_Tokens([], self.cache))

    @torch.no_grad()
    def __call__(self, input_ids, /, **kwargs) -> np.ndarray:
        ids = [int(t) for t in np.asarray(input_ids)]
        room = 1 << 30 if self.context is None else self.context - len(ids)
        if room < 1:
            return np.array([], dtype=np.intc)
        if self.cache is not None:
            self.cache.crop(agreement(self.seen, ids[:-1])["agreeing_prefix"])   # what it still holds of ids
        proposal = self.proposer.propose(_Tokens(ids, self.cache), room)
        if not proposal.is_chain:
            raise ValueError(f"{type(self.proposer).__name__} proposed a tree; llama.cpp verifies one chain")
        out = proposal.candidates
        self.passes += proposal.draft_passes
        if self.cache is not None:
            self.seen = (ids + out)[:self.cache.length]
        return np.array(out, dtype=np.intc)


class CourseLookupDraft(CourseDraft):
    """The course's prompt lookup (:func:`~minigpt.decoding.lookup.find_candidates`: the most recent earlier
    match of the longest suffix n-gram) in llama.cpp's protocol. llama.cpp's own ``LlamaPromptLookupDecoding``
    takes the *first* match instead."""

    def __init__(self, max_ngram: int = 3, num_pred: int = 8):
        super().__init__(Lookup(max_ngram, num_pred))


class CourseModelDraft(CourseDraft):
    """A minigpt draft model (the course's distilled SmolLM2 draft) proposing ``gamma`` greedy tokens per round in
    llama.cpp's protocol (the chain's own drafting, :class:`~minigpt.decoding.chain.Chain`)."""

    def __init__(self, draft: GPT, gamma: int = 4):
        super().__init__(Chain(draft, gamma))


def llama_lookup(max_ngram: int = 3, num_pred: int = 8):
    """llama.cpp's own prompt-lookup draft (``LlamaPromptLookupDecoding``) with these settings."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    return LlamaPromptLookupDecoding(max_ngram_size=max_ngram, num_pred_tokens=num_pred)


def agreement(ours, theirs) -> dict:
    """Where two greedy outputs part: ``first_divergence`` (index of the first differing token, None if one is a
    prefix of the other), ``agreeing_prefix`` (tokens before it), ``compared`` (the shorter length) and
    ``same_position_share`` (share of positions with the same token, over the shorter length; after a
    divergence the texts usually drift apart, so this is mostly the prefix)."""
    ours, theirs = [int(t) for t in ours], [int(t) for t in theirs]
    n = min(len(ours), len(theirs))
    first = next((i for i in range(n) if ours[i] != theirs[i]), None)
    same = sum(a == b for a, b in zip(ours, theirs))
    return dict(first_divergence=first, agreeing_prefix=n if first is None else first, compared=n,
                same_position_share=same / n if n else float("nan"))


@torch.no_grad()
def batch_consistency(score, prompt, continuation) -> dict:
    """Does scoring ``continuation`` in one pass give the logits of scoring it one token at a time?

    ``score(prompt, chunks) -> (len(continuation), V) logits`` (:meth:`LlamaCpp.logits_of`, or
    :func:`minigpt_logits_of` for a minigpt model). Returns the largest absolute logit difference, the number
    of positions whose argmax differs, and how many positions there were. Speculative greedy decoding
    reproduces plain greedy decoding only if no argmax differs."""
    k = len(continuation)
    together = np.asarray(score(prompt, [list(continuation)]), dtype=np.float64)
    alone = np.asarray(score(prompt, [[t] for t in continuation]), dtype=np.float64)
    return dict(positions=k, max_abs_diff=float(np.abs(together - alone).max()),
                argmax_differs=int((together.argmax(-1) != alone.argmax(-1)).sum()))


def minigpt_logits_of(model: GPT):
    """:meth:`LlamaCpp.logits_of` for a minigpt model: the prompt in one pass, then each chunk in one pass."""
    @torch.no_grad()
    def score(prompt, chunks):
        cache = KVCache.for_model(model)
        model.hidden_states(torch.tensor([list(prompt)], device=model.device), cache=cache)
        rows = [model(torch.tensor([list(c)], device=model.device), cache=cache)[0].float().cpu().numpy()
                for c in chunks]
        return np.concatenate(rows)
    return score


class EngineMethod:
    """A benchmark method run by llama.cpp: ``fn(prompt, max_new_tokens) -> ids``, like the transformers peers
    (:class:`minigpt.peers.PeerMethod`): after a call ``fn.stats`` holds its counts. ``draft_factory()`` makes a
    fresh draft in llama.cpp's protocol for each call (None: plain)."""

    def __init__(self, name: str, engine: LlamaCpp, draft_factory=None, eos_id: int | None = None,
                 description: str = "", params: dict | None = None):
        self.name, self.engine, self.draft_factory, self.eos_id = name, engine, draft_factory, eos_id
        self.description, self.params = description, dict(params or {})
        self.stats = DecodeStats()

    def __call__(self, prompt, max_new_tokens: int) -> list[int]:
        draft = self.draft_factory() if self.draft_factory is not None else None
        out, self.stats = self.engine.greedy(prompt, max_new_tokens, self.eos_id, draft)
        if draft is not None:
            self.stats.rounds = self.stats.target_passes
            self.stats.draft_passes = getattr(draft, "passes", 0)
        return out


def engine_methods(engine: LlamaCpp, models: Models, params: dict | None = None) -> dict[str, EngineMethod]:
    """llama.cpp's decoders on SmolLM2's GGUF: ``llama_plain``, ``llama_lookup`` (its own prompt lookup, with
    our prompt lookup's settings) and, for every method whose declaration names a llama.cpp counterpart and whose
    drafter ``models`` has, that method's proposer drafting inside llama.cpp (:class:`CourseDraft`; e.g.
    ``llama_course_lookup``, ``llama_course_draft``). ``params``: our methods' parameters (default: their
    declared defaults for ``models.family``); every method stops after ``models.eos_id``. EAGLE and Medusa
    cannot join: llama.cpp's draft protocol passes token ids only, and they read the target's own features."""
    version = require_llama_cpp().__version__
    params = params or {}

    def settings(name):
        return params.get(name) or METHODS[name].defaults(models.family)
    lookup = {k: settings("prompt_lookup")[k] for k in ("max_ngram", "num_pred")}
    methods = {
        "llama_plain": EngineMethod("llama_plain", engine, None, models.eos_id,
                                    f"llama.cpp (llama-cpp-python {version}) greedy, quantised GGUF weights"),
        "llama_lookup": EngineMethod("llama_lookup", engine, lambda: llama_lookup(**lookup), models.eos_id,
                                     "llama.cpp's LlamaPromptLookupDecoding as draft_model", lookup),
    }
    for name, method in METHODS.items():
        if method.llama_cpp in (None, "llama_plain") or method.missing(models) or method.needs_hidden:
            continue
        kw = settings(name)
        methods[method.llama_cpp] = EngineMethod(
            method.llama_cpp, engine, lambda m=method, kw=kw: CourseDraft(m.make(models, **kw)), models.eos_id,
            f"the course's {name} ({method.description}) drafting for llama.cpp", kw)
    return methods
