"""Token trees over a batch: SD-tree, TLI-tree and SLEM-tree (``hsd_core.methods.tree``'s
:class:`~hsd_core.methods.tree.SDTree`, :class:`~hsd_core.methods.tree.TLITree`,
:class:`~hsd_core.methods.tree.SLEMTree`), through ``generate(method="sd"|"tli"|"slem", tree=shape)``.

The same glossary and steps as ``hsd_core/methods/tree.py`` (read it first), over Hugging Face
models: a round drafts a tree per row with one drafter pass per depth (a dynamic shape: one per
round of expansions whose nodes lack a law), then verifies every row's whole tree in **one**
target pass (a tree attention mask and position ids ``context length + depth - 1``), and compacts
the KV caches to the accepted path (:mod:`hsd_torch.engine.tree_cache`: the accepted nodes' keys and
values are moved next to the context; nothing is fed again but the round's last token). SD-tree and
TLI-tree compact the drafter's cache too (its tree has the target tree's nodes); SLEM-tree's drafter
tree is another tree, whose columns are forgotten.

Glossary (as ``hsd_core``'s)
    tree        :class:`~hsd_torch.methods.tree_rows.RowTree`: a flat node list in drafting order,
                node 0 the root (the row's context); its tokens are target columns (SLEM-tree's
                drafter tree: drafter columns).
    shape       ``hsd_core.methods.tree.Static`` / ``Dynamic``.
    draws       ``"iid"`` or ``"distinct"`` (without replacement); greedy takes the ``width`` most
                likely tokens.
    exact match / recursive rejection sampling (RRS)   as ``hsd_core``'s verifier.

Steps of one round (SD-tree, TLI-tree)
    1. Drafter context: SD's (its ids of the prompt + the emitted ids) or TLI's (the emitted ids
       re-synced to drafter ids).
    2. Draft the tree (:func:`~hsd_torch.methods.tree_rows.draft_tree`, at most ``budget`` deep); a
       node's law: the drafter's processed law after the node's path (SD), or q_cap pushed to the
       target's columns (TLI; the path fed to the drafter as the drafter id with each token's string).
    3. One target pass over the tree; verify on the host (RRS when sampling, exact match when greedy
       or with ``verification="match"``).
    4. Compact both caches to the accepted path; the drafter's context grows by the emitted ids.
Steps of one round (SLEM-tree)
    1. Drafter context: SLEM's (re-synced from the text every round).
    2. Draft a tree of drafter ids; 3. re-tokenize every root-to-leaf path for the target into a trie
    of target columns (cut at the budget); 4. one target pass, exact match, target cache compacted.

Arithmetic and uniforms: :mod:`hsd_torch.methods.tree_rows` (``hsd_core``'s float operations on
host arrays, so that fed the uniforms recorded here ``hsd_core``'s method over the same models,
:class:`hsd_torch.CoreModel`, emits the same tokens). A row draws, per round, one uniform per node its
shape can hold at the start of drafting and ``size + 1`` before verifying, and consumes them in
``hsd_core``'s order ("The uniforms a round consumes" in ``hsd_core.methods.tree``).

Not taken with a tree: logits processors and ``min_new_tokens`` (each node has its own context),
``ValueError`` at the first round; a model whose attention reads no explicit 4D mask
(:func:`hsd_torch.engine.tree_cache.check_tree_model`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from torch import Tensor

from hsd_core.methods.resync import Resync
from hsd_core.methods.tree import DRAWS, VERIFICATIONS, Dynamic, Shape, Static, check_draws, check_shape

from ..engine.laws import TextSpace, space_law
from ..engine.round_state import Drafts, RoundView, Verdicts
from ..engine.tree_cache import HostLaw, RowDrafting, TreeCache, Walk
from ..vocab.text import Unencodable
from .base import Method
from .sd import SD
from .slem import retokenize
from .tli import resync_ids
from .tree_rows import Arr, RowTree, draft_tree, max_nodes, normalized, trie, walk_match, walk_rrs

__all__ = ["DRAWS", "Dynamic", "SDTree", "SLEMTree", "Static", "TLITree", "TreeDrafts", "TreeMethod"]

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
        to_d, t_ids, n_t = view.bridge.to_drafter_list, view.t_space.ids, view.t_space.n
        inter, dst = self.inter, self.dst

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


