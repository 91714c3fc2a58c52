"""Token trees: SLEM-tree, SD-tree and TLI-tree, verified by exact match or by recursive rejection sampling.

A tree round drafts many candidate continuations at once and lets the target verify all of them in one
pass (``hsd_torch`` will compute the target's laws at every node in one forward pass; here each node's
law is one ``next_probs`` call). ``proofs/slem_tree.md``, ``proofs/sd_tree.md`` and ``proofs/tli_tree.md``
prove every method here lossless; ``docs/trees.md`` is the overview.

Glossary
    tree        a :class:`TokenTree`: a flat list of nodes in drafting order. Node 0 is the root (the
                round's context, no token). Every other node ``i`` has a token ``tokens[i]``, a parent
                ``parents[i] < i`` and a depth ``depths[i] = depths[parents[i]] + 1``.
    path        the tokens from the root down to a node (the root's path is empty). A node's context is
                the round's context followed by its path.
    children    the nodes whose parent is a given node, in the order they were drafted.
    law         ``laws[i]``: the law node ``i``'s token was drawn from, given its parent's path and the
                siblings drawn before it (``None`` where there is none: SLEM's trie of re-tokenized text).
    shape       :class:`Static` (a width per depth: every node at depth ``d`` gets ``widths[d]``
                children) or :class:`Dynamic` (repeatedly expand the unexpanded node of highest drafter
                path probability, ``width`` children at a time, until ``budget`` nodes).
    draws       how a node's children are drawn from its law ``q``: ``"iid"`` (independently, repeats
                allowed) or ``"distinct"`` (without replacement: the ``i``-th child from ``q`` with the
                earlier children's tokens removed, renormalized; that law is what ``laws`` records).
                Greedy drafting takes the ``width`` most likely tokens (ties to the lowest id).
    exact match at the current node the target draws its own token (greedy: argmax) from its law at
                that node; the token is emitted; if it is a child's token the round descends into that
                child (the first such child), otherwise the round ends. A token drawn at a node without
                children is the bonus.
    recursive rejection sampling (RRS)
                SpecInfer's multi-step speculative sampling: at the current node, ``r = p`` (the target's
                law at the node); for each child ``c`` in order, accept its token ``x`` with probability
                ``min(1, r(x) / q_c(x))`` (``q_c = laws[c]``); on acceptance emit ``x`` and descend into
                ``c``; on rejection ``r <- norm(max(r - q_c, 0))``; when every child is rejected (or
                there is none) emit a token from ``r`` and end the round.

Steps of one round (SD-tree, TLI-tree)
    1. Drafter context as the single-path method (SD: the drafter's encoding of the prompt + the emitted
       ids; TLI: :func:`~hsd_core.methods.tli.drafter_context`).
    2. Draft a tree of depth at most the budget (:func:`draft_tree`). The law at a node is the drafter's
       law after the node's path (SD), or q_cap pushed to target ids (TLI; the node's path is mapped
       back to the drafter id each token's string is written as, ``Vocabulary.id_of``); EOS nodes get no children, a node whose
       law has no mass gets none either.
    3. Verify: RRS (sampling, ``verification="rrs"``) or exact match (greedy, or ``"match"``).
Steps of one round (SLEM-tree)
    1. Drafter context as SLEM's (:func:`~hsd_core.methods.slem.drafter_context`).
    2. Draft a tree of drafter tokens (depth at most the budget), over the drafter's vocabulary.
    3. Every root-to-leaf drafter path is decoded and re-tokenized for the target after the target
       context (:func:`~hsd_core.methods.slem.retokenize`, the target EOS appended when the path ended
       with the drafter's EOS; a text the target cannot encode is dropped); the candidate sequences
       form a trie of target ids (:func:`trie`), cut at the budget.
    4. Verify by exact match.

The randomness of a round is drawn through :class:`~hsd_core.rand.Rand` only, drafting first, then
verification, so :mod:`hsd_core.exact` enumerates it and :class:`~hsd_core.rand.UniformRand` replays it.
Nothing is carried across rounds: the tree is a function of the state and the round's own draws.
The uniforms a round consumes, in order (what a batched backend must record to be mirrored):

* drafting: for each expanded node in expansion order (static: node order, which is breadth first;
  dynamic: best first), one ``categorical`` per child drawn (none when greedy);
* exact match: one ``categorical`` per node visited (none when greedy);
* RRS: at each node visited, one ``bernoulli`` per child tried, in drafting order, until one is
  accepted; if none is, one ``categorical`` from the residual (at a leaf: from ``p``, the bonus).
"""

