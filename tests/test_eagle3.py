"""The EAGLE-3 head: chosen layers read in one pass, the fusion head's shapes, training-time test (its training
path and the KV-cache path the proposer drives give the same drafts; a few steps lower the loss), saving and
loading, drafting with the EAGLE proposer, and the resumable SmolLM2 trainer on a stand-in model."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import ARCHS, random_model
from minigpt.checkpoint import CheckpointError
from minigpt.decoding import generate
from minigpt.decoding.eagle import Eagle
from minigpt.decoding.session import decode
from minigpt.eagle_head import Eagle3Head, default_feature_layers, load_eagle, load_eagle3, save_eagle3
from minigpt.training.train_eagle3 import chain_hits, chain_summary, step_mask, target_pass, ttt_loss


def tiny(arch: str = "llama", seed: int = 0):
    return random_model(seed, **ARCHS[arch], n_layer=4, block_size=128)


def test_layer_states_are_the_blocks_outputs_of_the_same_pass():
    model = tiny()
    x = torch.randint(97, (2, 9))
    final, states = model.layer_states(x, (0, 2, 3))
    h, outs = model.transformer.wte(x), []
    for block in model.transformer.h:
        h = block(h, None, None, 0, model.rotary(torch.arange(9)))
        outs.append(h)
    assert all(torch.allclose(s, outs[i]) for s, i in zip(states, (0, 2, 3)))
    assert torch.allclose(final, model.hidden_states(x))
    assert all(not b._forward_hooks for b in model.transformer.h)        # the hooks are gone afterwards
    with pytest.raises(ValueError, match="layers"):
        model.layer_states(x, (4,))
    assert default_feature_layers(30) == (1, 14, 27)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_fusion_head_reads_three_layers_or_its_own_output(arch):
    target = tiny(arch)
    head = Eagle3Head(target, vocab_subset=torch.arange(10, 40))
    C = target.config.n_embd
    x = torch.randint(97, (2, 7))
    feats = head.target_features(x)
    assert feats.shape == (2, 7, 3 * C)
    h = head(feats[:, :-1], x[:, 1:])
    assert h.shape == (2, 6, C) and head.logits(h).shape == (2, 6, 30)
    assert head(h, x[:, 1:]).shape == (2, 6, C)                       # its own outputs, C wide
    assert head.token_ids(torch.tensor([0, 29])).tolist() == [10, 39]
    with pytest.raises(ValueError, match="wide"):
        head(feats[..., :2 * C], x)
    # before training, the read-out is the target's output layer on the normalised highest layer's feature
    assert torch.allclose(head.readout.weight, target.lm_head.weight[10:40])


def test_training_time_test_drafts_what_the_kv_cache_path_drafts():
    """Step k of the training path (its own outputs fed back, step masks) and the cached passes the proposer
    makes give the same tokens: the head is trained on what it meets while drafting."""
    target = tiny()
    head = Eagle3Head(target).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = torch.randint(97, (1, 20))
    features, labels = target_pass(head, x)
    _, record = ttt_loss(head, features, x, labels, steps=4)
    hits = chain_hits(head, x, labels, depth=4)
    assert [h for h, _ in record] == hits.sum(0).tolist()
    assert [n for _, n in record] == [19, 18, 17, 16]                  # entries with a label at each depth
    assert step_mask(3, 2).int().tolist() == [[1, 0, 0, 1, 0, 0, 1, 0, 0], [1, 1, 0, 0, 1, 0, 0, 1, 0],
                                              [1, 1, 1, 0, 0, 1, 0, 0, 1]]


def test_a_few_training_time_test_steps_lower_the_loss():
    target = tiny()
    head = Eagle3Head(target, vocab_subset=torch.arange(97))
    x = torch.randint(97, (4, 24), generator=torch.Generator().manual_seed(1))
    features, labels = target_pass(head, x)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        loss, _ = ttt_loss(head, features, x, labels, steps=3)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]


def test_save_and_load_round_trip(tmp_path):
    target = tiny()
    head = Eagle3Head(target, vocab_subset=torch.arange(5, 50)).eval()
    save_eagle3(head, tmp_path / "h.pt", card="{}")
    back = load_eagle3(target, tmp_path / "h.pt")
    x = torch.randint(97, (1, 8))
    f = head.target_features(x)
    with torch.no_grad():
        assert torch.equal(head.logits(head(f, x)), back.logits(back(f, x)))
    assert back.feature_layers == head.feature_layers and torch.equal(back.vocab_subset, head.vocab_subset)
    save_eagle3(head, tmp_path / "b.pt", dtype=torch.bfloat16)
    assert load_eagle3(target, tmp_path / "b.pt").readout.weight.dtype == torch.float32
    with pytest.raises(CheckpointError, match="load_eagle3"):
        load_eagle(target, tmp_path / "h.pt")
    with pytest.raises(CheckpointError, match="layers"):
        load_eagle3(random_model(0, **ARCHS["llama"], n_layer=3), tmp_path / "h.pt")


def test_the_eagle_proposer_drafts_with_it_and_decoding_stays_exact():
    target = tiny()
    head = Eagle3Head(target).eval()
    prompt = torch.randint(97, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    plain = generate(target, prompt, 20)
    eagle = Eagle(head, depth=3, top_k=2, total_tokens=5)
    assert eagle.needs_hidden == head.feature_layers  # the loop records those layers in its own passes
    ids, stats = decode(target, prompt, 20, eagle)
    assert ids == plain and stats.proposed > 0                         # exact, whatever the head proposes
    # the first chain it proposes is the head's own argmax chain, computed here without a cache from the
    # target's layers recomputed over the prompt: the features the loop handed it were those layers
    proposals = []

    class Spy(Eagle):
        def propose(self, session, room):
            p = super().propose(session, room)
            proposals.append(p.tokens)
            return p
    decode(target, prompt, 4, Spy(head, depth=3, top_k=1, total_tokens=3))
    with torch.no_grad():
        x = torch.tensor([prompt])
        h, kv = head.step(head.target_features(x)[:, :-1], x[:, 1:], torch.arange(11))  # the prompt's entries
        earlier, last, chain = [kv], h[:, -1:], []
        for d in range(3):  # each drafted token reads the last output and sees every earlier entry
            chain.append(int(head.token_ids(head.logits(last[0, -1]).argmax())))
            last, kv = head.step(last, torch.tensor([[chain[-1]]]), torch.tensor([11 + d]), earlier=earlier)
            earlier.append(kv)
    assert proposals[0][1:] == chain


def test_train_eagle3_head_resumes_where_it_stopped(monkeypatch, tmp_path):
    """The SmolLM2 trainer on a stand-in model and made-up conversations: 3 steps in two calls (2, then 1 more)
    end with the same weights as 3 steps in one; the best head is exported with its card and loads back."""
    from minigpt.real import distill
    target = random_model(1, **ARCHS["llama"], n_layer=4, block_size=128)
    rng = np.random.default_rng(0)
    convs = [rng.integers(0, 97, 80) for _ in range(12)]
    answer = [np.r_[np.zeros(30, bool), np.ones(50, bool)] for _ in convs]
    data = dict(tokens=np.concatenate(convs).astype(np.uint16), answer=np.concatenate(answer).astype(np.uint8),
                starts=np.cumsum([0] + [len(c) for c in convs])[:-1])
    monkeypatch.setattr(distill, "load_answers", lambda held_out=0.05: (data, 3))
    monkeypatch.setattr(distill, "load_smollm", lambda device=None: target)
    monkeypatch.setattr(distill, "SMOLLM2_EAGLE_CHECKPOINT", tmp_path / "absent.pt")
    kw = dict(subset_size=40, batch_size=2, block_size=64, ttt_steps=3, eval_every=2, eval_conversations=2,
              eval_depth=3, dev_prompts=[rng.integers(0, 97, 9).tolist() for _ in range(2)], dev_tokens=8,
              log=lambda *a: None)
    distill.train_eagle3_head(5.0, max_steps=2, out=tmp_path / "a", export_to=tmp_path / "a.pt", **kw)
    info = distill.train_eagle3_head(5.0, max_steps=3, out=tmp_path / "a", export_to=tmp_path / "a.pt", **kw)
    once = distill.train_eagle3_head(5.0, max_steps=3, out=tmp_path / "b", export_to=tmp_path / "b.pt", **kw)
    assert info["steps"] == once["steps"] == 3
    a = torch.load(tmp_path / "a" / "smollm2-eagle3" / "state.pt", weights_only=True)["head"]
    b = torch.load(tmp_path / "b" / "smollm2-eagle3" / "state.pt", weights_only=True)["head"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    head = load_eagle3(target, tmp_path / "a.pt")
    assert len(head.vocab_subset) == 40
    card = __import__("json").loads(torch.load(tmp_path / "a.pt", weights_only=True)["card"])
    assert len(card["held_out"]["agreement_by_depth"]) == 3 and card["held_out"]["chain_tau"] >= 1
    # chosen on the development requests (prompt + the target's greedy answer; only answer positions count)
    assert card["selected_by"].startswith("chain tau on the development") and card["dev_requests"]["entries"] > 0
    windows = distill.request_windows(target, kw["dev_prompts"], 8, None)
    assert [x.shape[1] for x, _ in windows] == [17, 17] and [int(c.sum()) for _, c in windows] == [8, 8]
    assert all(torch.equal(x[0, 9:], torch.tensor(generate(target, x[0, :9].tolist(), 8))) for x, _ in windows)
    # a new machine: no state in out/, only the exported head -- training starts from its weights and step
    logs = []
    again = distill.train_eagle3_head(5.0, max_steps=card["exported_step"], out=tmp_path / "c",
                                      export_to=tmp_path / "c.pt", init_from=tmp_path / "a.pt",
                                      **{**kw, "log": logs.append})
    assert again["steps"] == card["exported_step"] and any("started from" in m for m in logs)
    c = torch.load(tmp_path / "c" / "smollm2-eagle3" / "state.pt", weights_only=True)["head"]
    assert all(torch.equal(c[k].float(), head.state_dict()[k].float()) for k in c)   # no step taken: the export


def test_chain_summary_counts_leading_hits():
    hits = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    s = chain_summary(hits, torch.tensor([True, True, True, False]))
    assert s["agreement_by_depth"] == [round(2 / 3, 4), 0.5, 0.0] and s["chain_tau"] == 1 + 3 / 3


def test_a_batch_hands_each_sequence_the_heads_layers():
    from minigpt.decoding.batch import decode_batch
    target = tiny("llama", seed=2)
    head = Eagle3Head(target).eval()
    prompts = [torch.randint(97, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 9, 12)]
    for share in (False, True):
        outs, stats, batch = decode_batch(target, [[3, 4, 5] + p for p in prompts], 14,
                                          Eagle(head, depth=3, top_k=2, total_tokens=5), share_prefix=share,
                                          block_size=4)
        assert outs == [generate(target, [3, 4, 5] + p, 14) for p in prompts] and batch.blocks_left == 0
    assert sum(s.proposed for s in stats) > 0
