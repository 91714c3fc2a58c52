"""Audit a sampler against an exact law (or against reference samples): one call, one report.

:func:`audit_sampler` draws ``n`` outputs from a black-box sampler (``sample_fn()`` returns one
tuple of target ids per call), runs a family of sized tests from :mod:`hsd_core.stats`, corrects
them with Holm at the family-wise false-fail rate ``alpha``, and returns an :class:`AuditReport`.

The family (``m`` tests, each run at level ``alpha / m``; Holm then rejects at least what this
Bonferroni level rejects):

* the **joint law** of the whole output tuple: Pearson chi-square, G-test (both after pooling the
  cells of expected count < 5) and the distribution-free TV test;
* with ``positions=True``, for every emitted position ``j``, the law of the ``j``-th token
  **conditional on the output reaching position j** (i.e. on ``len(output) > j``), by chi-square.
  Conditionally on how many outputs reach ``j``, those outputs' ``j``-th tokens are i.i.d. from
  that conditional law, so the test is valid as it stands;
* with ``text`` (a decode callable ``tuple[int, ...] -> str``), the law of the decoded text, by
  chi-square.

Everything is validated before the first draw: the law (a probability law; keys tuples of ints),
the arguments (numpy numbers are fine), and the sample size the audit would pick (at most
``max_n``). Every output of ``sample_fn`` must be a tuple (or list) of ints: nothing is coerced.

The promise, ``detectable_tv``: every law at TV >= ``detectable_tv`` from the reference is caught
with probability >= ``power``. For a point-mass law (greedy) it comes from the exact check, ``1 -
(1 - power)^(1/n)``. Otherwise from the joint chi-square on the table it really runs: cells of
expected count < 5 are pooled, and a discrepancy inside the pooled cell is invisible, so
``detectable_tv = min_tv_detectable(k', n, alpha / m, power) + pooled_mass`` with k' the cells of
the pooled table (TV <= TV of the pooled laws + the pooled mass; asymptotic, for the k'-cell
test; see :func:`hsd_core.stats.min_num_samples_for_tv`). It is None when the table cannot run or
even TV 1 is out of reach.

Sizing: with ``n=None`` the sample size is the smallest n, from ``min_num_samples_for_tv(k, eps,
alpha / m, power)`` up, at which that promise reaches ``eps`` (:func:`min_num_samples_for_law`);
above ``max_n`` the audit refuses. With ``eps=None`` too, ``eps`` is the larger of
:data:`DEFAULT_EPS` and the promise at :data:`DEFAULT_MAX_N` samples, so the default stays
affordable.

Verdicts: ``"lossy"`` when Holm rejects any test; else ``"inconclusive"`` when the joint
chi-square test cannot be run (:class:`~hsd_core.stats.InvalidTest`: too sparse), when
``detectable_tv`` is None (no power), or when ``eps`` was given and ``detectable_tv > eps``; else
``"lossless-consistent"``. A position or text test that cannot be run is listed in ``skipped``
and does not change the verdict.

Two-sample mode (``law_or_reference`` is a list of samples): the joint, positional and text laws
are compared with :func:`~hsd_core.stats.chi_square_two_sample` (and the joint law also with
:func:`~hsd_core.stats.tv_two_sample`); ``detectable_tv`` then uses the effective sample size
``n * n_ref / (n + n_ref)``, an approximation.
"""

from __future__ import annotations

import math
import pickle
import sys
from concurrent.futures import Executor, ProcessPoolExecutor
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal, Union

import numpy as np

from .seqaudit import SequenceAuditReport, audit_sequences
from ._plot import pyplot
from .stats import (
    OTHER, InvalidTest, TestFamily, TestResult, _check_alpha, _check_eps, _check_n, _check_power,
    _validate_law, chi_square_two_sample, counts_of, gof_test, min_num_samples_for_tv,
    min_tv_detectable, pool_cells, tv_two_sample,
)

__all__ = ["AuditReport", "SequenceAuditReport", "audit_sequences", "DEFAULT_CHUNK_SIZE", "DEFAULT_EPS", "DEFAULT_MAX_N", "DEFAULT_MAX_SIZED_N", "Deviation", "Verdict",
           "AuditPlan", "audit_plan", "audit_sampler", "draw_chunks", "min_num_samples_for_law"]

Output = tuple[int, ...]
Prob = Union[float, Fraction]
Verdict = Literal["lossless-consistent", "lossy", "inconclusive"]

DEFAULT_EPS = 0.05
"""Default TV to detect when neither ``n`` nor ``eps`` is given (unless that would need more than
:data:`DEFAULT_MAX_N` samples)."""

DEFAULT_MAX_N = 50_000
"""Default cap on the sample size chosen when neither ``n`` nor ``eps`` is given."""

DEFAULT_CHUNK_SIZE = 1000
"""Draws per chunk in seeded / distributed sampling (:func:`audit_sampler` with ``seed`` or
``executor``): part of what a seed means, so keep it fixed to reproduce a run."""

DEFAULT_MAX_SIZED_N = 2_000_000
"""Default ``max_n``: the largest sample size :func:`audit_sampler` picks by itself (from ``eps``)
before refusing with the size it would need (minutes to hours of sampling for real samplers)."""

_MIN_EXPECTED = 5.0


@dataclass(frozen=True)
class Deviation:
    """One output with its observed and expected counts (expected: ``n * p``)."""

    output: Hashable
    observed: int
    expected: float