from __future__ import annotations

from collections.abc import Callable

from ..laws import Law, residual
from ..models import Model
from ..rand import Rand
from ..tokenizers import Unencodable
from .base import (HeterogeneousMethod, Method, RoundOutcome, State, check_alphabet_covers, check_greedy,
                   check_lookbehind, sample)
from .resync import Resync, as_resync
from .slem import drafter_context as slem_drafter_context
from .slem import retokenize
from .tli import drafter_context as tli_drafter_context
from .tli import intersection
from .tree_shapes import DRAWS, Dynamic, Shape, Static, TokenTree, check_draws, check_shape, draft_tree, trie

__all__ = ["DRAWS", "VERIFICATIONS", "Dynamic", "SDTree", "SLEMTree", "Shape", "Static", "TLITree", "TokenTree",
           "TokenTreeMethod", "TreeVerifier", "check_draws", "check_shape", "draft_tree", "trie"]


class TreeVerifier:
    """Verification of a :class:`TokenTree`, by exact match or by recursive rejection sampling.

    The target's law at a node is computed from the round's context followed by *that node's path*
    (what a tree-attention pass gives at the node), never from a separately kept record of the emitted
    ids: in the correct verifier the two agree. The hooks ``_match_child``, ``_child_law`` and
    ``_next_residual`` are overridden only by the deliberately lossy variants (:mod:`hsd_core.variants`).
    """

    greedy: bool = False

    def _match_child(self, tree: TokenTree, v: int, t: int) -> int | None:
        for c in tree.children(v):
            if tree.tokens[c] == t:
                return c
        return None

    def _child_law(self, tree: TokenTree, c: int) -> Law:
        law = tree.laws[c]
        assert law is not None, "RRS needs the law every child was drawn from"
        return law

    def _next_residual(self, r: Law, q: Law) -> Law:
        return residual(r, q)

    def verify_match(self, target: Model, ctx: tuple[int, ...], tree: TokenTree, rand: Rand,
                     budget: int) -> RoundOutcome:
        """Exact match on a tree (module glossary): emits at most ``budget`` target ids, the
        accepted path followed by one token of the target's own unless the path ends at EOS or at the
        budget. ``proposed`` is the number of nodes, ``accepted`` the accepted path's length."""
        eos = target.vocab.eos_id
        out: list[int] = []
        v = 0
        while True:
            t = sample(target.next_probs(ctx + tree.path(v)), rand, self.greedy)
            out.append(t)
            c = self._match_child(tree, v, t)
            if c is None:
                return RoundOutcome(tuple(out), tree.size, len(out) - 1)
            if t == eos or len(out) >= budget:
                return RoundOutcome(tuple(out), tree.size, len(out))
            v = c

    def verify_rrs(self, target: Model, ctx: tuple[int, ...], tree: TokenTree, rand: Rand,
                   budget: int) -> RoundOutcome:
        """Recursive rejection sampling on a tree (module glossary), with the law each child was
        drawn from as its ``q``: emits at most ``budget`` target ids, as :meth:`verify_match`."""
        eos = target.vocab.eos_id
        out: list[int] = []
        v = 0
        while True:
            r = target.next_probs(ctx + tree.path(v))
            chosen = None
            for c in tree.children(v):
                x, q = tree.tokens[c], self._child_law(tree, c)
                if rand.bernoulli(min(r[x] / q[x], r[x] - r[x] + 1)):
                    chosen = c
                    break
                r = self._next_residual(r, q)
            if chosen is None:
                out.append(rand.categorical(r))
                return RoundOutcome(tuple(out), tree.size, len(out) - 1)
            x = tree.tokens[chosen]
            out.append(x)
            if x == eos or len(out) >= budget:
                return RoundOutcome(tuple(out), tree.size, len(out))
            v = chosen


