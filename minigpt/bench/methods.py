"""The benchmark's methods are the decoding registry's (:mod:`minigpt.decoding.registry`): one declaration per
method, read here, by ``bench --batch``, the peers' race, the chat and the tests alike."""
from ..decoding.registry import METHODS, Method, Models, declare

__all__ = ["METHODS", "Method", "Models", "declare"]
