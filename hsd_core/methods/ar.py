"""AR: plain autoregressive decoding from the target, the baseline every method must equal.

Glossary: a *round* is one target forward pass; AR emits exactly one target token per round,
sampled from the target's law (greedy: its argmax, ties to the lowest id). No drafter is used.
"""

from __future__ import annotations

from ..models import Model
from ..rand import Rand
from .base import Method, RoundOutcome, State, check_greedy, sample


class AR(Method):
    """Autoregressive decoding: one target token per target call."""

    name = "AR"

    def __init__(self, greedy: bool = False) -> None:
        self.greedy = check_greedy(greedy)

    def check_models(self, target: Model, drafter: Model | None) -> None:
        """AR runs with or without a drafter (it ignores it)."""

    def step(self, target: Model, drafter: Model | None, state: State, rand: Rand) -> RoundOutcome:
        p = target.next_probs(state.target_context(target))
        return RoundOutcome((sample(p, rand, self.greedy),))
