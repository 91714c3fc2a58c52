"""A round of token trees over a batch, the services the tree methods call
(:mod:`hsd_torch.methods.tree`): :func:`tree_draft` runs every row's drafting against the drafter,
one drafter pass per round of requests (a static tree: one per depth), and :func:`tree_verify` runs
one target pass over every row's whole tree, each row's verification walk on the host, and compacts
the caches to the accepted paths (:mod:`hsd_torch.engine.tree_cache`: the tree mask, the position ids
and the compaction)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from .laws import space_law
from .round_state import EngineState, Verdicts
from .runner import window_view
from .tree_cache import HostLaw, Request, RowDrafting, TreeCache, Walk

__all__ = ["host_laws", "tree_draft", "tree_verify"]


def host_laws(law: Tensor, where: str) -> list[npt.NDArray[np.float64] | None]:
    """The rows of ``law [n, N]`` as float64 arrays on the host, None for a row without mass;
    ``ValueError`` for a NaN or infinite entry (``where`` names the model)."""
    arr = law.detach().to(torch.float64).cpu().numpy()
    if arr.shape[0] == 0:
        return []
    tot = np.cumsum(arr, axis=-1)[:, -1] if arr.shape[1] else np.zeros(arr.shape[0])
    if not bool(np.isfinite(tot).all()) or bool((arr < 0).any()):
        raise ValueError(f"the {where}'s law has NaN, infinite or negative entries (NaN or infinite logits?): "
                         "generation cannot go on")
    return [arr[k] if tot[k] > 0 else None for k in range(arr.shape[0])]


def tree_draft(gen: EngineState, active: Sequence[bool], contexts: Sequence[Sequence[int] | None],
               rows: Sequence[RowDrafting | None], law: Callable[[Tensor], Tensor],
               token_of: Callable[[int], int], depth: Sequence[int], host: HostLaw | None = None
               ) -> tuple[list[Any], TreeCache]:
    """Run every active row's drafting (``rows[i]``) against the drafter, one drafter pass per
    round of requests (a static tree: one per depth): the first pass feeds each row's drafter
    context ``contexts[i]`` (what its cache lacks of it) and reads the root's law; each later pass
    feeds the nodes the rows asked for (``token_of(column)``: the drafter id of a drafting column)
    under the tree mask. ``law(logits [n, V]) -> [n, N]``: the law over the drafting columns, made a
    float64 host array per node and, with ``host``, mapped by it (None: no mass).
    A context that would not leave room for ``depth[i]`` more positions is seen through the
    drafter's window (:func:`hsd_torch.engine.runner.window_view`, with that room kept).
    Returns each row's tree (None for inactive rows) and the drafter's :class:`TreeCache`."""
    drun = gen.drun
    assert drun is not None
    tc = TreeCache(drun)
    trees: list[Any] = [None] * gen.batch
    req: list[Request | None] = [None] * gen.batch
    for i in range(gen.batch):
        r = rows[i]
        if active[i] and r is not None:
            req[i] = next(r)
    first = True
    while any(q is not None for q in req):
        pending: list[list[int]] = [[] for _ in range(gen.batch)]
        nodes: list[list[tuple[int, int, int]]] = [[] for _ in range(gen.batch)]
        for i, q in enumerate(req):
            if q is None:
                continue
            if first:
                ctx = list(contexts[i] or [])
                if drun.max_pos is not None and len(ctx) + depth[i] > drun.max_pos:
                    ctx = window_view(ctx, drun.n_prefix[i], drun.max_pos - depth[i])
                pending[i] = drun.sync(i, ctx)
            nodes[i] = [(v, token_of(c), p) for v, c, p in q if v != 0]
        first = False
        logits, at, _ = tc.feed(pending, nodes)
        asked = [(i, v) for i, q in enumerate(req) if q is not None for v, _, _ in q]
        flat = host_laws(law(logits[[i for i, _ in asked], [at[i][v] for i, v in asked]]), "drafter")
        if host is not None:
            flat = [None if x is None else host(x) for x in flat]
        got_of = dict(zip(asked, flat))
        for i, q in enumerate(req):
            if q is None:
                continue
            want = [v for v, _, _ in q]
            got = [got_of[i, v] for v in want]
            r = rows[i]
            assert r is not None
            try:
                req[i] = r.send(dict(zip(want, got)))
            except StopIteration as stop:
                trees[i] = stop.value
                req[i] = None
    return trees, tc


def tree_verify(gen: EngineState, active: list[bool], budget: list[int], trees: Sequence[Any], walk: Walk,
                draft_cache: TreeCache | None) -> Verdicts:
    """One target pass over every active row's pending context and all its tree's nodes (tree mask,
    position ids context length + depth - 1), the row's walk on the host over the target's laws
    at its nodes (its uniforms: ``tree.size + 1`` fresh ones of its stream, a prefix read), then the
    target's cache (and the drafter's, ``draft_cache``, for the nodes it was fed) compacted to the
    accepted path. ``trees[i]`` has ``tokens``/``parents``/``size`` over target columns."""
    if gen.processors or gen.min_new_tokens:
        raise ValueError("token trees do not take logits processors or min_new_tokens (each node has its own "
                         "context): generate without a tree for them")
    trun, t_space = gen.trun, gen.t_space
    tc = TreeCache(trun)
    pend = [trun.sync(i, gen.t_ctx[i]) if active[i] else [] for i in range(gen.batch)]
    nodes = [[(v, t_space.ids[trees[i].tokens[v]], trees[i].parents[v]) for v in range(1, trees[i].size + 1)]
             if active[i] else [] for i in range(gen.batch)]
    want_hidden = gen.near is not None and trun.want_hidden
    logits, at, hidden = tc.feed(pend, nodes, want_hidden)
    if gen.near is not None and hidden is not None:  # greedy, reduced precision: near ties in float32
        logits = logits.float()
        for i in range(gen.batch):  # at each row's root and nodes only (not its context ids nor padding)
            if active[i]:
                sel = torch.tensor([at[i][v] for v in sorted(at[i])], dtype=torch.long, device=logits.device)
                fixed, checked, flips = gen.near.apply(logits[i:i + 1, sel], hidden[i:i + 1, sel])
                logits[i, sel] = fixed[0]
                gen.near_ties[i] += checked[0]
                gen.tie_flips[i] += flips[0]
    process = gen.process.args()
    u = gen.drafting_uniforms([trees[i].size + 1 if active[i] else 0 for i in range(gen.batch)])
    emitted: list[list[int]] = [[] for _ in range(gen.batch)]
    accepted = [0] * gen.batch
    read: list[list[float]] = [[] for _ in range(gen.batch)]
    cells = [(i, v) for i in range(gen.batch) if active[i] for v in sorted(at[i])]
    laws = host_laws(space_law(logits[[i for i, _ in cells], [at[i][v] for i, v in cells]], t_space, gen.t_drop,
                               *process), "target")  # every node's law: one processing, one copy to the host
    law_of = dict(zip(cells, laws))
    for i in range(gen.batch):
        if not active[i]:
            continue

        def p_at(v: int, i: int = i) -> npt.NDArray[np.float64]:
            got = law_of[i, v]
            if got is None:
                raise ValueError(f"the target's law at row {i} has no mass: generation cannot go on")
            return got

        emitted[i], accepted[i], read[i], path = walk(trees[i], p_at, u[i], max(budget[i], 1))
        tc.compact(i, path)
        if draft_cache is not None:
            draft_cache.compact(i, path)
    return Verdicts(emitted, accepted, read)
