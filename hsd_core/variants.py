"""Deliberately lossy methods: plausible bugs that a test-suite must catch.

Each variant changes one hook of a correct method (the rest of the code path is the real one),
so the exact engine and the statistical audits are shown to fail on exactly that bug. The
registry :data:`VARIANTS` maps a name to a factory ``() -> Method``; ``PINNED`` (in
``tests/exact/test_variants.py``) holds for each one a small world on which the exact engine
finds it lossy, and by how much.

The token-tree variants (:data:`TREE_VARIANTS`, pinned in :data:`TREE_PINNED` with their own
``max_new_tokens``: a tree bug may need three tokens to show) form a registry of their own, so the
tests that iterate :data:`VARIANTS` with :data:`PINNED_MAX_NEW_TOKENS` (the statistical suite, the
sequence audits) keep their stated sizes. ``hsd audit`` lists them after the others (exact, and
sampled with ``--sampled``); their exact and sized sampled tests are in ``tests/exact/test_trees.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from fractions import Fraction

from .laws import Law, Prob, normalized
from .methods.base import Method, State
from .methods.sd import SD
from .methods.slem import SLEM
from .methods.slrs import SLRS, Proposal
from .methods.tli import TLI, Intersection
from .methods.tree import Dynamic, SDTree, Static, TLITree, TokenTree
from .models import Model
from .rand import Rand


class AcceptEveryDraft(SD):
    """SD that skips the ratio test: every draft is kept (the output is the drafter's law)."""

    name = "accept_every_draft"

    def _accept_prob(self, p: Law, q: Law, x: int) -> Prob:
        return p[x] - p[x] + 1


class ResidualFromP(SD):
    """SD that resamples a rejected draft from ``p`` instead of ``norm(max(p - q, 0))``."""

    name = "residual_from_p"

    def _correction_law(self, p: Law, q: Law) -> Law:
        return p


class BonusOffByOne(SD):
    """SD whose bonus token comes from the last *verified* position's law ``p_n`` instead of
    ``p_{n+1}`` (an off-by-one in the logits index)."""

    name = "bonus_off_by_one"

    def _bonus_law(self, p_next: Law, p_last: Law | None) -> Law:
        return p_next if p_last is None else p_last


class TLIRawQ(TLI):
    """TLI that samples from the renormalized q_cap but puts the raw drafter q in the ratio and
    the residual (the most common real-world bug: q is not the law the draft was drawn from)."""

    name = "tli_raw_q"

    def _verification_law(self, inter: Intersection, q: Law, sampled: Law, size: int) -> Law:
        return inter.push(q, size)


class TLIOutsideIntersection(TLI):
    """TLI that forgets the mask: it drafts from the full drafter law, maps a draft outside the
    intersection to the first target token of its text, and verifies against the pushforward of
    q through the intersection only (mass that arrives from outside tokens is unaccounted for)."""

    name = "tli_outside_intersection"

    def _sampling_law(self, inter: Intersection, q: Law) -> Law | None:
        return q

    def _map_draft(self, target: Model, drafter: Model, inter: Intersection, d: int) -> int:
        t = inter.to_target[d]
        return t if t is not None else target.tokenizer.encode(drafter.vocab.string(d))[0]

    def _verification_law(self, inter: Intersection, q: Law, sampled: Law, size: int) -> Law:
        return inter.push(q, size)

    def _accept_prob(self, p: Law, q: Law, x: int) -> Prob:
        return p[x] - p[x] + 1 if q[x] == 0 else super()._accept_prob(p, q, x)


class TLIScatterAssign(TLI):
    """TLI whose drafter -> target map assigns instead of adding: when several drafter ids share a
    string, q_cap keeps the mass of the last one only (and renormalizes what is left)."""

    name = "tli_scatter_assign"

    def _verification_law(self, inter: Intersection, q: Law, sampled: Law, size: int) -> Law:
        zero = sampled[0] - sampled[0]
        out: list[Prob] = [zero] * size
        for d, qd in enumerate(sampled):
            t = inter.to_target[d]
            if t is not None:
                out[t] = qd
        total = sum(out)
        return tuple(x / total for x in out)


class SLEMRetokenizedContext(SLEM):
    """SLEM that conditions the target on the re-tokenized text (prompt + decoded emitted ids)
    instead of the ids it emitted: a non-canonical emitted tokenization gets rewritten."""

    name = "slem_retokenized_context"

    def _target_context(self, target: Model, state: State) -> tuple[int, ...]:
        return tuple(target.tokenizer.encode(state.text(target)))


def concat_psi(target: Model, drafter: Model, d_ctx: tuple[int, ...], t: int) -> Prob:
    """The *published* psi(t): the sum, over every drafter token sequence whose concatenation is
    exactly the string of target id ``t``, of its drafter probability (EOS: the drafter's EOS)."""
    if t == target.vocab.eos_id:
        return drafter.next_probs(d_ctx)[drafter.vocab.eos_id]
    s = target.vocab.string(t)
    zero: Prob = Fraction(0)
    total = zero
    stack: list[tuple[tuple[int, ...], int, Prob]] = [(d_ctx, 0, drafter.next_probs(d_ctx)[0] * 0 + 1)]
    while stack:
        ctx, pos, pr = stack.pop()
        q = drafter.next_probs(ctx)
        for d, tok in enumerate(drafter.vocab.tokens):
            if q[d] > 0 and s.startswith(tok, pos):
                if pos + len(tok) == len(s):
                    total += pr * q[d]
                else:
                    stack.append((ctx + (d,), pos + len(tok), pr * q[d]))
    return total


class SLRSConcatPsi(SLRS):
    """SLRS with the published psi: "the drafter's probability of the segmentations that
    concatenate exactly to t", instead of the law of the proposal actually drawn."""

    name = "slrs_concat_psi"

    def __init__(self, lookahead: int = 2) -> None:
        super().__init__(lookahead=lookahead, max_tokens=1)
        self.name = "slrs_concat_psi"

    def proposal_laws(self, target: Model, drafter: Model, state: State, proposal: Proposal) -> list[Law]:
        d_ctx = tuple(drafter.tokenizer.encode(state.text(target)))
        psi = tuple(concat_psi(target, drafter, d_ctx, t) for t in range(len(target.vocab)))
        return [psi for _ in proposal]

    def _accept_prob(self, p: Law, q: Law, x: int) -> Prob:
        return p[x] - p[x] + 1 if q[x] == 0 else super()._accept_prob(p, q, x)


class SLRSUnconditioned(SLRS):
    """Multi-token SLRS that verifies t_j against the *marginal* law of the j-th proposed token
    instead of its law given the proposed t_1..t_{j-1}."""

    name = "slrs_unconditioned"

    def __init__(self, lookahead: int = 2) -> None:
        super().__init__(lookahead=lookahead, max_tokens=None)
        self.name = "slrs_unconditioned"

    def proposal_laws(self, target: Model, drafter: Model, state: State, proposal: Proposal) -> list[Law]:
        psi = self.psi(target, drafter, state)
        n = len(target.vocab)
        out: list[Law] = []
        for j in range(len(proposal)):
            zero: Prob = psi.law[proposal] * 0
            w = [zero] * n
            for s, pr in psi.law.items():
                if len(s) > j:
                    w[s[j]] += pr
            total = sum(w)
            out.append(tuple(x / total for x in w))
        return out


class SLRSCoinStop(SLRS):
    """Bounded SLRS (longest-prefix map) whose drafting also stops on a fair coin after each
    unsettled draft, while psi is still the law of the procedure without the coin: the stopping
    rule looks at something psi does not account for (a stop that changes which token is proposed
    when the text is not settled yet)."""

    name = "slrs_coin_stop"

    def __init__(self, lookahead: int = 2, min_path_prob: Fraction | None = Fraction(1, 16)) -> None:
        super().__init__(lookahead=lookahead, max_tokens=1, min_path_prob=min_path_prob,
                         proposal_map="longest_prefix")
        self.name = "slrs_coin_stop"
        self._honest = SLRS(lookahead=lookahead, max_tokens=1, min_path_prob=min_path_prob,
                            proposal_map="longest_prefix")

    def _extra_stop(self, rand: Rand) -> bool:
        return rand.bernoulli(Fraction(1, 2))

    def proposal_laws(self, target: Model, drafter: Model, state: State, proposal: Proposal) -> list[Law]:
        return [self._honest.psi(target, drafter, state).first(len(target.vocab)) for _ in proposal]

    def _accept_prob(self, p: Law, q: Law, x: int) -> Prob:
        return p[x] - p[x] + 1 if q[x] == 0 else super()._accept_prob(p, q, x)


VARIANTS: dict[str, Callable[[], Method]] = {
    "accept_every_draft": lambda: AcceptEveryDraft(lookahead=2),
    "residual_from_p": lambda: ResidualFromP(lookahead=2),
    "bonus_off_by_one": lambda: BonusOffByOne(lookahead=1),
    "tli_raw_q": lambda: TLIRawQ(lookahead=2),
    "tli_outside_intersection": lambda: TLIOutsideIntersection(lookahead=2),
    "tli_scatter_assign": lambda: TLIScatterAssign(lookahead=2),
    "slem_retokenized_context": lambda: SLEMRetokenizedContext(lookahead=2),
    "slrs_concat_psi": lambda: SLRSConcatPsi(lookahead=2),
    "slrs_unconditioned": lambda: SLRSUnconditioned(lookahead=2),
    "slrs_coin_stop": lambda: SLRSCoinStop(lookahead=2),
}
"""Name -> factory of each deliberately lossy method."""

NEEDS_SAME_VOCAB = frozenset({"accept_every_draft", "residual_from_p", "bonus_off_by_one"})
"""Variants of SD, which need the drafter to share the target's vocabulary."""

_ABC = ["a", "b", "c"]

PINNED: dict[str, dict[str, object]] = {
    "accept_every_draft": {"target": {"tokens": _ABC, "random": 0}, "drafter": {"random": 0, "zero_prob": 0.8}},
    "residual_from_p": {"target": {"tokens": _ABC, "random": 0}, "drafter": {"random": 0, "zero_prob": 0.3}},
    "bonus_off_by_one": {"target": {"tokens": _ABC, "random": 0}, "drafter": {"random": 0}},
    "tli_raw_q": {"target": {"tokens": _ABC, "random": 0},
                  "drafter": {"tokens": _ABC + ["aa", "ab"], "random": 0, "outside_factor": 50}},
    "tli_outside_intersection": {"target": {"tokens": _ABC, "random": 0},
                                 "drafter": {"tokens": _ABC + ["aa"], "random": 0}},
    "tli_scatter_assign": {"target": {"tokens": _ABC + ["aa"], "random": 0},
                           "drafter": {"tokens": _ABC + ["aa", "aa"], "random": 0}},
    "slem_retokenized_context": {"target": {"tokens": _ABC + ["aa"], "random": 0},
                                 "drafter": {"tokens": _ABC + ["ab"], "random": 0}, "prompt": "a"},
    "slrs_concat_psi": {"target": {"tokens": _ABC, "random": 0}, "drafter": {"tokens": _ABC + ["aa"], "random": 0}},
    "slrs_unconditioned": {"target": {"tokens": _ABC, "random": 0}, "drafter": {"tokens": _ABC, "random": 0}},
    "slrs_coin_stop": {"target": {"tokens": _ABC + ["ab"], "random": 2}, "drafter": {"tokens": _ABC, "random": 2}},
}
"""For each variant, the spec (:func:`hsd_core.worlds.from_spec`) of a small world, found by
Hypothesis and shrunk, on which the exact engine shows it lossy with ``max_new_tokens=2``."""

PINNED_MAX_NEW_TOKENS = 2


class TLITreeStaleResidual(TLITree):
    """Sampled TLI-tree whose recursive rejection does not update the residual after a rejected
    sibling: every child of a node is tested against the target's law ``p`` itself, and the correction
    comes from ``p`` (a verifier that treats siblings as independent single drafts)."""

    name = "tli_tree_stale_residual"

    def _next_residual(self, r: Law, q: Law) -> Law:
        return r


class TLITreeDistinctWithIIDResidual(TLITree):
    """Sampled TLI-tree that drafts a node's children without replacement but verifies every child
    against the node's full law (the with-replacement ``q``), in the ratio and in the residual,
    instead of the law with the earlier siblings removed that the child was drawn from."""

    name = "tli_tree_distinct_iid_residual"

    def _child_law(self, tree: TokenTree, c: int) -> Law:
        first = tree.children(tree.parents[c])[0]
        law = tree.laws[first]
        assert law is not None
        return law


class SDTreeMatchAnyNodeAtDepth(SDTree):
    """SD-tree by exact match that accepts the target's draw when it matches *any* node at the next
    depth rather than a child of the current node, and goes on from that node (whose path, which
    the next target law is computed from, is not what was emitted)."""

    name = "sd_tree_match_any_node_at_depth"

    def _match_child(self, tree: TokenTree, v: int, t: int) -> int | None:
        for c in range(1, len(tree.tokens)):
            if tree.depths[c] == tree.depths[v] + 1 and tree.tokens[c] == t:
                return c
        return None


class TLITreePeeksAtTarget(TLITree):
    """Dynamic sampled TLI-tree whose expansion peeks at the target: it drafts a node's children only
    among tokens the target gives positive probability at that node (q restricted to p > 0), while
    the verifier is told the drafter's law q. With exact match such a tree would be harmless; the
    ratio test needs the law the draft was actually drawn from."""

    name = "tli_tree_peeks_at_target"

    def _sampling_law(self, target: Model, state: State) -> Callable[[tuple[int, ...], Law], Law] | None:
        ctx = state.target_context(target)

        def peek(path: tuple[int, ...], law: Law) -> Law:
            p = target.next_probs(ctx + path)
            zero = law[0] - law[0]
            kept = normalized([w if p[i] > 0 else zero for i, w in enumerate(law)])
            return law if kept is None else kept

        return peek


TREE_VARIANTS: dict[str, Callable[[], Method]] = {
    "tli_tree_stale_residual": lambda: TLITreeStaleResidual(Static((2,))),
    "tli_tree_distinct_iid_residual": lambda: TLITreeDistinctWithIIDResidual(Static((2,))),
    "sd_tree_match_any_node_at_depth": lambda: SDTreeMatchAnyNodeAtDepth(Static((2, 1)), verification="match"),
    "tli_tree_peeks_at_target": lambda: TLITreePeeksAtTarget(Dynamic(budget=3, width=2, depth=2)),
}
"""Name -> factory of each deliberately lossy token-tree method."""

TREE_PINNED: dict[str, dict[str, Any]] = {
    "tli_tree_stale_residual": {"target": {"tokens": _ABC, "random": 0},
                                "drafter": {"tokens": _ABC, "random": 100}, "max_new_tokens": 2},
    "tli_tree_distinct_iid_residual": {"target": {"tokens": _ABC, "random": 7},
                                       "drafter": {"tokens": _ABC, "random": 107, "zero_prob": 0.5},
                                       "max_new_tokens": 2},
    "sd_tree_match_any_node_at_depth": {"target": {"tokens": ["a", "b"], "random": 5, "zero_prob": 0.5},
                                        "drafter": {"random": 5}, "max_new_tokens": 3},
    "tli_tree_peeks_at_target": {"target": {"tokens": _ABC, "random": 0, "zero_prob": 0.5},
                                 "drafter": {"tokens": _ABC, "random": 100}, "max_new_tokens": 2},
}
"""For each tree variant, the spec (:func:`hsd_core.worlds.from_spec`; its ``max_new_tokens`` key is
the budget) of a small world on which the exact engine shows it lossy: found by a search over a few
seeds for a large TV (``tests/exact/test_trees.py`` records each TV)."""
