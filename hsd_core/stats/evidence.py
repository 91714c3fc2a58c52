"""The evidence of a sequence audit, accumulated token by token (:class:`SequenceEvidence`).

Each audited position adds its randomized PIT, its steps of the log-likelihood martingale and of
the directional statistics (toward the drafter, toward each named context bug), its first token to
its prompt's first-token test, and, when it has probability 0, an exact-check failure; a seeded
subsample of the positions feeds the power statement (:mod:`hsd_core.stats.alternatives`). The
statistics are described in the module docstring of :mod:`hsd_core.seqaudit`;
:meth:`SequenceEvidence.report` runs the tests (:mod:`hsd_core.stats.seqtests`), states the power
(:mod:`hsd_core.stats.seqpower`) and gives the verdict (:func:`hsd_core.stats.decide`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from ..context_bugs import AimedStats
from .alternatives import Alternatives
from .checks import _check_alpha, _check_power
from .family import TestFamily
from .seqpower import PowerStatement
from .seqreport import DEFAULT_BINS, SequenceAuditReport
from .seqtests import first_groups, planned, run_tests, sequence_verdict

__all__ = ["DEFAULT_POSITIONS", "DEFAULT_POWER_STEPS", "SequenceEvidence"]

F64 = NDArray[np.float64]

DEFAULT_POSITIONS = 4
"""How many first positions get a PIT test of their own."""

DEFAULT_POWER_STEPS = 500
"""Positions (at most, a seeded subsample) on which the power is computed: an unbiased estimate of
the per-token averages; ``tests/stats/test_audit_sequences.py`` checks the statement made with
this default by simulation."""


class SequenceEvidence:
    """The evidence of a sequence audit, fed step by step (module docstring of :mod:`hsd_core.seqaudit`).

    ``add_steps`` takes ``m`` audited positions at once: ``p [m, V]`` the target's conditional laws
    (float64, rows summing to 1), ``x [m]`` the sampled ids, ``pos [m]`` their positions (0 = first
    new token), ``v [m]`` the PIT uniforms, ``seq [m]`` the sequence of each; optionally ``q [m, V]``
    the drafter's laws on target ids and ``extra [m]`` the probability a law with one token more
    would give that token. ``report`` runs the family and states the power.
    """

    def __init__(self, *, alpha: float = 1e-3, power: float = 0.99, bins: int = DEFAULT_BINS,
                 positions: int = DEFAULT_POSITIONS, seed: int = 0, drafter: bool = False, extra: bool = False,
                 do_sample: bool = True, power_steps: int = DEFAULT_POWER_STEPS, expected_steps: int = 1,
                 aimed: Sequence[str] = ()) -> None:
        self.alpha = _check_alpha(alpha)
        self.power = _check_power(power)
        if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 2:
            raise ValueError(f"bins must be an integer >= 2, got {bins!r}")
        if isinstance(positions, bool) or not isinstance(positions, (int, np.integer)) or positions < 0:
            raise ValueError(f"positions must be an integer >= 0, got {positions!r}")
        self.bins, self.positions, self.seed = int(bins), int(positions), int(seed)
        self.drafter, self.extra, self.do_sample = drafter, extra, do_sample
        self.rho = min(1.0, power_steps / max(1, expected_steps))
        self._pick = np.random.default_rng(np.random.SeedSequence([self.seed, 2]))
        self.u: list[F64] = []
        self.u_pos: list[NDArray[np.int64]] = []
        self.ll_sum = 0.0
        self.ll_var = 0.0
        self.dir_sum = 0.0
        self.dir_var = 0.0
        self.tokens = 0
        self.impossible: list[tuple[int, int, int]] = []
        self.malformed: list[str] = []
        self.prefix_cut: list[str] = []
        self.with_prompt = 0  # sequences that start with their prompt's ids (prompt + new ids returned)
        self.first: dict[int, tuple[F64, list[int]]] = {}  # prompt -> (its first-token law, first tokens)
        self._alt = Alternatives(drafter=drafter, extra=extra, bins=self.bins)
        self._aim = AimedStats(aimed)

    # -- feeding ------------------------------------------------------------------------------

    def add_malformed(self, what: str) -> None:
        """Record a malformed sequence (an exact-check failure)."""
        self.malformed.append(what)

    def add_steps(self, p: F64, x: NDArray[np.int64], pos: NDArray[np.int64], v: F64, seq: NDArray[np.int64],
                  q: F64 | None = None, extra: F64 | None = None, prompt: int | NDArray[np.int64] | None = None,
                  aimed: Sequence[F64] = ()) -> None:
        """Add ``m`` audited positions (class docstring; they may be several sequences'). ``prompt``
        (an index, or one per position): the prompt each position's sequence follows; every first
        token (position 0) then also enters the first-token test of its prompt, whose law is the
        same for every sequence after it.
        ``aimed``: one ``[m, V]`` law per bug named at construction, the target's laws under that
        bug's context (:mod:`hsd_core.context_bugs`)."""
        p = np.asarray(p, dtype=np.float64)
        x = np.asarray(x, dtype=np.int64)
        m = x.shape[0]
        if p.ndim != 2 or p.shape[0] != m:
            raise ValueError(f"p must be [m, V] with m = {m} rows, got shape {p.shape}")
        if (q is None) == self.drafter:
            raise ValueError("q must be given exactly when the evidence was made with drafter=True")
        if (extra is None) == self.extra:
            raise ValueError("extra must be given exactly when the evidence was made with extra=True")
        if len(aimed) != len(self._aim.whats):
            raise ValueError(f"aimed: {len(aimed)} laws given for the {len(self._aim.whats)} bugs named at construction")
        if prompt is not None:
            groups = np.broadcast_to(np.asarray(prompt, dtype=np.int64), (m,))
            for r in np.flatnonzero(np.asarray(pos) == 0):
                self.first.setdefault(int(groups[r]), (p[r].copy(), []))[1].append(int(x[r]))
        rows = np.arange(m)
        px = p[rows, x]
        ok = px > 0
        for i in np.flatnonzero(~ok):
            self.impossible.append((int(seq[i]), int(pos[i]), int(x[i])))
        if not ok.any():
            return
        p, x, pos, v, rows = p[ok], x[ok], np.asarray(pos)[ok], np.asarray(v)[ok], np.arange(int(ok.sum()))
        px = px[ok]
        q = None if q is None else np.asarray(q, dtype=np.float64)[ok]
        rs = [np.asarray(r, dtype=np.float64)[ok] for r in aimed]
        full_p, full_q = p, q  # the power statement's picked rows keep every column
        ids, w = self._add_sums(p, x, pos, v, px, q, rs)
        e = None if extra is None else np.asarray(extra, dtype=np.float64)[ok]
        pick = np.flatnonzero(self._pick.random(full_p.shape[0]) < self.rho)
        if pick.size:
            w_pick = None
            if w is not None:
                w_pick = np.zeros((pick.size, full_p.shape[1] + 1))  # a last column for the padding id
                np.put_along_axis(w_pick, np.broadcast_to(ids, w.shape)[pick], w[pick], axis=1)  # 0 where p = q = 0
                w_pick = w_pick[:, :-1]
            self._alt.pend(full_p[pick], None if full_q is None else full_q[pick], w_pick,
                           None if e is None else e[pick])

    def _add_sums(self, p: F64, x: NDArray[np.int64], pos: NDArray[np.int64], v: F64, px: F64, q: F64 | None,
                  rs: list[F64]) -> tuple[NDArray[np.int64], F64 | None]:
        """Add positions of positive probability to the PITs, the martingales' sums and the aimed
        tests; return the ids of the columns read (``[m, W]`` or ``[1, V]``) and the directional
        weights there (None without a drafter)."""
        rows = np.arange(p.shape[0])
        ids, xc = _sparse_columns(p, x, ([] if q is None else [q]) + rs)
        if ids.ndim == 2:  # each row's ids with mass, padded: the laws read there (0 in the padding)
            p, q, rs = _gather(p, ids), None if q is None else _gather(q, ids), [_gather(r, ids) for r in rs]
        else:
            ids = ids[None, :]
        if rs:
            self._aim.add(p, xc, rs)
        before = np.where((p > px[:, None]) | ((p == px[:, None]) & (ids < x[:, None])), p, 0.0).sum(axis=1)
        u = np.clip(before + v * px, 0.0, 1.0)
        self.u.append(u)
        self.u_pos.append(pos.astype(np.int64))
        self.tokens += int(u.size)
        with np.errstate(divide="ignore", invalid="ignore"):
            logp = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), 0.0)
        h = -(p * logp).sum(axis=1)
        self.ll_sum += float((logp[rows, xc] + h).sum())
        self.ll_var += float(np.clip((p * logp ** 2).sum(axis=1) - h ** 2, 0.0, None).sum())
        w: F64 | None = None
        if q is not None:
            s = p + q
            w = np.where(s > 0, q / np.where(s > 0, s, 1.0), 0.0)
            ew = (p * w).sum(axis=1)
            self.dir_sum += float((w[rows, xc] - ew).sum())
            self.dir_var += float(np.clip((p * w ** 2).sum(axis=1) - ew ** 2, 0.0, None).sum())
        return ids, w

    @property
    def alt(self) -> Alternatives:
        """The power ingredients, with every picked position added."""
        self._alt.flush()
        return self._alt

    def report(self, *, n: int, max_new_tokens: int, max_detectable_tv: float | None = 0.1, name: str = "sampler",
               processing: str = "", cost: dict[str, float] | None = None) -> SequenceAuditReport:
        """Run the family (Holm at ``alpha``), state the power, and give the verdict."""
        groups = first_groups(self.first, self.do_sample)
        family = TestFamily(self.alpha, len(planned(self.positions, groups, self.drafter, self.do_sample, self._aim)))
        a = family.per_test_alpha
        u = np.concatenate(self.u) if self.u else np.zeros(0)
        upos = np.concatenate(self.u_pos) if self.u_pos else np.zeros(0, dtype=np.int64)
        run_tests(family, u, upos, bins=self.bins, positions=self.positions, do_sample=self.do_sample,
                  ll=(self.ll_sum, self.ll_var), direction=(self.dir_sum, self.dir_var) if self.drafter else None,
                  first=[(g, *self.first[g]) for g in groups], aim=self._aim)
        statement = PowerStatement(self.alt, self._aim, tokens=self.tokens, bins=self.bins, drafter=self.drafter,
                                   power=self.power)
        fams = statement.families(a) if self.do_sample else []
        head = statement.headline(fams)
        v = sequence_verdict(family, statement, head, impossible=self.impossible, malformed=self.malformed,
                             do_sample=self.do_sample, tokens=self.tokens, n=n, max_detectable_tv=max_detectable_tv)
        reason = v.reason
        if v.verdict == "lossy" and self.with_prompt > n / 2:
            reason += (f"; {self.with_prompt} of {n} sequences start with the prompt's own ids: does the sampler return "
                       "prompt + new ids? return only the new ones")
        if self.prefix_cut:
            reason += (f"; {len(self.prefix_cut)} sequences audited on their prefix only (length_mismatch='prefix', "
                       f"first: {self.prefix_cut[0]})")
        return SequenceAuditReport(
            verdict=v.verdict, reason=reason, n=n, tokens=self.tokens, max_new_tokens=max_new_tokens, alpha=self.alpha,
            power=self.power, seed=self.seed, m=family.m, tests=family.results, holm_rejected=tuple(family.verdicts()),
            skipped=family.skipped, families=tuple(fams), detectable_tv=v.detectable, detectable_by=v.by,
            impossible=tuple(self.impossible), malformed=tuple(self.malformed), do_sample=self.do_sample,
            processing=processing, name=name, cost=dict(cost or {}), pits=u, pit_positions=upos, bins=self.bins,
            n_needed=v.n_needed, prefix_cut=tuple(self.prefix_cut))