@dataclass(frozen=True)
class AuditReport:
    """Result of :func:`audit_sampler`.

    ``tests`` holds each test that ran, each at level ``alpha / m`` (its own ``alpha`` field);
    ``holm_rejected[i]`` is the Holm-corrected verdict of ``tests[i]`` at the family-wise
    ``alpha``. ``m`` counts the planned tests (skipped ones count as not rejected, which is
    conservative). ``detectable_tv`` is None when it cannot be computed (n too small); how it was
    obtained is ``detectable_by`` (the joint chi-square table, plus ``pooled_mass``, the mass of
    the cells pooled into one, which no pooled test sees inside; or the exact point-mass check).
    ``name`` names the sampler (title of the plot).
    """

    n: int
    alpha: float
    power: float
    eps: float | None
    m: int
    tests: tuple[TestResult, ...]
    holm_rejected: tuple[bool, ...]
    skipped: tuple[str, ...]
    k: int
    detectable_tv: float | None
    verdict: Verdict
    reason: str
    over: tuple[Deviation, ...]
    under: tuple[Deviation, ...]
    mode: Literal["exact", "two-sample"]
    rng_note: str = ""
    observed: Mapping[Any, int] = field(default_factory=dict, repr=False, compare=False)
    expected: Mapping[Any, float] = field(default_factory=dict, repr=False, compare=False)
    detectable_by: str = "joint chi-square"
    pooled_mass: float = 0.0
    name: str = "sampler"
    position_detectable: tuple[float | None, ...] = ()
    """Exact mode with ``positions``: for each position ``j``, the TV of the ``j``-th token's law (given
    that the output reaches ``j``) that its own test catches with probability ``power``, at the
    expected number of outputs reaching ``j`` (None: no power there)."""

    @property
    def per_test_alpha(self) -> float:
        """``alpha / m``: the level at which each test ran."""
        return self.alpha / self.m

    def to_markdown(self, title: str = "Sampler audit") -> str:
        """The report as a markdown section (verdict, sizing, test table, largest deviations)."""
        det = "n/a (n too small)" if self.detectable_tv is None else f"{self.detectable_tv:.4g}"
        lines = [
            f"## {title}", "",
            f"**Verdict: {self.verdict}** ({self.reason})", "",
            f"- mode: {self.mode}; n = {self.n} samples; support size k = {self.k}",
            f"- family-wise alpha = {self.alpha:.3g} (Holm over m = {self.m} tests, each at "
            f"{self.per_test_alpha:.3g}); power = {self.power}",
            f"- detectable TV ({self.detectable_by}, power {self.power}): {det}"
            + ("" if self.eps is None else f"; requested eps = {self.eps:.4g}"),
        ]
        if self.position_detectable:
            lines.append("- detectable TV of each position's own law (given the output reaches it): "
                         + ", ".join(f"position {j}: " + ("n/a" if d is None else f"{d:.4g}")
                                     for j, d in enumerate(self.position_detectable)))
        if self.pooled_mass > 0:
            lines.append(f"- pooled: {self.pooled_mass:.4g} of the probability lies in cells pooled into one "
                         "(expected count < 5); a discrepancy inside them is not seen, so the detectable TV "
                         "includes it")
        if self.rng_note:
            lines.append(f"- rng: {self.rng_note}")
        lines += ["", "| test | statistic | p-value | dof | n | Holm rejects |", "|---|---|---|---|---|---|"]
        for r, rej in zip(self.tests, self.holm_rejected):
            dof = "" if r.dof is None else str(r.dof)
            lines.append(f"| {r.name} | {r.statistic:.4g} | {r.p_value:.3g} | {dof} | {r.n} | "
                         f"{'**yes**' if rej else 'no'} |")
        if self.skipped:
            lines += ["", "Skipped tests:"] + [f"- {s}" for s in self.skipped]

        def table(title_: str, rows: Sequence[Deviation]) -> list[str]:
            out = ["", f"{title_} (observed vs expected count):", "",
                   "| output | observed | expected |", "|---|---|---|"]
            out += [f"| `{d.output!r}` | {d.observed} | {d.expected:.1f} |" for d in rows]
            if not rows:
                out.append("| (none) | | |")
            return out

        lines += table("Most over-represented outputs", self.over)
        lines += table("Most under-represented outputs", self.under)
        return "\n".join(lines) + "\n"

    def plot_data(self, max_bars: int = 40, band: float = 0.99) -> dict[str, Any]:
        """What :meth:`save_plot` draws: the ``max_bars`` outputs of largest expected count (then
        largest observed count), their observed and expected counts, the central ``band`` interval
        of each observed count under the reference (binomial; noise stays inside it, bias does
        not), and how many outputs (and what share of the samples) were cut from the plot."""
        from scipy import stats as sps  # type: ignore[import-untyped]

        everything = sorted(set(self.expected) | set(self.observed),
                            key=lambda x: (-self.expected.get(x, 0.0), -self.observed.get(x, 0), repr(x)))
        keys = everything[:max_bars]
        cut = everything[max_bars:]
        exp = [self.expected.get(x, 0.0) for x in keys]
        obs = [self.observed.get(x, 0) for x in keys]
        ps = [min(1.0, e / self.n) for e in exp]
        q = (1.0 - band) / 2.0
        lo = [float(sps.binom.ppf(q, self.n, p)) for p in ps]
        hi = [float(sps.binom.ppf(1.0 - q, self.n, p)) for p in ps]
        title = f"{self.name}: {self.verdict} (n={self.n})"
        if cut:
            cut_obs = sum(self.observed.get(x, 0) for x in cut)
            title += f"; {len(cut)} more outputs not shown ({cut_obs} samples, {cut_obs / self.n:.2%})"
        return {"keys": keys, "observed": obs, "expected": exp, "band_low": lo, "band_high": hi,
                "band": band, "n_cut": len(cut), "title": title}

    def save_plot(self, path: str, max_bars: int = 40, title: str | None = None, log: bool = False,
                  label: Callable[[Any], str] | None = None) -> bool:
        """Write a PNG of the observed counts against the expected ones to ``path``: the
        ``max_bars`` outputs of largest expected count as bars, the expected count of each as a
        marker with its 99% sampling band (:meth:`plot_data`), the sampler's name (``title``
        overrides it), the verdict and how many outputs were cut in the title; ``log=True`` for a
        log count scale. matplotlib is optional (not a dependency of hsd): without it, print a
        message to stderr and return False. ``label(output)`` gives each bar's tick label (default
        its ``repr``). The bands are per output (not simultaneous), as the legend says; the legend
        sits outside the axes, so it never covers a bar. Returns True if written.
        """
        plt = pyplot(path)
        if plt is None:
            return False
        d = self.plot_data(max_bars)
        if title is not None:
            d["title"] = title + d["title"][len(self.name):]
        xs = list(range(len(d["keys"])))
        ref = "reference" if self.mode == "two-sample" else "expected"
        fig, ax = plt.subplots(figsize=(max(6.0, 0.3 * len(xs)) + 3.0, 4.5))
        ax.bar(xs, d["observed"], width=0.6, color="tab:orange", label="observed")
        err_lo = [max(0.0, e - lo) for e, lo in zip(d["expected"], d["band_low"])]
        err_hi = [max(0.0, hi - e) for e, hi in zip(d["expected"], d["band_high"])]
        ax.errorbar(xs, d["expected"], yerr=[err_lo, err_hi], fmt="o", color="tab:blue", ms=3, capsize=2,
                    label=f"{ref} count, {d['band']:.0%} sampling band of each output (per output)")
        ax.set_xticks(xs)
        ax.set_xticklabels([(label or repr)(x) for x in d["keys"]], rotation=90, fontsize=6)
        ax.set_xlabel(f"output (the {len(xs)} of largest {ref} count)")
        ax.set_ylabel("count" + (" (log scale)" if log else ""))
        if log:
            ax.set_yscale("symlog", linthresh=1.0)
        ax.set_title(d["title"], fontsize=8)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return True


