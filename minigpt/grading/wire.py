"""Plain data across the boundary between the learner's kernel and the judge.

The judge (:mod:`.judge`) never runs learner code and the learner's kernel never computes a verdict: the judge
sends the inputs of each call, the kernel calls the learner's function and sends back what it returned. Both
directions use this module's encoding: a message is a JSON object plus a list of byte strings ("blobs"), with a
few tagged objects in the JSON:

* numbers, ``None``, strings and lists are JSON values; a ``bool`` stays a ``bool``, any other integral number
  becomes an ``int`` and any other real number a ``float`` (``int(x)`` / ``float(x)``: a subclass that compares
  equal to anything arrives as the plain number it converts to);
* ``{"t": "tuple"}``, ``{"t": "dict"}``: tuples and dicts (any keys), element by element;
* ``{"t": "tensor"}``: dtype (from a fixed list), shape and the index of the blob holding its raw bytes;
  decoding is ``torch.frombuffer``, so loading a tensor runs no code (no pickle);
* ``{"t": "generator"}``: a CPU ``torch.Generator``, its state bytes in a blob;
* ``{"t": "callable"}``: one of the few :data:`PORTABLE` callables the cases pass (a next-token table, a
  verification cost r(k)), rebuilt on the other side from plain data;
* ``{"t": "wrong"}``: anything else the learner's function returned (a numpy array, an object with a custom
  ``__eq__``, ...) travels as its type name and a short ``repr`` made in the kernel; the judge receives a
  :class:`WrongType` that is equal to nothing but itself, so a check reports it as a wrong type.

:func:`serve_call` is the kernel's half of one call (decode the inputs, call, encode the answer, the inputs as
the call left them and the global RNG's state); :func:`send` and :func:`receive` frame one message on a socket.
Nothing here imports the graders, so the kernel needs only this module and :mod:`.session`.
"""
from __future__ import annotations

import json
import linecache
import numbers
import os
import re
import struct
import sysconfig
from pathlib import Path
from typing import Callable

import torch

MAX_MESSAGE = 8 * 1024 * 1024  # bytes of one message; a larger answer is refused as "too large to check"
MAX_DEPTH = 32                 # nesting of lists / tuples / dicts in one value
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
    torch.float32, torch.float64, torch.complex64, torch.complex128)}


ITEMSIZE = {name: torch.empty((), dtype=d).element_size() for name, d in DTYPES.items()}
_NUMPY_OK = {d for d in DTYPES.values() if d is not torch.bfloat16}


class WireError(ValueError):
    """A message that is not valid wire data (a value too deep or too large, an unknown tag, bad bytes)."""


class WrongType:
    """What the judge receives for a value that is not plain data. ``type(x).__name__`` is the learner's type
    name (see :func:`wrong_type`), ``repr(x)`` the ``repr`` the kernel made; it equals nothing but itself."""

    learner_type = "object"

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


_WRONG_CLASSES: dict[str, type] = {}


def wrong_type(type_name: str, text: str) -> WrongType:
    """A :class:`WrongType` whose class is named after the learner's type (so messages that print
    ``type(got).__name__`` name it); names that are not identifiers become ``object``."""
    name = type_name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,59}", type_name or "") else "object"
    cls = _WRONG_CLASSES.get(name)
    if cls is None:
        cls = _WRONG_CLASSES[name] = type(name, (WrongType,), {"learner_type": name})
    return cls(str(text)[:200])


# ---- the few callables a case may pass to the learner's function ----------------------------------------------

class NextTokenTable:
    """A toy drafter for exercise 03: ``next_probs(context)`` is row ``context[-1]`` of a (V, V) table."""

    kind = "next_token_table"

    def __init__(self, table: torch.Tensor):
        self.table, self.calls = table, 0

    def __call__(self, context) -> torch.Tensor:
        self.calls += 1
        return self.table[int(context[-1])].clone()

    def to_wire(self):
        return self.table


