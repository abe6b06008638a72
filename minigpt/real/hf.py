"""Converting minigpt models to and from Hugging Face transformers' ``GPT2LMHeadModel`` (and, one way, to
``LlamaForCausalLM``).

minigpt's architecture is GPT-2's (learned positions, pre-LayerNorm blocks, tanh-GELU MLP, tied output
layer), and its parameters carry GPT-2's names, so the conversion is a renaming with one twist: GPT-2's
``Conv1D`` layers store their weight as (in, out), while ``nn.Linear`` stores (out, in), so the four matrices
of every block (``c_attn``, ``attn.c_proj``, ``c_fc``, ``mlp.c_proj``) are transposed. Nothing is
approximated: the converted model computes the same function, up to fp32 rounding (tests/test_hf.py checks
logits and greedy outputs).

    from minigpt.real.hf import to_hf
    hf = to_hf(minigpt.load_pretrained("target"))
    out = hf.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)

A minigpt model with the Llama switches (RMSNorm, rotary positions, SwiGLU, no biases: SmolLM2's draft in
Lesson 09) converts to ``LlamaForCausalLM`` instead. Two differences there: q/k/v and gate/up are one matrix
each in minigpt and separate ones in transformers, and transformers rotates the pairs (x[i], x[i + d/2]) of
a head where minigpt rotates adjacent pairs, so the rows of the q and k matrices are reordered
(:func:`rotate_half_layout`); scores, and so outputs, are unchanged.

:func:`load_hf_smollm` goes the other way for SmolLM2: transformers reads the same GGUF file itself, an
independent implementation for the exactness checks and the peer benchmark to compare with.

transformers is an optional dependency (``pip install -e '.[peers]'``); it is imported only when a function
here is called.
"""
from __future__ import annotations

import contextlib
import functools

import torch

from ..model import GPT, GPTConfig
from ..tokenizer import load_tokenizer
from .smollm import MISSING_REASON, gguf_path

INSTALL_HINT = "install the optional extra: pip install -e '.[peers]'"
# the matrices GPT-2 keeps in Conv1D layers, stored transposed relative to nn.Linear
GPT2_FIELDS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "dropout")  # the rest must be defaults
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def require_transformers():
    """The ``transformers`` module, or an ImportError that says how to install it."""
    try:
        import transformers
    except ImportError:
        raise ImportError(f"minigpt.real.hf needs Hugging Face transformers, which is not installed: {INSTALL_HINT}") \
            from None
    return transformers


def default_eos_id(vocab_size: int) -> int:
    """``<|endoftext|>`` (id 4095, the course tokenizer's last id); for other vocabularies the last id."""
    eot = load_tokenizer().eot_token
    return eot if eot < vocab_size else vocab_size - 1


def _is_conv1d(name: str) -> bool:
    return name.endswith(CONV1D_WEIGHTS)


def is_llama(config: GPTConfig) -> bool:
    """True for the full set of Llama switches (which :func:`to_hf` converts to ``LlamaForCausalLM``)."""
    return (config.norm, config.pos, config.mlp, config.bias) == ("rmsnorm", "rope", "swiglu", False)


def rotate_half_layout(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the rows of a q or k projection from adjacent-pair rotary layout (ours, the RoPE paper's,
    llama.cpp's) to the half-split layout that transformers' ``rotate_half`` expects: within each head, the
    even coordinates first, then the odd ones."""
    hs = w.shape[0] // n_heads
    return w.view(n_heads, hs // 2, 2, -1).transpose(1, 2).reshape(w.shape)


def _set_ids(hf, eos: int):
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        setattr(hf.config, key, eos)
        setattr(hf.generation_config, key, eos)


@torch.no_grad()
def to_llama(model: GPT, eos_id: int | None = None, attn_implementation: str | None = None):
    """A ``transformers.LlamaForCausalLM`` computing the same function as ``model`` (a minigpt GPT with the
    Llama switches), on its device and dtype, in eval mode."""
    transformers = require_transformers()
    c = model.config
    if not is_llama(c):
        raise ValueError("to_llama converts models with all the Llama switches (rmsnorm, rope, swiglu, no biases)")
    hc = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.n_embd, intermediate_size=c.hidden, num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head, num_key_value_heads=c.kv_heads, head_dim=c.head_size,
        max_position_embeddings=c.block_size, rms_norm_eps=c.norm_eps, rope_theta=c.rope_base,
        tie_word_embeddings=True, attention_bias=False, mlp_bias=False)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    hf = transformers.LlamaForCausalLM(hc, **kwargs)
    _set_ids(hf, default_eos_id(c.vocab_size) if eos_id is None else eos_id)
    sd = {"model.embed_tokens.weight": model.transformer.wte.weight,
          "model.norm.weight": model.transformer.ln_f.weight, "lm_head.weight": model.transformer.wte.weight}
    hs, nq, nkv = c.head_size, c.n_head, c.kv_heads
    for i, block in enumerate(model.transformer.h):
        q, k, v = block.attn.c_attn.weight.split([nq * hs, nkv * hs, nkv * hs])
        gate, up = block.mlp.c_fc.weight.chunk(2)
        pre = f"model.layers.{i}."
        sd |= {pre + "self_attn.q_proj.weight": rotate_half_layout(q, nq),
               pre + "self_attn.k_proj.weight": rotate_half_layout(k, nkv),
               pre + "self_attn.v_proj.weight": v, pre + "self_attn.o_proj.weight": block.attn.c_proj.weight,
               pre + "mlp.gate_proj.weight": gate, pre + "mlp.up_proj.weight": up,
               pre + "mlp.down_proj.weight": block.mlp.c_proj.weight,
               pre + "input_layernorm.weight": block.ln_1.weight,
               pre + "post_attention_layernorm.weight": block.ln_2.weight}
    hf.to(device=model.device, dtype=next(model.parameters()).dtype)
    hf.load_state_dict({k: v.detach() for k, v in sd.items()}, strict=True)
    return hf.eval()


@torch.no_grad()
def to_hf(model: GPT, eos_id: int | None = None, attn_implementation: str | None = None):
    """A ``transformers.GPT2LMHeadModel`` computing the same function as ``model``, on its device and dtype,
    in eval mode; a ``LlamaForCausalLM`` (:func:`to_llama`) when ``model`` uses the Llama switches. bos, eos
    and pad ids are ``eos_id`` (default: ``<|endoftext|>``, 4095; the last id for other vocabularies)."""
    transformers = require_transformers()
    c = model.config
    if is_llama(c):
        return to_llama(model, eos_id, attn_implementation)
    if GPTConfig(**{k: v for k, v in c.to_dict().items() if k in GPT2_FIELDS}) != c:
        raise ValueError("to_hf converts GPT-2 models and Llama models (rmsnorm, rope, swiglu, no biases); "
                         "this one mixes the two")
    eos = default_eos_id(c.vocab_size) if eos_id is None else eos_id
    hf_config = transformers.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.block_size, n_ctx=c.block_size, n_embd=c.n_embd,
        n_layer=c.n_layer, n_head=c.n_head, n_inner=4 * c.n_embd, activation_function="gelu_new",
        layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0,
        tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    hf = transformers.GPT2LMHeadModel(hf_config, **kwargs)
    _set_ids(hf, eos)

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


def load_hf_smollm(device=None):
    """transformers' own model from the same GGUF file (it dequantises to fp32 itself): the independent
    implementation the exactness checks and the peer benchmark compare with."""
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
