"""What a round of bounded SLRS (:mod:`.psi_one`, :mod:`.psi_multi`) reads from the procedure that
runs it (:class:`.psi.BoundedSLRS`): the typed contract between them, so that the rounds need not
import the procedure (and the procedure imports the rounds, not the other way round).

The hooks with a leading underscore are the ones a deliberately lossy variant of the tests
overrides (a psi that ignores pruned paths, the unconditional marginal, psi left undivided).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from ...vocab.text import TokenText
from .trie import DrafterBytes, TargetTrie

__all__ = ["PsiProcedure"]


class PsiProcedure(Protocol):
    """The bounded procedure as its rounds see it: the pair of texts (``tt``, ``dt``), the target
    trie and the drafter's bytes, the lookahead ``k``, the pruning threshold ``tau``, greedy or
    not, the device, the target's width ``vt``, the root's walk, and the hooks below (their
    contracts are :class:`.psi.BoundedSLRS`'s)."""

    tt: TokenText
    dt: TokenText
    trie: TargetTrie
    db: DrafterBytes
    k: int
    tau: float
    greedy: bool
    device: torch.device
    vt: int
    root_walk: tuple[Tensor, Tensor, Tensor]

    def _continuing(self, state: Tensor) -> tuple[Tensor, Tensor]: ...

    def _given_a_proposal(self, psi: Tensor) -> Tensor: ...

    def _psi_counts(self, stop: Tensor, settled: Tensor, w: Tensor, depth: int) -> Tensor: ...

    def _draw(self, laws: Tensor, cur_t: Tensor, live: list[int], uniforms: Sequence[Sequence[float]] | None,
              depth: int, used: list[int]) -> Tensor: ...

    def _given_prefix(self, same: Tensor, j: int) -> Tensor: ...

    def _counts_its_own_psi(self) -> bool: ...

    def _root_parse(self) -> tuple[Tensor, Tensor, Tensor, Tensor]: ...
