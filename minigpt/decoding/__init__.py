"""Decoding: one loop (:mod:`.session`), one verifier (:mod:`.verify`), and a proposer per method.

    candidates.py  what every method proposes: a token tree (a chain is a tree), its mask and positions
    verify.py      one target pass over a proposal, the acceptance rules (greedy, exact sampled, pluggable),
                   the cache rollback
    session.py     the loop: checks, caches, prefill, stopping, statistics, streaming; decode(proposer)
    plain.py chain.py tree.py lookup.py medusa.py
                   the proposers (Plain, Chain, SelfSpec, DraftTree, Lookup, LookupTree, Medusa) and the functions the
                   lessons call (generate, speculative_generate, tree_generate, lookup_generate, medusa_generate)
    stats.py       DecodeStats: passes, drafted/tested/accepted tokens, wall time
"""
from .candidates import (Proposal, children_of, ordered_paths, tree_attention_mask, tree_depths, tree_from_paths,
                         tree_position_ids)
from .chain import Chain, SelfSpec, draft_tokens, speculative_generate
from .lookup import Lookup, LookupTree, lookup_generate
from .medusa import Medusa, medusa_generate
from .plain import Plain, generate, generate_no_cache
from .session import Proposer, Session, decode, prefill
from .stats import DecodeStats
from .tree import DraftTree, draft_tree, score_tree, tree_generate
from .verify import (accept_greedy, accept_sampled, accept_tree_greedy, accept_tree_sampled, residual_distribution,
                     verify_chain, verify_tree)  # verify() itself: minigpt.decoding.verify.verify
