"""SD: same-vocabulary speculative decoding, over a batch (``hsd_core.methods.sd``).

Glossary
    draft       a token the drafter samples from its processed law; already a target id (one
                tokenizer, so one text space: drafting column c proposes target column c).
    lookahead   k, the number of drafts per round (``min(k, budget)``, fewer after EOS).
    q           the drafter's processed law each draft was drawn from.
    accepted    a draft kept after the ratio test ``u < p(x)/q(x)``.
    rejected    the first draft that fails it; nothing after it is looked at.
    correction  the token emitted in place of a rejected draft, from ``norm(max(p - q, 0))``.
    bonus       the extra token from ``p`` when every draft is accepted.

Steps of one round
    1. Drafter context = its ids of the prompt + the emitted ids (the same ids as the target's).
    2. Draft ``x_1..x_n ~ q`` token by token, ``n = min(k, budget)``, stopping after EOS (and, with
       ``min_confidence``, before a later draft whose law's largest probability is below it)
       (:func:`hsd_torch.engine.drafting.draft_tokens`; a law with no mass raises ``ValueError``).
    3. One target pass gives ``p_1..p_{n+1}``; rejection verification with exactly those q
       (:func:`hsd_torch.engine.verification.rejection`).
    4. Re-sync: the drafter's context is extended by the emitted ids.
Greedy mode drafts the drafter's argmax and keeps drafts while they equal the target's argmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..engine.laws import TextSpace
from ..engine.round_state import DraftColumns, Drafts, RoundView, Verdicts
from .base import Method

__all__ = ["SD"]


class SD(Method):
    """Same-tokenizer speculative decoding (``min_confidence``: the dynamic draft length)."""

    name = "sd"
    extends_drafter_context = True

    def drafter_space(self, gen: RoundView, space: TextSpace) -> TextSpace:
        """Refuse a drafter with another tokenizer; the drafter drafts over the target's columns
        (its text space when both keep the same ids)."""
        assert gen.bridge is not None
        if not gen.bridge.same_tokenizer:
            raise ValueError("method 'sd' needs the drafter to use the target's tokenizer (same ids, same "
                             "text); use 'tli' or 'slem' for different tokenizers")
        if space.ids != gen.t_space.ids:  # the target's law keeps ids without text: so does the drafter's
            vd = space.v
            if max(gen.t_space.ids) >= vd:
                raise ValueError(
                    f"method 'sd' drafts over the target's columns, and the target's law keeps every one of its "
                    f"{gen.vt} ids (mask_textless=False) while the drafter has {vd} logit columns: pass "
                    "mask_textless=True (ids without text removed from both laws) or a drafter of the target's width")
            return TextSpace(gen.t_space.ids, vd, gen.dev)
        return space

    def setup(self, gen: RoundView) -> None:
        """Drafting column c proposes target column c."""
        assert gen.d_space is not None
        self.cols = DraftColumns(gen.d_space, gen.d_space.n, list(range(gen.d_space.n)), stop_on_empty=False)

    def draft(self, gen: RoundView, active: list[bool], budget: list[int]) -> Drafts:
        """``min(lookahead, budget)`` drafts per active row."""
        return gen.draft_tokens(active, self.depth(active, budget), self.cols, self.min_confidence)[0]

    def verify(self, gen: RoundView, active: list[bool], budget: list[int], drafts: Drafts) -> Verdicts:
        """Rejection verification against the drafter laws the drafts were drawn from."""
        def q_of(kmax: int) -> Tensor:
            return torch.stack(drafts.laws[:kmax], dim=1)
        return gen.rejection(active, budget, drafts, q_of)

    def resync(self, gen: RoundView, i: int, out: list[int]) -> Sequence[int]:
        """The drafter's context takes the emitted ids as they are."""
        return out
