"""The contract between ``generate``'s round loop (:class:`hsd_torch.engine.rounds.Generation`) and a
method: one object per ``generate`` call, owning its options (its ``lookahead`` among them,
checked once where it was made: :func:`hsd_torch.methods.make`), whose hooks the loop calls in
every round, in order:

1. :meth:`Method.draft`: the round's proposals (target columns) and the laws they came from;
2. :meth:`Method.verify`: one target pass and the kernels' decisions
   (:mod:`hsd_torch.engine.verification`: exact match or rejection sampling, with this method's q);
3. :meth:`Method.resync`: the ids the drafter's context grows by after a row emitted tokens and
   goes on.

A method sees the round through :class:`hsd_torch.engine.round_state.RoundView` (read-only facts and the
machinery's services) and writes none of the engine's state. It mirrors
``hsd_core.methods.base.Method.step`` (drafts, verification, re-sync), over a batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from hsd_core.laws import Prob

from ..engine.laws import TextSpace
from ..engine.round_state import Drafts, RoundView, Verdicts

__all__ = ["Method"]


class Method:
    """A method of ``generate``. ``name``: its ``method=`` string; ``needs_drafter``: it drafts
    (all but AR); ``extends_drafter_context``: the drafter's context grows by :meth:`resync` across
    rounds, so its cache is re-synced to it when a round settles (SD, TLI; SLEM and SLRS re-encode
    theirs from the text at every round); ``lookahead``: the drafts per round (an int >= 1, as
    :func:`hsd_torch.methods.make` checked it; AR drafts none and keeps it only to be uniform);
    ``min_confidence``: the dynamic draft length of the methods that draft one path token by token
    (SD, TLI, SLEM; None: off, and for every other method), checked where it was made."""

    name = ""
    needs_drafter = True
    extends_drafter_context = False

    def __init__(self, *, lookahead: int = 4, min_confidence: Prob | None = None) -> None:
        self.lookahead = lookahead
        self.min_confidence = min_confidence

    def drafter_space(self, view: RoundView, space: TextSpace) -> TextSpace:
        """The columns the drafter's laws live on, given its text space ``space`` (called once,
        before :meth:`setup`, with a drafter): ``space`` itself unless the method drafts over
        other columns (SD: the target's)."""
        return space

    def setup(self, view: RoundView) -> None:
        """Build what the method needs once the generation's text spaces and bridge exist (column
        maps, pushforwards): called once, from ``Generation.__init__``."""

    def draft(self, view: RoundView, active: list[bool], budget: list[int]) -> Drafts:
        """The proposals of every active row (``budget[i]``: the target ids it may still emit)."""
        raise NotImplementedError

    def verify(self, view: RoundView, active: list[bool], budget: list[int], drafts: Drafts) -> Verdicts:
        """One target pass over the active rows' contexts and proposals, and what each emits."""
        raise NotImplementedError

    def resync(self, view: RoundView, i: int, out: list[int]) -> Sequence[int]:
        """Row ``i`` emitted the target ids ``out`` and goes on: the ids its drafter context
        (``view.d_ctx[i]``) grows by, if the method keeps one across rounds (none by default; the
        round loop appends them)."""
        return ()

    def depth(self, active: list[bool], budget: list[int]) -> list[int]:
        """Each row's drafts this round: ``min(lookahead, budget[i])`` for an active row, else 0."""
        k = self.lookahead
        return [min(k, b) if a else 0 for a, b in zip(active, budget)]
