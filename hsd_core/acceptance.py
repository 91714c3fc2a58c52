"""Closed-form acceptance rates for one position (the paper's formulas), from a round's state.

For the first proposal of a round, with ``p`` the target's law at the round's context:

* SD: ``sum_t min(p, q)``;
* TLI: ``sum_{t in T∩D} min(p(t), q_cap(t))``; the union baseline ``sum_{t in T∩D} min(p(t), q(t))``;
* SLEM: ``sum_t p(t) psi(t)``, psi the law of the first candidate;
* SLRS: ``sum_t min(p(t), psi(t))``, with the psi SLRS verifies against (``SLRS.psi``), which
  the tests show equals SLEM's first-candidate law for the same lookahead and look-behind; times
  the probability that there is a proposal, where some drafted texts propose none (alphabets
  that differ), psi being the law given one.

The tests check these against the enumerated rounds (``Analysis.first_acceptance``).
"""

from __future__ import annotations

from fractions import Fraction

from .laws import Law, Prob
from .methods.base import Method, State
from .methods.sd import SD
from .methods.slem import SLEM, draft_candidates
from .methods.slrs import SLRS
from .methods.tli import TLI, drafter_context, intersection
from .models import Model
from .rand import Enumerator, Rand


def _min_sum(p: Law, q: Law) -> Prob:
    zero: Prob = Fraction(0)
    return sum((min(a, b) for a, b in zip(p, q)), zero)


def first_candidate_law(method: SLEM | SLRS, target: Model, drafter: Model, state: State) -> Law:
    """psi: exact law over target ids of the first candidate SLEM's procedure reads off the draft
    (a sub-probability when some drafted texts propose none: the target cannot encode them)."""

    def first(rand: Rand) -> int:
        cands = draft_candidates(target, drafter, state, rand, method.lookahead, False, method.lookbehind,
                                 resync=method.resync)
        return cands[0] if cands else -1

    law = Enumerator().law(first)
    zero: Prob = Fraction(0)
    return tuple(law.get(t, zero) for t in range(len(target.vocab)))


def tli_laws(target: Model, drafter: Model, state: State) -> tuple[Law, Law | None]:
    """(raw q pushed to target ids over the intersection, q_cap pushed; None if no mass)."""
    inter = intersection(target.vocab, drafter.vocab)
    q = drafter.next_probs(drafter_context(target, drafter, state, inter))
    n = len(target.vocab)
    cap = inter.restrict(q)
    return inter.push(q, n), None if cap is None else inter.push(cap, n)


def union_acceptance(target: Model, drafter: Model, state: State) -> Prob:
    """The union baseline ``sum_{T∩D} min(p, q)`` at the round's first position."""
    p = target.next_probs(state.target_context(target))
    return _min_sum(p, tli_laws(target, drafter, state)[0])


def closed_form_acceptance(method: Method, target: Model, drafter: Model | None, state: State) -> Prob | None:
    """The paper's one-position acceptance for ``method`` (sampling mode), or None if none applies."""
    if drafter is None or method.greedy:
        return None
    p = target.next_probs(state.target_context(target))
    zero: Prob = Fraction(0)
    if isinstance(method, SD) and type(method) is SD:
        q = drafter.next_probs(tuple(drafter.tokenizer.encode(state.prompt)) + state.emitted)
        return _min_sum(p, q)
    if isinstance(method, TLI) and type(method) is TLI:
        cap = tli_laws(target, drafter, state)[1]
        return zero if cap is None else _min_sum(p, cap)
    if type(method) is SLEM:
        assert isinstance(method, SLEM)
        psi = first_candidate_law(method, target, drafter, state)
        return sum((a * b for a, b in zip(p, psi)), zero)
    if type(method) is SLRS:
        assert isinstance(method, SLRS)
        pl = method.psi(target, drafter, state)
        proposes = sum((pr for s, pr in pl.law.items() if s), zero)  # < 1 when some texts propose nothing
        return zero if proposes == 0 else proposes * _min_sum(p, pl.first(len(target.vocab)))
    return None
