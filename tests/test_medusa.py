"""Medusa heads and Medusa decoding: the heads' start, the loss's shift, the sparse tree, exactness, loading."""
import itertools
import math

import pytest
import torch

from conftest import random_model
from minigpt import GPT, GPTConfig, generate
from minigpt.checkpoint import CheckpointError
from minigpt.decoding.medusa import medusa_generate, typical_acceptance
from minigpt.medusa_heads import MedusaHeads, expected_accept_length, load_heads, save_heads, sparse_tree_paths
from minigpt.training.train_heads import medusa_loss, train_heads
from minigpt.sampling import SamplingConfig

TREE_ACC = torch.tensor([[0.6, 0.2, 0.1], [0.4, 0.15, 0.05], [0.3, 0.1, 0.05]])  # a plausible rank_acc


# ---- the heads ------------------------------------------------------------------------------------------------

def test_untrained_heads_repeat_the_targets_next_token_prediction():
    model = random_model(0)
    heads = MedusaHeads.for_target(model, n_heads=3)
    idx = torch.randint(0, model.config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(1))
    logits, h = model(idx, return_hidden=True)
    out = heads(h)
    assert out.shape == (3, 2, 17, model.config.vocab_size)
    for k in range(3):  # zero-initialised block + the target's output embedding = the target's own logits
        torch.testing.assert_close(out[k], logits, atol=1e-5, rtol=1e-5)


def test_training_the_heads_leaves_the_target_alone():
    model = random_model(0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    heads = MedusaHeads.for_target(model, n_heads=2)
    opt = torch.optim.SGD(heads.parameters(), lr=0.1)
    idx = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, h = model(idx, return_hidden=True)
    loss, _ = medusa_loss(heads(h), idx)
    loss.backward()
    opt.step()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # copied, not tied
    assert not torch.equal(heads.heads[0].out.weight, model.lm_head.weight)
    assert float(heads.heads[0].fc.weight.detach().abs().sum()) > 0  # the zero-initialised block does learn


def test_loss_scores_head_k_against_the_token_k_plus_2_places_ahead():
    K, B, T, V = 3, 2, 9, 11
    idx = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))

    def one_hot_logits(shift_of_head):
        logits = torch.full((K, B, T, V), -30.0)
        for k in range(K):
            s = shift_of_head(k)
            logits[k, :, :T - s] = torch.nn.functional.one_hot(idx[:, s:], V) * 60.0 - 30.0
        return logits

    total, per_head = medusa_loss(one_hot_logits(lambda k: k + 2), idx)
    assert len(per_head) == K and max(per_head) < 1e-6 and float(total) < 1e-5
    _, off_by_one = medusa_loss(one_hot_logits(lambda k: k + 1), idx)  # what the target's own head predicts
    assert min(off_by_one) > 5.0
    # uniform logits: every head costs log V, weighted decay^k
    total, per_head = medusa_loss(torch.zeros(K, B, T, V), idx, decay=0.5)
    assert per_head == pytest.approx([math.log(V)] * K)
    assert float(total) == pytest.approx(math.log(V) * (1 + 0.5 + 0.25))
    # head k needs position t + k + 2 < T: with T = 3 only head 0 can be scored
    _, per_head = medusa_loss(torch.zeros(K, B, 3, V), idx[:, :3])
    assert len(per_head) == 1


def test_distillation_scores_head_k_against_the_targets_distribution_at_t_plus_k_plus_1():
    """Head k at position t learns the target's distribution of token t + k + 2, which the target computes at
    position t + k + 1: heads that copy those rows have the lowest loss (the targets' own entropy), and heads
    that copy the rows one position off do worse."""
    from minigpt.training.train_heads import medusa_distill_loss
    K, B, T, V = 3, 2, 9, 11
    target_logits = torch.randn(B, T, V, generator=torch.Generator().manual_seed(4)) * 3

    def copied(shift_of_head):
        out = torch.zeros(K, B, T, V)
        for k in range(K):
            s = shift_of_head(k)
            out[k, :, :T - s] = target_logits[:, s:]
        return out

    p = torch.softmax(target_logits, -1)
    entropy = [float(-(p[:, k + 1:] * p[:, k + 1:].log()).sum(-1).mean()) for k in range(K)]
    _, right = medusa_distill_loss(copied(lambda k: k + 1), target_logits)
    _, wrong = medusa_distill_loss(copied(lambda k: k + 2), target_logits)
    assert right == pytest.approx(entropy, abs=1e-5)
    assert all(w > r + 0.1 for w, r in zip(wrong, right))
    _, per_head = medusa_distill_loss(torch.zeros(K, B, 2, V), target_logits[:, :2])
    assert len(per_head) == 1                       # with T = 2 only head 0 has a target position


