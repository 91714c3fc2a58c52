"""``generate``'s methods, one file each, each a mirror of its ``hsd_core.methods`` twin over a
batch: :mod:`.ar`, :mod:`.sd`, :mod:`.tli`, :mod:`.slem`, :mod:`.slrs` (one-token and bounded
SLRS; bounded SLRS's psi in :mod:`.slrs.psi`, its byte trie in :mod:`.slrs.trie`, its tree's
drafter passes in :mod:`.slrs.tree`). The round loop that calls them is
:class:`hsd_torch.rounds.Generation`; the contract is :class:`.base.Method`.
"""

from __future__ import annotations

from .ar import AR
from .base import Method
from .sd import SD
from .slem import SLEM
from .slrs import SLRS, BoundedSLRSMethod, slrs_options
from .tli import TLI

__all__ = ["AR", "METHODS", "SD", "SLEM", "SLRS", "TLI", "BoundedSLRSMethod", "Method", "make"]

METHODS = ("ar", "sd", "tli", "slem", "slrs")


def make(method: str, *, lookahead: int, greedy: bool, lookbehind: int, min_path_prob: float | None,
         proposal_map: str | None, max_tokens: int | None) -> Method:
    """The method object for ``generate``'s ``method=`` and its options (checked: ``ValueError``
    for an unknown method or an option it does not take, ``NotImplementedError`` for SLRS options
    whose psi would not finish, :func:`.slrs.slrs_options`)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if max_tokens != 1 and method != "slrs":
        raise ValueError(f"max_tokens is an option of method 'slrs', got max_tokens={max_tokens!r} with {method!r}")
    if method == "slrs":
        if slrs_options(lookahead, min_path_prob, proposal_map, greedy, max_tokens):
            return BoundedSLRSMethod(min_path_prob, max_tokens)
        return SLRS()
    if method == "slem":
        return SLEM(lookbehind)
    return {"ar": AR, "sd": SD, "tli": TLI}[method]()
