"""What a drafted token and a verification pass cost on this device: the course's c and r(k), measured where
the decoders pay them.

c is the draft's cost per drafted token as a fraction of one target decoding step, r(k) the cost of one target
pass over k tokens in one-token steps (COURSE_GUIDE's vocabulary). Both are ratios of pass times, and a pass's
time depends on what ran just before it, not only on the model: on a CPU a pass whose weights another model's
pass has just pushed out of the processor's caches runs slower than the same pass right after itself. A chain
decoder runs the draft several times in a row after each verification pass, and plain decoding runs the target
step after step, so the numbers the speed-up model needs are the ones measured *in the loop*:

* :class:`PassTimer` -- while active, records the number of new tokens and the seconds of every forward pass
  of a model (forward hooks; the device is synchronised around each pass; a decoder's prefill runs
  ``hidden_states`` instead and is not recorded);
* :func:`costs_in_loop` -- c and r(k) from real decoding: the draft's passes during chain speculation and the
  target's verification passes, over the target's one-token step during plain decoding, interleaved;
* :func:`pass_contexts` -- single-token passes timed alone, right after a pass of the same model ("warm") or of
  the other model ("cold"): why a pass timed in isolation gives a different c than the loop;
* :class:`CallTimer` -- while active, times every call of one function (e.g. ``SamplingConfig.probs``, the
  sampler): what the work around the passes costs inside the loop.

    costs = costs_in_loop(target, draft, code_prompts(4))   # {'c': 0.16, 'r': {5: 1.4, ...}, ...}
"""
from __future__ import annotations

import functools
import statistics
import time

import torch

from .cache import KVCache
from .decoding import generate, speculative_generate
from .device import synchronize
from .model import GPT, evaluating


