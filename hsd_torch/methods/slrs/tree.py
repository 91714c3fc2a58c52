"""The drafter passes of bounded SLRS's draft tree (:class:`TreeCache`): every expanded node of a
level, over every row, in one batched forward pass, on a copy of the rows' KV caches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ...engine.runner import new_cache, window_view

__all__ = ["TreeCache"]


class TreeCache:
    """Drafter contexts of the draft tree, one batched forward pass per level, on a copy of the
    rows' KV caches (a :class:`hsd_torch.engine.runner.Runner`'s, never modified).

    ``rows``: the batch rows (indices of ``runner``) whose root context the runner just fed;
    ``contexts[r]``: the full context of ``rows[r]`` (for rows that would outgrow the drafter's
    positions: their nodes are run without the cache, on the backend's sliding window of the full
    context, exactly as the mirror's ``CoreModel(window=True)``)."""

    def __init__(self, runner: Any, rows: Sequence[int], contexts: Sequence[Sequence[int]], depth: int) -> None:
        self.runner = runner
        self.rows = list(rows)
        self.contexts = [list(c) for c in contexts]
        dev = runner.device
        self.device = dev
        self.slots = torch.tensor([runner.slot(i) for i in self.rows], dtype=torch.long, device=dev)
        self.base = torch.tensor([len(runner.ids[i]) for i in self.rows], dtype=torch.long, device=dev)
        mp = runner.max_pos
        self.direct = [mp is not None and len(c) + depth - 1 > mp for c in self.contexts]
        self.cache: Any = None
        self.mask: Tensor | None = None
        self.pos: Tensor | None = None
        self.kv_pos: Tensor | None = None  # each column's position, with a runner's columns.positions
        self.paths: list[list[int]] = []  # per node of the last level: its drafted ids
        self.node_row: list[int] = []

    def extend(self, parent: Tensor, tokens: Tensor, node_row: Tensor) -> Tensor:
        """The next level: node ``i`` is node ``parent[i]`` of the last level (a row index into
        ``rows`` at the first call) followed by drafter id ``tokens[i]``; ``node_row[i]`` its row
        index. Returns the logits ``[N, V]`` after each new node's context."""
        runner = self.runner
        par = parent.tolist()
        tok = tokens.tolist()
        rws = node_row.tolist()
        if self.cache is None:
            paths = [[t] for t in tok]
        else:
            paths = [self.paths[p] + [t] for p, t in zip(par, tok)]
        direct = [self.direct[r] for r in rws]
        cached = [i for i, d in enumerate(direct) if not d]
        out: Tensor | None = None
        n = len(tok)
        if cached:
            cidx = torch.tensor(cached, dtype=torch.long, device=self.device)
            pc = parent.index_select(0, cidx)
            if self.cache is None:
                src = runner.cache
                sel = self.slots.index_select(0, pc)
                mask = runner.columns.mask.index_select(0, sel)
                pos = self.base.index_select(0, pc)
                kv_pos = runner.columns.kv_pos.index_select(0, sel) if runner.columns.positions else None
                cache = new_cache(runner.model)[0]
                for li, layer in enumerate(src.layers):
                    cache.layers[li].update(
                        layer.keys.index_select(0, sel), layer.values.index_select(0, sel))
            else:
                assert self.mask is not None and self.pos is not None
                # parents index the last level's nodes; only cached ones sit in the cache
                where = self._cached_index.index_select(0, pc)
                cache = self.cache
                cache.batch_select_indices(where)
                mask = self.mask.index_select(0, where)
                pos = self.pos.index_select(0, where)
                kv_pos = self.kv_pos.index_select(0, where) if self.kv_pos is not None else None
            mask = torch.cat([mask, torch.ones(len(cached), 1, dtype=mask.dtype, device=self.device)], dim=1)
            am: Any = mask
            if kv_pos is not None:  # sliding-window layers in a batch: windows over each row's positions
                kv_pos = torch.cat([kv_pos, pos.unsqueeze(1)], dim=1)
                am = runner.columns.masks_for(mask, kv_pos, pos.unsqueeze(1), mask.shape[1] - 1)
            res = runner.model(input_ids=tokens.index_select(0, cidx).unsqueeze(1), attention_mask=am,
                               position_ids=pos.unsqueeze(1), use_cache=True, **{runner._cache_kw: cache})
            logits: Tensor = res.logits[:, -1]
            out = logits.new_zeros((n, logits.shape[-1]))
            out[cidx] = logits
            self.cache, self.mask, self.pos, self.kv_pos = cache, mask, pos + 1, kv_pos
        ci = torch.full((n,), -1, dtype=torch.long, device=self.device)
        if cached:
            ci[torch.tensor(cached, dtype=torch.long, device=self.device)] = torch.arange(len(cached), device=self.device)
        self._cached_index = ci
        for i, d in enumerate(direct):
            if not d:
                continue
            r = rws[i]
            full = window_view(self.contexts[r] + paths[i], runner.n_prefix[self.rows[r]], runner.max_pos)
            lg: Tensor = runner.model(input_ids=torch.tensor([full], dtype=torch.long, device=self.device)).logits[0, -1]
            if out is None:
                out = lg.new_zeros((n, lg.shape[-1]))
            out[i] = lg
        for r in set(rws):
            i = self.rows[r]
            runner.calls[i] += 1
        for r in rws:
            runner.positions[self.rows[r]] += 1
        self.paths = paths
        assert out is not None
        return out

    _cached_index: Tensor
