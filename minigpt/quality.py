"""What a reduced precision costs in quality, next to the model it approximates: the same greedy text or not,
and the perplexity of held-out text (:mod:`minigpt.precision` gives the models; Lesson 13 reads the numbers).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .decoding.plain import generate
from .model import GPT


def greedy_agreement(reference: GPT, model: GPT, prompts: list[list[int]], n_new: int) -> dict:
    """Greedy continuations of ``n_new`` tokens from both models: how many prompts gave the same text, where
    the others first parted (0-based token index), and the share of all tokens produced before a parting."""
    firsts = []
    for p in prompts:
        a, b = generate(reference, p, n_new), generate(model, p, n_new)
        firsts.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), n_new))
    return dict(prompts=len(prompts), identical=sum(f == n_new for f in firsts), first_parting=firsts,
                share_before_parting=sum(firsts) / (n_new * len(prompts)))


@torch.no_grad()
def perplexity(model: GPT, tokens: list[int], window: int = 256, max_windows: int = 16) -> float:
    """exp(mean next-token cross-entropy) over up to ``max_windows`` consecutive windows of ``tokens``."""
    if len(tokens) < 2:
        raise ValueError("perplexity needs at least two tokens")
    window = min(window, model.config.block_size, len(tokens) - 1)
    total, count = 0.0, 0
    for start in range(0, min(len(tokens) - 1, window * max_windows), window):
        chunk = torch.tensor([tokens[start:start + window + 1]], device=model.device)
        if chunk.shape[1] < 2:
            break
        logits = model(chunk[:, :-1])[0].float()
        total += float(F.cross_entropy(logits, chunk[0, 1:], reduction="sum"))
        count += chunk.shape[1] - 1
    return math.exp(total / count)
