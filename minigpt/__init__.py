"""minigpt: a small GPT-2-style transformer and the decoders of a course on fast LLM decoding.

    import minigpt
    model = minigpt.load_pretrained("target")
    tok = minigpt.load_tokenizer()
    ids = minigpt.generate(model, tok.encode("def fib(n):"), max_new_tokens=40)
    print(tok.decode(ids))
"""
from .cache import KVCache
from .checkpoint import CheckpointError, load_model, load_pretrained, model_card, save_checkpoint
from .decoding import DecodeStats, Settings, generate, speculative_generate
from .device import get_device
from .model import GPT, GPTConfig
from .sampling import SamplingConfig, probs_from_logits
from .tokenizer import load_tokenizer

__version__ = "0.1.0"
__all__ = ["GPT", "GPTConfig", "KVCache", "CheckpointError", "DecodeStats", "SamplingConfig", "Settings", "generate",
           "get_device", "load_model", "load_pretrained", "load_tokenizer", "model_card", "probs_from_logits",
           "save_checkpoint", "speculative_generate"]
