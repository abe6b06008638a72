"""The kernel side of ``python -m minigpt.grade``: a private grader inside the notebook's kernel.

The grading command runs, before any cell of the submission, one cell of its own::

    import minigpt.grading.session as _s; _s.start("/tmp/.../handshake.json"); del _s

:func:`start` reads the handshake file (a secret made for this run, the path of a results file, the output cap,
the name to bind) and deletes it, then

* loads a **private copy** of the grading package (:func:`private_grading`): its ``check``, its registry of
  exercises and its cases are module objects that no name in the notebook points to, so reassigning
  ``minigpt.grading.check`` or ``minigpt.grading.core.check``, or redefining ``check`` in the notebook, does
  not reach them;
* binds one callable under a per-run name in the notebook's namespace. The grader runs each restored check cell
  through it: ``<name>(cell_number, "<the release's source of the check cell>")``. It executes that source with
  ``check`` bound to the private check for the duration of the cell, and appends one line per result to the
  results file: the result as JSON and an HMAC-SHA256 of it under the secret. The grading command accepts a
  line only if its HMAC verifies and it names the check cell that was running when it was written;
* caps what a cell can print (``sys.stdout`` / ``sys.stderr``) to ``stream_limit`` characters per cell.

This is a defence against a learner's notebook forging a score by the obvious means (printing a result line,
redefining ``check``, patching the public grading module, editing the check cell). It is not a sandbox: the
learner's code runs in this same process and could, with effort, find the secret in memory, patch the library
functions the checks compare against, or patch torch. docs/grading.md says what is and is not protected.
"""
from __future__ import annotations

import hashlib
import hmac
import importlib.util
import json
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Callable


def sign(secret: bytes, payload: str) -> str:
    """The HMAC-SHA256 (hex) of one result line's payload under the run's secret."""
    return hmac.new(secret, payload.encode("utf-8"), hashlib.sha256).hexdigest()


def private_grading(tag: str) -> ModuleType:
    """A fresh copy of ``minigpt.grading`` (its core, its exercise modules, their cases), not in ``sys.modules``.

    It is loaded as ``minigpt._grading_<tag>`` so that its relative imports of the library (``..decoding``)
    resolve to the shared ``minigpt`` modules, and removed from ``sys.modules`` once loaded."""
    here = Path(__file__).resolve().parent
    name = f"minigpt._grading_{tag}"
    spec = importlib.util.spec_from_file_location(name, here / "__init__.py", submodule_search_locations=[str(here)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
    return module


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


def start(handshake: str) -> None:
    """Set up grading in this kernel (see the module docstring). Called once, before any learner code."""
    path = Path(handshake)
    config = json.loads(path.read_text(encoding="utf-8"))
    path.unlink()
    secret = bytes.fromhex(config["secret"])
    results = open(config["results"], "a", encoding="utf-8")  # noqa: SIM115  (kept open for the whole run)
    grading = private_grading(config["tag"])
    private_check: Callable = grading.core.check

    shell = get_ipython()  # noqa: F821  (defined in an IPython kernel, where this runs)
    limit = int(config["stream_limit"])
    streams = [CappedStream(sys.stdout, limit), CappedStream(sys.stderr, limit)]
    sys.stdout, sys.stderr = streams
    for stream in streams:
        shell.events.register("pre_run_cell", stream.reset)

    # bound now, before any learner code runs: patching json.dumps or hmac.new later changes nothing here
    dumps, new_mac, sha256, write, flush = json.dumps, hmac.new, hashlib.sha256, results.write, results.flush
    main_thread, current_thread = threading.main_thread(), threading.current_thread
    run_exec, run_compile = exec, compile

    def record(payload: dict) -> None:
        text = dumps(payload, sort_keys=True)
        write(dumps({"payload": text, "mac": new_mac(secret, text.encode("utf-8"), sha256).hexdigest()}) + "\n")
        flush()

    busy = []  # non-empty while a check runs: a check called from inside the learner's function is refused
    done: set[int] = set()  # each check cell runs once: a second call for the same cell records nothing

    def run_check_cell(cell: int, source: str) -> None:
        if cell in done or current_thread() is not main_thread:
            raise RuntimeError("this check cell has already run")
        done.add(cell)
        namespace = shell.user_ns
        had, previous = "check" in namespace, namespace.get("check")

        def check(exercise: str, fn: Callable, *, verbose: bool = True):
            if busy or current_thread() is not main_thread:
                raise RuntimeError("check() cannot be called while a check is running")
            busy.append(exercise)
            try:
                result = private_check(exercise, fn, verbose=verbose)
            finally:
                busy.pop()
            record({"cell": cell, "exercise": exercise, "result": result.as_dict()})
            return result

        namespace["check"] = check
        try:
            run_exec(run_compile(source, f"<check cell {cell}>", "exec"), namespace)
        except Exception as e:  # e.g. NameError: the learner's function is not defined
            lines = str(e).strip().splitlines()
            message = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
            print(f"the check cell raised {message}")
            record({"cell": cell, "error": message})
        finally:
            if had:
                namespace["check"] = previous
            else:
                namespace.pop("check", None)

    shell.user_ns[config["name"]] = run_check_cell
