"""The draw kernels of :mod:`hsd_torch.engine.kernels` and the checks they share with the verification
kernels: inverse-CDF sampling (:func:`sample`, and the host-side :func:`_draw_host` and
:func:`_argmax_host` that ``generate`` calls; a rejection's correction on the support of a sparse law,
:func:`_residual_on_support`), the law and uniform checks, the compute dtype, the lazily processed
target law :class:`LazyLaw`, and the :class:`Verified` result type. Every name here is re-exported
from :mod:`hsd_torch.engine.kernels`, which documents the contract (same decisions as ``hsd_core`` on the same uniforms); callers go
through that module, so a name patched there is what they call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["HeadLaw", "LazyLaw", "Verified", "compute_dtype", "sample"]

_INF = float("inf")
_NAN = float("nan")


_NP = {torch.int64: np.int64, torch.float64: np.float64, torch.float32: np.float32}


def _host_tensor(data: Any, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``torch.tensor(data, dtype=dtype, device=device)`` for small nested lists of Python numbers,
    through NumPy (about twice as fast at a few elements, where the per-call cost is everything;
    floats are rounded to ``dtype`` as ``torch.tensor`` rounds them: to nearest). Tensors of other
    dtypes go through ``torch.tensor``."""
    nd = _NP.get(dtype)
    if nd is None:
        return torch.tensor(data, dtype=dtype, device=device)
    t = torch.from_numpy(np.array(data, dtype=nd))
    return t if device.type == "cpu" else t.to(device)