def _sparse_columns(p: F64, x: NDArray[np.int64], others: Sequence[F64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Where ``p`` and the ``others`` (same shape ``[m, V]``) have mass: when every row has mass at
    fewer than ``V / 2`` ids (top-k / top-p over a large vocabulary), each row's ids with mass,
    ``[m, W]`` padded with id ``V`` (no law has mass there), and each draw's column in its row;
    else ``(arange(V), x)``: every sum over a row then needs only those columns."""
    mass = p > 0
    for a in others:
        mass |= a > 0
    counts = mass.sum(axis=1)
    width = int(counts.max()) if counts.size else 0
    if 2 * width >= p.shape[1]:
        return np.arange(p.shape[1]), x
    rr, cc = np.nonzero(mass)
    within = np.arange(rr.size) - np.concatenate(([0], np.cumsum(counts)[:-1]))[rr]
    ids = np.full((p.shape[0], width), p.shape[1], dtype=np.int64)
    ids[rr, within] = cc
    return ids, (ids == x[:, None]).argmax(axis=1)


def _gather(a: F64, ids: NDArray[np.int64]) -> F64:
    """``a[i, ids[i, j]]``, 0 where ``ids`` is the padding id ``V``."""
    out: F64 = np.take_along_axis(a, np.minimum(ids, a.shape[1] - 1), axis=1)
    out[ids == a.shape[1]] = 0.0
    return out
