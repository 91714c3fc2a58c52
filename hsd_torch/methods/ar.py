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

from ..engine.round_state import Drafts, RoundView, Verdicts
from .base import Method

__all__ = ["AR"]


class AR(Method):
    """Autoregressive decoding: one target token per target pass."""

    name = "ar"
    needs_drafter = False

    def draft(self, gen: RoundView, active: list[bool], budget: list[int]) -> Drafts:
        """No proposals."""
        return Drafts.empty(gen.batch)

    def verify(self, gen: RoundView, active: list[bool], budget: list[int], drafts: Drafts) -> Verdicts:
        """The target's own token for every active row."""
        return gen.exact_match(active, budget, drafts)
