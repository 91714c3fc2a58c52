"""``generate``'s methods, one file each, each a mirror of its ``hsd_core.methods`` twin over a
batch: :mod:`.ar`, :mod:`.sd`, :mod:`.tli`, :mod:`.slem`, :mod:`.slrs` (one-token and bounded
SLRS; bounded SLRS's psi in :mod:`.slrs.psi`, its byte trie in :mod:`.slrs.trie`, its tree's
drafter passes in :mod:`.slrs.tree`), and the token-tree twins of SD, TLI and SLEM in :mod:`.tree`
(one row's tree in :mod:`.tree_rows`; ``generate(..., tree=shape)``). The round loop that calls them is
:class:`hsd_torch.engine.rounds.Generation`; the contract is :class:`.base.Method`.
"""

from __future__ import annotations

from typing import Any

from hsd_core.methods.resync import as_resync

from ..engine.validation import (METHODS, OPTIONS, ConflictingArguments, OutOfRange, as_int, check_method,
                                 check_min_confidence, is_int, refuse_options_not_taken)
from .ar import AR
from .base import Method
from .sd import SD
from .slem import SLEM
from .slrs import SLRS, BoundedSLRSMethod, slrs_options
from .tli import TLI
from .tree import SDTree, SLEMTree, TLITree


def tree_method(method: str, shape: Any, draws: Any, lookbehind: int = 4, resync: Any = None) -> Method:
    """The token-tree twin of ``method`` (:mod:`.tree`: ``"sd"``, ``"tli"``, ``"slem"``, the latter
    with its ``lookbehind`` and ``resync``) with ``shape`` and ``draws``, checked as
    ``hsd_core.methods.tree`` checks them (:class:`OutOfRange` for a bad value)."""
    try:
        if method == "slem":
            return SLEMTree(shape, draws=draws, lookbehind=lookbehind, resync=as_resync(resync))
        return {"sd": SDTree, "tli": TLITree}[method](shape, draws=draws)
    except (TypeError, ValueError) as e:
        raise OutOfRange(f"tree: {e}") from None

__all__ = ["AR", "METHODS", "OPTIONS", "SD", "SLEM", "SLRS", "TLI", "BoundedSLRSMethod", "Method", "SDTree", "SLEMTree",
           "TLITree", "make", "tree_method"]



def make(method: str, *, lookahead: int, greedy: bool, lookbehind: Any, min_path_prob: Any, proposal_map: Any,
         max_tokens: Any, resync: Any = None, tree: Any = None, tree_draws: Any = None,
         min_confidence: Any = None) -> Method:
    """The method object for ``generate``'s ``method=`` and its options, which it owns (checked
    here, once, with :mod:`hsd_torch.engine.validation`'s kinds of error: ``UnknownChoice`` for an unknown
    method, ``OptionNotTaken`` for an option it does not take (:data:`OPTIONS`, naming the methods
    that take it), ``OutOfRange`` for a value out of range, ``NotSupported`` for SLRS options whose
    psi would not finish, :func:`.slrs.slrs_options`). ``lookahead`` is an int >= 1 already; ``lookbehind=None``
    is SLEM's default, 4 (SLRS re-tokenizes with look-behind 0); ``resync`` (SLEM, SLRS) a
    :class:`hsd_core.methods.Resync` or None (the default one: the drafter's context re-synced
    incrementally, :mod:`hsd_core.methods.resync`). ``tree`` (a ``hsd_core.methods.tree.Static`` or
    ``Dynamic`` shape; :class:`hsd_core.methods.tree.SDTree`'s default ``Static((2, 1, 1))`` is not
    implied: None drafts a single path) makes the method its token-tree twin (:mod:`.tree`; its depth
    replaces ``lookahead``), ``tree_draws`` (``"distinct"``, the default, or ``"iid"``) how a node's
    children are drawn; both ``OutOfRange`` when invalid. ``min_confidence`` (SD, TLI, SLEM single
    paths; None: off) is ``hsd_core``'s dynamic draft length: a row stops drafting before any later
    draft whose law's largest probability is below it (:func:`hsd_torch.engine.drafting.draft_tokens`),
    checked by ``hsd_core``'s rule (:func:`hsd_torch.engine.validation.check_min_confidence`);
    ``ConflictingArguments`` with ``tree`` (``hsd_core`` defines it for single paths only)."""
    check_method(method)
    given = {"lookbehind": lookbehind is not None, "resync": resync is not None, "min_path_prob": min_path_prob is not None,
             "proposal_map": proposal_map is not None, "max_tokens": not (is_int(max_tokens) and max_tokens == 1),
             "tree": tree is not None, "tree_draws": tree_draws is not None,
             "min_confidence": min_confidence is not None}
    values = {"lookbehind": lookbehind, "resync": resync, "min_path_prob": min_path_prob, "proposal_map": proposal_map,
              "max_tokens": max_tokens, "tree": tree, "tree_draws": tree_draws, "min_confidence": min_confidence}
    refuse_options_not_taken(method, given, values)
    conf = check_min_confidence(min_confidence)
    if conf is not None and tree is not None:
        raise ConflictingArguments(f"min_confidence (got {min_confidence!r}) is the dynamic length of a single draft "
                                   "path; a token tree's size is its shape: give tree= or min_confidence=, not both")
    if tree_draws is not None and tree is None:
        raise OutOfRange(f"tree_draws is an option of a token tree: give tree= too (got tree_draws={tree_draws!r})")
    if tree is not None:
        lb = 4 if lookbehind is None else as_int("lookbehind", lookbehind, 0)
        return tree_method(method, tree, "distinct" if tree_draws is None else tree_draws, lb, resync)
    rs = as_resync(resync)
    if method == "slrs":
        if slrs_options(lookahead, min_path_prob, proposal_map, greedy, max_tokens):
            return BoundedSLRSMethod(None if min_path_prob is None else float(min_path_prob),
                                     None if max_tokens is None else int(max_tokens), rs, lookahead=lookahead)
        return SLRS(rs)
    if method == "slem":
        return SLEM(4 if lookbehind is None else as_int("lookbehind", lookbehind, 0), rs, lookahead=lookahead,
                    min_confidence=conf)
    if method == "ar":
        return AR(lookahead=lookahead)
    return {"sd": SD, "tli": TLI}[method](lookahead=lookahead, min_confidence=conf)