VERIFICATIONS = ("rrs", "match")


class TokenTreeMethod(TreeVerifier, Method):
    """SD-tree and TLI-tree: a tree of target ids drafted from a known law, then verified."""

    def __init__(self, shape: Shape = Static((2, 1, 1)), greedy: bool = False, draws: str = "distinct",
                 verification: str = "rrs") -> None:
        self.shape = check_shape(shape)
        self.greedy = check_greedy(greedy)
        self.draws = check_draws(draws)
        if verification not in VERIFICATIONS:
            raise ValueError(f"verification must be 'rrs' or 'match', got {verification!r}")
        self.verification = verification

    def law_at(self, target: Model, drafter: Model, state: State) -> Callable[[tuple[int, ...]], Law | None]:
        """The law (over target ids) a node's children are drawn from, as a function of its path."""
        raise NotImplementedError

    def _sampling_law(self, target: Model, state: State) -> Callable[[tuple[int, ...], Law], Law] | None:
        return None

    def draft(self, target: Model, drafter: Model | None, state: State, rand: Rand) -> TokenTree:
        """Steps 1-2: the round's tree (its exact law: enumerate this under :mod:`hsd_core.rand`)."""
        assert drafter is not None
        return draft_tree(self.law_at(target, drafter, state), self.shape, rand, self.greedy, self.draws,
                          target.vocab.eos_id, state.budget, self._sampling_law(target, state))

    def step(self, target: Model, drafter: Model | None, state: State, rand: Rand) -> RoundOutcome:
        tree = self.draft(target, drafter, state, rand)
        ctx = state.target_context(target)
        if self.greedy or self.verification == "match":
            return self.verify_match(target, ctx, tree, rand, state.budget)
        return self.verify_rrs(target, ctx, tree, rand, state.budget)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.shape!r}, greedy={self.greedy}, draws={self.draws!r}, "
                f"verification={self.verification!r})")


class SDTree(TokenTreeMethod):
    """SD over a token tree, drafter and target sharing one vocabulary.

    Defaults: ``shape=Static((2, 1, 1))``, ``greedy=False``, ``draws="distinct"``,
    ``verification="rrs"`` (greedy always verifies by exact match).
    """

    name = "SD-tree"

    def check_models(self, target: Model, drafter: Model | None) -> None:
        """As :class:`~hsd_core.methods.SD`: the drafter must share the target's vocabulary."""
        super().check_models(target, drafter)
        assert drafter is not None
        if drafter.vocab != target.vocab:
            raise ValueError("SDTree needs the drafter and the target to share one vocabulary; "
                             "use SLEMTree or TLITree for different vocabularies")

    def law_at(self, target: Model, drafter: Model, state: State) -> Callable[[tuple[int, ...]], Law | None]:
        d_ctx = tuple(drafter.tokenizer.encode(state.prompt)) + state.emitted

        def law(path: tuple[int, ...]) -> Law | None:
            return drafter.next_probs(d_ctx + path)

        return law


