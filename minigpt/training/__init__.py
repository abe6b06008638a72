"""Training: what made the shipped weights and the tokenizer; decoding never needs it.

* ``train``       -- trains the target and distils the draft (``python -m minigpt.training.train``);
* ``copydata``    -- copy-heavy training text that teaches the target to copy from its context;
* ``train_heads`` -- trains Medusa heads on the frozen target (``python -m minigpt.training.train_heads``);
* ``bpe``         -- trains the course's byte-level BPE tokenizer (``python -m minigpt.training.bpe``).
"""
