"""Small compiled kernels, built on first use with the machine's C compiler and loaded with ctypes.

One library so far, ``invariant.c``: the row-invariant products of 4-bit (:class:`minigpt.quant.W4A8Linear`) and
8-bit weights (:class:`minigpt.quant.Q8A8Linear`, the output layer) with 8-bit activations that the "w4a8"
precision runs on, and attention computed one query row at a time in an
order that depends on that row alone (:class:`minigpt.precision.InvariantAttention` on that path). PyTorch offers
no such product on a CPU: its weight-only int4 kernel works row by row (a pass over 17 tokens costs about six
one-token passes), and an integer matmul takes 8-bit weights only; and its attention, made row-invariant, costs a
few small calls per query row. The source is plain C (no PyTorch headers), so it compiles in about a second; the
library is cached under ``$MINIGPT_CACHE`` (default ``~/.cache/minigpt``), keyed by the source, the flags and the
machine, and built with ``-march=native`` for the CPU it runs on. Without a C compiler :func:`library` raises
:class:`KernelUnavailable` with one sentence saying so; every other precision needs nothing compiled.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
_loaded: dict[str, ctypes.CDLL] = {}


class KernelUnavailable(RuntimeError, ValueError):
    """A compiled kernel could not be built or loaded here (the message says why, in one line). A ValueError too,
    so the command-line tools print it as the one-line error they give for any other bad setting."""


def _cache_dir() -> Path:
    root = Path(os.environ.get("MINIGPT_CACHE") or Path.home() / ".cache" / "minigpt") / "kernels"
    try:
        root.mkdir(parents=True, exist_ok=True)
        return root
    except OSError:
        fallback = Path(tempfile.gettempdir()) / "minigpt-kernels"
        fallback.mkdir(parents=True, exist_ok=True)
        return fallback


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


def _build(name: str) -> Path:
    source = HERE / f"{name}.c"
    cc = _compiler()
    if cc is None:
        raise KernelUnavailable(f"the w4a8 path's kernels (minigpt/kernels/{name}.c) need a C compiler (cc, gcc or "
                                f"clang; or set CC), and none is here")
    flags = ["-O3", "-shared", "-fPIC", "-std=c99"]
    # -march=native lets the compiler use this CPU's vector instructions (AVX-512 VNNI turns on the vector code);
    # MINIGPT_KERNELS_PORTABLE=1 builds the plain C loops instead (the tests check that road too)
    native = [] if os.environ.get("MINIGPT_KERNELS_PORTABLE") else ["-march=native"]
    key = hashlib.sha256(source.read_bytes() + " ".join([cc, *flags, *native, platform.machine(),
                                                          platform.node()]).encode())
    target = _cache_dir() / f"{name}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    # OpenMP where the compiler has it (more than one thread then splits the work); a compiler that knows no
    # -march=native (some on ARM) builds the plain loops
    for extra in ([*native, "-fopenmp"], native, ["-fopenmp"], []):
        done = subprocess.run([cc, *flags, *extra, str(source), "-o", str(tmp), "-lm"], capture_output=True, text=True)
        if done.returncode == 0:
            os.replace(tmp, target)
            return target
    first = (done.stderr.strip().splitlines() or ["no message"])[0]
    raise KernelUnavailable(f"minigpt/kernels/{name}.c did not compile with {cc}: {first}")


def library() -> ctypes.CDLL:
    """The loaded ``invariant.c`` library (built on first use); :class:`KernelUnavailable` if it cannot be."""
    if "invariant" not in _loaded:
        try:
            lib = ctypes.CDLL(str(_build("invariant")))
        except OSError as e:
            raise KernelUnavailable(f"the invariant kernels were built but do not load: {e}") from None
        p, i = ctypes.c_void_p, ctypes.c_int
        lib.w4a8_linear.argtypes = [i, i, i, p, p, p, p, p, i]
        lib.q8a8_linear.argtypes = [i, i, i, p, p, p, p, i]
        lib.attend_rows.argtypes = [i, i, i, i, i, i, p, p, p, p, p, p, ctypes.c_float, p, i]
        for f in (lib.w4a8_linear, lib.q8a8_linear, lib.attend_rows, lib.w4a8_vector_path):
            f.restype = ctypes.c_int
        _loaded["invariant"] = lib
    return _loaded["invariant"]


def describe() -> str:
    """Which road the compiled kernels take on this CPU: "avx512-vnni" (the vector code) or "portable C" (the plain
    loops: the same formula and order of sums, much slower)."""
    return "avx512-vnni" if library().w4a8_vector_path() else "portable C"


def available() -> bool:
    """Whether the compiled kernels build and load here."""
    try:
        library()
        return True
    except KernelUnavailable:
        return False
