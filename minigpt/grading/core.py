"""The machinery shared by every exercise's checks: cases with points, one printed line per case, a score.

An exercise (e.g. ``"attend_with_cache"``) is a list of cases registered by its grader module
(:mod:`.ex01`, ...). Each case is a function that receives the learner's function, calls it on inputs it
builds itself (seeded, so a verdict is reproducible), and either returns a short "what was received" text or
raises :class:`Mismatch` with what was expected and what was received.

The function a case receives is never the learner's own object but a :class:`~.proxy.LearnerFunction`: the
arguments go to the learner's side as plain data and only the returned values come back (:mod:`.wire`), so the
references and every comparison are computed here, with libraries no learner code touched. In a notebook,
:func:`check` calls the learner's function in the same process (the learner's own feedback); the grading
command, ``python -m minigpt.grade``, runs these same cases in its own process against a function that lives in
the learner's kernel (:mod:`.judge`). :func:`run_exercise` runs every case and returns a :class:`Result`:
the learner's exceptions become FAIL lines that name the error and the line of the learner's code (no
traceback), a learner's stub raising ``NotImplementedError`` becomes "not implemented yet".

Statistical cases compare empirical frequencies with the exact distribution through the total variation
distance TV = ½·Σ|p̂ − p| against :func:`minigpt.exactness.tv_bound` (the bound the lessons use), with
``delta`` one in a million: a correct function fails with probability below that -- and the checks are seeded,
so the verdict does not change between runs.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from ..exactness import tv_bound, tv_distance
from .proxy import KernelLost, LearnerError, LearnerFunction, in_process


class Mismatch(Exception):
    """Raised by a case when the learner's answer is wrong: what was expected, what was received."""

    def __init__(self, expected: str, received: str, hint: str | None = None):
        super().__init__(f"expected {expected}, received {received}")
        self.expected, self.received, self.hint = expected, received, hint


@dataclass
class Case:
    name: str
    points: int
    run: Callable  # run(fn) -> str describing what was received; raises Mismatch on a wrong answer
    hint: str = ""
    side: bool = False  # checks what a function that ignores its inputs also does (leaves them unchanged, ...)


@dataclass
class CaseResult:
    name: str
    status: str  # "pass", "fail", "error" (the learner's code raised) or "todo" (NotImplementedError)
    points: int
    max_points: int
    detail: str
    hint: str = ""
    expected: str = ""  # filled for a failed case: what the check expected ...
    received: str = ""  # ... and what the learner's function gave (for a pass: what it returned, in short)

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def line(self) -> str:
        mark = "PASS" if self.passed else "FAIL"
        text = f"{mark} [{self.points}/{self.max_points}] {self.name}: {self.detail}"
        if not self.passed and self.hint:
            text += f"  -- hint: {self.hint}"
        return text


@dataclass
class Result:
    """The outcome of :func:`check`: ``exercise`` (also ``name``), ``points``, ``max_points``, ``cases``.

    ``check`` has already printed its lines, so in a notebook the returned object does not display again
    (see ``_ipython_display_``); ``print(result)`` shows a one-line summary, ``as_dict()`` everything."""
    exercise: str
    points: int
    max_points: int
    cases: list[CaseResult] = field(default_factory=list)

    @property
    def full_marks(self) -> bool:
        return self.points == self.max_points

    @property
    def status(self) -> str:
        if self.full_marks:
            return "full marks"
        if self.cases and all(c.status == "todo" for c in self.cases):
            return "not implemented yet"
        failed = [c.name for c in self.cases if not c.passed]
        return f"{len(failed)} of {len(self.cases)} cases failed"

    @property
    def name(self) -> str:
        return self.exercise

    def as_dict(self) -> dict:
        return {"exercise": self.exercise, "points": self.points, "max": self.max_points, "status": self.status,
                "cases": [asdict(c) for c in self.cases]}

    def __str__(self) -> str:
        return f"{self.exercise}: {self.points}/{self.max_points} points ({self.status})"

    def lines(self) -> list[str]:
        """What :func:`check` prints: one line per case, then the score."""
        return [c.line() for c in self.cases] + [f"Score: {self.points}/{self.max_points} points"]

    def _ipython_display_(self) -> None:
        pass  # check() has already printed every line; showing the object again would only repeat them


