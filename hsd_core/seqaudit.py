"""Sequence-level audits: every generated token is tested against its own conditional law.

:func:`audit_sequences` draws ``n`` whole sequences (up to ``max_new_tokens`` new target ids,
ending at the target's EOS) from a black-box sampler, runs each back through the target by
teacher forcing, and tests every token ``x_t`` against the target's conditional law ``p_t =
p(. | prompt, x_<t)``. The statistics live in :class:`SequenceEvidence`, which the PyTorch backend
(:func:`hsd_torch.audit.audit_sequences`) feeds with its own teacher-forced laws, so both audits
share one implementation of the tests and of the power statement.

**Why every token is evidence.** Order the target ids by decreasing ``p_t`` (ties by lower id) and
let ``F_t`` be the cumulative law in that order. The randomized probability integral transform
(PIT) ``U_t = F_t(x_t-) + V_t p_t(x_t)``, with ``V_t`` uniform on [0, 1] from a seeded stream
independent of the sampler, is uniform on [0, 1] given the whole history when ``x_t ~ p_t``
(Rosenblatt). So under losslessness the PITs of a sequence are i.i.d. uniform up to its stopping
time (EOS or the budget), whatever the prompt, position or history; a sampler that is exact for
the first tokens and wrong after a rejection or a cache rollback moves the PITs of the later
tokens.

**The family** (Holm at ``alpha`` over the ``m`` planned tests; a test that cannot run is listed
as skipped and counts as not rejected):

* ``PIT KS (pooled)``: Kolmogorov-Smirnov of all PITs against U(0, 1);
* ``PIT chi-square (pooled)``: the PITs in ``bins`` equal bins, Pearson chi-square, ``bins - 1``
  degrees of freedom;
* ``log-likelihood martingale``: ``S = sum_t (log p_t(x_t) + H(p_t))`` has conditional mean 0 and
  conditional variance ``Var_{p_t}(log p_t)`` at every step; ``S / sqrt(sum of those)`` is
  referred to N(0, 1), two-sided (catches a temperature that is off, in either direction);
* ``PIT KS (position j)`` for the first ``positions`` positions: the PITs of the sequences that
  reach position j (exactly i.i.d. uniform given that they reach it), exact KS;
* ``first token after prompt g (chi-square)``, for the (at most 4) prompts with the most sequences
  (at least 20): every sequence after one prompt draws its first token from the same law, so its
  first tokens are tested cell by cell (chi-square, cells of expected count < 5 pooled), which sees
  a wrong first context (a prompt fed wrong) that the PIT tests barely see;
* with a drafter, ``directional (toward the drafter)``: with ``q_t`` the drafter's law mapped to
  target ids and ``w_t = q_t / (p_t + q_t)`` (bounded in [0, 1]), ``D = sum_t (w_t(x_t) -
  E_{p_t} w_t)`` over ``sqrt(sum_t Var_{p_t} w_t)``, one-sided: the usual failure of a lossy
  speculative decoder is an output pulled toward its drafter, which raises ``D``;
* for each named context bug (``context_bugs``, :mod:`hsd_core.context_bugs`; by default the
  prompt's last id fed twice), ``directional (toward <the bug>)``: the same statistic with ``q_t``
  replaced by the target's law under the bug's context (one more teacher-forced pass), which sees a
  bug that moves each law in its own direction, where the pooled tests average it out.

The pooled tests and the martingale tests sum over a random number of tokens (sequences stop at
EOS); their normal / chi-square / KS reference laws are asymptotic (martingale central limit
theorem). ``tests/stats/test_audit_sequences.py`` checks by simulation that the false-fail rate
stays within ``alpha``. Besides the family, two exact checks make the verdict "lossy" at once: a
token the target gives probability 0 at its position, and an id outside the target's vocabulary.

**Length mismatches** (a sequence longer than the budget, shorter without ending at an end id, or
going on after an end id) say nothing about the law by themselves: a lossless sampler that returns
a few tokens more than asked, or pads after its EOS, writes them. By default
(``length_mismatch="error"``) the first one is a ``ValueError`` naming it, before any statistics
(with the hint "it starts with the prompt's ids" when it does); ``length_mismatch="prefix"`` audits
each sequence up to its first end id and the budget, and the report says how many were cut.

**The promise.** For the laws actually met (the teacher-forced ``p_t``, and ``q_t`` with a
drafter), the report states, per named family of departures, the smallest one caught with
probability >= ``power`` by at least one test of the family run at ``alpha / m`` (so Holm catches
it too): the mixture toward the drafter ``(1 - lambda) p_t + lambda q_t``; a temperature off by a
factor ``f`` (``p_t^(1/f)`` and ``p_t^f``, renormalized on ``p_t``'s support); one token fewer
(the least likely token of each ``p_t``'s support removed, as a top-k or top-p off by one); and,
where the caller gives the raw law's next token (the PyTorch audit with top-k / top-p), one token
more. Each is also given as the mean per-token TV it amounts to. Each named context bug is a fixed
departure: the report gives the probability that its aimed test catches it (exactly at every met
position, no subsample). The power of the pooled
chi-square is the non-central chi-square's, of the martingale tests the normal approximation's, of
a draw of probability 0 exact, all evaluated at the met positions (so it is an approximation: the
departing sampler would meet other prefixes); the KS and per-position tests are not counted, so
the promise is conservative in that respect. ``tests/stats/test_audit_sequences.py`` checks by
simulation that a mixture at the stated lambda is caught with the stated power. To keep the cost
bounded on large vocabularies the power is computed on a seeded subsample of at most
``power_steps`` positions (an unbiased estimate of the per-token averages).

**Verdicts.** "lossy" on an exact-check failure or a Holm rejection; otherwise "inconclusive" when
no test could run or the headline promise (the mixture toward the drafter's mean per-token TV when
a drafter is given, else the temperature family's) is missing or above ``max_detectable_tv`` (the
reason says how many sequences would reach it); otherwise "lossless-consistent". Greedy audits
(``do_sample=False``) compare every token with the argmax exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from scipy import stats as sps  # type: ignore[import-untyped]

from ._plot import pyplot
from .context_bugs import DEFAULT_CONTEXT_BUGS, AimedStats
from .context_bugs import context_bugs as _context_bugs
from .stats import InvalidTest, TestResult, _check_alpha, _check_power, chi_square_gof, holm

__all__ = ["DEFAULT_BINS", "DEFAULT_POSITIONS", "LENGTH_MISMATCH", "FamilyPower", "LengthCheck", "SequenceAuditReport",
           "SequenceEvidence", "as_ids", "audit_sequences", "check_sequence", "pit_uniforms", "sequence_seeds",
           "truncate_at_end"]

Verdict = Literal["lossless-consistent", "lossy", "inconclusive"]
F64 = NDArray[np.float64]

DEFAULT_BINS = 20
"""Bins of the pooled PIT chi-square."""

DEFAULT_POSITIONS = 4
"""How many first positions get a PIT test of their own."""

LAMBDAS: F64 = np.geomspace(1e-3, 1.0, 25)
"""The grid of mixture weights toward the drafter at which the power is evaluated."""

TEMPERATURE_FACTORS: F64 = np.exp(np.geomspace(0.002, 1.4, 16))
"""The grid of temperature factors ``f`` (both ``x f`` and ``/ f``; ``log f`` geometric from 0.002 to
1.4, ratio 1.55 from one to the next, so it is fine near 1) at which the power is evaluated: each
point costs a pass over every audited law of the power subsample (the mixture family's grid costs
nothing per point: it is linear in lambda), so the stated factor is the grid point at or above the
smallest detectable one, at most one step (x 1.55 in ``log f``) conservative."""

DEFAULT_POWER_STEPS = 500
"""Positions (at most, a seeded subsample) on which the power is computed: an unbiased estimate of
the per-token averages; ``tests/stats/test_audit_sequences.py`` checks the statement made with
this default by simulation."""

_MIN_POSITION_DRAWS = 20
_FIRST_GROUPS = 4
_POWER_CHUNK = 4_000_000  # entries of the [positions, alternatives, ids] array of one power chunk


def sequence_seeds(seed: int, n: int) -> list[int]:
    """The 32-bit sampler seed of each of the ``n`` sequences of an audit run with ``seed``
    (``SeedSequence([seed, i, 0])``): a function of ``(seed, i)`` only."""
    return [int(np.random.SeedSequence([seed, i, 0]).generate_state(1)[0]) for i in range(n)]


def pit_uniforms(seed: int, i: int, length: int) -> F64:
    """The uniforms ``V_t`` of sequence ``i``'s randomized PITs (``length`` of them), from
    ``SeedSequence([seed, i, 1])``: independent of the sampler's seed stream."""
    return np.random.default_rng(np.random.SeedSequence([seed, i, 1])).random(length)


