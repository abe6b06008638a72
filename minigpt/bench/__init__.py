"""Benchmark every decoding method on the same held-out prompts: ``python -m minigpt.bench``.

    python -m minigpt.bench                       # all methods, 8 code + 4 edit prompts, 64 new tokens
    python -m minigpt.bench --quick               # a smaller run (under a minute on a laptop CPU)
    python -m minigpt.bench --methods plain,chain --gamma 6 --json results.json --device cpu
    python -m minigpt.bench --model smollm2       # SmolLM2-135M-Instruct on chat requests (Lesson 09)

All methods decode greedily (temperature 0), so each must reproduce plain greedy decoding token for token;
the benchmark checks that on every prompt. Timing is fair by construction: the methods run interleaved,
prompt by prompt (their order rotating), after a warm-up, and each speed is a median over repeats. Plain
decoding always runs, since it is the baseline of ``speedup_vs_plain`` and of the exactness check.

The package: :mod:`~minigpt.bench.methods` (what a method may use, the registry and the registered methods),
:mod:`~minigpt.bench.run` (:func:`run_bench`: timing, exactness, the records), :mod:`~minigpt.bench.table`
(:func:`format_table`), :mod:`~minigpt.bench.smollm2` (the SmolLM2 models) and :mod:`~minigpt.bench.cli` (the
command line). A new decoder joins by registering a function ``run(models, prompt, max_new_tokens, **params)
-> (new ids, DecodeStats)``::

    @register("prompt_lookup", max_ngram=3, num_pred=8)
    def _prompt_lookup(models, prompt, max_new_tokens, max_ngram, num_pred):
        return lookup_generate(models.target, prompt, max_new_tokens, max_ngram=max_ngram, num_pred=num_pred)
"""
from .cli import BENCH_PRESETS, main
from .methods import METHODS, Method, Models, register
from .run import bench_prompts, check_device, check_methods, run_bench
from .smollm2 import SMOLLM2_BENCH_PRESETS, smollm2_models
from .table import format_table

__all__ = ["BENCH_PRESETS", "METHODS", "Method", "Models", "SMOLLM2_BENCH_PRESETS", "bench_prompts", "check_device",
           "check_methods", "format_table", "main", "register", "run_bench", "smollm2_models"]