class TLITree(TokenTreeMethod, HeterogeneousMethod):
    """TLI over a token tree: every node's children are drawn from q_cap pushed to target ids.

    The node's drafter context is TLI's context followed by, for each token of its path, the drafter id
    that token's string is written as (``Vocabulary.id_of``) (the drafter's context is free: ``proofs/sd.md``). Defaults:
    ``shape=Static((2, 1, 1))``, ``greedy=False``, ``draws="distinct"``, ``verification="rrs"``.
    """

    name = "TLI-tree"

    def check_models(self, target: Model, drafter: Model | None) -> None:
        """As :class:`~hsd_core.methods.TLI`: the drafter's alphabet must contain the target's."""
        Method.check_models(self, target, drafter)
        assert drafter is not None
        check_alphabet_covers(target, drafter)

    def law_at(self, target: Model, drafter: Model, state: State) -> Callable[[tuple[int, ...]], Law | None]:
        inter = intersection(target.vocab, drafter.vocab)
        d_ctx = tli_drafter_context(target, drafter, state, inter)
        n = len(target.vocab)

        def law(path: tuple[int, ...]) -> Law | None:
            mapped = tuple(inter.to_drafter[t] for t in path)
            assert all(d is not None for d in mapped), "TLI-tree drafts only intersection tokens"
            cap = inter.restrict(drafter.next_probs(d_ctx + mapped))  # type: ignore[operator]
            return None if cap is None else inter.push(cap, n)

        return law


class SLEMTree(TreeVerifier, HeterogeneousMethod):
    """SLEM over a tree of drafter paths: their re-tokenizations form a trie of target ids, which the
    target verifies by exact match. Lossless for any drafter tree (``proofs/slem_tree.md``).

    Defaults: ``shape=Static((2, 1, 1))``, ``greedy=False``, ``draws="distinct"``, ``lookbehind=4``,
    ``resync=Resync()`` (as :class:`~hsd_core.methods.SLEM`).
    """

    name = "SLEM-tree"

    def __init__(self, shape: Shape = Static((2, 1, 1)), greedy: bool = False, draws: str = "distinct",
                 lookbehind: int = 4, resync: Resync | None = Resync()) -> None:
        self.shape = check_shape(shape)
        self.greedy = check_greedy(greedy)
        self.draws = check_draws(draws)
        self.lookbehind = check_lookbehind(lookbehind)
        self.resync = as_resync(resync)

    def drafter_tree(self, target: Model, drafter: Model, state: State, rand: Rand) -> TokenTree:
        """Step 2: the tree of drafter ids (at most ``state.budget`` deep)."""
        d_ctx = slem_drafter_context(target, drafter, state, self.resync)

        def law(path: tuple[int, ...]) -> Law | None:
            return drafter.next_probs(d_ctx + path)

        return draft_tree(law, self.shape, rand, self.greedy, self.draws, drafter.vocab.eos_id, state.budget)

    def draft(self, target: Model, drafter: Model | None, state: State, rand: Rand) -> TokenTree:
        """Steps 1-3: the trie of target ids read off the drafter tree's root-to-leaf paths."""
        assert drafter is not None
        dtree = self.drafter_tree(target, drafter, state, rand)
        ctx = state.target_context(target)
        d_eos, eos = drafter.vocab.eos_id, target.vocab.eos_id
        seqs: list[tuple[int, ...]] = []
        for leaf in dtree.leaves():
            path = dtree.path(leaf)
            if not path:
                continue
            try:
                cands = retokenize(target, ctx, drafter.tokenizer.decode(path), self.lookbehind)
            except Unencodable:  # a text the target cannot encode proposes nothing
                continue
            seqs.append(cands + ((eos,) if path[-1] == d_eos else ()))
        return trie(seqs, state.budget)

    def step(self, target: Model, drafter: Model | None, state: State, rand: Rand) -> RoundOutcome:
        tree = self.draft(target, drafter, state, rand)
        return self.verify_match(target, state.target_context(target), tree, rand, state.budget)

    def __repr__(self) -> str:
        return f"SLEMTree({self.shape!r}, greedy={self.greedy}, draws={self.draws!r}, lookbehind={self.lookbehind})"