def test_head_accuracy_against_the_target_reads_its_argmax_one_position_later():
    """reference="target": head k at t is right when it names the target's argmax at t + k + 1."""
    from minigpt.training.train_heads import head_accuracy
    model = random_model(1)

    class Echo(torch.nn.Module):       # head k returns the target's own logits at the same position
        num_heads = 2

        def forward(self, h):
            return model.lm_head(h)[None].expand(2, *model.lm_head(h).shape)

    data = torch.randint(0, 97, (4000,), generator=torch.Generator().manual_seed(0)).numpy()
    acc = head_accuracy(model, Echo(), data, block_size=32, batches=2, batch_size=4, reference="target")
    text = head_accuracy(model, Echo(), data, block_size=32, batches=2, batch_size=4)
    assert acc.shape == text.shape == (2, 10)
    # the same windows by hand: the echo's top choice at t is the target's argmax at t; head k is right when
    # that equals the target's argmax at t + k + 1
    from minigpt.data import get_batch
    g, same = torch.Generator().manual_seed(4321), [[], []]
    for _ in range(2):
        x, _ = get_batch(data, 4, 31, g)
        with torch.no_grad():
            a = model(x).argmax(-1)
        for k in range(2):
            same[k].append((a[:, :31 - k - 2] == a[:, k + 1:30]).float().flatten())
    for k in range(2):
        assert float(acc[k, 0]) == pytest.approx(float(torch.cat(same[k]).mean()))
    with pytest.raises(ValueError, match="reference"):
        head_accuracy(model, Echo(), data, reference="file")


# ---- the sparse tree ------------------------------------------------------------------------------------------

def _all_paths(K, R):
    return [p for d in range(1, K + 1) for p in itertools.product(range(R), repeat=d)]


def _prefix_closed(paths) -> bool:
    s = set(paths)
    return all(p[:-1] in s for p in s if len(p) > 1)


def test_sparse_tree_is_prefix_closed_and_respects_the_budget():
    for budget in (1, 2, 5, 16, 40):
        paths = sparse_tree_paths(TREE_ACC, budget)
        assert len(paths) == len(set(paths)) == min(budget, len(_all_paths(3, 3)))
        assert _prefix_closed(paths)
        assert all(1 <= len(p) <= 3 and max(p) < 3 for p in paths)
    assert sorted(sparse_tree_paths(TREE_ACC, 1000)) == sorted(_all_paths(3, 3))  # budget beyond every path
    assert all(max(p) < 2 for p in sparse_tree_paths(TREE_ACC, 20, max_branch=2))
    assert sparse_tree_paths(TREE_ACC, 1) == [(0,)]


def test_sparse_tree_maximises_expected_acceptance_brute_force():
    g = torch.Generator().manual_seed(4)
    for _ in range(3):
        rank_acc = torch.rand(3, 2, generator=g) * 0.9  # 14 possible paths, not sorted by rank
        every = _all_paths(3, 2)
        for budget in range(1, len(every) + 1):
            best = max(expected_accept_length(s, rank_acc) for s in itertools.combinations(every, budget)
                       if _prefix_closed(s))
            got = sparse_tree_paths(rank_acc, budget)
            assert _prefix_closed(got) and len(got) == budget
            assert expected_accept_length(got, rank_acc) == pytest.approx(best, rel=1e-9), budget


def test_expected_accept_length_of_a_chain():
    chain = [(0,), (0, 0), (0, 0, 0)]
    assert expected_accept_length(chain, TREE_ACC) == pytest.approx(0.6 + 0.6 * 0.4 + 0.6 * 0.4 * 0.3)


