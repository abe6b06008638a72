"""Plain autoregressive decoding with a KV cache: one target pass per generated token.

On the shared loop (:mod:`.session`) plain decoding is the proposer that proposes nothing: each round the
target scores the last token alone and its own choice is the round's only token."""
from __future__ import annotations

import torch

from ..model import GPT
from .candidates import Proposal
from .session import Proposer, Session, Settings, as_prompt, check_length, decode


class Plain(Proposer):
    """No candidates: the root alone."""
    speculative = False  # its passes are decoding steps, not draft-then-verify rounds
    max_width = 1

    def propose(self, session: Session, room: int) -> Proposal:
        return Proposal([session.seq[-1]], [-1])


def generate(model: GPT, prompt, max_new_tokens: int, settings: Settings | None = None, **sampling) -> list[int]:
    """Generate up to ``max_new_tokens`` after ``prompt`` (a list of ids); return the new ids.

    One target pass per new token (``stats.target_passes == len(output)``), after one prefill pass.

    ``settings`` (:class:`~.session.Settings`) or its fields as keywords: ``temperature=0`` is greedy (also
    ``top_k``, ``top_p``); with a ``seed`` the output is reproducible; it stops early after ``eos_id``; pass a
    :class:`~.stats.DecodeStats` as ``stats`` to have it filled in; ``on_tokens(tokens)`` is called with every
    new token as it is made (streaming), which changes nothing else."""
    return decode(model, prompt, max_new_tokens, Plain(), settings, **sampling)[0]


@torch.no_grad()
def generate_no_cache(model: GPT, prompt, max_new_tokens: int) -> list[int]:
    """Greedy decoding that recomputes the whole sequence every step -- the slow baseline of Lesson 2."""
    idx = as_prompt(prompt, model)
    check_length(model, idx.shape[1], max_new_tokens)
    out: list[int] = []
    for _ in range(max_new_tokens):
        logits = model(idx)[0, -1]
        tok = int(logits.argmax())
        out.append(tok)
        idx = torch.cat([idx, torch.tensor([[tok]], device=idx.device)], dim=1)
    return out
