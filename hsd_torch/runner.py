"""One model's batched KV cache for ``generate`` (:class:`Runner`): the ids each row holds, the
cache columns they sit in, the attention mask over those columns, crops and row drops; and the
drafter's sliding window (:func:`window_view`).

A row's tokens sit in the columns it was fed; a column a row must forget (a rejected draft, a
drafter token that the re-sync replaced, padding of a ragged block) is masked out of attention from
then on (a hole), and position ids count only a row's kept tokens, so every row computes what it
would compute alone, up to float rounding. A batch of one row needs neither mask nor position ids:
a re-sync crops its cache at once, so it never holds a hole. The trailing columns no row keeps are
cropped off (``DynamicCache.crop(-n)``); finished rows are dropped from the cache
(``DynamicCache.batch_select_indices``).

The drafter's context need not fit its positions: when it outgrows them it sees a sliding window
(the special prefix and the last ids, the cut moving ``(positions - prefix) // 2`` ids at a time,
so the cache is refilled once per that many tokens). The drafter's law only has to be the law each
draft is drawn from, so this keeps every method lossless; :class:`hsd_torch.CoreModel` with
``window=True`` applies the same window for the mirror.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from . import kernels

__all__ = ["Runner", "common_prefix", "logit_width", "max_positions", "model_device", "window_view"]


def max_positions(config: Any) -> int | None:
    """A model config's number of positions (``n_positions`` or ``max_position_embeddings``), None if it has none."""
    for name in ("n_positions", "max_position_embeddings"):
        v = getattr(config, name, None)
        if isinstance(v, int):
            return v
    return None


def model_device(model: Any) -> torch.device:
    """The device of a model's (first) parameters."""
    dev: torch.device = next(model.parameters()).device
    return dev


