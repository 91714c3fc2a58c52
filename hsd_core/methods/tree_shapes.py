"""Token trees: what a round drafts (shapes, the tree, drafting, the trie of sequences).

:class:`Static` and :class:`Dynamic` shapes, the :class:`TokenTree` a round drafts (a flat list of
nodes in drafting order, each with its token, parent, depth and the law it was drawn from),
:func:`draft_tree` (a tree of drafts from a law at every node, through :class:`~hsd_core.rand.Rand`)
and :func:`trie` (the trie of SLEM-tree's re-tokenized paths). The glossary and the verification are
:mod:`hsd_core.methods.tree`'s, which re-exports every name here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Union

import numpy as np

from ..laws import Law, Prob, normalized
from ..rand import Rand

__all__ = ["DRAWS", "Dynamic", "Shape", "Static", "TokenTree", "check_draws", "check_shape", "draft_tree", "trie"]


def _check_count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Static:
    """A static tree shape: every node at depth ``d`` (the root has depth 0) gets ``widths[d]``
    children, so the tree has depth ``len(widths)`` and at most ``sum_d prod_{e <= d} widths[e]``
    nodes (fewer when a law has fewer tokens, after EOS, or near the budget). ``Static((k,) * n)`` of
    width 1 is the single path of lookahead ``n``."""

    widths: tuple[int, ...]

    def __post_init__(self) -> None:
        if isinstance(self.widths, (str, bytes)) or not isinstance(self.widths, Sequence) or not self.widths:
            raise ValueError(f"widths must be a non-empty sequence of integers >= 1, got {self.widths!r}")
        object.__setattr__(self, "widths", tuple(_check_count(w, "every width") for w in self.widths))

    @property
    def depth(self) -> int:
        return len(self.widths)


@dataclass(frozen=True)
class Dynamic:
    """A dynamic tree shape: starting from the root, repeatedly expand the unexpanded node of highest
    drafter path probability (the product of the drafter probabilities of its path's tokens, each under
    its parent's law; ties to the earliest node) whose depth is below ``depth``, giving it ``width``
    children (fewer if the budget would be passed), until the tree has ``budget`` nodes or no node can
    be expanded. The path probabilities are the drafter's only: the target is never consulted."""

    budget: int
    width: int
    depth: int

    def __post_init__(self) -> None:
        for name in ("budget", "width", "depth"):
            object.__setattr__(self, name, _check_count(getattr(self, name), name))


Shape = Union[Static, Dynamic]


def check_shape(shape: object) -> Shape:
    """``shape`` if it is a :class:`Static` or :class:`Dynamic`, else ``TypeError``."""
    if not isinstance(shape, (Static, Dynamic)):
        raise TypeError(f"shape must be Static(widths) or Dynamic(budget, width, depth), got {shape!r}")
    return shape


DRAWS = ("iid", "distinct")


def check_draws(draws: object) -> str:
    """``draws`` if it is ``"iid"`` or ``"distinct"``, else ``ValueError``."""
    if draws not in DRAWS:
        raise ValueError(f"draws must be 'iid' or 'distinct', got {draws!r}")
    assert isinstance(draws, str)
    return draws


@dataclass(frozen=True)
class TokenTree:
    """A tree of proposed tokens as a flat node list (see the module glossary). Node 0 is the root:
    ``tokens[0] == parents[0] == -1``, ``depths[0] == 0``, ``laws[0] is None``. Hashable, so the
    exact enumerator can take the law of the tree itself."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    laws: tuple[Law | None, ...]

    @property
    def size(self) -> int:
        """The number of proposed nodes (the root excluded)."""
        return len(self.tokens) - 1

    def children(self, v: int) -> list[int]:
        """The children of node ``v``, in drafting order."""
        return [c for c in range(v + 1, len(self.tokens)) if self.parents[c] == v]

    def path(self, v: int) -> tuple[int, ...]:
        """The tokens from the root's child down to node ``v`` (empty for the root)."""
        out: list[int] = []
        while v > 0:
            out.append(self.tokens[v])
            v = self.parents[v]
        return tuple(reversed(out))

    def leaves(self) -> list[int]:
        """The nodes without children (the root too when it has none), in node order."""
        has_child = set(self.parents[1:])
        return [v for v in range(len(self.tokens)) if v not in has_child]


class _Builder:
    def __init__(self) -> None:
        self.tokens: list[int] = [-1]
        self.parents: list[int] = [-1]
        self.depths: list[int] = [0]
        self.laws: list[Law | None] = [None]

    def add(self, parent: int, token: int, law: Law | None) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.laws.append(law)
        return len(self.tokens) - 1

    def path(self, v: int) -> tuple[int, ...]:
        out: list[int] = []
        while v > 0:
            out.append(self.tokens[v])
            v = self.parents[v]
        return tuple(reversed(out))

    def build(self) -> TokenTree:
        return TokenTree(tuple(self.tokens), tuple(self.parents), tuple(self.depths), tuple(self.laws))


def _without(law: Law, x: int) -> Law | None:
    zero = law[x] - law[x]
    return normalized([zero if i == x else w for i, w in enumerate(law)])


def draft_tree(
    law_at: Callable[[tuple[int, ...]], Law | None],
    shape: Shape,
    rand: Rand,
    greedy: bool,
    draws: str,
    eos_id: int,
    max_depth: int,
    sampling_law: Callable[[tuple[int, ...], Law], Law] | None = None,
) -> TokenTree:
    """Draft a tree of the given ``shape``, at most ``max_depth`` deep (the round's budget).

    ``law_at(path)`` is the law the children of the node with that path are drawn from (``None``: no
    mass, no children). A node of token ``eos_id`` gets no children. Children are drawn as ``draws``
    says (module glossary); greedy drafting takes the most likely remaining token each time and draws
    nothing. ``laws`` records, per node, the law its token was drawn from. ``sampling_law`` exists for
    the deliberately lossy variants only (it replaces the law actually sampled, not the one recorded).
    """
    shape = check_shape(shape)
    draws = check_draws(draws)
    b = _Builder()
    score: list[Prob] = [Fraction(1)]
    depth_cap = min(max_depth, shape.depth)

    def expand(v: int, n: int) -> None:
        path = b.path(v)
        law = law_at(path)
        if law is None:
            return
        cur: Law | None = law
        for _ in range(n):
            if cur is None:
                return
            if greedy:
                x = max(range(len(cur)), key=lambda i: (cur[i], -i))  # type: ignore[index]
                if not cur[x] > 0:
                    return
            else:
                drawn_from = cur if sampling_law is None else sampling_law(path, cur)
                x = rand.categorical(drawn_from)
            b.add(v, x, cur)
            score.append(score[v] * law[x])
            cur = law if (draws == "iid" and not greedy) else _without(cur, x)

    if isinstance(shape, Static):
        v = 0
        while v < len(b.tokens):
            if b.depths[v] < depth_cap and (v == 0 or b.tokens[v] != eos_id):
                expand(v, shape.widths[b.depths[v]])
            v += 1
    else:
        expanded: set[int] = set()
        while len(b.tokens) - 1 < shape.budget:
            open_ = [v for v in range(len(b.tokens)) if v not in expanded and b.depths[v] < depth_cap
                     and (v == 0 or b.tokens[v] != eos_id)]
            if not open_:
                break
            v = max(open_, key=lambda u: (score[u], -u))
            expanded.add(v)
            expand(v, min(shape.width, shape.budget - (len(b.tokens) - 1)))
    return b.build()


def trie(sequences: Sequence[Sequence[int]], max_depth: int) -> TokenTree:
    """The trie of ``sequences`` (each cut to ``max_depth`` ids) as a :class:`TokenTree` with no laws;
    nodes in order of first insertion."""
    b = _Builder()
    kids: dict[tuple[int, int], int] = {}
    for seq in sequences:
        v = 0
        for t in list(seq)[:max_depth]:
            c = kids.get((v, int(t)))
            if c is None:
                c = b.add(v, int(t), None)
                kids[(v, int(t))] = c
            v = c
    return b.build()