# ---------------------------------------------------------------------------------------------

def _point_mass_detectable(n: int, power: float) -> float:
    """Smallest TV caught by the exact point-mass check with probability >= power: a law at TV e
    from a point mass puts e on other outcomes, and all n draws miss them with prob (1 - e)^n."""
    return -math.expm1(math.log1p(-power) / n)


@dataclass(frozen=True)
class _Plan:
    """What the joint test can promise at a sample size: the detectable TV (None: nothing), how
    (``by``), and the mass pooled into one cell, which the pooled tests cannot see inside."""

    detectable: float | None
    by: str
    pooled_mass: float
    cells: int


def _joint_plan(law: Mapping[Any, Prob], n: int, alpha: float, power: float) -> _Plan:
    """The honest promise of the joint test at ``n`` samples (see the module docstring).

    A point mass is checked exactly. Otherwise the chi-square table is the one the test builds
    (:func:`~hsd_core.stats.pool_cells`); every alternative at TV >= d + pooled mass has TV >= d
    on that table (TV <= TV of the pooled laws + the pooled mass), so it is caught with the
    table's k'-cell chi-square power."""
    support = [x for x, p in law.items() if p > 0]
    if len(support) == 1:
        return _Plan(_point_mass_detectable(n, power), "exact point-mass check", 0.0, 1)
    try:
        labels, _, _ = pool_cells(law, {}, n, absorb_small_other=True)
    except InvalidTest:
        return _Plan(None, "joint chi-square (too sparse to run)", 1.0, 0)
    kept = set(labels) - {OTHER}
    pooled = float(sum((p for x, p in law.items() if x not in kept), Fraction(0)))
    if len(labels) < 2:
        return _Plan(None, "joint chi-square (fewer than 2 cells)", pooled, len(labels))
    try:
        d = min_tv_detectable(len(labels), n, alpha, power) + pooled
    except InvalidTest:
        return _Plan(None, "joint chi-square (n too small)", pooled, len(labels))
    by = f"joint chi-square on {len(labels)} cells" + (f" + pooled mass {pooled:.4g}" if pooled else "")
    return _Plan(d if d < 1.0 else None, by, pooled, len(labels))


