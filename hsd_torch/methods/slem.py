"""SLEM: string-level exact match, over a batch (``hsd_core.methods.slem``).

Glossary
    draft       a drafter token, drawn from the drafter's processed law in its own vocabulary.
    lookahead   k, the number of drafter tokens drafted per round (fewer near the budget, if the
                drafter emits EOS, or where its law has no mass).
    candidate   a target token read off the drafted text by re-tokenizing it for the target.
    accepted    a candidate equal to the target's own draw (greedy: argmax) at its position.
    rejected    the first candidate that differs; the target's own token replaces it.
    bonus       the target's own token after the last candidate, when all candidates match.
    look-behind the last few target tokens decoded and re-encoded together with the draft, so that
                the candidates are what the target tokenizer makes of the text in context.

Steps of one round
    1. Drafter context = its encoding of (prompt + emitted text), recomputed every round
       (:func:`hsd_torch.engine.drafting.drafter_context_from_text`).
    2. Draft ``min(k, budget)`` drafter tokens (:func:`hsd_torch.engine.drafting.draft_tokens`), stopping
       after EOS: no round drafts more drafter tokens than it can emit target tokens (and, with
       ``min_confidence``, before a later draft whose law's largest probability is below it).
    3. Candidates = :func:`retokenize` of the drafted text after the target context, followed by
       the target's EOS if the drafter ended with EOS, cut to the budget; none when the target
       cannot encode the text (:class:`~hsd_torch.vocab.text.Unencodable`: a byte it has no token for).
    4. Exact-match verification (:func:`hsd_torch.engine.verification.exact_match`): the target draws its
       own token at every candidate position; emit while they equal the candidates, then the first
       that differs or the bonus.
"""

from __future__ import annotations

from collections.abc import Sequence
from hsd_core.laws import Prob
from hsd_core.methods.resync import Resync

from ..engine.round_state import DraftColumns, Drafts, RoundView, Verdicts
from ..vocab.text import TokenText, Unencodable
from .base import Method

__all__ = ["SLEM", "retokenize"]


def retokenize(text_of: TokenText, ctx: Sequence[int], text: bytes, lookbehind: int) -> list[int]:
    """``hsd_core.methods.slem.retokenize`` over ids and bytes: for ``w`` from
    ``min(lookbehind, len(ctx))`` down to 0, encode the text of the last ``w`` ids of ``ctx``
    followed by ``text``; the first encoding that starts with exactly those ``w`` ids gives the
    candidates (the rest of it)."""
    for w in range(min(lookbehind, len(ctx)), -1, -1):
        tail = list(ctx[len(ctx) - w:])
        ids = text_of.encode(text_of.decode(tail) + text)
        if ids[:w] == tail:
            return ids[w:]
    raise AssertionError("unreachable: the empty look-behind always matches")


class SLEM(Method):
    """String-level exact match with look-behind ``lookbehind`` (the target's re-tokenization) and
    the drafter's context re-synced under ``resync`` (:mod:`hsd_core.methods.resync`); with
    ``min_confidence`` the draft length is dynamic (:func:`hsd_torch.engine.drafting.draft_tokens`)."""

    name = "slem"

    def __init__(self, lookbehind: int, resync: Resync = Resync(), *, lookahead: int = 4,
                 min_confidence: Prob | None = None) -> None:
        super().__init__(lookahead=lookahead, min_confidence=min_confidence)
        self.lookbehind, self.text_resync = lookbehind, resync

    def setup(self, gen: RoundView) -> None:
        """Drafts come from the drafter's whole text space; candidates are mapped after re-tokenizing;
        the exact match reads no drafter law (only the draws read them: under top-p, from the kept heads)."""
        assert gen.d_space is not None
        self.cols = DraftColumns(gen.d_space, gen.d_space.n, None, stop_on_empty=True, laws_read=False)

    def draft(self, gen: RoundView, active: list[bool], budget: list[int]) -> Drafts:
        """``lookahead`` drafter tokens per active row, re-tokenized into target candidates."""
        assert gen.dt is not None
        gen.drafter_context_from_text(active, self.text_resync)
        out, drafts_d = gen.draft_tokens(active, self.depth(active, budget), self.cols, self.min_confidence)
        tt, t_pos, eos_d = gen.tt, gen.t_space.pos, gen.dt.eos_id
        for i in range(gen.batch):
            if not active[i]:
                continue
            ended = bool(drafts_d[i]) and drafts_d[i][-1] == eos_d
            try:
                cands = retokenize(tt, gen.t_ctx[i][len(gen.t_first[i]):], gen.dt.decode(drafts_d[i]),
                                   self.lookbehind)
            except Unencodable:  # text the target cannot encode is not proposed: the target decodes
                cands, ended = [], False
            if ended:
                cands = cands + [tt.eos_id]
            out.cols[i] = [t_pos[t] for t in cands[:budget[i]]]
            out.n[i] = len(out.cols[i])
        return out

    def verify(self, gen: RoundView, active: list[bool], budget: list[int], drafts: Drafts) -> Verdicts:
        """Exact match of the candidates against the target's own draws."""
        return gen.exact_match(active, budget, drafts)
