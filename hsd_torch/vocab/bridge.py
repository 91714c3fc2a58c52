"""The drafter/target vocabulary bridge (the second half of :mod:`hsd_torch.vocab`; byte strings are
:mod:`hsd_torch.vocab.byte_strings`).

The bridge (:class:`VocabBridge`)
    The intersection of two vocabularies by byte string, as index tensors, with the two EOS ids
    corresponding; the pushforward of a drafter law to target ids (masses of drafter ids that
    share a string are **added**, in ascending drafter id, as ``hsd_core.methods.tli`` does); the
    restriction of a drafter law to the intersection. Everything is built once per tokenizer pair
    (cached) and its invariants are checked at build time.

Cost: building the bridge of two 150k-token vocabularies takes 0.5-1.0 s on this project's 2 busy
CPU cores after the tokenizers are loaded (``docs/vocab.md``); a cached pair takes milliseconds.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch

from .byte_strings import _BYTES_CACHE, TokenBytes, token_bytes
from .tokenizer_identity import _CACHE_SIZE, _STATES, tokenizer_state_cached

__all__ = ["Restricted", "VocabBridge", "clear_cache"]


class Restricted(NamedTuple):
    """A drafter law restricted to the intersection: ``law [..., Vd]`` (renormalized, all zeros
    where ``mass`` is 0) and ``mass [...]`` (the law's mass on the intersection before)."""

    law: torch.Tensor
    mass: torch.Tensor


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(f"VocabBridge invariant violated: {msg}")


def _resolve_eos(tokenizer: Any, given: int | None, size: int, who: str) -> int:
    eos = given if given is not None else getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError(
            f"the {who} tokenizer has no eos_token_id; pass {who}_eos_id= to VocabBridge")
    eos = int(eos)
    if not 0 <= eos < size:
        raise ValueError(f"{who} EOS id {eos} is outside the vocabulary of {size} ids")
    return eos


class _Push:
    """The pushforward of laws along a map of columns ``dst[c]`` (many to one allowed; ``-1``:
    column ``c`` is dropped) into ``n_out`` columns: ``x [..., len(dst)]`` -> ``[..., n_out]``, same
    dtype and device, the masses of the columns with one destination added in ascending source
    column (``hsd_core``'s order), destinations nothing maps to 0.

    On the CPU one ``index_add_`` does that (it adds the source columns one after another, in index
    order). On other devices ``index_add_`` adds duplicate destinations atomically, in any order,
    so there it runs once per multiplicity level (level ``r`` holds the ``r``-th source column of
    every destination: distinct destinations in each level), and the result is the same,
    deterministically. ``split``: force one way (False) or the other (True); None: by the device.

    :meth:`heads` pushes laws given by a few columns each (top-p's kept heads) without writing the
    source laws out: on the CPU the same bits as pushing the dense laws.
    """

    def __init__(self, dst: Sequence[int] | npt.NDArray[np.int64], n_out: int, device: torch.device,
                 split: bool | None = None) -> None:
        d = np.asarray(dst, dtype=np.int64).reshape(-1)
        bad = np.flatnonzero((d < -1) | (d >= n_out))
        if len(bad):
            c = int(bad[0])
            raise ValueError(f"column {c} maps to {int(d[c])}, outside [0, {n_out}) (and not -1, dropped)")
        self.n_in, self.n_out = len(d), n_out
        src = np.flatnonzero(d >= 0)
        tgt = d[src]
        order = np.argsort(tgt, kind="stable")  # by destination, ascending source column within one
        ts, cs = tgt[order], src[order]
        starts = np.r_[0, np.flatnonzero(np.diff(ts)) + 1] if len(ts) else np.zeros(0, dtype=np.int64)
        rank = np.arange(len(ts)) - np.repeat(starts, np.diff(np.r_[starts, len(ts)]))
        depth = int(rank.max()) + 1 if len(rank) else 0

        def put(a: npt.NDArray[np.int64]) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)

        self.levels: list[tuple[torch.Tensor | None, torch.Tensor]] = []
        # for heads(): each source column's destination, dropped and padding columns (n_in) sent to 0
        self._to = np.r_[np.where(d >= 0, d, 0), 0].astype(np.int64)
        self._kept = None if len(src) == len(d) else np.r_[d >= 0, False]
        self._head_maps: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
        if not (device.type != "cpu" if split is None else split) or depth <= 1:
            self.levels.append((None if len(src) == len(d) else put(src), put(tgt)))
            return
        for r in range(depth):
            at = rank == r
            by_src = np.argsort(cs[at], kind="stable")
            self.levels.append((put(cs[at][by_src]), put(ts[at][by_src])))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(lead.numel(), self.n_in)
        out = x2.new_zeros((x2.shape[0], self.n_out))
        for src, dst in self.levels:
            out.index_add_(1, dst, x2 if src is None else x2.index_select(1, src))
        return out.view(*lead, self.n_out)

    def heads(self, cols: torch.Tensor, vals: torch.Tensor) -> torch.Tensor:
        """The push of the laws ``x [..., n_in]`` that hold ``vals[..., i]`` at column ``cols[..., i]``
        and +0 at every other column: ``[..., n_out]``, the bits of ``self(x)``, from the entries alone.

        ``cols`` (int64) and ``vals`` (``>= +0``), both ``[..., h]``: each row's columns strictly
        increasing, then padding entries (column ``n_in``, value +0), as a
        :class:`hsd_torch.engine.kernels.HeadLaw`'s of ``n == n_in`` columns are.

        Why the same bits on the CPU: ``self(x)`` adds, into zeros, each destination's source columns
        one after another in ascending column order (``index_add_``), each addition rounded to the
        dtype. Here ``scatter_add_`` adds each row's entries one after another in their order, which is
        ascending column order; the columns it skips hold +0 in ``x``, and adding +0 to a value that is
        ``>= +0`` (every partial sum here) returns that value, so the partial sums of every destination,
        and its result, are the same. A padding entry (and an entry of a dropped column, set to +0)
        adds +0 to destination 0: no bit changes. Off the CPU ``scatter_add_`` adds duplicate
        destinations atomically, in any order: there the laws are written out and pushed by
        :meth:`__call__` (deterministic)."""
        if cols.shape != vals.shape or cols.dim() < 1:
            raise ValueError(f"heads need cols and vals of one shape [..., h], got {tuple(cols.shape)} and "
                             f"{tuple(vals.shape)}")
        lead, h = cols.shape[:-1], cols.shape[-1]
        c2, v2 = cols.reshape(-1, h), vals.reshape(-1, h)
        if cols.device.type != "cpu":
            dense = v2.new_zeros((c2.shape[0], self.n_in + 1)).scatter_add_(1, c2, v2)  # distinct columns a row
            return self(dense[:, :self.n_in]).view(*lead, self.n_out)
        key = str(cols.device)
        got = self._head_maps.get(key)
        if got is None:
            got = self._head_maps[key] = (torch.from_numpy(self._to).to(cols.device),
                                          None if self._kept is None else torch.from_numpy(self._kept).to(cols.device))
        to, kept = got
        dst = to.index_select(0, c2.reshape(-1)).view_as(c2)
        if kept is not None:  # a dropped column adds +0
            v2 = torch.where(kept.index_select(0, c2.reshape(-1)).view_as(c2), v2,
                             torch.zeros((), dtype=v2.dtype, device=v2.device))
        out = v2.new_zeros((c2.shape[0], self.n_out))
        return out.scatter_add_(1, dst, v2).view(*lead, self.n_out)


