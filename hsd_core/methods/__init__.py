"""Decoding methods: baselines (AR, SD) and the heterogeneous-vocabulary methods SLEM, TLI, SLRS."""

from .ar import AR
from .base import Method, RoundOutcome, State
from .resync import Resync
from .sd import SD
from .slem import SLEM
from .slrs import SLRS
from .tli import TLI

__all__ = ["AR", "SD", "SLEM", "SLRS", "TLI", "Method", "Resync", "RoundOutcome", "State"]
