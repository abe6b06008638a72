"""Our decoders next to Hugging Face transformers' own, on the same weights: ``python -m minigpt.peers``.

The shipped models are converted exactly (:mod:`minigpt.real.hf`), so both libraries compute the same function
and greedy decoding must produce the same tokens; what differs is the code around the model. Three pairs:

* ``hf_plain``          -- ``generate(do_sample=False)``                      vs ours ``plain``;
* ``hf_assisted``       -- assisted generation, our draft as ``assistant_model`` vs ours ``chain``;
* ``hf_prompt_lookup``  -- ``prompt_lookup_num_tokens``                       vs ours ``prompt_lookup``.

Which of our methods each pairs with is declared with the method (``transformers=`` in
:mod:`minigpt.decoding.registry`); :data:`PAIRS` reads it.

Settings that make the pairs comparable: greedy, ``use_cache=True``, an all-ones attention mask, pad/bos/eos =
``<|endoftext|>`` but *no* stopping at it unless ``eos_id`` is given (our decoders do not stop either);
assisted generation drafts a constant ``gamma`` tokens (``num_assistant_tokens_schedule="constant"``) with its
confidence-based early stop switched off (``assistant_confidence_threshold=0``; recent versions default to
0.4 and tune it as they go), and prompt lookup uses our ``max_ngram`` and ``num_pred``. Remaining
differences: transformers' lookup takes the *earliest* earlier match of the n-gram, ours the most recent one,
and may verify up to ``num_pred`` tokens past the requested length (so it needs that much spare context);
each round of its assisted generation runs a whole ``generate`` call of the assistant; its first pass scores
the whole prompt and yields the first token, while ours fill the cache with all but the last prompt token
and start decoding from that token (one pass more in total: a prefill, then one pass per token or round).

:func:`peer_methods` gives callables ``fn(prompt, max_new_tokens) -> list[int]`` (``fn.stats`` holds the
:class:`~minigpt.decoding.DecodeStats` of the last call, passes counted with forward hooks) for
:mod:`minigpt.bench`; :func:`compare` times ours and theirs interleaved on the same prompts.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from .checkpoint import load_pretrained
from .decoding import DecodeStats
from .decoding.registry import METHODS, Models
from .device import get_device, synchronize, time_rotating_over
from .model import GPT
from .prompts import code_prompts, edit_prompts
from .real.hf import require_transformers, to_hf

# transformers' decoder -> the method of ours it races, from the methods' declarations
PAIRS = {m.transformers: name for name, m in METHODS.items() if m.transformers}


def _count_passes(hf_model) -> None:
    """Attach a forward-call counter (``hf_model.minigpt_passes``) once."""
    if not hasattr(hf_model, "minigpt_passes"):
        hf_model.minigpt_passes = 0

        def hook(module, args):
            module.minigpt_passes += 1
        hf_model.register_forward_pre_hook(hook)


class PeerMethod:
    """``fn(prompt, max_new_tokens) -> list[int]``: one transformers ``generate`` call, greedy.

    After a call, ``fn.stats`` holds its counts and ``fn.seconds`` the wall time of the ``generate`` call
    alone. Every forward call of the target counts as a target pass: transformers has no separate prefill (its
    first pass scores the whole prompt and yields, or verifies, the first new tokens), so plain decoding makes
    exactly one pass per token, like ours."""

    def __init__(self, name: str, hf_target, assistant=None, eos_id: int | None = None, description: str = "",
                 params: dict | None = None, **generate_kwargs):
        self.name, self.hf, self.assistant, self.eos_id = name, hf_target, assistant, eos_id
        self.description, self.params = description, dict(params or {})  # for benchmark records
        self.kwargs = generate_kwargs
        self.stats, self.seconds = DecodeStats(), float("nan")
        for m in (hf_target, assistant):
            if m is not None:
                _count_passes(m)

    @torch.no_grad()
    def __call__(self, prompt, max_new_tokens: int) -> list[int]:
        lookahead = self.kwargs.get("prompt_lookup_num_tokens", 0)
        context = getattr(self.hf.config, "n_positions", None) or self.hf.config.max_position_embeddings
        if len(prompt) + max_new_tokens + lookahead > context:
            # transformers' prompt lookup may verify up to num_pred tokens past max_length (an IndexError in
            # the position table), so it needs that much room beyond the requested length
            raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens})"
                             f"{f' + lookahead ({lookahead})' if lookahead else ''} exceeds the model's context "
                             f"of {context} tokens")
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=self.hf.device)  # (1, T)
        extra = {"assistant_model": self.assistant} if self.assistant is not None else {}
        t_before = self.hf.minigpt_passes
        d_before = self.assistant.minigpt_passes if self.assistant is not None else 0
        synchronize(ids.device)
        t0 = time.perf_counter()
        out = self.hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                               do_sample=False, num_beams=1, use_cache=True,
                               pad_token_id=self.hf.generation_config.pad_token_id, eos_token_id=self.eos_id,
                               **extra, **self.kwargs)
        synchronize(ids.device)
        self.seconds = time.perf_counter() - t0
        new = out[0, ids.shape[1]:].tolist()
        passes = self.hf.minigpt_passes - t_before
        self.stats = DecodeStats(new_tokens=len(new), target_passes=passes, wall_time=self.seconds)
        if self.assistant is not None or "prompt_lookup_num_tokens" in self.kwargs:
            self.stats.rounds = passes  # one verification pass per round
        if self.assistant is not None:
            self.stats.draft_passes = self.assistant.minigpt_passes - d_before
        return new


def peer_methods(target: GPT, draft: GPT | None = None, gamma: int = 4, max_ngram: int = 3, num_pred: int = 8,
                 eos_id: int | None = None, hf_target=None) -> dict[str, PeerMethod]:
    """transformers' greedy decoders on converted copies of ``target`` (and ``draft``, for assisted
    generation): ``{"hf_plain", "hf_assisted", "hf_prompt_lookup"} -> fn(prompt, max_new_tokens) -> ids``.

    ``gamma``: tokens the assistant drafts per round (constant); ``max_ngram``/``num_pred``: prompt lookup's
    longest n-gram and number of copied tokens. ``eos_id``: stop after this token (default: never).
    ``hf_target``: transformers' own model of the same weights, when it can load them itself (SmolLM2 from
    its GGUF file) instead of a conversion of ``target``."""
    version = require_transformers().__version__
    source = "same weights, loaded by transformers" if hf_target is not None else "converted target"
    hf_target = to_hf(target) if hf_target is None else hf_target
    methods = {"hf_plain": PeerMethod("hf_plain", hf_target, eos_id=eos_id,
                                      description=f"transformers {version} greedy generate ({source})")}
    if draft is not None:
        hf_draft = to_hf(draft, eos_id=eos_id)
        cfg = hf_draft.generation_config  # assisted generation reads its settings from the assistant's config
        cfg.num_assistant_tokens = gamma
        cfg.num_assistant_tokens_schedule = "constant"
        cfg.assistant_confidence_threshold = 0.0  # no early stop on low draft confidence, as in our chain
        methods["hf_assisted"] = PeerMethod(
            "hf_assisted", hf_target, assistant=hf_draft, eos_id=eos_id, params=dict(gamma=gamma),
            description=f"transformers {version} assisted generation, converted draft as assistant_model")
    methods["hf_prompt_lookup"] = PeerMethod(
        "hf_prompt_lookup", hf_target, eos_id=eos_id, params=dict(max_ngram=max_ngram, num_pred=num_pred),
        description=f"transformers {version} prompt lookup decoding",
        prompt_lookup_num_tokens=num_pred, max_matching_ngram_size=max_ngram)
    return methods


def settings_from_bench(params: dict) -> dict:
    """:func:`peer_methods`' settings from our methods' parameters (``{"chain": {"gamma": 4}, "prompt_lookup":
    {...}}``, each method's declared defaults where absent): the draft length of the method ``hf_assisted``
    races, the n-gram and copied tokens of the one ``hf_prompt_lookup`` races, so both libraries draft alike."""
    ours = {theirs: params.get(name, METHODS[name].params) for theirs, name in PAIRS.items()}
    assisted, lookup = ours["hf_assisted"], ours["hf_prompt_lookup"]
    return dict(gamma=assisted["gamma"], max_ngram=lookup["max_ngram"], num_pred=lookup["num_pred"])


def our_methods(target: GPT, draft: GPT | None = None, gamma: int = 4, max_ngram: int = 3,
                num_pred: int = 8) -> dict:
    """Our side of every pair that can run with these models, with the same settings: name -> fn(prompt,
    max_new_tokens) -> ids."""
    models, given = Models(target, draft), dict(gamma=gamma, max_ngram=max_ngram, num_pred=num_pred)
    ours = {}
    for name in PAIRS.values():
        method = METHODS[name]
        if not method.missing(models):
            params = {k: given.get(k, v) for k, v in method.params.items()}
            ours[name] = lambda p, n, m=method, kw=params: m.run(models, p, n, **kw)[0]
    return ours


def compare(target: GPT, draft: GPT | None, prompts: list, max_new_tokens: int = 64, repeats: int = 3,
            gamma: int = 4, max_ngram: int = 3, num_pred: int = 8, log=None) -> list[dict]:
    """Time our decoders and transformers' on ``prompts`` (lists of ids), interleaved prompt by prompt with a
    rotating order, after one warm-up call each. Returns one record per method: ``tokens_per_s`` (median over
    repeats of total new tokens / total seconds, and min/max); for transformers' methods also
    ``ours_over_theirs`` (our matching method's tokens/s over theirs) and ``identical_to_ours``."""
    fns = {**our_methods(target, draft, gamma, max_ngram, num_pred),
           **peer_methods(target, draft, gamma, max_ngram, num_pred)}
    dev = target.device
    seconds, results = time_rotating_over({n: (lambda p, fn=fn: fn(p, max_new_tokens)) for n, fn in fns.items()},
                                          prompts, dev, repeat=repeats, warmup=1, log=log)
    names = list(fns)
    times = {n: [sum(row) for row in seconds[n]] for n in names}   # seconds per repeat, all prompts
    outputs = {n: results[n][0] for n in names}                       # the first repeat's outputs
    records = {}
    for n in names:
        tps = [sum(map(len, outputs[n])) / t for t in times[n]]
        records[n] = dict(method=n, device=str(dev), n_prompts=len(prompts), max_new_tokens=max_new_tokens,
                          repeats=repeats, new_tokens=sum(map(len, outputs[n])), tokens_per_s=statistics.median(tps),
                          tokens_per_s_min=min(tps), tokens_per_s_max=max(tps))
    for theirs, ours in PAIRS.items():
        if theirs in records:
            ratios = [t_theirs / t_ours for t_theirs, t_ours in zip(times[theirs], times[ours])]
            records[theirs].update(ours=ours, ours_over_theirs=statistics.median(ratios),
                                   identical_to_ours=outputs[theirs] == outputs[ours])
    return list(records.values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minigpt.peers", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cpu, cuda, mps ... (default: minigpt.get_device())")
    ap.add_argument("--n-code", type=int, default=3)
    ap.add_argument("--n-edit", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads for torch (0 = torch's default)")
    ap.add_argument("--json", metavar="FILE", help="also write the records as JSON")
    args = ap.parse_args(argv)
    dev = torch.device(args.device) if args.device else get_device()
    if args.threads and dev.type == "cpu":
        torch.set_num_threads(args.threads)
    target, draft = load_pretrained("target", dev), load_pretrained("draft", dev)
    prompts = code_prompts(args.n_code) + edit_prompts(args.n_edit)
    records = compare(target, draft, prompts, args.max_new_tokens, args.repeats, args.gamma,
                      log=lambda m: print(m, file=sys.stderr))
    for r in records:
        extra = (f"  ours/theirs {r['ours_over_theirs']:.2f}x  identical {r['identical_to_ours']}"
                 if "ours_over_theirs" in r else "")
        print(f"{r['method']:<18}{r['tokens_per_s']:>8.1f} tok/s ({r['tokens_per_s_min']:.1f}-"
              f"{r['tokens_per_s_max']:.1f}){extra}")
    print(f"{len(prompts)} prompts x {args.max_new_tokens} new tokens, greedy, {args.repeats} repeats (medians), "
          f"device {dev}, fp32, transformers {require_transformers().__version__}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=2)
    return 0 if all(r.get("identical_to_ours", True) for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
