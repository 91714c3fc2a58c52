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

Token trees (:mod:`hsd_core.methods.tree`): given the round's tree, the expected accepted length is the
sum over its nodes of the probability that verification reaches the node, each a product along the
node's path of one-step acceptance probabilities (exact match: ``p(x)`` for the first child with
token ``x``, greedy: 1 for the first child with the target's argmax; RRS: the probability that the
child's earlier siblings are rejected and the child accepted, with the residual chain); the
expected number of emitted tokens adds one for the target's own token unless the accepted path ends
at EOS or at the budget. :func:`tree_expected` averages these over the exact law of the tree
(enumerated drafting only), and the tests check them against the enumerated rounds.
"""

from __future__ import annotations

from fractions import Fraction

from .laws import Law, Prob, argmax, residual
from .methods.base import Method, State
from .methods.sd import SD
from .methods.slem import SLEM, draft_candidates
from .methods.slrs import SLRS
from .methods.tli import TLI, drafter_context, intersection
from .methods.tree import SLEMTree, TokenTree, TokenTreeMethod
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
                                 resync=method.resync, min_confidence=getattr(method, "min_confidence", None))
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


def tree_given(tree: TokenTree, target: Model, ctx: tuple[int, ...], budget: int, rrs: bool,
               greedy: bool) -> tuple[Prob, Prob]:
    """(E[accepted length], E[emitted tokens]) of verifying ``tree`` after target context ``ctx``
    (module docstring), computed in closed form from the nodes' reach probabilities."""
    one: Prob = Fraction(1)
    zero: Prob = Fraction(0)
    reach: list[Prob] = [one] + [zero] * tree.size
    for v in range(len(tree.tokens)):
        kids = tree.children(v)
        if not kids or reach[v] == 0:
            continue
        p = target.next_probs(ctx + tree.path(v))
        if rrs and not greedy:
            r: Law = p
            stay = one
            for c in kids:
                x, q = tree.tokens[c], tree.laws[c]
                assert q is not None
                a = min(one, r[x] / q[x])
                reach[c] = reach[v] * stay * a
                stay *= one - a
                r = residual(r, q)
            continue
        seen: set[int] = set()
        for c in kids:
            x = tree.tokens[c]
            if x not in seen:
                seen.add(x)
                reach[c] = reach[v] * ((one if x == argmax(p) else zero) if greedy else p[x])
    eos = target.vocab.eos_id
    accepted = sum(reach[1:], zero)
    ends = sum((reach[c] for c in range(1, len(reach)) if tree.tokens[c] == eos or tree.depths[c] >= budget), zero)
    return accepted, accepted + 1 - ends


def tree_expected(method: SLEMTree | TokenTreeMethod, target: Model, drafter: Model, state: State) -> tuple[Prob, Prob]:
    """(E[accepted length], E[emitted tokens]) of one round of a tree method from ``state``: the
    closed form of :func:`tree_given`, averaged over the exact law of the round's tree."""
    trees = Enumerator().law(lambda rand: method.draft(target, drafter, state, rand))
    rrs = isinstance(method, TokenTreeMethod) and method.verification == "rrs"
    ctx = state.target_context(target)
    zero: Prob = Fraction(0)
    acc, tok = zero, zero
    for tree, w in trees.items():
        a, t = tree_given(tree, target, ctx, state.budget, rrs, method.greedy)
        acc += w * a
        tok += w * t
    return acc, tok