# ---- Medusa decoding ------------------------------------------------------------------------------------------

def _random_cases(n, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        plen = int(torch.randint(1, 20, (1,), generator=g))
        yield torch.randint(0, vocab, (plen,), generator=g).tolist(), int(torch.randint(1, 36, (1,), generator=g))


@pytest.mark.parametrize("vocab", [20, 97])
def test_greedy_medusa_equals_plain_greedy(vocab):
    model = random_model(0, vocab_size=vocab)
    heads = MedusaHeads.for_target(model, n_heads=3)
    tree = sparse_tree_paths(TREE_ACC, 12)
    accepted = rejected = 0
    for prompt, n in _random_cases(12, vocab, seed=vocab):
        ref = generate(model, prompt, n)
        for paths in (None, tree):  # None: the default chain of top-1 guesses
            out, st = medusa_generate(model, heads, prompt, n, paths=paths)
            assert out == ref, (prompt, n, paths)
            assert st.new_tokens == n and st.target_passes == st.rounds <= n
            accepted += st.accepted
            rejected += st.tested - st.accepted
    assert accepted > 20 and rejected > 20  # both branches of the rule were exercised


class OracleHeads(torch.nn.Module):
    """Heads that know the greedy future: they look up which position a hidden state belongs to and return
    the true tokens k + 2 places after it. Only correct if medusa_generate feeds them the right hidden state."""

    def __init__(self, model, seq, K):
        super().__init__()
        with torch.no_grad():
            self.hidden = model(torch.tensor([seq]), return_hidden=True)[1][0]  # (T, C)
        self.seq, self.K, self.V = seq, K, model.config.vocab_size
        self.num_heads = K  # what the decoder asks of heads: num_heads, and hidden (C,) -> logits (num_heads, V)

    def forward(self, h):
        i = int((self.hidden - h).norm(dim=-1).argmin())
        out = torch.zeros(self.K, self.V)
        for k in range(self.K):
            if i + k + 2 < len(self.seq):
                out[k, self.seq[i + k + 2]] = 10.0
        return out


def test_perfect_heads_are_fully_accepted():
    model = random_model(1)
    prompt, n, K = [5, 17, 3, 88, 41], 22, 3
    seq = prompt + generate(model, prompt, n)
    out, st = medusa_generate(model, OracleHeads(model, seq, K), prompt, n)
    assert out == seq[len(prompt):]
    assert st.target_passes == math.ceil(n / (K + 1)), st  # every round: K accepted guesses + 1 target token
    assert st.accepted == n - st.target_passes  # nothing rejected


def _peaky(vocab=8, scale=6.0, seed=3):
    """A one-layer random model whose top_k=4 distributions are neither flat nor one-hot."""
    torch.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=vocab, block_size=32, n_layer=1, n_head=2, n_embd=16)).eval()
    with torch.no_grad():
        m.transformer.wte.weight.mul_(scale)
    return m


def _tv_bound(n, k, delta=1e-6):
    return math.sqrt((k * math.log(2) + math.log(1 / delta)) / (2 * n))


def test_exact_medusa_sampling_has_the_targets_distribution_and_typical_does_not():
    model, prompt, V = _peaky(), [1, 2, 3], 8
    heads = MedusaHeads.for_target(model, n_heads=2)
    cfg = SamplingConfig(temperature=1.0, top_k=4)
    paths = [(0,), (1,), (0, 0), (1, 0)]
    with torch.no_grad():
        p1 = cfg.probs(model(torch.tensor([prompt]))[0, -1])
        second = cfg.probs(model(torch.tensor([prompt + [x] for x in range(V)]))[:, -1])  # (V, V): p(y | x)
    joint = (p1[:, None] * second).flatten()

    def sample_runs(acceptance, n):
        firsts, pairs, accepted = [], [], 0
        for s in range(n):
            out, st = medusa_generate(model, heads, prompt, 3, paths=paths, temperature=1.0, top_k=4, seed=s,
                                      acceptance=acceptance)
            firsts.append(out[0])
            pairs.append(out[0] * V + out[1])
            accepted += st.accepted
        return (torch.bincount(torch.tensor(firsts), minlength=V) / n,
                torch.bincount(torch.tensor(pairs), minlength=V * V) / n, accepted / n)

    n = 800
    f, pair, acc = sample_runs("exact", n)
    assert 0.2 < acc < 2.5  # candidates are accepted and rejected: the tree rule is really exercised
    assert 0.5 * float((f - p1).abs().sum()) < _tv_bound(n, int((p1 > 0).sum()))
    assert 0.5 * float((pair - joint).abs().sum()) < _tv_bound(n, int((joint > 0).sum()))
    # typical acceptance takes any candidate above its threshold: the first token is biased, measurably
    f_typ, _, _ = sample_runs("typical", 200)
    assert 0.5 * float((f_typ - p1).abs().sum()) > 2 * _tv_bound(200, int((p1 > 0).sum()))
    assert "not exact" in typical_acceptance.__doc__.lower()


