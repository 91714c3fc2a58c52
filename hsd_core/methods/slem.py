"""SLEM: string-level exact match (Timor et al. 2025, Algorithm 2).

Glossary
    draft       a drafter token, sampled in the drafter's own vocabulary.
    lookahead   k, the number of drafter tokens drafted per round (fewer near the budget, or if the
                drafter emits EOS).
    candidate   a target token read off the drafted text by re-tokenizing it for the target.
    accepted    a candidate equal to the target's own sample (greedy: argmax) at its position.
    rejected    the first candidate that differs; the target's own token replaces it.
    bonus       the target's own token after the last candidate, when all candidates match.
    look-behind the last few target tokens decoded and re-encoded together with the draft, so that
                the candidates are what the target tokenizer makes of the text in context.

Steps of one round
    1. Drafter context = the drafter's encoding of (prompt + decoded emitted ids): it is re-synced
       from the accepted text every round, incrementally (``resync``, :mod:`.resync`).
    2. Draft ``min(k, budget)`` drafter tokens (sampling, or argmax when greedy), stopping after
       drafter EOS: no round drafts more drafter tokens than it can emit target tokens.
    3. Candidates = :func:`retokenize` of the drafted text after the target context, followed by
       the target's EOS if the drafter ended with EOS; none when the target cannot encode the text
       (a character outside its alphabet: the alphabets may differ).
    4. The target takes its own token at every candidate position (sample from ``p_j``, or argmax):
       emit tokens while they equal the candidates; the first one that differs is emitted and ends
       the round; if all match, one more (the bonus) is emitted.
The target's context is only ever its own emitted ids, never re-tokenized text, so every emitted
token is the target's own draw given its own history: SLEM is lossless for any drafter.
"""

from __future__ import annotations

from ..laws import Prob, argmax
from ..models import Model
from .base import (HeterogeneousMethod, RoundOutcome, State, check_confidence, check_greedy, check_lookahead, check_lookbehind,
                   draft_autoregressive, sample)
from ..rand import Rand
from ..tokenizers import Unencodable, encode_free
from .resync import Resync, as_resync, drafter_context_ids


def retokenize(target: Model, ctx: tuple[int, ...], text: str, lookbehind: int) -> tuple[int, ...]:
    """Target ids ``c`` such that ``decode(ctx + c) == decode(ctx) + text``, as the target tokenizer
    would split ``text`` in context.

    For ``w`` from ``min(lookbehind, len(ctx))`` down to 0: encode the text of the last ``w``
    context ids followed by ``text``; the first ``w`` for which the encoding starts with exactly
    those ``w`` ids gives the candidates (the rest of the encoding). ``w = 0`` (``text`` encoded on
    its own) always succeeds, so a merge across the boundary that would rewrite committed ids is
    never proposed.
    """
    tok = target.tokenizer
    for w in range(min(lookbehind, len(ctx)), -1, -1):
        tail = ctx[len(ctx) - w:]
        ids = tok.encode(tok.decode(tail) + text)
        if tuple(ids[:w]) == tail:
            return tuple(ids[w:])
    raise AssertionError("unreachable: the empty look-behind always matches")


def drafter_context(target: Model, drafter: Model, state: State, resync: Resync | None) -> tuple[int, ...]:
    """Step 1: the drafter's ids of (prompt + decoded emitted ids) under ``resync``
    (:func:`hsd_core.methods.resync.drafter_context_ids`; ``None``: the default :class:`Resync`),
    leaving out characters the drafter cannot encode (:func:`~hsd_core.tokenizers.encode_free`)."""
    tok = drafter.tokenizer
    return tuple(drafter_context_ids(state.text(target), lambda t: encode_free(tok, t), tok.decode,
                                     as_resync(resync)))


def draft_candidates(
    target: Model,
    drafter: Model,
    state: State,
    rand: Rand,
    lookahead: int,
    greedy: bool,
    lookbehind: int,
    target_ctx: tuple[int, ...] | None = None,
    resync: Resync | None = None,
    min_confidence: Prob | None = None,
) -> tuple[int, ...]:
    """SLEM's proposal: steps 1-3 of a round (shared with SLRS, whose psi is this function's law);
    the drafter's context is :func:`drafter_context` under ``resync`` (``None``: the default); with
    ``min_confidence`` the draft length is dynamic (:func:`~hsd_core.methods.base.draft_autoregressive`).

    Returns the candidate target ids: empty when the target cannot encode the drafted text
    (:class:`~hsd_core.tokenizers.Unencodable`: a character outside its alphabet), else never
    empty (the drafter either writes text or ends).
    """
    ctx_t = state.target_context(target) if target_ctx is None else target_ctx
    d_ctx = drafter_context(target, drafter, state, resync)
    drafts, _ = draft_autoregressive(drafter, d_ctx, lookahead, rand, greedy, min_confidence=min_confidence)
    ended = bool(drafts) and drafts[-1] == drafter.vocab.eos_id
    text = drafter.tokenizer.decode(drafts)
    try:
        cands = retokenize(target, ctx_t, text, lookbehind)
    except Unencodable:  # a text the target cannot encode is not proposed: the round is the target's own token
        return ()
    return cands + ((target.vocab.eos_id,) if ended else ())


class SLEM(HeterogeneousMethod):
    """String-level exact match: the target keeps the longest prefix of the re-tokenized draft that
    agrees with its own draws, plus one token of its own.

    Defaults: ``lookahead=3``, ``greedy=False``, ``lookbehind=4`` (the target's re-tokenization),
    ``resync=Resync(stride=256, lookbehind=4)`` (the drafter's context, :mod:`.resync`),
    ``min_confidence=None`` (with a probability: stop drafting before a later draft whose law's top
    probability is below it).
    """

    name = "SLEM"

    def __init__(self, lookahead: int = 3, greedy: bool = False, lookbehind: int = 4,
                 resync: Resync | None = Resync(), min_confidence: Prob | None = None) -> None:
        self.lookahead = check_lookahead(lookahead)
        self.greedy = check_greedy(greedy)
        self.lookbehind = check_lookbehind(lookbehind)
        self.resync = as_resync(resync)
        self.min_confidence = check_confidence(min_confidence)

    def _target_context(self, target: Model, state: State) -> tuple[int, ...]:
        return state.target_context(target)

    def candidates(self, target: Model, drafter: Model, state: State, rand: Rand) -> tuple[int, ...]:
        """The round's candidate target ids (steps 1-3)."""
        return draft_candidates(target, drafter, state, rand, min(self.lookahead, state.budget), self.greedy,
                                self.lookbehind, state.target_context(target), self.resync, self.min_confidence)

    def step(self, target: Model, drafter: Model | None, state: State, rand: Rand) -> RoundOutcome:
        assert drafter is not None
        cands = self.candidates(target, drafter, state, rand)[: state.budget]
        ctx = self._target_context(target, state)
        eos = target.vocab.eos_id
        out: list[int] = []
        for j, c in enumerate(cands):
            p = target.next_probs(ctx + tuple(out))
            t = argmax(p) if self.greedy else rand.categorical(p)
            out.append(t)
            if t != c:
                return RoundOutcome(tuple(out), len(cands), j)
            if t == eos or len(out) >= state.budget:
                return RoundOutcome(tuple(out), len(cands), j + 1)
        p = target.next_probs(ctx + tuple(out))
        out.append(sample(p, rand, self.greedy))
        return RoundOutcome(tuple(out), len(cands), len(cands))