class CostTable:
    """r(k) for exercise 08: the cost of a target pass over k tokens, ``values[k - 1]`` for k = 1, 2, ...;
    ``str`` says how it was made (e.g. ``1 + 0.15 (k - 1)``)."""

    kind = "cost_table"

    def __init__(self, values, label: str = ""):
        self.values, self.label = [float(v) for v in values], str(label)

    def __call__(self, k) -> float:
        k = int(k)
        if not 1 <= k <= len(self.values):
            raise IndexError(f"r(k) is given for k = 1 .. {len(self.values)} tokens, not k = {k}")
        return self.values[k - 1]

    def __repr__(self) -> str:
        return f"r(k) = {self.label}" if self.label else f"r = {self.values}"

    def to_wire(self):
        return [self.values, self.label]


PORTABLE: dict[str, Callable] = {
    NextTokenTable.kind: lambda data: NextTokenTable(data),
    CostTable.kind: lambda data: CostTable(*data),
}


# ---- encode / decode -------------------------------------------------------------------------------------------
# A message is a JSON object plus a list of byte strings ("blobs"): a tensor's bytes or a generator's state are a
# blob, referred to by its index, so no large value is escaped into JSON or base64.

_PLAIN = (int, float, str, type(None))


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a contiguous CPU tensor."""
    if not t.numel():
        return b""
    if t.dtype in _NUMPY_OK:
        return t.numpy().tobytes()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def _type_name(value) -> str:
    try:
        return str(type(value).__name__)[:60]
    except Exception:
        return "object"


def _blob(blobs: list, data: bytes) -> int:
    blobs.append(data)
    return len(blobs) - 1


def encode(value, blobs: list, depth: int = 0, gens: dict | None = None):
    """``value`` as JSON-ready data, its bytes appended to ``blobs`` (see the module docstring); never raises for
    a learner's value: whatever cannot be encoded becomes a ``wrong`` marker. With ``gens`` (a dict), generators
    are encoded as references ``{"t": "generator_ref", "ref": i}`` into it (id -> (i, generator)), so that calls
    of one batch share them (:func:`serve_map`)."""
    mark = len(blobs)
    try:
        if gens is not None and isinstance(value, torch.Generator):
            return {"t": "generator_ref", "ref": gens.setdefault(id(value), (len(gens), value))[0]}
        if gens is not None and isinstance(value, (list, tuple)):
            items = [encode(v, blobs, depth + 1, gens) for v in value]
            return items if isinstance(value, list) else {"t": "tuple", "items": items}
        return _encode(value, blobs, depth)
    except Exception as e:  # too deep, or a learner's object whose __float__, __iter__, repr ... raised
        del blobs[mark:]
        text = str(e) if isinstance(e, WireError) else f"{_type_name(value)} ({type(e).__name__})"
        return {"t": "wrong", "type": "object" if isinstance(e, WireError) else _type_name(value), "text": text}


def _tensor(t: torch.Tensor, blobs: list) -> dict:
    return {"t": "tensor", "dtype": str(t.dtype)[6:], "shape": list(t.shape), "blob": _blob(blobs, tensor_bytes(t))}


def _encode(value, blobs: list, depth: int):
    kind = type(value)
    if kind in _PLAIN or kind is bool:  # the common cases first
        return value
    if kind is list and depth < MAX_DEPTH and all(type(v) in _PLAIN for v in value):
        return list(value)
    if kind is torch.Tensor and value.device.type == "cpu" and not value.requires_grad and value.is_contiguous() \
            and value.layout == torch.strided and not value.is_conj() and not value.is_neg() \
            and str(value.dtype)[6:] in DTYPES:
        return _tensor(value, blobs)
    if depth > MAX_DEPTH:
        raise WireError(f"a value nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu")
        if t.layout != torch.strided or str(t.dtype)[6:] not in DTYPES:
            return {"t": "wrong", "type": "Tensor", "text": f"a {t.layout} tensor of dtype {t.dtype}"}
        return _tensor(torch.Tensor.as_subclass(t, torch.Tensor).resolve_conj().resolve_neg().contiguous(), blobs)
    if isinstance(value, (list, tuple)):
        items = [_encode(v, blobs, depth + 1) for v in list(value)]
        return items if isinstance(value, list) else {"t": "tuple", "items": items}
    if isinstance(value, dict):
        return {"t": "dict", "items": [[_encode(k, blobs, depth + 1), _encode(v, blobs, depth + 1)]
                                       for k, v in dict(value).items()]}
    if isinstance(value, torch.Generator):
        return {"t": "generator", "blob": _blob(blobs, tensor_bytes(value.get_state()))}
    kind = getattr(type(value), "kind", None)
    if kind in PORTABLE and type(value) in (NextTokenTable, CostTable):
        return {"t": "callable", "kind": kind, "data": _encode(value.to_wire(), blobs, depth + 1)}
    try:
        text = repr(value)
    except Exception:
        text = f"a {_type_name(value)}"
    return {"t": "wrong", "type": _type_name(value), "text": text[:200]}


def decode(data, blobs: list, depth: int = 0, gens: list | None = None):
    """The value that :func:`encode` made ``data`` from (fresh objects; a generator reference is an element of
    ``gens``); raises :class:`WireError` on bad data."""
    if depth > MAX_DEPTH + 2:
        raise WireError("a value nested too deep")
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode(v, blobs, depth + 1, gens) for v in data]
    if not isinstance(data, dict):
        raise WireError(f"unexpected {type(data).__name__}")
    tag = data.get("t")
    if tag == "tuple":
        return tuple(decode(v, blobs, depth + 1, gens) for v in data["items"])
    if tag == "generator_ref":
        if gens is None or not isinstance(data.get("ref"), int) or not 0 <= data["ref"] < len(gens):
            raise WireError("a generator reference outside a batch")
        return gens[data["ref"]]
    if tag == "dict":
        return {_hashable(decode(k, blobs, depth + 1)): decode(v, blobs, depth + 1) for k, v in data["items"]}
    if tag == "tensor":
        return tensor_from(_get(blobs, data["blob"]), data.get("dtype"), data["shape"])
    if tag == "generator_state":
        return tensor_from(_get(blobs, data["blob"]), "uint8", None)
    if tag == "generator":
        g = torch.Generator()
        g.set_state(tensor_from(_get(blobs, data["blob"]), "uint8", None))
        return g
    if tag == "callable" and data.get("kind") in PORTABLE:
        return PORTABLE[data["kind"]](decode(data["data"], blobs, depth + 1))
    if tag == "wrong":
        return wrong_type(str(data.get("type", "object")), str(data.get("text", "")))
    raise WireError(f"unknown tag {tag!r}")


def _get(blobs: list, index) -> bytes:
    if not isinstance(index, int) or not 0 <= index < len(blobs):
        raise WireError(f"no blob {index!r}")
    return blobs[index]


def _hashable(key):
    return tuple(key) if isinstance(key, list) else key


def tensor_from(raw: bytes, dtype_name, shape) -> torch.Tensor:
    """A tensor of ``dtype_name`` and ``shape`` (``None``: one dimension) on a copy of the bytes ``raw``."""
    dtype = DTYPES.get(dtype_name)
    if dtype is None:
        raise WireError(f"unknown dtype {dtype_name!r}")
    size = ITEMSIZE[dtype_name]
    shape = [len(raw) // size] if shape is None else [int(s) for s in shape]
    numel = 1
    for s in shape:
        if s < 0:
            raise WireError("a negative dimension")
        numel *= s
    if numel * size != len(raw):
        raise WireError("tensor bytes do not match its shape")
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)


def same(a, blobs_a: list, b, blobs_b: list) -> bool:
    """Whether two encodings (each with its blobs) describe the same value."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return False
        return all(same(_get(blobs_a, a[k]), [], _get(blobs_b, b[k]), []) if k == "blob" else
                   same(a[k], blobs_a, b[k], blobs_b) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, blobs_a, y, blobs_b) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


