"""The departures a sequence audit states its power against, and what each test would see of them.

For every position of the power subsample (a seeded subsample of the audited positions; the
module docstring of :mod:`hsd_core.seqaudit`, "The promise"), :class:`Alternatives` adds, for each
named departure (the mixture toward the drafter on the :data:`LAMBDAS` grid, a temperature off by
each factor of :data:`TEMPERATURE_FACTORS`, one token fewer, one token more), the ingredients of
each test's power under it: the PIT's bin masses, the mean and variance of the log-likelihood
martingale's and of the directional statistic's steps, the log-probability of never drawing a
token of probability 0, and the TV it amounts to. :mod:`hsd_core.stats.seqpower` turns them into
the power statement.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["LAMBDAS", "TEMPERATURE_FACTORS", "Alternatives"]

F64 = NDArray[np.float64]

LAMBDAS: F64 = np.geomspace(1e-3, 1.0, 25)
"""The grid of mixture weights toward the drafter at which the power is evaluated."""

TEMPERATURE_FACTORS: F64 = np.exp(np.geomspace(0.002, 1.4, 16))
"""The grid of temperature factors ``f`` (both ``x f`` and ``/ f``; ``log f`` geometric from 0.002 to
1.4, ratio 1.55 from one to the next, so it is fine near 1) at which the power is evaluated: each
point costs a pass over every audited law of the power subsample (the mixture family's grid costs
nothing per point: it is linear in lambda), so the stated factor is the grid point at or above the
smallest detectable one, at most one step (x 1.55 in ``log f``) conservative."""

_POWER_CHUNK = 4_000_000  # entries of the [positions, alternatives, ids] array of one power chunk


class Alternatives:
    """Per-step ingredients of the power of each test under each departure, summed over the steps
    of the power subsample (module docstring). ``pend`` keeps picked positions, which are added in
    batches (:meth:`flush`)."""

    def __init__(self, *, drafter: bool, extra: bool, bins: int) -> None:
        names: list[tuple[str, float]] = []
        if drafter:
            names += [("mixture", float(lam)) for lam in LAMBDAS]
        names += [("hotter", float(f)) for f in TEMPERATURE_FACTORS]
        names += [("colder", float(f)) for f in TEMPERATURE_FACTORS]
        names.append(("one fewer", 1.0))
        if extra:
            names.append(("one more", 1.0))
        self.names = names
        self.n_bins = bins
        a = len(names)
        self.steps = 0
        self.bins = np.zeros((a, bins))
        self.ll_mu = np.zeros(a)
        self.ll_var = np.zeros(a)
        self.dir_mu = np.zeros(a)
        self.dir_var = np.zeros(a)
        self.log_keep = np.zeros(a)
        self.tv = np.zeros(a)
        self.null_ll_var = 0.0
        self.null_dir_var = 0.0
        self._pending: list[tuple[F64, F64 | None, F64 | None, F64 | None]] = []  # picked rows not yet added

    def index(self, family: str) -> list[int]:
        return [i for i, (f, _) in enumerate(self.names) if f == family]

    def pend(self, p: F64, q: F64 | None, w: F64 | None, extra: F64 | None) -> None:
        """Keep picked positions (rows of ``p``, every column) to add later; add them once they make
        :data:`_POWER_CHUNK` entries."""
        self._pending.append((p, q, w, extra))
        if sum(r[0].shape[0] for r in self._pending) * p.shape[1] * len(self.names) >= _POWER_CHUNK:
            self.flush()

    def flush(self) -> None:
        """Add the picked positions kept so far (sequences' few picks are batched: one vectorized pass
        per :data:`_POWER_CHUNK` entries rather than per sequence)."""
        if not self._pending:
            return
        cat = [np.concatenate([r[i] for r in self._pending]) if self._pending[0][i] is not None else None
               for i in range(4)]
        self._pending = []
        p, q, w, e = cat
        assert p is not None
        width = int((p > 0).sum(axis=1).max())  # the largest support met
        chunk = max(1, _POWER_CHUNK // (len(self.names) * width))
        for c0 in range(0, p.shape[0], chunk):
            sl = slice(c0, c0 + chunk)
            self._power_rows(p[sl], None if q is None else q[sl], None if w is None else w[sl],
                             None if e is None else e[sl])

    def _power_rows(self, p: F64, q: F64 | None, w: F64 | None, extra: F64 | None) -> None:
        """Add the power ingredients of ``m`` positions (rows of ``p``): every
        alternative law over each row's ids sorted by decreasing ``p`` (ties by id), its mass
        outside ``p``'s support (drawn there, it is a draw of probability 0), and what each test
        sees of it. The mixture family is linear in lambda: its ingredients are those of its two
        ends (``p`` and ``q`` on ``p``'s support) combined per row, exactly (:meth:`_mixture_rows`)."""
        alt = self
        m = p.shape[0]
        rows = np.arange(m)[:, None]
        order = np.argsort(-p, axis=1, kind="stable")
        order = order[:, :int((p > 0).sum(axis=1).max())]  # every alternative lives on p's support
        ps = p[rows, order]
        pos = ps > 0
        s = pos.sum(axis=1)
        with np.errstate(divide="ignore"):
            logp = np.where(pos, np.log(np.where(pos, ps, 1.0)), 0.0)
        gen = [i for i, (fam, _) in enumerate(alt.names) if fam != "mixture"]
        mix = [i for i, (fam, _) in enumerate(alt.names) if fam == "mixture"]
        g_n = len(gen)
        cond, keep, tv, qs = self._laws(ps, pos, s, logp, None if q is None else q[rows, order], extra, gen, mix)
        bins = self._pit_bins(ps, s, cond)  # [m, A, k]
        ws = None if w is None else w[rows, order]
        fs = [logp, logp ** 2] + ([] if ws is None else [ws, ws ** 2])
        mom = np.matmul(cond, np.stack(fs, axis=2))  # [m, A, f]: E_cond of log p, its square (and w, w^2)
        m1, m2 = mom[:, :, 0], mom[:, :, 1]
        h = -(ps * logp).sum(axis=1)
        alt.bins[gen] += bins[:, :g_n].sum(axis=0)
        alt.ll_mu[gen] += (m1[:, :g_n] + h[:, None]).sum(axis=0)
        alt.ll_var[gen] += np.clip(m2[:, :g_n] - m1[:, :g_n] ** 2, 0.0, None).sum(axis=0)
        alt.null_ll_var += float(np.clip((ps * logp ** 2).sum(axis=1) - h ** 2, 0.0, None).sum())
        d1 = d2 = ew = None
        if ws is not None:
            ew = (ps * ws).sum(axis=1)
            d1, d2 = mom[:, :, 2], mom[:, :, 3]
            alt.dir_mu[gen] += (d1[:, :g_n] - ew[:, None]).sum(axis=0)
            alt.dir_var[gen] += np.clip(d2[:, :g_n] - d1[:, :g_n] ** 2, 0.0, None).sum(axis=0)
            alt.null_dir_var += float(np.clip((ps * ws ** 2).sum(axis=1) - ew ** 2, 0.0, None).sum())
        with np.errstate(divide="ignore"):
            alt.log_keep[gen] += np.log(keep[:, :g_n]).sum(axis=0)
        alt.tv[gen] += tv.sum(axis=0)
        if mix:
            assert qs is not None
            lam = np.array([alt.names[i][1] for i in mix])
            self._mixture_rows(mix, lam, ps, qs, h, bins[:, g_n:], m1[:, g_n:], m2[:, g_n:],
                               None if d1 is None or d2 is None or ew is None else (d1[:, g_n:], d2[:, g_n:], ew))
        alt.steps += m

    def _laws(self, ps: F64, pos: NDArray[np.bool_], s: NDArray[np.int64], logp: F64, q_sorted: F64 | None,
              extra: F64 | None, gen: list[int], mix: list[int]) -> tuple[F64, F64, F64, F64 | None]:
        """Each alternative's law on ``p``'s support (rows sorted as ``ps``) given that it draws there
        (``cond [m, A, V]``; the mixture: its two ends, ``p`` and ``q``'s part on ``p``'s support,
        after the others), the probability ``keep [m, A]`` that it draws there, the TV ``[m, G]`` of
        the other alternatives, and ``qs``, ``q`` on ``p``'s support (None without a drafter)."""
        alt = self
        m = ps.shape[0]
        g_n = len(gen)
        # every alternative's law on p's support, written into one [m, A, V] array (the mixture: its two
        # ends, p and q's part on p's support, after the others) and its mass off that support
        r = np.empty((m, g_n + (2 if mix else 0), ps.shape[1]))
        im = np.zeros((m, r.shape[1]))
        full = bool(pos.all())
        rel = logp - logp[:, :1]  # log(p / max p) (column 0: ps is sorted)
        z = np.empty_like(rel)
        for k, i in enumerate(gen):  # one [m, V] block at a time: it stays in cache, no page-faulting temporaries
            fam, f = alt.names[i]
            if fam in ("hotter", "colder"):  # p^(1/f) or p^f over p's support
                (np.divide if fam == "hotter" else np.multiply)(rel, f, out=z)
                np.exp(z, out=z)
                if not full:
                    z *= pos
                np.divide(z, z.sum(axis=1, keepdims=True), out=r[:, k])
        for k, i in enumerate(gen):
            fam = alt.names[i][0]
            if fam == "one fewer":
                rr = ps.copy()
                cut = s >= 2
                rr[np.flatnonzero(cut), s[cut] - 1] = 0.0
                r[:, k] = rr / rr.sum(axis=1, keepdims=True)
            elif fam == "one more":
                assert extra is not None
                r[:, k] = (1 - extra)[:, None] * ps
                im[:, k] = extra
        qs = None
        if mix:
            assert q_sorted is not None
            qs = np.where(pos, q_sorted, 0.0)
            r[:, g_n], r[:, g_n + 1] = ps, qs
        keep = np.clip(1.0 - im, 0.0, 1.0)
        tv = 0.5 * (np.stack([np.abs(r[:, k] - ps).sum(axis=1) for k in range(g_n)], axis=1) + im[:, :g_n])  # [m, G]
        off = np.flatnonzero((im > 0).any(axis=0))  # only these alternatives put mass off p's support
        r[:, off] /= np.where(keep[:, off] > 0, keep[:, off], 1.0)[:, :, None]
        return r, keep, tv, qs

    def _pit_bins(self, ps: F64, s: NDArray[np.int64], cond: F64) -> F64:
        """The bin masses ``[m, A, k]`` of the PIT under each alternative: its density on token x's
        interval is cond(x) / p(x)."""
        m = ps.shape[0]
        r = cond
        cum = np.cumsum(ps, axis=1)
        edges = np.linspace(0.0, 1.0, self.n_bins + 1)
        j = np.minimum(np.stack([np.searchsorted(c, edges) for c in cum]), (s - 1)[:, None])  # [m, k + 1]: ids below
        pj = np.take_along_axis(ps, j, axis=1)
        frac = np.clip((edges[None, :] - (np.take_along_axis(cum, j, axis=1) - pj)) / pj, 0.0, 1.0)
        below = (np.arange(ps.shape[1])[None, :, None] < j[:, None, :]).astype(np.float64)  # [m, V, k + 1]
        jj = np.broadcast_to(j[:, None, :], (m, r.shape[1], j.shape[1]))
        cj = np.take_along_axis(cond, jj, axis=2)
        gb = np.matmul(cond, below) + cj * frac[:, None, :]  # the mass below each edge
        gb[:, :, 0] = 0.0
        gb[:, :, -1] = cond.sum(axis=2)
        out: F64 = np.diff(gb, axis=2)
        return out

    def _mixture_rows(self, idx: list[int], lam: F64, ps: F64, qs: F64, h: F64, bins: F64, m1: F64, m2: F64,
                      directional: tuple[F64, F64, F64] | None) -> None:
        """The mixture family's ingredients at ``lam`` from those of its ends (index 0: ``ps``, 1:
        ``qs``, ``q`` on ``p``'s support; per row): the alternative ``(1 - lam) p + lam q`` keeps
        ``keep = 1 - lam (1 - sum qs)`` on ``p``'s support and its conditional law there is
        ``((1 - lam) ps + lam qs) / keep``, so every expectation under it (bin masses, the moments of
        ``log p`` and of the directional weight) is the same combination of the ends' expectations."""
        alt = self
        out = np.clip(1.0 - qs.sum(axis=1), 0.0, None)  # q's mass off p's support: a draw of probability 0
        keep = np.clip(1.0 - lam[None, :] * out[:, None], 0.0, 1.0)  # [m, M]
        den = np.where(keep > 0, keep, 1.0)
        a0, a1 = (1.0 - lam)[None, :] / den, lam[None, :] / den
        alt.bins[idx] += np.einsum("mk,ma->ak", bins[:, 0], a0) + np.einsum("mk,ma->ak", bins[:, 1], a1)
        mu1 = a0 * m1[:, :1] + a1 * m1[:, 1:2]
        mu2 = a0 * m2[:, :1] + a1 * m2[:, 1:2]
        alt.ll_mu[idx] += (mu1 + h[:, None]).sum(axis=0)
        alt.ll_var[idx] += np.clip(mu2 - mu1 ** 2, 0.0, None).sum(axis=0)
        if directional is not None:
            d1, d2, ew = directional
            e1 = a0 * d1[:, :1] + a1 * d1[:, 1:2]
            e2 = a0 * d2[:, :1] + a1 * d2[:, 1:2]
            alt.dir_mu[idx] += (e1 - ew[:, None]).sum(axis=0)
            alt.dir_var[idx] += np.clip(e2 - e1 ** 2, 0.0, None).sum(axis=0)
        with np.errstate(divide="ignore"):
            alt.log_keep[idx] += np.log(keep).sum(axis=0)
        alt.tv[idx] += 0.5 * lam * (np.abs(qs - ps).sum(axis=1) + out).sum()
