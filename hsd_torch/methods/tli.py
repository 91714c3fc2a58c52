"""TLI: token-level intersection, over a batch (``hsd_core.methods.tli``).

Glossary
    intersection  the token strings that both vocabularies hold (the two EOS ids also correspond).
    q_cap         the drafter's processed law restricted to drafter ids whose string is in the
                  intersection, renormalized; pushed to target ids it is the law each draft is
                  sampled from (several drafter ids with one string add up).
    draft         a drafter id drawn from q_cap and mapped to the target id with its string.
    lookahead     k, the number of drafts per round (``min(k, budget)``, fewer after EOS, or when
                  the drafter puts no mass on the intersection).
    accepted / rejected / correction / bonus   as in SD (``sd.py``), with q = q_cap pushed.
    re-sync       the drafter's context after the round: each emitted target id becomes the
                  drafter id with its string, else the drafter's encoding of its text.

Steps of one round
    1. Drafter context = its encoding of the prompt, then each emitted target id re-synced.
    2. Draft up to ``min(k, budget)`` drafter ids from q_cap (:func:`hsd_torch.engine.drafting.draft_tokens`
       over the intersection's columns, the first ``n_draw`` of the drafter's space: a slice, not
       renormalized; a draw reads the mass it normalizes by); stop after EOS, or where q_cap has no
       mass (a round with no draft is plain target decoding), or, with ``min_confidence``, before a
       later draft whose q_cap's largest probability (the slice's largest entry over its mass) is
       below it, as ``hsd_core`` reads q_cap. Without top-k / top-p for the
       drafter, its head computes only the intersection's logits and q_cap is their softmax (the
       same law: the restriction of ``softmax(logits / T)`` renormalized; the head's other rows
       are never computed).
    3. Map the drafts to target ids; each draft's q is the pushforward onto target columns of
       exactly the law it was drawn from, divided by the mass its draw read (inside the kernel).
       Under top-p on the CPU (sampling) the laws are drafted from and kept as top-p's kept heads,
       and pushed from them (:func:`push_laws`): the dense push's bits, with no pass over the
       drafter's columns.
    4. Rejection verification (:func:`hsd_torch.engine.verification.rejection`) with exactly those laws.
Greedy mode drafts the argmax of the drafter over the intersection (ties to the lowest drafter id).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..engine._cache import IdentityCache
from ..engine._draws import HeadLaw
from ..engine.laws import TextSpace
from ..engine.round_state import DraftColumns, Drafts, RoundView, Verdicts
from ..vocab import VocabBridge, _Push
from ..vocab.text import TokenText
from .base import Method

__all__ = ["TLI", "push_laws", "resync_ids", "tli_columns"]

ZOO_SEAMS = ("TLI.resync",)
"""What a variant of the bug zoo may replace here (:func:`hsd_torch.auditing.variants.patch_seam`): TLI's
re-sync of the drafter's context (a lossless-on-purpose variant drops a token: the drafter's context
is free)."""

_COLUMNS: IdentityCache[Any] = IdentityCache(16)

TLIColumns = tuple[TextSpace, int, list[int], _Push, dict[int, list[int]]]


def tli_columns(bridge: VocabBridge, tt: TokenText, dt: TokenText, t_space: TextSpace, d_space: TextSpace,
                device: torch.device) -> TLIColumns:
    """TLI's drafter space: the drafter's text space reordered so that its ``n`` ids in the
    intersection come first, in sampling order (increasing, EOS last: the columns TLI draws from,
    a slice of the law), then the others (they only normalize the processed law, which TLI
    restricts); the target columns of those ``n``, the pushforward of a law over them onto the
    target's columns (several drafter ids may share one string, hence one target id), and the memo
    of the re-sync's encodings of target tokens the drafter lacks (filled as they occur). Built
    once per pair of spaces and device."""
    def build() -> TLIColumns:
        to_t = bridge.to_target_list
        ids = [d for d in d_space.ids if to_t[d] >= 0]  # EOS (last) maps to EOS
        space = TextSpace(ids + [d for d in d_space.ids if to_t[d] < 0], d_space.v, device)
        dst = [t_space.pos[to_t[d]] for d in ids]
        return space, len(ids), dst, _Push(dst, t_space.n, device), {}
    out: TLIColumns = _COLUMNS.get((tt, dt, t_space, d_space), ("tli", str(device)), build)
    return out


class TLI(Method):
    """Token-level intersection (``min_confidence``: the dynamic draft length, read from q_cap)."""

    name = "tli"
    extends_drafter_context = True

    def setup(self, gen: RoundView) -> None:
        """The intersection's columns, their target columns, the pushforward and the re-sync memo."""
        assert gen.bridge is not None and gen.dt is not None and gen.d_space is not None
        space, n_draw, dst, self.push, self.resync_memo = tli_columns(gen.bridge, gen.tt, gen.dt, gen.t_space,
                                                                      gen.d_space, gen.dev)
        # without top-k / top-p the drafter's head computes the shared ids' logits alone (q_cap needs no other)
        head = None if gen.d_process.reads_every_logit or n_draw == 0 else space.cols[:n_draw]
        # with top-p on the CPU the laws are drafted from and kept as their heads (the push reads them there)
        self.cols = DraftColumns(space, n_draw, dst, stop_on_empty=True, head=head, heads_read=True)

    def draft(self, gen: RoundView, active: list[bool], budget: list[int]) -> Drafts:
        """Up to ``min(lookahead, budget)`` drafts per active row from q_cap."""
        return gen.draft_tokens(active, self.depth(active, budget), self.cols, self.min_confidence)[0]

    def verify(self, gen: RoundView, active: list[bool], budget: list[int], drafts: Drafts) -> Verdicts:
        """Rejection verification against q_cap pushed to target columns (divided by each draw's mass)."""
        def q_of(kmax: int) -> Tensor:  # [B, kmax, Nt]
            if drafts.law_heads:
                return push_laws(self.push, drafts.law_heads[:kmax])
            return self.push(torch.stack(drafts.laws[:kmax], dim=1))
        return gen.rejection(active, budget, drafts, q_of, q_scale=drafts.mass)

    def resync(self, gen: RoundView, i: int, out: list[int]) -> Sequence[int]:
        """Each emitted target id becomes the drafter id with its string, else the drafter's encoding
        of its text (context-free: memoized per id; an id without text adds nothing)."""
        assert gen.bridge is not None and gen.dt is not None
        to_d, tt, dt, memo = gen.bridge.to_drafter_list, gen.tt, gen.dt, self.resync_memo
        grown: list[int] = []
        for t in out:
            grown.extend(resync_ids(t, to_d, tt, dt, memo))
        return grown


