"""Bounded SLRS over real vocabularies (docs/slrs.md), the public names in one place: the procedure's
round (:class:`BoundedSLRS`, psi level by level, :mod:`hsd_torch.methods.slrs.psi`), its byte trie
and walks (:mod:`hsd_torch.methods.slrs.trie`), the tree's drafter passes
(:mod:`hsd_torch.methods.slrs.tree`), the first round of a batch of prompts for tests and
benchmarks, and the option check ``generate`` runs (:func:`slrs_options`). ``generate(method="slrs",
...)`` runs it through :class:`hsd_torch.methods.slrs.BoundedSLRSMethod`."""

from __future__ import annotations

from .methods.slrs import FirstTargetMap, slrs_options
from .methods.slrs.psi import (MAX_PSI_ROWS, BoundedSLRS, MultiRoundResult, RoundResult, first_round,
                               first_round_multi, psi_bound)
from .methods.slrs.tree import TreeCache
from .methods.slrs.trie import DrafterBytes, TargetTrie, pad_bytes, parse_pairs, walk, walk_pairs

__all__ = ["MAX_PSI_ROWS", "BoundedSLRS", "DrafterBytes", "FirstTargetMap", "MultiRoundResult", "RoundResult",
           "TargetTrie", "TreeCache", "first_round", "first_round_multi", "pad_bytes", "parse_pairs", "psi_bound",
           "slrs_options", "walk", "walk_pairs"]
