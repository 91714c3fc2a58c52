"""The typed interface between ``generate``'s round loop (:class:`hsd_torch.engine.rounds.Generation`) and
the rest: what one round hands around (:class:`Drafts`, :class:`Verdicts`), what a method may read
and ask for (:class:`RoundView`), and what the shared machinery (:mod:`hsd_torch.engine.drafting`,
:mod:`hsd_torch.engine.verification`) reads of the engine (:class:`EngineState`).

A method (:mod:`hsd_torch.methods`) sees the round only through :class:`RoundView`: read-only
facts (the batch, the device, greedy or not, both texts and spaces, the bridge, the drafter's
processing, the rows' contexts) and the services that act on the engine's state for it (drafting,
verification, re-syncing the drafter's context from the text, recording uniforms). It owns its
options (its lookahead included) and writes nothing of the engine's: its re-sync returns the ids
the drafter's context grows by, and the engine appends them. ``Generation`` is the one object that
implements both protocols.

This module imports neither the round loop nor the methods, so no import cycle closes through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import Tensor

from hsd_core.laws import Prob
from hsd_core.methods.resync import Resync, ResyncMemo

from ..vocab import VocabBridge
from ..vocab.text import TokenText
from ._draws import HeadLaw
from .laws import Processing, TextSpace
from .runner import Runner

if TYPE_CHECKING:
    from ._precision import NearTies
    from .processors import Processor
    from .tree_cache import HostLaw, RowDrafting, TreeCache, Walk

__all__ = ["DraftColumns", "Drafts", "EngineState", "RoundView", "Verdicts"]


@dataclass
class Drafts:
    """One round's proposals, per row ``i``: ``n[i]`` proposals, ``cols[i]`` their target columns
    (the target's text space). For methods that draft token by token, ``laws[j]`` is the drafter
    law ``[B, N]`` the ``j``-th drafts were drawn from (over the drafting columns; TLI's
    unnormalized; empty where the verification does not read them: ``DraftColumns.laws_read``, or
    reads them as ``law_heads``) and ``mass[i][j]`` the mass that draw read (TLI: the normalizer); for bounded
    SLRS ``q_steps[j]`` is psi ``[B, Vt]`` (float64, over target ids) at position ``j``.
    ``law_heads[j]`` (``DraftColumns.heads_read``, TLI; ``laws`` then stays empty): the same laws, each
    position either that tensor or a :class:`HeadLaw` of ``B`` rows (top-p's kept heads at ``n_draw``,
    :meth:`HeadLaw.prefix`), whose ``dense()`` is that tensor at every row that drafted at ``j``; a row
    that did not draft there holds the zero law (no entry), which no verification reads (it reads
    position ``j`` of row ``i`` only for ``j < n[i]``)."""

    n: list[int]
    cols: list[list[int]]
    laws: list[Tensor]
    mass: list[list[float]]
    q_steps: list[Tensor]
    law_heads: list[Tensor | HeadLaw] = field(default_factory=list)

    @classmethod
    def empty(cls, batch: int) -> Drafts:
        """No proposal for any of ``batch`` rows (AR's every round)."""
        return cls([0] * batch, [[] for _ in range(batch)], [], [[] for _ in range(batch)], [])


@dataclass
class Verdicts:
    """The verification of one round, per row ``i``: ``emitted[i]`` the target columns it emits
    (accepted proposals, then at most one correction or bonus), ``accepted[i]`` how many
    proposals it kept, ``uniforms[i]`` the verification uniforms the kernel read, in
    ``hsd_core``'s order (empty when greedy)."""

    emitted: list[list[int]]
    accepted: list[int]
    uniforms: list[list[float]]


@dataclass
class DraftColumns:
    """Where drafts come from: the drafter's laws live on ``space``'s columns and drafts are drawn
    from the first ``n_draw`` of them (TLI: the intersection's, a slice, not renormalized);
    ``to_target[c]`` is the target column drawing column ``c`` proposes (None: the method maps
    the drafted text itself, SLEM); ``stop_on_empty``: a law with no mass on those columns ends the
    row's drafting (TLI, SLEM) instead of raising ``ValueError`` (SD, SLRS). ``head`` (int64, the
    ids ``space.ids[:n_draw]`` on the drafter's device; only when the drafter's processing has no
    top-k or top-p, whose kept sets read every logit): the drafter's head computes those ids'
    logits alone and the law drawn from is :func:`hsd_torch.engine.laws.restricted_law` of them, the
    processed law restricted to the drafting columns and renormalized (TLI's q_cap). ``laws_read``:
    whether the verification reads :attr:`Drafts.laws` (SD, TLI, SLRS: ``q`` in the ratio tests and
    the residual); False (SLEM, whose exact match reads the target alone): the laws are read only by
    the draws, so they are not kept (``Drafts.laws`` stays empty) and, under top-p on the CPU, are
    drawn from their kept heads (:func:`hsd_torch.engine.drafting.draft_tokens`). ``heads_read`` (with
    ``laws_read``; TLI, whose push reads a law from its heads: :meth:`hsd_torch.vocab.bridge._Push.heads`):
    the laws are kept in :attr:`Drafts.law_heads`, and under top-p on the CPU (sampling, ``head`` None)
    each position's law is computed for the rows still drafting alone, drawn from and kept as its heads."""

    space: TextSpace
    n_draw: int
    to_target: list[int] | None
    stop_on_empty: bool
    head: Tensor | None = None
    laws_read: bool = True
    heads_read: bool = False


class RoundView(Protocol):
    """What a method may read of the round state, and the services it may call. Read-only: the
    batch size, the device, greedy or not, the target's text (``tt``), width (``vt``) and law
    space (``t_space``), the drafter's text, space, removed ids, processing and runner (None
    without a drafter), the bridge between the two, and per row the target's context (``t_ctx``,
    of which ``t_first`` is the special prefix) and the drafter's (``d_ctx``)."""

    @property
    def batch(self) -> int: ...
    @property
    def dev(self) -> torch.device: ...
    @property
    def greedy(self) -> bool: ...
    @property
    def tt(self) -> TokenText: ...
    @property
    def vt(self) -> int: ...
    @property
    def t_space(self) -> TextSpace: ...
    @property
    def dt(self) -> TokenText | None: ...
    @property
    def d_space(self) -> TextSpace | None: ...
    @property
    def d_drop(self) -> Tensor | None: ...
    @property
    def d_process(self) -> Processing: ...
    @property
    def drun(self) -> Runner | None: ...
    @property
    def bridge(self) -> VocabBridge | None: ...
    @property
    def t_ctx(self) -> Sequence[Sequence[int]]: ...
    @property
    def t_first(self) -> Sequence[Sequence[int]]: ...
    @property
    def d_ctx(self) -> Sequence[Sequence[int]]: ...

    def record(self, i: int, values: Sequence[float]) -> None:
        """Row ``i`` consumed these uniforms (kept with ``record_uniforms=True``)."""

    def drafting_uniforms(self, k: Sequence[int]) -> list[list[float]]:
        """:func:`hsd_torch.engine.drafting.drafting_uniforms`."""

    def feed_drafter(self, contexts: Sequence[Sequence[int] | None], head: Tensor | None = None) -> Tensor:
        """:func:`hsd_torch.engine.drafting.feed_drafter`."""

    def draft_tokens(self, active: Sequence[bool], k: Sequence[int], cols: DraftColumns,
                     min_confidence: Prob | None = None) -> tuple[Drafts, list[list[int]]]:
        """:func:`hsd_torch.engine.drafting.draft_tokens`."""

    def drafter_context_from_text(self, active: Sequence[bool], resync: Resync) -> None:
        """:func:`hsd_torch.engine.drafting.drafter_context_from_text`."""

    def exact_match(self, active: list[bool], budget: list[int], drafts: Drafts) -> Verdicts:
        """:func:`hsd_torch.engine.verification.exact_match`."""

    def rejection(self, active: list[bool], budget: list[int], drafts: Drafts, q_of: Callable[[int], Tensor],
                  q_scale: list[list[float]] | None = None) -> Verdicts:
        """:func:`hsd_torch.engine.verification.rejection`."""

    def tree_draft(self, active: Sequence[bool], contexts: Sequence[Sequence[int] | None],
                   rows: Sequence[RowDrafting | None], law: Callable[[Tensor], Tensor],
                   token_of: Callable[[int], int], depth: Sequence[int], host: HostLaw | None = None
                   ) -> tuple[list[Any], TreeCache]:
        """:func:`hsd_torch.engine.tree.tree_draft`."""

    def tree_verify(self, active: list[bool], budget: list[int], trees: Sequence[Any], walk: Walk,
                    draft_cache: TreeCache | None) -> Verdicts:
        """:func:`hsd_torch.engine.tree.tree_verify`."""


class EngineState(RoundView, Protocol):
    """What the shared machinery (:mod:`hsd_torch.engine.drafting`, :mod:`hsd_torch.engine.verification`) reads
    and writes of the engine beyond a method's view: the rows' emitted ids, random streams, the
    drafter's context parts and re-sync memos, the target's runner, processing and removed ids,
    the end ids, the caller's processors, the reduced-precision near-tie re-check and its counts."""

    @property
    def t_ctx(self) -> list[list[int]]: ...
    @property
    def d_ctx(self) -> list[list[int]]: ...
    @property
    def d_start(self) -> list[list[int]]: ...
    @property
    def d_head(self) -> list[list[int]]: ...
    @property
    def d_memos(self) -> list[ResyncMemo[bytes]]: ...
    @property
    def e_text(self) -> list[tuple[int, bytes]]: ...
    @property
    def prompt_bytes(self) -> list[bytes]: ...
    @property
    def emitted(self) -> list[list[int]]: ...
    @property
    def rngs(self) -> list[np.random.Generator]: ...
    @property
    def trun(self) -> Runner: ...
    @property
    def process(self) -> Processing: ...
    @property
    def t_drop(self) -> Tensor: ...
    @property
    def t_eos_col(self) -> int: ...
    @property
    def ends(self) -> frozenset[int]: ...
    @property
    def processors(self) -> list[Processor]: ...
    @property
    def min_new_tokens(self) -> int: ...
    @property
    def near(self) -> NearTies | None: ...
    @property
    def near_ties(self) -> list[int]: ...
    @property
    def tie_flips(self) -> list[int]: ...