def logit_width(model: Any) -> int:
    """The number of logit columns a model produces (its output embedding's rows, else ``config.vocab_size``)."""
    head = model.get_output_embeddings()
    if head is not None and hasattr(head, "weight"):
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def window_view(context: Sequence[int], n_prefix: int, max_pos: int) -> list[int]:
    """The drafter's sliding window: the part of ``context`` (``n_prefix`` special ids, then the
    body) that a model with ``max_pos`` positions sees.

    ``context`` itself when it fits; else the special prefix followed by the body without its
    first ``s`` ids, where ``s`` is the smallest multiple of ``step = max(1, (max_pos - n_prefix)
    // 2)`` that makes it fit. ``s`` is a function of the context's length alone (so the windowed
    law is a function of the context, which the mirror needs) and moves by ``step`` ids at a time
    (so the cache is refilled once per ``step`` new ids, not at every token)."""
    n = len(context)
    if n <= max_pos:
        return list(context)
    room = max_pos - n_prefix
    if room < 1:
        raise ValueError(f"a model with {max_pos} positions cannot hold its {n_prefix} special prefix ids and text")
    step = max(1, room // 2)
    body = n - n_prefix
    s = -(-(body - room) // step) * step
    return list(context[:n_prefix]) + list(context[n_prefix + s:])


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two id lists (a binary search over slice
    comparisons, which run in C: contexts are long and usually differ only near their end)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while hi - lo > 1:  # a[:lo] == b[:lo], a[:hi] != b[:hi]
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class Runner:
    """A model, its batch cache and, per row, the ids it holds and the cache columns they sit in.

    Rows are the batch's rows (``0 .. batch-1``); ``live`` lists those still in the cache, in
    cache order (:meth:`drop` removes finished rows from the cache with
    ``DynamicCache.batch_select_indices``). With ``window`` set (the drafter), contexts longer
    than the model's positions are seen through :func:`window_view`; without it (the target),
    such a context raises ``ValueError``.

    A batch of one row never holds holes: where :meth:`sync` drops ids it crops the cache at once
    (the dropped ids are the row's last columns), so its columns are exactly its ids, in order, and
    the model runs without an attention mask and without position ids (plain causal attention over
    the cache, positions counted from the cache's length: what the mask of ones and the positions
    they replace would give). Batches of several rows pass both (:attr:`mask`), holes and padding
    included."""

    def __init__(self, model: Any, batch: int, pad_id: int, name: str, window: bool = False,
                 n_prefix: Sequence[int] = ()) -> None:
        from transformers import DynamicCache

        self.model = model
        self.name = name
        self.device = model_device(model)
        self.cache = DynamicCache(config=model.config)
        self.use_mask = batch > 1
        self._mask = torch.zeros(batch, 0, dtype=torch.long, device=self.device)  # the attention mask, 1 = kept
        self.width = 0  # the cache's columns
        self.batch = batch
        self.live: list[int] = list(range(batch))
        self._slot: dict[int, int] = {i: i for i in range(batch)}
        self.ids: list[list[int]] = [[] for _ in range(batch)]
        self.cols: list[list[int]] = [[] for _ in range(batch)]
        self.high = [0] * batch
        self.calls = [0] * batch
        self.positions = [0] * batch
        self.recomputed = [0] * batch
        self.pad_id = pad_id
        self.max_pos = max_positions(model.config)
        self.window = window and self.max_pos is not None
        self.n_prefix = list(n_prefix) if n_prefix else [0] * batch
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def feed(self, blocks: Sequence[Sequence[int]], starts: Sequence[int], width: int | None) -> Tensor:
        """Run the model on one block of new ids per row (ragged; an empty block feeds nothing;
        rows dropped from the cache must have empty blocks); returns the logits ``[B, width, V]``
        at block columns ``starts[b] + j`` (clamped into the block), zeros for dropped rows;
        ``width=None``: ``[B, V]``, the column ``starts[b]`` alone."""
        one = width is None
        width = 1 if width is None else width
        live = self.live
        start = self.width
        dev = self.device
        if not self.use_mask and blocks[0]:  # one row: its ids alone (no mask, no positions, no padding)
            row = self._record(0, blocks[0], start)
            width_in = len(row)
            out = self.model(input_ids=kernels._host_tensor([row], torch.long, dev), use_cache=True,
                             **{self._cache_kw: self.cache})
        else:
            width_in = max(1, max(len(blocks[r]) for r in live))
            # one host-to-device copy for the ids, positions and new mask columns: [3, rows, width_in]
            toks: list[int] = []
            pos: list[int] = []
            valid: list[int] = []
            cap = (self.max_pos - 1) if self.max_pos is not None else None
            for i in live:
                n0 = len(self.ids[i])
                lb = len(blocks[i])
                top = n0 + width_in
                pos.extend(range(n0, top) if cap is None or top <= cap + 1 else [min(p, cap) for p in range(n0, top)])
                valid.extend([1] * lb + [0] * (width_in - lb))
                toks.extend(self._record(i, blocks[i], start) if lb else [])
                toks.extend([self.pad_id] * (width_in - lb))
            for i in range(self.batch):
                if blocks[i] and self.slot(i) < 0:
                    raise AssertionError(f"row {i} was dropped from the {self.name}'s cache")
            ids_in, pos_in, new_mask = kernels._host_tensor(toks + pos + valid, torch.long, dev).view(
                3, len(live), width_in).unbind(0)
            mask = torch.cat([self.mask, new_mask], dim=1)
            out = self.model(input_ids=ids_in, attention_mask=mask, position_ids=pos_in,
                             use_cache=True, **{self._cache_kw: self.cache})
            self._mask = mask
        self.width = start + width_in
        logits: Tensor = out.logits
        hi = width_in - 1
        first = {min(max(starts[i], 0), hi) for i in live}
        if len(first) == 1 and (c := first.pop()) + width - 1 <= hi:
            got = logits[:, c] if one else logits[:, c:c + width]  # every row reads the same columns: a view
        else:
            idx = torch.tensor([[min(max(starts[i] + j, 0), hi) for j in range(width)] for i in live],
                               dtype=torch.long, device=dev)
            got = logits.gather(1, idx.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
            got = got[:, 0] if one else got
        if len(live) == self.batch:
            return got
        full = got.new_zeros((self.batch, got.shape[-1]) if one else (self.batch, width, got.shape[-1]))
        full[torch.tensor(live, dtype=torch.long, device=dev)] = got
        return full

    def _record(self, i: int, block: Sequence[int], start: int) -> list[int]:
        """Row ``i`` is fed ``block`` (non-empty) at cache columns from ``start``: check that it fits
        the model's positions, and record ids, columns and counts; returns the ids as ints."""
        n0 = len(self.ids[i])
        lb = len(block)
        if self.max_pos is not None and n0 + lb > self.max_pos:
            raise ValueError(
                f"the {self.name}'s context would grow to {n0 + lb} tokens, beyond its {self.max_pos} "
                "positions; shorten the prompt or max_new_tokens")
        row = [int(t) for t in block]
        self.calls[i] += 1
        self.positions[i] += lb
        self.recomputed[i] += max(0, min(self.high[i], n0 + lb) - n0)
        self.ids[i].extend(row)
        self.cols[i].extend(range(start, start + lb))
        self.high[i] = max(self.high[i], n0 + lb)
        return row

    @property
    def mask(self) -> Tensor:
        """The attention mask over the cache's columns ``[rows in the cache, width]`` (1 = kept): the
        one kept for several rows, ones for a batch of one."""
        if self.use_mask:
            return self._mask
        return torch.ones(len(self.live), self.width, dtype=torch.long, device=self.device)

    def slot(self, i: int) -> int:
        """Row ``i``'s index in the cache's batch, -1 once dropped."""
        return self._slot.get(i, -1)

    def sync(self, i: int, context: Sequence[int]) -> list[int]:
        """Keep the longest prefix of row ``i``'s cached ids that ``context`` (seen through the
        window, if any) starts with (mask the rest); returns the ids still to feed, at least one
        (the last id is fed again when the cache holds all of it: its logits are needed)."""
        if self.window and self.max_pos is not None and len(context) > self.max_pos:
            context = window_view(context, self.n_prefix[i], self.max_pos)
        have = self.ids[i]
        nh = len(have)
        if nh < len(context) and list(context[:nh]) == have:
            return list(context[nh:])
        m = common_prefix(have, context)
        if m == len(context) and m > 0:
            m -= 1
        if m < nh:
            drop = self.cols[i][m:]
            if not self.use_mask:  # one row: its dropped ids are the cache's last columns
                self.cache.crop(drop[0] - self.width)
                self.width = drop[0]
            else:
                s = self.slot(i)
                if drop[-1] - drop[0] + 1 == len(drop):  # usually: a run of columns, cleared as a slice
                    self._mask[s, drop[0]:drop[-1] + 1] = 0
                else:
                    self._mask[s, torch.tensor(drop, dtype=torch.long, device=self.device)] = 0
            del have[m:]
            del self.cols[i][m:]
        return list(context[m:])

    def drop(self, finished: Sequence[bool]) -> None:
        """Remove finished rows from the cache (one ``batch_select_indices``), if any are left in it."""
        keep = [s for s, i in enumerate(self.live) if not finished[i]]
        if len(keep) == len(self.live) or not keep:
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(idx)
        self._mask = self._mask.index_select(0, idx)
        self.live = [self.live[s] for s in keep]
        self._slot = {i: s for s, i in enumerate(self.live)}

    def trim(self) -> None:
        """Crop the trailing cache columns that no row in the cache keeps."""
        last = max((self.cols[i][-1] + 1 for i in self.live if self.cols[i]), default=0)
        n = self.width - last
        if n > 0 and last > 0:
            self.cache.crop(-n)
            self._mask = self._mask[:, :last]
            self.width = last