def _size_for(law: Mapping[Output, Prob], eps: float, alpha: float, power: float, k: int) -> int:
    """The sample size the audit picks for ``eps``: ``min_num_samples_for_tv(k, eps, alpha, power)``
    when the honest promise at that n already reaches eps, else the smallest larger n at which it
    does (found by doubling, then bisection)."""
    if sum(1 for p in law.values() if p > 0) == 1:
        return max(1, math.ceil(math.log1p(-power) / math.log1p(-eps))) if eps < 1 else 1

    def ok(m: int) -> bool:
        d = _joint_plan(law, m, alpha, power).detectable
        return d is not None and d <= eps

    lo = min_num_samples_for_tv(k, eps, alpha, power)
    if ok(lo):
        return lo
    hi = lo * 2
    while not ok(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # ok(hi), not ok(lo)
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def min_num_samples_for_law(law: Mapping[Any, Prob], eps: float, alpha: float, power: float = 0.99) -> int:
    """The sample size :func:`audit_sampler` picks to detect TV ``eps`` on ``law`` with its joint
    test run at level ``alpha`` (the per-test level ``alpha_total / m``): the smallest n (from
    ``min_num_samples_for_tv(k, eps, alpha, power)`` up) at which the honest detectable TV,
    pooled mass included, is at most ``eps``."""
    lw = _normalise_law(law)
    _validate_law(lw)
    return _size_for(lw, _check_eps(eps), _check_alpha(alpha), _check_power(power),
                     max(2, sum(1 for p in lw.values() if p > 0)))


def _num_tests(two_sample: bool, positions: int, text: bool, prefixes: int) -> int:
    """How many tests :func:`audit_sampler` runs (the Holm family's size ``m``): the joint test and
    its companions (two in two-sample mode, three against a law), one per position, one for the
    text, one per prefix."""
    return (2 if two_sample else 3) + positions + (1 if text else 0) + prefixes


@dataclass(frozen=True)
class AuditPlan:
    """What :func:`audit_sampler` will be able to promise before it draws: with ``n`` draws, every
    law at TV >= ``detectable_tv`` from the reference law is caught with probability >= ``power``
    (None: no TV below 1), by ``by``; ``tests`` tests share the family-wise ``alpha``."""

    n: int
    alpha: float
    power: float
    tests: int
    detectable_tv: float | None
    by: str


def audit_plan(law: Mapping[Any, Prob], n: int, alpha: float = 1e-6, power: float = 0.99, *,
               positions: bool = True, text: bool = False, prefixes: int = 0) -> AuditPlan:
    """The promise of ``audit_sampler(sample_fn, law, n=n, alpha=alpha, power=power,
    positions=positions, text=..., prefixes=...)`` computed before any draw (``text``: whether a
    decode callable is given; ``prefixes``: how many prefixes). Its ``detectable_tv`` is exactly the
    report's: it depends on the law, ``n`` and the per-test level only, never on the draws."""
    lw = _normalise_law(law)
    if not lw:
        raise ValueError("the law is empty")
    _validate_law(lw)
    alpha, power, n = _check_alpha(alpha), _check_power(power), _check_n(n)
    max_len = max(len(s) for s in lw)
    m = _num_tests(False, max_len if positions else 0, text, int(prefixes))
    plan = _joint_plan(lw, n, alpha / m, power)
    return AuditPlan(n, alpha, power, m, plan.detectable, plan.by)


def _is_token(t: object) -> bool:
    return isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))


def _as_output(x: object, what: str) -> Output:
    """``x`` as a tuple of Python ints; ``TypeError`` unless it is a tuple, a list or a 1-d integer
    array of ints (numpy integers included): ``(1.7,)``, a dict, a str, None or a bare int are
    refused rather than coerced."""
    if isinstance(x, np.ndarray) and x.ndim == 1 and x.dtype.kind in "iu":
        return tuple(int(t) for t in x.tolist())
    if isinstance(x, (tuple, list)) and all(_is_token(t) for t in x):
        return tuple(int(t) for t in x)
    raise TypeError(
        f"{what} is {x!r} ({type(x).__name__}); outputs are tuples (or lists) of int token ids, e.g. (3, 1)")


def _normalise_law(law: object) -> dict[Output, Prob]:
    """The law with its keys checked (tuples of ints, numpy ints allowed) and made Python ints;
    probabilities are left for :func:`~hsd_core.stats._validate_law` to check."""
    if not isinstance(law, Mapping):
        raise TypeError(f"the law must be a Mapping from output tuples to probabilities, got {type(law).__name__}")
    out: dict[Output, Any] = {}
    for s, p in law.items():
        if not isinstance(s, tuple):
            raise TypeError(f"law key {s!r} ({type(s).__name__}) must be a tuple of int token ids, e.g. (3, 1)")
        out[_as_output(s, f"law key {s!r}")] = p
    return out


def _gof(kind: str, label: str, law: Mapping[Any, Prob], counts: Mapping[Any, int], alpha: float) -> TestResult:
    res = gof_test(law, counts, alpha, {"g_test": "g"}.get(kind, kind))
    return TestResult(f"{label} {res.name}", res.statistic, res.p_value, res.alpha, res.n, res.dof,
                      res.rejected, res.detail)


def _two(kind: str, label: str, a: Mapping[Any, int], b: Mapping[Any, int], alpha: float) -> TestResult:
    if kind == "tv":
        res = tv_two_sample(a, b, alpha)
    elif len(set(a) | set(b)) == 1:
        res = TestResult("chi2_two_sample", 0.0, 1.0, alpha, sum(a.values()) + sum(b.values()), None, False,
                         "both samples are constant on the same outcome")
    else:
        res = chi_square_two_sample(a, b, alpha)
    return TestResult(f"{label} {res.name}", res.statistic, res.p_value, res.alpha, res.n, res.dof,
                      res.rejected, res.detail)


def _position_law(law: Mapping[Output, Prob], j: int) -> dict[int, Prob]:
    """Exact law of the j-th token given len(output) > j (empty if no output reaches j)."""
    raw: dict[int, Prob] = {}
    for s, p in law.items():
        if len(s) > j and p > 0:
            raw[s[j]] = raw.get(s[j], 0) + p
    total = sum(raw.values())
    return {t: p / total for t, p in raw.items()} if total > 0 else {}


