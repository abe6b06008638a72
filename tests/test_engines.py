"""minigpt.engines: llama.cpp on SmolLM2's GGUF next to minigpt. The parts that need no llama.cpp run always;
the rest skip with the install command when the ``[engines]`` extra (llama-cpp-python) or the GGUF is missing."""
from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from conftest import random_model
from minigpt.decoding.lookup import find_candidates
from minigpt.engines import (INSTALL_HINT, CourseLookupDraft, CourseModelDraft, agreement, batch_consistency,
                             llama_cpp_available, minigpt_logits_of, require_llama_cpp)


def test_a_missing_extra_is_one_line_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)   # as if not installed
    with pytest.raises(ImportError) as e:
        require_llama_cpp()
    assert 'pip install -e ".[engines]"' in str(e.value) and "\n" not in str(e.value)
    from minigpt.bench.cli import main
    assert main(["--model", "smollm2", "--engines", "--quick"]) == 2


def test_engines_need_the_smollm2_model(capsys):
    from minigpt.bench.cli import main
    assert main(["--engines", "--quick"]) == 2
    assert "--model smollm2" in capsys.readouterr().err


def test_agreement_reports_the_first_divergence():
    assert agreement([1, 2, 3, 4], [1, 2, 9, 4]) == dict(first_divergence=2, agreeing_prefix=2, compared=4,
                                                         same_position_share=0.75)
    assert agreement([1, 2, 3], [1, 2, 3, 7])["first_divergence"] is None
    assert agreement([1, 2, 3], [1, 2, 3, 7])["agreeing_prefix"] == 3
    assert agreement([5], [6])["same_position_share"] == 0.0


def test_minigpts_fp32_path_scores_k_tokens_like_k_single_steps(arch):
    model = random_model(3, **arch)
    assert minigpt_logits_of(model)([1, 2], [[3, 4]]).shape == (2, 97)   # callable outside no_grad
    rep = batch_consistency(minigpt_logits_of(model), [1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11])
    assert rep["positions"] == 6 and rep["argmax_differs"] == 0 and rep["max_abs_diff"] < 1e-4


def test_batch_consistency_catches_a_scorer_whose_batched_logits_differ():
    model = random_model(3)
    exact = minigpt_logits_of(model)

    def sloppy(prompt, chunks):   # a wrong kernel: the batched pass's logits come out shifted by one position
        out = exact(prompt, chunks)
        return np.roll(out, 1, axis=0) if len(chunks) == 1 and len(chunks[0]) > 1 else out
    rep = batch_consistency(sloppy, [1, 2, 3], [4, 5, 6, 7, 8])
    assert rep["argmax_differs"] > 0 and rep["max_abs_diff"] > 0.1


def test_the_course_lookup_draft_is_find_candidates():
    seq = np.array([4, 5, 6, 7, 1, 2, 4, 5, 6, 9, 4, 5], dtype=np.intc)
    assert CourseLookupDraft(3, 4)(seq).tolist() == find_candidates(seq.tolist(), 3, 4) == [6, 9, 4, 5]
    assert CourseLookupDraft()(np.array([1, 2, 3], dtype=np.intc)).size == 0


def test_the_course_model_draft_reuses_its_cache_and_proposes_what_a_fresh_one_would():
    draft = random_model(4)
    kept = CourseModelDraft(draft, gamma=3)
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 97, (12,), generator=g).tolist()
    calls = [seq[:6], seq[:8], seq[:8] + [3], seq[:5] + [1, 2], seq]   # grows, then diverges, then grows again
    for ids in calls:
        fresh = CourseModelDraft(draft, gamma=3)
        got = kept(np.array(ids, dtype=np.intc))
        assert got.tolist() == fresh(np.array(ids, dtype=np.intc)).tolist(), ids
        assert len(got) == 3
    assert kept.passes < sum(len(ids) for ids in calls)   # the cache was reused: fewer than re-reading everything


def test_a_course_draft_is_any_token_only_chain_proposer():
    """CourseDraft runs a declared method's proposer in llama.cpp's protocol: the self-speculation chain works like
    the draft model's; a proposer that reads the target's hidden states, or proposes a tree, is refused in one line."""
    from minigpt.decoding import METHODS, Models
    from minigpt.eagle_head import EagleHead
    from minigpt.engines import CourseDraft
    target = random_model(4)
    models = Models(target, eagle_head=EagleHead(target), early_exit_layers=1)
    ids = np.array([5, 6, 7, 5, 6, 7, 5, 6], dtype=np.intc)
    early = CourseDraft(METHODS["self_spec"].make(models, gamma=3))
    assert len(early(ids)) == 3 and early.passes == 3
    with pytest.raises(ValueError, match="hidden states, which llama.cpp's draft protocol does not pass"):
        CourseDraft(METHODS["eagle"].make(models))
    from minigpt.decoding import LookupTree
    with pytest.raises(ValueError, match="proposed a tree; llama.cpp verifies one chain"):
        CourseDraft(LookupTree(2, 2, max_matches=3))(np.array([1, 2, 3, 1, 2, 4, 1, 2], dtype=np.intc))


# ---- llama.cpp itself (the [engines] extra and SmolLM2's GGUF) ----

def _gguf():
    from minigpt.real.smollm import gguf_path
    return gguf_path()


