"""What tokens are, as bytes and as text: the exact byte strings of Hugging Face tokenizer ids
(:mod:`hsd_torch.vocab.byte_strings`), the drafter/target bridge (:mod:`hsd_torch.vocab.bridge`:
intersection index tensors, additive pushforward) and a tokenizer's text space
(:mod:`hsd_torch.vocab.text`). The names the single module ``hsd_torch.vocab`` had are kept here."""

from .bridge import Restricted, VocabBridge, clear_cache
from .bridge import _Push as _Push  # private: the methods' pushforward
from .byte_strings import (TokenBytes, UnsupportedTokenizer, byte_level_alphabet, forget_tokenizer, model_digest,
                           token_bytes, tokenizer_fingerprint, tokenizer_state, tokenizer_state_cached)

__all__ = [
    "Restricted",
    "TokenBytes",
    "UnsupportedTokenizer",
    "VocabBridge",
    "byte_level_alphabet",
    "clear_cache",
    "forget_tokenizer",
    "model_digest",
    "token_bytes",
    "tokenizer_fingerprint",
    "tokenizer_state",
    "tokenizer_state_cached",
]