class Exercise:
    """A named exercise: an ordered list of cases, each worth some points."""

    def __init__(self, name: str, notebook: str, summary: str):
        self.name, self.notebook, self.summary = name, notebook, summary
        self.cases: list[Case] = []
        if name in EXERCISES:
            raise ValueError(f"exercise {name!r} registered twice")
        EXERCISES[name] = self

    @property
    def max_points(self) -> int:
        return sum(c.points for c in self.cases)

    def case(self, name: str, points: int = 1, hint: str = "", side: bool = False):
        """Decorator: register ``run(fn) -> str`` as a case of this exercise. ``side=True`` for a case that a
        function ignoring its inputs passes too (it leaves them unchanged; an edge case whose answer is empty):
        it counts only when another case of the exercise passed."""
        def register(run: Callable) -> Callable:
            self.cases.append(Case(name, points, run, hint, side))
            return run
        return register


EXERCISES: dict[str, Exercise] = {}
RESULTS: list[Result] = []  # every result of this session, in order (the last one per exercise counts)


def _one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    msg = msg[0] if msg else ""
    if len(msg) > 160:
        msg = msg[:157] + "..."
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def run_case(case: Case, fn: Callable) -> CaseResult:
    """Run one case against ``fn`` (a :class:`~.proxy.LearnerFunction`; a plain function is wrapped by
    :func:`~.proxy.in_process`), turning every way the learner's code can go wrong into a one-line result.
    :class:`~.proxy.KernelLost` is not a result: it propagates (the judge then records nothing)."""
    if not isinstance(fn, LearnerFunction):
        fn = in_process(fn)
    try:
        with torch.random.fork_rng(devices=[]):  # cases seed the global RNG too; keep the caller's state
            torch.manual_seed(0)
            detail = case.run(fn)
        return CaseResult(case.name, "pass", case.points, case.points, detail or "ok", received=detail or "ok")
    except Mismatch as m:
        return CaseResult(case.name, "fail", 0, case.points, f"expected {m.expected}, received {m.received}",
                          m.hint if m.hint is not None else case.hint, str(m.expected), str(m.received))
    except LearnerError as e:
        if e.not_implemented:
            return CaseResult(case.name, "todo", 0, case.points, f"not implemented yet ({e.summary})",
                              "replace the `raise NotImplementedError` line with your code", "your code",
                              f"raise {e.summary}")
        return CaseResult(case.name, "error", 0, case.points, f"your function raised {e.summary}", e.hint(),
                          "a return value", f"an exception: {e.summary}")
    except KernelLost:
        raise
    except Exception as e:  # the check itself could not digest what came back (e.g. len() of a number)
        return CaseResult(case.name, "fail", 0, case.points, f"the answer could not be checked ({_one_line(e)})",
                          case.hint or "return what the docstring describes (types, shapes, lengths)",
                          "an answer of the type the docstring describes", f"one the check failed on: "
                          f"{_one_line(e)}")


def run_exercise(exercise: str, fn: Callable) -> Result:
    """Every case of ``exercise`` against ``fn`` (see :func:`run_case`); prints nothing, records nothing. A side
    case (see :meth:`Exercise.case`) that passed counts only if a case that is not one passed too, so a function
    returning a constant earns nothing for leaving its inputs alone."""
    ex = EXERCISES[exercise]
    results = [run_case(case, fn) for case in ex.cases]
    if not any(r.passed for r, c in zip(results, ex.cases) if not c.side):
        results = [CaseResult(r.name, "fail", 0, r.max_points, f"not counted: {r.detail} -- but no other case of "
                              "this exercise passed", "this case checks what a function that ignores its inputs "
                              "also does; it counts once your function computes an answer",
                              "another case passed as well", r.detail) if c.side and r.passed else r
                   for r, c in zip(results, ex.cases)]
    return Result(exercise, sum(r.points for r in results), ex.max_points, results)


def check(exercise: str, fn: Callable, *, verbose: bool = True) -> Result:
    """Grade ``fn`` against the cases of ``exercise``; print one line per case and the score.

    Returns a :class:`Result` (exercise, points, max_points, cases) and records it in ``RESULTS``. This is the
    learner's feedback: it runs ``fn`` in this process. The grading command does not use it (nor parse what it
    prints): it runs the same cases in a process of its own (:mod:`.judge`)."""
    if exercise not in EXERCISES:
        raise KeyError(f"unknown exercise {exercise!r}; known: {', '.join(sorted(EXERCISES))}")
    if not callable(fn):
        raise TypeError(f"check({exercise!r}, fn) needs your function as fn, got {type(fn).__name__}")
    result = run_exercise(exercise, in_process(fn))
    RESULTS.append(result)
    if verbose:
        for line in result.lines():
            print(line)
    return result


