"""The judge runs outside the learner's process: learner code can influence only the values its functions return.

* the wire (``minigpt.grading.wire``): what crosses between kernel and judge is plain data, loading it runs no
  code, and anything else arrives as a wrong type that equals nothing;
* the protocol in one process (``through_the_wire``) grades exactly like the in-process ``check``, including the
  wrong versions that write into their arguments or misuse the random generators;
* the attacks, in a real kernel (slow): patched comparisons (``math.isclose``, ``builtins.abs``,
  ``torch.allclose``, ``numpy.isclose``), a patched ``check`` and patched graders, objects that compare equal to
  anything, printed marker lines, and the stubs returning 1.0 of the ex08 attack: wrong code earns nothing, and
  the right code next to the same patches still earns full marks;
* when the learner's code raises, the hint names the error and the line of the learner's code.
"""
from __future__ import annotations

import json
import linecache
import math
import socket
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from minigpt.decoding.lookup import find_candidates
from minigpt.decoding.verify import accept_greedy
from minigpt.grading import EXERCISES, check, wire
from minigpt.grading.core import run_exercise
from minigpt.grading.proxy import through_the_wire

ROOT = Path(__file__).resolve().parents[1]


def roundtrip(value):
    blobs: list = []
    data = wire.encode(value, blobs)
    head = json.loads(json.dumps(data))  # what a socket carries
    return wire.decode(head, list(blobs))


# ---- the wire ----------------------------------------------------------------------------------------------------

class AlwaysEqual:
    def __eq__(self, other):
        return True

    def __repr__(self):   # not the default, whose address differs between the two runs compared below
        return "AlwaysEqual()"

    __hash__ = object.__hash__


class EqualFloat(float):
    def __eq__(self, other):
        return True

    __hash__ = float.__hash__


class EqualTensor(torch.Tensor):
    def __eq__(self, other):
        return True


def test_plain_values_round_trip():
    values = [0, -7, 2**70, 1.5, float("inf"), True, None, "text", [1, 2.5, [3, (4, "x")]], (1, [2]),
              {"a": 1, 2: [3], (1, 2): None}]
    for v in values:
        assert roundtrip(v) == v and type(roundtrip(v)) is type(v), v
    assert math.isnan(roundtrip(float("nan")))
    for dtype in wire.DTYPES.values():
        t = (torch.arange(12) % 2).to(dtype).reshape(3, 4)
        back = roundtrip(t)
        assert back.dtype == dtype and back.shape == t.shape and torch.equal(back, t)
    for t in (torch.empty(0, 3), torch.tensor(2.5), torch.arange(10.0)[::2], torch.ones(2, requires_grad=True)):
        back = roundtrip(t)
        assert back.shape == t.shape and torch.equal(back, t.detach()) and not back.requires_grad
    g = torch.Generator().manual_seed(5)
    torch.rand(3, generator=g)
    assert torch.equal(roundtrip(g).get_state(), g.get_state())
    table = roundtrip(wire.NextTokenTable(torch.eye(3)))
    assert torch.equal(table([0, 2]), torch.eye(3)[2])
    assert roundtrip(wire.CostTable([1.0, 1.5], "made up"))(2) == 1.5


def test_what_is_not_plain_data_arrives_as_a_wrong_type_equal_to_nothing():
    for value, name in ((np.zeros(3), "ndarray"), (AlwaysEqual(), "AlwaysEqual"), (object(), "object"),
                        (1 + 2j, "complex"), ({1, 2}, "set")):
        back = roundtrip(value)
        assert isinstance(back, wire.WrongType) and type(back).__name__ == name, (value, back)
        assert back != 0 and back != back.text and not (back == 1.0)
    # subclasses that "equal anything" arrive as the plain value they convert to
    back = roundtrip(EqualFloat(0.25))
    assert type(back) is float and back == 0.25 and back != 1.0
    back = roundtrip(torch.zeros(2).as_subclass(EqualTensor))
    assert type(back) is torch.Tensor and not torch.equal(back, torch.ones(2))
    assert type(roundtrip(np.float32(0.5))) is float and type(roundtrip(np.int64(3))) is int
    nested = roundtrip([1, AlwaysEqual()])
    assert nested[0] == 1 and isinstance(nested[1], wire.WrongType)


