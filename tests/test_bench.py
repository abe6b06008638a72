"""The benchmark command (minigpt.bench) and the prompt sets it runs on (minigpt.prompts)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from conftest import perturbed_copy, random_model
from minigpt import bench
from minigpt.decoding import Lookup, Plain, generate
from minigpt.prompts import Prompt, code_prompts, edit_prompts, prose_prompts, split_code_and_prose
from minigpt.tokenizer import load_tokenizer

RECORD_KEYS = {"method", "tokens_per_target_pass", "acceptance_rate", "tokens_per_s", "speedup_vs_plain",
               "identical_to_plain_greedy", "device", "n_prompts", "new_tokens", "gamma", "repeats",
               "tokens_per_s_min", "tokens_per_s_max", "time_s_median", "time_s_min", "time_s_max",
               "speedup_min", "speedup_max", "target_passes", "draft_passes", "other_cpu_cores"}


# ---------------------------------------------------------------- prompts

SOURCE = '''"""Module docstring: prose."""
import os  # a comment


def f(x):
    """Return x doubled."""
    # explain the next line
    # over two lines
    s = "not a docstring"
    return 2 * x
'''


def test_split_code_and_prose_round_trips_and_classifies():
    pieces = split_code_and_prose(SOURCE)
    assert "".join(t for _, t in pieces) == SOURCE
    prose = [t for k, t in pieces if k == "prose"]
    code = "".join(t for k, t in pieces if k == "code")
    assert prose[0] == '"""Module docstring: prose."""'
    assert "# a comment" in prose
    # a docstring and the comment lines right after it, with only whitespace between: one prose piece
    assert '"""Return x doubled."""\n    # explain the next line\n    # over two lines' in prose
    assert '"not a docstring"' in code and "return 2 * x" in code and "import os" in code
    assert all(k in ("code", "prose") for k, _ in pieces)
    assert split_code_and_prose("x = (\n") == [("code", "x = (\n")]  # does not tokenize: all code


@pytest.mark.parametrize("make,kind", [(code_prompts, "code"), (prose_prompts, "prose"), (edit_prompts, "edit")])
def test_prompt_sets_are_deterministic_and_fit_the_context(make, kind):
    a, b = make(4), make(4)
    assert len(a) == 4 and [list(p) for p in a] == [list(p) for p in b]
    assert len({p.name for p in a}) == 4  # four different places
    for p in a:
        assert isinstance(p, Prompt) and p.kind == kind and p.reference
        assert all(isinstance(t, int) and 0 <= t < 4096 for t in p)
        assert len(p) <= 150 and len(p) + 96 <= 256  # prompt + generation fit block_size


def test_prompt_contents_match_their_kind():
    enc = load_tokenizer()
    for p in code_prompts(3):
        assert enc.decode(p).endswith("\n")  # cut at a line break
        assert "#" not in enc.decode(p.reference) and '"""' not in enc.decode(p.reference)
    for p in prose_prompts(3):
        assert sum(c.isalpha() or c.isspace() for c in enc.decode(p.reference)) > 0.8 * len(enc.decode(p.reference))
    for p in edit_prompts(3):
        text = enc.decode(p)
        old, new = text.split("renamed to `")[0].rsplit("`", 2)[-2], text.split("renamed to `")[1].split("`")[0]
        assert new == f"new_{old}"
        # the correct continuation is the original body with the name replaced, and it is there
        assert new in enc.decode(p.reference)


# ---------------------------------------------------------------- run_bench on small random models

def small_pair():
    target = random_model(0)
    return bench.Models(target, perturbed_copy(target, 0.3))


def small_prompts(n=3, length=12):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(97, (length,), generator=g).tolist() for _ in range(n)]


def test_records_on_small_models_have_the_schema_and_are_exact():
    records = bench.run_bench(["chain"], models=small_pair(), prompts=small_prompts(), max_new_tokens=10,
                              repeats=2, gamma=3)
    json.dumps(records, allow_nan=False)  # strict JSON: no NaN anywhere
    assert [r["method"] for r in records] == ["plain", "chain"]  # plain always runs: it is the baseline
    plain, chain = records
    for r in records:
        assert RECORD_KEYS <= set(r)
        assert r["identical_to_plain_greedy"] is True and r["mismatched_prompts"] == []
        assert r["n_prompts"] == 3 and r["new_tokens"] == 30 and r["repeats"] == 2 and r["device"] == "cpu"
        assert r["tokens_per_s_min"] <= r["tokens_per_s"] <= r["tokens_per_s_max"]
        assert r["speedup_min"] <= r["speedup_vs_plain"] <= r["speedup_max"]
    assert plain["tokens_per_target_pass"] == 1 and plain["target_passes"] == 30
    assert plain["acceptance_rate"] is None and plain["gamma"] is None and plain["speedup_vs_plain"] == 1
    assert chain["gamma"] == 3 and 0 <= chain["acceptance_rate"] <= 1
    assert chain["tokens_per_target_pass"] >= 1 and chain["target_passes"] < 30  # the draft agrees sometimes
    assert chain["draft_passes"] > 0
    assert all(r["other_cpu_cores"] is None or r["other_cpu_cores"] >= 0 for r in records)


