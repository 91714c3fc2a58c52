"""The laws every method draws from and verifies against: a model's processed law
(:func:`process_logits`: ids without text removed, then temperature, top-k, top-p) and the
columns it lives on (:class:`TextSpace`: the ids with text in ``hsd_core``'s order, EOS last).

The law every method is lossless for is the target's **processed** law; the drafter's laws are
processed the same way (with its own temperature, if given). Every draw (inverse CDF, and argmax
ties) reads a law's columns in ``hsd_core``'s order: ids increasing with EOS moved last, which is
the text space's order, so a law over a text space needs no permutation before a draw.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ._cache import IdentityCache
from .text import TokenText

__all__ = ["TextSpace", "process_logits", "process_with_drop", "space_law"]


def process_logits(logits: Tensor, text_mask: Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> Tensor:
    """The processed law of ``logits [..., V]``: probabilities, float64 for float64 logits, else
    float32.

    In order: ids where ``text_mask [V]`` is False get probability 0; logits are divided by
    ``temperature``; top-k keeps the ids whose logit is at least the k-th largest (ties kept);
    top-p keeps, in order of decreasing probability (ties by lower id), the ids whose preceding mass
    is below ``top_p`` (the smallest such head of mass >= ``top_p``), renormalized.
    """
    v = logits.shape[-1]
    if text_mask.shape[0] != v:
        raise ValueError(f"logits have {v} columns but the text mask {text_mask.shape[0]}")
    return process_with_drop(logits, ~text_mask.to(logits.device), temperature, top_k, top_p)




def _tempered_softmax(x: Tensor, temperature: float, top_k: int | None) -> Tensor:
    """``softmax`` of ``x [..., V]`` (compute dtype; removed ids already ``-inf`` or absent) divided
    by ``temperature``, keeping the ids whose logit is at least the k-th largest (ties kept)."""
    if temperature != 1.0:
        x = x / temperature
    if top_k is not None and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    return torch.softmax(x, dim=-1)




def process_with_drop(logits: Tensor, drop: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> Tensor:
    """:func:`process_logits` with the mask of removed ids given (``drop [V]``, bool, on ``logits``'
    device): ``[..., V]`` probabilities, float64 for float64 logits, else float32; what
    ``generate`` calls at every step, without re-deriving the mask."""
    cdt = torch.float64 if logits.dtype == torch.float64 else torch.float32
    probs = _tempered_softmax((logits if logits.dtype == cdt else logits.to(cdt)).masked_fill(drop, float("-inf")),
                              temperature, top_k)
    if top_p is not None and top_p < 1.0:
        sp, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = torch.cumsum(sp, dim=-1) - sp
        keep_sorted = before < top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = torch.where(keep, probs, torch.zeros((), dtype=cdt, device=probs.device))
        probs = probs / probs.sum(-1, keepdim=True)
    return probs




class TextSpace:
    """The columns ``generate``'s laws live on for one model: ``ids``, the model's ids a law may
    put mass on in ``hsd_core``'s order (ids with text increasing, then EOS: the mirror's core ids,
    :class:`hsd_torch.mirror.CoreTokenizer`; a TLI drafter's: the same ids, those it shares with
    the target first, :func:`hsd_torch.methods.tli.tli_columns`). ``pos[id]``: an id's column (-1: none).

    Laws over these columns need no permutation before a draw (the sampling order is the column
    order of the columns drawn from) and carry no columns of probability 0 by construction; :meth:`select` takes the columns
    out of a ``[..., V]`` tensor with one ``index_select`` (a slice when they are one run of ids:
    EOS last and every other id with text, e.g. GPT-2's)."""

    _cache: IdentityCache[TextSpace] = IdentityCache(32)

    def __init__(self, ids: Sequence[int], v: int, device: torch.device) -> None:
        self.ids: list[int] = [int(i) for i in ids]
        self.n = len(self.ids)
        self.v = v
        self.pos: list[int] = [-1] * v
        for c, i in enumerate(self.ids):
            self.pos[i] = c
        self.cols = torch.tensor(self.ids, dtype=torch.long, device=device)
        one_run = self.ids == list(range(self.ids[0], self.ids[0] + self.n)) if self.ids else False
        self._run: tuple[int, int] | None = (self.ids[0], self.ids[0] + self.n) if one_run else None

    @classmethod
    def text(cls, text: TokenText, device: torch.device) -> TextSpace:
        """The text space of a model: every id with text, then EOS (built once per TokenText and device)."""
        def build() -> TextSpace:
            mask = text.text_mask.tolist()
            return cls([i for i, m in enumerate(mask) if m and i != text.eos_id] + [text.eos_id], text.vocab_size,
                       device)
        return cls._cache.get((text,), (str(device),), build)

    def select(self, x: Tensor) -> Tensor:
        """``x [..., v]`` at the space's columns: ``[..., n]`` (a view when they form one run)."""
        if self._run is not None:
            return x[..., self._run[0]:self._run[1]]
        if x.dim() == 2:
            return x.index_select(1, self.cols)
        lead = x.shape[:-1]
        return x.reshape(-1, x.shape[-1]).index_select(1, self.cols).view(*lead, self.n)


def space_law(logits: Tensor, space: TextSpace, drop: Tensor, temperature: float, top_k: int | None,
               top_p: float | None) -> Tensor:
    """The processed law of :func:`process_logits` at the columns of a model's text space
    (:meth:`TextSpace.text`, which holds every id the law may put mass on): ``[..., space.n]``, float64
    for float64 logits, else float32. Temperature and top-k act on those columns alone (the same
    law: the removed ids are ``-inf`` there); top-p, whose ties go to the lower id, runs on all
    ``V`` columns in id order first (``drop [V]``: the removed ids)."""
    if top_p is not None and top_p < 1.0:
        return space.select(process_with_drop(logits, drop, temperature, top_k, top_p))
    cdt = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = space.select(logits)
    return _tempered_softmax(x if x.dtype == cdt else x.to(cdt), temperature, top_k)


