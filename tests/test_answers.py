"""The distillation-data generator on the batch engine, with a tiny random model: each answer is the target's own
greedy continuation (a follow-up's second turn after its first answer), the shards resume to the same data as
an uninterrupted run, the card counts what the shards hold, and the held-out conversations come last."""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

from conftest import ARCHS, random_model
from minigpt.decoding import generate
from minigpt.real.answers import Job, generate_answers, is_held_out, load_answers, shard_paths
from minigpt.real.smollm import gguf_path

EOS = 2
SETTINGS = dict(model="tiny", precision="fp32", mix="made up")


def make_jobs(n: int = 10) -> list[Job]:
    g = np.random.default_rng(0)
    jobs = []
    for i in range(n):
        turns = [g.integers(3, 97, int(g.integers(3, 12))).tolist()]
        if i % 3 == 0:  # a follow-up: a second user turn after the first answer
            turns.append(g.integers(3, 97, 4).tolist())
        jobs.append(Job(i, "followup" if i % 3 == 0 else "chat", turns))
    return jobs


@pytest.fixture(scope="module")
def target():
    return random_model(0, **ARCHS["llama"], block_size=256)


def conversations(out_dir):
    data, _ = load_answers(held_out=0.0, out_dir=out_dir)
    return dict(zip(data["request"].tolist(), zip(np.split(data["tokens"], data["starts"][1:]),
                                                   np.split(data["answer"], data["starts"][1:]))))


def test_each_answer_is_the_targets_greedy_continuation(target, tmp_path):
    jobs = make_jobs()
    generate_answers(target, jobs, tmp_path, SETTINGS, EOS, max_new_tokens=9, batch_size=4, shard_size=4, log=print)
    convs = conversations(tmp_path)
    assert sorted(convs) == [j.request for j in jobs]
    for job in jobs:
        tokens, answer = (a.tolist() for a in convs[job.request])
        ids = list(job.turns[0])
        for k, turn in enumerate(job.turns):
            if k:
                ids += turn
            out = generate(target, ids, 9, eos_id=EOS)         # alone, greedy: what the batch must have said
            assert tokens[len(ids):len(ids) + len(out)] == out and answer[len(ids):len(ids) + len(out)] == [1] * len(out)
            assert not any(answer[len(ids) - len(turn) if k else 0:len(ids)])   # the prompt is not an answer
            ids += out
            if k + 1 < len(job.turns) and out[-1] != EOS:
                ids.append(EOS)                                  # a cut answer still closes its turn
        assert tokens == ids


def test_a_restart_continues_to_the_same_data(target, tmp_path):
    jobs, kw = make_jobs(), dict(max_new_tokens=9, batch_size=3, shard_size=4, log=lambda *a: None)
    generate_answers(target, jobs, tmp_path / "once", SETTINGS, EOS, **kw)
    generate_answers(target, jobs, tmp_path / "twice", SETTINGS, EOS, max_shards=1, **kw)   # stopped after a shard
    assert len(shard_paths(tmp_path / "twice")) == 1
    card = generate_answers(target, jobs, tmp_path / "twice", SETTINGS, EOS, **kw)
    assert card["stats"]["shards"] == 3
    for a, b in zip(shard_paths(tmp_path / "once"), shard_paths(tmp_path / "twice"), strict=True):
        with np.load(a) as x, np.load(b) as y:
            for key in ("tokens", "answer", "starts", "kinds", "request", "turn_length", "turn_eos", "digest"):
                assert np.array_equal(x[key], y[key]), key
    with pytest.raises(ValueError, match="max_new_tokens"):   # other settings would mix two data sets
        generate_answers(target, jobs, tmp_path / "once", SETTINGS, EOS, **{**kw, "max_new_tokens": 5})


def test_workers_fill_one_folder_with_the_data_of_one_process(target, tmp_path):
    jobs, kw = make_jobs(), dict(max_new_tokens=9, batch_size=3, shard_size=2, log=lambda *a: None)
    generate_answers(target, jobs, tmp_path / "one", SETTINGS, EOS, **kw)
    made = []
    for i in (1, 2):   # in turn, each its own half; a process started twice skips what its half already holds
        generate_answers(target, jobs, tmp_path / "two", SETTINGS, EOS, worker=(i, 2), **kw)
        made.append({p.name for p in shard_paths(tmp_path / "two")})
    assert made[0] == {f"shard-{s:05d}.npz" for s in (0, 2, 4)} and len(made[1]) == 5
    card = generate_answers(target, jobs, tmp_path / "two", SETTINGS, EOS, worker=(2, 2), **kw)
    assert card["stats"]["shards"] == 5 and not list((tmp_path / "two").glob("*.tmp"))
    for a, b in zip(shard_paths(tmp_path / "one"), shard_paths(tmp_path / "two"), strict=True):
        with np.load(a) as x, np.load(b) as y:
            assert np.array_equal(x["tokens"], y["tokens"]) and np.array_equal(x["request"], y["request"])
    with pytest.raises(ValueError, match="worker 3/2"):
        generate_answers(target, jobs, tmp_path / "two", SETTINGS, EOS, worker=(3, 2), **kw)


