"""Decoding: one loop (:mod:`.session`), one verifier (:mod:`.verify`), a proposer per method, and the registry
that declares every method once (:mod:`.registry`).

    candidates.py  what every method proposes: a token tree (a chain is a tree), its mask and positions
    verify.py      one target pass over a proposal, the acceptance rules (greedy, exact sampled, pluggable),
                   the cache rollback; for one sequence or a ragged batch
    session.py     the loop: checks, caches, prefill, stopping, statistics, streaming; Settings; decode(proposer)
    batch.py       many sequences at once on the paged cache: BatchEngine, decode_batch, serve
    registry.py    METHODS: each method's proposer, parameters and defaults per model family, what it needs, its
                   counterparts in transformers and llama.cpp; Models (what is loaded); declare()
    stats.py       DecodeStats: passes, drafted/tested/accepted tokens, wall time

The methods (name in the registry: proposer, module, the function the lessons call):

    plain                    Plain        plain.py      generate         one target pass per token
    chain                    Chain        chain.py      speculative_generate   a draft model's chain of gamma tokens
    self_spec                SelfSpec     chain.py      speculative_generate   the chain drafted by the target's
                                                                         own first layers (early exit)
    tree                     DraftTree    tree.py       tree_generate    a draft model's token tree
    prompt_lookup            Lookup       lookup.py     lookup_generate  copy what followed an earlier match
    prompt_lookup_adaptive   Lookup       lookup.py     lookup_generate  ... with a length that follows acceptance
    (a lookup tree)          LookupTree   lookup.py     lookup_generate(tree=True)  several matches, merged
    medusa                   Medusa       medusa.py     medusa_generate  heads on the target's hidden state
    eagle                    Eagle        eagle.py      eagle_generate   EAGLE-2's dynamic tree from a feature head
    lookahead                Lookahead    lookahead.py  lookahead_generate  Jacobi window + n-gram pool
    (a controller)           Auto         auto.py                        picks among options round by round

A draft chain and a draft tree batch their draft's passes in a batch; the others draft sequence by sequence.
"""
from .auto import Auto
from .batch import BatchEngine, Request, decode_batch, serve
from .candidates import (Proposal, children_of, merge_continuations, ordered_paths, tree_attention_mask, tree_depths,
                         tree_from_paths, tree_position_ids)
from .chain import Chain, SelfSpec, draft_chains, draft_tokens, speculative_generate
from .eagle import Eagle, eagle_generate
from .lookahead import Lookahead, lookahead_generate
from .lookup import Lookup, LookupTree, lookup_generate
from .medusa import Medusa, medusa_generate
from .plain import Plain, generate, generate_no_cache
from .registry import METHODS, Method, Models, available, declare
from .session import Proposer, Session, Settings, decode, prefill
from .stats import DecodeStats
from .tree import DraftTree, draft_tree, draft_trees, score_tree, tree_generate
from .verify import (accept_greedy, accept_sampled, accept_tree_greedy, accept_tree_sampled, residual_distribution,
                     verify_chain, verify_tree)  # verify() itself: minigpt.decoding.verify.verify
