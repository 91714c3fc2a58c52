"""AR: plain autoregressive decoding from the target, the baseline every method must equal
(``hsd_core.methods.ar``).

Glossary: a *round* is one target forward pass; AR emits exactly one target token per round,
drawn from the target's processed law (greedy: its argmax, ties to the lowest id). No drafter.

Steps of one round (a batch of rows at once)
    1. No drafts.
    2. One target pass over each row's pending context; the target draws its token with one
       uniform (:func:`hsd_torch.engine.verification.exact_match` with no proposal: only the bonus).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.rounds import Drafts, Verdicts
from ..engine.verification import exact_match
from .base import Method

if TYPE_CHECKING:
    from ..engine.rounds import Generation

__all__ = ["AR"]


class AR(Method):
    """Autoregressive decoding: one target token per target pass."""

    name = "ar"
    needs_drafter = False

    def draft(self, gen: Generation, active: list[bool], budget: list[int]) -> Drafts:
        """No proposals."""
        return Drafts.empty(gen.batch)

    def verify(self, gen: Generation, active: list[bool], budget: list[int], drafts: Drafts) -> Verdicts:
        """The target's own token for every active row."""
        return exact_match(gen, active, budget, drafts)