def _position_counts(counts: Mapping[Output, int], j: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for s, c in counts.items():
        if len(s) > j:
            out[s[j]] = out.get(s[j], 0) + c
    return out


def _prefix_law(law: Mapping[Output, Prob], pre: Output) -> dict[int, Prob]:
    """Exact law of the token after ``pre`` given that the output starts with ``pre`` and goes on."""
    k = len(pre)
    raw: dict[int, Prob] = {}
    for s, p in law.items():
        if len(s) > k and s[:k] == pre and p > 0:
            raw[s[k]] = raw.get(s[k], 0) + p
    total = sum(raw.values())
    return {t: p / total for t, p in raw.items()} if total > 0 else {}


def _prefix_counts(counts: Mapping[Output, int], pre: Output) -> dict[int, int]:
    k = len(pre)
    out: dict[int, int] = {}
    for s, c in counts.items():
        if len(s) > k and s[:k] == pre:
            out[s[k]] = out.get(s[k], 0) + c
    return out


def _draw_chunk(sample_fn: Callable[[np.random.Generator], Any], entropy: int, j: int, size: int) -> list[Any]:
    """Chunk ``j``: ``size`` draws with ``default_rng(SeedSequence(entropy, spawn_key=(j,)))``, the
    ``j``-th child of ``SeedSequence(entropy).spawn``. Module level, so executors can pickle it."""
    rng = np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(j,)))
    return [sample_fn(rng) for _ in range(size)]


_NOT_PICKLABLE = ("sample_fn must be picklable to run on a process or cluster executor ({why}): define it at "
                  "module level (not a lambda, closure or local class), or as functools.partial of a "
                  "module-level function; load big objects (models) lazily inside the worker")


def draw_chunks(sample_fn: Callable[[np.random.Generator], Any], n: int, seed: int, chunk_size: int = 1000,
                executor: Executor | None = None) -> list[Any]:
    """``n`` draws ``sample_fn(rng)``, in chunks of ``chunk_size`` with independent
    ``SeedSequence(seed).spawn`` children (see :func:`audit_sampler`), serially or on ``executor``;
    the result depends on ``(seed, chunk_size)`` only, not on the executor. ``TypeError`` naming
    the fix when a process executor cannot pickle ``sample_fn``."""
    sizes = [min(chunk_size, n - start) for start in range(0, n, chunk_size)]
    if executor is None:
        chunks = [_draw_chunk(sample_fn, seed, j, s) for j, s in enumerate(sizes)]
    else:
        if isinstance(executor, ProcessPoolExecutor):
            try:
                pickle.dumps(sample_fn)
            except Exception as e:  # pickle raises PicklingError, AttributeError or TypeError
                raise TypeError(_NOT_PICKLABLE.format(why=f"{type(e).__name__}: {e}")) from e
        try:
            futures = [executor.submit(_draw_chunk, sample_fn, seed, j, s) for j, s in enumerate(sizes)]
            chunks = [f.result() for f in futures]
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            if "pickl" not in str(e).lower():
                raise
            raise TypeError(_NOT_PICKLABLE.format(why=f"{type(e).__name__}: {e}")) from e
    return [x for c in chunks for x in c]


def _pushforward(law: Mapping[Output, Prob], f: Callable[[Output], str]) -> dict[str, Prob]:
    out: dict[str, Prob] = {}
    for s, p in law.items():
        if p > 0:
            key = f(s)
            out[key] = out.get(key, 0) + p
    return out