class PassTimer:
    """Context manager recording ``(new tokens, seconds, start)`` for every forward pass of ``model`` in
    ``passes`` (``start``: the ``time.perf_counter()`` at which the pass began, to put two timers' passes in order).

    The clock starts in a forward pre-hook and stops in a forward hook, with the device synchronised at both, so
    a pass's time is the model's own work: the sampling and bookkeeping around it are not counted."""

    def __init__(self, model: GPT):
        self.model, self.passes, self._handles, self._t0 = model, [], [], 0.0

    def _start(self, module, args, kwargs) -> None:
        synchronize(self.model.device)
        idx = args[0] if args else kwargs["idx"]
        self._n = int(idx.shape[-1])
        self._t0 = time.perf_counter()

    def _stop(self, module, args, output) -> None:
        synchronize(self.model.device)
        self.passes.append((self._n, time.perf_counter() - self._t0, self._t0))

    def __enter__(self) -> "PassTimer":
        self._handles = [self.model.register_forward_pre_hook(self._start, with_kwargs=True),
                         self.model.register_forward_hook(self._stop)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def seconds(self, n_tokens: int | None = None, at_most: int | None = None) -> list[float]:
        """The recorded passes' seconds: all, those over exactly ``n_tokens``, or over at most ``at_most``."""
        return [s for n, s, _ in self.passes
                if (n_tokens is None or n == n_tokens) and (at_most is None or n <= at_most)]


def costs_in_loop(target: GPT, draft: GPT, prompts, max_new_tokens: int = 48, gamma: int = 4,
                  repeat: int = 3) -> dict:
    """c and r(k) as the decoders pay them, from ``repeat`` interleaved rounds over ``prompts`` (greedy).

    Each round decodes every prompt plainly and by chain speculation (``gamma``), in alternating order. The
    target's one-token step is the median of its passes during plain decoding. The draft's passes during
    speculation come in two kinds: the first of a round runs right after a verification pass of the target,
    the others right after a pass of the draft itself; c is their median times, weighted by how many of each
    there were, over the step (the mean cost of a drafted token, robust to a disturbed pass). r(k) is the median
    verification pass over k tokens over the same step, for every k that occurred. Returns ``c``,
    ``c_after_target`` and ``c_after_draft`` (each kind's median over the step), ``r`` {k: r(k)},
    ``target_step_ms``, ``draft_pass_ms`` (the weighted median) and ``passes`` (how many each number rests on)."""
    if repeat < 1 or not prompts:
        raise ValueError(f"costs_in_loop needs prompts and repeat >= 1, got {len(prompts)} prompts, repeat={repeat}")
    plain_t, spec_t, spec_d = PassTimer(target), PassTimer(target), PassTimer(draft)

    def plain() -> None:
        with plain_t:
            for p in prompts:
                generate(target, p, max_new_tokens)

    def speculative() -> None:
        with spec_t, spec_d:
            for p in prompts:
                speculative_generate(target, draft, p, max_new_tokens, gamma=gamma)

    for r in range(repeat):
        for run in ((plain, speculative) if r % 2 == 0 else (speculative, plain)):
            run()
    step = statistics.median(plain_t.seconds(1))
    events = sorted([(t0, "target", n, s) for n, s, t0 in spec_t.passes]
                    + [(t0, "draft", n, s) for n, s, t0 in spec_d.passes])
    after = {"target": [], "draft": []}          # draft passes by the model that ran just before
    verify: dict[int, list[float]] = {}
    previous = "target"
    for _, model, n, s in events:
        if model == "draft":
            after[previous].append(s)
        else:
            verify.setdefault(n, []).append(s)
        previous = model
    kinds = {k: v for k, v in after.items() if v}
    draft_pass = sum(len(v) * statistics.median(v) for v in kinds.values()) / sum(map(len, kinds.values()))
    return dict(c=draft_pass / step,
                c_after_target=statistics.median(after["target"]) / step if after["target"] else float("nan"),
                c_after_draft=statistics.median(after["draft"]) / step if after["draft"] else float("nan"),
                r={k: statistics.median(v) / step for k, v in sorted(verify.items())},
                target_step_ms=1e3 * step, draft_pass_ms=1e3 * draft_pass,
                passes=dict(target_steps=len(plain_t.seconds(1)), draft_after_target=len(after["target"]),
                            draft_after_draft=len(after["draft"]), verify={k: len(v) for k, v in sorted(verify.items())}))


@torch.no_grad()
def pass_contexts(target: GPT, draft: GPT, cached: int = 128, repeat: int = 31) -> dict[str, list[float]]:
    """Seconds of single-token passes after ``cached`` cached positions, each timed right after an untimed pass
    of the same model ("target after target", "draft after draft": warm) or of the other one ("target after
    draft", "draft after target": cold), the four interleaved ``repeat`` times."""
    if cached + 1 > min(target.config.block_size, draft.config.block_size):
        raise ValueError(f"cached ({cached}) + 1 exceeds a model's context")
    gen = torch.Generator().manual_seed(0)
    passes = {}
    for name, model in (("target", target), ("draft", draft)):
        cache = KVCache.for_model(model, max_len=cached + 1)
        cache.advance(cached)                       # zeros as the prefix: their values change no work
        idx = torch.randint(model.config.vocab_size, (1, 1), generator=gen).to(model.device)

        def one(model=model, cache=cache, idx=idx) -> None:
            cache.crop(cached)
            model(idx, cache=cache)
        passes[name] = (model, one)
    order = [("target", "target"), ("draft", "draft"), ("target", "draft"), ("draft", "target")]
    runs = {f"{name} after {before}": [] for name, before in order}
    with evaluating(target), evaluating(draft):
        for _ in range(repeat):
            for name, before in order:
                passes[before][1]()                 # untimed: leaves its weights in the caches
                model, one = passes[name]
                synchronize(model.device)
                t0 = time.perf_counter()
                one()
                synchronize(model.device)
                runs[f"{name} after {before}"].append(time.perf_counter() - t0)
    return runs


class CallTimer:
    """Context manager timing every call of ``getattr(owner, name)`` (a function of a class or a module) while
    active: ``calls`` holds ``(shape of the first tensor argument or None, seconds)`` per call. The function is
    replaced by a timing wrapper on entry and restored on exit, so everything that calls it through ``owner``
    (methods through their class) is timed."""

    def __init__(self, owner, name: str):
        self.owner, self.name, self.calls, self._original = owner, name, [], None

    def __enter__(self) -> "CallTimer":
        original = self._original = getattr(self.owner, self.name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if tensor is not None:
                synchronize(tensor.device)
            t0 = time.perf_counter()
            out = original(*args, **kwargs)
            if tensor is not None:
                synchronize(tensor.device)
            self.calls.append((None if tensor is None else tuple(tensor.shape), time.perf_counter() - t0))
            return out
        setattr(self.owner, self.name, timed)
        return self

    def __exit__(self, *exc) -> None:
        setattr(self.owner, self.name, self._original)

    def seconds(self) -> float:
        """The recorded calls' seconds, summed."""
        return sum(s for _, s in self.calls)