# ---- one call, on the learner's side ---------------------------------------------------------------------------

_LIBRARY_DIRS = tuple(str(Path(p).resolve()) + os.sep for p in {
    str(Path(__file__).resolve().parent.parent), str(Path(torch.__file__).resolve().parent),
    *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))})


def _in_library(filename: str) -> bool:
    if filename.startswith("<"):
        return filename.startswith("<frozen")
    try:
        return str(Path(filename).resolve()).startswith(_LIBRARY_DIRS)
    except (OSError, ValueError):
        return False


def _cell_name(filename: str) -> str:
    if re.search(r"ipykernel_\d+[/\\]\d+\.py$", filename) or filename.startswith("<ipython-input"):
        return "your cell"
    return os.path.basename(filename) or filename


def learner_line(exc: BaseException) -> dict | None:
    """Where in the learner's code ``exc`` was raised: the deepest frame of its traceback that is not in minigpt,
    torch or the standard library (``function``, ``line``, ``file``: "your cell" for a notebook cell, ``text``)."""
    found, tb = None, exc.__traceback__
    while tb is not None:
        if not _in_library(tb.tb_frame.f_code.co_filename):
            found = tb
        tb = tb.tb_next
    if found is None:
        return None
    code, line = found.tb_frame.f_code, found.tb_lineno
    text = linecache.getline(code.co_filename, line, found.tb_frame.f_globals).strip()
    return {"function": code.co_name, "line": line, "file": _cell_name(code.co_filename), "text": text[:160]}


