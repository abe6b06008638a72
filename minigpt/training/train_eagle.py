"""Training an EAGLE head (:mod:`minigpt.eagle_head`) on a frozen target's features.

For every window of text the frozen target computes its features f_0 .. f_{T-1}; the head reads (f_t, x_{t+1})
and is trained to output f_{t+1}: a regression on the feature (smooth L1) plus a classification loss that asks
the target's output layer, applied to the predicted feature, to give the target's own distribution over x_{t+2}
(weight 0.1, as in the paper). While drafting, deeper tree levels feed the head its own predicted features, which
are never exact; uniform noise on the input features during training prepares it for that.

    python -m minigpt.training.train_eagle --minutes 40 --write   # train for the shipped target, measure, ship
    python -m minigpt.training.train_eagle --measure              # measure the shipped head again
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..checkpoint import PACKAGE_CHECKPOINTS, load_pretrained
from ..data import get_batch, load_tokens
from ..decoding.eagle import Eagle
from ..decoding.session import decode
from ..eagle_head import EAGLE_CHECKPOINT, EagleHead, load_eagle, save_eagle
from ..model import GPT, frozen
from ..prompts import code_prompts
from ..tokenizer import EOT, load_tokenizer
from .copydata import copy_batch, example_starts, load_copy_tokens


def eagle_loss(head: EagleHead, features: torch.Tensor, tokens: torch.Tensor, noise: float = 0.0,
               cls_weight: float = 0.1, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The loss on one batch. features (B, T, C): the target's final hidden states of ``tokens`` (B, T).

    The head's entry t reads (f_t + noise, x_{t+1}) and is scored against f_{t+1} and the target's distribution
    at t + 1; ``mask`` (B, T - 1) bool: which entries count (e.g. only an answer's tokens)."""
    inp = features[:, :-1]
    if noise:
        inp = inp + (torch.rand_like(inp) * 2 - 1) * noise
    pred = head(inp, tokens[:, 1:])
    want = features[:, 1:]
    keep = torch.ones(pred.shape[:2], dtype=torch.bool, device=pred.device) if mask is None else mask
    reg = F.smooth_l1_loss(pred[keep], want[keep])
    with torch.no_grad():
        p = torch.softmax(head.logits(want[keep]).float(), -1)
    logq = torch.log_softmax(head.logits(pred[keep]).float(), -1)
    cls = -(p * logq).sum(-1).mean()
    with torch.no_grad():
        top1 = (logq.argmax(-1) == p.argmax(-1)).float().mean()
    return reg + cls_weight * cls, dict(reg=reg.item(), cls=cls.item(), top1=top1.item())


@torch.no_grad()
def agreement(target: GPT, head: EagleHead, windows) -> float:
    """How often the head's next token (from the true f_t and x_{t+1}) is the target's own argmax at t + 1.
    ``windows``: (x (B, T), mask (B, T - 1) or None) pairs; a mask picks the entries that count (e.g. those
    predicting an answer's token)."""
    hits = total = 0
    for x, mask in windows:
        x = x.to(target.device)
        f = target.hidden_states(x)
        pred = head(f[:, :-1], x[:, 1:])
        agree = head.token_ids(head.logits(pred).argmax(-1)) == target.lm_head(f[:, 1:]).argmax(-1)
        keep = torch.ones_like(agree) if mask is None else mask.to(agree.device)
        hits += int((agree & keep).sum())
        total += int(keep.sum())
    return hits / max(total, 1)


def eagle_top1(target: GPT, head: EagleHead, data: np.ndarray, batches: int = 8, batch_size: int = 8,
               block_size: int = 256) -> float:
    """Held-out agreement (:func:`agreement`) on ``batches`` fixed random windows of ``data`` (token ids)."""
    g = torch.Generator().manual_seed(4321)
    return agreement(target, head, [(get_batch(data, batch_size, block_size, g)[0], None) for _ in range(batches)])


def depth_acceptance(target: GPT, head: EagleHead, prompts, depth: int = 6, max_new_tokens: int = 64) -> list[float]:
    """Held-out top-1 per depth, as decoding sees it: EAGLE's chain (top_k=1) runs greedily on ``prompts``, and
    entry d - 1 is the share of rounds reaching depth d (d - 1 tokens accepted, a d-th proposed) whose d-th
    token was accepted too: the head's top-1 agreement with the target at that depth, given the ones before."""
    outcomes = []

    class Recording(Eagle):
        def observe(self, proposal, verified):
            outcomes.append((len(proposal.candidates), len(verified.path)))

    for prompt in prompts:
        decode(target, prompt, max_new_tokens, Recording(head, depth=depth, top_k=1, total_tokens=depth))
    rates = []
    for d in range(1, depth + 1):
        reached = sum(1 for proposed, accepted in outcomes if proposed >= d and accepted >= d - 1)
        rates.append(sum(1 for _, accepted in outcomes if accepted >= d) / reached if reached else float("nan"))
    return rates