needs_llama = pytest.mark.skipif(not llama_cpp_available(), reason=f"llama.cpp is not installed: {INSTALL_HINT}")
needs_gguf = pytest.mark.skipif(_gguf() is None, reason="SmolLM2's GGUF is not here: python -m minigpt.real.smollm fetch")


@pytest.fixture(scope="module")
def engine():
    from minigpt.engines import LlamaCpp
    return LlamaCpp(n_threads=1)


@pytest.fixture(scope="module")
def edit_request():
    from minigpt.real.request_sets import real_prompts
    return real_prompts(kinds=("edit",), per_kind=1)[0]


@needs_llama
@needs_gguf
def test_llama_cpp_loads_the_same_file_with_the_same_tokenizer(engine):
    from minigpt.real.smollm import chat_prompt, encode_chat, load_smollm_tokenizer
    question = "Rename the variable x to total in:\n    x = 1 + 2\n    print(x * 10)"
    ids = encode_chat(load_smollm_tokenizer(), question)
    theirs = engine.llm.tokenize(chat_prompt(question).encode(), add_bos=False, special=True)
    assert theirs == ids and engine.vocab_size == 49152


@needs_llama
@needs_gguf
def test_llama_cpp_prompt_lookup_equals_its_own_plain_greedy_output(engine, edit_request):
    from minigpt.engines import llama_lookup
    from minigpt.real.smollm import STOP, load_smollm_tokenizer
    eos = load_smollm_tokenizer().encode_single_token(STOP)
    plain, ps = engine.greedy(edit_request, 48, eos)
    again, _ = engine.greedy(edit_request, 48, eos)
    looked, ls = engine.greedy(edit_request, 48, eos, draft=llama_lookup(3, 8))
    assert plain == again                          # greedy is deterministic
    assert looked == plain, agreement(plain, looked)
    assert ps.target_passes == len(plain) - 1 or ps.target_passes == len(plain)
    assert ls.target_passes < ps.target_passes     # copying from the request saved passes


@needs_llama
@needs_gguf
def test_a_course_drafter_runs_inside_llama_cpp(engine, edit_request):
    from minigpt.real.loaders import SMOLLM2_DRAFT_CHECKPOINT, load_smollm2_draft
    from minigpt.real.smollm import STOP, load_smollm_tokenizer
    eos = load_smollm_tokenizer().encode_single_token(STOP)
    plain, ps = engine.greedy(edit_request, 32, eos)
    ours, ls = engine.greedy(edit_request, 32, eos, draft=CourseLookupDraft(3, 8))
    assert agreement(plain, ours)["agreeing_prefix"] >= 16 and ls.target_passes < ps.target_passes
    if SMOLLM2_DRAFT_CHECKPOINT.exists():
        draft = CourseModelDraft(load_smollm2_draft("cpu"), gamma=4)
        out, st = engine.greedy(edit_request, 32, eos, draft=draft)
        assert draft.passes > 0 and st.target_passes < ps.target_passes
        assert agreement(plain, out)["agreeing_prefix"] >= 16


@needs_llama
@needs_gguf
def test_llama_cpp_and_minigpt_agree_on_the_first_tokens_and_the_report_says_where_they_part(engine, edit_request):
    from minigpt.decoding import generate
    from minigpt.real.smollm import load_smollm
    ours = generate(load_smollm("cpu"), edit_request, 24)
    theirs, _ = engine.greedy(edit_request, 24)
    rep = agreement(ours, theirs)
    assert rep["compared"] == 24 and rep["agreeing_prefix"] >= 4   # the same model, other arithmetic


def test_the_bench_judges_engine_methods_against_their_own_plain_output():
    """run_bench(engines=...) with stand-in engine methods (no llama.cpp needed): an engine method is 'identical'
    when it reproduces llama_plain, whatever our plain output is, and its record says where it parts from ours."""
    from minigpt.bench import run_bench
    from minigpt.bench.methods import Models
    from minigpt.decoding import DecodeStats, generate
    from minigpt.bench.table import format_table
    target = random_model(1)

    class Stand:
        def __init__(self, name, shift):
            self.name, self.shift, self.params, self.description = name, shift, {}, name
            self.stats = DecodeStats()

        def __call__(self, prompt, n):
            out = generate(target, prompt, n)
            out = out[:3] + [(t + self.shift) % 97 for t in out[3:]]   # parts from ours after 3 tokens
            self.stats = DecodeStats(new_tokens=len(out), target_passes=len(out))
            return out

    engines = {"llama_plain": Stand("llama_plain", 1), "llama_same": Stand("llama_same", 1),
               "llama_other": Stand("llama_other", 2)}
    records = run_bench(["plain"], models=Models(target), prompts=[[1, 2, 3], [4, 5]], max_new_tokens=8,
                        repeats=1, engines=engines)
    by = {r["method"]: r for r in records}
    assert by["plain"]["identical_to_plain_greedy"] and by["llama_same"]["identical_to_plain_greedy"]
    assert not by["llama_other"]["identical_to_plain_greedy"]
    assert by["llama_same"]["reference"] == "llama_plain"
    assert [a["first_divergence"] for a in by["llama_same"]["agreement_with_ours"]] == [3, 3]
    assert by["llama_plain"]["speedup_vs_reference"] == 1.0
    assert "speed over llama_plain" in format_table(records)
    with pytest.raises(ValueError, match="llama_plain"):
        run_bench(["plain"], models=Models(target), prompts=[[1, 2]], max_new_tokens=4, repeats=1,
                  engines={"llama_same": Stand("llama_same", 1)})