@dataclass(frozen=True)
class _Core:
    """Everything a bridge holds, on the CPU, built once per tokenizer pair."""

    target_bytes: TokenBytes
    drafter_bytes: TokenBytes
    target_eos_id: int
    drafter_eos_id: int
    to_target: torch.Tensor
    to_drafter: torch.Tensor
    drafter_ids: torch.Tensor
    target_ids: torch.Tensor
    shared: int
    same_tokenizer: bool
    build_seconds: float
    to_target_list: tuple[int, ...]  # the two maps as host tuples, for per-token lookups without a tensor op
    to_drafter_list: tuple[int, ...]
    pushes: dict[str, _Push] = field(default_factory=dict, compare=False)  # per device, built on first use


def _build_core(target: Any, drafter: Any, t_size: int | None, d_size: int | None,
                t_eos: int | None, d_eos: int | None, states: tuple[Any, Any] | None = None) -> _Core:
    t0 = time.perf_counter()
    tb = token_bytes(target, t_size, state=None if states is None else states[0])
    db = token_bytes(drafter, d_size, state=None if states is None else states[1])
    vt, vd = len(tb), len(db)
    te = _resolve_eos(target, t_eos, vt, "target")
    de = _resolve_eos(drafter, d_eos, vd, "drafter")
    tbl = list(tb.by_id)
    dbl = list(db.by_id)
    tbl[te] = None  # EOS is out of band whatever its text
    dbl[de] = None
    first_t = tb.written_ids((te,))
    first_d = db.written_ids((de,))
    to_t: npt.NDArray[np.int64] = np.fromiter(map(first_t.get, dbl, repeat(-1)), dtype=np.int64, count=vd)  # type: ignore[arg-type]
    to_d: npt.NDArray[np.int64] = np.fromiter(map(first_d.get, tbl, repeat(-1)), dtype=np.int64, count=vt)  # type: ignore[arg-type]
    to_t[de] = te
    to_d[te] = de
    d_ids = np.flatnonzero(to_t >= 0)
    t_ids = to_t[d_ids]
    shared = len(first_t.keys() & first_d.keys())

    # Invariants (checked, not assumed): EOS <-> EOS only; every mapped pair has equal bytes, in
    # both maps; the maps are mutually consistent (each lands on a written id, and a round trip from a
    # written id is that id); they cover exactly the shared strings.
    _check(to_t[de] == te and to_d[te] == de, "EOS must map to EOS")
    pair_bytes = [dbl[d] for d in d_ids.tolist()]
    _check(pair_bytes == [tbl[t] if t != te else None for t in t_ids.tolist()],
           "a mapped drafter/target pair differs in bytes")
    _check(pair_bytes.count(None) == 1, "only EOS may map without a byte string")
    mapped_t = np.flatnonzero(to_d >= 0)
    _check([tbl[t] for t in mapped_t.tolist()] == [dbl[d] if d != de else None for d in to_d[mapped_t].tolist()],
           "a target id and its drafter id differ in bytes")
    written_t = np.fromiter(first_t.values(), dtype=np.int64, count=len(first_t))
    written_d = np.fromiter(first_d.values(), dtype=np.int64, count=len(first_d))
    _check(bool(np.isin(to_d[mapped_t], np.r_[written_d, de]).all())
           and bool(np.isin(t_ids, np.r_[written_t, te]).all()), "a map lands on an id its tokenizer does not write")
    back_t = mapped_t[np.isin(mapped_t, np.r_[written_t, te])]
    back_d = d_ids[np.isin(d_ids, np.r_[written_d, de])]
    _check(bool((to_t[to_d[back_t]] == back_t).all()), "target -> drafter -> target moves a written target id")
    _check(bool((to_d[to_t[back_d]] == back_d).all()), "drafter -> target -> drafter moves a written drafter id")
    _check(len(mapped_t) == sum(map(first_d.__contains__, filter(None, tbl))) + 1,
           "target-to-drafter map misses or invents shared strings")
    _check(len(d_ids) == sum(map(first_t.__contains__, filter(None, dbl))) + 1,
           "drafter-to-target map misses or invents shared strings")

    n = max(vt, vd)
    pad_t = tb.by_id + (None,) * (n - vt)
    pad_d = db.by_id + (None,) * (n - vd)
    same = pad_t == pad_d and dict(tb.special) == dict(db.special) and te == de
    return _Core(tb, db, te, de, torch.from_numpy(to_t), torch.from_numpy(to_d),
                 torch.from_numpy(d_ids.astype(np.int64)), torch.from_numpy(t_ids.copy()),
                 shared, same, time.perf_counter() - t0, tuple(to_t.tolist()), tuple(to_d.tolist()))