def test_bad_arguments_are_clear():
    model = random_model(0)
    heads = MedusaHeads.for_target(model, n_heads=2)
    with pytest.raises(ValueError, match="only 2 heads"):
        medusa_generate(model, heads, [1, 2], 5, paths=[(0,), (0, 0), (0, 0, 0)])
    with pytest.raises(ValueError, match="acceptance"):
        medusa_generate(model, heads, [1, 2], 5, acceptance="greedy")


# ---- saving and loading ---------------------------------------------------------------------------------------

def test_save_load_roundtrip_and_one_line_errors(tmp_path):
    model = random_model(0)
    heads = MedusaHeads.for_target(model, n_heads=2)
    with torch.no_grad():
        heads.heads[1].fc.weight.normal_()
    save_heads(heads, tmp_path / "heads.pt")
    loaded = load_heads(model, tmp_path / "heads.pt")
    h = torch.randn(3, model.config.n_embd)
    torch.testing.assert_close(loaded(h), heads(h))

    with pytest.raises(CheckpointError, match="not found") as e:
        load_heads(model, tmp_path / "missing.pt")
    assert "\n" not in str(e.value)
    narrow = random_model(0, n_embd=16)
    with pytest.raises(CheckpointError, match="width 32") as e:
        load_heads(narrow, tmp_path / "heads.pt")
    assert "\n" not in str(e.value)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError) as e:
        load_heads(model, tmp_path / "junk.pt")
    assert "\n" not in str(e.value)


def test_heads_can_share_the_targets_output_layer(tmp_path):
    """For a large vocabulary the heads read out through the target's own (frozen) output layer: no output
    matrices of their own, none in the saved file, and a round trip through save/load gives the same logits."""
    from minigpt.medusa_heads import MedusaHeads, load_heads, save_heads
    target = random_model(0)
    heads = MedusaHeads.for_target(target, n_heads=3, share_output=True)
    assert not any("out" in name for name, _ in heads.named_parameters())
    assert sum(p.numel() for p in heads.parameters()) == 3 * (32 * 32 + 32)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.1)
    h = torch.randn(2, 5, 32)
    logits = heads(h)
    assert logits.shape == (3, 2, 5, 97)
    with torch.no_grad():  # head 0 by hand: residual SiLU block, then the target's output layer
        z = h + torch.nn.functional.silu(heads.heads[0].fc(h))
        torch.testing.assert_close(logits[0], target.lm_head(z))
    save_heads(heads, tmp_path / "heads.pt")
    again = load_heads(target, tmp_path / "heads.pt")
    torch.testing.assert_close(again(h), logits)


def test_train_heads_without_progress_bar_prints_nothing(capsys):
    """Lessons train with progress=False so no tqdm bar is left in their saved outputs."""
    model = random_model(0)
    heads = MedusaHeads.for_target(model, n_heads=2)
    data = torch.randint(0, model.config.vocab_size, (400,), generator=torch.Generator().manual_seed(3))
    info = train_heads(model, heads, minutes=0.02, batch_size=2, block_size=16, data=data, progress=False)
    out = capsys.readouterr()
    assert info["steps"] > 0 and "medusa heads" not in out.err + out.out
    train_heads(model, heads, minutes=0.005, batch_size=2, block_size=16, data=data)   # the default shows one
    assert "medusa heads" in capsys.readouterr().err
