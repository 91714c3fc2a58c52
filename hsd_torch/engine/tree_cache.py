"""Token trees in a model's batched KV cache (:class:`TreeCache`): one forward pass over many
candidate continuations at once, and the cache compacted to the accepted path afterwards.

A round's tree lives in the cache of a :class:`hsd_torch.engine.runner.Runner` next to the rows'
contexts. Node 0 of a row's tree is its *root*: the last id of its context (the root's logits are
the law after the context). Every other node has a token and a parent node; a feed
(:meth:`TreeCache.feed`) runs the model once over, per row, the ids its cache still lacks of its
context (fed as usual, causally) followed by any number of nodes (their parents fed before them,
in an earlier feed or earlier in the same block). Each node:

* sits in a cache column of its row that the row does **not** keep (its attention-mask column is 0
  in the runner's own bookkeeping, :class:`hsd_torch.engine._columns.Columns`), so no later forward of
  the runner ever sees it unless it is compacted;
* has position id ``position(parent) + 1``: a node at depth ``d`` below a root at position ``L - 1``
  (a context of ``L`` ids) has position ``L + d - 1``, the position its token would have on the
  path alone;
* attends to exactly what its path would attend to alone: the columns its row keeps (its context)
  and the columns of its ancestors and of itself, never a sibling or a cousin (the *tree mask*,
  a 4D mask ``[rows, 1, q, columns]``); on a model's sliding-window layers (Gemma's) also only the
  keys whose position is within the window of its own (positions, not columns: the tree's columns
  are not its positions).

:meth:`TreeCache.compact` then keeps, for a row, the nodes of one root-to-node path: their keys and
values are moved (one gather per layer) into the row's columns right after its context, in path
order, and recorded as the row's ids: the cache then holds what feeding the path's tokens one by
one would have left, and every other node is forgotten (its column stays masked out; trailing
columns no row keeps are cropped by :meth:`hsd_torch.engine.runner.Runner.trim`). A batch of one
row, which runs without an attention mask between rounds, is left with no hole: its columns after
the path are cropped by the same trim, which the round loop runs when a round settles.

The masks are passed as the model's ``attention_mask`` (transformers uses a 4D mask as it is):
boolean (True: attend) for ``attn_implementation="sdpa"``, additive (0 or the dtype's minimum) for
``"eager"``; a model with sliding-window layers gets a mapping per layer type (Gemma's forward
takes one). Other attention implementations, and sliding-window models whose forward takes no
mapping, are refused (:func:`check_tree_model`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor

from ._columns import _check_layer_masks
from .runner import Runner, _scatter_live

__all__ = ["HostLaw", "Request", "RowDrafting", "TreeCache", "Walk", "check_tree_model", "tree_masks"]

ZOO_SEAMS = ("TreeCache._visible", "TreeCache._node_position", "TreeCache._move")
"""What a variant of the bug zoo may replace here (:func:`hsd_torch.auditing.variants.patch_seam`): the
columns a node attends to (siblings seeing each other), a node's position id (off by one), and the
compaction of a row's cache to its accepted path (a cache not compacted)."""

Request = list[tuple[int, int, int]]
"""What a row's drafting asks for: the nodes ``(node, column, parent)`` whose laws it needs
(``(0, -1, -1)``: the root's; ``column`` is a drafting column, mapped to the model's id by the caller's
``token_of``)."""

RowDrafting = Generator[Request, dict[int, npt.NDArray[np.float64] | None], Any]
"""A row's drafting as a generator (:func:`hsd_torch.methods.tree.draft_tree`): it yields the
nodes whose laws it needs, is sent ``{node: law or None}`` (None: no mass), and returns its tree."""


HostLaw = Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64] | None]
"""A drafting law's last step on the host (TLI-tree: q_cap restricted, renormalized and pushed to the
target's columns; None: no mass)."""

Walk = Callable[[Any, Callable[[int], npt.NDArray[np.float64]], list[float], int],
                tuple[list[int], int, list[float], list[int]]]
"""A row's verification walk (:mod:`hsd_torch.methods.tree`): ``walk(tree, p_at, uniforms, budget)``
with ``p_at(node)`` the target's law at a node, returns ``(emitted columns, accepted, uniforms read,
accepted path nodes)``."""



