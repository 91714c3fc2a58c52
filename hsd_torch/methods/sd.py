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
    2. Draft ``x_1..x_n ~ q`` token by token, ``n = min(k, budget)``, stopping after EOS
       (:func:`hsd_torch.engine.drafting.draft_tokens`; a law with no mass raises ``ValueError``).
    3. One target pass gives ``p_1..p_{n+1}``; rejection verification with exactly those q
       (:func:`hsd_torch.engine.verification.rejection`).
    4. Re-sync: the drafter's context is extended by the emitted ids.
Greedy mode drafts the drafter's argmax and keeps drafts while they equal the target's argmax.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..engine.drafting import DraftColumns, draft_tokens
from ..engine.laws import TextSpace
from ..engine.rounds import Drafts, Verdicts
from ..engine.verification import rejection
from .base import Method

if TYPE_CHECKING:
    from ..engine.rounds import Generation

__all__ = ["SD"]


class SD(Method):
    """Same-tokenizer speculative decoding."""

    name = "sd"
    extends_drafter_context = True

    def setup(self, gen: Generation) -> None:
        """Refuse a drafter with another tokenizer; drafting column c proposes target column c."""
        assert gen.bridge is not None and gen.d_space is not None
        if not gen.bridge.same_tokenizer:
            raise ValueError("method 'sd' needs the drafter to use the target's tokenizer (same ids, same "
                             "text); use 'tli' or 'slem' for different tokenizers")
        if gen.d_space.ids != gen.t_space.ids:  # the target's law keeps ids without text: so does the drafter's
            vd = gen.d_space.v
            if max(gen.t_space.ids) >= vd:
                raise ValueError(
                    f"method 'sd' drafts over the target's columns, and the target's law keeps every one of its "
                    f"{gen.vt} ids (mask_textless=False) while the drafter has {vd} logit columns: pass "
                    "mask_textless=True (ids without text removed from both laws) or a drafter of the target's width")
            gen.d_space = TextSpace(gen.t_space.ids, vd, gen.dev)
            gen.d_drop = gen.d_space.drop_mask()
        self.cols = DraftColumns(gen.d_space, gen.d_space.n, list(range(gen.d_space.n)), stop_on_empty=False)

    def draft(self, gen: Generation, active: list[bool], budget: list[int]) -> Drafts:
        """``min(lookahead, budget)`` drafts per active row."""
        k = [min(gen.lookahead, budget[i]) if active[i] else 0 for i in range(gen.batch)]
        return draft_tokens(gen, active, k, self.cols)[0]

    def verify(self, gen: Generation, active: list[bool], budget: list[int], drafts: Drafts) -> Verdicts:
        """Rejection verification against the drafter laws the drafts were drawn from."""
        def q_of(kmax: int) -> Tensor:
            return torch.stack(drafts.laws[:kmax], dim=1)
        return rejection(gen, active, budget, drafts, q_of)

    def resync(self, gen: Generation, i: int, out: list[int]) -> None:
        """The drafter's context takes the emitted ids as they are."""
        gen.d_ctx[i].extend(out)