def _text_counts(counts: Mapping[Output, int], f: Callable[[Output], str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s, c in counts.items():
        key = f(s)
        out[key] = out.get(key, 0) + c
    return out


def audit_sampler(
    sample_fn: Callable[..., Sequence[int]],
    law_or_reference: Mapping[Any, Prob] | Sequence[Sequence[int]],
    n: int | None = None,
    alpha: float = 1e-6,
    eps: float | None = None,
    power: float = 0.99,
    positions: bool = True,
    text: Callable[[Output], str] | None = None,
    rng_note: str = "",
    max_n: int = DEFAULT_MAX_SIZED_N,
    name: str | None = None,
    *,
    seed: int | None = None,
    executor: Executor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    prefixes: Sequence[Sequence[int]] = (),
) -> AuditReport:
    """Draw ``n`` outputs with ``sample_fn()`` and test them against an exact law or reference samples.

    ``law_or_reference``: a ``Mapping`` from output tuples to probabilities (exact ``Fraction``
    or float), or a sequence of reference outputs (two-sample mode). ``alpha`` is the family-wise
    false-fail rate (Holm over all tests); ``eps`` the TV to detect with probability ``power``
    (sizes ``n`` when ``n`` is None, and makes an under-sized ``n`` "inconclusive"); ``positions``
    adds one test per emitted position (law of the j-th token given that the output reaches j);
    ``text`` (a decode callable) adds a test of the law of the decoded text; ``rng_note`` is
    recorded in the report (say which seed you used); ``max_n`` caps the sample size the audit
    picks by itself; ``name`` names the sampler in the report and its plot. See the module
    docstring for the details.

    Seeded and distributed sampling: with ``seed`` (an int >= 0) or ``executor`` (any
    :class:`concurrent.futures.Executor`: a ``ProcessPoolExecutor``, Dask's
    ``Client.get_executor()``, ...), ``sample_fn`` is called as ``sample_fn(rng)`` with a
    ``numpy.random.Generator``: the ``n`` draws are split into chunks of ``chunk_size``, chunk
    ``j`` draws with ``default_rng(SeedSequence(seed, spawn_key=(j,)))`` (the ``j``-th child of
    ``SeedSequence(seed).spawn``), and the chunks are concatenated in order, so the report for a
    given seed is identical whether the chunks ran serially or on any executor (with any number of
    workers). ``seed=None`` with an executor draws fresh entropy (recorded in ``rng_note``). For a
    process or cluster executor, ``sample_fn`` must be picklable (a module-level function or
    class instance, or ``functools.partial`` of one; Dask also takes closures through cloudpickle).

    ``prefixes``: for each given prefix (a tuple of ids), one more chi-square test of the law of
    the next token given that the output starts with the prefix and goes on (exact mode; the
    conditional law is read off the law). Those outputs' next tokens are i.i.d. from it given
    their number, so the test is valid as it stands.

    Everything is checked before the first draw. Raises :class:`~hsd_core.stats.InvalidTest` for
    out-of-range arguments (alpha, power, eps, n < 1; numpy numbers are fine), a law that is not a
    probability law (sum not 1, negative, NaN, empty), or an ``n`` the sizing would pick above
    ``max_n``; ``TypeError`` for law keys, reference outputs or sampler outputs that are not tuples
    (or lists) of int token ids.
    """
    alpha = _check_alpha(alpha)
    power = _check_power(power)
    if eps is not None:
        eps = _check_eps(eps)
    if n is not None:
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
            raise InvalidTest(f"n={n!r} must be a positive integer (or None to size it from eps)")
        n = _check_n(n)
    if isinstance(max_n, (bool, np.bool_)) or not isinstance(max_n, (int, np.integer)) or max_n < 1:
        raise InvalidTest(f"max_n={max_n!r} must be a positive integer")
    if not callable(sample_fn):
        raise TypeError(f"sample_fn must be a callable returning one output per call, got {type(sample_fn).__name__}")
    if name is None:
        name = str(getattr(sample_fn, "__qualname__", "") or type(sample_fn).__name__)
        name = "sampler" if name == "<lambda>" else name

    two_sample = not isinstance(law_or_reference, Mapping)
    law: dict[Output, Prob] = {}
    ref_counts: dict[Output, int] = {}
    n_ref = 0
    if two_sample:
        if isinstance(law_or_reference, (str, bytes)) or not isinstance(law_or_reference, (Sequence, np.ndarray)):
            raise TypeError("law_or_reference must be a Mapping {output tuple: probability} or a sequence of "
                            f"reference outputs, got {type(law_or_reference).__name__}")
        ref_counts = counts_of([_as_output(s, f"reference output {i}") for i, s in enumerate(law_or_reference)])
        if not ref_counts:
            raise ValueError("the reference sample is empty")
        n_ref = sum(ref_counts.values())
        ref_law: dict[Output, Prob] = {s: Fraction(c, n_ref) for s, c in ref_counts.items()}
    else:
        law = _normalise_law(law_or_reference)
        if not law:
            raise ValueError("the law is empty")
        _validate_law(law)  # sums to 1, no negative / NaN entries: before the first draw
        ref_law = law
    k = max(2, sum(1 for p in ref_law.values() if p > 0))
    max_len = max(len(s) for s in ref_law)

    # the plan: how many tests (m) will run
    n_positions = max_len if positions else 0
    pre_list = [_as_output(list(x) if isinstance(x, tuple) else x, f"prefixes[{i}]") for i, x in enumerate(prefixes)]
    if pre_list and two_sample:
        raise ValueError("prefixes= needs an exact law (conditional tests are not run in two-sample mode)")
    m = _num_tests(two_sample, n_positions, text is not None, len(pre_list))
    seeded = seed is not None or executor is not None
    if seed is not None and (isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer))
                             or seed < 0):
        raise InvalidTest(f"seed={seed!r} must be an int >= 0 (or None)")
    if isinstance(chunk_size, (bool, np.bool_)) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise InvalidTest(f"chunk_size={chunk_size!r} must be a positive integer")
    if executor is not None and not isinstance(executor, Executor):
        raise TypeError(f"executor must be a concurrent.futures.Executor, got {type(executor).__name__}")
    a_test = alpha / m

    if n is None:
        if two_sample:
            n = n_ref
        else:
            if eps is None:
                at_cap = _joint_plan(law, DEFAULT_MAX_N, a_test, power).detectable
                if at_cap is None:
                    raise InvalidTest(
                        f"this law ({k} outcomes) is too sparse for the default budget of {DEFAULT_MAX_N} "
                        "samples: pass eps (and max_n) or n")
                eps = max(DEFAULT_EPS, at_cap)
                n = min(_size_for(law, eps, a_test, power, k), DEFAULT_MAX_N)
            else:
                n = _size_for(law, eps, a_test, power, k)
            if n > max_n:
                raise InvalidTest(
                    f"detecting TV {eps:.4g} with power {power} at alpha {alpha:.3g} needs n = {n} samples, "
                    f"above max_n={max_n} (at 100 us per sample that is {n * 1e-4 / 3600:.3g} h): increase eps, "
                    "or pass a larger max_n (or n) if you mean it")

    if seeded:
        entropy = int(np.random.SeedSequence().entropy if seed is None else seed)  # type: ignore[arg-type]
        if seed is None:
            rng_note = (rng_note + "; " if rng_note else "") + f"fresh entropy {entropy}"
        raw = draw_chunks(sample_fn, n, entropy, int(chunk_size), executor)
        samples = [_as_output(x, f"sample_fn(rng) at draw {i}") for i, x in enumerate(raw)]
    else:
        samples = [_as_output(sample_fn(), f"sample_fn() at draw {i}") for i in range(n)]
    counts = counts_of(samples)

    family = TestFamily(alpha, m)
    skipped: list[str] = []
    joint_invalid: str | None = None

    def run(label: str, fn: Callable[[], TestResult], joint: bool = False) -> None:
        nonlocal joint_invalid
        try:
            family.add(fn())
        except InvalidTest as e:
            skipped.append(f"{label}: {e}")
            if joint and joint_invalid is None:
                joint_invalid = f"{label}: {e}"

    if two_sample:
        run("joint chi2", lambda: _two("chi2", "joint", counts, ref_counts, a_test), joint=True)
        run("joint tv", lambda: _two("tv", "joint", counts, ref_counts, a_test))
    else:
        for kind in ("chi2", "g_test", "tv"):
            run(f"joint {kind}", lambda kind=kind: _gof(kind, "joint", law, counts, a_test),  # type: ignore[misc]
                joint=kind == "chi2")
    for j in range(n_positions):
        pc = _position_counts(counts, j)
        label = f"position {j}"
        if not pc:
            skipped.append(f"{label}: no sample reaches position {j}")
            continue
        if two_sample:
            rc = _position_counts(ref_counts, j)
            if not rc:
                skipped.append(f"{label}: no reference sample reaches position {j}")
                continue
            run(label, lambda pc=pc, rc=rc, label=label: _two("chi2", label, pc, rc, a_test))  # type: ignore[misc]
        else:
            pl = _position_law(law, j)
            if not pl:  # samples reach a position the law never reaches
                pl = {-1: Fraction(1)}
            run(label, lambda pc=pc, pl=pl, label=label: _gof("chi2", label, pl, pc, a_test))  # type: ignore[misc]
    for pre in pre_list:
        label = f"after {pre}"
        cc = _prefix_counts(counts, pre)
        cl = _prefix_law(law, pre)
        if not cc:
            skipped.append(f"{label}: no sample starts with {pre} and goes on")
            continue
        if not cl:
            cl = {-1: Fraction(1)}
        run(label, lambda cc=cc, cl=cl, label=label: _gof("chi2", label, cl, cc, a_test))  # type: ignore[misc]
    if text is not None:
        tc = _text_counts(counts, text)
        if two_sample:
            rt = _text_counts(ref_counts, text)
            run("text", lambda: _two("chi2", "text", tc, rt, a_test))
        else:
            tl = _pushforward(law, text)
            run("text", lambda: _gof("chi2", "text", tl, tc, a_test))

    tests = family.results
    holm_rej = tuple(family.verdicts())

    if two_sample:
        plan = _two_sample_plan(counts, ref_counts, a_test, power)
    else:
        plan = _joint_plan(law, n, a_test, power)
    detectable = plan.detectable

    verdict: Verdict
    if any(holm_rej):
        names = [t.name for t, r in zip(tests, holm_rej) if r]
        verdict, reason = "lossy", f"Holm rejects {', '.join(names)} at family-wise alpha {alpha:.3g}"
    elif joint_invalid is not None:
        verdict, reason = "inconclusive", f"the joint test cannot run: {joint_invalid}"
    elif detectable is None:
        verdict, reason = "inconclusive", (f"no test rejects, but n={n} has no power: no TV below 1 is detected "
                                           f"with probability {power} ({plan.by}); increase n")
    elif eps is not None and detectable > eps:
        need = (_size_for(law, eps, a_test, power, k) if not two_sample
                else min_num_samples_for_tv(k, eps, a_test, power))
        verdict, reason = "inconclusive", (f"under-powered: detecting TV {eps:.4g} with power {power} needs "
                                           f"n >= {need}, got n={n} (detectable TV {detectable:.4g})")
    else:
        verdict = "lossless-consistent"
        reason = (f"no test rejects at family-wise alpha {alpha:.3g}; any law at TV >= {detectable:.4g} "
                  f"would be caught with probability >= {power} ({plan.by})")

    pos_det: list[float | None] = []
    if not two_sample:
        for j in range(n_positions):
            pl = _position_law(law, j)
            reach = sum(float(p) for s, p in law.items() if len(s) > j)
            n_j = int(n * reach)
            pos_det.append(_joint_plan(pl, n_j, a_test, power).detectable if pl and n_j > 0 else None)
    expected = {s: n * float(p) for s, p in ref_law.items()}
    keys = list(expected) + [s for s in counts if s not in expected]
    dev = [Deviation(s, counts.get(s, 0), expected.get(s, 0.0)) for s in keys]
    over = tuple(sorted((d for d in dev if d.observed > d.expected), key=lambda d: d.expected - d.observed)[:5])
    under = tuple(sorted((d for d in dev if d.observed < d.expected), key=lambda d: d.observed - d.expected)[:5])

    return AuditReport(
        n=n, alpha=alpha, power=power, eps=eps, m=m,
        tests=tests, holm_rejected=holm_rej, skipped=tuple(skipped), k=k, detectable_tv=detectable,
        verdict=verdict, reason=reason, over=over, under=under,
        mode="two-sample" if two_sample else "exact", rng_note=rng_note,
        observed=dict(counts), expected=expected, detectable_by=plan.by, pooled_mass=plan.pooled_mass,
        name=name, position_detectable=tuple(pos_det),
    )


