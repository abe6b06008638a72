"""The graders are themselves tested.

* every graded exercise: the solution notebook's function earns full marks, and at least three realistic wrong
  versions (kept below, each named for its bug) lose points;
* ``check`` turns exceptions, NaN, wrong shapes and wrong types into FAIL lines without a traceback, reports
  stubs as "not implemented yet", and never prints the reference code;
* ``python -m minigpt.grade`` survives notebooks that raise, hang, return NaN, kill their kernel, are not
  notebooks or are not valid JSON, and grades ``solutions/`` with full marks and ``exercises/`` with none.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F

from minigpt.decoding.verify import accept_greedy, accept_sampled
from minigpt.grading import EXERCISES, check
from minigpt.grading.make_exercises import BEGIN, END

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "solutions"
EXERCISE_NBS = ROOT / "exercises"


def graded_functions(notebook: Path) -> dict:
    """Execute only the graded cells (those with solution markers, or stubs) of a notebook; return its names."""
    nb = nbformat.read(str(notebook), as_version=4)
    namespace = {"math": math, "torch": torch, "F": F}
    for cell in nb.cells:
        if cell.cell_type == "code" and ("### BEGIN SOLUTION" in cell.source or "NotImplementedError" in cell.source):
            exec(compile(cell.source, f"{notebook.name}", "exec"), namespace)
    return namespace


def solution(name: str):
    return graded_functions(SOLUTIONS / EXERCISES[name].notebook)[name]


# ---- ex01: attention with a KV cache ------------------------------------------------------------------------

def _attend(q, k_new, v_new, k_cache, v_cache, *, scale=None, mask="shifted", append=True, softmax_dim=-1):
    k = torch.cat([k_cache, k_new], 2) if append else k_new
    v = torch.cat([v_cache, v_new], 2) if append else v_new
    S, T = k.shape[2] - q.shape[2], q.shape[2]
    scores = q @ k.transpose(-2, -1) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if mask == "shifted":
        allowed = torch.ones(T, S + T, dtype=torch.bool).tril(diagonal=S)
    elif mask == "top_left":
        allowed = torch.ones(T, S + T, dtype=torch.bool).tril()
    else:
        allowed = torch.ones(T, S + T, dtype=torch.bool)
    out = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=softmax_dim) @ v
    return (out, k, v) if append else (out, k_cache, v_cache)


def attention_not_causal(q, k_new, v_new, k_cache, v_cache):
    return _attend(q, k_new, v_new, k_cache, v_cache, mask="none")


def scale_by_d_not_sqrt_d(q, k_new, v_new, k_cache, v_cache):
    return _attend(q, k_new, v_new, k_cache, v_cache, scale=1 / q.shape[-1])


def forgot_to_append_cache(q, k_new, v_new, k_cache, v_cache):
    return _attend(q, k_new, v_new, k_cache, v_cache, append=False)


def causal_mask_without_cache_offset(q, k_new, v_new, k_cache, v_cache):
    # scaled_dot_product_attention(is_causal=True) aligns the triangle top-left: wrong once the cache is non-empty
    k, v = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True), k, v


def softmax_over_queries(q, k_new, v_new, k_cache, v_cache):
    return _attend(q, k_new, v_new, k_cache, v_cache, softmax_dim=-2)


def attend_scales_q_in_place(q, k_new, v_new, k_cache, v_cache):
    # right numbers, but `q *= scale` writes into the caller's tensor
    q *= 1 / math.sqrt(q.shape[-1])
    k, v = torch.cat([k_cache, k_new], 2), torch.cat([v_cache, v_new], 2)
    S, T = k_cache.shape[2], q.shape[2]
    allowed = torch.ones(T, S + T, dtype=torch.bool).tril(diagonal=S)
    return torch.softmax((q @ k.transpose(-2, -1)).masked_fill(~allowed, float("-inf")), -1) @ v, k, v


def crop_in_place_zeroes_tail(k_cache, v_cache, length):
    # right slices, but "cleans up" the rejected positions in the caller's tensors
    k_cache[:, :, length:] = 0
    v_cache[:, :, length:] = 0
    return k_cache[:, :, :length], v_cache[:, :, :length]


def forgot_to_crop_cache(k_cache, v_cache, length):
    return k_cache, v_cache


def crop_off_by_one(k_cache, v_cache, length):
    return k_cache[:, :, :length - 1], v_cache[:, :, :length - 1]


def crop_keeps_tail(k_cache, v_cache, length):
    return k_cache[:, :, -length:], v_cache[:, :, -length:]


def crop_wrong_dim(k_cache, v_cache, length):
    return k_cache[..., :length], v_cache[..., :length]


# ---- ex02: the memory-bound arithmetic ----------------------------------------------------------------------

def forgot_factor_2_flops(n_params, n_tokens=1):
    return n_params * n_tokens


def flops_ignore_n_tokens(n_params, n_tokens=1):
    return 2 * n_params


def flops_in_gigaflops(n_params, n_tokens=1):
    return 2 * n_params * n_tokens / 1e9


def bytes_as_bits(n_params, bytes_per_param):
    return n_params * bytes_per_param * 8


def weight_bytes_in_gb(n_params, bytes_per_param):
    return n_params * bytes_per_param / 1e9


def weight_bytes_hardcoded_fp16(n_params, bytes_per_param):
    return n_params * 2


def intensity_upside_down(n_params, n_tokens, bytes_per_param):
    return (n_params * bytes_per_param) / (2 * n_params * n_tokens)


def intensity_forgot_factor_2(n_params, n_tokens, bytes_per_param):
    return n_tokens / bytes_per_param


def intensity_weights_read_per_token(n_params, n_tokens, bytes_per_param):
    return (2 * n_params * n_tokens) / (n_params * bytes_per_param * n_tokens)


def floor_sum_not_max(n_params, bytes_per_param, bandwidth_bytes_per_s, flops_per_s, n_tokens=1):
    return n_params * bytes_per_param / bandwidth_bytes_per_s + 2 * n_params * n_tokens / flops_per_s


def floor_min_not_max(n_params, bytes_per_param, bandwidth_bytes_per_s, flops_per_s, n_tokens=1):
    return min(n_params * bytes_per_param / bandwidth_bytes_per_s, 2 * n_params * n_tokens / flops_per_s)


def floor_memory_term_only(n_params, bytes_per_param, bandwidth_bytes_per_s, flops_per_s, n_tokens=1):
    return n_params * bytes_per_param / bandwidth_bytes_per_s


def ridge_upside_down(flops_per_s, bandwidth_bytes_per_s):
    return bandwidth_bytes_per_s / flops_per_s


def ridge_extra_factor_2(flops_per_s, bandwidth_bytes_per_s):
    return 2 * flops_per_s / bandwidth_bytes_per_s


def ridge_bandwidth_in_bits(flops_per_s, bandwidth_bytes_per_s):
    return flops_per_s / (8 * bandwidth_bytes_per_s)


def tokens_forgot_bytes_per_param(flops_per_s, bandwidth_bytes_per_s, bytes_per_param):
    return flops_per_s / bandwidth_bytes_per_s / 2


def tokens_forgot_halving(flops_per_s, bandwidth_bytes_per_s, bytes_per_param):
    return flops_per_s / bandwidth_bytes_per_s * bytes_per_param


def tokens_divides_by_bytes(flops_per_s, bandwidth_bytes_per_s, bytes_per_param):
    return flops_per_s / bandwidth_bytes_per_s / bytes_per_param * 2


def kv_forgot_k_and_v(n_layer, n_embd, bytes_per_el):
    return n_layer * n_embd * bytes_per_el


def kv_one_layer_only(n_layer, n_embd, bytes_per_el):
    return 2 * n_embd * bytes_per_el


def kv_bytes_as_bits(n_layer, n_embd, bytes_per_el):
    return 2 * n_layer * n_embd * bytes_per_el * 8


# ---- ex03: one speculative round ----------------------------------------------------------------------------

def _sample(probs, g):
    return int(torch.multinomial(probs, 1, generator=g))


def _step(draft_tokens, q, p, g, *, accept, residual, stop_after_reject=True, bonus=True):
    """A speculative round with pluggable pieces, to build the wrong versions below."""
    out = []
    for i, x in enumerate(draft_tokens):
        if accept(float(torch.rand((), generator=g)), float(p[i, x]), float(q[i, x])):
            out.append(x)
            continue
        out.append(residual(p[i], q[i], g))
        if stop_after_reject:
            return out
    if bonus:
        out.append(_sample(p[len(draft_tokens)], g))
    return out


def _min_rule(u, px, qx):
    return u < min(1.0, px / qx)


def _good_residual(p, q, g):
    r = (p - q).clamp(min=0)
    return _sample(r / r.sum(), g)


def forgot_bonus_token(draft_tokens, q, p, generator=None):
    return _step(draft_tokens, q, p, generator, accept=_min_rule, residual=_good_residual, bonus=False)


def unnormalised_residual(draft_tokens, q, p, generator=None):
    # inverse-CDF sampling on max(0, p - q) without dividing by its sum: the mass it lacks lands on the last id
    def residual(p, q, g):
        cdf = (p - q).clamp(min=0).cumsum(0)
        return min(int(torch.searchsorted(cdf, torch.rand((), generator=g).reshape(1))), p.numel() - 1)
    return _step(draft_tokens, q, p, generator, accept=_min_rule, residual=residual)


def residual_abs_not_clamp(draft_tokens, q, p, generator=None):
    def residual(p, q, g):
        return _sample((p - q).abs(), g)
    return _step(draft_tokens, q, p, generator, accept=_min_rule, residual=residual)


def residual_from_p_not_p_minus_q(draft_tokens, q, p, generator=None):  # a.k.a. replacement_from_p
    return _step(draft_tokens, q, p, generator, accept=_min_rule, residual=lambda p, q, g: _sample(p, g))


def ratio_upside_down(draft_tokens, q, p, generator=None):
    return _step(draft_tokens, q, p, generator, accept=lambda u, px, qx: u < min(1.0, qx / px) if px else False,
                 residual=_good_residual)


def accept_if_p_beats_q(draft_tokens, q, p, generator=None):
    return _step(draft_tokens, q, p, generator, accept=lambda u, px, qx: px >= qx, residual=_good_residual)


def continue_after_reject(draft_tokens, q, p, generator=None):
    return _step(draft_tokens, q, p, generator, accept=_min_rule, residual=_good_residual, stop_after_reject=False)


def ratio_without_min(draft_tokens, q, p, generator=None):
    """NOT a bug: u < p/q is the same event as u < min(1, p/q) for u in [0, 1). Must pass."""
    return _step(draft_tokens, q, p, generator, accept=lambda u, px, qx: u < px / qx, residual=_good_residual)


def greedy_forgot_bonus_token(draft_tokens, target_argmax):
    out = []
    for x, t in zip(draft_tokens, target_argmax):
        if x != t:
            return out + [t]
        out.append(x)
    return out


def greedy_continue_after_mismatch(draft_tokens, target_argmax):
    out = [x for x, t in zip(draft_tokens, target_argmax) if x == t]
    return out + [target_argmax[len(out)]]


def greedy_target_token_off_by_one(draft_tokens, target_argmax):
    out = []
    for x, t in zip(draft_tokens, target_argmax):
        if x != t:
            break
        out.append(x)
    return out + [target_argmax[min(len(out) + 1, len(target_argmax) - 1)]]


def greedy_keeps_draft_at_mismatch(draft_tokens, target_argmax):
    out = []
    for x, t in zip(draft_tokens, target_argmax):
        out.append(x)
        if x != t:
            return out
    return out + [target_argmax[-1]]


def argmax_draft_soft_q(next_probs, context, gamma, generator=None):
    seq, tokens, qs = list(context), [], []
    for _ in range(gamma):
        q = next_probs(seq)
        x = int(q.argmax())  # drafted greedily...
        tokens.append(x)
        qs.append(q)  # ...but scored with the soft distribution
        seq.append(x)
    return tokens, torch.stack(qs)


def draft_same_context_every_step(next_probs, context, gamma, generator=None):
    tokens, qs = [], []
    for _ in range(gamma):
        q = next_probs(context)
        tokens.append(_sample(q, generator))
        qs.append(q)
    return tokens, torch.stack(qs)


def draft_mutates_callers_context(next_probs, context, gamma, generator=None):
    tokens, qs = [], []
    for _ in range(gamma):
        q = next_probs(context)
        x = _sample(q, generator)
        tokens.append(x)
        qs.append(q)
        context.append(x)
    return tokens, torch.stack(qs)


def draft_ignores_generator(next_probs, context, gamma, generator=None):
    # right distribution, but samples from the global RNG: a seed does not reproduce the draft
    seq, tokens, qs = list(context), [], []
    for _ in range(gamma):
        q = next_probs(seq)
        x = int(torch.multinomial(q, 1))
        tokens.append(x)
        qs.append(q)
        seq.append(x)
    return tokens, torch.stack(qs)


def step_ignores_generator(draft_tokens, q, p, generator=None):
    return accept_sampled(draft_tokens, q, p, None)


def step_normalises_p_in_place(draft_tokens, q, p, generator=None):
    # right rule, but it writes the residual into the caller's p
    out = []
    for i, x in enumerate(draft_tokens):
        if float(torch.rand((), generator=generator)) < min(1.0, float(p[i, x] / q[i, x])):
            out.append(int(x))
            continue
        p[i] -= q[i]
        p[i].clamp_(min=0)
        p[i] /= p[i].sum()
        return out + [int(torch.multinomial(p[i], 1, generator=generator))]
    return out + [int(torch.multinomial(p[len(draft_tokens)], 1, generator=generator))]


def greedy_pops_target(draft_tokens, target_argmax):
    out = []
    for x in draft_tokens:
        t = target_argmax.pop(0)
        if x != t:
            return out + [t]
        out.append(x)
    return out + [target_argmax.pop(0)]


def draft_records_next_q(next_probs, context, gamma, generator=None):
    seq, tokens, qs = list(context), [], []
    q = next_probs(seq)
    for _ in range(gamma):
        x = _sample(q, generator)
        tokens.append(x)
        seq.append(x)
        q = next_probs(seq)
        qs.append(q)  # off by one: the distribution of the *next* step
    return tokens, torch.stack(qs)


WRONG = {
    "attend_with_cache": [attention_not_causal, scale_by_d_not_sqrt_d, forgot_to_append_cache,
                          causal_mask_without_cache_offset, softmax_over_queries, attend_scales_q_in_place],
    "crop_cache": [forgot_to_crop_cache, crop_off_by_one, crop_keeps_tail, crop_wrong_dim, crop_in_place_zeroes_tail],
    "decode_flops": [forgot_factor_2_flops, flops_ignore_n_tokens, flops_in_gigaflops],
    "weight_bytes": [bytes_as_bits, weight_bytes_in_gb, weight_bytes_hardcoded_fp16],
    "arithmetic_intensity": [intensity_upside_down, intensity_forgot_factor_2, intensity_weights_read_per_token],
    "step_time_floor": [floor_sum_not_max, floor_min_not_max, floor_memory_term_only],
    "ridge_point": [ridge_upside_down, ridge_extra_factor_2, ridge_bandwidth_in_bits],
    "tokens_until_compute_bound": [tokens_forgot_bytes_per_param, tokens_forgot_halving, tokens_divides_by_bytes],
    "kv_cache_bytes_per_token": [kv_forgot_k_and_v, kv_one_layer_only, kv_bytes_as_bits],
    "speculative_step": [forgot_bonus_token, unnormalised_residual, residual_abs_not_clamp,
                         residual_from_p_not_p_minus_q, ratio_upside_down, accept_if_p_beats_q,
                         continue_after_reject, step_ignores_generator, step_normalises_p_in_place],
    "greedy_step": [greedy_forgot_bonus_token, greedy_continue_after_mismatch, greedy_target_token_off_by_one,
                    greedy_keeps_draft_at_mismatch, greedy_pops_target],
    "draft": [argmax_draft_soft_q, draft_same_context_every_step, draft_mutates_callers_context,
              draft_records_next_q, draft_ignores_generator],
}


# later exercises keep their wrong versions (and their own special cases) in their own test files
from test_grading_ex04_ex05 import WRONG as WRONG_04_05  # noqa: E402
from test_grading_ex06 import WRONG as WRONG_06  # noqa: E402
from test_grading_ex07_ex08 import WRONG as WRONG_07_08  # noqa: E402
from test_grading_ex09 import WRONG as WRONG_09  # noqa: E402

ALL_WRONG = {**WRONG, **WRONG_04_05, **WRONG_06, **WRONG_07_08, **WRONG_09}


def test_every_exercise_has_a_solution_and_three_wrong_versions():
    from test_grading_ex10 import WRONG as WRONG_10   # ex10's wrong versions live beside its own tests
    wrong = {**ALL_WRONG, "longest_match": WRONG_10}
    assert set(wrong) == set(EXERCISES)
    for name, ex in EXERCISES.items():
        assert callable(solution(name)), name
        assert len(wrong[name]) >= 3, name
        assert ex.max_points >= 2, name


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_solution_earns_full_marks(name):
    result = check(name, solution(name), verbose=False)
    assert result.full_marks, [c.line() for c in result.cases if not c.passed]


@pytest.mark.parametrize("name, wrong", [(n, w) for n, ws in ALL_WRONG.items() for w in ws],
                         ids=[f"{n}-{w.__name__}" for n, ws in ALL_WRONG.items() for w in ws])
def test_wrong_version_loses_points(name, wrong):
    result = check(name, wrong, verbose=False)
    assert result.points < result.max_points, f"{wrong.__name__} passed every case of {name}"
    assert any(c.status in ("fail", "error") for c in result.cases)


def test_library_references_pass():
    from minigpt import roofline
    for name in ("decode_flops", "weight_bytes", "arithmetic_intensity", "step_time_floor", "ridge_point",
                 "tokens_until_compute_bound", "kv_cache_bytes_per_token"):
        assert check(name, getattr(roofline, name), verbose=False).full_marks, name
    assert check("speculative_step", accept_sampled, verbose=False).full_marks
    assert check("greedy_step", accept_greedy, verbose=False).full_marks


def test_ratio_without_min_is_equivalent_and_passes():
    # u < p/q and u < min(1, p/q) are the same event when u < 1: the grader must not punish the shorter form
    assert check("speculative_step", ratio_without_min, verbose=False).full_marks


def test_statistical_verdicts_are_reproducible():
    a = check("speculative_step", residual_from_p_not_p_minus_q, verbose=False)
    b = check("speculative_step", residual_from_p_not_p_minus_q, verbose=False)
    assert [(c.status, c.detail) for c in a.cases] == [(c.status, c.detail) for c in b.cases]


def test_roofline_worked_example():
    from minigpt import roofline as R
    assert R.weight_bytes(70e9, 2) == 140e9
    t = R.step_time_floor(70e9, 2, 3.35e12, R.H100_SXM_BF16_FLOPS)
    assert 0.041 < t < 0.043 and 23.5 < 1 / t < 24.5
    assert R.arithmetic_intensity(70e9, 1, 2) == 1.0
    ridge = R.ridge_point(R.H100_SXM_BF16_FLOPS, R.H100_SXM_BANDWIDTH)
    assert R.arithmetic_intensity(1e9, R.tokens_until_compute_bound(R.H100_SXM_BF16_FLOPS, R.H100_SXM_BANDWIDTH, 2),
                                  2) == pytest.approx(ridge)
    # compute-bound beyond the ridge: the floor grows with the tokens
    many = R.step_time_floor(70e9, 2, 3.35e12, R.H100_SXM_BF16_FLOPS, n_tokens=4096)
    assert many == pytest.approx(R.decode_flops(70e9, 4096) / R.H100_SXM_BF16_FLOPS)


# ---- what check() prints --------------------------------------------------------------------------------------

def _lines(capsys) -> list[str]:
    return capsys.readouterr().out.strip().splitlines()


def test_exception_in_learner_code_is_one_fail_line(capsys):
    def broken(n_params, n_tokens=1):
        return n_params / 0

    result = check("decode_flops", broken)
    lines = _lines(capsys)
    assert result.points == 0 and len(lines) == len(EXERCISES["decode_flops"].cases) + 1
    assert all(ln.startswith("FAIL") and "raised ZeroDivisionError: float division by zero" in ln for ln in lines[:-1])
    assert lines[-1] == f"Score: 0/{result.max_points} points"  # no machine-readable line: nothing parses output
    assert "Traceback" not in "\n".join(lines)


def test_nan_wrong_shape_and_wrong_type_are_clear(capsys):
    check("weight_bytes", lambda n, b: float("nan"))
    assert "received NaN" in _lines(capsys)[0]
    check("crop_cache", lambda k, v, n: (k, v))
    assert "shape" in _lines(capsys)[0]
    check("attend_with_cache", lambda q, k, v, kc, vc: (q.tolist(), k, v))
    first = _lines(capsys)[0]
    assert first.startswith("FAIL") and "torch.Tensor" in first and "list" in first
    check("greedy_step", lambda d, t: torch.tensor(t[:1]))
    assert "list of ints" in _lines(capsys)[0]
    check("attend_with_cache", lambda q, k, v, kc, vc: (q * float("nan"), torch.cat([kc, k], 2), torch.cat([vc, v], 2)))
    assert "NaN" in _lines(capsys)[0]


def test_stub_reports_not_implemented(capsys):
    def stub(draft_tokens, target_argmax):
        raise NotImplementedError("compare drafts with the target")

    result = check("greedy_step", stub)
    lines = _lines(capsys)
    assert result.points == 0 and result.status == "not implemented yet"
    assert all("not implemented yet" in ln for ln in lines[:-1])


def test_failed_checks_do_not_reveal_reference_code(capsys):
    for name, wrongs in ALL_WRONG.items():
        check(name, wrongs[0])
        printed = capsys.readouterr().out
        nb = nbformat.read(str(SOLUTIONS / EXERCISES[name].notebook), as_version=4)
        body = []
        for cell in nb.cells:
            inside = False
            for line in cell.source.splitlines() if cell.cell_type == "code" else []:
                if BEGIN.match(line):
                    inside = True
                elif END.match(line):
                    inside = False
                elif inside and len(line.strip()) > 12:
                    body.append(line.strip())
        assert not [ln for ln in body if ln in printed], name


def test_unknown_exercise_and_non_callable_are_usage_errors():
    with pytest.raises(KeyError, match="known"):
        check("attention", lambda: None)
    with pytest.raises(TypeError):
        check("crop_cache", 3)


def test_exercise_stubs_score_zero_not_implemented():
    for notebook in sorted(EXERCISE_NBS.glob("*.ipynb")):
        names = graded_functions(notebook)
        for name, ex in EXERCISES.items():
            if ex.notebook == notebook.name:
                result = check(name, names[name], verbose=False)
                assert result.points == 0 and result.status == "not implemented yet", (name, result.status)


# ---- the grading command ----------------------------------------------------------------------------------------
# (tests/test_grade_command.py tests what makes its scores trustworthy; these test that it survives bad notebooks)

def _grade(*args, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "minigpt.grade", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def _rows(report: Path) -> dict:
    return {(Path(r["notebook"]).name, r["exercise"]): r for r in json.loads(report.read_text())["rows"]}


def _solved(name: str, body: str) -> str:
    return f"def {name}:\n    ### BEGIN SOLUTION\n    {body}\n    ### END SOLUTION"


MINI = ["from minigpt.grading import check",
        _solved("decode_flops(n_params, n_tokens=1)", "return 2 * n_params * n_tokens"),
        'check("decode_flops", decode_flops)',
        _solved("weight_bytes(n_params, bytes_per_param)", "return n_params * bytes_per_param"),
        'check("weight_bytes", weight_bytes)',
        _solved("ridge_point(flops_per_s, bandwidth_bytes_per_s)", "return flops_per_s / bandwidth_bytes_per_s"),
        'check("ridge_point", ridge_point)']


def _release(folder: Path, names: list[str]) -> Path:
    """A release folder made by the generator from a small solution notebook, under each of ``names``."""
    solutions, release = folder / "solutions", folder / "release"
    solutions.mkdir(parents=True)
    for name in names:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in MINI])
        nbformat.write(nb, str(solutions / name))
    proc = subprocess.run([sys.executable, "-m", "minigpt.grading.make_exercises", "--solutions", str(solutions),
                           "--exercises", str(release)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return release


def _submission(release: Path, path: Path, bodies: dict[int, str], extra: dict[int, str] | None = None,
                drop: tuple[int, ...] = (), source: str | None = None) -> None:
    """The release notebook with the stub of cell i replaced by ``bodies[i]``, a new cell after cell i for each
    ``extra[i]``, and the cells in ``drop`` deleted (cells numbered from 0)."""
    nb = nbformat.read(str(release / (source or path.name)), as_version=4)
    cells = []
    for i, cell in enumerate(nb.cells):
        if i in bodies:
            cell.source = re.sub(r"raise NotImplementedError\(.*\)", lambda _: bodies[i], cell.source)
        if i not in drop:
            cells.append(cell)
        if extra and i in extra:
            cells.append(nbformat.v4.new_code_cell(extra[i]))
    nb.cells = cells
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


GOOD = {1: "return 2 * n_params * n_tokens", 3: "return n_params * bytes_per_param",
        5: "return flops_per_s / bandwidth_bytes_per_s"}


@pytest.mark.slow
def test_grade_command_survives_bad_notebooks(tmp_path):
    names = ["raises.ipynb", "hangs.ipynb", "nan.ipynb", "dies.ipynb", "slow.ipynb"]
    release = _release(tmp_path, names)
    sub = tmp_path / "submissions"
    _submission(release, sub / "alice" / "raises.ipynb", {**GOOD, 3: "return undefined_name", 5: "return (1 +"},
                extra={1: "raise RuntimeError('learner cell crashed at top level')"})
    _submission(release, sub / "hangs.ipynb", {**GOOD, 5: "while True:\n        pass"})
    _submission(release, sub / "nan.ipynb", {1: "return float('nan')"}, drop=(3,))
    _submission(release, sub / "dies.ipynb", GOOD, extra={2: "import os\nos._exit(1)"})
    _submission(release, sub / "slow.ipynb", GOOD, extra={2: "import time\ntime.sleep(60)"})
    _submission(release, sub / "unknown.ipynb", GOOD, source="nan.ipynb")  # renamed: its metadata says which
    bare = nbformat.read(str(sub / "unknown.ipynb"), as_version=4)
    bare.metadata.pop("minigpt")
    for cell in bare.cells:
        cell.metadata.pop("minigpt", None)
    nbformat.write(bare, str(sub / "stranger.ipynb"))  # no identity, no tags, a name no release has
    (sub / "broken.ipynb").write_text("{ this is not json")
    (sub / "notes.txt").write_text("not a notebook")
    report = tmp_path / "report.json"

    proc = _grade(sub, "--release", release, "--timeout", "20", "--json", report)
    assert proc.returncode == 1, proc.stdout
    rows = _rows(report)
    # raises: a top-level error does not stop later cells; an error inside the function is a failed check;
    # a syntax error leaves the function undefined, and the row says why
    assert rows["raises.ipynb", "decode_flops"]["status"] == "full marks"
    assert rows["raises.ipynb", "weight_bytes"]["points"] == 0
    detail = {(Path(g["notebook"]).name, e["exercise"]): e for g in json.loads(report.read_text())["notebooks"]
              for e in g["exercises"]}
    cases = detail["raises.ipynb", "weight_bytes"]["cases"]
    assert cases and all("NameError: name 'undefined_name'" in c["received"] for c in cases)
    # the hint names the error and the learner's line, as the kernel saw it (line 2 of the cell, under the def)
    assert all(c["hint"] == "NameError at line 2 of your cell, in weight_bytes: `return undefined_name`"
               for c in cases), [c["hint"] for c in cases]
    status = rows["raises.ipynb", "ridge_point"]["status"]
    assert "no score: the check cell raised NameError" in status and "SyntaxError at line 2" in status, status
    assert rows["raises.ipynb", "ridge_point"]["max"] == EXERCISES["ridge_point"].max_points
    # hangs: scores before the hang are kept, the hanging check gets a row
    assert rows["hangs.ipynb", "decode_flops"]["status"] == "full marks"
    assert rows["hangs.ipynb", "weight_bytes"]["status"] == "full marks"
    assert "timeout" in rows["hangs.ipynb", "ridge_point"]["status"]
    # NaN: zero points; a deleted learner cell is the release's stub again
    assert rows["nan.ipynb", "decode_flops"]["points"] == 0
    assert rows["nan.ipynb", "weight_bytes"]["status"] == "not implemented yet"
    # a dead kernel: earlier scores kept, the rest reported
    assert rows["dies.ipynb", "decode_flops"]["status"] == "full marks"
    assert "kernel died" in rows["dies.ipynb", "weight_bytes"]["status"]
    assert "kernel died" in rows["dies.ipynb", "ridge_point"]["status"]
    # invalid JSON, no release: one row each, and the text file is not picked up from a folder
    assert rows["broken.ipynb", "-"]["status"].startswith("invalid notebook")
    assert rows["unknown.ipynb", "decode_flops"]["status"] == "full marks"  # graded as the release it was made from
    assert rows["stranger.ipynb", "-"]["status"].startswith("not graded: no release notebook matches"), rows
    assert not any(nb == "notes.txt" for nb, _ in rows)
    assert "Total:" in proc.stdout

    # the whole-notebook limit: a notebook that sleeps stops at it, and says so
    proc = _grade(sub / "slow.ipynb", "--release", release, "--timeout", "100", "--notebook-timeout", "15",
                  "--json", report)
    rows = _rows(report)
    assert rows["slow.ipynb", "decode_flops"]["status"] == "full marks"
    assert "the notebook ran past its 15 s limit" in rows["slow.ipynb", "weight_bytes"]["status"], proc.stdout

    for path, reason in ((sub / "notes.txt", "not a notebook"), (tmp_path / "missing.ipynb", "not found")):
        proc = _grade(path)
        assert proc.returncode == 1 and reason in proc.stdout, proc.stdout


@pytest.mark.slow
def test_grade_solutions_full_marks(tmp_path):
    report, reports = tmp_path / "solutions.json", tmp_path / "reports"
    proc = _grade("solutions", "--json", report, "--report", reports)
    assert proc.returncode == 0, proc.stdout
    data = json.loads(report.read_text())
    assert data["full_marks"] and data["points"] == data["max"] == sum(e.max_points for e in EXERCISES.values())
    assert {r["exercise"] for r in data["rows"]} == set(EXERCISES)
    assert sorted(p.stem for p in reports.glob("*.md")) == sorted(p.stem for p in SOLUTIONS.glob("*.ipynb"))
    assert all(not g["restored"] for g in data["notebooks"]), [g["restored"] for g in data["notebooks"]]


@pytest.mark.slow
def test_grade_exercises_runs_to_the_end_with_zero(tmp_path):
    report = tmp_path / "exercises.json"
    proc = _grade("exercises", "--json", report)
    assert proc.returncode == 1, proc.stdout
    data = json.loads(report.read_text())
    assert data["points"] == 0 and {r["exercise"] for r in data["rows"]} == set(EXERCISES)
    assert all(r["status"] == "not implemented yet" for r in data["rows"]), proc.stdout
    assert re.search(r"Total: 0/\d+ points", proc.stdout)
