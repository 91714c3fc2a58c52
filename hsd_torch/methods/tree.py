"""Token trees over a batch: SD-tree (``hsd_core.methods.tree``'s :class:`~hsd_core.methods.tree.SDTree`).

The same glossary and steps as ``hsd_core/methods/tree.py`` (read it first), over Hugging Face
models: a round drafts a tree per row with one drafter pass per depth (a dynamic shape: one per
round of expansions whose nodes lack a law), then verifies every row's whole tree in **one**
target pass (a tree attention mask and position ids ``context length + depth - 1``), and compacts
both models' KV caches to the accepted path (:mod:`hsd_torch.engine.tree`: the accepted nodes' keys
and values are moved next to the context; nothing is fed again but the round's last token).

Glossary (as ``hsd_core``'s)
    tree        :class:`RowTree`: a flat node list in drafting order, node 0 the root (the row's
                context); ``tokens`` are drafting columns (SD: the target's columns).
    shape       ``hsd_core.methods.tree.Static`` / ``Dynamic``.
    draws       ``"iid"`` or ``"distinct"`` (without replacement); greedy takes the ``width`` most
                likely tokens.
    exact match / recursive rejection sampling (RRS)   as ``hsd_core``'s verifier.

Steps of one round (SD-tree)
    1. Drafter context: its ids of the prompt + the emitted ids (as SD).
    2. Draft the tree (:func:`draft_tree`, the steps of ``hsd_core.methods.tree.draft_tree``), at most
       ``budget`` deep; a node's law is the drafter's processed law after its path.
    3. One target pass over the tree; verify on the host (:func:`walk_rrs` when sampling,
       :func:`walk_match` when greedy or with ``verification="match"``).
    4. Compact the caches to the accepted path; the drafter's context is extended by the emitted ids.

Arithmetic. Laws are float64 arrays on the host and every operation is ``hsd_core``'s on floats
(normalization by the left-to-right sum, ``inverse_cdf``, ``min(1, r(x)/q(x))``, the residual), so
that fed the uniforms recorded here, ``hsd_core``'s method over the same models
(:class:`hsd_torch.CoreModel`) emits the same tokens. Uniforms: a row draws, per round, one
uniform per node its shape can hold at the start of drafting and ``size + 1`` before verifying, and
consumes them in ``hsd_core``'s order ("The uniforms a round consumes" in ``hsd_core.methods.tree``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from torch import Tensor

from hsd_core.methods.resync import Resync
from hsd_core.methods.tree import DRAWS, VERIFICATIONS, Dynamic, Shape, Static, check_draws, check_shape

from ..engine.laws import TextSpace, space_law
from ..engine.round_state import Drafts, RoundView, Verdicts
from ..engine.tree import HostLaw, Request, RowDrafting, TreeCache, Walk
from ..vocab.text import Unencodable
from .base import Method
from .sd import SD
from .slem import retokenize
from .tli import resync_ids

__all__ = ["RowTree", "SDTree", "SLEMTree", "TLITree", "TreeDrafts", "TreeMethod", "draft_tree", "max_nodes",
           "trie", "walk_match", "walk_rrs"]

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


# ---------------------------------------------------------------------------------------------
# the methods


@dataclass
class TreeDrafts(Drafts):
    """:class:`Drafts` of a tree round: ``trees[i]`` row ``i``'s tree (None: inactive) and the
    drafter's :class:`TreeCache` (compacted with the target's)."""

    trees: list[RowTree | None] = field(default_factory=list)
    cache: TreeCache | None = None


class TreeMethod(Method):
    """What the tree methods share: the shape, draws and verification options (checked as
    ``hsd_core``'s), the per-row uniforms, the drafting loop and the verification walk. A method
    says what it drafts over (:meth:`drafting`) and from which drafter context (:meth:`contexts`)."""

    extends_drafter_context = True

    def __init__(self, shape: Shape = Static((2, 1, 1)), draws: str = "distinct", verification: str = "rrs") -> None:
        self.shape = check_shape(shape)
        super().__init__(lookahead=self.shape.depth)
        self.draws = check_draws(draws)
        if verification not in VERIFICATIONS:
            raise ValueError(f"verification must be 'rrs' or 'match', got {verification!r}")
        self.verification = verification

    def depth_of(self, budget: int) -> int:
        return min(self.shape.depth, budget)

    def drafting(self, view: RoundView) -> tuple[Callable[[Tensor], Tensor], HostLaw | None, Callable[[int], int], int]:
        """``(law, host, token_of, eos)``: the law over the drafting columns from the drafter's
        logits, its last step on the host (or None), the drafter id of a drafting column, and the
        EOS column (a node of that token gets no children)."""
        raise NotImplementedError

    def contexts(self, view: RoundView, active: list[bool]) -> list[Sequence[int] | None]:
        """Each active row's drafter context (its ``d_ctx``, kept across rounds by the re-sync)."""
        return [view.d_ctx[i] if active[i] else None for i in range(view.batch)]

    def walk(self, view: RoundView, eos: int) -> Walk:
        """The row's verification (greedy or ``"match"``: exact match; else RRS)."""
        greedy = view.greedy
        if greedy or self.verification == "match":
            return lambda tree, p_at, u, budget: walk_match(tree, p_at, u, budget, greedy=greedy, eos=eos)
        return lambda tree, p_at, u, budget: walk_rrs(tree, p_at, u, budget, eos=eos)

    def draft_trees(self, view: RoundView, active: list[bool], budget: list[int]
                    ) -> tuple[list[RowTree | None], TreeCache]:
        """Every active row's tree over the drafting columns (one drafter pass per depth), its
        drafting uniforms recorded in the order it consumed them."""
        law, host, token_of, eos = self.drafting(view)
        k = [max_nodes(self.shape, self.depth_of(b)) if a else 0 for a, b in zip(active, budget)]
        uni = view.drafting_uniforms(k)
        used: list[list[float]] = [[] for _ in range(view.batch)]
        gens: list[RowDrafting | None] = [
            draft_tree(self.shape, view.greedy, self.draws, eos, b, uni[i], used[i]) if active[i] else None
            for i, b in enumerate(budget)]
        trees, cache = view.tree_draft(active, self.contexts(view, active), gens, law, token_of,
                                       [self.depth_of(b) for b in budget], host)
        for i in range(view.batch):
            if used[i]:
                view.record(i, used[i])
        return trees, cache

    def draft(self, view: RoundView, active: list[bool], budget: list[int]) -> Drafts:
        """Steps 1-2 for every active row."""
        trees, cache = self.draft_trees(view, active, budget)
        return tree_drafts(view, trees, cache)

    def verify(self, view: RoundView, active: list[bool], budget: list[int], drafts: Drafts) -> Verdicts:
        """Step 3 (one target pass over every row's tree) and the compaction of both caches."""
        assert isinstance(drafts, TreeDrafts)
        return view.tree_verify(active, budget, drafts.trees, self.walk(view, view.t_space.n - 1), drafts.cache)


def tree_drafts(view: RoundView, trees: list[RowTree | None], cache: TreeCache | None) -> TreeDrafts:
    """The round's :class:`TreeDrafts` (``n[i]``: row ``i``'s node count, its proposals)."""
    d = Drafts.empty(view.batch)
    return TreeDrafts(n=[0 if t is None else t.size for t in trees], cols=d.cols, laws=[], mass=d.mass, q_steps=[],
                      trees=trees, cache=cache)


class SDTree(TreeMethod):
    """SD over a token tree (``hsd_core.methods.tree.SDTree``): drafter and target share one
    tokenizer; the drafter drafts over the target's columns (as :class:`~hsd_torch.methods.sd.SD`),
    a node's law being its processed law after the node's path."""

    name = "sd"

    def drafter_space(self, view: RoundView, space: TextSpace) -> TextSpace:
        """As SD's: the drafter drafts over the target's columns."""
        return SD.drafter_space(self, view, space)  # type: ignore[arg-type]

    def drafting(self, view: RoundView) -> tuple[Callable[[Tensor], Tensor], HostLaw | None, Callable[[int], int], int]:
        space, drop, process = view.d_space, view.d_drop, view.d_process.args()
        assert space is not None and drop is not None
        return (lambda lg: space_law(lg, space, drop, *process)), None, (lambda c: space.ids[c]), space.n - 1

    def resync(self, view: RoundView, i: int, out: list[int]) -> Sequence[int]:
        """The drafter's context takes the emitted ids as they are."""
        return out


class TLITree(TreeMethod):
    """TLI over a token tree (``hsd_core.methods.tree.TLITree``): a node's children are drawn from
    q_cap (the drafter's processed law after the node's path, restricted to the intersection and
    renormalized) pushed to the target's columns; the path's target ids are fed to the drafter as
    the drafter id with each one's string (the bridge's ``to_drafter``). The drafter's context is
    TLI's (:meth:`hsd_torch.methods.tli.TLI.resync`)."""

    name = "tli"

    def setup(self, view: RoundView) -> None:
        """The intersection's drafter columns, their target columns, and TLI's re-sync memo."""
        assert view.bridge is not None and view.d_space is not None
        to_t, t_pos = view.bridge.to_target_list, view.t_space.pos
        self.inter = np.array([c for c, d in enumerate(view.d_space.ids) if to_t[d] >= 0], dtype=np.int64)
        self.dst = np.array([t_pos[to_t[view.d_space.ids[c]]] for c in self.inter], dtype=np.int64)
        self.resync_memo: dict[int, list[int]] = {}

    def drafting(self, view: RoundView) -> tuple[Callable[[Tensor], Tensor], HostLaw | None, Callable[[int], int], int]:
        space, drop, process = view.d_space, view.d_drop, view.d_process.args()
        assert space is not None and drop is not None and view.bridge is not None
        to_d, t_ids, n_t, inter, dst = view.bridge.to_drafter_list, view.t_space.ids, view.t_space.n, self.inter, self.dst

        def push(q: Arr) -> Arr | None:  # hsd_core's Intersection.restrict, then .push
            cap = normalized(q[inter])  # the entries outside it are 0: the same left-to-right sum
            if cap is None:
                return None
            out = np.zeros(n_t)
            np.add.at(out, dst, cap)  # ascending drafter column within one target column
            return out

        return (lambda lg: space_law(lg, space, drop, *process)), push, (lambda c: to_d[t_ids[c]]), n_t - 1

    def resync(self, view: RoundView, i: int, out: list[int]) -> Sequence[int]:
        """TLI's: each emitted target id becomes the drafter id with its string, else the drafter's
        encoding of its text."""
        assert view.bridge is not None and view.dt is not None
        grown: list[int] = []
        for t in out:
            grown.extend(resync_ids(t, view.bridge.to_drafter_list, view.tt, view.dt, self.resync_memo))
        return grown


class SLEMTree(TreeMethod):
    """SLEM over a tree of drafter paths (``hsd_core.methods.tree.SLEMTree``): the drafter drafts a
    tree of its own ids from SLEM's context (re-synced from the text every round); every root-to-leaf
    path is decoded and re-tokenized for the target (look-behind ``lookbehind``; the target's EOS
    appended after a drafter EOS; a text the target cannot encode proposes nothing); the candidate
    sequences form a trie of target columns (cut at the budget), verified by exact match. The
    drafter's cache is not compacted (its tree is not the target's): its tree columns are forgotten."""

    name = "slem"
    extends_drafter_context = False

    def __init__(self, shape: Shape = Static((2, 1, 1)), draws: str = "distinct", lookbehind: int = 4,
                 resync: Resync = Resync()) -> None:
        super().__init__(shape, draws, "match")
        self.lookbehind, self.text_resync = lookbehind, resync

    def drafting(self, view: RoundView) -> tuple[Callable[[Tensor], Tensor], HostLaw | None, Callable[[int], int], int]:
        space, drop, process = view.d_space, view.d_drop, view.d_process.args()
        assert space is not None and drop is not None
        return (lambda lg: space_law(lg, space, drop, *process)), None, (lambda c: space.ids[c]), space.n - 1

    def draft(self, view: RoundView, active: list[bool], budget: list[int]) -> Drafts:
        """Steps 1-3: the drafter tree, then each row's trie of re-tokenized paths."""
        assert view.dt is not None and view.d_space is not None
        view.drafter_context_from_text(active, self.text_resync)
        dtrees, _ = self.draft_trees(view, active, budget)
        tt, dt, d_ids, t_pos = view.tt, view.dt, view.d_space.ids, view.t_space.pos
        d_eos = view.d_space.n - 1
        tries: list[RowTree | None] = [None] * view.batch
        for i in range(view.batch):
            dtree = dtrees[i]
            if not active[i] or dtree is None:
                continue
            ctx = view.t_ctx[i][len(view.t_first[i]):]
            seqs: list[list[int]] = []
            for leaf in dtree.leaves():
                path = dtree.path(leaf)
                if not path:
                    continue
                toks = [dtree.tokens[v] for v in path]
                try:
                    cands = retokenize(tt, ctx, dt.decode([d_ids[c] for c in toks]), self.lookbehind)
                except Unencodable:  # a text the target cannot encode proposes nothing
                    continue
                seqs.append([t_pos[t] for t in cands] + ([view.t_space.n - 1] if toks[-1] == d_eos else []))
            tries[i] = trie(seqs, budget[i])
        return tree_drafts(view, tries, None)

    def walk(self, view: RoundView, eos: int) -> Walk:
        """Exact match, always."""
        greedy = view.greedy
        return lambda tree, p_at, u, budget: walk_match(tree, p_at, u, budget, greedy=greedy, eos=eos)


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


__all__ += ["DRAWS", "Dynamic", "Static"]