def _two_sample_plan(counts: Mapping[Output, int], ref: Mapping[Output, int], alpha: float, power: float) -> _Plan:
    """The two-sample analogue of :func:`_joint_plan` (an approximation): the chi-square
    homogeneity table's columns at the effective sample size ``n n_ref / (n + n_ref)``, plus the
    share of both samples in the pooled column."""
    na, nb = sum(counts.values()), sum(ref.values())
    big = na + nb
    cats = set(counts) | set(ref)
    small_row = min(na, nb)
    tot = {x: counts.get(x, 0) + ref.get(x, 0) for x in cats}
    kept = [x for x in cats if small_row * tot[x] / big >= _MIN_EXPECTED]
    pooled = sum(tot[x] for x in cats if x not in set(kept)) / big
    cells = len(kept) + (1 if pooled > 0 else 0)
    n_eff = max(1, int(na * nb / big))
    try:
        d = min_tv_detectable(max(2, cells), n_eff, alpha, power) + pooled
    except InvalidTest:
        return _Plan(None, "two-sample chi-square (n too small)", pooled, cells)
    by = (f"two-sample chi-square on {cells} columns at effective n {n_eff} (approximate)"
          + (f" + pooled share {pooled:.4g}" if pooled else ""))
    return _Plan(d if d < 1.0 else None, by, pooled, cells)


