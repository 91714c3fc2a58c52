"""Speculative generation over Hugging Face causal LMs: ``hsd_torch.generate``.

Methods (names as in :mod:`hsd_core.methods`; each round is one target forward pass):

- ``"ar"``: one token from the target's processed law per round.
- ``"sd"``: same-tokenizer speculative decoding: ``min(lookahead, budget)`` drafts from the
  drafter's processed law, verified by :func:`hsd_torch.kernels.rejection_verify`.
- ``"tli"``: token-level intersection: drafts from the drafter's processed law restricted to the
  intersection (:meth:`VocabBridge.restrict`), mapped by ``to_target``; each draft is verified
  against the pushforward (:meth:`VocabBridge.push`) of exactly the law it was drawn from.
  Drafting stops early where that law has no mass (a round with no draft is plain target
  decoding). The drafter's context is re-synced as ``hsd_core``'s TLI does: each emitted target
  id becomes ``to_drafter`` of it when the drafter has its text, else the drafter's encoding of
  its text (:meth:`TokenText.encode`).
- ``"slem"``: ``lookahead`` drafter tokens from its processed law; their text is re-tokenized for
  the target after its context (look-behind 4, :func:`retokenize`), the target's EOS appended if
  the drafter ended; :func:`hsd_torch.kernels.exact_match_verify`. The drafter's context is its
  encoding of (prompt + emitted text), recomputed every round.
- ``"slrs"`` at ``lookahead=1`` (default ``proposal_map``): the paper's one-token SLRS: one drafter token from its
  processed law (drafter context as SLEM's); the proposal is the first target id of the target's
  encoding of its text alone (``hsd_core``'s ``SLRS(lookahead=1, lookbehind=0)``: with no
  look-behind the map from drafter ids to first target ids is context-free, built once,
  :class:`FirstTargetMap`), the target's EOS for the drafter's EOS; verified by
  :func:`hsd_torch.kernels.rejection_verify` against psi(t) = the drafter's mass on the ids
  whose first target id is t (``index_add``: masses add).
  With ``proposal_map="longest_prefix"`` and ``min_path_prob=tau`` (any lookahead): the bounded
  SLRS of issue 11, ``hsd_core``'s ``SLRS(lookahead, min_path_prob=tau,
  proposal_map="longest_prefix")``, psi computed level by level with one batched drafter pass
  per level (:mod:`hsd_torch.slrs`); ``max_tokens=m`` (None: the budget) proposes up to m target ids
  per round. Deeper lookaheads without them are refused
  (``NotImplementedError``: psi would enumerate every drafter path).

The law every method is lossless for is the target's **processed** law (:func:`process_logits`):
ids without text other than EOS removed (special tokens, a padded embedding's extra ids),
then temperature, top-k, top-p. The drafter's laws are processed the same way.

How a batch runs. All rows advance together, one round per target forward pass. Each model has a
:class:`_Runner`: one ``DynamicCache`` for the batch and an attention mask (0/1) over its columns. A row's
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
increasing with EOS moved last (:class:`_EosLast`); with the tokenizer's order (EOS at id 2, say)
the same uniform would pick another token than the reference.

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from . import kernels
from ._cache import IdentityCache
from .slrs import BoundedSLRS, slrs_options
from .text import TokenText
from .vocab import VocabBridge

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


def _process(logits: Tensor, drop: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> Tensor:
    """:func:`process_logits` with the mask of removed ids given (``drop [V]`` on ``logits``'
    device): what ``generate`` calls at every step, without re-deriving the mask."""
    cdt = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = logits if logits.dtype == cdt else logits.to(cdt)
    v = x.shape[-1]
    x = x.masked_fill(drop, float("-inf"))
    if temperature != 1.0:
        x = x / temperature
    if top_k is not None and top_k < v:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
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


class _Runner:
    """A model, its batch cache and, per row, the ids it holds and the cache columns they sit in.

    Rows are the batch's rows (``0 .. batch-1``); ``live`` lists those still in the cache, in
    cache order (:meth:`drop` removes finished rows from the cache with
    ``DynamicCache.batch_select_indices``). With ``window`` set (the drafter), contexts longer
    than the model's positions are seen through :func:`window_view`; without it (the target),
    such a context raises ``ValueError``."""

    def __init__(self, model: Any, batch: int, pad_id: int, name: str, window: bool = False,
                 n_prefix: Sequence[int] = ()) -> None:
        from transformers import DynamicCache

        self.model = model
        self.name = name
        self.device = _device(model)
        self.cache = DynamicCache(config=model.config)
        self.mask = torch.zeros(batch, 0, dtype=torch.long, device=self.device)  # the attention mask, 1 = kept
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
        width_in = max(1, max(len(blocks[r]) for r in live))
        start = self.mask.shape[1]
        n_live = len(live)
        # one host-to-device copy for the ids, positions and new mask columns: [3, rows, width_in]
        toks: list[int] = []
        pos: list[int] = []
        valid: list[int] = []
        cap = (self.max_pos - 1) if self.max_pos is not None else None
        for i in live:
            b = blocks[i]
            n0 = len(self.ids[i])
            lb = len(b)
            if lb and self.max_pos is not None and n0 + lb > self.max_pos:
                raise ValueError(
                    f"the {self.name}'s context would grow to {n0 + lb} tokens, beyond its {self.max_pos} "
                    "positions; shorten the prompt or max_new_tokens")
            top = n0 + width_in
            pos.extend(range(n0, top) if cap is None or top <= cap + 1 else [min(p, cap) for p in range(n0, top)])
            if lb:
                row = [int(t) for t in b]
                toks.extend(row)
                self.calls[i] += 1
                self.positions[i] += lb
                self.recomputed[i] += max(0, min(self.high[i], n0 + lb) - n0)
                self.ids[i].extend(row)
                self.cols[i].extend(range(start, start + lb))
                self.high[i] = max(self.high[i], len(self.ids[i]))
            toks.extend([self.pad_id] * (width_in - lb))
            valid.extend([1] * lb + [0] * (width_in - lb))
        for i in range(self.batch):
            if blocks[i] and self.slot(i) < 0:
                raise AssertionError(f"row {i} was dropped from the {self.name}'s cache")
        dev = self.device
        ids_in, pos_in, new_mask = torch.tensor(toks + pos + valid, dtype=torch.long, device=dev).view(
            3, n_live, width_in).unbind(0)
        mask = torch.cat([self.mask, new_mask], dim=1)
        out = self.model(input_ids=ids_in, attention_mask=mask, position_ids=pos_in,
                         use_cache=True, **{self._cache_kw: self.cache})
        self.mask = mask
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
        if n_live == self.batch:
            return got
        full = got.new_zeros((self.batch, got.shape[-1]) if one else (self.batch, width, got.shape[-1]))
        full[torch.tensor(live, dtype=torch.long, device=dev)] = got
        return full

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
        m = 0
        n = min(nh, len(context))
        while m < n and have[m] == context[m]:
            m += 1
        if m == len(context) and m > 0:
            m -= 1
        if m < nh:
            drop = self.cols[i][m:]
            s = self.slot(i)
            if drop[-1] - drop[0] + 1 == len(drop):  # usually: a run of columns, cleared as a slice
                self.mask[s, drop[0]:drop[-1] + 1] = 0
            else:
                self.mask[s, torch.tensor(drop, dtype=torch.long, device=self.device)] = 0
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
        self.mask = self.mask.index_select(0, idx)
        self.live = [self.live[s] for s in keep]
        self._slot = {i: s for s, i in enumerate(self.live)}

    def trim(self) -> None:
        """Crop the trailing cache columns that no row in the cache keeps."""
        last = max((self.cols[i][-1] + 1 for i in self.live if self.cols[i]), default=0)
        n = self.mask.shape[1] - last
        if n > 0 and last > 0:
            self.cache.crop(-n)
            self.mask = self.mask[:, :last]


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


def _pad2(rows: Sequence[Sequence[float]], width: int, dev: torch.device) -> Tensor:
    out = np.zeros((len(rows), max(width, 0)), dtype=np.float64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r[:width]
    t = torch.from_numpy(out)
    return t if t.device == dev else t.to(dev)


def _fit_width(law: Tensor, v: int) -> Tensor:
    """A law over drafter ids as one over ``v`` target ids of the same tokenizer (SD): columns past
    the tokenizer carry no mass, so padding with zeros or cutting them changes nothing."""
    n = law.shape[-1]
    if n == v:
        return law
    if n > v:
        return law[..., :v]
    return torch.nn.functional.pad(law, (0, v - n))


class _EosLast:
    """The column order in which laws are sampled: the ids in increasing order with EOS moved to
    the end, which is ``hsd_core``'s order (its EOS is the last id). Inverse-CDF draws and argmax
    ties depend on the order, so the backend samples in this one (the mirror needs it)."""

    def __init__(self, eos: int, v: int, device: torch.device) -> None:
        self.eos, self.v = eos, v
        self.identity = eos == v - 1
        self.perm = torch.cat([torch.arange(eos), torch.arange(eos + 1, v), torch.tensor([eos])]).to(device)
        self.inverse = torch.argsort(self.perm)
        self.perm_list: list[int] = self.perm.tolist()  # the same maps on the host, for lists of ids
        self.inverse_list: list[int] = self.inverse.tolist()

    def law(self, x: Tensor) -> Tensor:
        """``x [..., V]`` with its columns in sampling order (``x`` itself when EOS is the last id)."""
        if self.identity:
            return x
        if x.dim() == 2 and x.shape[0] == 1:  # one row (a batch-1 draft): one index_select, 2-4x faster than the cat
            return x.index_select(1, self.perm)
        e = self.eos  # three slices and a cat: on the CPU, index_select over the last dim of several rows is far slower
        return torch.cat([x[..., :e], x[..., e + 1:], x[..., e:e + 1]], dim=-1)

    def draw(self, x: Tensor, u: Tensor | None) -> Tensor:
        """One id per row of ``x [R, V]`` (a law over ids), read in sampling order: the argmax
        (ties to the first in that order) when ``u`` is None, else the inverse-CDF draw with
        ``u [R]`` (:func:`hsd_torch.kernels.sample`, unchecked: a drafter's law only chooses
        proposals; the laws that decide what is emitted are checked where they are verified)."""
        return self.to_id(self._positions(x, u))

    def draw_ids(self, x: Tensor, u: Tensor | None) -> list[int]:
        """:meth:`draw` as a host list (the positions read back once, mapped to ids on the host)."""
        sel = self.law(x)
        pos: list[int] = torch.argmax(sel, dim=-1).tolist() if u is None else kernels._sample_list(sel, u)
        return pos if self.identity else [self.perm_list[c] for c in pos]

    def _positions(self, x: Tensor, u: Tensor | None) -> Tensor:
        sel = self.law(x)
        return torch.argmax(sel, dim=-1) if u is None else kernels.sample(sel, u, check=False)

    def to_id(self, c: Tensor) -> Tensor:
        """Sampling-order positions back to ids."""
        return c if self.identity else self.perm[c]


class FirstTargetMap:
    """SLRS at lookahead 1: drafter id -> the first target id of its text, and psi.

    ``ids [Vd]`` (long): for a drafter id with text, the first id of the target's encoding of that
    text alone (:meth:`TokenText.encode`, i.e. ``hsd_core``'s ``retokenize`` with look-behind 0,
    so the map does not depend on the context and is built once); the target's EOS for the
    drafter's EOS; 0 for ids without text (they never carry mass). :meth:`psi` pushes a drafter
    law through it with ``index_add`` (the masses of all drafter ids with the same first target
    id add up). Built with one batched tokenizer call over the ids whose text is valid UTF-8 and
    :meth:`TokenText.encode` for the rest (partial characters)."""

    _cache: IdentityCache[FirstTargetMap] = IdentityCache()

    def __init__(self, tt: TokenText, dt: TokenText, device: torch.device) -> None:
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
        has = torch.tensor([f >= 0 for f in first], dtype=torch.bool)
        if any(not 0 <= f < tt.vocab_size or (tt.bytes_of[f] is None and f != tt.eos_id) for f in first if f >= 0):
            raise ValueError("a drafter token's text encodes to a target id without text")
        self.ids = torch.tensor([max(f, 0) for f in first], dtype=torch.long, device=device)
        self.d_idx = torch.nonzero(has).flatten().to(device)
        self.t_idx = self.ids.index_select(0, self.d_idx)
        self.vt = tt.vocab_size

    @classmethod
    def get(cls, tt: TokenText, dt: TokenText, device: torch.device) -> FirstTargetMap:
        """The map for this pair of tokenizers (built once per pair, widths and device)."""
        return cls._cache.get((tt.tokenizer, dt.tokenizer), (tt.vocab_size, dt.vocab_size, str(device)),
                              lambda: cls(tt, dt, device))

    def psi(self, law: Tensor) -> Tensor:
        """``law [R, Vd]`` -> psi ``[R, Vt]``: the law of the first target id of the draft's text."""
        out = law.new_zeros((law.shape[0], self.vt))
        out.index_add_(1, self.t_idx, law.index_select(1, self.d_idx))
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