def test_the_folder_is_the_environments_then_the_checkouts_then_the_caches(tmp_path, monkeypatch):
    from minigpt.real import answers
    monkeypatch.setenv("MINIGPT_ANSWERS", str(tmp_path / "mine"))
    assert answers.answers_dir() == tmp_path / "mine"
    monkeypatch.delenv("MINIGPT_ANSWERS")
    checkout = answers.Path(answers.__file__).resolve().parents[2] / "data" / answers.ANSWERS_DIR
    monkeypatch.setenv("MINIGPT_CACHE", str(tmp_path / "cache"))
    expected = checkout if checkout.is_dir() else tmp_path / "cache" / answers.ANSWERS_DIR
    assert answers.answers_dir() == expected


def test_a_changed_request_is_decoded_again_with_its_shard_only(target, tmp_path):
    jobs, kw = make_jobs(), dict(max_new_tokens=6, batch_size=3, shard_size=4)
    generate_answers(target, jobs, tmp_path, SETTINGS, EOS, log=lambda *a: None, **kw)
    before = {p.name: p.stat().st_mtime_ns for p in shard_paths(tmp_path)}
    jobs[5].turns[0] = [7, 8, 9]                                # request 5 is in shard 1 (positions 4-7)
    said = []
    generate_answers(target, jobs, tmp_path, SETTINGS, EOS, log=said.append, **kw)
    after = {p.name: p.stat().st_mtime_ns for p in shard_paths(tmp_path)}
    assert [n for n in before if before[n] != after[n]] == ["shard-00001.npz"] and "decoding it again" in said[0]
    assert conversations(tmp_path)[5][0][:3].tolist() == [7, 8, 9]


def test_the_card_counts_the_shards(target, tmp_path):
    jobs = make_jobs()
    card = generate_answers(target, jobs, tmp_path, SETTINGS, EOS, max_new_tokens=9, batch_size=4, shard_size=4,
                            log=lambda *a: None)
    assert json.loads((tmp_path / "card.json").read_text()) == card
    data, _ = load_answers(held_out=0.0, out_dir=tmp_path)
    st = card["stats"]
    assert st["conversations_by_kind"] == {"chat": 6, "followup": 4} and st["answers"] == 14
    assert st["answer_tokens"] == int(data["answer"].sum()) and st["batch_sizes"] == [4] and st["threads"]
    lengths = [n for p in shard_paths(tmp_path) for n in np.load(p)["turn_length"].tolist()]
    assert st["mean_answer_length"] == pytest.approx(np.mean(lengths), abs=0.05) and max(lengths) <= 9
    assert card["settings"]["max_new_tokens"] == 9 and card["settings"]["decoding"] == "greedy"


def test_held_out_conversations_come_last(target, tmp_path):
    jobs = make_jobs(40)
    generate_answers(target, jobs, tmp_path, SETTINGS, EOS, max_new_tokens=2, batch_size=8, shard_size=16,
                     log=lambda *a: None)
    data, n_val = load_answers(held_out=0.2, out_dir=tmp_path)
    held = [is_held_out(int(r), 0.2) for r in data["request"]]
    assert 0 < n_val < 40 and held == [False] * (40 - n_val) + [True] * n_val
    with pytest.raises(FileNotFoundError, match="make-answers"):
        load_answers(out_dir=tmp_path / "empty")


@pytest.mark.skipif(gguf_path() is None or importlib.util.find_spec("gguf") is None,
                    reason="needs the SmolLM2 file (python -m minigpt.real.smollm fetch) and gguf")
def test_a_second_turn_is_tokenized_as_the_chat_template_does():
    from minigpt.real.answers import smollm2_jobs
    from minigpt.real.smollm import STOP, encode_chat, load_smollm_tokenizer
    enc = load_smollm_tokenizer()
    job = next(j for j in smollm2_jobs(60) if len(j.turns) == 2)
    from minigpt.real.request_mix import request_mix
    first, second = next(r for r in request_mix(60) if r.index == job.request).turns
    reply = "Sure. Here is a short answer."
    built = job.turns[0] + enc.encode(reply) + [enc.encode_single_token(STOP)] + job.turns[1]
    assert built == encode_chat(enc, [{"role": "user", "content": first}, {"role": "assistant", "content": reply},
                                      {"role": "user", "content": second}])
