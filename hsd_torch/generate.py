"""Speculative generation over Hugging Face causal LMs: ``hsd_torch.generate``.

Methods (names as in :mod:`hsd_core.methods`; each round is one target forward pass):

- ``"ar"``: one token from the target's processed law per round.
- ``"sd"``: same-tokenizer speculative decoding: ``min(lookahead, budget)`` drafts from the
  drafter's processed law, verified by :func:`hsd_torch.kernels.rejection_verify`'s decisions.
- ``"tli"``: token-level intersection: drafts from the drafter's processed law restricted to the
  intersection (``hsd_core``'s ``Intersection.restrict``: the law's columns there, renormalized
  by their mass), mapped by ``to_target``; each draft is verified against the pushforward onto
  target ids of exactly the law it was drawn from. Drafting stops early where that law has no mass
  (a round with no draft is plain target decoding). The drafter's context is re-synced as ``hsd_core``'s TLI does: each emitted target
  id becomes ``to_drafter`` of it when the drafter has its text, else the drafter's encoding of
  its text (:meth:`TokenText.encode`).
- ``"slem"``: ``lookahead`` drafter tokens from its processed law; their text is re-tokenized for
  the target after its context (look-behind 4, :func:`retokenize`), the target's EOS appended if
  the drafter ended; :func:`hsd_torch.kernels.exact_match_verify`'s decisions. The drafter's context is its
  encoding of (prompt + emitted text), recomputed every round.
- ``"slrs"`` at ``lookahead=1`` (default ``proposal_map``): the paper's one-token SLRS: one drafter token from its
  processed law (drafter context as SLEM's); the proposal is the first target id of the target's
  encoding of its text alone (``hsd_core``'s ``SLRS(lookahead=1, lookbehind=0)``: with no
  look-behind the map from drafter ids to first target ids is context-free, built once,
  :class:`FirstTargetMap`), the target's EOS for the drafter's EOS; verified by
  :func:`hsd_torch.kernels.rejection_verify`'s decisions against psi(t) = the drafter's mass on
  the ids whose first target id is t (a pushforward, :class:`_Push`: masses add).
  With ``proposal_map="longest_prefix"`` and ``min_path_prob=tau`` (any lookahead): the bounded
  SLRS of issue 11, ``hsd_core``'s ``SLRS(lookahead, min_path_prob=tau,
  proposal_map="longest_prefix")``, psi computed level by level with one batched drafter pass
  per level (:mod:`hsd_torch.slrs`); ``max_tokens=m`` (None: the budget) proposes up to m target ids
  per round. Deeper lookaheads without them are refused
  (``NotImplementedError``: psi would enumerate every drafter path).

The law every method is lossless for is the target's **processed** law (:func:`process_logits`):
ids without text other than EOS removed (special tokens, a padded embedding's extra ids),
then temperature, top-k, top-p. The drafter's laws are processed the same way.

Where the work happens. Every law lives on its model's *text space* (:class:`_Space`): the ids a
law may put mass on, in ``hsd_core``'s order (ids with text increasing, EOS last), taken out of the
logits with one ``index_select`` and processed there (:func:`_space_law`), so no draw needs a
permutation and no column is masked. The tensor work (softmax, cumulative sums, draws, gathers,
pushforwards, residuals) runs on the models' device; the small decisions (which draft passes,
where a row stops, what it emits) are made on the host from a few values read back
(:func:`hsd_torch.kernels._rejection_host`, :func:`hsd_torch.kernels._exact_match_host`, the same
code the public kernels run). Validity is read off those values too: each draft's law is checked
by the mass its draw reads (SD and SLRS raise ``ValueError`` on a NaN or empty one; TLI and SLEM
stop drafting that row), and the target's by the total of the law each emitted token is drawn
from (a NaN or infinite logit makes its whole softmax row NaN, which shows there: ``ValueError``).

How a batch runs. All rows advance together, one round per target forward pass
(:class:`_Generation`: its phases :meth:`~_Generation.draft`, :meth:`~_Generation.verify`,
:meth:`~_Generation.advance` and :meth:`~_Generation.settle_caches`, in that order). Each model has a
:class:`_Runner`: one ``DynamicCache`` for the batch and an attention mask (0/1) over its columns
(a batch of one row needs neither mask nor position ids: a re-sync crops its cache at once, so it
never holds a hole). A row's
tokens sit in the columns it was fed; a column a row must forget (a rejected draft, a drafter
token that the re-sync replaced, padding of a ragged block) is masked out of attention from then on
(a hole), and position ids count only a row's kept tokens, so every row computes what it would
compute alone, up to float rounding. After each round the trailing columns that no row keeps are
cropped off the cache (``DynamicCache.crop(-n)``). So the target's cache holds exactly the
accepted context plus holes, and the drafter's holds the longest prefix of its new context that
it had already seen (only the rest is recomputed; ``stats`` counts both). Rows that finish are
dropped from both caches at the end of their round (``DynamicCache.batch_select_indices``), so
the others go on with a smaller batch.

Contexts. A model's context is its tokenizer's special prefix (a BOS) and its encoding of the
prompt; for a prompt that encodes to no ids with a tokenizer that adds no prefix, the tokenizer's
BOS (``ValueError`` up front when it has none: :meth:`TokenText.start`). The target's context
must fit its positions (prompt + ``max_new_tokens``, checked up front: its law is defined only
there). The drafter's need not: when its context outgrows its positions (its tokens are often
shorter than the target's; transformers' assisted generation crashes there with ``IndexError``),
it sees a sliding window (:func:`window_view`: the special prefix and the last ids, the cut
moving ``(positions - prefix) // 2`` ids at a time, so the cache is refilled once per that many
tokens). The drafter's law only has to be the law each draft is drawn from, so this keeps every
method lossless; :class:`hsd_torch.CoreModel` with ``window=True`` applies the same window for the
mirror.

Randomness. Row ``i`` draws from ``numpy.random.default_rng(SeedSequence(seed).spawn(n)[i])``
(the same for any batch size ``n``), and how many uniforms a round draws depends only on that
row's own state, so a row's output is a function of ``(seed, i, its prompt)`` alone. Per round a
row draws its drafting uniforms (one per possible draft), then its verification uniforms; the
uniforms it actually *consumes*, in the order ``hsd_core``'s method consumes them (drafts, then
what the kernel read: see :mod:`hsd_torch.kernels`), can be recorded (``record_uniforms=True``)
and replayed into ``hsd_core`` through :class:`hsd_core.rand.UniformRand` (the mirror test).
Every draw (inverse CDF, and argmax ties) reads a law's columns in ``hsd_core``'s order: ids
increasing with EOS moved last (the text space's order); with the tokenizer's order (EOS at id 2,
say) the same uniform would pick another token than the reference.

Multi-token SLRS (``max_tokens`` > 1 or None) runs only with the bounded procedure: the proposal is
the first ``min(max_tokens, budget)`` target ids read off the drafted text, position ``j`` verified
against psi conditioned on the first ``j`` (``hsd_core``'s ``PsiLaw.conditional``;
:meth:`hsd_torch.slrs.BoundedSLRS.round_multi`). Not implemented: SLRS's re-tokenizing proposal map
beyond lookahead 1 (issue 11; :mod:`hsd_torch.slrs`).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from . import kernels
from ._cache import IdentityCache
from .slrs import BoundedSLRS, slrs_options
from .text import TokenText
from .vocab import VocabBridge, _Push

__all__ = ["GenerateOutput", "RowStats", "generate", "process_logits", "retokenize"]

METHODS = ("ar", "sd", "tli", "slem", "slrs")


@dataclass
class RowStats:
    """What generating one prompt cost. Forward passes count the calls in which this row had a
    token to feed; ``*_positions`` the tokens it fed; ``*_recomputed`` the fed tokens whose
    position the model had computed before, with whatever id: the correction token at a rejected
    draft's position (the target), drafter tokens from the first one a re-sync changed onward, and
    the last id fed again for its logits when the cache already held the whole context. So
    ``positions - recomputed`` is the context length each model reached, and ``recomputed`` is
    what rollbacks cost. ``wall_time`` is the whole batch's time (seconds)."""

    target_calls: int = 0
    drafter_calls: int = 0
    proposed: int = 0
    accepted: int = 0
    new_tokens: int = 0
    target_positions: int = 0
    drafter_positions: int = 0
    target_recomputed: int = 0
    drafter_recomputed: int = 0
    wall_time: float = 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0


