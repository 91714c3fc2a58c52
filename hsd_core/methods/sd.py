"""SD: same-vocabulary speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Glossary
    draft       a token the drafter samples; here it is already a target id (one vocabulary).
    lookahead   k, the number of drafts per round (fewer near the budget or after EOS).
    accepted    a draft kept after the ratio test ``u < p(x)/q(x)``.
    rejected    the first draft that fails it; nothing after it is looked at.
    correction  the token emitted in place of a rejected draft, from ``norm(max(p - q, 0))``.
    bonus       the extra token from ``p`` when every draft is accepted.

Steps of one round
    1. Drafter context = its encoding of the prompt + the emitted ids (same vocabulary).
    2. Draft ``x_1..x_n ~ q`` autoregressively, ``n = min(k, budget)``, stopping after EOS (and, with
       ``min_confidence``, before a later draft whose law's top probability is below it).
    3. One target pass gives ``p_1..p_{n+1}``; verify left to right (``RejectionVerifier``).
    4. Emit the accepted drafts plus the correction or bonus token.
Greedy mode drafts the drafter's argmax and keeps drafts while they equal the target's argmax.
"""

from __future__ import annotations

from ..models import Model
from ..rand import Rand
from ..laws import Prob
from .base import (Method, RejectionVerifier, RoundOutcome, State, check_confidence, check_greedy, check_lookahead,
                   draft_autoregressive)


class SD(RejectionVerifier, Method):
    """Speculative decoding when drafter and target share one vocabulary.

    Defaults: ``lookahead=3``, ``greedy=False``, ``min_confidence=None`` (with a probability: the dynamic
    draft length of :func:`~hsd_core.methods.base.draft_autoregressive`).
    """

    name = "SD"

    def __init__(self, lookahead: int = 3, greedy: bool = False, min_confidence: Prob | None = None) -> None:
        self.lookahead = check_lookahead(lookahead)
        self.greedy = check_greedy(greedy)
        self.min_confidence = check_confidence(min_confidence)

    def check_models(self, target: Model, drafter: Model | None) -> None:
        """SD needs a drafter over exactly the target's vocabulary (same strings, same ids)."""
        super().check_models(target, drafter)
        assert drafter is not None
        if drafter.vocab != target.vocab:
            raise ValueError("SD needs the drafter and the target to share one vocabulary; "
                             "use SLEM, TLI or SLRS for different vocabularies")

    def step(self, target: Model, drafter: Model | None, state: State, rand: Rand) -> RoundOutcome:
        assert drafter is not None
        d_ctx = tuple(drafter.tokenizer.encode(state.prompt)) + state.emitted
        k = min(self.lookahead, state.budget)
        drafts, qs = draft_autoregressive(drafter, d_ctx, k, rand, self.greedy, min_confidence=self.min_confidence)
        return self.verify(target, state.target_context(target), drafts, qs, rand, state.budget)