def _one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    msg = lines[0] if lines else ""
    return msg if len(msg) <= 160 else msg[:157] + "..."


def raised_info(e: BaseException) -> dict:
    """What the judge is told about an exception the learner's function raised."""
    return {"type": _type_name(e), "message": _one_line(e), "not_implemented": isinstance(e, NotImplementedError),
            "where": learner_line(e)}


def rng_state() -> torch.Tensor:
    """The global torch RNG's state (a uint8 tensor)."""
    return torch.get_rng_state()


def serve_call(fn: Callable, call: dict, blobs: list) -> tuple[dict, list]:
    """Call ``fn`` on the decoded ``call["args"]`` / ``call["kwargs"]`` (with the global torch RNG set to the
    blob ``call["rng"]`` when given) and return the reply with its blobs: ``value`` (encoded) or ``raised`` (type,
    message, whether it is a NotImplementedError, the learner's line), the arguments as the call left them
    (``None`` where unchanged) and the global RNG's state (a blob) when the call changed it."""
    if call.get("rng") is not None:
        torch.set_rng_state(tensor_from(_get(blobs, call["rng"]), "uint8", None))
    sent_args, sent_kwargs = list(call.get("args", [])), dict(call.get("kwargs", {}))
    args = [decode(a, blobs) for a in sent_args]
    kwargs = {k: decode(v, blobs) for k, v in sent_kwargs.items()}
    before = torch.get_rng_state()
    out: list = []
    reply: dict = {"value": None, "raised": None}
    try:
        value = fn(*args, **kwargs)
        reply["value"] = encode(value, out)
    except (Exception, SystemExit) as e:  # SystemExit too: a function that calls exit() raised, nothing more
        reply["raised"] = raised_info(e)
    reply["args"] = [_changed(a, s, blobs, out) for a, s in zip(args, sent_args)]
    reply["kwargs"] = {k: _changed(v, sent_kwargs[k], blobs, out) for k, v in kwargs.items()}
    now = torch.get_rng_state()
    reply["rng"] = None if torch.equal(now, before) else _blob(out, tensor_bytes(now))
    size = sum(len(b) for b in out)
    if size > MAX_MESSAGE:
        reply = {"value": {"t": "wrong", "type": "object", "text": f"a value of {size / 2**20:.1f} MB, too large to "
                           f"check (the limit is {MAX_MESSAGE / 2**20:.0f} MB)"},
                 "raised": None, "args": [None] * len(args), "kwargs": {k: None for k in kwargs}, "rng": None}
        out = []
    return reply, out