def _impl(model: Any) -> str:
    config = model.config.get_text_config(decoder=True)
    return str(getattr(config, "_attn_implementation", None))


def _sliding(model: Any) -> int | None:
    """The model's sliding window when it has sliding-window layers, else None."""
    config = model.config.get_text_config(decoder=True)
    types = set(getattr(config, "layer_types", None) or ())
    w = getattr(config, "sliding_window", None)
    return w if isinstance(w, int) and "sliding_attention" in types else None


def check_tree_model(model: Any, name: str) -> None:
    """``ValueError`` unless a tree mask can be passed to ``model``: its attention implementation
    reads an explicit 4D mask (``"sdpa"`` or ``"eager"``), and a model with sliding-window layers
    takes masks per layer type (:func:`hsd_torch.engine._columns._check_layer_masks`)."""
    impl = _impl(model)
    if impl not in ("sdpa", "eager"):
        raise ValueError(f"token trees need the {name} to read an explicit 4D attention mask: load it with "
                         f"attn_implementation='sdpa' or 'eager' (it has {impl!r})")
    if _sliding(model) is not None:
        _check_layer_masks(model, name)


def tree_masks(see: Tensor, kv_pos: Tensor | None, q_pos: Tensor, window: int | None, impl: str,
               dtype: torch.dtype) -> Tensor | dict[str, Tensor]:
    """The attention mask(s) of a tree feed from the visibility ``see [rows, q, columns]`` (bool:
    query ``j`` of a row may attend to that column): ``[rows, 1, q, columns]``, boolean for ``"sdpa"``,
    additive of ``dtype`` for ``"eager"``; with a sliding ``window`` a mapping per layer type,
    the sliding layers' mask also requiring ``kv_pos [rows, columns] > q_pos [rows, q] - window``
    (a query's own column always kept, so no row of a mask is empty)."""
    masks = {"full_attention": see}
    if window is not None:
        assert kv_pos is not None
        own = see & (kv_pos[:, None, :] == q_pos[:, :, None])
        masks["sliding_attention"] = (see & (kv_pos[:, None, :] > q_pos[:, :, None] - window)) | own
    if impl == "eager":
        low = torch.finfo(dtype).min
        out = {k: torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, low).unsqueeze(1)
               for k, m in masks.items()}
    else:
        out = {k: m.unsqueeze(1) for k, m in masks.items()}
    return out if window is not None else out["full_attention"]


