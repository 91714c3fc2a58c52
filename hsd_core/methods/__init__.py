"""Decoding methods: baselines (AR, SD), the heterogeneous-vocabulary methods SLEM, TLI, SLRS, and their
token-tree forms SD-tree, SLEM-tree and TLI-tree (:mod:`.tree`)."""

from .ar import AR
from .base import Method, RoundOutcome, State
from .resync import Resync
from .sd import SD
from .slem import SLEM
from .slrs import SLRS
from .tli import TLI
from .tree import Dynamic, SDTree, SLEMTree, Static, TLITree, TokenTree

__all__ = ["AR", "SD", "SLEM", "SLRS", "TLI", "SDTree", "SLEMTree", "TLITree", "Static", "Dynamic", "TokenTree",
           "Method", "Resync", "RoundOutcome", "State"]