@dataclass(frozen=True)
class FamilyPower:
    """The smallest departure of one named family that the audit catches with probability >=
    ``power``: ``detectable`` is the family's parameter there (lambda for the mixture toward the
    drafter, the factor ``f`` for the temperature; None when even the largest on the grid is not
    caught, or for a fixed departure), ``mean_tv`` the mean per-token TV it amounts to at the met
    positions, ``caught`` the probability that the fixed departure (or the detectable one) is
    caught, ``by`` the test that catches it best, ``note`` what the family is."""

    family: str
    detectable: float | None
    mean_tv: float | None
    caught: float
    by: str
    note: str


@dataclass(frozen=True)
class SequenceAuditReport:
    """Result of :func:`audit_sequences` (module docstring). ``tests`` ran each at ``alpha / m``;
    ``holm_rejected[i]`` is the corrected verdict of ``tests[i]``; ``families`` the power
    statement; ``detectable_tv`` the headline promise (mean per-token TV, ``detectable_by`` names
    its family); ``impossible`` the draws the target gives probability 0 as ``(sequence,
    position, id)``; ``malformed`` what was wrong with malformed sequences; ``pits`` and
    ``pit_positions`` every PIT and its position (for plots and further tests); ``prefix_cut`` the
    sequences audited on their prefix only (``length_mismatch="prefix"``)."""

    verdict: Verdict
    reason: str
    n: int
    tokens: int
    max_new_tokens: int
    alpha: float
    power: float
    seed: int
    m: int
    tests: tuple[TestResult, ...]
    holm_rejected: tuple[bool, ...]
    skipped: tuple[str, ...]
    families: tuple[FamilyPower, ...]
    detectable_tv: float | None
    detectable_by: str
    impossible: tuple[tuple[int, int, int], ...]
    malformed: tuple[str, ...]
    do_sample: bool = True
    processing: str = ""
    name: str = "sampler"
    cost: dict[str, float] = field(default_factory=dict)
    pits: F64 = field(default_factory=lambda: np.zeros(0), repr=False, compare=False)
    pit_positions: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False,
                                             compare=False)
    bins: int = DEFAULT_BINS
    prefix_cut: tuple[str, ...] = ()
    n_needed: int | None = None
    """When the headline promise is above ``max_detectable_tv``: about how many sequences would
    bring it down to that (None otherwise, or when no grid point reaches it)."""

    @property
    def per_test_alpha(self) -> float:
        """``alpha / m``: the level at which each test ran."""
        return self.alpha / self.m

    def to_markdown(self, title: str | None = None) -> str:
        """The report as a markdown section: verdict, sizes, the tests, the power per family."""
        det = "n/a" if self.detectable_tv is None else f"{self.detectable_tv:.4g}"
        lines = [f"## {title or f'Sequence audit of {self.name}'}", "",
                 f"**Verdict: {self.verdict}** ({self.reason})", "",
                 f"- n = {self.n} sequences, {self.tokens} tokens (max_new_tokens {self.max_new_tokens}); "
                 + ("sampling" if self.do_sample else "greedy") + (f", {self.processing}" if self.processing else ""),
                 f"- family-wise alpha = {self.alpha:.3g} (Holm over m = {self.m} tests, each at "
                 f"{self.per_test_alpha:.3g}); power = {self.power}; seed = {self.seed}",
                 f"- headline promise: mean per-token TV {det} ({self.detectable_by})"]
        if self.cost:
            lines.append("- cost: " + ", ".join(f"{k} {v:.3g} s" for k, v in self.cost.items()))
        if self.impossible:
            lines.append(f"- {len(self.impossible)} draws of probability 0 under the target, first "
                         + ", ".join(f"sequence {s} position {j} id {t}" for s, j, t in self.impossible[:5]))
        if self.malformed:
            lines.append(f"- {len(self.malformed)} malformed sequences, first: " + "; ".join(self.malformed[:3]))
        if self.prefix_cut:
            lines.append(f"- {len(self.prefix_cut)} sequences audited on their prefix only (length_mismatch='prefix': "
                         "cut after the first end id and at max_new_tokens), first: " + "; ".join(self.prefix_cut[:3]))
        lines += ["", "| test | statistic | p-value | n | Holm rejects |", "|---|---|---|---|---|"]
        for r, rej in zip(self.tests, self.holm_rejected):
            lines.append(f"| {r.name} | {r.statistic:.4g} | {r.p_value:.3g} | {r.n} | {'**yes**' if rej else 'no'} |")
        if self.skipped:
            lines += ["", "Skipped tests:"] + [f"- {s}" for s in self.skipped]
        lines += ["", f"What would be caught with probability >= {self.power} (at the met positions):", "",
                  "| departure | smallest caught | mean per-token TV | caught with probability | best test |",
                  "|---|---|---|---|---|"]
        for f in self.families:
            d = "n/a" if f.detectable is None else f"{f.detectable:.4g}"
            tv = "n/a" if f.mean_tv is None else f"{f.mean_tv:.4g}"
            lines.append(f"| {f.family} ({f.note}) | {d} | {tv} | {f.caught:.3g} | {f.by} |")
        return "\n".join(lines) + "\n"

    def save_plot(self, path: str) -> bool:
        """Write a PNG: the histogram of the pooled PITs with each bin's 99% band under
        uniformity (per bin), and the mean PIT per position with its 99% band. matplotlib is
        optional: without it, print a message to stderr and return False. Returns True if written."""
        plt = pyplot(path)
        if plt is None:
            return False
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        u = self.pits
        k = self.bins
        counts = np.histogram(u, bins=k, range=(0.0, 1.0))[0] if u.size else np.zeros(k)
        xs = (np.arange(k) + 0.5) / k
        a1.bar(xs, counts, width=0.9 / k, color="tab:orange", label="observed PITs")
        if u.size:
            lo, hi = sps.binom.ppf(0.005, u.size, 1 / k), sps.binom.ppf(0.995, u.size, 1 / k)
            a1.fill_between([0, 1], [lo, lo], [hi, hi], color="tab:blue", alpha=0.2,
                            label="99% band of each bin under uniformity")
            a1.axhline(u.size / k, color="tab:blue", lw=1)
        a1.set_xlabel("randomized PIT of each token under the target's conditional law")
        a1.set_ylabel("tokens")
        fig.suptitle(f"{self.name}: {self.verdict} ({self.n} sequences, {self.tokens} tokens)", fontsize=9)
        a1.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.02), ncol=2, borderaxespad=0.0)
        pos = self.pit_positions
        if u.size:
            js = np.unique(pos)
            means = np.array([u[pos == j].mean() for j in js])
            cnt = np.array([(pos == j).sum() for j in js])
            half = 2.576 * np.sqrt(1 / 12 / cnt)
            a2.fill_between(js, 0.5 - half, 0.5 + half, color="tab:blue", alpha=0.2,
                            label="99% band of each position's mean (pointwise)")
            a2.plot(js, means, "o-", color="tab:orange", ms=3, label="mean PIT")
        a2.axhline(0.5, color="tab:blue", lw=1)
        a2.set_xlabel("position of the new token (0 = first)")
        a2.set_ylabel("mean PIT")
        a2.set_ylim(0, 1)
        a2.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.02), ncol=2, borderaxespad=0.0)
        fig.tight_layout(rect=(0.0, 0.0, 1.0, 0.93))
        fig.savefig(path)
        plt.close(fig)
        return True


