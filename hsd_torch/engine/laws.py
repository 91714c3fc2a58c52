"""The laws every method draws from and verifies against: a model's processed law
(:func:`process_logits`: the removed ids at 0, then temperature, top-k, top-p) and the columns it
lives on (:class:`TextSpace`: the ids it may put mass on in ``hsd_core``'s order, EOS last).

The law every method is lossless for is the target's **processed** law, over every id of its
logits by default (:meth:`TextSpace.law`; ``mask_textless=True``: the ids with text, EOS and the end
ids); the drafter's laws are processed the same way over its ids with text (with its own
temperature, if given). Every draw (inverse CDF, and argmax
ties) reads a law's columns in ``hsd_core``'s order: ids increasing with EOS moved last, which is
the text space's order, so a law over a text space needs no permutation before a draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from ..vocab.text import TokenText
from ._cache import IdentityCache
from ._draws import HeadLaw
from .validation import TEMPERATURE_RANGE as TEMPERATURE_RANGE
from .validation import check_temperature as check_temperature
from .validation import check_top_k as check_top_k
from .validation import check_top_p as check_top_p

__all__ = ["TEMPERATURE_RANGE", "Processing", "TextSpace", "check_processing", "check_temperature", "check_top_k",
           "check_top_p", "process_logits", "process_with_drop", "restricted_law", "space_head_law", "space_law"]

@dataclass(frozen=True)
class Processing:
    """How a model's logits become its law (:func:`process_logits`): ``temperature`` (a float in
    :data:`TEMPERATURE_RANGE`), ``top_k`` (None: off, else >= 1), ``top_p`` (None or in ``(0, 1]``).
    Built checked by :meth:`checked`; immutable, so one object is shared by every round."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    @classmethod
    def checked(cls, temperature: Any, top_k: Any, top_p: Any) -> Processing:
        """The settings checked (:func:`check_temperature`, :func:`check_top_k`, :func:`check_top_p`,
        in that order: the first bad one is reported)."""
        return cls(check_temperature(temperature), check_top_k(top_k), check_top_p(top_p))

    def with_temperature(self, temperature: float) -> Processing:
        """The same settings with another (already checked) temperature."""
        return replace(self, temperature=temperature)

    def args(self) -> tuple[float, int | None, float | None]:
        """``(temperature, top_k, top_p)``: the positional arguments :func:`space_law` and
        :func:`process_with_drop` take after their mask."""
        return self.temperature, self.top_k, self.top_p

    def as_dict(self) -> dict[str, Any]:
        """The settings as the keyword arguments of :func:`process_logits`."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

    @property
    def reads_every_logit(self) -> bool:
        """Whether the kept set depends on every logit (a top-k, or a top-p below 1): a law over a
        subset of the ids cannot then be computed from that subset's logits alone."""
        return self.top_k is not None or (self.top_p is not None and self.top_p < 1.0)


