"""Benchmark every decoding method on the same held-out prompts: ``python -m minigpt.bench``.

    python -m minigpt.bench                       # all methods, 8 code + 4 edit prompts, 64 new tokens
    python -m minigpt.bench --quick               # a smaller run (under a minute on a laptop CPU)
    python -m minigpt.bench --methods plain,chain --gamma 6 --json results.json --device cpu
    python -m minigpt.bench --model smollm2       # SmolLM2-135M-Instruct on chat requests (Lesson 09)

All methods decode greedily (temperature 0), so each must reproduce plain greedy decoding token for token;
the benchmark checks that on every prompt. Timing is fair by construction: the methods run interleaved,
prompt by prompt (their order rotating), after a warm-up, and each speed is a median over repeats. Plain
decoding always runs, since it is the baseline of ``speedup_vs_plain`` and of the exactness check.

The package: :mod:`~minigpt.bench.run` (:func:`run_bench`: timing, exactness, the records), :mod:`~minigpt.bench.table`
(:func:`format_table`), :mod:`~minigpt.bench.batch` (``--batch``), :mod:`~minigpt.bench.smollm2` (the SmolLM2
models) and :mod:`~minigpt.bench.cli` (the command line). The methods are the decoding registry's
(:data:`minigpt.decoding.registry.METHODS`): a new decoder joins every race by one declaration::

    declare("prompt_lookup", Lookup, "copy what followed ...", params=dict(max_ngram=3, num_pred=8))
"""
from .cli import BENCH_PRESETS, main
from .methods import METHODS, Method, Models, declare
from .run import bench_prompts, check_device, check_methods, run_bench
from .smollm2 import SMOLLM2_BENCH_PRESETS, smollm2_models
from .table import format_table

__all__ = ["BENCH_PRESETS", "METHODS", "Method", "Models", "SMOLLM2_BENCH_PRESETS", "bench_prompts", "check_device",
           "check_methods", "declare", "format_table", "main", "run_bench", "smollm2_models"]
