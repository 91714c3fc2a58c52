"""hsd_core: exact reference implementations of lossless speculative decoding.

``import hsd_core as hc`` gives :class:`Vocabulary`, the tokenizers, ``hc.toy`` (model families),
``hc.methods`` (AR, SD, SLEM, TLI, SLRS), ``hc.exact`` (the exact law engine), ``hc.rand``
(the randomness interface), ``hc.variants`` (deliberately lossy methods), ``hc.stats`` and
``hc.audit`` (sized statistical audits of samplers). ``hsd_core.strategies`` (Hypothesis
strategies) is imported on its own, since it needs hypothesis.
"""

from . import acceptance, audit, exact, laws, methods, rand, stats, toy, variants, worlds
from .laws import InvalidLawError
from .rand import CostLimitError
from .tokenizers import BPETokenizer, LongestMatchTokenizer, Tokenizer
from .vocab import Vocabulary

__all__ = [
    "BPETokenizer", "CostLimitError", "InvalidLawError", "LongestMatchTokenizer", "Tokenizer", "Vocabulary",
    "acceptance", "audit", "exact", "laws", "methods", "rand", "stats", "toy", "variants", "worlds",
]
__version__ = "0.1.0"