def test_by_kind_splits_counts_and_times_of_the_same_runs():
    prompts = [Prompt(ids, f"p{i}", kind) for i, (ids, kind) in enumerate(zip(small_prompts(3), "aba"))]
    records = bench.run_bench(["chain"], models=small_pair(), prompts=prompts, max_new_tokens=8, repeats=2, gamma=3)
    for r in records:
        a, b = r["by_kind"]["a"], r["by_kind"]["b"]
        assert (a["n_prompts"], b["n_prompts"]) == (2, 1) and a["new_tokens"] + b["new_tokens"] == r["new_tokens"]
        assert a["speedup_min"] <= a["speedup_vs_plain"] <= a["speedup_max"]
        assert a["identical_to_plain_greedy"] and b["identical_to_plain_greedy"]
        assert a["time_s_median"] + b["time_s_median"] == pytest.approx(r["time_s_median"], rel=0.5)
    assert records[0]["by_kind"]["a"]["speedup_vs_plain"] == 1  # plain against itself


def test_a_stop_token_ends_every_method_after_it():
    models = small_pair()
    prompt = small_prompts(1)[0]
    free = generate(models.target, prompt, 12)
    models.eos_id = free[4]                    # a token the model produces: every method must stop there
    records = bench.run_bench(["chain", "prompt_lookup", "self_spec"], models=models, prompts=[prompt],
                              max_new_tokens=12, repeats=1, gamma=3)
    stop = free.index(free[4]) + 1
    for r in records:
        assert r["new_tokens"] == stop and r["identical_to_plain_greedy"], r["method"]


def test_self_speculation_method_is_exact_and_uses_the_early_exit_depth():
    models = small_pair()
    records = bench.run_bench(["self_spec"], models=models, prompts=small_prompts(2), max_new_tokens=8, repeats=1)
    assert records[1]["method"] == "self_spec" and records[1]["identical_to_plain_greedy"] is True
    assert records[1]["draft_passes"] > 0 and records[1]["gamma"] == 4
    models.early_exit_layers = 5  # deeper than the 2-layer target: the one-line error of early_exit_draft
    with pytest.raises(ValueError, match="1 <= n_layers < 2"):
        bench.run_bench(["self_spec"], models=models, prompts=small_prompts(1), max_new_tokens=4, repeats=1)


class KeepEverything(Lookup):
    """A wrong method: prompt lookup whose rule keeps every copied token (its output follows the copies, not the
    target)."""
    @staticmethod
    def rule(sampling, generator):
        return lambda proposal, logits: (list(range(1, len(proposal.tokens))), int(logits[-1].argmax()))


def test_identity_check_catches_a_wrong_method(monkeypatch):
    monkeypatch.setitem(bench.METHODS, "keep_everything", None)   # the declaration is undone afterwards
    bench.declare("keep_everything", KeepEverything, "prompt lookup, every copied token kept",
                  params=dict(max_ngram=2, num_pred=4))
    prompts = [[5, 6, 7, 8, 5, 6], [1, 2, 3, 1, 2]]          # repeats: lookup copies, and the copies are kept
    records = bench.run_bench(["keep_everything"], models=small_pair(), prompts=prompts, max_new_tokens=6, repeats=1)
    assert records[0]["identical_to_plain_greedy"] is True
    assert records[1]["identical_to_plain_greedy"] is False and records[1]["mismatched_prompts"] == [0, 1]


def test_declare_adds_a_method(monkeypatch):
    monkeypatch.setitem(bench.METHODS, "plain_again", None)  # so that the declaration is undone afterwards
    seen = []

    def build(models, unused):
        seen.append(unused)
        return Plain()
    bench.declare("plain_again", Plain, "plain decoding under another name", build=build, params=dict(unused=7))
    records = bench.run_bench(["plain_again"], models=small_pair(), prompts=small_prompts(1), max_new_tokens=4,
                              repeats=1)
    assert records[1]["method"] == "plain_again" and records[1]["identical_to_plain_greedy"]
    assert records[1]["tokens_per_target_pass"] == 1 and set(seen) == {7}
    with pytest.raises(ValueError, match="has no parameter 'gamma'"):
        bench.METHODS["plain_again"].make(small_pair(), gamma=3)


def test_a_method_without_its_drafter_fails_in_one_line():
    with pytest.raises(ValueError, match="the medusa method needs Medusa heads, and none is loaded"):
        bench.run_bench(["medusa"], models=bench.Models(random_model(1)), prompts=small_prompts(1), max_new_tokens=4,
                        repeats=1)


# ---------------------------------------------------------------- the command line