def _require_laws(x: Tensor, rows: Tensor | None, who: str) -> None:
    """Raise ``ValueError`` unless every row of ``x [B, P, V]`` (those where ``rows [B, P]`` is True,
    or all) has a finite positive total. ``x`` comes from softmax (and, for drafts, restriction
    and pushforward), so its entries are never negative: a NaN or infinite logit shows as a NaN
    total, a row with every id removed as a zero one. One reduction and its minimum and maximum
    read back (the masked form, for ``rows``, one more reduction)."""
    total = x.sum(-1)
    if rows is None:  # the usual case, two host reads: min > 0 fails on NaN and 0, max < inf on inf
        lo, hi = torch.aminmax(total)
        if float(lo) > 0 and float(hi) < float("inf"):
            return
    bad = ~(total > 0) | torch.isinf(total)
    if rows is not None:
        bad &= rows
    if bool(bad.any()):
        b, j = (int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(f"the {who}'s law at row {b}, position {j} has NaN, infinite or no mass "
                         "(NaN or infinite logits?): generation cannot go on")


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

    vt = _logit_width(target)
    tt = TokenText.get(target_tokenizer, vt)
    process = {"temperature": float(temperature), "top_k": top_k, "top_p": top_p}
    if drafter_temperature is not None and not drafter_temperature > 0:
        raise ValueError(f"drafter_temperature must be > 0, got {drafter_temperature!r}")
    d_process = dict(process, temperature=float(temperature if drafter_temperature is None else drafter_temperature))
    t_drop = ~tt.text_mask.to(dev)
    batch = len(prompts)
    prompt_bytes = [p.encode("utf-8") for p in prompts]
    t_first = [tt.start(p) for p in prompts]
    t_ctx = [t_first[i] + tt.encode(prompt_bytes[i]) for i in range(batch)]
    max_pos_t = _max_positions(target.config)
    if max_pos_t is not None:
        for i, c in enumerate(t_ctx):
            if len(c) + max_new_tokens > max_pos_t:
                raise ValueError(
                    f"prompt {i} has {len(c)} target tokens; with max_new_tokens={max_new_tokens} the target's "
                    f"context could reach {len(c) + max_new_tokens} tokens, beyond its {max_pos_t} positions "
                    "(the target's law is defined only within them: lower max_new_tokens or shorten the prompt)")
    emitted: list[list[int]] = [[] for _ in range(batch)]
    finished = [False] * batch
    stats = [RowStats() for _ in range(batch)]
    ss = _seed_sequence(seed)
    rngs = [np.random.default_rng(s) for s in ss.spawn(batch)]
    used: list[list[float]] | None = [[] for _ in range(batch)] if record_uniforms else None
    t_pad = tt.eos_id
    trun = _Runner(target, batch, t_pad, "target")

    dt: TokenText | None = None
    drun: _Runner | None = None
    bridge: VocabBridge | None = None
    d_ctx: list[list[int]] = []
    d_start: list[list[int]] = []
    first_t: FirstTargetMap | None = None
    bounded: BoundedSLRS | None = None
    d_drop: Tensor | None = None
    if needs_drafter:
        vd = _logit_width(drafter)
        dt = TokenText.get(drafter_tokenizer, vd)
        bridge = VocabBridge(target_tokenizer, drafter_tokenizer, target_vocab_size=vt, drafter_vocab_size=vd,
                             target_eos_id=tt.eos_id, drafter_eos_id=dt.eos_id, device=dev)
        if method == "sd" and not bridge.same_tokenizer:
            raise ValueError("method 'sd' needs the drafter to use the target's tokenizer (same ids, same "
                             "text); use 'tli' or 'slem' for different tokenizers")
        d_drop = ~dt.text_mask.to(dev)
        d_start = [dt.start(p) for p in prompts]
        d_ctx = [d_start[i] + dt.encode(prompt_bytes[i]) for i in range(batch)]
        drun = _Runner(drafter, batch, dt.eos_id, "drafter", window=True, n_prefix=[len(x) for x in d_start])
        d_order = _EosLast(dt.eos_id, vd, dev)
        to_target = bridge.to_target_list
        if method == "slrs":
            first_t = FirstTargetMap.get(tt, dt, dev)
            bounded = BoundedSLRS(tt, dt, lookahead, min_path_prob, greedy, dev,
                                  max_tokens=max_tokens) if slrs_bounded else None
    t_order = _EosLast(tt.eos_id, vt, dev)

    def record(i: int, values: Sequence[float]) -> None:
        if used is not None:
            used[i].extend(float(v) for v in values)

    def target_probs(logits: Tensor) -> Tensor:
        return _process(logits, t_drop, **process)  # type: ignore[arg-type]

    def drafter_probs(logits: Tensor) -> Tensor:
        assert d_drop is not None
        return _process(logits, d_drop, **d_process)  # type: ignore[arg-type]

    while not all(finished):
        active = [not f for f in finished]
        budget = [max_new_tokens - len(e) for e in emitted]
        # ---- drafting ------------------------------------------------------------------------
        n_d = [0] * batch
        drafts_t: list[list[int]] = [[] for _ in range(batch)]
        q_steps: list[Tensor] = []  # [B, Vt] per draft position: the law each draft was drawn from
        d_laws: list[Tensor] = []  # TLI: [B, Vd] per draft position, the restricted drafter law
        d_uniforms: list[list[float]] = [[] for _ in range(batch)]
        if method in ("sd", "tli", "slem", "slrs"):
            assert drun is not None and dt is not None and bridge is not None
            if method in ("slem", "slrs"):
                d_ctx = [d_start[i] + dt.encode(prompt_bytes[i] + tt.decode(emitted[i])) if active[i] else d_ctx[i]
                         for i in range(batch)]
                k = [lookahead if active[i] else 0 for i in range(batch)]
            else:
                k = [min(lookahead, budget[i]) if active[i] else 0 for i in range(batch)]
            if not greedy:
                d_uniforms = [list(rngs[i].random(k[i])) if k[i] else [] for i in range(batch)]
                u_round = _pad2(d_uniforms, max(k), dev)
            blocks = [drun.sync(i, d_ctx[i]) if active[i] else [] for i in range(batch)]
            still = [k[i] > 0 for i in range(batch)]
            drafts_d: list[list[int]] = [[] for _ in range(batch)]
            last = drun.feed(blocks, [len(b) - 1 for b in blocks], None)
            if bounded is not None:  # bounded SLRS (hsd_torch/slrs.py): psi level by level, drafting inside
                k = _bounded_slrs_round(bounded, drun, last, active, d_ctx, d_uniforms, drafter_probs, drafts_t,
                                        n_d, q_steps, record, greedy, vt, budget)
            for j in range(max(k)):
                probs = drafter_probs(last)  # [B, Vd]
                if method == "tli":
                    law, _, has = bridge._restricted(probs)
                    still = [s and h[0] for s, h in zip(still, has.tolist())]
                else:
                    law = probs
                if not greedy and u_round.dtype != law.dtype:
                    u_round = u_round.to(law.dtype)  # once a round, the conversion sample would make at every draw
                rows = [i for i in range(batch) if still[i]]
                if not rows:
                    break
                ridx = None if len(rows) == batch else torch.tensor(rows, dtype=torch.long, device=dev)
                picked_l = d_order.draw_ids(law if ridx is None else law.index_select(0, ridx),
                                            None if greedy else (u_round[:, j] if ridx is None else u_round[ridx, j]))
                if method == "tli":
                    d_laws.append(law)  # pushed onto target ids once per round, at verification
                    mapped = [to_target[d] for d in picked_l]
                elif method == "sd":
                    q_steps.append(_fit_width(law, vt))
                    mapped = picked_l
                elif method == "slrs":
                    assert first_t is not None
                    mapped_t = first_t.ids[torch.tensor(picked_l, dtype=torch.long, device=dev)]
                    if greedy:
                        psi = law.new_zeros(len(rows), vt)
                        psi.scatter_(1, mapped_t.unsqueeze(1), 1.0)
                    else:
                        psi = first_t.psi(law if ridx is None else law.index_select(0, ridx))
                    if ridx is None:
                        q_steps.append(psi)
                    else:
                        q_full = law.new_zeros(batch, vt)
                        q_full[ridx] = psi
                        q_steps.append(q_full)
                    mapped = mapped_t.tolist()
                else:
                    mapped = picked_l
                for r, d, t in zip(rows, picked_l, mapped):
                    drafts_d[r].append(int(d))
                    drafts_t[r].append(int(t))
                    n_d[r] += 1
                    record(r, d_uniforms[r][j:j + 1] if not greedy else [])
                    if d == dt.eos_id or n_d[r] >= k[r]:
                        still[r] = False
                if not any(still):
                    break
                blocks = [drun.sync(i, d_ctx[i] + drafts_d[i]) if still[i] else [] for i in range(batch)]
                last = drun.feed(blocks, [len(b) - 1 for b in blocks], None)
            if method == "slem":
                for i in range(batch):
                    if not active[i]:
                        continue
                    ended = bool(drafts_d[i]) and drafts_d[i][-1] == dt.eos_id
                    text = dt.decode(drafts_d[i])
                    cands = retokenize(tt, t_ctx[i][len(t_first[i]):], text, lookbehind)
                    if ended:
                        cands = cands + [tt.eos_id]
                    drafts_t[i] = cands[:budget[i]]
                    n_d[i] = len(drafts_t[i])
        # ---- target pass --------------------------------------------------------------------
        pend = [trun.sync(i, t_ctx[i]) if active[i] else [] for i in range(batch)]
        blocks = [pend[i] + drafts_t[i] if active[i] else [] for i in range(batch)]
        kmax = max(n_d)
        p = target_probs(trun.feed(blocks, [len(pend[i]) - 1 for i in range(batch)], kmax + 1))
        inv = t_order.inverse_list
        # one host-to-device copy: [n_drafts | budget | candidates in sampling order (0-padded)]
        packed = torch.tensor(n_d + [max(b, 1) for b in budget]
                              + [inv[t] for d in drafts_t for t in d + [0] * (kmax - len(d))],
                              dtype=torch.long, device=dev)
        n_drafts, budget_t = packed[:batch], packed[batch:2 * batch]
        cand = packed[2 * batch:].view(batch, kmax)
        p = t_order.law(p)
        _require_laws(p, None, "target")
        # The kernels run unchecked (check=False): their other inputs are valid by construction
        # (uniforms from numpy in [0, 1), drafts and counts built here), and the laws that decide
        # what is emitted, p and (below) q, are checked here, once per round.
        if method in ("ar", "slem"):
            if greedy:
                uv = torch.zeros(batch, kmax + 1, dtype=torch.float64, device=dev)
            else:
                uv_rows = [list(rngs[i].random(n_d[i] + 1)) if active[i] else [] for i in range(batch)]
                uv = _pad2(uv_rows, kmax + 1, dev)
            ver = kernels.exact_match_verify(p, cand, n_drafts, uv, greedy=greedy,
                                             eos_id=vt - 1, budget=budget_t, check=False)
            rows_pos, n_acc_l = ver.rows(), ver.accepted()
            n_emit_l = [len(r) for r in rows_pos]
            read_u = [] if greedy else [uv_rows[i][:n] for i, n in enumerate(n_emit_l)]
        else:
            if d_laws:
                assert bridge is not None
                q = bridge.push(torch.stack(d_laws, dim=1))
            else:
                q = torch.stack(q_steps, dim=1) if q_steps else p.new_zeros(batch, 0, p.shape[-1])
            q = q if q.dtype == p.dtype else q.to(p.dtype)
            if q.shape[1] < kmax:  # pragma: no cover - every draft position has its law
                raise AssertionError("missing draft laws")
            q = t_order.law(q if q.shape[1] == kmax else q[:, :kmax])
            if method != "tli":  # TLI drafts only where restrict found a positive (so finite) mass
                _require_laws(q, torch.arange(kmax, device=dev).unsqueeze(0) < n_drafts.unsqueeze(1), "drafter")
            if greedy:
                ua = torch.zeros(batch, kmax, dtype=torch.float64, device=dev)
                uf = torch.zeros(batch, dtype=torch.float64, device=dev)
            else:
                ua_rows = [list(rngs[i].random(n_d[i])) if active[i] else [] for i in range(batch)]
                uf_rows = [float(rngs[i].random()) if active[i] else 0.0 for i in range(batch)]
                u_all = _pad2([r + [0.0] * (kmax - len(r)) + [f] for r, f in zip(ua_rows, uf_rows)], kmax + 1, dev)
                ua, uf = u_all[:, :kmax], u_all[:, kmax]  # one host-to-device copy for both
            ver = kernels.rejection_verify(p, q, cand, n_drafts, ua, uf, greedy=greedy,
                                           eos_id=vt - 1, budget=budget_t, check=False)
            rows_pos, n_acc_l = ver.rows(), ver.accepted()
            n_emit_l = [len(r) for r in rows_pos]
            read_u = []
            if not greedy:
                for i, (na, ne) in enumerate(zip(n_acc_l, n_emit_l)):
                    tested = na + 1 if (ne > na and na < n_d[i]) else na
                    read_u.append(ua_rows[i][:tested] + ([uf_rows[i]] if ne > na else []))
        perm = t_order.perm_list
        rows_out = rows_pos if t_order.identity else [[perm[c] for c in r] for r in rows_pos]
        for i in range(batch):
            if not active[i]:
                continue
            out = rows_out[i]
            if not greedy:
                record(i, read_u[i])
            emitted[i].extend(out)
            t_ctx[i].extend(out)
            st = stats[i]
            st.target_calls += 1
            if method != "ar":
                st.proposed += n_d[i]
                st.accepted += n_acc_l[i]
            if (out and out[-1] == tt.eos_id) or len(emitted[i]) >= max_new_tokens:
                finished[i] = True
            elif method in ("sd", "tli"):
                assert bridge is not None and dt is not None
                if method == "sd":
                    d_ctx[i].extend(out)
                else:
                    to_d = bridge.to_drafter_list
                    for t in out:
                        d = to_d[t]
                        if d >= 0:
                            d_ctx[i].append(d)
                        else:
                            b = tt.bytes_of[t]
                            assert b is not None
                            d_ctx[i].extend(dt.encode(b))
        # the target keeps exactly the verified context; the drafter what is still valid
        for i in range(batch):
            if active[i]:
                trun.sync(i, t_ctx[i])
        if progress is not None:
            done = sum(1 for i in range(batch) if active[i] and finished[i])
            if done:
                progress(done)
        trun.drop(finished)
        trun.trim()
        if drun is not None:
            for i in range(batch):
                if active[i] and not finished[i] and method not in ("slem", "slrs"):
                    drun.sync(i, d_ctx[i])
            drun.drop(finished)
            drun.trim()
    wall = time.perf_counter() - t_start
    for i, st in enumerate(stats):
        st.new_tokens = len(emitted[i])
        st.target_positions = trun.positions[i]
        st.target_recomputed = trun.recomputed[i]
        if drun is not None:
            st.drafter_calls = drun.calls[i]
            st.drafter_positions = drun.positions[i]
            st.drafter_recomputed = drun.recomputed[i]
        st.wall_time = wall
    texts = [tt.decode(e).decode("utf-8", errors="replace") for e in emitted]
    return GenerateOutput(emitted, texts, stats, used)