class TreeCache:
    """One round's token trees in ``runner``'s cache (module docstring): per row, each fed node's
    cache column and position id, and its ancestors' columns. :meth:`feed` runs the model;
    :meth:`compact` keeps a row's accepted path; nodes not compacted are forgotten."""

    def __init__(self, runner: Runner) -> None:
        check_tree_model(runner.model, runner.name)
        self.runner = runner
        self.window = _sliding(runner.model)
        b = runner.batch
        self.col: list[dict[int, int]] = [{} for _ in range(b)]
        """``col[i][v]``: the cache column of row ``i``'s node ``v`` (the root: its context's last column)."""
        self.pos: list[dict[int, int]] = [{} for _ in range(b)]
        """``pos[i][v]``: node ``v``'s position id (the root: its context's length - 1)."""
        self.line: list[dict[int, list[int]]] = [{} for _ in range(b)]
        """``line[i][v]``: the columns of node ``v``'s ancestors below the root, and its own."""
        self.tokens: list[dict[int, int]] = [{} for _ in range(b)]
        self._parent: list[dict[int, int]] = [{} for _ in range(b)]

    # the zoo's seams ------------------------------------------------------------------------

    def _visible(self, i: int, v: int, parent: int) -> list[int]:
        """The tree columns node ``v`` of row ``i`` attends to besides its row's context: its
        ancestors' and its own (``line[i][v]``, already recorded)."""
        return self.line[i][v]

    def _node_position(self, i: int, parent: int) -> int:
        """The position id of a child of row ``i``'s node ``parent``: one past the parent's."""
        return self.pos[i][parent] + 1

    # feeding --------------------------------------------------------------------------------

    def feed(self, pending: Sequence[Sequence[int]], nodes: Sequence[Sequence[tuple[int, int, int]]],
             want_hidden: bool = False) -> tuple[Tensor, list[dict[int, int]], Tensor | None]:
        """One forward pass: row ``i`` is fed ``pending[i]`` (the ids its cache lacks of its context,
        from :meth:`Runner.sync`; non-empty makes its last id the root, node 0) then ``nodes[i]``,
        ``(node, token, parent)`` triples whose parents are the root or nodes fed before them.
        Rows dropped from the runner's cache must feed nothing. Returns the logits ``[B, W, V]`` at
        the block's columns (zeros for rows not in the cache), ``at[i][v]``: the block column of row
        ``i``'s root (when its pending ids were fed) and of each node fed, and, with ``want_hidden``,
        the final hidden states ``[B, W, H]`` at the same columns."""
        run = self.runner
        cols = run.columns
        dev = run.device
        live = run.live
        for i in range(run.batch):
            if (pending[i] or nodes[i]) and run.slot(i) < 0:
                raise AssertionError(f"row {i} was dropped from the {run.name}'s cache")
        start = cols.width
        width = max(1, max(len(pending[i]) + len(nodes[i]) for i in live))
        base = cols.mask.bool() if cols.masked else self._unmasked_keep(start)
        kv_pos = self._kv_positions(start) if self.window is not None else None
        at: list[dict[int, int]] = [{} for _ in range(run.batch)]
        toks: list[list[int]] = []
        pos: list[list[int]] = []
        extra: list[tuple[int, int, int]] = []  # (slot, query, column) visible beyond the row's kept columns
        for s, i in enumerate(live):
            t, p, e = self._row_block(s, i, pending[i], nodes[i], start, width, at[i])
            toks.append(t)
            pos.append(p)
            extra.extend(e)
        ids_in = torch.tensor(toks, dtype=torch.long, device=dev)
        pos_in = torch.tensor(pos, dtype=torch.long, device=dev)
        see = torch.zeros(len(live), width, start + width, dtype=torch.bool, device=dev)
        if start:
            see[:, :, :start] = base[:, None, :start]
        e_t = torch.tensor(extra, dtype=torch.long, device=dev)
        see[e_t[:, 0], e_t[:, 1], e_t[:, 2]] = True
        if kv_pos is not None:
            kv_pos = torch.cat([kv_pos, pos_in], dim=1)
        mask = tree_masks(see, kv_pos, pos_in, self.window, _impl(run.model), run.model.dtype)
        kw: dict[str, Any] = {run._cache_kw: run.cache}
        if want_hidden:
            kw["output_hidden_states"] = True
        out = run.model(input_ids=ids_in, attention_mask=mask, position_ids=pos_in, use_cache=True, **kw)
        if cols.masked:  # the context ids fed are kept (1), the nodes and padding are not (0)
            fed = [[1] * len(pending[i]) + [0] * (width - len(pending[i])) for i in live]
            cols.append(torch.tensor(fed, dtype=torch.long, device=dev), pos_in)
        else:
            cols.width = start + width
        logits = _scatter_live(out.logits, live, run.batch)
        hidden = _scatter_live(out.hidden_states[-1], live, run.batch) if want_hidden else None
        return logits, at, hidden

    def _row_block(self, s: int, i: int, pend: Sequence[int], nodes: Sequence[tuple[int, int, int]], start: int,
                   width: int, at: dict[int, int]) -> tuple[list[int], list[int], list[tuple[int, int, int]]]:
        """Row ``i``'s (cache slot ``s``) part of a feed: its ids and position ids padded to ``width``
        (padding repeats the last position), the ``(slot, query, column)`` visibilities beyond its kept
        columns (the pending ids causally, each node its context and its line, padding itself), and
        ``at`` filled; the pending ids are recorded as the row's (:meth:`Runner._record`), the nodes
        as this tree's."""
        run = self.runner
        row_t: list[int] = []
        row_p: list[int] = []
        extra: list[tuple[int, int, int]] = []
        cap = (run.max_pos - 1) if run.max_pos is not None else None
        if pend:
            n0 = run._first_position(i)
            row_t += run._record(i, list(pend), start)
            row_p += list(range(n0, n0 + len(pend)))
            self.col[i], self.pos[i], self.line[i] = {0: start + len(pend) - 1}, {0: n0 + len(pend) - 1}, {0: []}
            self.tokens[i], self._parent[i] = {}, {}
            at[0] = len(pend) - 1
            for j in range(len(pend)):  # causal within the pending ids
                extra.extend((s, j, start + k) for k in range(j + 1))
        elif nodes and 0 not in self.col[i]:
            raise AssertionError(f"row {i} feeds tree nodes before its context (no root)")
        for v, tok, parent in nodes:
            j = len(row_t)
            self.col[i][v] = start + j
            self.pos[i][v] = self._node_position(i, parent)
            self.line[i][v] = self.line[i][parent] + [start + j]
            self.tokens[i][v], self._parent[i][v] = int(tok), parent
            if cap is not None and self.pos[i][v] > cap:
                raise ValueError(f"the {run.name}'s tree would reach position {self.pos[i][v]}, beyond its "
                                 f"{cap + 1} positions; shorten the prompt or max_new_tokens")
            row_t.append(int(tok))
            row_p.append(self.pos[i][v])
            at[v] = j
            extra.extend((s, j, c) for c in self._visible(i, v, parent))
            extra.extend((s, j, start + k) for k in range(len(pend)))  # the context fed in this block
        if nodes:
            run.calls[i] += 0 if pend else 1
            run.positions[i] += len(nodes)
        n_fed = len(row_t)
        fill = row_p[-1] if row_p else max(run._first_position(i), 0)
        fill = fill if cap is None else min(fill, cap)
        extra.extend((s, j, start + j) for j in range(n_fed, width))  # padding: sees its own column only
        return row_t + [run.pad_id] * (width - n_fed), row_p + [fill] * (width - n_fed), extra

    def _unmasked_keep(self, start: int) -> Tensor:
        """A batch of one: the columns its ids sit in (0 .. len(ids) - 1), as ``[1, start]`` bools."""
        run = self.runner
        keep = torch.zeros(1, start, dtype=torch.bool, device=run.device)
        n = len(run.cols[run.live[0]]) if run.live else 0
        keep[:, :n] = True
        return keep

    def _kv_positions(self, start: int) -> Tensor:
        """Each existing cache column's position in its row ``[rows, start]``: the runner's (several
        rows), else the column itself; the tree columns of this round overwritten with their nodes'
        positions."""
        run = self.runner
        cols = run.columns
        if cols.masked:
            kv = cols.kv_pos.clone()
        else:
            kv = torch.arange(start, device=run.device).expand(len(run.live), -1).clone()
        for s, i in enumerate(run.live):
            for v, c in self.col[i].items():
                if v and c < start:
                    kv[s, c] = self.pos[i][v]
        return kv

    # compaction -----------------------------------------------------------------------------

    def _move(self, slot: int, src: Tensor, dst: Tensor) -> None:
        """Every layer's keys and values of the cache row ``slot``: the columns ``src`` copied to
        ``dst`` (all read before any is written)."""
        for layer in self.runner.cache.layers:
            for name in ("keys", "values"):
                row = getattr(layer, name)[slot]  # [heads, columns, dim]
                row[:, dst] = row[:, src]

    def compact(self, i: int, path: Sequence[int]) -> int:
        """Row ``i`` keeps the nodes ``path`` (the root's child first, each the next one's parent),
        as far as they were fed: their keys and values move to the row's columns right after its
        last kept id, in order, and become its ids (masked in for several rows). Returns how many
        nodes it kept. The row's other nodes stay forgotten."""
        run = self.runner
        keep = []
        for v in path:
            if v not in self.col[i]:
                break
            keep.append(v)
        if not keep:
            return 0
        s = run.slot(i)
        assert s >= 0, f"row {i} was dropped from the {run.name}'s cache"
        first = run.cols[i][-1] + 1
        src = torch.tensor([self.col[i][v] for v in keep], dtype=torch.long, device=run.device)
        dst_cols = list(range(first, first + len(keep)))
        dst = torch.tensor(dst_cols, dtype=torch.long, device=run.device)
        self._move(s, src, dst)
        n0 = len(run.ids[i])
        run.ids[i].extend(self.tokens[i][v] for v in keep)
        run.cols[i].extend(dst_cols)
        run.high[i] = max(run.high[i], len(run.ids[i]))
        cols = run.columns
        if cols.masked:
            cols._mask[s, first:first + len(keep)] = 1
            if cols.positions:
                cols._pos[s, first:first + len(keep)] = torch.arange(n0, n0 + len(keep), device=run.device)
        return len(keep)
