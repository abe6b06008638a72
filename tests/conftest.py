"""Shared fixtures: small random models (fast, fp32, seeded) and the shipped pair (loaded once, on the CPU)."""
from __future__ import annotations

import copy
import platform
import random

import pytest
import torch

import minigpt
import minigpt.checkpoint
from minigpt.model import GPT, GPTConfig
from minigpt.sampling import SamplingConfig

# The models in these tests are tiny: one thread is faster than several (no synchronisation), and it does not
# fight other processes for the cores.
torch.set_num_threads(1)

SMALL = dict(vocab_size=97, block_size=64, n_layer=2, n_head=4, n_embd=32)
# The same tests run on both architectures the model supports: GPT-2, and the Llama family's switches
# (RMSNorm, rotary positions from the position ids, SwiGLU, grouped-query attention, no biases).
ARCHS = {"gpt2": {}, "llama": dict(norm="rmsnorm", pos="rope", mlp="swiglu", mlp_hidden=48, n_kv_head=2, bias=False)}


def pytest_report_header(config):
    import numpy, tiktoken
    try:
        import ipywidgets
        widgets = ipywidgets.__version__
    except ImportError:
        widgets = "missing"
    return (f"minigpt {minigpt.__version__} | python {platform.python_version()} | torch {torch.__version__} | "
            f"numpy {numpy.__version__} | tiktoken {tiktoken.__version__} | ipywidgets {widgets} | "
            f"default device {minigpt.get_device()}")


def random_model(seed: int = 0, **overrides) -> GPT:
    """A seeded random GPT in eval mode, on the CPU, fp32, that behaves like a (bad) language model.

    With GPT-2's initialisation (std 0.02) the residual stream is dominated by the current token's embedding
    and the tied output layer predicts that same token again and again, so every decoder "agrees" trivially.
    Larger weights in the blocks let the context decide: greedy outputs vary, and the two top logits are
    separated by far more than rounding error, so equality tests compare real decisions."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**SMALL, **overrides}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "wte" not in name and "wpe" not in name:
                p.normal_(0.0, 1.5 * p.shape[1] ** -0.5)  # (out, in) matrices of the blocks
        model.transformer.wte.weight.normal_(0.0, 0.3)   # also the (tied) output layer
        if "wpe" in model.transformer:
            model.transformer.wpe.weight.normal_(0.0, 1.0)
    return model.eval()


def first_two_joint(model: GPT, prompt: list[int], temperature: float) -> torch.Tensor:
    """The exact joint distribution of the first two tokens sampled after ``prompt``, (V, V), from the model
    itself: what a sampled decoder's first two tokens must follow."""
    cfg = SamplingConfig(temperature)
    with torch.no_grad():
        p1 = cfg.probs(model(torch.tensor([prompt]))[0, -1])
        p2 = torch.stack([cfg.probs(model(torch.tensor([prompt + [x]]))[0, -1]) for x in range(len(p1))])
    return p1[:, None] * p2


def pair_frequencies(first_two, vocab_size: int, n: int) -> torch.Tensor:
    """Empirical joint of (a, b) = first_two(seed)[:2] over seeds 0 .. n - 1, (V, V)."""
    counts = torch.zeros(vocab_size, vocab_size)
    for seed in range(n):
        a, b = first_two(seed)[:2]
        counts[a, b] += 1
    return counts / n


def prompts_from(texts, tokenizer, n: int, seed: int, lengths=(4, 40), window: int = 1000,
                 min_text: int = 2000) -> list[list[int]]:
    """n windows of held-out text (``window`` characters from texts longer than ``min_text``), tokenized and cut
    to a random length in ``lengths``: prompts the models never trained on."""
    rng = random.Random(seed)
    texts = [t for t in texts if len(t) > min_text]
    out = []
    for _ in range(n):
        text = rng.choice(texts)
        start = rng.randrange(len(text) - window)
        ids = tokenizer.encode_ordinary(text[start:start + window])
        out.append(ids[:rng.randint(*lengths)])
    return out


def perturbed_copy(model: GPT, noise: float, seed: int = 0) -> GPT:
    """The same model plus Gaussian noise of ``noise`` times each tensor's std: a draft that agrees with
    ``model`` often but not always."""
    g = torch.Generator().manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * (p.std() if p.numel() > 1 else 1.0))
    return draft.eval()


@pytest.fixture(params=list(ARCHS))
def arch(request) -> dict:
    """Config overrides for one architecture; a test taking ``arch`` runs once per architecture."""
    return ARCHS[request.param]


@pytest.fixture
def small_model() -> GPT:
    return random_model(0)


def _pretrained(name: str) -> GPT:
    if not (minigpt.checkpoint.PACKAGE_CHECKPOINTS / f"{name}.pt").exists():
        # tests/test_setup.py fails on the missing file; here we only avoid a cascade of identical errors
        pytest.skip(f"shipped checkpoint minigpt/checkpoints/{name}.pt is missing")
    return minigpt.load_pretrained(name, device="cpu")


@pytest.fixture(scope="session")
def target() -> GPT:
    return _pretrained("target")


@pytest.fixture(scope="session")
def draft() -> GPT:
    return _pretrained("draft")


@pytest.fixture(scope="session")
def tokenizer():
    return minigpt.load_tokenizer()


@pytest.fixture(scope="session")
def val_texts() -> list[str]:
    """Held-out source files (the validation split), read as text: prompts the models never trained on."""
    from minigpt.data import read_text, split_files
    return [read_text(p) for p in split_files("val")]
