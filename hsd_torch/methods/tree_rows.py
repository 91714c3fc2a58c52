"""One row's token tree for :mod:`hsd_torch.methods.tree`: ``hsd_core.methods.tree``'s steps on
one row, over float64 arrays on the host, with ``hsd_core``'s float arithmetic (normalization by the
left-to-right sum, ``inverse_cdf``, ``min(1, r(x)/q(x))``, the residual), so that the reference fed
the same uniforms takes the same decisions: :class:`RowTree`, :func:`draft_tree` (a generator that
asks the engine for the laws it needs, :func:`hsd_torch.engine.tree.tree_draft`), :func:`trie`, and
the verification walks :func:`walk_match` and :func:`walk_rrs` (``hsd_core``'s ``TreeVerifier``)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from hsd_core.methods.tree import Dynamic, Shape, Static

from ..engine.tree_cache import Request

__all__ = ["Arr", "RowTree", "draft_tree", "inverse_cdf", "max_nodes", "normalized", "residual", "trie", "walk_match",
           "walk_rrs", "without"]

Arr = npt.NDArray[np.float64]


# ---------------------------------------------------------------------------------------------
# hsd_core's float arithmetic, on arrays


def total(w: Arr) -> float:
    """``sum(w)`` summed left to right, as Python's ``sum`` over the entries (``hsd_core.laws``)."""
    return float(np.cumsum(w)[-1]) if w.size else 0.0


def normalized(w: Arr) -> Arr | None:
    """``hsd_core.laws.normalized``: ``w / sum(w)``, None when the sum is not positive."""
    t = total(w)
    return None if not t > 0 else w / t


def residual(p: Arr, q: Arr) -> Arr:
    """``hsd_core.laws.residual``: ``norm(max(p - q, 0))``, ``p`` when that has no mass."""
    r = normalized(np.where(p > q, p - q, 0.0))
    return p if r is None else r


def inverse_cdf(probs: Arr, u: float) -> int:
    """``hsd_core.rand.inverse_cdf``: the first index of positive probability whose partial sum
    (left to right) exceeds ``u * total``, else the last index of positive probability."""
    cs = np.cumsum(probs)
    target = u * float(cs[-1])
    i = int(np.searchsorted(cs, target, side="right"))
    if i >= probs.size:
        return int(np.flatnonzero(probs > 0)[-1])
    return i


def without(law: Arr, x: int) -> Arr | None:
    """``law`` with ``x`` removed, renormalized (None without mass): the next distinct draw's law."""
    w = law.copy()
    w[x] = 0.0
    return normalized(w)


# ---------------------------------------------------------------------------------------------
# a row's tree and its drafting


@dataclass
class RowTree:
    """One row's tree (``hsd_core.methods.tree.TokenTree``'s fields, over drafting columns): node 0
    is the root (``tokens[0] == parents[0] == -1``)."""

    tokens: list[int] = field(default_factory=lambda: [-1])
    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    laws: list[Arr | None] = field(default_factory=lambda: [None])

    @property
    def size(self) -> int:
        return len(self.tokens) - 1

    def children(self, v: int) -> list[int]:
        return [c for c in range(v + 1, len(self.tokens)) if self.parents[c] == v]

    def leaves(self) -> list[int]:
        """The nodes without children (the root too when it has none), in node order."""
        has_child = set(self.parents[1:])
        return [v for v in range(len(self.tokens)) if v not in has_child]

    def path(self, v: int) -> list[int]:
        """The nodes from the root's child down to ``v``."""
        out: list[int] = []
        while v > 0:
            out.append(v)
            v = self.parents[v]
        return out[::-1]

    def add(self, parent: int, token: int, law: Arr | None) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.laws.append(law)
        return len(self.tokens) - 1


def max_nodes(shape: Shape, max_depth: int) -> int:
    """The most nodes a tree of ``shape`` at most ``max_depth`` deep can hold (the drafting
    uniforms a row draws per round)."""
    if isinstance(shape, Dynamic):
        return shape.budget
    n, level = 0, 1
    for w in shape.widths[:max_depth]:
        level *= w
        n += level
    return n


