"""The judge: the grading command's end of a check, in a process that never runs learner code.

For each check cell of a submission, the grading command (:mod:`minigpt.grade`) opens a fresh socket
(:meth:`Judge.open_cell`) and runs the release's check cell in the learner's kernel, where ``check(name, fn)``
connects to it (:mod:`.session`). The judge then runs the exercise's cases here: each case builds its inputs with
the judge's seeds, calls the learner's function through the connection (:class:`~.proxy.RemoteFunction`: the
inputs go out as plain data, the returned values come back as plain data, :mod:`.wire`), and compares what came
back with references it computes itself. So a learner cell that patches ``math.isclose``, ``torch.allclose``,
``builtins.abs``, the graders or ``check`` changes nothing here, an object that "equals anything" arrives as a
wrong type, and printed text is never read. The judge keeps the first complete result per exercise of the cell;
an exercise whose connection broke mid-way (a kernel that died or ran out of time) gets no result.
"""
from __future__ import annotations

import secrets
import socket
import threading
from pathlib import Path

from . import wire
from .core import run_exercise
from .proxy import KernelLost, RemoteFunction


class Judge:
    """One notebook's judge. ``results`` maps exercise -> ``Result.as_dict()``; ``notes`` says what was refused."""

    def __init__(self, folder: Path, token: str):
        self.folder, self.token = Path(folder), token
        self.results: dict[str, dict] = {}
        self.notes: list[str] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._conn: socket.socket | None = None
        self._path: Path | None = None

    def open_cell(self, cell: int, label: str, names: list[str]) -> str:
        """Listen for the check cell ``cell`` (which checks ``names``); returns the address to give it."""
        self.close_cell()
        self._stop = threading.Event()
        if hasattr(socket, "AF_UNIX"):
            self._path = self.folder / f"check-{cell}-{secrets.token_hex(4)}.sock"
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(self._path))
            address = f"unix:{self._path}"
        else:  # Windows: loopback TCP, guarded by the token like the socket file is by its folder
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            address = f"tcp:127.0.0.1:{listener.getsockname()[1]}"
        listener.listen(4)
        listener.settimeout(0.1)
        self._listener = listener
        self._thread = threading.Thread(target=self._serve, args=(listener, cell, label, list(names)), daemon=True)
        self._thread.start()
        return address

    def close_cell(self) -> None:
        """Stop listening; break off a check still running (its kernel timed out or died): it records nothing."""
        self._stop.set()
        conn = self._conn
        if conn is not None:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._listener is not None:
            self._listener.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
        self._thread = self._listener = self._conn = self._path = None

    def _serve(self, listener: socket.socket, cell: int, label: str, names: list[str]) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                return
            self._conn = conn
            try:
                conn.settimeout(None)
                self._check(conn, cell, label, names)
            except (OSError, wire.WireError, KernelLost):
                pass  # the kernel went away or sent garbage: nothing recorded for this connection
            finally:
                self._conn = None
                conn.close()

    def _check(self, conn: socket.socket, cell: int, label: str, names: list[str]) -> None:
        hello, _ = wire.receive(conn, limit=4096)
        exercise = str(hello.get("exercise", ""))
        if not secrets.compare_digest(str(hello.get("token", "")), self.token):
            wire.send(conn, {"op": "done", "lines": ["the grader refused this connection"]})
            return
        if exercise not in names:
            self.notes.append(f"{label} asked for a check of {exercise!r}, which it does not check: ignored")
            wire.send(conn, {"op": "done", "lines": [f"{label} does not check {exercise!r}"]})
            return
        if exercise in self.results:
            wire.send(conn, {"op": "done", "lines": [f"{exercise} was already graded in this run"]})
            return

        def channel(call: dict, blobs: list) -> tuple[dict, list]:
            try:
                wire.send(conn, {"op": "call", **call} if "op" not in call else call, blobs)
                return wire.receive(conn)
            except (OSError, wire.WireError) as e:
                raise KernelLost(f"{type(e).__name__}: {e}") from None

        result = run_exercise(exercise, RemoteFunction(channel))  # KernelLost propagates: nothing recorded
        self.results[exercise] = result.as_dict()
        try:
            wire.send(conn, {"op": "done", "lines": result.lines()})
        except OSError:
            pass
