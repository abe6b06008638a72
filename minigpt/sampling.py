"""From logits to the probability distribution that is actually sampled from.

Speculative sampling is exact only if the acceptance rule uses the *same* distributions the tokens were
drawn from: after temperature, top-k and top-p. So instead of a ``sample(logits)`` that hides them, every
decoder here first asks :func:`probs_from_logits` for the distribution and then draws from it. (The draft and
the target need not use the same settings: the draft's only change how often its tokens are accepted.)

Temperature 0 means greedy decoding; its distribution is the one-hot vector at the argmax, so the same
acceptance rule covers greedy and sampled decoding.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How to turn logits into a distribution. ``temperature=0`` is greedy."""
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be a positive integer, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return probs_from_logits(logits, self.temperature, self.top_k, self.top_p)


def probs_from_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                      top_p: float | None = None) -> torch.Tensor:
    """(..., V) logits -> (..., V) probabilities, exactly the distribution a sampler would draw from.

    temperature 0: one-hot at the argmax (greedy). Otherwise softmax(logits / temperature), restricted to
    the ``top_k`` most likely tokens, then to the smallest set of most likely tokens whose probability
    reaches ``top_p`` (the "nucleus"), and renormalised.
    """
    SamplingConfig(temperature, top_k, top_p)  # validates the arguments
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (..., 1) the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None and top_p < 1:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the tokens strictly more likely than it already reach top_p
        mass_before = sorted_p.cumsum(-1) - sorted_p
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """Draw one token id from a (V,) distribution (on the CPU, so a seed gives the same draw on any device)."""
    return int(torch.multinomial(probs.detach().float().cpu(), 1, generator=generator))


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU random generator; seeded when ``seed`` is given, else from fresh entropy."""
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g