def check_processing(temperature: Any, top_k: Any, top_p: Any) -> dict[str, Any]:
    """The processing arguments of :func:`process_logits`, checked (:meth:`Processing.checked`) and
    as the keyword arguments it takes."""
    return Processing.checked(temperature, top_k, top_p).as_dict()


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
        kth = largest(x, top_k)[0][..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    return torch.softmax(x, dim=-1)




def process_with_drop(logits: Tensor, drop: Tensor, temperature: float, top_k: int | None, top_p: float | None,
                      space: TextSpace | None = None) -> Tensor:
    """:func:`process_logits` with the mask of removed ids given (``drop [V]``, bool, on ``logits``'
    device): ``[..., V]`` probabilities, float64 for float64 logits, else float32; what
    ``generate`` calls at every step, without re-deriving the mask. With a ``space`` (and top-p),
    the law at that space's columns, ``[..., space.n]`` (:func:`space_law`).

    With top-p, the kept probabilities are divided by their sum taken in decreasing order (one
    canonical order: ties are equal values, so the same bits whichever sort found them), and the law
    is built from the sorted head alone when its boundary is strict (:func:`top_p_law`)."""
    probs = _probs(logits, drop, temperature, top_k)
    if top_p is not None and top_p < 1.0:
        return top_p_law(probs, top_p, space=space)
    return probs if space is None else space.select(probs)


def _probs(logits: Tensor, drop: Tensor, temperature: float, top_k: int | None) -> Tensor:
    """The tempered softmax of ``logits [..., V]`` with the ``drop`` ids removed and top-k applied,
    in the compute dtype (float64 for float64 logits, else float32): the law before top-p."""
    cdt = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = logits if logits.dtype == cdt else logits.to(cdt)
    removed = _REMOVED.peek((drop,), None)
    if removed is not None:  # a fixed mask (:func:`fixed_drop`): its removed ids written alone, if any
        if removed.numel():
            x = x.index_fill(-1, removed, float("-inf"))
    elif drop.device.type != "cpu" or bool(drop.any()):  # nothing removed (the target's own law): no pass
        x = x.masked_fill(drop, float("-inf"))
    return _tempered_softmax(x, temperature, top_k)


_REMOVED: IdentityCache[Tensor] = IdentityCache(32)


def fixed_drop(drop: Tensor) -> Tensor:
    """``drop`` (a ``[V]`` bool mask of removed ids), returned as is, with its removed ids (int64)
    noted by its identity: the laws built with this very tensor write those ids alone
    (``index_fill``, the same bits as ``masked_fill`` without reading the mask). The caller promises
    never to change the mask in place (``generate``'s masks, built once per call, are never
    changed); a mask not noted, or noted and since forgotten, is read whole."""
    _REMOVED.get((drop,), None, lambda: drop.nonzero().squeeze(-1))
    return drop


LARGEST_CHUNK = 256
"""The chunk width :func:`largest` reads the maxima of (CPU, when ``k`` chunks are at most an eighth
of the row)."""


def largest(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` largest entries of ``x [..., V]`` along the last dimension, ``1 <= k <= V``: their
    values in decreasing order (``[..., k]``, ``x``'s dtype; bit for bit ``torch.topk``'s, NaN
    first) and their ids (``[..., k]``, int64). Where several ids tie at the ``k``-th value, which of
    them are returned is not specified (as with ``torch.topk``); every id above it is.

    On CPU, when ``k`` chunks of :data:`LARGEST_CHUNK` ids are at most an eighth of ``V``, only the
    ``k`` chunks of the largest maxima are searched (and the ids past the last whole chunk): every
    entry above the ``k``-th largest chunk maximum lies in one of those chunks, and they hold ``k``
    entries at least that large, so the ``k`` largest values are found there."""
    v = x.shape[-1]
    c = LARGEST_CHUNK
    n = v // c
    if x.device.type != "cpu" or 8 * k * c > v:
        return torch.topk(x, k, dim=-1, sorted=True)
    lead = x.shape[:-1]
    flat = x.reshape(-1, v)
    r = flat.shape[0]
    body = flat[:, : n * c].reshape(r, n, c)
    top = torch.topk(body.amax(-1), k, dim=-1, sorted=False).indices  # [r, k] chunks
    cand = body.gather(1, top.unsqueeze(-1).expand(r, k, c)).reshape(r, k * c)
    if n * c < v:
        cand = torch.cat([cand, flat[:, n * c:]], dim=-1)
    vals, at = torch.topk(cand, k, dim=-1, sorted=True)
    in_body = at < k * c
    ids = torch.where(in_body, top.gather(1, torch.clamp(at // c, max=k - 1)) * c + at % c, at - k * c + n * c)
    return vals.reshape(*lead, k), ids.reshape(*lead, k)


TOP_P_FIRST_K = 32
"""How many of the largest probabilities :func:`top_p_keep` sorts first (then 8 times more, until
the kept head ends inside the sorted part; from a quarter of the vocabulary, all of it). Measured
(bench/RESULTS.md): on the Gemma pair at temperature 0.7 and top-p 0.9 every one of 441 calls kept
fewer than 32 ids in every row (98 % fewer than 16), and :func:`largest` finds 32 on Gemma's 262,144
ids in a quarter of ``torch.topk``'s time."""


def top_p_law(probs: Tensor, top_p: float, first_k: int | None = None, space: TextSpace | None = None) -> Tensor:
    """``probs [..., V]`` (a law; softmax's output, which may be overwritten) kept on
    :func:`top_p_keep`'s set and renormalized: same shape and dtype, the removed ids +0, each kept
    probability divided by the kept mass summed in decreasing order (the cumulative sum top-p
    reads). Where every row's kept head ends strictly above the next value (no tie across the
    boundary, the usual case), the law is written from the sorted head alone (:func:`_top_p`'s
    :class:`HeadLaw`, its values added into zeros), without reading the removed ids; else through
    the kept mask. Both give the same bits: the kept values are the head's values, divided by the
    same sum. With a ``space``: the law at its columns, ``[..., space.n]`` (the removed ids, outside
    it, have probability 0), written there directly on the sorted-head path."""
    law = _top_p(probs, top_p, first_k, space)
    if isinstance(law, HeadLaw):  # into probs, in place, when it has the law's columns: no new buffer of V
        return law.dense(out=probs if space is None else None)
    return law


def _top_p(probs: Tensor, top_p: float, first_k: int | None, space: TextSpace | None) -> Tensor | HeadLaw:
    """:func:`top_p_law`'s law: a :class:`HeadLaw` (the kept ids' columns, in increasing order, and
    their probabilities divided by the kept mass; ``h`` the largest kept count of the rows) where
    every row's boundary is strict, else the dense law through the kept mask (``probs`` overwritten)."""
    vals, ids, csum, m = _top_p_head(probs, top_p, first_k)
    mass = csum.gather(-1, m - 1)  # the kept mass, summed in decreasing order
    k = vals.shape[-1]
    if bool((m < k).all()) and bool((vals.gather(-1, m - 1) > vals.gather(-1, m)).all()):
        h = int(m.max())
        n = probs.shape[-1] if space is None else space.n
        cols = ids[..., :h] if space is None else space.col_of(ids[..., :h])
        # a removed id (outside the space, probability 0) adds nothing: +0, and a padding column
        kept = (torch.arange(h, device=vals.device) < m) & (cols >= 0)
        head = torch.where(kept, vals[..., :h] / mass, torch.zeros((), dtype=vals.dtype, device=vals.device))
        cols, order = torch.sort(torch.where(kept, cols, torch.full_like(cols, n)), dim=-1)
        return HeadLaw(cols, head.gather(-1, order), n)
    # in place: the removed ids' probabilities become +0 (probs are >= 0), as torch.where gave
    law = probs.mul_(_kept(probs, vals, m)).div_(mass)
    return law if space is None else space.select(law)


def _top_p_head(probs: Tensor, top_p: float, first_k: int | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The sorted head top-p reads in ``probs [..., V]``: its ``k`` largest values in decreasing
    order, their ids, their cumulative sums (``[..., k]`` each) and each row's count ``m [..., 1]``
    (int64) of kept positions, ``m < k`` unless ``k = V`` (:func:`top_p_keep`)."""
    v = probs.shape[-1]
    k = max(1, min(TOP_P_FIRST_K if first_k is None else first_k, v))
    while True:
        if 4 * k >= v:
            k = v
        vals, ids = torch.sort(probs, dim=-1, descending=True) if k == v else largest(probs, k)
        csum = torch.cumsum(vals, dim=-1)
        keep_sorted = (csum - vals) < top_p
        # the top id's preceding mass is 0 < top_p: kept, also where top_p underflows the compute dtype
        # (a top_p below 1.2e-38 is 0 in float32, and the comparison alone would keep no id)
        keep_sorted[..., :1] = True
        m = keep_sorted.sum(-1, keepdim=True)
        if k == v or bool((m < k).all()):
            return vals, ids, csum, m
        k *= 8


def _kept(probs: Tensor, vals: Tensor, m: Tensor) -> Tensor:
    """The kept ids of ``probs [..., V]`` (bool, same shape) given the sorted head ``vals`` and
    each row's kept count ``m``: those above the ``m``-th value and, among those equal to it, the
    lowest ids, as many as the count asks."""
    last = vals.gather(-1, m - 1)  # the smallest kept value of each row
    at_least = probs >= last
    if bool((at_least.sum(-1, keepdim=True) == m).all()):  # no tie at the boundary left out (the usual case)
        return at_least
    above = probs > last
    tied = probs == last
    need = m - above.sum(-1, keepdim=True)  # how many of the ids equal to it are kept (>= 1)
    if bool((tied.sum(-1, keepdim=True) == need).all()):
        return above | tied
    return above | (tied & (torch.cumsum(tied, dim=-1, dtype=torch.int64) <= need))


def top_p_keep(probs: Tensor, top_p: float, first_k: int | None = None) -> Tensor:
    """The ids top-p keeps in ``probs [..., V]`` (bool, same shape): in order of decreasing
    probability, ties by lower id, those whose preceding mass is below ``top_p``, and always the
    first.

    Only the head is sorted: the ``k`` largest values (``torch.topk``, ``k`` from ``first_k``,
    default :data:`TOP_P_FIRST_K`, growing until every row's kept head ends before the ``k``-th
    value). The kept set is the one a full stable sort gives, bit for bit: the preceding masses are
    the cumulative sums of the same sorted values (ties are equal values, so their order does not
    change the sums), a prefix of which is the prefix of the full sums; a row's count ``m`` of kept
    positions is final once ``m < k`` (the masses only grow); and the kept ids are those above the
    ``m``-th value plus, among the ids equal to it, the lowest ones, as many as the count asks."""
    vals, _, _, m = _top_p_head(probs, top_p, first_k)
    return _kept(probs, vals, m)




class TextSpace:
    """The columns ``generate``'s laws live on for one model: ``ids``, the model's ids a law may
    put mass on in ``hsd_core``'s order (ids with text increasing, then EOS: the mirror's core ids,
    :class:`hsd_torch.models.mirror.CoreTokenizer`; a TLI drafter's: the same ids, those it shares with
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
        self._pos_t: Tensor | None = None
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

    @classmethod
    def law(cls, text: TokenText, device: torch.device, *, keep_all: bool, ends: frozenset[int] = frozenset()
            ) -> TextSpace:
        """The columns of a target's law in ``generate``: with ``keep_all`` (``mask_textless=False``,
        the default) every id of the model's logits, the target's own law; else the ids with text,
        the end ids ``ends`` (a generation config's end-of-turn ids, which may have no text) and EOS
        (:meth:`text` when ``ends`` adds nothing). Ids increasing, EOS last (built once per text,
        mode, end set and device)."""
        extra = sorted(e for e in ends if 0 <= e < text.vocab_size and e != text.eos_id)
        if not keep_all and all(bool(text.text_mask[e]) for e in extra):
            return cls.text(text, device)

        def build() -> TextSpace:
            mask = text.text_mask.tolist()
            ok = set(extra)
            return cls([i for i, m in enumerate(mask) if (keep_all or m or i in ok) and i != text.eos_id]
                       + [text.eos_id], text.vocab_size, device)
        return cls._cache.get((text,), ("law", keep_all, tuple(extra), str(device)), build)

    def drop_mask(self) -> Tensor:
        """``[v]`` bool on the space's device: True at the ids outside the space (the removed ids)."""
        drop = torch.ones(self.v, dtype=torch.bool, device=self.cols.device)
        drop[self.cols] = False
        return drop

    def col_of(self, ids: Tensor) -> Tensor:
        """The columns of ``ids`` (int64, any shape, on the space's device): -1 for an id outside the space."""
        if self._pos_t is None:
            self._pos_t = torch.tensor(self.pos, dtype=torch.long, device=self.cols.device)
        return self._pos_t[ids]

    def select(self, x: Tensor) -> Tensor:
        """``x [..., v]`` at the space's columns: ``[..., n]`` (a view when they form one run)."""
        if self._run is not None:
            return x[..., self._run[0]:self._run[1]]
        if x.dim() == 2:
            return x.index_select(1, self.cols)
        lead = x.shape[:-1]
        return x.reshape(-1, x.shape[-1]).index_select(1, self.cols).view(*lead, self.n)


def restricted_law(logits: Tensor, temperature: float) -> Tensor:
    """``softmax(logits / temperature)`` over the last axis of ``logits [..., N]`` (float64 for
    float64 logits, else float32): given the logits of a set of ids only, the processed law of
    :func:`process_logits` (without top-k or top-p) restricted to those ids and renormalized, the
    same law as ``space_law`` over all ids followed by that restriction (the other ids' logits
    cancel from it); what TLI's drafter draws from when its head computes only the shared ids."""
    cdt = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return _tempered_softmax(logits if logits.dtype == cdt else logits.to(cdt), temperature, None)


def space_law(logits: Tensor, space: TextSpace, drop: Tensor, temperature: float, top_k: int | None,
              top_p: float | None) -> Tensor:
    """The processed law of :func:`process_logits` at the columns of a model's text space
    (:meth:`TextSpace.text`, which holds every id the law may put mass on): ``[..., space.n]``, float64
    for float64 logits, else float32. Temperature and top-k act on those columns alone (the same
    law: the removed ids are ``-inf`` there); top-p, whose ties go to the lower id, runs on all
    ``V`` columns in id order first (``drop [V]``: the removed ids)."""
    if top_p is not None and top_p < 1.0:
        return top_p_law(_probs(logits, drop, temperature, top_k), top_p, space=space)
    cdt = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = space.select(logits)
    return _tempered_softmax(x if x.dtype == cdt else x.to(cdt), temperature, top_k)


def space_head_law(logits: Tensor, space: TextSpace, drop: Tensor, temperature: float, top_k: int | None,
                   top_p: float | None) -> Tensor | HeadLaw:
    """:func:`space_law`'s law, given by its kept heads where it can be: with top-p, where every row's
    boundary is strict, a :class:`hsd_torch.engine.kernels.HeadLaw` (the kept columns and values, not
    written out; its ``dense()`` is :func:`space_law`'s tensor, bit for bit); otherwise that tensor.
    What the verification builds the target's laws with (:class:`hsd_torch.engine.kernels.LazyLaw`
    reads a head as it is where only draws and single values read it, and writes it out otherwise)."""
    if top_p is not None and top_p < 1.0:
        return _top_p(_probs(logits, drop, temperature, top_k), top_p, None, space)
    return space_law(logits, space, drop, temperature, top_k, top_p)
