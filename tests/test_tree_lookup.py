"""Token trees and prompt lookup: greedy identical to plain greedy, exact sampling, helpers' edge cases."""
import pytest
import torch

from minigpt import GPT, GPTConfig, KVCache, generate
from minigpt.decoding import (tree_attention_mask, tree_from_paths, tree_generate, tree_position_ids,
                              verify_tree)
from minigpt.decoding.lookup import find_candidate_tree, find_candidates, lookup_generate, ngram_matches
from minigpt.decoding.verify import accept_tree_sampled, residual_distribution
from minigpt.sampling import SamplingConfig

from conftest import perturbed_copy, random_model


def peaky_model(vocab, n_layer, seed, block_size=128):
    """A random model whose next token depends on the whole context (see conftest.random_model)."""
    return random_model(seed, vocab_size=vocab, n_layer=n_layer, block_size=block_size)


def random_cases(n, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        plen = int(torch.randint(1, 24, (1,), generator=g))
        yield torch.randint(0, vocab, (plen,), generator=g).tolist(), int(torch.randint(1, 50, (1,), generator=g))


def test_mask_and_positions():
    parents = [-1, 0, 0, 1, 1, 2, 3]
    m = tree_attention_mask(parents)
    expect = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 4}, 5: {0, 2, 5}, 6: {0, 1, 3, 6}}
    for i, seen in expect.items():
        assert set(torch.nonzero(m[i]).flatten().tolist()) == seen
    assert tree_position_ids(parents, 10).tolist() == [10, 11, 11, 12, 12, 12, 13]
    assert tree_from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]) == parents
    with pytest.raises(ValueError, match="parent"):
        tree_attention_mask([-1, 2, 0])
    with pytest.raises(ValueError, match="no parent path"):
        tree_from_paths([(0, 0)])


def test_verify_tree_compacts_cache_to_accepted_path():
    model = peaky_model(50, 2, 1)
    prefix = [3, 7, 1, 9]
    g1, g2 = generate(model, prefix, 2)
    w1, w2 = (g1 + 1) % 50, (g2 + 1) % 50
    # the target's greedy path is node 2 -> node 4; nodes 1 and 3 are wrong siblings placed before them
    tokens, parents = [prefix[-1], w1, g1, w2, g2], [-1, 0, 0, 2, 2]
    cache = KVCache.for_model(model)
    model(torch.tensor([prefix[:-1]]), cache=cache)
    new, path, _ = verify_tree(model, cache, tokens, parents, SamplingConfig())
    assert path == [2, 4] and new[:2] == [g1, g2]
    assert cache.length == len(prefix) + len(path)
    # after compaction the next step's logits equal recomputation over prefix + accepted path + new token
    nxt = model(torch.tensor([[new[-1]]]), cache=cache)[0, -1]
    full = model(torch.tensor([prefix + [g1, g2, new[-1]]]))[0, -1]
    torch.testing.assert_close(nxt, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kw", [dict(), dict(budget=4, max_depth=3, branch=3, threshold=0.99),
                                dict(paths=[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])])
def test_tree_greedy_identical_to_plain(kw):
    target = peaky_model(64, 2, 0)
    draft = perturbed_copy(target, 0.05)  # agrees often, not always: both accept and reject paths run
    for prompt, n in random_cases(12, 64):
        assert tree_generate(target, draft, prompt, n, **kw)[0] == generate(target, prompt, n)


@pytest.mark.parametrize("kw", [dict(), dict(tree=True), dict(max_ngram=1, num_pred=2), dict(max_ngram=4, num_pred=12)])
def test_lookup_greedy_identical_to_plain(kw):
    target = peaky_model(12, 2, 2)  # a small vocabulary makes repeats, hence matches, frequent
    accepted = 0
    for prompt, n in random_cases(12, 12, seed=3):
        out, stats = lookup_generate(target, prompt, n, **kw)
        assert out == generate(target, prompt, n)
        assert stats.accepted <= stats.tested <= stats.proposed and stats.new_tokens == len(out)
        accepted += stats.accepted
    assert accepted > 0  # the test exercised acceptance, not just rejection


