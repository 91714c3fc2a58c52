"""hsd_core: exact reference implementations of lossless speculative decoding.

``import hsd_core as hc`` gives :class:`Vocabulary`, the tokenizers, ``hc.toy`` (model families),
``hc.methods`` (AR, SD, SLEM, TLI, SLRS), ``hc.exact`` (the exact law engine), ``hc.rand``
(the randomness interface) and ``hc.variants`` (deliberately lossy methods).
"""

from . import exact, laws, methods, rand, toy
from .laws import InvalidLawError
from .tokenizers import BPETokenizer, LongestMatchTokenizer, Tokenizer
from .vocab import Vocabulary

__all__ = [
    "BPETokenizer", "InvalidLawError", "LongestMatchTokenizer", "Tokenizer", "Vocabulary",
    "exact", "laws", "methods", "rand", "toy",
]
__version__ = "0.1.0"
