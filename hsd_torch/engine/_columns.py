"""The columns of one model's batched KV cache: a cache whose every layer can be cropped
(:func:`new_cache`), the attention masks per layer type that give each row of a batch its own
sliding window (:func:`layer_masks`), and :class:`Columns`, the bookkeeping of a
:class:`hsd_torch.engine.runner.Runner`'s columns (how many, which each row keeps, their positions).

A row's tokens sit in the columns it was fed; a column a row must forget (a rejected draft, a
drafter token that the re-sync replaced, padding of a ragged block) is masked out of attention from
then on (a hole). A batch of one row needs no mask: it never holds a hole.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

__all__ = ["Columns", "layer_masks", "new_cache"]


def new_cache(model: Any) -> tuple[Any, bool]:
    """A ``DynamicCache`` for ``model`` whose every layer can be cropped, and whether the model
    has sliding-window layers.

    The model's own cache (``DynamicCache(config=model.config)``) keeps, on a sliding-window layer
    (``DynamicSlidingWindowLayer``), only the last ``sliding_window - 1`` columns once it is full,
    and then cannot be cropped: a rejected draft past the window could not be taken back. Here each
    such layer is replaced by a full-history ``DynamicLayer``, so crops work at any length; the
    window is applied by the attention mask alone, which transformers builds from the cache's
    columns (for one row without holes the columns are the positions, so the model attends to the
    last ``sliding_window`` positions, as it does with its own cache), or :func:`layer_masks`
    builds over each row's kept positions (batches). The law is the model's; the cost is memory
    (the sliding layers keep every column) and attention over masked columns."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    cache = DynamicCache(config=model.config)
    sliding = False
    for k, layer in enumerate(cache.layers):
        if type(layer) is DynamicSlidingWindowLayer:
            sliding = True
            cache.layers[k] = DynamicLayer()  # type: ignore[no-untyped-call]
    return cache, sliding


def _check_layer_masks(model: Any, name: str) -> None:
    """``ValueError`` unless :func:`layer_masks` can serve ``model``'s sliding-window layers in a
    batch: its decoder takes a mapping of masks per layer type (``attention_mask`` as a dict, as
    Gemma's do), its layer types are full and sliding attention only, with one window
    (``config.sliding_window``, the one transformers' sliding masks apply), and its attention is
    ``"sdpa"`` or ``"eager"`` (which read an explicit 4D mask)."""
    config = model.config.get_text_config(decoder=True)
    types = set(getattr(config, "layer_types", None) or ())
    if not isinstance(getattr(config, "sliding_window", None), int):
        types = set()
    decoder = model.get_decoder() if callable(getattr(model, "get_decoder", None)) else None
    try:
        src = inspect.getsource(type(decoder).forward) if decoder is not None else ""
    except (OSError, TypeError):
        src = ""
    impl = getattr(config, "_attn_implementation", None)
    if not types or not types <= {"full_attention", "sliding_attention"} or "attention_mask, dict" not in src:
        raise ValueError(f"the {name} has sliding-window attention layers that hsd cannot mask per row in a batch "
                         "(its forward takes no masks per layer type); generate one prompt at a time")
    if impl not in ("sdpa", "eager"):
        raise ValueError(f"the {name} has sliding-window attention layers and attn_implementation={impl!r}, which "
                         "reads no explicit mask: load it with attn_implementation='sdpa' or 'eager' for batches, "
                         "or generate one prompt at a time")


def layer_masks(keep: Tensor, kv_pos: Tensor, q_pos: Tensor, start: int, window: int, impl: str,
                dtype: torch.dtype) -> dict[str, Tensor]:
    """The attention masks of one batched forward over a cache with holes, per layer type:
    ``{"full_attention": m, "sliding_attention": m}``, each ``[rows, 1, q, columns]``.

    ``keep`` ``[rows, columns]``: 1 where a column holds one of the row's ids (the new block's
    columns included, from ``start``); ``kv_pos`` ``[rows, columns]``: each column's position in
    its row; ``q_pos`` ``[rows, q]``: the block's positions. A query at column ``start + j`` sees the
    kept columns up to its own (full attention) and, on sliding layers, only those whose position
    is within ``window`` of its own: the row's last ``window`` positions, as the row alone would
    see them (transformers' own sliding mask counts columns, padding and holes included). Every
    query also sees its own column, so a padding query never has an empty row (its output is
    never read). ``impl`` ``"sdpa"``: boolean masks (True: attend); ``"eager"``: additive masks
    of ``dtype`` (0 or its minimum)."""
    n_q = q_pos.shape[1]
    cols = torch.arange(keep.shape[1], device=keep.device)
    q_cols = start + torch.arange(n_q, device=keep.device)
    own = (cols[None, :] == q_cols[:, None])[None]  # [1, q, columns]
    full = (keep.bool()[:, None, :] & (cols[None, :] <= q_cols[:, None])[None]) | own
    near = kv_pos[:, None, :] > q_pos[:, :, None] - window
    masks = {"full_attention": full, "sliding_attention": (full & near) | own}
    if impl == "eager":
        low = torch.finfo(dtype).min
        return {k: torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, low).unsqueeze(1)
                for k, m in masks.items()}
    return {k: m.unsqueeze(1) for k, m in masks.items()}


