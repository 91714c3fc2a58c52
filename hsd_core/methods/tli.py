"""TLI: token-level intersection (Timor et al. 2025, Algorithm 4).

Glossary
    intersection  the token strings that both vocabularies hold (the two EOS ids also correspond).
    q_cap         the drafter's law restricted to drafter ids whose string is in the intersection,
                  renormalized; pushed to target ids it is the law each draft is sampled from.
    draft         a drafter id sampled from q_cap and mapped to the target id with its string.
    lookahead     k, the number of drafts per round (fewer near the budget, after EOS, or when
                  the drafter puts no mass on the intersection).
    accepted / rejected / correction / bonus   as in standard SD (see ``sd.py``), with q = q_cap.

Steps of one round
    1. Drafter context = the drafter's encoding of the prompt, then each emitted target id mapped
       back: a token of the intersection becomes the drafter id the drafter's tokenizer writes its
       string as (``Vocabulary.id_of``: the lowest such id unless the vocabulary names another, as a
       SentencePiece vocabulary names its piece ``b`` over the byte fallback ``<0x62>``), any other
       token is re-tokenized by the drafter tokenizer (the re-sync).
    2. Draft up to ``k`` drafter ids from q_cap; stop early after EOS, or when the drafter's mass
       on the intersection is zero. If the intersection is empty or has no mass at the first
       draft, no draft is made and the round is plain target decoding (one token from ``p``).
    3. Map the drafts to target ids; the q of each draft is the pushforward of the q_cap it was
       drawn from (several drafter ids with one string add up).
    4. Standard rejection-sampling verification (``RejectionVerifier``) with exactly those laws.
Greedy mode drafts the argmax of the drafter over the intersection (ties to the lowest drafter id).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..laws import Law, Prob, normalized
from ..models import Model
from .base import (HeterogeneousMethod, Method, RejectionVerifier, RoundOutcome, State, check_alphabet_covers,
                   check_confidence, check_greedy, check_lookahead, draft_autoregressive)
from ..rand import Rand
from ..vocab import Vocabulary


@dataclass(frozen=True)
class Intersection:
    """The string intersection of a drafter vocabulary ``D`` and a target vocabulary ``T``.

    ``to_target[d]`` is the target id the target's tokenizer writes drafter id ``d``'s string as
    (``Vocabulary.id_of``: the lowest id with it unless the vocabulary names another), or ``None`` when
    ``d``'s string is not a target token; the drafter's EOS maps to the target's EOS.
    ``to_drafter[t]`` is likewise the drafter id the drafter's tokenizer writes target id ``t``'s
    string as, or ``None``.
    """

    to_target: tuple[int | None, ...]
    to_drafter: tuple[int | None, ...]

    @staticmethod
    def of(target: Vocabulary, drafter: Vocabulary) -> Intersection:
        to_t: list[int | None] = [target.id_of(s) if s in target else None for s in drafter.tokens]
        to_t.append(target.eos_id)
        to_d: list[int | None] = [drafter.id_of(s) if s in drafter else None for s in target.tokens]
        to_d.append(drafter.eos_id)
        return Intersection(tuple(to_t), tuple(to_d))

    @property
    def shared_strings(self) -> int:
        """Number of target ids (EOS excluded) whose string the drafter also has."""
        return sum(d is not None for d in self.to_drafter[:-1])

    def restrict(self, q: Law) -> Law | None:
        """q_cap over drafter ids: ``q`` zeroed outside the intersection and renormalized
        (``None`` when that leaves no mass)."""
        zero = q[0] - q[0]
        return normalized([qd if self.to_target[d] is not None else zero for d, qd in enumerate(q)])

    def push(self, q: Law, size: int) -> Law:
        """The law over target ids (``size`` of them) of ``to_target[d]`` for ``d ~ q``."""
        zero: Prob = q[0] - q[0] if q else Fraction(0)
        out: list[Prob] = [zero] * size
        for d, qd in enumerate(q):
            t = self.to_target[d]
            if t is not None:
                out[t] += qd
        return tuple(out)


_CACHE: dict[tuple[Vocabulary, Vocabulary], Intersection] = {}


def intersection(target: Vocabulary, drafter: Vocabulary) -> Intersection:
    """The (cached) :class:`Intersection` of two vocabularies."""
    key = (target, drafter)
    if key not in _CACHE:
        _CACHE[key] = Intersection.of(target, drafter)
    return _CACHE[key]


def drafter_context(target: Model, drafter: Model, state: State, inter: Intersection) -> tuple[int, ...]:
    """Step 1: the drafter's context, a function of the prompt and the emitted target ids only."""
    ctx = list(drafter.tokenizer.encode(state.prompt))
    for t in state.emitted:
        d = inter.to_drafter[t]
        if d is not None:
            ctx.append(d)
        else:
            ctx.extend(drafter.tokenizer.encode(target.vocab.string(t)))
    return tuple(ctx)


class TLI(RejectionVerifier, HeterogeneousMethod):
    """Token-level intersection: SD with the drafter renormalized onto the shared tokens.

    Defaults: ``lookahead=3``, ``greedy=False``, ``min_confidence=None`` (with a probability: stop
    drafting before a later draft whose q_cap's top probability is below it).
    """

    name = "TLI"

    def __init__(self, lookahead: int = 3, greedy: bool = False, min_confidence: Prob | None = None) -> None:
        self.lookahead = check_lookahead(lookahead)
        self.greedy = check_greedy(greedy)
        self.min_confidence = check_confidence(min_confidence)

    def check_models(self, target: Model, drafter: Model | None) -> None:
        """As every heterogeneous method, except that the drafter's alphabet need only contain the
        target's (``proofs/tli.md``: the re-sync encodes target text for the drafter; drafter
        tokens with other characters are simply outside the intersection)."""
        Method.check_models(self, target, drafter)
        assert drafter is not None
        check_alphabet_covers(target, drafter)

    def _sampling_law(self, inter: Intersection, q: Law) -> Law | None:
        return inter.restrict(q)

    def _map_draft(self, target: Model, drafter: Model, inter: Intersection, d: int) -> int:
        t = inter.to_target[d]
        assert t is not None, "TLI drafts only intersection tokens"
        return t

    def _verification_law(self, inter: Intersection, q: Law, sampled: Law, size: int) -> Law:
        return inter.push(sampled, size)

    def step(self, target: Model, drafter: Model | None, state: State, rand: Rand) -> RoundOutcome:
        assert drafter is not None
        inter = intersection(target.vocab, drafter.vocab)
        d_ctx = drafter_context(target, drafter, state, inter)
        k = min(self.lookahead, state.budget)
        drafts, sampled = draft_autoregressive(
            drafter, d_ctx, k, rand, self.greedy, lambda q: self._sampling_law(inter, q), self.min_confidence)
        n = len(target.vocab)
        qs = [self._verification_law(inter, drafter.next_probs(d_ctx + tuple(drafts[:j])), s, n)
              for j, s in enumerate(sampled)]
        xs = [self._map_draft(target, drafter, inter, d) for d in drafts]
        return self.verify(target, state.target_context(target), xs, qs, rand, state.budget)