def serve_map(fn: Callable, batch: dict, blobs: list) -> tuple[dict, list]:
    """Call ``fn`` on each argument list of ``batch["calls"]`` in order (a batch of calls in one message), the
    generators of ``batch["gens"]`` shared between the calls; stop at the first call that raises. Returns the
    reply: ``values`` (encoded, one per call made), ``raised`` (as :func:`serve_call`), the generators' states
    after the batch (``gens``, blobs) and the global RNG's state when the batch changed it."""
    if batch.get("rng") is not None:
        torch.set_rng_state(tensor_from(_get(blobs, batch["rng"]), "uint8", None))
    gens = []
    for index in batch.get("gens", []):
        g = torch.Generator()
        g.set_state(tensor_from(_get(blobs, index), "uint8", None))
        gens.append(g)
    calls = [[decode(a, blobs, gens=gens) for a in args] for args in batch.get("calls", [])]
    before = torch.get_rng_state()
    out: list = []
    reply: dict = {"values": [], "raised": None}
    for args in calls:
        try:
            value = fn(*args)
        except (Exception, SystemExit) as e:
            reply["raised"] = raised_info(e)
            break
        reply["values"].append(encode(value, out))
    reply["gens"] = [_blob(out, tensor_bytes(g.get_state())) for g in gens]
    now = torch.get_rng_state()
    reply["rng"] = None if torch.equal(now, before) else _blob(out, tensor_bytes(now))
    size = sum(len(b) for b in out)
    if size > MAX_MESSAGE:
        wrong = {"t": "wrong", "type": "object", "text": f"answers of {size / 2**20:.1f} MB in all, too large to "
                 f"check (the limit is {MAX_MESSAGE / 2**20:.0f} MB)"}
        out = [tensor_bytes(g.get_state()) for g in gens]
        reply = {"values": [wrong] * len(reply["values"]), "raised": reply["raised"],
                 "gens": list(range(len(gens))), "rng": None}
    return reply, out


def _changed(value, sent, sent_blobs: list, out: list):
    """``value`` encoded into ``out`` if the call changed it (an argument written in place), else ``None``."""
    kind = type(value)
    if kind in _PLAIN or kind is bool:
        return None
    tag = sent.get("t") if isinstance(sent, dict) else None
    if kind is list and type(sent) is list and all(type(v) in _PLAIN for v in value):  # a list of numbers
        if len(value) == len(sent) and all(a == b and type(a) is type(b) for a, b in zip(value, sent)):
            return None
        return list(value)
    if kind is torch.Tensor and tag == "tensor" and value.is_contiguous() and not value.requires_grad \
            and str(value.dtype)[6:] == sent["dtype"] and list(value.shape) == sent["shape"] \
            and tensor_bytes(value) == _get(sent_blobs, sent["blob"]):
        return None
    if kind is torch.Generator and tag == "generator":
        state = tensor_bytes(value.get_state())
        return None if state == _get(sent_blobs, sent["blob"]) else {"t": "generator", "blob": _blob(out, state)}
    mark = len(out)
    after = encode(value, out)
    if same(after, out, sent, sent_blobs):
        del out[mark:]
        return None
    return after


# ---- framing on a socket -----------------------------------------------------------------------------------------

def pack(message: dict, blobs: list) -> bytes:
    """One message as bytes: the JSON's length and the JSON, the number of blobs, each blob's length and bytes."""
    head = json.dumps(message).encode("utf-8")
    parts = [struct.pack(">II", len(head), len(blobs)), head]
    for b in blobs:
        parts += [struct.pack(">I", len(b)), b]
    return b"".join(parts)


def send(sock, message: dict, blobs: list | None = None) -> None:
    """Send one message (see :func:`pack`)."""
    sock.sendall(pack(message, blobs or []))


def receive(sock, limit: int = MAX_MESSAGE) -> tuple[dict, list]:
    """Receive one message and its blobs; raises ``ConnectionError`` when the other side closed, :class:`WireError`
    when the message is larger than ``limit`` in all or not a JSON object."""
    size, count = struct.unpack(">II", _exactly(sock, 8))
    if size > limit or count > limit // 4:
        raise WireError(f"a message of {size} bytes and {count} blobs (the limit is {limit} bytes)")
    try:
        message = json.loads(_exactly(sock, size).decode("utf-8"))
    except (ValueError, RecursionError) as e:
        raise WireError(f"not JSON ({type(e).__name__})") from None
    if not isinstance(message, dict):
        raise WireError("a message must be a JSON object")
    blobs, total = [], size
    for _ in range(count):
        n = struct.unpack(">I", _exactly(sock, 4))[0]
        total += n
        if total > limit:
            raise WireError(f"a message of more than {limit} bytes")
        blobs.append(_exactly(sock, n))
    return message, blobs


def _exactly(sock, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


__all__ = ["CostTable", "NextTokenTable", "WireError", "WrongType", "decode", "encode", "learner_line", "pack",
           "raised_info", "receive", "rng_state", "same", "send", "serve_call", "serve_map", "tensor_bytes", "tensor_from",
           "wrong_type"]