@dataclass(frozen=True)
class Verified:
    """What one verification step emitted, per row.

    ``tokens``: ``LongTensor[B, K+1]``, the emitted target ids left-aligned, padded with -1.
    ``n_accepted``: ``LongTensor[B]``, how many drafts (candidates) were kept as they were.
    ``n_emitted``: ``LongTensor[B]``, how many ids ``tokens`` holds: ``n_accepted`` plus one
    correction, mismatch or bonus token, or ``n_accepted`` alone when the row stopped on an
    accepted EOS or on its budget.
    """

    tokens: Tensor
    n_accepted: Tensor
    n_emitted: Tensor
    # the same, as the kernels computed them on the host: (rows(), n_accepted as a list)
    _host: tuple[list[list[int]], list[int]] | None = field(default=None, repr=False, compare=False)

    def rows(self) -> list[list[int]]:
        """The emitted ids of every row as Python lists (no device sync: the kernels decide on the host)."""
        if self._host is not None:
            return [list(r) for r in self._host[0]]
        toks = self.tokens.tolist()
        return [r[:n] for r, n in zip(toks, self.n_emitted.tolist())]

    def accepted(self) -> list[int]:
        """``n_accepted`` as a Python list (no device sync)."""
        if self._host is not None:
            return list(self._host[1])
        return [int(n) for n in self.n_accepted.tolist()]


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (float32, float16, bfloat16 inputs)."""
    for t in tensors:
        if not t.is_floating_point():
            raise TypeError(f"expected a floating-point tensor of probabilities, got {t.dtype}")
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _fail_if(cond: Tensor, message: str) -> None:
    if bool(cond.any()):
        raise ValueError(message)


def _check_uniforms(u: Tensor, name: str) -> None:
    if not u.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor of uniforms in [0, 1), got {u.dtype}")
    _fail_if(~((u >= 0) & (u < 1)), f"{name}: every uniform must lie in [0, 1)")


def _check_law_rows(law: Tensor, rows: Tensor | None, name: str) -> None:
    """Raise ``ValueError`` if a checked row of ``law [..., V]`` has a NaN, infinite or negative
    entry, or no mass. ``rows`` (bool, ``law.shape[:-1]``) selects the rows to check (None: all).
    Two read-only reductions per row, in the input dtype (sums accumulated in at least float32)."""
    total = law.sum(-1, dtype=torch.float64 if law.dtype == torch.float64 else torch.float32)
    bad = ~(law.amin(-1) >= 0) | ~torch.isfinite(total) | ~(total > 0)
    if rows is not None:
        bad = bad & rows
    if bool(bad.any()):
        where = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise ValueError(f"{name}: row {where} is not a law (NaN, infinite or negative entry, or no mass)")


def _searchsorted_draw(probs: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """``(idx [N, 1], total [N, 1])``: the first index ``i`` with ``u * cs[-1] < cs[i]`` (``cs =
    cumsum(probs)``, left to right), or ``V`` when rounding pushed ``u * cs[-1]`` to the total or
    past it; and ``cs[-1]``. ``u``: ``[N]`` or ``[N, 1]``."""
    cs = torch.cumsum(probs, dim=-1)
    tot = cs[:, -1:]
    ut = u if u.dim() == 2 else u.unsqueeze(-1)
    return torch.searchsorted(cs, (ut if ut.dtype == cs.dtype else ut.to(cs.dtype)) * tot, right=True), tot


def _last_positive(probs: Tensor, rows: Tensor) -> Tensor:
    """``[len(rows)]``: the last index of positive probability of those rows of ``probs [N, V]``."""
    pos = probs.index_select(0, rows) > 0
    return (probs.shape[-1] - 1) - torch.argmax(torch.flip(pos, dims=[-1]).to(torch.uint8), dim=-1)


def _inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """Unchecked inverse-CDF draw: ``probs [N, V]`` (non-negative, compute dtype), ``u [N]``."""
    idx = _searchsorted_draw(probs, u)[0].squeeze(-1)
    past = idx >= probs.shape[-1]
    if bool(past.any()):  # rounding pushed u * total to the total: the last index of positive probability
        rows = torch.nonzero(past).squeeze(-1)
        idx = idx.index_put((rows,), _last_positive(probs, rows))
    return idx


def _draw_host(probs: Tensor, u: list[float] | Tensor, cols: Tensor | None = None) -> tuple[list[int], list[float]]:
    """:func:`_inverse_cdf` read back to the host, with each row's total mass: draws from the rows
    of ``probs [R, N]`` (non-negative, need not be normalized; float32 or float64) with ``u`` (a
    host list of ``R`` uniforms, or a tensor ``[R]`` or ``[R, 1]``). A total that is not finite and
    positive says the row was not a law (its draw is meaningless). The rounding case (an index past
    the last column) is found on the host and replaced by the row's last index of positive
    probability, as :func:`sample` does. ``cols [R, N]`` (int64, optional): the drawn index ``i`` of
    row ``r`` is returned as ``cols[r, i]`` (a :class:`HeadLaw`'s columns: :meth:`LazyLaw.draw`)."""
    ut = u if isinstance(u, Tensor) else _host_tensor([[x] for x in u], probs.dtype, probs.device)
    idx_t, tot = _searchsorted_draw(probs, ut)
    idx = [r[0] for r in idx_t.tolist()]
    past = [i for i, x in enumerate(idx) if x >= probs.shape[-1]]
    if past:
        fixed = _last_positive(probs, torch.tensor(past, dtype=torch.int64, device=probs.device)).tolist()
        for i, f in zip(past, fixed):
            idx[i] = f
    if cols is not None:
        idx = cols.gather(1, _host_tensor([[i] for i in idx], torch.int64, probs.device)).squeeze(1).tolist()
    return idx, [r[0] for r in tot.tolist()]


def sample(probs: Tensor, u: Tensor, *, check: bool = True) -> Tensor:
    """Inverse-CDF draws: ``LongTensor[B]``, row ``b`` drawn from ``probs[b]`` with ``u[b]``.

    ``probs [B, V]`` holds non-negative weights (need not sum to 1; computed in
    :func:`compute_dtype`), ``u [B]`` uniforms in [0, 1). The result is the index ``i`` with
    ``cdf(i-1) <= u * total < cdf(i)``, never an index of probability zero; when rounding pushes
    ``u * total`` past the last partial sum it is the last index of positive probability. Same rule,
    and in float64 on the CPU the same result, as :func:`hsd_core.rand.inverse_cdf`.
    Raises ``ValueError`` for a row with a NaN, infinite or negative entry or no mass, or a uniform
    outside [0, 1).
    """
    if probs.dim() != 2 or u.dim() != 1 or u.shape[0] != probs.shape[0]:
        raise ValueError(f"sample needs probs [B, V] and u [B], got {tuple(probs.shape)} and {tuple(u.shape)}")
    if probs.shape[1] == 0:
        raise ValueError("sample: empty vocabulary")
    pr = probs if probs.dtype in (torch.float32, torch.float64) else probs.to(compute_dtype(probs))
    if check:
        _check_uniforms(u, "u")
        _check_law_rows(pr, None, "probs")
    return _inverse_cdf(pr, u if u.device == pr.device else u.to(pr.device))


def _argmax_host(probs: Tensor) -> tuple[list[int], list[float]]:
    """The argmax of every row of ``probs [R, N]`` (ties to the first column) and its value, read back."""
    top, arg = torch.max(probs, dim=-1)
    ids: list[int] = arg.tolist()
    vals: list[float] = top.tolist()
    return ids, vals


def _rows_at(x: Tensor, rows: list[int], pos: list[int]) -> Tensor:
    """``x[rows[i], pos[i]]`` for ``x [B, P, V]``: ``[len(rows), V]``, a fresh buffer holding only those rows."""
    p = x.shape[1]
    idx = torch.tensor([r * p + j for r, j in zip(rows, pos)], dtype=torch.int64, device=x.device)
    if x.is_contiguous():
        return x.reshape(-1, x.shape[-1]).index_select(0, idx)
    return x.flatten(0, 1).index_select(0, idx)


@dataclass(frozen=True)
class HeadLaw:
    """Laws ``[..., n]`` given by the few columns they put mass on (top-p's kept head): row ``r``
    holds ``vals[r, i]`` at column ``cols[r, i]`` and +0 at every other column.

    ``cols [..., h]`` (int64): each row's columns in strictly increasing order, then padding
    entries, whose column is ``n`` and whose value is +0; ``vals [..., h]`` (the laws' dtype, every
    entry ``>= +0``). Built by :func:`hsd_torch.engine.laws.space_head_law` where top-p's
    boundary is strict on every row; :meth:`dense` is :func:`hsd_torch.engine.laws.space_law`'s
    tensor of the same logits, bit for bit (it adds these values, and nothing else, into zeros)."""

    cols: Tensor
    vals: Tensor
    n: int

    def dense(self, out: Tensor | None = None) -> Tensor:
        """The laws ``[..., n]`` (into ``out``, zeroed first, if given): +0 everywhere, then each value
        added at its column (a padding entry adds +0 to column ``n - 1``, which changes no bit)."""
        out = (torch.zeros((*self.vals.shape[:-1], self.n), dtype=self.vals.dtype, device=self.vals.device)
               if out is None else out.zero_())
        return out.scatter_add_(-1, self.cols.clamp(max=self.n - 1), self.vals)

    def prefix(self, n: int) -> HeadLaw:
        """The laws at the first ``n`` columns alone (``dense()[..., :n]``, not renormalized; ``1 <= n
        <= self.n``): each entry at a column ``>= n`` becomes a padding entry (column ``n``, value +0),
        so the columns stay in increasing order and a draw cannot reach past ``n``."""
        if not 1 <= n <= self.n:
            raise ValueError(f"a prefix of a law over {self.n} columns needs 1 <= n <= {self.n}, got {n}")
        if n == self.n:
            return self
        inside = self.cols < n
        return HeadLaw(torch.where(inside, self.cols, torch.full_like(self.cols, n)),
                       torch.where(inside, self.vals, torch.zeros((), dtype=self.vals.dtype, device=self.vals.device)),
                       n)

    def at_rows(self, rows: Sequence[int], batch: int) -> HeadLaw:
        """These laws ``[R, n]`` (``R = len(rows)``) as rows ``rows`` of a batch of ``batch`` laws: row
        ``rows[i]`` is row ``i`` here, every other row only padding entries (the zero law, which a
        caller must not read as a law). ``rows``: distinct, in ``[0, batch)``."""
        if self.vals.dim() != 2 or len(rows) != self.vals.shape[0]:
            raise ValueError(f"at_rows needs laws [R, h] and R rows, got {tuple(self.vals.shape)} and {len(rows)} rows")
        if list(rows) == list(range(batch)):
            return self
        idx = torch.tensor(list(rows), dtype=torch.int64, device=self.cols.device)
        h = self.cols.shape[-1]
        cols = self.cols.new_full((batch, h), self.n).index_copy_(0, idx, self.cols)
        return HeadLaw(cols, self.vals.new_zeros((batch, h)).index_copy_(0, idx, self.vals), self.n)


class LazyLaw:
    """The laws ``p [B, P, N]`` of a verification, each row ``p[b, j]`` computed when a decision
    first reads it: ``process`` maps a block of source rows ``[R, W]`` (a model's logits at those
    positions) to their laws ``[R, N]`` (a tensor, or a :class:`HeadLaw`: the same laws given by
    their kept heads), or, without ``process``, ``source [B, P, N]`` holds the laws themselves. The
    verifiers read positions in order and stop at a row's first rejection or mismatch, so a round
    processes only the positions it reads (with top-p, the softmax and sorted head of a 262,144-id
    law cost about a millisecond a position). Each law row is a function of its own source row alone
    (``process`` acts row by row: softmax, top-k, top-p), so the laws, and every decision, are the
    bits that processing the whole ``[B, P]`` at once gives.

    ``dtype``: the laws' dtype (``process``: float64 for float64 sources, else float32, as
    :func:`hsd_torch.engine.laws.process_logits`); ``lazy[b, j]``: one row ``[N]``. ``sparse``: a hint
    that the laws put their mass on few columns (top-k or top-p processing), so that a residual is
    cheaper taken on a row's support than over all ``N`` columns (:func:`_final_tokens`); it changes
    no decision, only where the arithmetic runs. A :class:`HeadLaw` block is written out densely
    (once) only when :meth:`rows` reads it; :meth:`draw`, :meth:`at_columns` and a rejection's residual
    (:meth:`head`) read it as it is, on the CPU."""

    def __init__(self, source: Tensor, process: Callable[[Tensor], Tensor | HeadLaw] | None = None, *,
                 sparse: bool = False) -> None:
        if source.dim() != 3:
            raise ValueError(f"a law source must be [B, P, N], got {tuple(source.shape)}")
        self.source, self.process, self.sparse = source, process, sparse
        self.batch, self.positions = source.shape[0], source.shape[1]
        self.device = source.device
        self.dtype = source.dtype if process is None else (
            torch.float64 if source.dtype == torch.float64 else torch.float32)
        self._at: dict[tuple[int, int], tuple[int, int]] = {}  # (b, j) -> (block, row in it)
        self._blocks: list[Tensor | HeadLaw] = []

    def _load(self, pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """``(block, row in it)`` of each of ``pairs``; the positions not yet read are processed together, once."""
        missing = list(dict.fromkeys(pr for pr in pairs if pr not in self._at))
        if missing:
            block = _rows_at(self.source, [b for b, _ in missing], [j for _, j in missing])
            law = block if self.process is None else self.process(block)
            n = len(self._blocks)
            self._blocks.append(law)
            for r, pr in enumerate(missing):
                self._at[pr] = (n, r)
        return [self._at[pr] for pr in pairs]

    def _dense(self, a: int) -> Tensor:
        """Block ``a`` as a tensor ``[R, N]`` (a :class:`HeadLaw` written out, once)."""
        blk = self._blocks[a]
        if isinstance(blk, HeadLaw):
            blk = blk.dense()
            self._blocks[a] = blk
        return blk

    def rows(self, pairs: Sequence[tuple[int, int]]) -> Tensor:
        """The laws at ``pairs`` ((row, position) each): ``[len(pairs), N]``, a fresh buffer; the
        positions not yet read are processed together, once."""
        where = self._load(pairs)
        first = where[0][0]
        if all(w[0] == first for w in where):
            return self._dense(first).index_select(
                0, torch.tensor([w[1] for w in where], dtype=torch.int64, device=self.device))
        out = self._dense(first).new_empty((len(where), self._dense(first).shape[-1]))
        for a in sorted({w[0] for w in where}):  # one gather and one scatter a block, not one copy a row
            at = [(i, r) for i, (b, r) in enumerate(where) if b == a]
            out.index_copy_(0, torch.tensor([i for i, _ in at], dtype=torch.int64, device=self.device),
                            self._dense(a).index_select(
                                0, torch.tensor([r for _, r in at], dtype=torch.int64, device=self.device)))
        return out

    def head(self, pairs: Sequence[tuple[int, int]]) -> tuple[Tensor, Tensor] | None:
        """``(vals, cols)``, each ``[len(pairs), h]``: the kept heads of the laws at ``pairs``
        (:class:`HeadLaw`'s entries, in increasing column order, then padding), where every pair
        lies in one :class:`HeadLaw` block on the CPU (the predicate of every evaluation on the heads:
        :meth:`draw`, :meth:`at_columns`, a rejection's residual); else None (the rows are dense)."""
        where = self._load(pairs)
        a = where[0][0]
        blk = self._blocks[a]
        if not (isinstance(blk, HeadLaw) and self.device.type == "cpu" and all(w[0] == a for w in where)):
            return None
        idx = [w[1] for w in where]
        if idx == list(range(blk.vals.shape[0])):
            return blk.vals, blk.cols
        sel = torch.tensor(idx, dtype=torch.int64, device=self.device)
        return blk.vals.index_select(0, sel), blk.cols.index_select(0, sel)

    def draw(self, pairs: Sequence[tuple[int, int]], u: list[float], dtype: torch.dtype | None = None
             ) -> tuple[list[int], list[float]]:
        """:func:`_draw_host` of the laws at ``pairs`` with ``u`` (one uniform each), in ``dtype``
        (default: float64 for float64 laws, else float32): the drawn columns and each law's total mass.

        On the kept heads alone where :meth:`head` gives them (their values in column order, the
        columns mapped back), with the same result, bit for bit, as on the dense rows: the CPU's
        cumulative sum adds left to right in a wider accumulator (double, for float32 and float64
        alike) and rounds each partial sum to the dtype; a +0 leaves the accumulator as it was, so
        the dense row's partial sum at a head column is the head's partial sum there, and its last
        partial sum (the total, by which the uniform is scaled) is the head's last. The first partial
        sum above ``u * total`` is one where the accumulator grew, at a column of positive value, so a
        head column, the same in both; when rounding puts ``u * total`` at or past the total, both
        take the last column of positive value. Off the CPU (a scan adds in another order) the dense
        rows decide."""
        got = self.head(pairs)
        if got is not None:
            vals, cols = got
            cdt = dtype or (torch.float64 if vals.dtype == torch.float64 else torch.float32)
            return _draw_host(vals if vals.dtype == cdt else vals.to(cdt), u, cols)
        at = self.rows(pairs)
        cdt = dtype or (torch.float64 if at.dtype == torch.float64 else torch.float32)
        return _draw_host(at if at.dtype == cdt else at.to(cdt), u)

    def at_columns(self, pairs: Sequence[tuple[int, int]], cols: list[int]) -> list[float]:
        """The laws' values ``p[b, j, cols[i]]`` at ``pairs[i] = (b, j)``, in the laws' dtype: read
        from the kept heads where :meth:`head` gives them (the entry at that column, or +0 where
        the column is not kept: the dense row's value, which is that entry), else from the dense rows."""
        x = _host_tensor([[c] for c in cols], torch.int64, self.device)
        got = self.head(pairs)
        if got is None:
            out: list[float] = self.rows(pairs).gather(1, x).squeeze(1).tolist()
            return out
        vals, hcols = got  # a row's kept columns are distinct: one entry at most, the others add +0
        out = torch.where(hcols == x, vals, torch.zeros((), dtype=vals.dtype, device=vals.device)).sum(-1).tolist()
        return out

    def __getitem__(self, at: tuple[int, int]) -> Tensor:
        return self.rows([at])[0]


def _residual_on_support(law: Tensor, q_row: Tensor, scale: float | None, cdt: torch.dtype, u: float,
                         cols: Tensor | None = None) -> tuple[list[int], list[float]] | None:
    """The correction drawn with ``u`` from ``norm(max(p - q / scale, 0))`` for one row (``law [N]`` in
    ``cdt``, ``q_row [N]``), computed on the support of ``p`` only: ``([id], [total])`` as
    :func:`_draw_host` gives it on the whole row, bit for bit, or None where that support is not
    small (a quarter of the columns or more) or the residual has no mass (the caller's dense path
    then decides, as before). ``cols [h]`` (optional): ``law [h]`` holds the values of ``p`` at those
    columns only (a :class:`HeadLaw` row: increasing columns, then padding entries of value +0), every
    positive value of ``p`` among them; its positive entries are then the support, as ``nonzero``
    finds it on the whole row.

    The same bits because the residual is +0 off the support (``max(0 - q, 0)`` with ``q >= 0``) and
    the CPU's cumulative sum (the mass, then the draw's) adds left to right in a wider accumulator
    rounded at each step, to which a +0 adds nothing: the support's partial sums, in column order,
    are the whole row's at those columns, and the first partial sum above ``u * total`` is at the
    same column. Off the CPU (another order of addition) it declines."""
    if law.device.type != "cpu":
        return None
    if cols is None:
        cols = law.nonzero().squeeze(-1)
        on = law.index_select(0, cols)
    else:
        pos = law > 0
        cols, on = cols[pos], law[pos]
    if 4 * cols.numel() >= q_row.shape[-1] or cols.numel() == 0:
        return None
    qs = q_row.index_select(0, cols)
    qs = qs if qs.dtype == cdt else qs.to(cdt)
    if scale is not None:
        qs = qs / scale
    diff = torch.sub(on, qs).clamp_(min=0).unsqueeze(0)  # max(p - q, 0) on the support
    mass = torch.cumsum(diff, dim=-1)[:, -1:]  # left to right, as the reference sums
    if not 0 < float(mass) < _INF:
        return None
    (i,), tot = _draw_host(diff.div_(mass), [u])
    return [int(cols[i])], tot