class Columns:
    """The columns of one model's batch KV cache (a :class:`hsd_torch.engine.runner.Runner`'s): their
    number (:attr:`width`) and, in a batch of several rows (:attr:`masked`), the attention mask over
    them (:attr:`mask`: 1 where a column holds one of the row's ids, 0 for a hole or padding) and,
    for a model with sliding-window layers (:attr:`positions`), each column's position in its row
    (:attr:`kv_pos`), from which :func:`layer_masks` builds each row's window. Rows are those left
    in the cache, in cache order (:meth:`select`).

    ``ValueError`` (:func:`_check_layer_masks`) for a batch of a sliding-window model whose masks
    per layer type hsd cannot pass."""

    def __init__(self, model: Any, batch: int, device: torch.device, sliding: bool, name: str) -> None:
        self.model = model
        self.device = device
        self.width = 0  # the cache's columns
        self.rows = batch
        self.masked = batch > 1
        self.positions = self.masked and sliding
        if self.positions:
            _check_layer_masks(model, name)
        self._mask = torch.zeros(batch, 0, dtype=torch.long, device=device)  # the attention mask, 1 = kept
        self._pos = torch.zeros(batch, 0, dtype=torch.long, device=device)  # each column's position in its row

    @property
    def mask(self) -> Tensor:
        """The attention mask over the cache's columns ``[rows in the cache, width]`` (1 = kept): the
        one kept for several rows, ones for a batch of one."""
        if self.masked:
            return self._mask
        return torch.ones(self.rows, self.width, dtype=torch.long, device=self.device)

    @property
    def kv_pos(self) -> Tensor:
        """Each cache column's position in its row ``[rows in the cache, width]`` (kept only with
        :attr:`positions`; a batch of one holds its ids in order: ``0 .. width-1``)."""
        if self.masked:
            assert self.positions, "column positions are kept only for sliding-window layers"
            return self._pos
        return torch.arange(self.width, device=self.device).expand(self.rows, -1)

    def masks_for(self, keep: Tensor, kv_pos: Tensor, q_pos: Tensor, start: int) -> dict[str, Tensor]:
        """:func:`layer_masks` for this model (its window, attention implementation and dtype)."""
        config = self.model.config.get_text_config(decoder=True)
        return layer_masks(keep, kv_pos, q_pos, start, config.sliding_window, config._attn_implementation,
                           self.model.dtype)

    def extend(self, new_mask: Tensor, q_pos: Tensor, start: int) -> Tensor | dict[str, Tensor]:
        """Record a batched forward's block of new columns from ``start`` (several rows): ``new_mask
        [rows, n]`` (1 where a row is fed, 0 for its padding), ``q_pos [rows, n]`` their positions.
        Returns what the model is passed as ``attention_mask``: the attention mask with them
        ``[rows, start + n]``, or with :attr:`positions`, :meth:`masks_for`'s masks over it."""
        mask = torch.cat([self.mask, new_mask], dim=1)
        self._mask = mask
        if not self.positions:
            return mask
        self._pos = torch.cat([self._pos, q_pos], dim=1)
        return self.masks_for(mask, self._pos, q_pos, start)

    def append(self, new_mask: Tensor, q_pos: Tensor) -> None:
        """Record a block of new columns (several rows) as :meth:`extend` does, building no mask:
        the caller passed its own (a tree feed, :mod:`hsd_torch.engine.tree`)."""
        self._mask = torch.cat([self.mask, new_mask], dim=1)
        if self.positions:
            self._pos = torch.cat([self._pos, q_pos], dim=1)
        self.width += new_mask.shape[1]

    def hide(self, slot: int, drop: list[int]) -> None:
        """Mask the columns ``drop`` (ascending) out of the row at ``slot`` (several rows)."""
        if drop[-1] - drop[0] + 1 == len(drop):  # usually: a run of columns, cleared as a slice
            self._mask[slot, drop[0]:drop[-1] + 1] = 0
        else:
            self._mask[slot, torch.tensor(drop, dtype=torch.long, device=self.device)] = 0

    def select(self, idx: Tensor) -> None:
        """Keep the rows ``idx`` (cache order, as ``DynamicCache.batch_select_indices`` keeps them)."""
        self._mask = self._mask.index_select(0, idx)
        if self.positions:
            self._pos = self._pos.index_select(0, idx)
        self.rows = len(idx)

    def crop(self, last: int) -> None:
        """Keep the first ``last`` columns (the cache was cropped to them)."""
        self._mask = self._mask[:, :last]
        self._pos = self._pos[:, :last] if self.positions else self._pos
        self.width = last
