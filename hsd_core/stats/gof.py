"""One-sample goodness-of-fit tests against an exact law, and the assertion built on them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction  # noqa: F401  (the doctests' exact laws)

import numpy as np
from scipy import stats as _sps  # type: ignore[import-untyped]

from .checks import (
    K, InvalidTest, Law, Prob, Samples, TestName, TestResult, _check_alpha, _check_power, _check_test, _log_weissman,
    _validate_law,
)
from .counts import counts_of
from .pooling import OTHER, pool_cells
from .sizing import min_num_samples_for_tv

__all__ = ["assert_law_matches", "chi_square_gof", "g_test_gof", "gof_test", "tv_test"]


def _impossible(lw: Mapping[K, Prob], counts: Mapping[K, int]) -> dict[K, int]:
    return {x: c for x, c in counts.items() if c > 0 and not (lw.get(x, 0) > 0)}


def _reject_impossible(name: str, alpha: float, n: int, bad: Mapping[K, int]) -> TestResult:
    shown = sorted(bad.items(), key=lambda xc: -xc[1])[:5]
    listed = ", ".join(f"{x!r} (observed {c})" for x, c in shown)
    more = f" and {len(bad) - len(shown)} more" if len(bad) > len(shown) else ""
    return TestResult(
        name=name, statistic=math.inf, p_value=0.0, alpha=alpha, n=n, dof=None, rejected=True,
        detail=(f"{sum(bad.values())} sample(s) on outcome(s) with probability 0 under the law: "
                f"{listed}{more}; the sampler emitted an impossible outcome"),
    )


def _prepare(law: Law[K], samples: Samples[K], alpha: float) -> tuple[float, dict[K, Prob], dict[K, int], int]:
    """Validated (alpha, law, counts, n) for a goodness-of-fit test; InvalidTest if no samples."""
    alpha = _check_alpha(alpha)
    lw, _ = _validate_law(law)
    counts = counts_of(samples)
    n = sum(counts.values())
    if n == 0:
        raise InvalidTest("samples are empty; draw at least one sample")
    return alpha, lw, counts, n


def gof_test(law: Law[K], samples: Samples[K], alpha: float, test: str = "chi2") -> TestResult:
    """Run the goodness-of-fit test named ``test`` ("chi2", "g" or "tv") of ``samples`` against
    ``law`` at false-fail rate ``alpha``. A point-mass law is checked exactly instead (every sample
    must be its one outcome), since no asymptotic test applies to a single cell."""
    test = _check_test(test)
    alpha, lw, counts, n = _prepare(law, samples, alpha)
    support = [x for x, p in lw.items() if p > 0]
    if len(support) == 1:
        bad = _impossible(lw, counts)
        if bad:
            return _reject_impossible(test, alpha, n, bad)
        return TestResult(name=test, statistic=0.0, p_value=1.0, alpha=alpha, n=n, dof=None, rejected=False,
                          detail=f"point-mass law on {support[0]!r}: all {n} samples equal it (exact check)")
    if test == "chi2":
        return chi_square_gof(lw, counts, alpha)
    if test == "g":
        return g_test_gof(lw, counts, alpha)
    return tv_test(lw, counts, alpha)


def _gof(law: Law[K], samples: Samples[K], alpha: float, lambda_: str, name: str,
         min_expected: float, min_kept_mass: float) -> TestResult:
    alpha, lw, counts, n = _prepare(law, samples, alpha)
    bad = _impossible(lw, counts)
    if bad:
        return _reject_impossible(name, alpha, n, bad)
    labels, expected, observed = pool_cells(lw, counts, n, min_expected, min_kept_mass,
                                            absorb_small_other=True)
    if len(labels) < 2:
        support = [x for x, p in lw.items() if p > 0]
        if len(support) == 1:
            raise InvalidTest(
                f"the law is a point mass on {support[0]!r}: a {name} test has nothing to compare; "
                "the zero-probability check (every sample equals that outcome) is the whole test"
            )
        raise InvalidTest(
            f"only {len(labels)} cell left after pooling at n={n} (need >= 2); increase n so that at "
            f"least two cells have expected count >= {min_expected}"
        )
    stat, p = _sps.power_divergence(observed, expected, lambda_=lambda_)
    dof = len(labels) - 1
    contrib = (observed - expected) ** 2 / expected
    top = np.argsort(-contrib)[:3]
    worst = ", ".join(f"{labels[i]!r} (observed {int(observed[i])} vs expected {expected[i]:.1f})" for i in top)
    pooled = len(lw) - (len(labels) - (1 if labels[-1] == OTHER else 0))
    detail = (f"{len(labels)} cells ({pooled} outcome(s) pooled into {OTHER!r}), dof={dof}; "
              f"largest deviations: {worst}")
    stat_f, p_f = float(stat), float(p)
    return TestResult(name=name, statistic=stat_f, p_value=p_f, alpha=alpha, n=n, dof=dof,
                      rejected=bool(p_f <= alpha), detail=detail)


def chi_square_gof(law: Law[K], samples: Samples[K], alpha: float, *, min_expected: float = 5.0,
                   min_kept_mass: float = 0.9) -> TestResult:
    """Pearson chi-square goodness-of-fit test of ``samples`` against ``law``, after pooling.

    Rejects (``p_value <= alpha``) when the samples are unlikely under the law. Any sample on an
    outcome of probability 0 (or absent from the law) rejects outright with ``p_value = 0.0``,
    ``statistic = inf`` and a detail naming the outcome. Otherwise cells are pooled as in
    :func:`pool_cells` (with ``absorb_small_other=True``) and the statistic has ``dof = cells - 1``.
    The false-fail rate is ``alpha`` asymptotically (all pooled cells have expected counts >= 5).

    Raises :class:`InvalidTest` when the samples are empty, the kept cells carry less than
    ``min_kept_mass`` of the mass, or fewer than 2 cells remain after pooling.

    >>> law = {(0,): Fraction(1, 2), (1,): Fraction(1, 2)}
    >>> r = chi_square_gof(law, [(0,)] * 50 + [(1,)] * 50, alpha=0.01)
    >>> r.rejected, r.statistic, r.p_value, r.dof
    (False, 0.0, 1.0, 1)
    >>> chi_square_gof(law, [(0,)] * 99 + [(2,)], alpha=0.01).p_value
    0.0
    """
    return _gof(law, samples, alpha, "pearson", "chi2", min_expected, min_kept_mass)


def g_test_gof(law: Law[K], samples: Samples[K], alpha: float, *, min_expected: float = 5.0,
               min_kept_mass: float = 0.9) -> TestResult:
    """G-test (likelihood-ratio) goodness-of-fit test, ``scipy.stats.power_divergence`` with
    ``lambda_="log-likelihood"``; otherwise the same contract as :func:`chi_square_gof`.

    >>> law = {(0,): Fraction(1, 4), (1,): Fraction(3, 4)}
    >>> r = g_test_gof(law, {(0,): 10, (1,): 90}, alpha=0.01)
    >>> r.rejected, round(r.statistic, 3), r.dof
    (True, 14.492, 1)
    """
    return _gof(law, samples, alpha, "log-likelihood", "g_test", min_expected, min_kept_mass)


def tv_test(law: Law[K], samples: Samples[K], alpha: float) -> TestResult:
    """Distribution-free test: reject iff TV(empirical, law) > tau.

    ``statistic`` is the TV distance between the empirical law and ``law`` (over the law's
    support; any sample outside the support rejects outright with ``p_value = 0.0``). With
    k = max(2, support size), ``tau = sqrt((ln(2^k - 2) + ln(1/alpha)) / (2n))``, so by the
    Weissman et al. bound ``P(TV >= tau) <= (2^k - 2) exp(-2 n tau^2) = alpha``: the false-fail
    rate is at most ``alpha`` for every n, with no asymptotics and no pooling. The same bound caps
    the false-pass rate at ``alpha`` for any true TV >= 2 tau. ``p_value`` is the conservative
    ``min(1, (2^k - 2) exp(-2 n stat^2))``. ``dof`` is None.

    >>> law = {(0,): Fraction(1, 2), (1,): Fraction(1, 2)}
    >>> r = tv_test(law, [(0,)] * 60 + [(1,)] * 40, alpha=0.05)
    >>> r.rejected, round(r.statistic, 3), round(r.p_value, 3)
    (False, 0.1, 0.271)
    """
    alpha, lw, counts, n = _prepare(law, samples, alpha)
    bad = _impossible(lw, counts)
    if bad:
        return _reject_impossible("tv", alpha, n, bad)
    support = [x for x, p in lw.items() if p > 0]
    k = max(2, len(support))
    stat = 0.5 * math.fsum(abs(counts.get(x, 0) / n - float(lw[x])) for x in support)
    log_w = _log_weissman(k)
    tau = math.sqrt((log_w + math.log(1.0 / alpha)) / (2.0 * n))
    log_p = log_w - 2.0 * n * stat * stat
    p_value = 1.0 if log_p >= 0.0 else math.exp(log_p)
    detail = (f"TV(empirical, law) = {stat:.4g} vs threshold tau = {tau:.4g} (k={k}, n={n}); "
              f"false fail <= alpha, and any law at TV >= {2 * tau:.4g} passes with probability <= alpha")
    return TestResult(name="tv", statistic=stat, p_value=p_value, alpha=alpha, n=n, dof=None,
                      rejected=stat > tau, detail=detail)



def assert_law_matches(law: Law[K], samples: Samples[K], alpha: float = 1e-6, eps: float | None = None,
                       power: float = 0.99, test: TestName = "chi2") -> TestResult:
    """Assert that ``samples`` are consistent with ``law``; return the :class:`TestResult`.

    Runs :func:`chi_square_gof` (``test="chi2"``), :func:`g_test_gof` (``"g"``) or :func:`tv_test`
    (``"tv"``) at level ``alpha`` (the false-fail rate). If ``eps`` is given, it first checks that
    the test is powered: ``len(samples) >= min_num_samples_for_tv(k, eps, alpha, power, test)``
    with k the number of outcomes of positive probability (at least 2), and raises
    :class:`InvalidTest` ("under-powered: need n >= ...") if not. Then every law at TV >= eps is
    caught with probability >= ``power``.

    A point-mass law is checked exactly (every sample must equal its outcome). Raises
    ``AssertionError`` when the test rejects, with the statistic, p-value, alpha, n and the 5 most
    over- and under-represented outcomes (observed vs expected counts).

    >>> law = {(0,): Fraction(1, 2), (1,): Fraction(1, 2)}
    >>> assert_law_matches(law, [(0,)] * 500 + [(1,)] * 500).rejected
    False
    >>> assert_law_matches(law, [(0,)] * 900 + [(1,)] * 100)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    AssertionError: chi2 test rejected the law: statistic=640, p_value=...
    """
    power = _check_power(power)
    test = _check_test(test)
    alpha, lw, counts, n = _prepare(law, samples, alpha)
    support = [x for x, p in lw.items() if p > 0]
    if eps is not None:
        need = min_num_samples_for_tv(max(2, len(support)), eps, alpha, power, test)
        if n < need:
            raise InvalidTest(
                f"under-powered: need n >= {need} samples to detect TV >= {eps} with power {power} at "
                f"alpha={alpha} (k={len(support)}, test={test!r}); got n={n}"
            )
    result = gof_test(lw, counts, alpha, test)
    if result.rejected:
        raise AssertionError(_rejection_message(result, lw, counts, n))
    return result


def _rejection_message(result: TestResult, lw: Mapping[K, Prob], counts: Mapping[K, int], n: int) -> str:
    keys = list(lw) + [x for x in counts if x not in lw]
    dev = [(x, counts.get(x, 0), n * float(lw.get(x, 0.0))) for x in keys]
    over = sorted((d for d in dev if d[1] > d[2]), key=lambda d: d[2] - d[1])[:5]
    under = sorted((d for d in dev if d[1] < d[2]), key=lambda d: d[1] - d[2])[:5]

    def fmt(rows: list[tuple[K, int, float]]) -> str:
        return "\n".join(f"    {x!r}: observed {o} vs expected {e:.1f}" for x, o, e in rows) or "    (none)"

    return (
        f"{result.name} test rejected the law: statistic={result.statistic:.4g}, "
        f"p_value={result.p_value:.3g} <= alpha={result.alpha:.3g}, n={n}, dof={result.dof}\n"
        f"  {result.detail}\n"
        f"  most over-represented (observed vs expected count):\n{fmt(over)}\n"
        f"  most under-represented (observed vs expected count):\n{fmt(under)}"
    )
