"""The kernel side of ``python -m minigpt.grade``: the learner's functions answer the judge's calls.

The grading command runs, before any cell of the submission, one cell of its own::

    import minigpt.grading.session as _s; _s.start("/tmp/.../handshake.json"); del _s

:func:`start` reads the handshake file (a token made for this run, the output cap, the name to bind, an optional
memory limit) and deletes it, caps what each cell can print (``sys.stdout`` / ``sys.stderr``, ``stream_limit``
characters per cell), and binds one callable under a per-run name in the notebook's namespace. The grader runs
each restored check cell through it: ``<name>(cell_number, "<the release's check cell>", "<address>")``. It
executes the release's source with ``check`` bound, for that cell only, to a function that connects to the
judge at ``address`` (a socket the judge opened for this cell), names the exercise, and then only answers: for
each call the judge sends, it calls the learner's function on the inputs received and sends back the value it
returned as plain data (:func:`.wire.serve_call`). When the judge is done it sends the lines to print.

Nothing here computes a verdict, and nothing the learner's code does in this process can reach the judge except
the values its functions return: the references, the comparisons and the score live in the judge's process
(:mod:`.judge`). This module imports only :mod:`.wire`, not the graders.
"""
from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Callable

import torch

from . import wire

try:
    import resource
except ImportError:  # Windows: no address-space limit
    resource = None


class CappedStream:
    """Forwards writes to ``stream`` until ``limit`` characters were written in the current cell; drops the rest
    (with one note), so a cell that prints megabytes in a loop costs neither the kernel nor the grader memory."""

    def __init__(self, stream, limit: int):
        self._stream, self._limit, self._written, self._noted = stream, limit, 0, False

    def reset(self, *_args) -> None:
        self._written, self._noted = 0, False

    def write(self, text: str) -> int:
        room = self._limit - self._written
        n = len(text)
        if room > 0:
            self._stream.write(text[:room])
        elif not self._noted:
            self._noted = True
            self._stream.write(f"\n[the grader dropped this cell's further output: more than {self._limit} "
                               "characters]\n")
        self._written += n
        return n

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def __setattr__(self, name, value):
        # IPython 9 patches ``sys.stdout.write`` during each cell to keep a copy of everything printed in its
        # history (``history_manager.outputs``): that copy would hold every byte the cap drops. Refuse it.
        if name != "write":
            object.__setattr__(self, name, value)


def connect(address: str) -> socket.socket:
    """A connection to the judge: ``unix:<path>`` or ``tcp:<host>:<port>``."""
    kind, _, rest = address.partition(":")
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(rest)
    else:
        host, _, port = rest.rpartition(":")
        sock = socket.create_connection((host, int(port)))
    return sock


def answer(address: str, token: str, cell: int, exercise: str, fn: Callable) -> None:
    """Serve the judge's calls of ``exercise`` with ``fn`` until it is done; print the lines it sends."""
    saved = torch.get_rng_state()  # the learner's global RNG is the judge's during the check, theirs again after
    try:
        with connect(address) as sock:
            wire.send(sock, {"token": token, "cell": cell, "exercise": exercise})
            while True:
                message, blobs = wire.receive(sock)
                if message.get("op") == "call":
                    wire.send(sock, *wire.serve_call(fn, message, blobs))
                elif message.get("op") == "map":
                    wire.send(sock, *wire.serve_map(fn, message, blobs))
                else:
                    for line in message.get("lines", []):
                        print(line)
                    return
    except (OSError, wire.WireError) as e:
        print(f"the grader's connection for {exercise} broke ({type(e).__name__})")
    finally:
        torch.set_rng_state(saved)


def _limit_memory(megabytes: int) -> None:
    if resource is None:
        return
    limit = int(megabytes) * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # hard limit too: learner code cannot raise it back


def start(handshake: str) -> None:
    """Set up grading in this kernel (see the module docstring). Called once, before any learner code."""
    path = Path(handshake)
    config = json.loads(path.read_text(encoding="utf-8"))
    path.unlink()
    token = str(config["token"])
    if config.get("memory_limit_mb"):
        _limit_memory(config["memory_limit_mb"])

    shell = get_ipython()  # noqa: F821  (defined in an IPython kernel, where this runs)
    limit = int(config["stream_limit"])
    streams = [CappedStream(sys.stdout, limit), CappedStream(sys.stderr, limit)]
    sys.stdout, sys.stderr = streams
    for stream in streams:
        shell.events.register("pre_run_cell", stream.reset)

    def run_check_cell(cell: int, source: str, address: str) -> None:
        namespace = shell.user_ns
        had, previous = "check" in namespace, namespace.get("check")

        def check(exercise: str, fn: Callable, *, verbose: bool = True) -> None:
            if not callable(fn):
                raise TypeError(f"check({exercise!r}, fn) needs your function as fn, got {type(fn).__name__}")
            answer(address, token, cell, str(exercise), fn)

        namespace["check"] = check
        try:
            exec(compile(source, f"<check cell {cell}>", "exec"), namespace)  # e.g. NameError: not defined
        finally:
            if had:
                namespace["check"] = previous
            else:
                namespace.pop("check", None)

    shell.user_ns[config["name"]] = run_check_cell