# ---- helpers the graders share: turn "the learner returned garbage" into a clear Mismatch ----------------

def fmt_shape(t) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def expect_tensor(name: str, got, shape: tuple[int, ...]) -> torch.Tensor:
    """``got`` must be a finite floating tensor of ``shape``; returns it (on the CPU)."""
    if not isinstance(got, torch.Tensor):
        raise Mismatch(f"{name} as a torch.Tensor of shape {tuple(shape)}", f"a {type(got).__name__}")
    if tuple(got.shape) != tuple(shape):
        raise Mismatch(f"{name} of shape {tuple(shape)}", f"shape {tuple(got.shape)}")
    got = got.detach().cpu()
    if got.is_floating_point() and not bool(torch.isfinite(got).all()):
        bad = "NaN" if bool(torch.isnan(got).any()) else "inf"
        raise Mismatch(f"finite numbers in {name}", f"{bad} values")
    return got


def expect_close(name: str, got, ref: torch.Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> float:
    """``got`` must match ``ref`` elementwise; returns the largest absolute difference."""
    got = expect_tensor(name, got, tuple(ref.shape)).to(ref.dtype)
    ref = ref.detach().cpu()
    diff = float((got - ref).abs().max()) if ref.numel() else 0.0
    if not torch.allclose(got, ref, atol=atol, rtol=rtol):
        i = int((got - ref).abs().flatten().argmax())
        raise Mismatch(f"{name} = reference (max |diff| <= {atol:g})",
                       f"max |diff| {diff:.3g} (e.g. element {i}: {float(ref.flatten()[i]):.4g} expected, "
                       f"{float(got.flatten()[i]):.4g} received)")
    return diff


def expect_number(name: str, got, ref: float, rel: float = 1e-9) -> float:
    """``got`` must be a real number (int, float, numpy scalar or 0-d tensor) within ``rel`` of ``ref``."""
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        raise Mismatch(f"{name} as a number", f"a {type(got).__name__} ({str(got)[:40]!r})")
    got = float(got)
    if math.isnan(got):
        raise Mismatch(f"{name} = {ref:.6g}", "NaN")
    if not math.isclose(got, ref, rel_tol=rel, abs_tol=1e-300):
        raise Mismatch(f"{name} = {ref:.6g}", f"{got:.6g} ({got / ref:.4g}x the expected value)"
                       if ref and math.isfinite(got) else f"{got:.6g}")
    return got


def expect_token_list(name: str, got) -> list[int]:
    """``got`` must be a list or tuple of integer token ids; returns it as a list of Python ints."""
    if not isinstance(got, (list, tuple)):
        raise Mismatch(f"{name} as a list of ints", f"a {type(got).__name__}",
                       "return a Python list of ints (convert tensors with int(...) or .tolist())")
    for t in got:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise Mismatch(f"{name} as a list of ints", f"an element of type {type(t).__name__} ({t!r})",
                           "append int(token) rather than a tensor or a float")
    return [int(t) for t in got]


def frequencies(counts: torch.Tensor) -> torch.Tensor:
    """Empirical frequencies from counts (float64)."""
    counts = counts.double()
    return counts / counts.sum()


def expect_distribution(name: str, samples, probs: torch.Tensor, delta: float = 1e-6) -> str:
    """Empirical frequencies of integer ``samples`` must be within ``tv_bound`` of ``probs`` (V,): k is the number
    of outcomes with p > 0 (plus one when samples fell outside that support)."""
    samples = torch.as_tensor(samples, dtype=torch.long)
    V = probs.numel()
    if samples.numel() and (int(samples.min()) < 0 or int(samples.max()) >= V):
        raise Mismatch(f"{name} in 0..{V - 1}", f"value {int(samples.max())}")
    counts = torch.bincount(samples, minlength=V)
    k = int((probs > 0).sum()) + int(((counts > 0) & (probs == 0)).any())
    tv, bound = tv_distance(frequencies(counts), probs), tv_bound(samples.numel(), max(k, 2), delta)
    if tv > bound:
        freq = counts.double() / counts.sum()
        raise Mismatch(f"{name} distributed as {fmt_probs(probs)} (TV <= {bound:.3f} over {samples.numel()} "
                       f"samples)", f"{fmt_probs(freq)} (TV {tv:.3f})")
    return f"TV {tv:.3f} <= {bound:.3f} over {samples.numel()} samples"


def fmt_probs(p: torch.Tensor) -> str:
    return "[" + ", ".join(f"{float(x):.2f}" for x in p) + "]"
