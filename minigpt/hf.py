"""Converting minigpt models to and from Hugging Face transformers' ``GPT2LMHeadModel``.

minigpt's architecture is GPT-2's (learned positions, pre-LayerNorm blocks, tanh-GELU MLP, tied output
layer), and its parameters carry GPT-2's names, so the conversion is a renaming with one twist: GPT-2's
``Conv1D`` layers store their weight as (in, out), while ``nn.Linear`` stores (out, in), so the four matrices
of every block (``c_attn``, ``attn.c_proj``, ``c_fc``, ``mlp.c_proj``) are transposed. Nothing is
approximated: the converted model computes the same function, up to fp32 rounding (tests/test_hf.py checks
logits and greedy outputs).

    from minigpt.hf import to_hf
    hf = to_hf(minigpt.load_pretrained("target"))
    out = hf.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)

transformers is an optional dependency (``pip install -e '.[peers]'``); it is imported only when a function
here is called.
"""
from __future__ import annotations

import torch

from .model import GPT, GPTConfig

INSTALL_HINT = "install the optional extra: pip install -e '.[peers]'"
# the matrices GPT-2 keeps in Conv1D layers, stored transposed relative to nn.Linear
GPT2_FIELDS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout")  # the rest must be defaults
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def require_transformers():
    """The ``transformers`` module, or an ImportError that says how to install it."""
    try:
        import transformers
    except ImportError:
        raise ImportError(f"minigpt.hf needs Hugging Face transformers, which is not installed: {INSTALL_HINT}") \
            from None
    return transformers


def default_eos_id(vocab_size: int) -> int:
    """``<|endoftext|>`` (id 4095, the course tokenizer's last id); for other vocabularies the last id."""
    from .tokenizer import load_tokenizer
    eot = load_tokenizer().eot_token
    return eot if eot < vocab_size else vocab_size - 1


def _is_conv1d(name: str) -> bool:
    return name.endswith(CONV1D_WEIGHTS)


@torch.no_grad()
def to_hf(model: GPT, eos_id: int | None = None, attn_implementation: str | None = None):
    """A ``transformers.GPT2LMHeadModel`` computing the same function as ``model``, on its device and dtype,
    in eval mode. bos, eos and pad ids are ``eos_id`` (default: ``<|endoftext|>``, 4095)."""
    transformers = require_transformers()
    c = model.config
    if GPTConfig(**{k: v for k, v in c.to_dict().items() if k in GPT2_FIELDS}) != c:
        raise ValueError("to_hf converts GPT-2-style models only (this one uses Llama-family switches)")
    eos = default_eos_id(c.vocab_size) if eos_id is None else eos_id
    hf_config = transformers.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.block_size, n_ctx=c.block_size, n_embd=c.n_embd,
        n_layer=c.n_layer, n_head=c.n_head, n_inner=4 * c.n_embd, activation_function="gelu_new",
        layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0,
        tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    hf = transformers.GPT2LMHeadModel(hf_config, **kwargs)
    hf.generation_config.pad_token_id = eos
    hf.generation_config.bos_token_id = eos
    hf.generation_config.eos_token_id = eos

    ours = dict(model.named_parameters())  # the tied lm_head.weight is listed once, as transformer.wte.weight
    theirs = dict(hf.named_parameters())
    if set(ours) != set(theirs):
        raise ValueError(f"parameter names differ: only in minigpt {sorted(set(ours) - set(theirs))[:3]}, "
                         f"only in transformers {sorted(set(theirs) - set(ours))[:3]}")
    hf.to(device=model.device, dtype=next(model.parameters()).dtype)
    theirs = dict(hf.named_parameters())
    for name, p in ours.items():
        src = p.t() if _is_conv1d(name) else p  # nn.Linear (out, in) -> Conv1D (in, out)
        theirs[name].copy_(src)
    if hf.lm_head.weight.data_ptr() != hf.transformer.wte.weight.data_ptr():
        hf.lm_head.weight.copy_(model.lm_head.weight)  # in case this transformers version unties them
    return hf.eval()


@torch.no_grad()
def from_hf(hf_model) -> GPT:
    """The inverse of :func:`to_hf`: a minigpt :class:`GPT` (eval mode, same device and dtype) from a
    ``GPT2LMHeadModel``. Raises ValueError for GPT-2 variants minigpt cannot express (another activation,
    MLP width or LayerNorm epsilon, per-layer attention scaling, untied output layer, cross-attention)."""
    require_transformers()
    hc = hf_model.config
    problems = []
    if hc.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        problems.append(f"activation {hc.activation_function!r} (minigpt uses tanh GELU)")
    if hc.n_inner not in (None, 4 * hc.n_embd):
        problems.append(f"MLP width {hc.n_inner} (minigpt uses 4 * n_embd)")
    if abs(hc.layer_norm_epsilon - 1e-5) > 1e-12:
        problems.append(f"layer_norm_epsilon {hc.layer_norm_epsilon} (minigpt uses 1e-5)")
    if not getattr(hc, "scale_attn_weights", True) or getattr(hc, "scale_attn_by_inverse_layer_idx", False):
        problems.append("non-standard attention scaling")
    if getattr(hc, "add_cross_attention", False):
        problems.append("cross-attention")
    if not torch.equal(hf_model.lm_head.weight, hf_model.transformer.wte.weight):
        problems.append("an output layer not tied to the token embedding")
    if problems:
        raise ValueError("cannot convert this GPT-2 model to minigpt: " + "; ".join(problems))
    config = GPTConfig(vocab_size=hc.vocab_size, block_size=hc.n_positions, n_layer=hc.n_layer,
                       n_head=hc.n_head, n_embd=hc.n_embd)
    model = GPT(config)
    ref = next(hf_model.parameters())
    model.to(device=ref.device, dtype=ref.dtype)
    theirs = dict(hf_model.named_parameters())
    for name, p in model.named_parameters():
        if name not in theirs:
            raise ValueError(f"the transformers model has no parameter {name!r}")
        src = theirs[name]
        p.copy_(src.t() if _is_conv1d(name) else src)  # Conv1D (in, out) -> nn.Linear (out, in)
    return model.eval()