@pytest.mark.parametrize("argv,message", [(["--methods", "plain,nope"], "unknown method 'nope'; available: plain"),
                                          (["--device", "nodevice"], "device 'nodevice' is not usable here"),
                                          (["--model", "smollm2", "--draft", "draft1"],
                                           "--draft chooses the course pair's draft"),
                                          (["--batch", "1,2", "--draft", "draft1"],
                                           "--draft chooses the course pair's draft")])
def test_cli_errors_are_one_line(argv, message, capsys):
    assert bench.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_cli_quick_json_on_the_shipped_pair(tmp_path, target, draft):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "minigpt.bench", "--quick", "--n-code", "2", "--n-edit", "1",
           "--max-new-tokens", "12", "--repeats", "1", "--device", "cpu", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = json.loads(out.read_text())
    assert [r["method"] for r in records][:2] == ["plain", "chain"]
    for r in records:
        assert RECORD_KEYS <= set(r) and r["identical_to_plain_greedy"] is True
        assert r["n_prompts"] == 3 and r["device"] == "cpu"
    assert records[0]["tokens_per_target_pass"] == 1 and records[0]["acceptance_rate"] is None
    assert 0 <= records[1]["acceptance_rate"] <= 1 and records[1]["gamma"] == 4
    assert "identical" in proc.stdout and "chain" in proc.stdout  # the table


def test_the_shipped_models_take_either_draft():
    one, two = (bench.Models.shipped("cpu", draft=name).draft for name in ("draft1", "draft"))
    assert one.config.n_layer == 1 and two.config.n_layer == 2


def test_cli_smollm2_without_the_file_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MINIGPT_SMOLLM_GGUF", str(tmp_path / "absent.gguf"))
    assert bench.main(["--model", "smollm2", "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "error:" in err[-1] and "python -m minigpt.real.smollm fetch" in err[-1]


def test_cli_smollm2_skips_a_method_whose_drafter_is_missing_in_one_line(monkeypatch, capsys):
    """``--model smollm2`` on stand-in models with no trained drafter: the methods that need one are skipped in one
    line naming the training commands; the others race with SmolLM2's defaults (prompt lookup copies 16)."""
    from minigpt.bench import smollm2
    target = random_model(0)
    monkeypatch.setattr(smollm2, "smollm2_models", lambda *a, **k: bench.Models(target, family="smollm2"))
    monkeypatch.setattr(smollm2, "real_prompts", lambda **k: small_prompts(2))
    assert bench.main(["--model", "smollm2", "--quick", "--methods", "plain,chain,medusa,prompt_lookup",
                       "--max-new-tokens", "6", "--repeats", "1"]) == 0
    out = capsys.readouterr()
    skip = [line for line in out.err.splitlines() if line.startswith("skipping")]
    assert skip == ["skipping chain, medusa: no trained drafter for SmolLM2 is installed "
                    "(python -m minigpt.real train-draft / train-medusa)"]
    assert "benchmarking plain, prompt_lookup on SmolLM2" in out.err
    assert [line.split()[0] for line in out.out.splitlines()[2:4]] == ["plain", "prompt_lookup"]


# ---------------------------------------------------------------- how busy the machine was

def test_other_load_sees_a_busy_neighbour_and_not_this_process():
    from minigpt.device import OtherLoad
    if OtherLoad()._busy_seconds() is None:
        pytest.skip("this machine does not report its CPU time (/proc/stat)")
    spin = "import time\nt = time.perf_counter()\nwhile time.perf_counter() - t < 1.5: pass"
    with OtherLoad() as alone_busy:          # this process busy: its own time is not counted
        t = time.perf_counter()
        while time.perf_counter() - t < 0.5:
            pass
    with OtherLoad() as beside:              # a neighbour process spinning the whole time
        proc = subprocess.Popen([sys.executable, "-c", spin])
        proc.wait()
    assert beside.cores > 0.5
    assert alone_busy.cores < beside.cores - 0.5   # counting this process's own time would make them about equal


def test_other_load_is_none_where_the_machine_does_not_say(monkeypatch, tmp_path):
    from minigpt.device import OtherLoad
    monkeypatch.setattr(OtherLoad, "STAT", str(tmp_path / "no-such-file"))
    with OtherLoad() as load:
        pass
    assert load.cores is None


def test_a_busy_run_says_so_in_its_table():
    from minigpt.device import busy_machine_note
    records = bench.run_bench(["prompt_lookup"], models=small_pair(), prompts=small_prompts(2), max_new_tokens=6,
                              repeats=1)
    for r in records:
        r["other_cpu_cores"] = 1.02
    assert "1.02 cores busy" in bench.format_table(records)
    for r in records:
        r["other_cpu_cores"] = 0.05
    assert "cores busy" not in bench.format_table(records)
    assert busy_machine_note(None) is None and busy_machine_note(0.3) is not None