def course_batches(batch_size: int = 8, block_size: int = 256, copy_share: float = 0.5, vocab_size: int = 4096):
    """The course target's training batches: windows of the corpus's training split, and a ``copy_share`` of
    batches from the copy-heavy examples the target itself learned to copy on. Returns batch(generator) ->
    (x, None)."""
    corpus = load_tokens("train")
    copies = load_copy_tokens("train")
    starts = example_starts(copies, load_tokenizer().encode_single_token(EOT))

    def batch(g: torch.Generator):
        if float(torch.rand((), generator=g)) < copy_share:
            return copy_batch(copies, starts, batch_size, block_size, g, vocab_size=vocab_size)[0], None
        return get_batch(corpus, batch_size, block_size, g)[0], None
    return batch


def train_eagle(target: GPT, head: EagleHead, minutes: float, batches=None, lr: float = 1e-3, noise: float = 0.1,
                max_steps: int | None = None, progress: bool = True, save_to=None) -> dict:
    """Train ``head`` on the frozen target for ``minutes`` (or ``max_steps``). ``batches``: a function of a
    generator returning (x, mask or None) (default: :func:`course_batches`); ``save_to``: a path the head is
    saved to every 200 steps (a long run can be stopped and still kept)."""
    batches = batches or course_batches(vocab_size=target.config.vocab_size)
    with frozen(target):  # the target is read, never trained; given back as it came
        head.train()
        opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
        g = torch.Generator().manual_seed(11)
        t0, step, tokens, history = time.time(), 0, 0, []
        bar = tqdm(desc="eagle head", unit="step", disable=not progress)
        while time.time() - t0 < minutes * 60 and (max_steps is None or step < max_steps):
            for group in opt.param_groups:  # a short warm-up, then a constant rate
                group["lr"] = lr * min(1.0, (step + 1) / 50)
            x, mask = batches(g)
            x = x.to(target.device)
            with torch.no_grad():
                f = target.hidden_states(x)
            loss, parts = eagle_loss(head, f, x, noise, mask=None if mask is None else mask.to(x.device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            step += 1
            tokens += x.numel()
            if step % 50 == 0:
                history.append(dict(step=step, **{k: round(v, 4) for k, v in parts.items()}))
            if save_to is not None and step % 200 == 0:
                save_eagle(head, save_to, steps=step)
            bar.set_postfix(reg=f"{parts['reg']:.3f}", cls=f"{parts['cls']:.3f}", top1=f"{parts['top1']:.2f}")
            bar.update(1)
        bar.close()
    head.eval()
    return dict(steps=step, tokens_seen=tokens, train_seconds=round(time.time() - t0), lr=lr,
                batch_shape=list(x.shape), input_noise=noise, history=history)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--write", action="store_true", help="save into minigpt/checkpoints/ with a card")
    ap.add_argument("--measure", action="store_true",
                    help="no training: measure the shipped head again and rewrite the measurements in its card")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_pretrained("target", "cpu")
    card_path = PACKAGE_CHECKPOINTS / "eagle_card.json"
    if args.measure:
        head, out = load_eagle(target), EAGLE_CHECKPOINT
        card = json.loads(card_path.read_text())
    else:
        head = EagleHead(target)
        out = EAGLE_CHECKPOINT if args.write else Path("runs") / "eagle.pt"
        out.parent.mkdir(parents=True, exist_ok=True)
        info = train_eagle(target, head, args.minutes, max_steps=args.max_steps, save_to=out)
        card = dict(target="minigpt/checkpoints/target.pt (frozen)",
                    data="training split of the standard-library corpus and its copy-heavy examples "
                         "(minigpt.training.copydata), half of the batches each",
                    **{k: v for k, v in info.items() if k != "history"},
                    hardware=f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}",
                    history=info["history"])
    card["held_out_top1"] = round(eagle_top1(target, head, load_tokens("val")), 4)
    card["held_out_top1_by_depth"] = [round(r, 4) for r in depth_acceptance(target, head, code_prompts(8))]
    card["held_out_top1_by_depth_how"] = ("EAGLE's chain (top_k=1, depth 6) decoding 64 tokens greedily on the 8 "
                                          "held-out code prompts of minigpt.prompts.code_prompts; entry d-1: "
                                          "accepted at depth d / rounds that reached depth d")
    print(json.dumps({k: v for k, v in card.items() if k != "history"}, indent=1))
    if args.write or args.measure:
        save_eagle(head, out, card=json.dumps(card))
        card_path.write_text(json.dumps(card, indent=1) + "\n")
    else:
        save_eagle(head, out, card=json.dumps(card))


if __name__ == "__main__":
    main()