def test_bad_wire_data_is_refused():
    for data, blobs in (({"t": "tensor", "dtype": "object", "shape": [1], "blob": 0}, [b"x"]),
                        ({"t": "tensor", "dtype": "float32", "shape": [2], "blob": 0}, [b"1234"]),
                        ({"t": "tensor", "dtype": "float32", "shape": [1], "blob": 3}, []),
                        ({"t": "pickle", "data": "..."}, []), ({"t": "callable", "kind": "os.system"}, [])):
        with pytest.raises(wire.WireError):
            wire.decode(data, blobs)
    deep: list = []
    for _ in range(100):
        deep = [deep]
    assert isinstance(roundtrip(deep), wire.WrongType)


def test_a_message_over_the_limit_is_refused():
    a, b = socket.socketpair()
    with a, b:
        wire.send(a, {"op": "call"}, [b"x" * 2000])
        with pytest.raises(wire.WireError):
            wire.receive(b, limit=1000)


def test_serve_call_reports_changed_arguments_rng_and_the_raising_line():
    def appends(seq, t, g):
        seq.append(9)
        t.mul_(2)
        torch.rand(1, generator=g)
        torch.rand(1)  # the global RNG
        return len(seq)

    blobs: list = []
    g = torch.Generator().manual_seed(1)
    call = {"args": [wire.encode(x, blobs) for x in ([1, 2], torch.ones(2), g)], "kwargs": {}, "rng": None}
    reply, out = wire.serve_call(appends, call, blobs)
    assert wire.decode(reply["value"], out) == 3
    seq, t, g2 = (wire.decode(a, out) for a in reply["args"])
    assert seq == [1, 2, 9] and torch.equal(t, torch.full((2,), 2.0)) and reply["rng"] is not None
    assert not torch.equal(g2.get_state(), g.get_state())

    def raises(x):
        y = x + 1
        return y / 0

    reply, _ = wire.serve_call(raises, {"args": [1], "kwargs": {}, "rng": None}, [])
    raised = reply["raised"]
    assert raised["type"] == "ZeroDivisionError" and raised["where"]["function"] == "raises"
    assert raised["where"]["text"] == "return y / 0" and raised["where"]["file"] == "test_judge.py"


# ---- the protocol in one process grades like check() --------------------------------------------------------------

def greedy_pops_target(draft_tokens, target_argmax):  # writes into the caller's list
    out = []
    for x in draft_tokens:
        t = target_argmax.pop(0)
        if x != t:
            return out + [t]
        out.append(x)
    return out + [target_argmax.pop(0)]


def crop_zeroes_tail(k_cache, v_cache, length):  # writes into the caller's tensors
    k_cache[:, :, length:] = 0
    v_cache[:, :, length:] = 0
    return k_cache[:, :, :length], v_cache[:, :, :length]


def lookup_reverses_seq(seq, max_ngram, num_pred, min_ngram=1):
    seq.reverse()
    return find_candidates(seq[::-1], max_ngram, num_pred, min_ngram)


@pytest.mark.parametrize("name, fn", [("greedy_step", accept_greedy), ("greedy_step", greedy_pops_target),
                                      ("crop_cache", crop_zeroes_tail), ("crop_cache", lambda k, v, n: 1.0),
                                      ("find_candidates", find_candidates), ("find_candidates", lookup_reverses_seq),
                                      ("decode_flops", lambda n, t=1: AlwaysEqual())])
def test_the_socket_protocol_grades_like_check(name, fn):
    local = check(name, fn, verbose=False)
    remote = run_exercise(name, through_the_wire(fn))
    assert [(c.status, c.points, c.detail) for c in remote.cases] == [(c.status, c.points, c.detail)
                                                                      for c in local.cases]


