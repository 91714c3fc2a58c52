"""The contract between ``generate``'s round loop (:class:`hsd_torch.engine.rounds.Generation`) and a
method: one object per ``generate`` call, whose hooks the loop calls in every round, in order:

1. :meth:`Method.draft`: the round's proposals (target columns) and the laws they came from;
2. :meth:`Method.verify`: one target pass and the kernels' decisions
   (:mod:`hsd_torch.engine.verification`: exact match or rejection sampling, with this method's q);
3. :meth:`Method.resync`: the drafter's context after a row emitted tokens and goes on.

It mirrors ``hsd_core.methods.base.Method.step`` (drafts, verification, re-sync), over a batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.rounds import Drafts, Verdicts

if TYPE_CHECKING:
    from ..engine.rounds import Generation

__all__ = ["Method"]


class Method:
    """A method of ``generate``. ``name``: its ``method=`` string; ``needs_drafter``: it drafts
    (all but AR); ``extends_drafter_context``: the drafter's context grows by :meth:`resync` across
    rounds, so its cache is re-synced to it when a round settles (SD, TLI; SLEM and SLRS re-encode
    theirs from the text at every round)."""

    name = ""
    needs_drafter = True
    extends_drafter_context = False

    def setup(self, gen: Generation) -> None:
        """Build what the method needs once the generation's text spaces and bridge exist (column
        maps, pushforwards): called once, from ``Generation.__init__``."""

    def draft(self, gen: Generation, active: list[bool], budget: list[int]) -> Drafts:
        """The proposals of every active row (``budget[i]``: the target ids it may still emit)."""
        raise NotImplementedError

    def verify(self, gen: Generation, active: list[bool], budget: list[int], drafts: Drafts) -> Verdicts:
        """One target pass over the active rows' contexts and proposals, and what each emits."""
        raise NotImplementedError

    def resync(self, gen: Generation, i: int, out: list[int]) -> None:
        """Row ``i`` emitted the target ids ``out`` and goes on: bring its drafter context
        (``gen.d_ctx[i]``) up to date, if the method keeps one across rounds."""