def _ks(u: F64, name: str, alpha: float, exact: bool) -> TestResult:
    res = sps.kstest(u, "uniform", method="exact" if exact else "asymp")
    p = float(res.pvalue)
    return TestResult(name, float(res.statistic), p, alpha, int(u.size), None, p <= alpha,
                      f"Kolmogorov-Smirnov of {u.size} PITs against U(0, 1)")


class _Alternatives:
    """Per-step ingredients of the power of each test under each departure, summed over the
    steps of the power subsample (module docstring)."""

    def __init__(self, names: list[tuple[str, float]], k: int) -> None:
        self.names = names
        a = len(names)
        self.steps = 0
        self.bins = np.zeros((a, k))
        self.ll_mu = np.zeros(a)
        self.ll_var = np.zeros(a)
        self.dir_mu = np.zeros(a)
        self.dir_var = np.zeros(a)
        self.log_keep = np.zeros(a)
        self.tv = np.zeros(a)
        self.null_ll_var = 0.0
        self.null_dir_var = 0.0

    def index(self, family: str) -> list[int]:
        return [i for i, (f, _) in enumerate(self.names) if f == family]


class SequenceEvidence:
    """The statistics of a sequence audit, fed step by step (module docstring).

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
        names: list[tuple[str, float]] = []
        if drafter:
            names += [("mixture", float(lam)) for lam in LAMBDAS]
        names += [("hotter", float(f)) for f in TEMPERATURE_FACTORS]
        names += [("colder", float(f)) for f in TEMPERATURE_FACTORS]
        names.append(("one fewer", 1.0))
        if extra:
            names.append(("one more", 1.0))
        self._alt = _Alternatives(names, self.bins)
        self._aim = AimedStats(aimed)
        self._pending: list[tuple[F64, F64 | None, F64 | None, F64 | None]] = []  # picked rows not yet added

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
        ids, xc = _sparse_columns(p, x, ([] if q is None else [q]) + rs)
        if ids.ndim == 2:  # each row's ids with mass, padded: the laws read there (0 in the padding)
            p, q, rs = _gather(p, ids), None if q is None else _gather(q, ids), [_gather(r, ids) for r in rs]
        else:
            ids = ids[None, :]
        if aimed:
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
        e = None if extra is None else np.asarray(extra, dtype=np.float64)[ok]
        pick = np.flatnonzero(self._pick.random(u.size) < self.rho)
        if pick.size:
            w_pick = None
            if w is not None:
                w_pick = np.zeros((pick.size, full_p.shape[1] + 1))  # a last column for the padding id
                np.put_along_axis(w_pick, np.broadcast_to(ids, w.shape)[pick], w[pick], axis=1)  # 0 where p = q = 0
                w_pick = w_pick[:, :-1]
            self._pending.append((full_p[pick], None if full_q is None else full_q[pick], w_pick,
                                  None if e is None else e[pick]))
            if sum(r[0].shape[0] for r in self._pending) * full_p.shape[1] * len(self._alt.names) >= _POWER_CHUNK:
                self._flush()

    @property
    def alt(self) -> _Alternatives:
        """The power ingredients, with every picked position added."""
        self._flush()
        return self._alt

    def _flush(self) -> None:
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
        chunk = max(1, _POWER_CHUNK // (len(self._alt.names) * width))
        for c0 in range(0, p.shape[0], chunk):
            sl = slice(c0, c0 + chunk)
            self._power_rows(p[sl], None if q is None else q[sl], None if w is None else w[sl],
                             None if e is None else e[sl])

    def _power_rows(self, p: F64, q: F64 | None, w: F64 | None, extra: F64 | None) -> None:
        """Add the power ingredients of ``m`` positions (rows of ``p``; module docstring): every
        alternative law over each row's ids sorted by decreasing ``p`` (ties by id), its mass
        outside ``p``'s support (drawn there, it is a draw of probability 0), and what each test
        sees of it. The mixture family is linear in lambda: its ingredients are those of its two
        ends (``p`` and ``q`` on ``p``'s support) combined per row, exactly (:meth:`_mixture_rows`)."""
        alt = self._alt
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
            assert q is not None
            qs = np.where(pos, q[rows, order], 0.0)
            r[:, g_n], r[:, g_n + 1] = ps, qs
        keep = np.clip(1.0 - im, 0.0, 1.0)
        tv = 0.5 * (np.stack([np.abs(r[:, k] - ps).sum(axis=1) for k in range(g_n)], axis=1) + im[:, :g_n])  # [m, G]
        off = np.flatnonzero((im > 0).any(axis=0))  # only these alternatives put mass off p's support
        r[:, off] /= np.where(keep[:, off] > 0, keep[:, off], 1.0)[:, :, None]
        cond = r  # each alternative's law on p's support given that it draws there
        # bin masses of the PIT under each alternative: its density on token x's interval is cond(x) / p(x)
        cum = np.cumsum(ps, axis=1)
        edges = np.linspace(0.0, 1.0, self.bins + 1)
        j = np.minimum(np.stack([np.searchsorted(c, edges) for c in cum]), (s - 1)[:, None])  # [m, k + 1]: ids below
        pj = np.take_along_axis(ps, j, axis=1)
        frac = np.clip((edges[None, :] - (np.take_along_axis(cum, j, axis=1) - pj)) / pj, 0.0, 1.0)
        below = (np.arange(ps.shape[1])[None, :, None] < j[:, None, :]).astype(np.float64)  # [m, V, k + 1]
        jj = np.broadcast_to(j[:, None, :], (m, r.shape[1], j.shape[1]))
        cj = np.take_along_axis(cond, jj, axis=2)
        gb = np.matmul(cond, below) + cj * frac[:, None, :]  # the mass below each edge
        gb[:, :, 0] = 0.0
        gb[:, :, -1] = cond.sum(axis=2)
        bins = np.diff(gb, axis=2)  # [m, A, k]
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

    def _mixture_rows(self, idx: list[int], lam: F64, ps: F64, qs: F64, h: F64, bins: F64, m1: F64, m2: F64,
                      directional: tuple[F64, F64, F64] | None) -> None:
        """The mixture family's ingredients at ``lam`` from those of its ends (index 0: ``ps``, 1:
        ``qs``, ``q`` on ``p``'s support; per row): the alternative ``(1 - lam) p + lam q`` keeps
        ``keep = 1 - lam (1 - sum qs)`` on ``p``'s support and its conditional law there is
        ``((1 - lam) ps + lam qs) / keep``, so every expectation under it (bin masses, the moments of
        ``log p`` and of the directional weight) is the same combination of the ends' expectations."""
        alt = self._alt
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

    # -- the family and the promise ------------------------------------------------------------

    def _first_groups(self) -> list[int]:
        """The prompts whose first tokens get a chi-square test: the (at most ``_FIRST_GROUPS``)
        with the most sequences, at least ``_MIN_POSITION_DRAWS`` of them (sampling only)."""
        if not self.do_sample:
            return []
        big = sorted((g for g, (_, t) in self.first.items() if len(t) >= _MIN_POSITION_DRAWS),
                     key=lambda g: (-len(self.first[g][1]), g))
        return big[:_FIRST_GROUPS]

    def _planned(self) -> list[str]:
        names = ["PIT KS (pooled)", "PIT chi-square (pooled)", "log-likelihood martingale"]
        names += [f"PIT KS (position {j})" for j in range(self.positions)]
        names += [f"first token after prompt {g} (chi-square)" for g in self._first_groups()]
        if self.drafter:
            names.append("directional (toward the drafter)")
        if self.do_sample:
            names += [self._aim.test_name(k) for k in range(len(self._aim.whats))]
        return names

    def _powers(self, a: float, scale: float = 1.0) -> dict[str, F64]:
        """Power of each test (at level ``a``) under every alternative, for ``scale`` times the
        tokens seen."""
        alt = self.alt
        n_alt = len(alt.names)
        out: dict[str, F64] = {}
        if alt.steps == 0 or self.tokens == 0:
            return {"none": np.zeros(n_alt)}
        n_tok = self.tokens * scale
        k = self.bins
        pi = alt.bins / alt.steps
        nc = n_tok * k * ((pi - 1.0 / k) ** 2).sum(axis=1)
        crit = sps.chi2.isf(a, k - 1)
        out["PIT chi-square (pooled)"] = np.asarray(sps.ncx2.sf(crit, k - 1, nc), dtype=np.float64)
        mean_ratio = n_tok / alt.steps
        if alt.null_ll_var > 0:
            mu, s1 = alt.ll_mu * mean_ratio, np.sqrt(alt.ll_var * mean_ratio)
            s0 = math.sqrt(alt.null_ll_var * mean_ratio)
            z = float(sps.norm.isf(a / 2))
            s1 = np.where(s1 > 0, s1, 1e-300)
            out["log-likelihood martingale"] = sps.norm.cdf((mu - z * s0) / s1) + sps.norm.cdf((-mu - z * s0) / s1)
        if self.drafter and alt.null_dir_var > 0:
            mu, s1 = alt.dir_mu * mean_ratio, np.sqrt(alt.dir_var * mean_ratio)
            s0 = math.sqrt(alt.null_dir_var * mean_ratio)
            z = float(sps.norm.isf(a))
            s1 = np.where(s1 > 0, s1, 1e-300)
            out["directional (toward the drafter)"] = sps.norm.cdf((mu - z * s0) / s1)
        with np.errstate(over="ignore", invalid="ignore"):
            out["a draw of probability 0"] = 1.0 - np.exp(alt.log_keep * mean_ratio)
        return out

    def _best(self, a: float, scale: float = 1.0) -> tuple[F64, list[str]]:
        pw = self._powers(a, scale)
        names = list(pw)
        arr = np.nan_to_num(np.array([pw[k] for k in names]), nan=0.0)
        return arr.max(axis=0), [names[i] for i in arr.argmax(axis=0)]

    def _families(self, a: float) -> list[FamilyPower]:
        alt = self.alt
        if alt.steps == 0:
            return []
        best, by = self._best(a)
        tv = alt.tv / alt.steps
        out: list[FamilyPower] = []
        if self.drafter:
            idx = alt.index("mixture")
            hit = [i for i in idx if best[i] >= self.power]
            if hit:
                i = hit[0]
                out.append(FamilyPower("mixture toward the drafter", alt.names[i][1], float(tv[i]), float(best[i]),
                                       by[i], "(1 - lambda) p + lambda q; detectable: lambda"))
            else:
                i = idx[-1]
                out.append(FamilyPower("mixture toward the drafter", None, None, float(best[i]), by[i],
                                       "(1 - lambda) p + lambda q; not caught even at lambda = 1"))
        hot, cold = alt.index("hotter"), alt.index("colder")
        found = None
        for i, j in zip(hot, cold):
            if best[i] >= self.power and best[j] >= self.power:
                found = (i, j)
                break
        if found:
            i, j = found
            out.append(FamilyPower("temperature off by a factor", alt.names[i][1], float(max(tv[i], tv[j])),
                                   float(min(best[i], best[j])), by[i] if best[i] <= best[j] else by[j],
                                   "p^(1/f) and p^f renormalized; detectable: f"))
        else:
            out.append(FamilyPower("temperature off by a factor", None, None, float(min(best[hot[-1]], best[cold[-1]])),
                                   by[hot[-1]], f"p^(1/f) and p^f; not caught even at f = {TEMPERATURE_FACTORS[-1]:.3g}"))
        for fam, note in (("one fewer", "the least likely token of each law removed (top-k / top-p off by one)"),
                          ("one more", "the raw law's next token added (top-k / top-p off by one)")):
            for i in alt.index(fam):
                out.append(FamilyPower(f"one token {fam.split()[1]}", None, float(tv[i]), float(best[i]), by[i], note))
        aim = self._aim
        for k, what in enumerate(aim.whats):
            pw, how = aim.caught(k, a)
            out.append(FamilyPower(f"context bug: {what}", None, float(aim.tv[k]) / max(1, aim.steps), pw, how,
                                   "the target's law under that context at every met position; by its aimed test"))
        return out

    def _headline(self, fams: list[FamilyPower]) -> FamilyPower | None:
        want = "mixture toward the drafter" if self.drafter else "temperature off by a factor"
        for f in fams:
            if f.family == want:
                return f
        return None

    def _scale_needed(self, a: float, family: str, max_tv: float) -> float | None:
        """The factor by which the number of sequences must grow for ``family`` to be caught at a
        mean per-token TV <= ``max_tv`` (None if no grid point qualifies up to x10^4)."""
        alt = self.alt
        tv = alt.tv / max(1, alt.steps)
        if family == "mixture toward the drafter":
            cand = [[i] for i in alt.index("mixture") if tv[i] <= max_tv]
        else:
            cand = [[i, j] for i, j in zip(alt.index("hotter"), alt.index("colder")) if max(tv[i], tv[j]) <= max_tv]
        if not cand:
            return None
        hi = 1e4
        if not any(self._best(a, hi)[0][c].min() >= self.power for c in cand):
            return None
        lo = 1.0
        for _ in range(40):
            mid = math.sqrt(lo * hi)
            b = self._best(a, mid)[0]
            if any(b[c].min() >= self.power for c in cand):
                hi = mid
            else:
                lo = mid
        return hi

    def report(self, *, n: int, max_new_tokens: int, max_detectable_tv: float | None = 0.1, name: str = "sampler",
               processing: str = "", cost: dict[str, float] | None = None) -> SequenceAuditReport:
        """Run the family (Holm at ``alpha``), state the power, and give the verdict."""
        planned = self._planned()
        m = len(planned)
        a = self.alpha / m
        u = np.concatenate(self.u) if self.u else np.zeros(0)
        upos = np.concatenate(self.u_pos) if self.u_pos else np.zeros(0, dtype=np.int64)
        tests: list[TestResult] = []
        skipped: list[str] = []
        if not self.do_sample:
            skipped.append("every test but the exact one (greedy: every token must equal the argmax)")
        elif u.size >= 5 * self.bins:
            tests.append(_ks(u, "PIT KS (pooled)", a, exact=False))
            counts = np.histogram(u, bins=self.bins, range=(0.0, 1.0))[0]
            r = sps.chisquare(counts)
            tests.append(TestResult("PIT chi-square (pooled)", float(r.statistic), float(r.pvalue), a, int(u.size),
                                    self.bins - 1, float(r.pvalue) <= a, f"{self.bins} equal bins"))
        else:
            skipped.append(f"pooled PIT tests: {u.size} tokens, fewer than {5 * self.bins}")
        if self.do_sample:
            if self.ll_var > 0:
                z = self.ll_sum / math.sqrt(self.ll_var)
                pv = float(2 * sps.norm.sf(abs(z)))
                tests.append(TestResult("log-likelihood martingale", z, pv, a, int(u.size), None, pv <= a,
                                        "sum of log p(x) + H(p) over its conditional standard deviation"))
            else:
                skipped.append("log-likelihood martingale: every law met is a point mass")
            for j in range(self.positions):
                uj = u[upos == j]
                if uj.size >= _MIN_POSITION_DRAWS:
                    tests.append(_ks(uj, f"PIT KS (position {j})", a, exact=uj.size <= 10_000))
                else:
                    skipped.append(f"PIT KS (position {j}): {uj.size} tokens, fewer than {_MIN_POSITION_DRAWS}")
            for g in self._first_groups():
                law0, toks = self.first[g]
                test = f"first token after prompt {g} (chi-square)"  # not `name`: that is the report's title
                try:
                    r = chi_square_gof({int(t): float(law0[t]) for t in np.flatnonzero(law0 > 0)},
                                       toks, a, min_kept_mass=0.0)
                    tests.append(TestResult(test, r.statistic, r.p_value, a, r.n, r.dof, r.rejected, r.detail))
                except InvalidTest as e:
                    skipped.append(f"{test}: {e}")
            if self.drafter:
                if self.dir_var > 0:
                    z = self.dir_sum / math.sqrt(self.dir_var)
                    pv = float(sps.norm.sf(z))
                    tests.append(TestResult("directional (toward the drafter)", z, pv, a, int(u.size), None, pv <= a,
                                            "sum of w(x) - E_p w, w = q / (p + q), over its standard deviation"))
                else:
                    skipped.append("directional test: no law met gives it any variance (q = p or point masses)")
            for k in range(len(self._aim.whats)):
                zk = self._aim.z(k)
                if zk is None:
                    skipped.append(f"{self._aim.test_name(k)}: no law met gives it any variance (the bug changes no law)")
                    continue
                pv = float(sps.norm.sf(zk))
                tests.append(TestResult(self._aim.test_name(k), zk, pv, a, int(u.size), None, pv <= a,
                                        "sum of w(x) - E_p w, w = r / (p + r), r the target's law under that bug"))
        rejected = holm([t.p_value for t in tests] + [1.0] * (m - len(tests)), self.alpha)[:len(tests)]
        n_needed: int | None = None
        fams = self._families(a) if self.do_sample else []
        head = self._headline(fams)
        detectable = None if head is None else head.mean_tv
        by = "" if head is None else head.family
        verdict: Verdict
        if self.impossible or self.malformed:
            verdict = "lossy"
            parts = []
            if self.impossible:
                s, j, t = self.impossible[0]
                parts.append(f"{len(self.impossible)} tokens the target gives probability 0 (first: sequence {s}, "
                             f"position {j}, id {t})")
            if self.malformed:
                parts.append(f"{len(self.malformed)} malformed sequences ({self.malformed[0]})")
            reason = "; ".join(parts)
        elif any(rejected):
            verdict = "lossy"
            names = [t.name for t, r in zip(tests, rejected) if r]
            reason = f"Holm rejects at family-wise alpha {self.alpha:.3g}: " + ", ".join(names)
        elif not self.do_sample:
            verdict = "lossless-consistent" if self.tokens else "inconclusive"
            reason = (f"all {self.tokens} tokens equal the target's argmax" if self.tokens else "no tokens")
            by = "greedy: exact check"
        elif not tests:
            verdict, reason = "inconclusive", "no test could run: " + "; ".join(skipped)
        elif detectable is None:
            verdict = "inconclusive"
            reason = (f"no test rejects, but no {by or 'departure'} on the grid would be caught with probability "
                      f">= {self.power}; increase n")
        elif max_detectable_tv is not None and detectable > max_detectable_tv:
            grow = self._scale_needed(a, by, max_detectable_tv)
            n_needed = None if grow is None else math.ceil(grow * n)
            more = ("" if n_needed is None else f"; about n = {n_needed} sequences would reach it")
            verdict = "inconclusive"
            reason = (f"no test rejects, but the smallest {by} caught with probability >= {self.power} is at mean "
                      f"per-token TV {detectable:.4g} > max_detectable_tv {max_detectable_tv:.4g}{more}")
        else:
            verdict = "lossless-consistent"
            reason = (f"no test rejects at family-wise alpha {self.alpha:.3g}; a {by} at mean per-token TV >= "
                      f"{detectable:.4g} would be caught with probability >= {self.power} (at the met positions)")
        if verdict == "lossy" and self.with_prompt > n / 2:
            reason += (f"; {self.with_prompt} of {n} sequences start with the prompt's own ids: does the sampler return "
                       "prompt + new ids? return only the new ones")
        if self.prefix_cut:
            reason += (f"; {len(self.prefix_cut)} sequences audited on their prefix only (length_mismatch='prefix', "
                       f"first: {self.prefix_cut[0]})")
        return SequenceAuditReport(
            verdict=verdict, reason=reason, n=n, tokens=self.tokens, max_new_tokens=max_new_tokens, alpha=self.alpha,
            power=self.power, seed=self.seed, m=m, tests=tuple(tests), holm_rejected=tuple(rejected),
            skipped=tuple(skipped), families=tuple(fams), detectable_tv=detectable, detectable_by=by,
            impossible=tuple(self.impossible), malformed=tuple(self.malformed), do_sample=self.do_sample,
            processing=processing, name=name, cost=dict(cost or {}), pits=u, pit_positions=upos, bins=self.bins,
            n_needed=n_needed, prefix_cut=tuple(self.prefix_cut))


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


def check_sequence(ids: Sequence[int], max_new_tokens: int, end_ids: frozenset[int]) -> str | None:
    """What is malformed in a sequence of new target ids (None if nothing): longer than the
    budget, an end id before the last token, or shorter than the budget without an end id."""
    if len(ids) > max_new_tokens:
        return f"{len(ids)} tokens, more than max_new_tokens {max_new_tokens}"
    for j, t in enumerate(ids[:-1]):
        if t in end_ids:
            return f"end id {t} at position {j}, then {len(ids) - j - 1} more tokens"
    if len(ids) < max_new_tokens and (not ids or ids[-1] not in end_ids):
        return f"{len(ids)} tokens without an end id (the budget is {max_new_tokens})"
    return None


def truncate_at_end(ids: Sequence[int], max_new_tokens: int, end_ids: frozenset[int]) -> list[int]:
    """``ids`` cut after its first end id and to ``max_new_tokens``: the part a target's own
    decoding could have produced, which a malformed sequence is still audited on."""
    out: list[int] = []
    for t in ids[:max_new_tokens]:
        out.append(int(t))
        if t in end_ids:
            break
    return out


LENGTH_MISMATCH = ("error", "prefix", "lossy")
"""What a sequence audit does with a length mismatch (module docstring): raise (the default),
audit each sequence's prefix up to its first end id and the budget, or count it as a malformed
sequence, which makes the verdict "lossy" (the engine audits' rule: a recorded engine's draws are
what it claims to have sampled, and no option can fix them after the fact)."""


class LengthCheck:
    """One audit's rule for sequences whose length does not fit (module docstring, "Length
    mismatches"): :meth:`take` returns the ids to audit, raises ``ValueError`` on a mismatch under
    ``"error"``, and cuts it (recorded in the evidence) under ``"prefix"``."""

    def __init__(self, length_mismatch: str, max_new_tokens: int, end_ids: frozenset[int]) -> None:
        if length_mismatch not in LENGTH_MISMATCH:
            raise ValueError(f"length_mismatch must be 'error', 'prefix' or 'lossy', got {length_mismatch!r}")
        self.policy, self.max_new_tokens, self.end_ids = length_mismatch, int(max_new_tokens), end_ids

    def take(self, ev: SequenceEvidence, i: int, ids: list[int], prompt_ids: Sequence[int], what: str) -> list[int]:
        """``ids`` (sequence ``i``'s new target ids; ``what`` names the draw: "sample_fn('x', 7)"),
        as audited; counts in ``ev`` the sequences that start with ``prompt_ids``."""
        head = list(prompt_ids)
        starts = bool(head) and len(ids) > len(head) and ids[:len(head)] == head
        ev.with_prompt += starts
        wrong = check_sequence(ids, self.max_new_tokens, self.end_ids)
        if wrong is None:
            return ids
        hint = "; it starts with the prompt's ids: return only the new ids" if starts else ""
        if self.policy == "error":
            raise ValueError(
                f"{what} (sequence {i}) returned {wrong}: a length mismatch, so no statistics were run{hint}. Return "
                f"the new ids only, up to the first end id and at most max_new_tokens={self.max_new_tokens}, or pass "
                "length_mismatch='prefix' to audit each sequence up to its first end id and max_new_tokens (the "
                "report then says how many were cut)")
        (ev.prefix_cut if self.policy == "prefix" else ev.malformed).append(f"sequence {i}: {wrong}{hint}")
        return truncate_at_end(ids, self.max_new_tokens, self.end_ids)


def audit_sequences(
    sample_fn: Callable[[str, int], Sequence[int]],
    target: Any,
    prompts: str | Sequence[str],
    n: int = 200,
    max_new_tokens: int = 32,
    do_sample: bool = True,
    alpha: float = 1e-3,
    seed: int = 0,
    drafter: Any = None,
    *,
    power: float = 0.99,
    bins: int = DEFAULT_BINS,
    positions: int = DEFAULT_POSITIONS,
    max_detectable_tv: float | None = 0.1,
    power_steps: int = DEFAULT_POWER_STEPS,
    name: str | None = None,
    context_bugs: Sequence[str] | None = DEFAULT_CONTEXT_BUGS,
    length_mismatch: str = "error",
) -> SequenceAuditReport:
    """Audit ``sample_fn(prompt, seed) -> list[int]`` (new target ids) over ``hsd_core`` models:
    ``n`` sequences (the prompts taken in turn), every token tested against ``target``'s exact
    conditional law ``next_probs`` (module docstring). With ``drafter`` (an ``hsd_core`` model whose
    alphabet contains the target's), the directional test uses the drafter's law pushed onto the
    shared strings (TLI's intersection, renormalized) with TLI's drafter context. Sequence ``i``'s
    seed is :func:`sequence_seeds` ``(seed, n)[i]``. ``do_sample=False``: every token must be the
    argmax (ties to the lowest id). ``context_bugs``: names of :data:`hsd_core.context_bugs.CONTEXT_BUGS`
    to aim a test at (None or empty: none; sampling only). ``length_mismatch``: ``"error"`` (a
    sequence longer than ``max_new_tokens``, going on after an end id or stopping short without one
    raises ``ValueError`` naming it) or ``"prefix"`` (each sequence audited up to its first end id
    and ``max_new_tokens``; the report says how many were cut) or ``"lossy"`` (a malformed sequence:
    the verdict is "lossy"; its prefix is audited too). Returns a :class:`SequenceAuditReport`."""
    from .laws import argmax
    from .methods.base import State, check_run_args
    from .methods.tli import drafter_context, intersection
    from .models import checked

    if not callable(sample_fn):
        raise TypeError(f"sample_fn must be a callable (prompt, seed) -> list of ids, got {type(sample_fn).__name__}")
    plist = [prompts] if isinstance(prompts, str) else list(prompts)
    if not plist:
        raise ValueError("prompts is empty")
    target = checked(target, "target")
    for pr in plist:
        check_run_args(target, pr, max_new_tokens)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be True or False, got {do_sample!r}")
    inter = None
    if drafter is not None:
        drafter = checked(drafter, "drafter")
        if not set(target.vocab.alphabet) <= set(drafter.vocab.alphabet):
            raise ValueError("the drafter's alphabet must contain the target's (its context is the target's text)")
        inter = intersection(target.vocab, drafter.vocab)
    size = len(target.vocab)
    eos = target.vocab.eos_id
    lengths = LengthCheck(length_mismatch, int(max_new_tokens), frozenset([eos]))
    bugs = _context_bugs(context_bugs) if do_sample else ()
    ev = SequenceEvidence(alpha=alpha, power=power, bins=bins, positions=positions, seed=seed,
                          drafter=drafter is not None, do_sample=do_sample, power_steps=power_steps,
                          expected_steps=int(n) * int(max_new_tokens), aimed=[b.what for b in bugs])
    for i, sd in enumerate(sequence_seeds(int(seed), int(n))):
        prompt = plist[i % len(plist)]
        out = sample_fn(prompt, sd)
        ids = as_ids(out, f"sample_fn({prompt!r}, {sd}) (sequence {i}) returned")
        bad = [t for t in ids if not 0 <= t < size]
        if bad:
            ev.add_malformed(f"sequence {i}: id {bad[0]} outside the target's {size} ids")
            continue
        base = tuple(target.tokenizer.encode(prompt))
        ids = lengths.take(ev, i, ids, base, f"sample_fn({prompt!r}, {sd})")
        if not ids:
            continue
        rows = []
        qrows = []
        bases = [tuple(b.context(base)) for b in bugs]
        aimed: list[list[F64]] = [[] for _ in bugs]
        for j in range(len(ids)):
            law = target.next_probs(base + tuple(ids[:j]))
            if do_sample:
                rows.append(np.array([float(v) for v in law]))
            else:
                row = np.zeros(len(law))
                row[argmax(law)] = 1.0
                rows.append(row)
            if inter is not None:
                dctx = drafter_context(target, drafter, State(prompt, tuple(ids[:j]), int(max_new_tokens)), inter)
                capped = inter.restrict(drafter.next_probs(dctx))
                qrows.append(np.array([float(v) for v in inter.push(capped, size)]) if capped is not None
                             else rows[-1].copy())
            for k, b in enumerate(bases):  # an empty context: no law to aim at, no evidence (r = p)
                aimed[k].append(np.array([float(v) for v in target.next_probs(b + tuple(ids[:j]))]) if b
                                else rows[-1].copy())
        ev.add_steps(np.array(rows), np.array(ids), np.arange(len(ids)), pit_uniforms(int(seed), i, len(ids)),
                     np.full(len(ids), i), q=np.array(qrows) if inter is not None else None, prompt=i % len(plist),
                     aimed=[np.array(r) for r in aimed])
    label = name or str(getattr(sample_fn, "__qualname__", "") or type(sample_fn).__name__)
    return ev.report(n=int(n), max_new_tokens=int(max_new_tokens), max_detectable_tv=max_detectable_tv, name=label)


def as_ids(out: Any, what: str) -> list[int]:
    """``out`` (a list, tuple or numpy array) as a list of Python ints; ``TypeError`` for anything that
    is not a sequence of int ids (None, a str, a float id, which ``int()`` would truncate in silence).
    ``what`` starts the message ("sample_fn('x', 7) returned")."""
    if out is None or isinstance(out, (str, bytes)):
        got = "None" if out is None else f"a {type(out).__name__} {repr(out)[:40]}"
        raise TypeError(f"{what} {got}, not a list of int target ids")
    if isinstance(out, np.ndarray):
        out = out.ravel().tolist()
    try:
        items = list(out)
    except TypeError:
        raise TypeError(f"{what} a {type(out).__name__}, not a list of int target ids") from None
    for t in items:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"{what} {t!r} ({type(t).__name__}) among its ids, not an integer id")
    return [int(t) for t in items]