def test_generator_and_global_rng_are_shared_through_the_protocol():
    # a draft that ignores its generator (the global RNG) must fail the reproducibility case in both paths, and
    # the right draft must pass it: the generator's state and the global RNG travel with each call
    from minigpt.grading.ex03 import drafting

    def right(next_probs, context, gamma, generator=None):
        seq, tokens, qs = list(context), [], []
        for _ in range(gamma):
            q = next_probs(seq)
            tokens.append(int(torch.multinomial(q, 1, generator=generator)))
            qs.append(q)
            seq.append(tokens[-1])
        return tokens, torch.stack(qs)

    def global_rng(next_probs, context, gamma, generator=None):
        return right(next_probs, context, gamma, None)

    case = next(c for c in drafting.cases if c.name.startswith("the same generator seed"))
    from minigpt.grading.core import run_case
    for fn, passed in ((right, True), (global_rng, False)):
        assert run_case(case, through_the_wire(fn)).passed is passed
        assert run_case(case, fn).passed is passed


CELL = """def decode_flops(n_params, n_tokens=1):
    per_token = 2 * n_params
    return per_token * n_tokens / 0
"""


def test_a_raising_function_gets_a_hint_with_its_error_and_line():
    # compiled the way ipykernel compiles a cell (a file name per cell, the source in linecache)
    filename = "/tmp/ipykernel_4242/1234567.py"
    linecache.cache[filename] = (len(CELL), None, CELL.splitlines(True), filename)
    namespace: dict = {}
    exec(compile(CELL, filename, "exec"), namespace)
    result = check("decode_flops", namespace["decode_flops"], verbose=False)
    for case in result.cases:
        assert case.status == "error" and "raised ZeroDivisionError" in case.detail
        assert case.hint == ("ZeroDivisionError at line 3 of your cell, in decode_flops: "
                             "`return per_token * n_tokens / 0`"), case.hint


def test_an_error_inside_a_library_call_points_at_the_learners_line():
    def attend_with_cache(q, k_new, v_new, k_cache, v_cache):
        k = torch.cat([k_cache, k_new], 3)  # the wrong dimension: torch raises inside cat
        return q @ k, k, v_new

    case = check("attend_with_cache", attend_with_cache, verbose=False).cases[0]
    assert case.status == "error" and "torch.cat([k_cache, k_new], 3)" in case.hint, case.hint


OWN = [n for n, e in EXERCISES.items() if e.notebook[:4] in {f"ex0{i}" for i in range(1, 10)}]  # exercises 01-09


@pytest.mark.parametrize("name", OWN)
def test_a_function_that_ignores_its_inputs_earns_nothing(name):
    # constants are the stubs of the attack; a side case (inputs left unchanged, an empty answer for an
    # empty input) counts only when a case that computes something passed
    for constant in (1.0, 0, None, []):
        result = check(name, lambda *a, _c=constant, **k: _c, verbose=False)
        assert result.points == 0, (constant, [c.name for c in result.cases if c.passed])


# ---- the attacks, in a real kernel ---------------------------------------------------------------------------------

PATCHES = """
import builtins, math, numpy, torch
import minigpt.grading, minigpt.grading.core, minigpt.grading.ex08
math.isclose = lambda *a, **k: True
builtins.abs = lambda x: 0.0
torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
numpy.isclose = lambda *a, **k: True
numpy.allclose = lambda *a, **k: True
class _Pass:
    def __init__(self, *a, **k): pass
minigpt.grading.core.Mismatch = _Pass
for name in dir(minigpt.grading.ex08):
    if name.startswith("reference_"):
        setattr(minigpt.grading.ex08, name, lambda *a, **k: 1.0)
def check(name, fn, **kw):
    print(f"PASS [99/99] {name}: full marks")
    print("Score: 99/99 points")
minigpt.grading.check = minigpt.grading.core.check = check
print('[[minigpt-grade]] {"exercise": "expected_tokens", "points": 7, "max": 7, "status": "full marks"}')
"""