@dataclass
class GenerateOutput:
    """``sequences[i]``: the new target ids of prompt ``i`` (ending with EOS if it came);
    ``texts[i]``: their text (the tokens' bytes decoded as UTF-8, invalid bytes replaced);
    ``stats[i]``: :class:`RowStats`; ``uniforms[i]``: the uniforms row ``i`` consumed, in
    ``hsd_core``'s order (only with ``record_uniforms=True``, else ``None``)."""

    sequences: list[list[int]]
    texts: list[str]
    stats: list[RowStats]
    uniforms: list[list[float]] | None = None


# --------------------------------------------------------------------------------------------
# laws


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
    return _process(logits, ~text_mask.to(logits.device), temperature, top_k, top_p)


def _tempered_softmax(x: Tensor, temperature: float, top_k: int | None) -> Tensor:
    """``softmax`` of ``x [..., V]`` (compute dtype; removed ids already ``-inf`` or absent) divided
    by ``temperature``, keeping the ids whose logit is at least the k-th largest (ties kept)."""
    if temperature != 1.0:
        x = x / temperature
    if top_k is not None and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    return torch.softmax(x, dim=-1)


def _process(logits: Tensor, drop: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> Tensor:
    """:func:`process_logits` with the mask of removed ids given (``drop [V]`` on ``logits``'
    device): what ``generate`` calls at every step, without re-deriving the mask."""
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


# --------------------------------------------------------------------------------------------
# one model's batched cache


def _max_positions(config: Any) -> int | None:
    for name in ("n_positions", "max_position_embeddings"):
        v = getattr(config, name, None)
        if isinstance(v, int):
            return v
    return None


def _device(model: Any) -> torch.device:
    dev: torch.device = next(model.parameters()).device
    return dev


def _logit_width(model: Any) -> int:
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


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
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


class _Runner:
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
        self.device = _device(model)
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
        self.max_pos = _max_positions(model.config)
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
        m = _common_prefix(have, context)
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


# --------------------------------------------------------------------------------------------
# helpers shared by the methods


def retokenize(text_of: TokenText, ctx: Sequence[int], text: bytes, lookbehind: int) -> list[int]:
    """``hsd_core.methods.slem.retokenize`` over ids and bytes: for ``w`` from
    ``min(lookbehind, len(ctx))`` down to 0, encode the text of the last ``w`` ids of ``ctx``
    followed by ``text``; the first encoding that starts with exactly those ``w`` ids gives the
    candidates (the rest of it)."""
    for w in range(min(lookbehind, len(ctx)), -1, -1):
        tail = list(ctx[len(ctx) - w:])
        ids = text_of.encode(text_of.decode(tail) + text)
        if ids[:w] == tail:
            return ids[w:]
    raise AssertionError("unreachable: the empty look-behind always matches")


class _Space:
    """The columns ``generate``'s laws live on for one model: ``ids``, the model's ids a law may
    put mass on in ``hsd_core``'s order (ids with text increasing, then EOS: the mirror's core ids,
    :class:`hsd_torch.mirror.CoreTokenizer`; a TLI drafter's: the same ids, those it shares with
    the target first, :func:`_tli_columns`). ``pos[id]``: an id's column (-1: none).

    Laws over these columns need no permutation before a draw (the sampling order is the column
    order of the columns drawn from) and carry no columns of probability 0 by construction; :meth:`select` takes the columns
    out of a ``[..., V]`` tensor with one ``index_select`` (a slice when they are one run of ids:
    EOS last and every other id with text, e.g. GPT-2's)."""

    _cache: IdentityCache[_Space] = IdentityCache(32)

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
    def text(cls, text: TokenText, device: torch.device) -> _Space:
        """The text space of a model: every id with text, then EOS (built once per TokenText and device)."""
        def build() -> _Space:
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


def _space_law(logits: Tensor, space: _Space, drop: Tensor, temperature: float, top_k: int | None,
               top_p: float | None) -> Tensor:
    """The processed law of :func:`process_logits` at the columns of a model's text space
    (:meth:`_Space.text`, which holds every id the law may put mass on): ``[..., space.n]``, float64
    for float64 logits, else float32. Temperature and top-k act on those columns alone (the same
    law: the removed ids are ``-inf`` there); top-p, whose ties go to the lower id, runs on all
    ``V`` columns in id order first (``drop [V]``: the removed ids)."""
    if top_p is not None and top_p < 1.0:
        return space.select(_process(logits, drop, temperature, top_k, top_p))
    cdt = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = space.select(logits)
    return _tempered_softmax(x if x.dtype == cdt else x.to(cdt), temperature, top_k)


class FirstTargetMap:
    """SLRS at lookahead 1: drafter id -> the first target id of its text.

    ``first[d]``: for a drafter id with text, the first id of the target's encoding of that text
    alone (:meth:`TokenText.encode`, i.e. ``hsd_core``'s ``retokenize`` with look-behind 0, so the
    map does not depend on the context and is built once); the target's EOS for the drafter's EOS;
    -1 for ids without text (they never carry mass). psi, the law of the first target id of the
    draft's text, is the pushforward of the drafter's law along it (:class:`_Push`: the masses of
    all drafter ids with one first target id add up). Built with one batched tokenizer call over
    the ids whose text is valid UTF-8 and :meth:`TokenText.encode` for the rest (partial
    characters)."""

    _cache: IdentityCache[FirstTargetMap] = IdentityCache()

    def __init__(self, tt: TokenText, dt: TokenText) -> None:
        vd = dt.vocab_size
        first = [-1] * vd
        valid: list[int] = []
        texts: list[str] = []
        for d, b in enumerate(dt.bytes_of):
            if b is None:
                continue
            try:
                texts.append(b.decode("utf-8"))
                valid.append(d)
            except UnicodeDecodeError:
                first[d] = tt.encode(b)[0]
        if texts:
            enc = tt.tokenizer(texts, add_special_tokens=False)["input_ids"]
            for d, ids in zip(valid, enc):
                first[d] = int(ids[0])
        first[dt.eos_id] = tt.eos_id
        if any(not 0 <= f < tt.vocab_size or (tt.bytes_of[f] is None and f != tt.eos_id) for f in first if f >= 0):
            raise ValueError("a drafter token's text encodes to a target id without text")
        self.first: list[int] = first

    @classmethod
    def get(cls, tt: TokenText, dt: TokenText) -> FirstTargetMap:
        """The map for this pair of tokenizers (built once per pair and widths)."""
        return cls._cache.get((tt.tokenizer, dt.tokenizer), (tt.vocab_size, dt.vocab_size), lambda: cls(tt, dt))


_COLUMNS: IdentityCache[Any] = IdentityCache(16)


_TLIColumns = tuple[_Space, int, list[int], _Push, dict[int, list[int]]]


def _tli_columns(bridge: VocabBridge, tt: TokenText, dt: TokenText, t_space: _Space, d_space: _Space,
                 device: torch.device) -> _TLIColumns:
    """TLI's drafter space: the drafter's text space reordered so that its ``n`` ids in the
    intersection come first, in sampling order (increasing, EOS last: the columns TLI draws from,
    a slice of the law), then the others (they only normalize the processed law, which TLI
    restricts); the target columns of those ``n``, the pushforward of a law over them onto the
    target's columns (several drafter ids may share one string, hence one target id), and the memo
    of the re-sync's encodings of target tokens the drafter lacks (filled as they occur)."""
    def build() -> _TLIColumns:
        to_t = bridge.to_target_list
        ids = [d for d in d_space.ids if to_t[d] >= 0]  # EOS (last) maps to EOS
        space = _Space(ids + [d for d in d_space.ids if to_t[d] < 0], d_space.v, device)
        dst = [t_space.pos[to_t[d]] for d in ids]
        return space, len(ids), dst, _Push(dst, t_space.n, device), {}
    out: _TLIColumns = _COLUMNS.get((tt, dt, t_space, d_space), ("tli", str(device)), build)
    return out


def _slrs_columns(tt: TokenText, dt: TokenText, t_space: _Space, d_space: _Space,
                  device: torch.device) -> tuple[list[int], _Push]:
    """One-token SLRS: the target column of each drafter-space column's first target id
    (:class:`FirstTargetMap`) and psi, the pushforward of a drafter law along it."""
    def build() -> tuple[list[int], _Push]:
        first = FirstTargetMap.get(tt, dt).first
        dst = [t_space.pos[first[d]] for d in d_space.ids]
        return dst, _Push(dst, t_space.n, device)
    out: tuple[list[int], _Push] = _COLUMNS.get((tt, dt, t_space, d_space), ("slrs", str(device)), build)
    return out


def _bounded_slrs_round(bounded: BoundedSLRS, drun: _Runner, last: Tensor, active: Sequence[bool],
                        d_ctx: Sequence[Sequence[int]], d_uniforms: Sequence[Sequence[float]],
                        drafter_probs: Callable[[Tensor], Tensor], drafts_t: list[list[int]], n_d: list[int],
                        q_steps: list[Tensor], record: Callable[[int, Sequence[float]], None], greedy: bool,
                        vt: int, budget: Sequence[int]) -> list[int]:
    """One bounded SLRS round (:class:`hsd_torch.slrs.BoundedSLRS`) for the active rows, whose
    root contexts ``drun`` just fed (``last``: their logits): fills each row's proposal, its psi
    (multi-token: the conditional psi of each position) and the uniforms it read; returns the
    per-row draft counts for the generic drafting loop (zeros: nothing left to draft)."""
    from .slrs import TreeCache

    rows = [i for i, a in enumerate(active) if a]
    ridx = torch.tensor(rows, dtype=torch.long, device=last.device)
    tree = TreeCache(drun, rows, [d_ctx[i] for i in rows], bounded.k)
    if bounded.max_tokens != 1:
        mt = bounded.max_tokens
        multi = bounded.round_multi(
            drafter_probs(last.index_select(0, ridx)), None if greedy else [d_uniforms[i] for i in rows],
            lambda parent, tokens, node_row: drafter_probs(tree.extend(parent, tokens, node_row)),
            [budget[i] if mt is None else min(mt, budget[i]) for i in rows])
        for j in range(multi.conditionals.shape[1]):
            q_full = multi.conditionals.new_zeros(len(active), vt)
            q_full[ridx] = multi.conditionals[:, j]
            q_steps.append(q_full)
        for r, i in enumerate(rows):
            drafts_t[i].extend(multi.proposals[r])
            n_d[i] = len(multi.proposals[r])
            if not greedy:
                record(i, d_uniforms[i][:multi.used[r]])
        return [0] * len(active)
    res = bounded.round(drafter_probs(last.index_select(0, ridx)), None if greedy else [d_uniforms[i] for i in rows],
                        lambda parent, tokens, node_row: drafter_probs(tree.extend(parent, tokens, node_row)))
    q_full = res.psi.new_zeros(len(active), vt)
    q_full[ridx] = res.psi
    q_steps.append(q_full)
    for r, i in enumerate(rows):
        drafts_t[i].append(res.proposal[r])
        n_d[i] = 1
        if not greedy:
            record(i, d_uniforms[i][:res.used[r]])
    return [0] * len(active)


def _seed_sequence(seed: int | torch.Generator | None) -> np.random.SeedSequence:
    if isinstance(seed, torch.Generator):
        return np.random.SeedSequence(int(torch.randint(0, 2**62, (1,), generator=seed).item()))
    if seed is None:
        return np.random.SeedSequence()
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, a torch.Generator or None, got {seed!r}")
    return np.random.SeedSequence(int(seed))


# --------------------------------------------------------------------------------------------
# the API


@torch.inference_mode()
def generate(
    target: Any,
    drafter: Any = None,
    prompts: str | Sequence[str] = (),
    *,
    target_tokenizer: Any,
    drafter_tokenizer: Any = None,
    method: str = "tli",
    lookahead: int = 4,
    max_new_tokens: int = 64,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | torch.Generator | None = 0,
    drafter_temperature: float | None = None,
    record_uniforms: bool = False,
    lookbehind: int = 4,
    progress: Callable[[int], None] | None = None,
    min_path_prob: float | None = None,
    proposal_map: str | None = None,
    max_tokens: int | None = 1,
) -> GenerateOutput:
    """Generate continuations of ``prompts`` from ``target``, lossless for its processed law.

    ``target``, ``drafter``: Hugging Face causal LMs in eval mode on one device (``drafter`` may be
    None for ``method="ar"``); ``prompts``: a str or a list of str, encoded by each tokenizer with
    its own special prefix (a BOS; an empty prompt starts from the BOS) and no other special
    token. ``method`` in {"ar", "sd", "tli", "slem", "slrs"} (module docstring; "slrs" beyond
    ``lookahead=1`` needs ``proposal_map="longest_prefix"`` and ``min_path_prob``, the bounded
    procedure's probability stop; greedy needs no stop; ``max_tokens``: bounded SLRS's proposed target ids per
    round, verified against psi conditioned on the ones before, None: up to the budget); ``lookahead``: drafts
    per round; ``lookbehind``: SLEM's re-tokenization
    look-behind (SLRS uses 0); ``do_sample=False``: greedy (argmax, ties to the lowest id), no randomness;
    ``temperature``, ``top_k``, ``top_p``: the processing of both models' laws
    (:func:`process_logits`; ``drafter_temperature``, if given, replaces ``temperature`` for the
    drafter: its processing is free, the target's defines the law); ``seed``: an int, a ``torch.Generator`` (one int is drawn from it)
    or None (fresh entropy). ``record_uniforms=True`` fills ``GenerateOutput.uniforms``.
    ``progress``, if given, is called after every round with the number of rows that finished in
    it (for a progress bar).

    Returns :class:`GenerateOutput`. The models are never modified (no attribute, weight, config
    or generation config is written); everything runs under ``torch.inference_mode``.
    """
    t_start = time.perf_counter()
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if max_tokens != 1 and method != "slrs":
        raise ValueError(f"max_tokens is an option of method 'slrs', got max_tokens={max_tokens!r} with {method!r}")
    slrs_bounded = method == "slrs" and slrs_options(lookahead, min_path_prob, proposal_map, not do_sample,
                                                     max_tokens)
    if isinstance(prompts, str):
        prompts = [prompts]
    prompts = list(prompts)
    if not prompts or not all(isinstance(p, str) for p in prompts):
        raise TypeError("prompts must be a str or a non-empty list of str")
    if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 1:
        raise ValueError(f"lookahead must be an int >= 1, got {lookahead!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if isinstance(lookbehind, bool) or not isinstance(lookbehind, int) or lookbehind < 0:
        raise ValueError(f"lookbehind must be an int >= 0, got {lookbehind!r}")
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be True or False, got {do_sample!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be None or in (0, 1], got {top_p!r}")
    greedy = not do_sample
    for role, m in (("target", target), ("drafter", drafter)):
        if m is not None and getattr(m, "training", False):
            raise ValueError(f"the {role} is in training mode (dropout would make its law random); "
                             "call .eval() on it first (generate never changes the models itself)")
    needs_drafter = method != "ar"
    if needs_drafter and (drafter is None or drafter_tokenizer is None):
        raise ValueError(f"method {method!r} needs a drafter and a drafter_tokenizer")
    dev = _device(target)
    if needs_drafter and _device(drafter) != dev:
        raise ValueError(f"the target is on {dev} and the drafter on {_device(drafter)}: put both models on "
                         "one device")
    if drafter_temperature is not None and not drafter_temperature > 0:
        raise ValueError(f"drafter_temperature must be > 0, got {drafter_temperature!r}")
    process = {"temperature": float(temperature), "top_k": top_k, "top_p": top_p}
    d_process = dict(process, temperature=float(temperature if drafter_temperature is None else drafter_temperature))
    run = _Generation(target, drafter if needs_drafter else None, prompts, target_tokenizer, drafter_tokenizer,
                      method=method, lookahead=lookahead, max_new_tokens=max_new_tokens, greedy=greedy,
                      process=process, d_process=d_process, seed=seed, record_uniforms=record_uniforms,
                      lookbehind=lookbehind, slrs_bounded=slrs_bounded, min_path_prob=min_path_prob, max_tokens=max_tokens)
    while not all(run.finished):
        run.round(progress)
    return run.output(time.perf_counter() - t_start)


@dataclass
class _Drafts:
    """One round's proposals (:meth:`_Generation.draft`), per row ``i``: ``n[i]`` proposals,
    ``cols[i]`` their target columns (``t_space``); for SD, TLI and one-token SLRS ``laws[j]`` is
    the drafter law ``[B, N]`` the ``j``-th drafts were drawn from (TLI: over the intersection's
    columns, unnormalized) and ``mass[i][j]`` the mass that draw read (TLI: the normalizer); for
    bounded SLRS ``q_steps[j]`` is psi ``[B, Vt]`` over target ids at position ``j``."""

    n: list[int]
    cols: list[list[int]]
    laws: list[Tensor]
    mass: list[list[float]]
    q_steps: list[Tensor]

    @classmethod
    def empty(cls, batch: int) -> _Drafts:
        """No proposal yet for any of ``batch`` rows (AR's every round)."""
        return cls([0] * batch, [[] for _ in range(batch)], [], [[] for _ in range(batch)], [])


class _Generation:
    """One call of :func:`generate` (its arguments checked): the models' runners, the columns and
    maps of the method, the rows' contexts, randomness and statistics. :meth:`round` runs one round
    for every unfinished row in four phases: :meth:`draft` (the proposals), :meth:`verify` (one
    target pass and the kernels' decisions), :meth:`advance` (emitted tokens, the drafter's
    re-sync, finished rows), :meth:`settle_caches` (each cache kept to what stays valid)."""

    def __init__(self, target: Any, drafter: Any, prompts: list[str], target_tokenizer: Any, drafter_tokenizer: Any,
                 *, method: str, lookahead: int, max_new_tokens: int, greedy: bool, process: dict[str, Any],
                 d_process: dict[str, Any], seed: int | torch.Generator | None, record_uniforms: bool,
                 lookbehind: int, slrs_bounded: bool, min_path_prob: float | None, max_tokens: int | None) -> None:
        dev = self.dev = _device(target)
        self.method, self.lookahead, self.max_new_tokens, self.greedy = method, lookahead, max_new_tokens, greedy
        self.process, self.d_process, self.lookbehind = process, d_process, lookbehind
        vt = self.vt = _logit_width(target)
        tt = self.tt = TokenText.get(target_tokenizer, vt)
        self.t_drop = ~tt.text_mask.to(dev)
        batch = self.batch = len(prompts)
        self.prompt_bytes = [p.encode("utf-8") for p in prompts]
        self.t_first = [tt.start(p) for p in prompts]
        self.t_ctx = [self.t_first[i] + tt.encode(self.prompt_bytes[i]) for i in range(batch)]
        max_pos_t = _max_positions(target.config)
        if max_pos_t is not None:
            for i, ctx_i in enumerate(self.t_ctx):
                if len(ctx_i) + max_new_tokens > max_pos_t:
                    raise ValueError(
                        f"prompt {i} has {len(ctx_i)} target tokens; with max_new_tokens={max_new_tokens} the "
                        f"target's context could reach {len(ctx_i) + max_new_tokens} tokens, beyond its {max_pos_t} "
                        "positions (the target's law is defined only within them: lower max_new_tokens or shorten "
                        "the prompt)")
        self.emitted: list[list[int]] = [[] for _ in range(batch)]
        self.finished = [False] * batch
        self.stats = [RowStats() for _ in range(batch)]
        self.rngs = [np.random.default_rng(s) for s in _seed_sequence(seed).spawn(batch)]
        self.used: list[list[float]] | None = [[] for _ in range(batch)] if record_uniforms else None
        self.trun = _Runner(target, batch, tt.eos_id, "target")
        t_space = self.t_space = _Space.text(tt, dev)
        self.t_eos_col = t_space.n - 1  # EOS is the last column of every law over target columns
        self.dt: TokenText | None = None
        self.drun: _Runner | None = None
        self.bridge: VocabBridge | None = None
        self.d_ctx: list[list[int]] = []
        self.d_start: list[list[int]] = []
        self.bounded: BoundedSLRS | None = None
        self.d_drop: Tensor | None = None
        self.d_space: _Space | None = None  # the drafter's text space: its laws' columns
        self.draft_ids: list[int] = []  # drafting column -> drafter id
        self.draft_cols: list[int] = []  # drafting column -> the target column it proposes (sd, tli, slrs)
        self.n_draw = 0  # drafts come from the first n_draw columns of the drafter's space (TLI: the intersection)
        self.push: _Push | None = None  # TLI, SLRS: drafting columns -> target columns (q, psi)
        self.resync: dict[int, list[int]] = {}  # TLI: target id the drafter lacks -> the drafter's encoding of its text
        if drafter is None:
            return
        vd = _logit_width(drafter)
        dt = self.dt = TokenText.get(drafter_tokenizer, vd)
        bridge = self.bridge = VocabBridge(target_tokenizer, drafter_tokenizer, target_vocab_size=vt,
                                           drafter_vocab_size=vd, target_eos_id=tt.eos_id, drafter_eos_id=dt.eos_id,
                                           device=dev)
        if method == "sd" and not bridge.same_tokenizer:
            raise ValueError("method 'sd' needs the drafter to use the target's tokenizer (same ids, same "
                             "text); use 'tli' or 'slem' for different tokenizers")
        self.d_drop = ~dt.text_mask.to(dev)
        self.d_start = [dt.start(p) for p in prompts]
        self.d_ctx = [self.d_start[i] + dt.encode(self.prompt_bytes[i]) for i in range(batch)]
        self.drun = _Runner(drafter, batch, dt.eos_id, "drafter", window=True, n_prefix=[len(x) for x in self.d_start])
        d_space = self.d_space = _Space.text(dt, dev)
        self.draft_ids = d_space.ids
        self.n_draw = d_space.n
        if method == "sd":
            if d_space.ids != t_space.ids:  # pragma: no cover - same tokenizer, same ids with text
                raise AssertionError("the SD drafter's ids with text differ from the target's")
            self.draft_cols = list(range(d_space.n))
        elif method == "tli":
            self.d_space, self.n_draw, self.draft_cols, self.push, self.resync = _tli_columns(
                bridge, tt, dt, t_space, d_space, dev)
            self.draft_ids = self.d_space.ids[:self.n_draw]
        elif method == "slrs" and not slrs_bounded:
            self.draft_cols, self.push = _slrs_columns(tt, dt, t_space, d_space, dev)
        if method == "slrs" and slrs_bounded:
            self.bounded = BoundedSLRS(tt, dt, lookahead, min_path_prob, greedy, dev, max_tokens=max_tokens)

    def record(self, i: int, values: Sequence[float]) -> None:
        """Row ``i`` consumed these uniforms (kept with ``record_uniforms=True``)."""
        if self.used is not None:
            self.used[i].extend(float(v) for v in values)

    def drafter_probs(self, logits: Tensor) -> Tensor:
        """Bounded SLRS: the drafter's processed law over all its ids."""
        assert self.d_drop is not None
        return _process(logits, self.d_drop, **self.d_process)

    def round(self, progress: Callable[[int], None] | None) -> None:
        """One round: one target forward pass for every unfinished row."""
        active = [not f for f in self.finished]
        budget = [self.max_new_tokens - len(e) for e in self.emitted]
        drafts = self.draft(active, budget) if self.drun is not None else _Drafts.empty(self.batch)
        rows_pos, n_acc, read_u = self.verify(active, budget, drafts)
        self.advance(active, drafts.n, rows_pos, n_acc, read_u)
        if progress is not None:
            done = sum(1 for i in range(self.batch) if active[i] and self.finished[i])
            if done:
                progress(done)
        self.settle_caches(active)

    def draft(self, active: list[bool], budget: list[int]) -> _Drafts:
        """The drafting phase: the drafter's context of each active row re-synced and fed, then up
        to ``lookahead`` draws from its processed law (one drafter pass per draft position; bounded
        SLRS: its own procedure, :func:`_bounded_slrs_round`); SLEM's drafts re-tokenized for the
        target, bounded SLRS's proposals mapped to target columns."""
        batch, method, greedy, dev = self.batch, self.method, self.greedy, self.dev
        drun, dt, d_space, d_drop, tt = self.drun, self.dt, self.d_space, self.d_drop, self.tt
        assert drun is not None and dt is not None and d_space is not None and d_drop is not None
        rngs, draft_ids, draft_cols, n_draw = self.rngs, self.draft_ids, self.draft_cols, self.n_draw
        out = _Drafts.empty(batch)
        n_d, drafts_t, d_laws, d_mass = out.n, out.cols, out.laws, out.mass
        d_uniforms: list[list[float]] = [[] for _ in range(batch)]
        if method in ("slem", "slrs"):
            self.d_ctx = [self.d_start[i] + dt.encode(self.prompt_bytes[i] + tt.decode(self.emitted[i]))
                          if active[i] else self.d_ctx[i] for i in range(batch)]
            k = [self.lookahead if active[i] else 0 for i in range(batch)]
        else:
            k = [min(self.lookahead, budget[i]) if active[i] else 0 for i in range(batch)]
        d_ctx = self.d_ctx
        if not greedy:
            d_uniforms = [rngs[i].random(k[i]).tolist() if k[i] else [] for i in range(batch)]
            u_round: Tensor | None = None  # [max(k), B, 1] in the laws' dtype, made at the first draw
            u_steps: tuple[Tensor, ...] = ()  # its [B, 1] slices, one per draft position
        blocks = [drun.sync(i, d_ctx[i]) if active[i] else [] for i in range(batch)]
        still = [k[i] > 0 for i in range(batch)]
        drafts_d: list[list[int]] = [[] for _ in range(batch)]
        last = drun.feed(blocks, [len(b) - 1 for b in blocks], None)
        if self.bounded is not None:  # bounded SLRS (hsd_torch/slrs.py): psi level by level, drafting inside
            k = _bounded_slrs_round(self.bounded, drun, last, active, d_ctx, d_uniforms, self.drafter_probs, drafts_t,
                                    n_d, out.q_steps, self.record, greedy, self.vt, budget)
        for j in range(max(k)):
            rows = [i for i in range(batch) if still[i]]
            if not rows:
                break
            # the drafter's processed law over its text space (TLI: its first n_draw columns, the
            # intersection's, a view, not renormalized: a draw needs no normalization, and
            # verification divides by the mass read back here)
            law = _space_law(last, d_space, d_drop, **self.d_process)
            if n_draw < d_space.n:
                law = law[:, :n_draw]
            if not greedy and u_round is None:  # one host-to-device copy a round
                u_round = kernels._host_tensor(
                    [[[r[j] if j < len(r) else 0.0] for r in d_uniforms] for j in range(max(k))], law.dtype, dev)
                u_steps = u_round.unbind(0)
            ridx = None if len(rows) == batch else torch.tensor(rows, dtype=torch.long, device=dev)
            sub = law if ridx is None else law.index_select(0, ridx)
            if greedy:  # the argmax (ties to the first column) and its value, as the mass check
                picked, mass = kernels._argmax_host(sub)
            else:
                assert u_round is not None
                picked, mass = kernels._draw_host(sub, u_steps[j] if ridx is None else u_round[j, ridx])
            d_laws.append(law)
            for r, c, m in zip(rows, picked, mass):
                if not (0 < m < float("inf")):  # NaN, infinite or no mass on the columns drafted from
                    if method in ("sd", "slrs"):
                        raise ValueError(f"the drafter's law at row {r}, position {j} has NaN, infinite or no "
                                         "mass (NaN or infinite logits?): generation cannot go on")
                    still[r] = False  # TLI: no mass on the intersection; SLEM: no candidates; the target decodes
                    continue
                d = draft_ids[c]
                drafts_d[r].append(d)
                if method != "slem":
                    drafts_t[r].append(draft_cols[c])
                d_mass[r].append(m)
                n_d[r] += 1
                if not greedy:
                    self.record(r, d_uniforms[r][j:j + 1])
                if d == dt.eos_id or n_d[r] >= k[r]:
                    still[r] = False
            if not any(still):
                break
            blocks = [drun.sync(i, d_ctx[i] + drafts_d[i]) if still[i] else [] for i in range(batch)]
            last = drun.feed(blocks, [len(b) - 1 for b in blocks], None)
        t_pos = self.t_space.pos
        if method == "slem":
            for i in range(batch):
                if not active[i]:
                    continue
                ended = bool(drafts_d[i]) and drafts_d[i][-1] == dt.eos_id
                text = dt.decode(drafts_d[i])
                cands = retokenize(tt, self.t_ctx[i][len(self.t_first[i]):], text, self.lookbehind)
                if ended:
                    cands = cands + [tt.eos_id]
                drafts_t[i] = [t_pos[t] for t in cands[:budget[i]]]
                n_d[i] = len(drafts_t[i])
        elif self.bounded is not None:
            out.cols = [[t_pos[t] for t in row] for row in drafts_t]
        return out

    def verify(self, active: list[bool], budget: list[int], drafts: _Drafts
               ) -> tuple[list[list[int]], list[int], list[list[float]]]:
        """The target pass over each active row's pending context and proposals, and the kernels'
        decisions: per row the emitted target columns, the number of proposals accepted, and the
        verification uniforms the kernel read (in ``hsd_core``'s order)."""
        batch, greedy, rngs, trun, t_space = self.batch, self.greedy, self.rngs, self.trun, self.t_space
        n_d, drafts_t = drafts.n, drafts.cols
        pend = [trun.sync(i, self.t_ctx[i]) if active[i] else [] for i in range(batch)]
        kmax = max(n_d)
        p = _space_law(trun.feed([pend[i] + [t_space.ids[c] for c in drafts_t[i]] if active[i] else []
                                  for i in range(batch)],
                                 [len(pend[i]) - 1 for i in range(batch)], kmax + 1),
                       t_space, self.t_drop, **self.process)
        cand = [row + [0] * (kmax - len(row)) for row in drafts_t]  # target columns, padded
        bud = [max(b, 1) for b in budget]
        # The kernels run unchecked: their inputs are valid by construction (uniforms from numpy in
        # [0, 1), drafts and counts built here); each draft's law was checked where it was drawn
        # (its mass read back), and the kernels report a target law that is not one (`bad`: a NaN
        # softmax row shows in the draw from it, which every output read from such a row makes).
        read_u: list[list[float]] = []
        if self.method in ("ar", "slem"):
            uv_rows = None if greedy else [rngs[i].random(n_d[i] + 1).tolist() if active[i] else [] for i in range(batch)]
            rows_pos, n_acc_l, bad = kernels._exact_match_host(
                p, cand, n_d, None if uv_rows is None else [r + [0.0] * (kmax + 1 - len(r)) for r in uv_rows],
                eos_id=self.t_eos_col, budget=bud)
            if uv_rows is not None:
                read_u = [uv_rows[i][:len(r)] for i, r in enumerate(rows_pos)]
        else:
            q: Tensor | None = None
            if not greedy and kmax:
                if self.bounded is not None:
                    q = t_space.select(torch.stack(drafts.q_steps[:kmax], dim=1))
                else:
                    laws = torch.stack(drafts.laws[:kmax], dim=1)  # [B, kmax, N]
                    q = laws if self.push is None else self.push(laws)
            # one draw of n_d + 1 uniforms: the same stream as n_d for the drafts, then one for the final token
            u_ver = None if greedy else [rngs[i].random(n_d[i] + 1).tolist() if active[i] else [0.0] for i in range(batch)]
            ua_rows = None if u_ver is None else [r[:-1] for r in u_ver]
            uf_rows = None if u_ver is None else [r[-1] for r in u_ver]
            # TLI's laws are pushed unnormalized: each is divided by the mass its draw read (summed
            # left to right, as hsd_core normalizes), inside the kernel
            rows_pos, n_acc_l, bad = kernels._rejection_host(
                p, q, cand, n_d, None if ua_rows is None else [r + [0.0] * (kmax - len(r)) for r in ua_rows],
                uf_rows, eos_id=self.t_eos_col, budget=bud, q_scale=drafts.mass if self.method == "tli" else None)
            if ua_rows is not None and uf_rows is not None:
                for i, (na, row) in enumerate(zip(n_acc_l, rows_pos)):
                    ne = len(row)
                    tested = na + 1 if (ne > na and na < n_d[i]) else na
                    read_u.append(ua_rows[i][:tested] + ([uf_rows[i]] if ne > na else []))
        if bad is not None:  # rows not fed this round read zero logits: a uniform law, never bad
            raise ValueError(f"the target's law at row {bad[0]}, position {bad[1]} has NaN, infinite or no mass "
                             "(NaN or infinite logits?): generation cannot go on")
        return rows_pos, n_acc_l, read_u

    def advance(self, active: list[bool], n_d: list[int], rows_pos: list[list[int]], n_acc: list[int],
                read_u: list[list[float]]) -> None:
        """Each active row emits its tokens (target columns ``rows_pos``): contexts, statistics,
        recorded uniforms, finished rows, and the drafter's context re-synced (SD: the same ids;
        TLI: each target id's drafter id, else the drafter's encoding of its text)."""
        method, tt, t_ids = self.method, self.tt, self.t_space.ids
        emitted, d_ctx = self.emitted, self.d_ctx
        for i in range(self.batch):
            if not active[i]:
                continue
            out = [t_ids[c] for c in rows_pos[i]]
            if not self.greedy:
                self.record(i, read_u[i])
            emitted[i].extend(out)
            self.t_ctx[i].extend(out)
            st = self.stats[i]
            st.target_calls += 1
            if method != "ar":
                st.proposed += n_d[i]
                st.accepted += n_acc[i]
            if (out and out[-1] == tt.eos_id) or len(emitted[i]) >= self.max_new_tokens:
                self.finished[i] = True
            elif method == "sd":
                d_ctx[i].extend(out)
            elif method == "tli":
                assert self.bridge is not None and self.dt is not None
                to_d = self.bridge.to_drafter_list
                for t in out:
                    d = to_d[t]
                    if d >= 0:
                        d_ctx[i].append(d)
                    else:  # the drafter's encoding of the token's text (context-free: memoized per id)
                        ids = self.resync.get(t)
                        if ids is None:
                            b = tt.bytes_of[t]
                            assert b is not None
                            ids = self.resync[t] = self.dt.encode(b)
                        d_ctx[i].extend(ids)

    def settle_caches(self, active: list[bool]) -> None:
        """The target keeps exactly the verified context; the drafter what is still valid (SD, TLI:
        its re-synced context; SLEM and SLRS re-encode theirs at the next round); finished rows
        leave both caches; trailing columns no row keeps are cropped."""
        trun, drun = self.trun, self.drun
        for i in range(self.batch):
            if active[i]:
                trun.sync(i, self.t_ctx[i])
        trun.drop(self.finished)
        trun.trim()
        if drun is not None:
            for i in range(self.batch):
                if active[i] and not self.finished[i] and self.method not in ("slem", "slrs"):
                    drun.sync(i, self.d_ctx[i])
            drun.drop(self.finished)
            drun.trim()

    def output(self, wall: float) -> GenerateOutput:
        """The result, with every row's statistics (``wall``: the call's wall time)."""
        trun, drun = self.trun, self.drun
        for i, st in enumerate(self.stats):
            st.new_tokens = len(self.emitted[i])
            st.target_positions = trun.positions[i]
            st.target_recomputed = trun.recomputed[i]
            if drun is not None:
                st.drafter_calls = drun.calls[i]
                st.drafter_positions = drun.positions[i]
                st.drafter_recomputed = drun.recomputed[i]
            st.wall_time = wall
        texts = [self.tt.decode(e).decode("utf-8", errors="replace") for e in self.emitted]
        return GenerateOutput(self.emitted, texts, self.stats, self.used)