def test_ngram_lookup_never_matches_the_suffix_itself():
    assert ngram_matches([1, 2, 3], 2) == []            # [2, 3] only occurs as the suffix
    assert find_candidates([1, 2, 3], 2, 5) == []
    assert find_candidates([1, 2, 3, 1, 2], 2, 5) == [3, 1, 2]
    assert find_candidates([4, 1, 2, 9, 1, 2], 2, 2) == [9, 1]  # most recent earlier occurrence wins
    assert find_candidates([7, 1, 5, 1], 3, 4) == [5, 1]        # falls back from 3-grams to the 1-gram [1]
    tokens, parents = find_candidate_tree([1, 2, 3, 1, 2, 4, 1, 2], 2, 3)
    assert tokens == [2, 4, 1, 2, 3, 1, 2] and parents == [-1, 0, 1, 2, 0, 4, 5]


# ---- exactness of tree verification under sampling -------------------------------------------------------
V = 4
P = torch.tensor([[0.10, 0.20, 0.30, 0.40], [0.55, 0.15, 0.15, 0.15], [0.05, 0.05, 0.60, 0.30], [0.25, 0.25, 0.25, 0.25]])
Q = torch.tensor([[0.50, 0.30, 0.10, 0.10], [0.10, 0.10, 0.40, 0.40], [0.40, 0.40, 0.10, 0.10], [0.70, 0.10, 0.10, 0.10]])
ROOT = 0


def sample_tree(g):
    """Two i.i.d. draft samples under the root and two under each child: a Markov toy 'draft' Q, 'target' P."""
    tokens, parents = [ROOT], [-1]
    for _ in range(2):
        tokens.append(int(torch.multinomial(Q[ROOT], 1, generator=g))); parents.append(0)
    for c in (1, 2):
        for _ in range(2):
            tokens.append(int(torch.multinomial(Q[tokens[c]], 1, generator=g))); parents.append(c)
    q = torch.stack([Q[tokens[p]] if p >= 0 else Q[ROOT] for p in parents])
    p = torch.stack([P[t] for t in tokens])
    return tokens, parents, q, p


def per_path_rule(tokens, parents, q, p, g):
    """The tempting wrong rule: check every root-to-leaf path on its own and keep the longest accepted one."""
    leaves = [i for i in range(len(tokens)) if i not in parents]
    best, best_last = [], None
    for leaf in leaves:
        path, n = [], leaf
        while n > 0:
            path.append(n); n = parents[n]
        path.reverse()
        acc, node = [], 0
        for c in path:
            if float(torch.rand((), generator=g)) < min(1.0, float(p[node, tokens[c]] / q[c, tokens[c]])):
                acc.append(c); node = c
            else:
                last = int(torch.multinomial(residual_distribution(p[node], q[c]), 1, generator=g))
                break
        else:
            last = int(torch.multinomial(p[node], 1, generator=g))
        if best_last is None or len(acc) > len(best):
            best, best_last = acc, last
    return best, best_last


def first_two_tokens(rule, n, seed):
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, V)
    for _ in range(n):
        tokens, parents, q, p = sample_tree(g)
        path, last = rule(tokens, parents, q, p, g)
        out = [tokens[i] for i in path] + [last]
        if len(out) == 1:  # extend with an exact sample from the target to read off the second token
            out.append(int(torch.multinomial(P[out[0]], 1, generator=g)))
        counts[out[0], out[1]] += 1
    return counts / n


def test_tree_sampling_is_exact_and_per_path_rule_is_not():
    expected = P[ROOT][:, None] * P  # joint distribution of the first two tokens under the target alone
    n = 12000
    tv_exact = 0.5 * (first_two_tokens(accept_tree_sampled, n, 0) - expected).abs().sum().item()
    tv_wrong = 0.5 * (first_two_tokens(per_path_rule, n, 0) - expected).abs().sum().item()
    # 16 cells and 12k samples: sampling noise in TV is about 0.5 * sum sqrt(p/n) ~ 0.015
    assert tv_exact < 0.035, tv_exact
    assert tv_wrong > 0.07, tv_wrong