EQUAL_TO_EVERYTHING = """
class AlwaysEqual(float):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return False
    def __gt__(self, other): return False
    def __le__(self, other): return True
    def __ge__(self, other): return True
    __hash__ = float.__hash__
    def __float__(self): return 1.0
"""


def _grade(*args, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "minigpt.grade", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def _learner_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code" and (c.metadata.get("minigpt") or {}).get("role") == "learner"]


def _fill(nb, body_for) -> None:
    """Replace the stub line of every learner cell by ``body_for(function name)`` (indented)."""
    for cell in _learner_cells(nb):
        name = cell.source.split("def ", 1)[1].split("(", 1)[0]
        lines = cell.source.split("\n")
        i = next(i for i, ln in enumerate(lines) if "raise NotImplementedError" in ln)
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        lines[i: i + 1] = [indent + ln for ln in body_for(name).split("\n")]
        cell.source = "\n".join(lines)


def _attacked(release: str, body_for, extra: str = "") -> nbformat.NotebookNode:
    nb = nbformat.read(str(ROOT / "exercises" / release), as_version=4)
    _fill(nb, body_for)
    first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "from minigpt.grading import check"
                 in c.source)
    nb.cells.insert(first + 1, nbformat.v4.new_code_cell(PATCHES + EQUAL_TO_EVERYTHING + extra))
    return nb


@pytest.mark.slow
def test_the_attacks_earn_nothing_for_wrong_code_and_leave_right_code_its_marks(tmp_path):
    ex08 = [n for n, e in EXERCISES.items() if e.notebook == "ex08_speedup_model.ipynb"]
    ex02 = [n for n, e in EXERCISES.items() if e.notebook == "ex02_memory_bound.ipynb"]
    folder = tmp_path / "class"
    for student in ("stubs", "equal", "right"):
        (folder / student).mkdir(parents=True)
    # the attack on ex08: patched comparisons and graders, then stubs returning 1.0
    nbformat.write(_attacked("ex08_speedup_model.ipynb", lambda name: "return 1.0"),
                   str(folder / "stubs" / "ex08_speedup_model.ipynb"))
    # the same patches, with functions returning an object that equals everything
    nbformat.write(_attacked("ex02_memory_bound.ipynb", lambda name: "return AlwaysEqual(0.0)"),
                   str(folder / "equal" / "ex02_memory_bound.ipynb"))
    # the same patches next to right code: the patches do not cost the right answers anything
    solved = nbformat.read(str(ROOT / "solutions" / "ex02_memory_bound.ipynb"), as_version=4)
    first = next(i for i, c in enumerate(solved.cells) if c.cell_type == "code" and "from minigpt.grading import"
                 in c.source)
    solved.cells.insert(first + 1, nbformat.v4.new_code_cell(PATCHES.replace("builtins.abs = lambda x: 0.0", "")))
    nbformat.write(solved, str(folder / "right" / "ex02_memory_bound.ipynb"))
    report = tmp_path / "r.json"
    proc = _grade(folder, "--json", report, "--timeout", "300", "--jobs", "2")
    data = json.loads(report.read_text())
    rows = {(Path(r["notebook"]).parent.name, r["exercise"]): r for r in data["rows"]}
    for name in ex08:
        assert rows["stubs", name]["points"] == 0, (name, rows["stubs", name], proc.stdout)
    for name in ex02:
        assert rows["equal", name]["points"] == 0, (name, rows["equal", name])
        assert rows["right", name]["status"] == "full marks", (name, rows["right", name])
    cases = [c for g in data["notebooks"] if "/equal/" in g["notebook"] for e in g["exercises"] for c in e["cases"]]
    assert cases and all(c["status"] != "pass" for c in cases)