def draft_tree(shape: Shape, greedy: bool, draws: str, eos: int, max_depth: int, uniforms: Sequence[float],
               used: list[float]) -> Generator[Request, dict[int, Arr | None], RowTree]:
    """``hsd_core.methods.tree.draft_tree`` for one row, as a generator: it yields the nodes
    ``(node, column, parent)`` whose laws it needs next (all the open nodes that lack one: a
    static tree asks once per depth) and is sent ``{node: law}``; each categorical draw consumes
    the next of ``uniforms`` (appended to ``used``); returns the :class:`RowTree`."""
    tree = RowTree()
    laws: dict[int, Arr | None] = {}
    score: list[float] = [1.0]
    depth_cap = min(max_depth, shape.depth)
    pos = [0]

    def is_open(v: int) -> bool:
        return tree.depths[v] < depth_cap and (v == 0 or tree.tokens[v] != eos)

    def need(v: int, candidates: Sequence[int]) -> Request | None:
        if v in laws:
            return None
        return [(u, tree.tokens[u], tree.parents[u]) for u in candidates if is_open(u) and u not in laws]

    def expand(v: int, n: int) -> None:
        law = laws[v]
        if law is None:
            return
        cur: Arr | None = law
        for _ in range(n):
            if cur is None:
                return
            if greedy:
                x = int(np.argmax(cur))
                if not cur[x] > 0:
                    return
            else:
                u = uniforms[pos[0]]
                pos[0] += 1
                used.append(u)
                x = inverse_cdf(cur, u)
            tree.add(v, x, cur)
            score.append(score[v] * float(law[x]))
            cur = law if (draws == "iid" and not greedy) else without(cur, x)

    if isinstance(shape, Static):
        v = 0
        while v < len(tree.tokens):
            if is_open(v):
                ask = need(v, range(v, len(tree.tokens)))
                if ask is not None:
                    laws.update((yield ask))
                expand(v, shape.widths[tree.depths[v]])
            v += 1
    else:
        expanded: set[int] = set()
        while tree.size < shape.budget:
            open_ = [v for v in range(len(tree.tokens)) if v not in expanded and is_open(v)]
            if not open_:
                break
            v = max(open_, key=lambda w: (score[w], -w))
            ask = need(v, open_)
            if ask is not None:
                laws.update((yield ask))
            expanded.add(v)
            expand(v, min(shape.width, shape.budget - tree.size))
    return tree


# ---------------------------------------------------------------------------------------------
# verification walks (hsd_core's TreeVerifier, on one row)


def _child(tree: RowTree, v: int, t: int) -> int | None:
    for c in tree.children(v):
        if tree.tokens[c] == t:
            return c
    return None


def walk_match(tree: RowTree, p_at: Callable[[int], Arr], uniforms: Sequence[float], budget: int, *, greedy: bool,
               eos: int) -> tuple[list[int], int, list[float], list[int]]:
    """``hsd_core``'s ``TreeVerifier.verify_match``: at the current node the target draws its token
    (argmax when greedy, else one uniform); it is emitted; the round descends into the first child
    with that token, else ends. Returns (emitted columns, accepted, uniforms read, accepted nodes)."""
    out: list[int] = []
    read: list[float] = []
    path: list[int] = []
    v = 0
    while True:
        p = p_at(v)
        if greedy:
            t = int(np.argmax(p))
        else:
            read.append(uniforms[len(read)])
            t = inverse_cdf(p, read[-1])
        out.append(t)
        c = _child(tree, v, t)
        if c is None:
            return out, len(out) - 1, read, path
        path.append(c)
        if t == eos or len(out) >= budget:
            return out, len(out), read, path
        v = c


def walk_rrs(tree: RowTree, p_at: Callable[[int], Arr], uniforms: Sequence[float], budget: int, *,
             eos: int) -> tuple[list[int], int, list[float], list[int]]:
    """``hsd_core``'s ``TreeVerifier.verify_rrs``: at the current node ``r = p``; each child ``c`` in
    drafting order is accepted with probability ``min(1, r(x) / q_c(x))`` (one uniform), else
    ``r <- norm(max(r - q_c, 0))``; when none is accepted a token is drawn from ``r`` (one uniform)
    and the round ends."""
    out: list[int] = []
    read: list[float] = []
    path: list[int] = []
    v = 0
    while True:
        r = p_at(v)
        chosen = None
        for c in tree.children(v):
            x, q = tree.tokens[c], tree.laws[c]
            assert q is not None, "RRS needs the law every child was drawn from"
            read.append(uniforms[len(read)])
            if read[-1] < min(float(r[x]) / float(q[x]), 1.0):
                chosen = c
                break
            r = residual(r, q)
        if chosen is None:
            read.append(uniforms[len(read)])
            out.append(inverse_cdf(r, read[-1]))
            return out, len(out) - 1, read, path
        x = tree.tokens[chosen]
        out.append(x)
        path.append(chosen)
        if x == eos or len(out) >= budget:
            return out, len(out), read, path
        v = chosen


def trie(sequences: Sequence[Sequence[int]], max_depth: int) -> RowTree:
    """``hsd_core.methods.tree.trie``: the trie of ``sequences`` (each cut to ``max_depth``), nodes
    in order of first insertion, no laws."""
    tree = RowTree()
    kids: dict[tuple[int, int], int] = {}
    for seq in sequences:
        v = 0
        for t in list(seq)[:max_depth]:
            c = kids.get((v, int(t)))
            if c is None:
                c = kids[(v, int(t))] = tree.add(v, int(t), None)
            v = c
    return tree