def push_laws(push: _Push, laws: Sequence[Tensor | HeadLaw]) -> Tensor:
    """``push`` of the laws ``[B, n_draw]`` of positions ``0..k-1`` (tensors, or :class:`HeadLaw`s
    over ``push.n_in`` columns): ``[B, k, n_out]``, the bits of ``push(stack(dense laws, dim=1))``
    (each output row a function of its own law row). Where every position is a head (the usual
    case under top-p), one :meth:`_Push.heads` over the heads padded to one width (padding entries:
    column ``n_in``, value +0) and stacked; else position by position."""
    if not laws:
        raise ValueError("push_laws needs at least one position")
    heads = [x for x in laws if isinstance(x, HeadLaw)]
    if not heads:  # every position dense (greedy, no top-p, a tied boundary, off the CPU): one push
        return push(torch.stack([x for x in laws if isinstance(x, Tensor)], dim=1))
    if any(x.n != push.n_in for x in heads):
        raise ValueError(f"heads over {sorted({x.n for x in heads})} columns, the push reads {push.n_in}")
    if len(heads) < len(laws):
        return torch.stack([push.heads(x.cols, x.vals) if isinstance(x, HeadLaw) else push(x) for x in laws], dim=1)
    h = max(x.cols.shape[-1] for x in heads)
    cols = torch.stack([torch.nn.functional.pad(x.cols, (0, h - x.cols.shape[-1]), value=push.n_in) for x in heads], 1)
    vals = torch.stack([torch.nn.functional.pad(x.vals, (0, h - x.vals.shape[-1]), value=0.0) for x in heads], 1)
    return push.heads(cols, vals)


def resync_ids(t: int, to_drafter: Sequence[int], tt: TokenText, dt: TokenText,
               memo: dict[int, list[int]]) -> list[int]:
    """The drafter ids target id ``t`` re-syncs to: the drafter id with its string
    (``to_drafter[t] >= 0``), else the drafter's encoding of its text, memoized in ``memo``; none
    for an id without text (the target's own law keeps them). What ``TLI.resync`` appends, and what
    :func:`hsd_torch.auditing.sequences.audit_sequences` builds the drafter's context from."""
    d = to_drafter[t]
    if d >= 0:
        return [d]
    ids = memo.get(t)
    if ids is None:
        b = tt.bytes_of[t]
        ids = memo[t] = [] if b is None else dt.encode(b, free=True)
    return ids
