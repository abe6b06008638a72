"""Decoders, one module per method, sharing the acceptance rules in :mod:`.verify`."""
from .chain import draft_tokens, speculative_generate, verify_chain
from .plain import generate, generate_no_cache
from .stats import DecodeStats
from .verify import accept_greedy, accept_sampled, residual_distribution
