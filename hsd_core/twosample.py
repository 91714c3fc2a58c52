"""Two-sample audits of whole sequences: does an engine with speculation draw what it draws without?

When the reference law is not the engine's own (an engine's bf16 kernels, its fused processing),
the one question that needs no reference is whether speculation changes the engine's law: draw
sequences with speculation (sample A) and without (sample B) from the same engine, independent
draws, and test that the two laws are equal. Any fixed function of a sequence is a valid two-sample
statistic, so scores computed under a law that is *not* the engine's still give valid tests
(only their power depends on how well the score separates the laws): the log-likelihood under a
reference target, under the drafter (toward which a lossy speculative decoder drifts), their
difference.

**The family** (Holm at ``alpha`` over the ``m`` planned tests, each run at ``alpha / m`` for the
power statement; a test that cannot run is skipped and counts as not rejected):

* ``first-k prefix homogeneity`` for each k of ``prefix_lengths`` (default 1 and 2): within each
  prompt (stratum), the law of the sequence's first k ids (fewer when it ends earlier) is compared
  across the two samples by :func:`hsd_core.stats.chi_square_two_sample` (cells of expected count
  below 5 pooled); the strata's statistics and degrees of freedom add up (independent strata), and
  the sum is referred to the chi-square law (:func:`stratified_homogeneity`);
* ``score <name> (stratified rank test)`` for each given score: within each stratum the scores of
  both samples are ranked (mid-ranks for ties), and van Elteren's stratified Wilcoxon statistic
  ``W = sum_s (R_s - a_s (n_s + 1) / 2) / (n_s + 1)`` (``R_s`` the rank sum of sample A, ``a_s``
  and ``b_s`` the sizes, ``n_s = a_s + b_s``) is divided by its exact permutation standard
  deviation and referred to N(0, 1), two-sided (:func:`stratified_rank_test`).

Both are asymptotic (chi-square and normal approximations, as the rest of :mod:`hsd_core.stats`);
``tests/stats/test_twosample.py`` checks the family's false-fail rate on toy engines by simulation.
Every test's validity needs only that, within a stratum, the draws are independent and each
sample's draws share one law: prompts may come in any mix, since the statistics compare within
prompts.

**The promise** (:class:`TwoSamplePower`), per test at ``alpha / m`` with probability ``power``:

* prefix homogeneity: any pair of laws at total variation ``eps`` (on the tested cells) in every
  stratum, with ``eps = min_tv_detectable(dof + 1, floor(N_h), alpha / m, power)``
  (:func:`hsd_core.stats.min_tv_detectable`: the non-central chi-square with the least favourable
  non-centrality ``4 N_h eps^2``), ``N_h = sum_s a_s b_s / n_s`` (half the per-sample size for equal
  samples); one stratum: :func:`min_tv_detectable_two_sample` / :func:`min_num_samples_two_sample`;
* a score: any shift ``delta`` of the probability of superiority ``P(S_A > S_B) + P(S_A = S_B) / 2
  - 1/2`` (the same in every stratum), with ``delta = (z_{1 - alpha/(2m)} + z_power) / sqrt(12 S)``,
  ``S = sum_s a_s b_s / (n_s + 1)`` (normal approximation with the null variance, small shifts;
  ties only lower the variance, so they only add power): :func:`min_shift_detectable_rank` /
  :func:`min_num_samples_rank`. A shift ``delta`` of a score implies a total variation of at least
  ``delta`` between the sequence laws, not the converse: the score tests see departures that move
  the score.

Greedy samples (``do_sample=False``) are compared exactly: within each stratum, when sample B (no
speculation) is deterministic, every draw of A must equal it ("lossy" otherwise); when B itself is
not deterministic, the engine's greedy output depends on something other than the prompt (batch
composition, numerics) and the verdict is "inconclusive". The tests are combined and the verdict
given as in every audit (:mod:`hsd_core.stats.family`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import optimize as _opt  # type: ignore[import-untyped]
from scipy import stats as _sps

from .stats.checks import InvalidTest, TestResult, _check_alpha, _check_power
from .stats.family import TestFamily, Verdict, decide
from .stats.homogeneity import chi_square_two_sample
from .stats.sizing import min_num_samples_for_tv, min_tv_detectable

__all__ = ["TwoSamplePower", "TwoSampleReport", "min_num_samples_rank", "min_num_samples_two_sample",
           "min_shift_detectable_rank", "min_tv_detectable_two_sample", "stratified_homogeneity",
           "stratified_rank_test", "two_sample_sequences"]

F64 = NDArray[np.float64]
DEFAULT_PREFIX_LENGTHS = (1, 2)


def min_tv_detectable_two_sample(k: int, n_a: int, n_b: int, alpha: float, power: float = 0.99) -> float:
    """Smallest total variation between two laws on ``k`` cells that the two-sample chi-square
    homogeneity test (:func:`hsd_core.stats.chi_square_two_sample`, unpooled) detects with
    probability >= ``power`` at level ``alpha`` from samples of sizes ``n_a`` and ``n_b``: the
    one-sample sizing (:func:`hsd_core.stats.min_tv_detectable`) at the effective size
    ``floor(n_a n_b / (n_a + n_b))``, whose non-centrality bound ``4 n_h eps^2`` holds for the
    homogeneity test too (by Cauchy-Schwarz on the pooled law). Asymptotic. Raises
    :class:`~hsd_core.stats.InvalidTest` when the samples cannot detect even TV 1.

    >>> round(min_tv_detectable_two_sample(8, 85666, 85666, 1e-6), 4)
    0.02
    """
    for name, v in (("n_a", n_a), ("n_b", n_b)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise InvalidTest(f"{name}={v!r} must be an int >= 1")
    n_h = max(1, int(n_a) * int(n_b) // (int(n_a) + int(n_b)))
    return min_tv_detectable(k, n_h, alpha, power)


def min_num_samples_two_sample(k: int, eps: float, alpha: float, power: float = 0.99) -> int:
    """Smallest size ``n`` of each of two equal samples at which the two-sample chi-square
    homogeneity test detects every pair of laws on ``k`` cells at TV >= ``eps`` with probability
    >= ``power`` at level ``alpha``: twice :func:`hsd_core.stats.min_num_samples_for_tv` (the
    effective size of two samples of ``n`` is ``n / 2``). The pair of :func:`min_tv_detectable_two_sample`.

    >>> min_num_samples_two_sample(8, 0.02, 1e-6)
    85666
    """
    return 2 * min_num_samples_for_tv(k, eps, alpha, power)


def _z(alpha: float, power: float) -> float:
    return float(_sps.norm.isf(alpha / 2) + _sps.norm.ppf(power))


def min_shift_detectable_rank(sizes: Sequence[tuple[int, int]], alpha: float, power: float = 0.99) -> float:
    """Smallest shift ``delta`` of the probability of superiority (module docstring) that the
    stratified rank test (:func:`stratified_rank_test`, two-sided at ``alpha``) detects with
    probability >= ``power``, for strata of sizes ``sizes`` (``(a_s, b_s)`` pairs):
    ``(z_{1-alpha/2} + z_power) / sqrt(12 sum_s a_s b_s / (a_s + b_s + 1))`` (normal approximation).
    Raises :class:`~hsd_core.stats.InvalidTest` when no shift up to 1/2 is detectable.

    >>> round(min_shift_detectable_rank([(1000, 1000)], 1e-3), 4)
    0.0725
    """
    alpha, power = _check_alpha(alpha), _check_power(power)
    s = sum(a * b / (a + b + 1) for a, b in sizes if a > 0 and b > 0)
    if s <= 0:
        raise InvalidTest("no stratum has draws in both samples: nothing to compare")
    d = _z(alpha, power) / math.sqrt(12.0 * s)
    if d > 0.5:
        raise InvalidTest(f"the samples cannot detect even the largest shift (1/2) with power {power} at alpha {alpha}: "
                          f"draw at least {min_num_samples_rank(0.5, alpha, power)} per sample")
    return d


def min_num_samples_rank(delta: float, alpha: float, power: float = 0.99) -> int:
    """Smallest size ``n`` of each of two equal samples (one stratum) at which the rank test detects a
    shift ``delta`` in (0, 1/2] of the probability of superiority with probability >= ``power`` at
    level ``alpha``; the pair of :func:`min_shift_detectable_rank`.

    >>> min_num_samples_rank(0.0726, 1e-3)
    999
    """
    alpha, power = _check_alpha(alpha), _check_power(power)
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta <= 0.5:
        raise InvalidTest(f"delta={delta!r} must be a number in (0, 0.5]")
    z = _z(alpha, power)

    def gap(n: float) -> float:
        return delta * math.sqrt(12.0 * n * n / (2 * n + 1)) - z

    hi = 2.0
    while gap(hi) < 0:
        hi *= 2
    n = math.ceil(float(_opt.brentq(gap, 1.0, hi)) - 1e-9) if gap(1.0) < 0 else 1
    while gap(n) < 0:
        n += 1
    return n


def stratified_homogeneity(a: Sequence[Sequence[Hashable]], b: Sequence[Sequence[Hashable]], alpha: float,
                           name: str = "stratified homogeneity") -> tuple[TestResult, int, float]:
    """Chi-square homogeneity of the outcomes ``a[s]`` and ``b[s]`` of each stratum ``s``, summed
    over the strata where :func:`hsd_core.stats.chi_square_two_sample` runs (both samples present,
    at least two columns left after pooling). Returns the result (statistic, p-value, total degrees
    of freedom), that total, and the effective size ``N_h = sum_s a_s b_s / (a_s + b_s)`` of the
    strata that ran (for :func:`min_tv_detectable_two_sample`-style sizing). Raises
    :class:`~hsd_core.stats.InvalidTest` when no stratum can be tested."""
    alpha = _check_alpha(alpha)
    if len(a) != len(b):
        raise ValueError(f"a has {len(a)} strata and b {len(b)}: give both samples' outcomes stratum by stratum")
    stat, dof, used, n_h, n = 0.0, 0, 0, 0.0, 0
    for sa, sb in zip(a, b):
        if not sa or not sb:
            continue
        try:
            r = chi_square_two_sample(list(sa), list(sb), alpha)
        except InvalidTest:
            continue
        assert r.dof is not None
        stat += r.statistic
        dof += r.dof
        used += 1
        n_h += len(sa) * len(sb) / (len(sa) + len(sb))
        n += len(sa) + len(sb)
    if used == 0:
        raise InvalidTest(f"{name}: no stratum has two outcomes of expected count >= 5 in both samples; draw more")
    p = float(_sps.chi2.sf(stat, dof))
    res = TestResult(name=name, statistic=stat, p_value=p, alpha=alpha, n=n, dof=dof, rejected=p <= alpha,
                     detail=f"{used} of {len(a)} strata tested, dof {dof}, effective size {n_h:.1f}")
    return res, dof, n_h


def stratified_rank_test(a: Sequence[ArrayLike], b: Sequence[ArrayLike], alpha: float,
                         name: str = "stratified rank test") -> TestResult:
    """Van Elteren's stratified Wilcoxon rank-sum test of ``a[s]`` against ``b[s]`` (module
    docstring): two-sided, normal approximation with the exact permutation variance (mid-ranks for
    ties; ``-inf`` and ``+inf`` are ordinary values, NaN is refused). The statistic reported is the
    standardized ``Z`` (> 0: sample A scores higher). Raises :class:`~hsd_core.stats.InvalidTest`
    when no stratum has two distinct values across both samples."""
    alpha = _check_alpha(alpha)
    if len(a) != len(b):
        raise ValueError(f"a has {len(a)} strata and b {len(b)}: give both samples' scores stratum by stratum")
    w = var = 0.0
    n = used = 0
    for sa, sb in zip(a, b):
        xa, xb = np.asarray(sa, dtype=np.float64), np.asarray(sb, dtype=np.float64)
        if xa.size == 0 or xb.size == 0:
            continue
        x = np.concatenate([xa, xb])
        if np.isnan(x).any():
            raise ValueError(f"{name}: a score is NaN; every score must be a number (infinities are allowed)")
        r = _sps.rankdata(x)
        ns, na, nb = x.size, xa.size, xb.size
        v = na * nb / (ns * (ns - 1)) * float(((r - (ns + 1) / 2) ** 2).sum()) if ns > 1 else 0.0
        if v <= 0:
            continue
        w += (float(r[:na].sum()) - na * (ns + 1) / 2) / (ns + 1)
        var += v / (ns + 1) ** 2
        n += ns
        used += 1
    if used == 0:
        raise InvalidTest(f"{name}: no stratum has two distinct scores across both samples")
    z = w / math.sqrt(var)
    p = float(min(1.0, 2 * _sps.norm.sf(abs(z))))
    return TestResult(name=name, statistic=z, p_value=p, alpha=alpha, n=n, dof=None, rejected=p <= alpha,
                      detail=f"{used} of {len(a)} strata, Z {z:.4g} (> 0: sample A scores higher)")


@dataclass(frozen=True)
class TwoSamplePower:
    """What one test of the family catches with probability >= ``power`` at ``alpha / m``:
    ``detectable`` in ``unit`` (``"TV"`` for the prefix tests, ``"shift of P(A > B)"`` for a
    score); None when the test could not run."""

    test: str
    detectable: float | None
    unit: str
    note: str


@dataclass(frozen=True)
class TwoSampleReport:
    """Result of :func:`two_sample_sequences` (module docstring): the sizes, the family (each test
    at ``alpha / m``, ``holm_rejected`` the corrected verdicts), what each test detects, and for
    greedy samples the strata where the outputs differ (``greedy_mismatch``)."""

    verdict: Verdict
    reason: str
    n_a: int
    n_b: int
    strata: int
    alpha: float
    power: float
    m: int
    tests: tuple[TestResult, ...]
    holm_rejected: tuple[bool, ...]
    skipped: tuple[str, ...]
    powers: tuple[TwoSamplePower, ...]
    do_sample: bool = True
    name_a: str = "A"
    name_b: str = "B"
    greedy_mismatch: tuple[str, ...] = ()
    max_detectable_tv: float | None = None
    """The TV the first-token homogeneity test had to detect for a "lossless-consistent" verdict
    (None: no such requirement)."""

    def to_markdown(self, title: str | None = None) -> str:
        """The report as a markdown section."""
        lines = [f"## {title or f'Two-sample audit: {self.name_a} against {self.name_b}'}", "",
                 f"**Verdict: {self.verdict}** ({self.reason})", "",
                 f"- {self.n_a} sequences in {self.name_a}, {self.n_b} in {self.name_b}, {self.strata} prompts; "
                 + ("sampling" if self.do_sample else "greedy (exact comparison)")]
        if self.do_sample:
            lines.append(f"- family-wise alpha = {self.alpha:.3g} (Holm over m = {self.m} tests, each at "
                         f"{self.alpha / self.m:.3g}); power = {self.power}")
            lines += ["", "| test | statistic | p-value | n | Holm rejects | detectable with probability "
                      f">= {self.power} |", "|---|---|---|---|---|---|"]
            for r, rej in zip(self.tests, self.holm_rejected):
                pw = next((q for q in self.powers if q.test == r.name), None)
                det = "n/a" if pw is None or pw.detectable is None else f"{pw.unit} {pw.detectable:.4g}"
                lines.append(f"| {r.name} | {r.statistic:.4g} | {r.p_value:.3g} | {r.n} | "
                             f"{'**yes**' if rej else 'no'} | {det} |")
            if self.skipped:
                lines += ["", "Skipped tests:"] + [f"- {s}" for s in self.skipped]
        for g in self.greedy_mismatch[:5]:
            lines.append(f"- {g}")
        return "\n".join(lines) + "\n"


def _group(strata: Sequence[Hashable], items: Sequence[object]) -> dict[Hashable, list[int]]:
    out: dict[Hashable, list[int]] = {}
    for i, s in enumerate(strata):
        out.setdefault(s, []).append(i)
    if len(strata) != len(items):
        raise ValueError(f"{len(strata)} strata for {len(items)} sequences: give one stratum (prompt) per sequence")
    return out


def _greedy(seqs_a: Sequence[Sequence[int]], seqs_b: Sequence[Sequence[int]], ga: Mapping[Hashable, list[int]],
            gb: Mapping[Hashable, list[int]], common: list[Hashable]) -> tuple[Verdict, str, tuple[str, ...]]:
    wobbly, wrong = [], []
    for k, s in enumerate(common):
        outs_b = {tuple(seqs_b[i]) for i in gb[s]}
        outs_a = {tuple(seqs_a[i]) for i in ga[s]}
        if len(outs_b) > 1:
            wobbly.append(f"prompt {k}: {len(outs_b)} different greedy outputs without speculation")
        elif outs_a - outs_b:
            bad = sum(tuple(seqs_a[i]) not in outs_b for i in ga[s])
            ref = next(iter(outs_b))
            first = next(tuple(seqs_a[i]) for i in ga[s] if tuple(seqs_a[i]) not in outs_b)
            j = next((j for j, (x, y) in enumerate(zip(first, ref)) if x != y), min(len(first), len(ref)))
            wrong.append(f"prompt {k}: {bad} of {len(ga[s])} draws differ from the output without speculation, "
                         f"first at position {j}")
    verdict, reason = decide(None, failures=[
        f"greedy outputs with speculation differ from the engine's deterministic output without it in {len(wrong)} "
        f"of {len(common)} prompts"] if wrong else [], doubts=[lambda: None if not wobbly else (
            f"the engine's greedy output without speculation is not deterministic in {len(wobbly)} of {len(common)} "
            "prompts (batching or numerics): no exact comparison")],
        promise=lambda: f"every greedy draw with speculation equals the engine's output without it ({len(common)} prompts)")
    return verdict, reason, tuple(wrong + wobbly)


def two_sample_sequences(
    seqs_a: Sequence[Sequence[int]],
    strata_a: Sequence[Hashable],
    seqs_b: Sequence[Sequence[int]],
    strata_b: Sequence[Hashable],
    *,
    scores: Mapping[str, tuple[ArrayLike, ArrayLike]] | None = None,
    alpha: float = 1e-3,
    power: float = 0.99,
    prefix_lengths: Sequence[int] = DEFAULT_PREFIX_LENGTHS,
    do_sample: bool = True,
    name_a: str = "A",
    name_b: str = "B",
    max_detectable_tv: float | None = None,
) -> TwoSampleReport:
    """Test that sequences ``seqs_a`` (e.g. with speculation) and ``seqs_b`` (without) share one law
    within each stratum (``strata_a[i]``: the prompt of ``seqs_a[i]``, any hashable; the same for
    B), by the family of the module docstring. ``scores``: name -> (one score per sequence of A,
    one per sequence of B), any fixed function of a sequence (and its prompt). Only strata present
    in both samples are compared. Returns a :class:`TwoSampleReport`: "lossy" when Holm rejects
    (or, greedy, a draw differs from a deterministic output), "inconclusive" when no test could
    run or none could catch any departure (no power), or (sampling, ``max_detectable_tv`` given) when
    the first-token homogeneity test cannot
    detect a TV of ``max_detectable_tv`` (a verdict never hides a weak promise), else
    "lossless-consistent" with the detectable departures stated; by :func:`hsd_core.stats.decide`."""
    alpha, power = _check_alpha(alpha), _check_power(power)
    ga, gb = _group(strata_a, seqs_a), _group(strata_b, seqs_b)
    common = [s for s in ga if s in gb]
    base: dict[str, Any] = dict(n_a=len(seqs_a), n_b=len(seqs_b), strata=len(common), alpha=alpha, power=power, name_a=name_a,
                name_b=name_b, do_sample=do_sample, max_detectable_tv=max_detectable_tv)
    if not common:
        verdict, reason = decide(None, doubts=[lambda: "no prompt occurs in both samples: nothing to compare"],
                                 promise=lambda: "")
        return TwoSampleReport(verdict=verdict, reason=reason, m=1, tests=(), holm_rejected=(), skipped=(), powers=(),
                               **base)
    if not do_sample:
        verdict, reason, mism = _greedy(seqs_a, seqs_b, ga, gb, common)
        return TwoSampleReport(verdict=verdict, reason=reason, m=1, tests=(), holm_rejected=(), skipped=(), powers=(),
                               greedy_mismatch=mism, **base)
    scores = dict(scores or {})
    for nm, (sa, sb) in scores.items():
        if np.size(sa) != len(seqs_a) or np.size(sb) != len(seqs_b):
            raise ValueError(f"score {nm!r} has {np.size(sa)} and {np.size(sb)} values for {len(seqs_a)} and {len(seqs_b)} "
                             "sequences: give one score per sequence")
    ks = [int(k) for k in prefix_lengths]
    m = len(ks) + len(scores)
    if m == 0:
        raise ValueError("no test to run: give prefix_lengths or scores")
    family = TestFamily(alpha, m)
    powers = _run_family(family, seqs_a, seqs_b, [(ga[s], gb[s]) for s in common], ks, scores, power)

    def no_power() -> str | None:  # a verdict that could not have been "lossy" is no verdict
        if any(q.detectable is not None for q in powers):
            return None
        return (f"no test rejects, but with {len(seqs_a)} and {len(seqs_b)} sequences no test could catch any "
                f"departure with probability >= {power} at alpha {alpha:.3g} (no power): more sequences are needed")

    def too_weak() -> str | None:
        first = next((q.detectable for q in powers if q.test == "first-token homogeneity"), None)
        if max_detectable_tv is None or (first is not None and first <= max_detectable_tv):
            return None
        return (f"no test rejects, but the first-token homogeneity test detects only TV "
                f"{'n/a' if first is None else f'{first:.3g}'}, above max_detectable_tv {max_detectable_tv:.3g}: "
                "more sequences are needed")

    verdict, reason = decide(family, doubts=[no_power, too_weak], promise=lambda: (
        f"no test rejects at family-wise alpha {alpha:.3g}; caught with probability >= {power}: "
        + (", ".join(f"{q.test}: {q.unit} {q.detectable:.3g}" for q in powers if q.detectable is not None)
           or "nothing (too few draws)")))
    if verdict == "lossy":
        reason += f": the laws of {name_a} and {name_b} differ"
    return TwoSampleReport(verdict=verdict, reason=reason, m=m, tests=family.results,
                           holm_rejected=tuple(family.verdicts()), skipped=family.skipped, powers=tuple(powers), **base)


def _run_family(family: TestFamily, seqs_a: Sequence[Sequence[int]], seqs_b: Sequence[Sequence[int]],
                strata: Sequence[tuple[list[int], list[int]]], ks: Sequence[int],
                scores: Mapping[str, tuple[ArrayLike, ArrayLike]], power: float) -> list[TwoSamplePower]:
    """Run the family of :func:`two_sample_sequences` into ``family`` over the common ``strata``
    (each: the indices of its sequences in A and in B); return what each test that ran detects."""
    a_m = family.per_test_alpha
    powers: list[TwoSamplePower] = []
    for k in ks:
        nm = f"first-{k} prefix homogeneity" if k > 1 else "first-token homogeneity"
        try:
            res, dof, n_h = stratified_homogeneity([[tuple(seqs_a[i][:k]) for i in ia] for ia, _ in strata],
                                                   [[tuple(seqs_b[i][:k]) for i in ib] for _, ib in strata], a_m, nm)
        except InvalidTest as e:
            family.skip(f"{nm}: {e}")
            continue
        family.add(res)
        try:
            det: float | None = min_tv_detectable(dof + 1, max(1, int(n_h)), a_m, power)
        except InvalidTest:
            det = None
        powers.append(TwoSamplePower(nm, det, "TV", "the same TV between the prefix laws in every tested prompt, "
                                                    "on the tested (pooled) cells"))
    for nm0, (sa, sb) in scores.items():
        nm = f"score {nm0} (stratified rank test)"
        xa, xb = np.asarray(sa, dtype=np.float64), np.asarray(sb, dtype=np.float64)
        if family.run(nm, lambda nm=nm, xa=xa, xb=xb: stratified_rank_test(  # type: ignore[misc]
                [xa[ia] for ia, _ in strata], [xb[ib] for _, ib in strata], a_m, nm)) is None:
            continue
        try:
            det = min_shift_detectable_rank([(len(ia), len(ib)) for ia, ib in strata], a_m, power)
        except InvalidTest:
            det = None
        powers.append(TwoSamplePower(nm, det, "shift of P(A > B)", "the same shift of the probability of "
                                                                    "superiority in every prompt"))
    return powers