# ---------------------------------------------------------------------------------------------
# The sampled part of ``hsd audit`` (``--sampled N --report PATH.md``)
# ---------------------------------------------------------------------------------------------

def sampled_audit_all(
    methods: Sequence[tuple[str, Any]],
    n: int,
    report_path: str | None = None,
    progress: Any = None,
) -> int:
    """Audit, with ``n`` samples each, every ``(label, method)`` of ``methods`` on the built-in
    world (against the target law; greedy methods against the greedy one) and every variant of
    :data:`hsd_core.variants.VARIANTS` on its pinned world (against the target law).

    Prints one line per sampler (verdict and detectable TV) to stdout and ``[i/total] label ...``
    progress lines to ``progress`` (default stderr). With ``report_path``, writes the markdown
    report there and, when matplotlib is importable, one PNG per sampler next to it. Seeds are
    fixed: ``numpy.random.default_rng(crc32(label))``. Returns 1 if a correct method is found
    lossy, else 0.
    """
    import os
    import zlib

    import numpy as np

    from . import exact, variants
    from .methods import SD
    from .worlds import builtin_world, from_spec

    out = sys.stderr if progress is None else progress
    world = builtin_world()
    jobs: list[tuple[str, bool, Any, Any, Any, str, int]] = []
    for lab, m in methods:
        drafter = world.same_vocab_drafter if isinstance(m, SD) else world.drafter
        jobs.append((lab, True, m, world.target, drafter, world.prompt, world.max_new_tokens))
    for name, mk in variants.VARIANTS.items():
        target, drafter, prompt = from_spec(variants.PINNED[name])
        jobs.append(("variant:" + name, False, mk(), target, drafter, prompt, variants.PINNED_MAX_NEW_TOKENS))
    print()
    print(f"Sampled audit (hsd_core.audit.audit_sampler, n={n} samples each, family-wise alpha 1e-6, "
          "against the target law; variants on their pinned worlds):")
    reports: list[tuple[str, bool, AuditReport]] = []
    for i, (lab, correct, m, target, drafter, prompt, mnt) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] {lab} ...", file=out, flush=True)
        law = exact.target_law(target, prompt, mnt, greedy=m.greedy)
        rng = np.random.default_rng(zlib.crc32(lab.encode()))

        def draw(m: Any = m, target: Any = target, drafter: Any = drafter, prompt: str = prompt,
                 mnt: int = mnt, rng: Any = rng) -> Sequence[int]:
            return list(m.generate(target, drafter, prompt, mnt, rng))

        def decode(s: Output, t: Any = target) -> str:
            return str(t.tokenizer.decode(s))

        rep = audit_sampler(draw, law, n=n, alpha=1e-6, text=decode,
                            rng_note=f"numpy default_rng(crc32({lab!r}))", name=lab)
        reports.append((lab, correct, rep))
        det = "n/a" if rep.detectable_tv is None else f"{rep.detectable_tv:.4f}"
        print(f"  {lab:34s} {rep.verdict:20s} detectable TV {det}")
    bad = [lab for lab, correct, rep in reports if correct and rep.verdict == "lossy"]
    missed = [lab for lab, correct, rep in reports if not correct and rep.verdict != "lossy"]
    if missed:
        print(f"  variants not rejected at n={n} (need more samples, or inconclusive): {missed}")
    if report_path is not None:
        stem, _ = os.path.splitext(report_path)
        parts = [f"# hsd sampled audit (n={n} per sampler)", "",
                 "| sampler | expected | verdict | detectable TV |", "|---|---|---|---|"]
        for lab, correct, rep in reports:
            det = "n/a" if rep.detectable_tv is None else f"{rep.detectable_tv:.4g}"
            parts.append(f"| {lab} | {'lossless' if correct else 'lossy'} | {rep.verdict} | {det} |")
        parts.append("")
        os.makedirs(os.path.dirname(os.path.abspath(report_path)), exist_ok=True)
        for lab, _correct, rep in reports:
            slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in lab)
            png = f"{stem}_{slug}.png"
            parts.append(rep.to_markdown(title=lab))
            if rep.save_plot(png, title=lab):
                parts += [f"![{lab}]({os.path.basename(png)})", ""]
        with open(report_path, "w", encoding="utf-8") as f:
            f.write("\n".join(parts))
        print(f"  report written to {report_path}")
    if bad:
        print(f"ERROR: correct methods found lossy by sampling: {bad}")
        return 1
    return 0
