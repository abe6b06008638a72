"""``python -m minigpt.bench --batch``: the batch-size race (minigpt.bench.batch) on small models."""
from __future__ import annotations

import pytest

from conftest import perturbed_copy, random_model
from minigpt.bench.batch import batch_prompts, report_batch, run_batch_bench
from minigpt.bench.cli import main
from minigpt.bench.methods import Models


def test_batch_race_records_every_method_and_size():
    target = random_model(1)
    models = Models(target, perturbed_copy(target, 0.3, seed=2))
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7], [9, 9, 4, 9, 9], [3, 4]]
    records = run_batch_bench([1, 2, 4], max_new_tokens=12, repeats=2, models=models, prompts=prompts)
    assert [(r["batch"], r["method"]) for r in records] == [(b, m) for b in (1, 2, 4)
                                                            for m in ("plain", "chain", "prompt_lookup")]
    for r in records:
        assert r["identical_to_solo_plain"] and r["blocks_left"] == 0
        assert r["tokens"] == 12 * r["batch"]
        assert r["tokens_per_s_min"] <= r["tokens_per_s"] <= r["tokens_per_s_max"]
        assert r["speedup_min"] <= r["speedup"] <= r["speedup_max"]
        # two repeats are too few for a verdict (the course's rule: 5), and say so
        assert r["verdict"] == ("baseline" if r["method"] == "plain" else "too few repeats")
        assert r["noise_band"][0] <= 1 <= r["noise_band"][1]
    assert all(len(r["aa_ratios"]) == 2 for r in records if r["method"] == "plain")   # plain against its A/A twin
    plain = [r for r in records if r["method"] == "plain"]
    assert all(r["tokens_per_batch_pass"] == r["batch"] for r in plain)   # one token per sequence per pass
    table = report_batch(records)
    assert "every output identical" in table and "no KV block left" in table and "too few repeats" in table


def test_every_declared_method_runs_in_the_batch_engine():
    """No list of batched methods: whatever is declared races at B = 2 and 3, exact and leaving no block behind."""
    from minigpt.decoding import METHODS
    from minigpt.eagle_head import Eagle3Head, EagleHead
    from minigpt.medusa_heads import MedusaHeads
    target = random_model(1)
    models = Models(target, perturbed_copy(target, 0.3, seed=2), MedusaHeads.for_target(target, n_heads=2).eval(),
                    [(0,), (1,), (0, 0)], EagleHead(target).eval(), eagle3_head=Eagle3Head(target).eval())
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7], [9, 9, 4, 9, 9]]
    records = run_batch_bench([2, 3], methods=tuple(METHODS), max_new_tokens=8, repeats=1, models=models,
                              prompts=prompts)
    assert {r["method"] for r in records} == set(METHODS)
    assert all(r["identical_to_solo_plain"] and r["blocks_left"] == 0 for r in records)


def test_batch_prompts_mix_edits_through_the_list():
    ps = batch_prompts(8)
    assert [p.kind for p in ps].count("edit") == 2 and ps[3].kind == "edit" and ps[0].kind == "code"


@pytest.mark.parametrize("argv, message", [(["--batch", "1,x"], "comma-separated"), (["--batch", "0"], "positive"),
                                           (["--batch", "2", "--model", "smollm2"], "course's models")])
def test_batch_cli_errors(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err