_CORE_CACHE: OrderedDict[tuple[Any, ...], tuple[Any, Any, _Core]] = OrderedDict()


def clear_cache() -> None:
    """Forget every cached byte table, bridge and tokenizer state (and the tokenizers they keep alive)."""
    _BYTES_CACHE.clear()
    _CORE_CACHE.clear()
    _STATES.clear()


class VocabBridge:
    """The intersection of a target and a drafter vocabulary by exact byte string.

    Attributes (index tensors are ``torch.long`` on :attr:`device`):

    - ``target_bytes``, ``drafter_bytes``: :class:`TokenBytes` of ``Vt`` / ``Vd`` ids, where
      ``Vt = target_vocab_size`` (default: the tokenizer's largest id + 1) and likewise ``Vd``;
    - ``target_eos_id``, ``drafter_eos_id``: the EOS ids (default the tokenizers'
      ``eos_token_id``); EOS maps to EOS and has no byte string;
    - ``to_target [Vd]``: the target id with drafter id ``d``'s byte string that the target's
      tokenizer writes that string as (:meth:`TokenBytes.written_ids`: a piece before a byte fallback
      ``<0xNN>``, else the lowest id), ``-1`` if none;
    - ``to_drafter [Vt]``: likewise the drafter id the drafter's tokenizer writes target id ``t``'s
      byte string as, ``-1`` if none (the map that re-syncs the drafter's context from emitted target
      ids: a drafter fed ``<0x62>`` where its tokenizer writes ``b`` would see a context it was never
      trained on);
    - ``drafter_ids [M]``, ``target_ids [M]``: the mapped pairs, drafter ids ascending (EOS
      included), ``target_ids == to_target[drafter_ids]``;
    - ``shared``: the number of distinct byte strings in both vocabularies (EOS not counted);
    - ``same_tokenizer``: every id has the same byte string in both (ids past the shorter
      vocabulary count as ``None``), the same special ids and the same EOS; never decided by
      vocabulary size.

    Building is cached per (tokenizer objects, sizes, EOS ids); ``device`` places the index
    tensors (``.to(device)`` gives a copy elsewhere).
    """

    def __init__(self, target_tokenizer: Any, drafter_tokenizer: Any, *,
                 target_vocab_size: int | None = None, drafter_vocab_size: int | None = None,
                 target_eos_id: int | None = None, drafter_eos_id: int | None = None,
                 device: torch.device | str | None = None) -> None:
        key = (id(target_tokenizer), id(drafter_tokenizer), target_vocab_size, drafter_vocab_size,
               target_eos_id, drafter_eos_id)
        fps = (tokenizer_state_cached(target_tokenizer), tokenizer_state_cached(drafter_tokenizer))
        hit = _CORE_CACHE.get(key)
        if (hit is not None and hit[0][0] is target_tokenizer and hit[0][1] is drafter_tokenizer
                and hit[1] == fps):
            _CORE_CACHE.move_to_end(key)
            core = hit[2]
        else:
            core = _build_core(target_tokenizer, drafter_tokenizer, target_vocab_size,
                               drafter_vocab_size, target_eos_id, drafter_eos_id, fps)
            _CORE_CACHE[key] = ((target_tokenizer, drafter_tokenizer), fps, core)
            while len(_CORE_CACHE) > _CACHE_SIZE:
                _CORE_CACHE.popitem(last=False)
        self._core = core
        self._place(torch.device("cpu") if device is None else torch.device(device))

    def _place(self, device: torch.device) -> None:
        c = self._core
        self.to_target: torch.Tensor = c.to_target.to(device)
        self.device: torch.device = self.to_target.device  # e.g. cuda:0 for "cuda"
        self.to_drafter: torch.Tensor = c.to_drafter.to(device)
        self.drafter_ids: torch.Tensor = c.drafter_ids.to(device)
        self.target_ids: torch.Tensor = c.target_ids.to(device)
        self._mask: torch.Tensor = self.to_target >= 0
        self._outside: torch.Tensor = ~self._mask

    def to(self, device: torch.device | str) -> VocabBridge:
        """The same bridge with its index tensors on ``device`` (self if already there)."""
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev == self.device:
            return self
        out = object.__new__(VocabBridge)
        out._core = self._core
        out._place(dev)
        return out

    # plain attributes of the core
    @property
    def target_bytes(self) -> TokenBytes:
        return self._core.target_bytes

    @property
    def drafter_bytes(self) -> TokenBytes:
        return self._core.drafter_bytes

    @property
    def target_eos_id(self) -> int:
        return self._core.target_eos_id

    @property
    def drafter_eos_id(self) -> int:
        return self._core.drafter_eos_id

    @property
    def target_vocab_size(self) -> int:
        """``Vt``: the number of target ids (the width of target laws)."""
        return len(self._core.target_bytes)

    @property
    def drafter_vocab_size(self) -> int:
        """``Vd``: the number of drafter ids (the width of drafter laws)."""
        return len(self._core.drafter_bytes)

    @property
    def shared(self) -> int:
        return self._core.shared

    @property
    def same_tokenizer(self) -> bool:
        return self._core.same_tokenizer

    @property
    def build_seconds(self) -> float:
        """Wall time the (first, uncached) build of this pair took, tokenizer loading excluded."""
        return self._core.build_seconds

    def __repr__(self) -> str:
        return (f"VocabBridge(Vt={self.target_vocab_size}, Vd={self.drafter_vocab_size}, "
                f"shared={self.shared}, mapped_drafter_ids={len(self.drafter_ids)}, "
                f"same_tokenizer={self.same_tokenizer}, device={self.device})")

    def _check_law(self, q: torch.Tensor) -> None:
        if q.dim() < 1 or q.shape[-1] != self.drafter_vocab_size:
            raise ValueError(f"expected a drafter law [..., {self.drafter_vocab_size}], got {tuple(q.shape)}")
        if q.device != self.device:
            raise ValueError(f"law on {q.device} but the bridge's indices are on {self.device}; use .to()")

    def push(self, q_drafter: torch.Tensor) -> torch.Tensor:
        """The law over target ids of ``to_target[d]`` for ``d ~ q_drafter``.

        ``q_drafter [..., Vd]`` -> ``[..., Vt]``, same dtype and device. The masses of drafter ids
        sharing one byte string are added in ascending drafter id (:class:`_Push`: deterministic on
        every device); mass on unmapped ids is dropped.
        """
        self._check_law(q_drafter)
        key = str(self.device)
        push = self._core.pushes.get(key)
        if push is None:
            push = self._core.pushes[key] = _Push(self._core.to_target.numpy(), self.target_vocab_size, self.device)
        return push(q_drafter)

    @property
    def to_target_list(self) -> tuple[int, ...]:
        """``to_target`` as a host tuple (drafter id -> target id or -1)."""
        return self._core.to_target_list

    @property
    def to_drafter_list(self) -> tuple[int, ...]:
        """``to_drafter`` as a host tuple (target id -> drafter id or -1)."""
        return self._core.to_drafter_list

    def restrict(self, q: torch.Tensor) -> Restricted:
        """``q [..., Vd]`` zeroed outside the intersection (drafter ids with ``to_target >= 0``,
        EOS included) and renormalized, with the mass it had there.

        Returns ``Restricted(law [..., Vd], mass [...])`` in ``q``'s dtype and device (bfloat16 and
        float16 are summed in float32). A row with no mass on the intersection gets an all-zero law
        and mass 0, never NaN.
        """
        self._check_law(q)
        law, mass, _ = self._restricted(q)
        mass = mass.squeeze(-1)
        return Restricted(law if law.dtype == q.dtype else law.to(q.dtype),
                          mass if mass.dtype == q.dtype else mass.to(q.dtype))

    def _restricted(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`restrict` without the checks, in float32 or float64, for ``generate``'s drafting
        loop: ``(law [..., Vd], mass [..., 1], has [..., 1])`` with ``has = mass > 0`` (False for NaN)."""
        work = q if q.dtype in (torch.float32, torch.float64) else q.to(torch.float32)
        kept = work.masked_fill(self._outside, 0.0)
        mass = kept.sum(-1, keepdim=True)
        has = mass > 0  # no mass (or NaN): an all-zero law, never 0 / 0
        law = torch.where(has, kept.div_(torch.where(has, mass, 1.0)), 0.0)
        return law, mass, has
