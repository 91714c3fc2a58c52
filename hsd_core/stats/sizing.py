"""Sizing: the power of a test, the sample size it needs, the smallest discrepancy it detects."""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize as _opt  # type: ignore[import-untyped]
from scipy import stats as _sps

from .checks import (
    InvalidTest, TestName, _check_alpha, _check_eps, _check_k, _check_n, _check_power, _check_test, _log_weissman,
)

__all__ = ["min_num_samples_for_tv", "min_tv_detectable", "power_chi2"]


def _chi2_power_raw(k: int, n: float, eps: float, crit: float) -> float:
    return float(_sps.ncx2.sf(crit, k - 1, 4.0 * n * eps * eps))


def _tv_n_raw(k: int, eps: float, alpha: float, power: float) -> int:
    tau = eps / 2.0
    delta = min(alpha, 1.0 - power)
    return max(1, math.ceil((_log_weissman(k) + math.log(1.0 / delta)) / (2.0 * tau * tau)))


def power_chi2(k: int, n: int, eps: float, alpha: float) -> float:
    """Power of the (unpooled, k-cell) Pearson chi-square GOF test against the diffuse alternative.

    Returns ``ncx2.sf(chi2.isf(alpha, k-1), k-1, 4 n eps^2)``: the asymptotic probability of
    rejecting, at level ``alpha`` with ``n`` samples, a law at TV ``eps`` from the null whose
    noncentrality ``n * sum((p' - p)^2 / p)`` is the smallest possible, ``4 n eps^2`` (see
    :func:`min_num_samples_for_tv`). It is thus a lower bound on the power against every
    alternative at TV >= eps, for every null on k cells.

    >>> round(power_chi2(8, 42833, 0.02, 1e-6), 4)
    0.99
    """
    k, n, eps, alpha = _check_k(k), _check_n(n), _check_eps(eps), _check_alpha(alpha)
    return _chi2_power_raw(k, n, eps, float(_sps.chi2.isf(alpha, k - 1)))


def min_num_samples_for_tv(k: int, eps: float, alpha: float, power: float = 0.99,
                           test: TestName = "chi2") -> int:
    """Smallest n such that the named test, with k cells and false-fail rate ``alpha``, rejects
    every law at TV distance >= ``eps`` from the null with probability >= ``power``.

    ``test="chi2"`` (and ``"g"``, which has the same asymptotic power): sized with the
    noncentral chi-square approximation, power = ``ncx2.sf(chi2.isf(alpha, k-1), k-1, lam)`` with
    ``lam = n * sum((p' - p)^2 / p)``. We size for the *least favourable* alternative at TV eps,
    the "diffuse" bias: for a uniform null on even k, half the cells get +2 eps/k and half
    -2 eps/k, so ``lam = 4 n eps^2``. By Cauchy-Schwarz, ``sum((p'-p)^2/p) >= (sum |p'-p|)^2 =
    4 eps^2`` for *every* null and alternative, so this n suffices for every alternative at TV >=
    eps (concentrated biases need fewer samples). The guarantee is asymptotic, for the k-cell
    test; it assumes all k cells survive pooling (roughly ``n * min p >= 5``).

    ``test="tv"``: ``n = ceil((ln(2^k - 2) + ln(1/min(alpha, 1 - power))) / (2 tau^2))`` with
    ``tau = eps/2``; the Weissman bound then caps both the false-fail rate of :func:`tv_test`
    (whose threshold is <= tau at this n) and its false-pass rate for TV >= 2 tau = eps.
    Non-asymptotic.

    Raises :class:`InvalidTest` for out-of-range arguments, ``ValueError`` for an unknown test.

    >>> min_num_samples_for_tv(8, 0.02, 1e-6, 0.99)
    42833
    >>> min_num_samples_for_tv(16, 0.02, 1e-6, 0.99, test="tv")
    124530
    """
    k, eps, alpha, power = _check_k(k), _check_eps(eps), _check_alpha(alpha), _check_power(power)
    test = _check_test(test)
    if test == "tv":
        return _tv_n_raw(k, eps, alpha, power)
    crit = float(_sps.chi2.isf(alpha, k - 1))
    hi = 1
    while _chi2_power_raw(k, hi, eps, crit) < power:
        hi *= 2
        if hi > 2**62:
            raise InvalidTest(f"power={power} is unreachable for eps={eps}, alpha={alpha}; increase eps")
    lo = hi // 2 + 1 if hi > 1 else 1
    while lo < hi:  # invariant: power(hi) >= target, power(lo - 1) < target
        mid = (lo + hi) // 2
        if _chi2_power_raw(k, mid, eps, crit) >= power:
            hi = mid
        else:
            lo = mid + 1
    return hi


def min_tv_detectable(k: int, n: int, alpha: float, power: float = 0.99,
                      test: TestName = "chi2") -> float:
    """Smallest TV ``eps`` that the named test, with k cells, n samples and false-fail rate
    ``alpha``, detects with probability >= ``power`` (same model as :func:`min_num_samples_for_tv`).

    It inverts :func:`min_num_samples_for_tv`: ``min_num_samples_for_tv(k, e, alpha, power, test)
    <= n`` for ``e = min_tv_detectable(k, n, alpha, power, test)``, and ``> n`` for any noticeably
    smaller e. Raises :class:`InvalidTest` when n is too small to detect even TV = 1.

    >>> round(min_tv_detectable(8, 42833, 1e-6), 4)
    0.02
    >>> round(min_tv_detectable(16, 124530, 1e-6, test="tv"), 4)
    0.02
    """
    k, n, alpha, power = _check_k(k), _check_n(n), _check_alpha(alpha), _check_power(power)
    test = _check_test(test)

    def too_small() -> InvalidTest:
        need = min_num_samples_for_tv(k, 1.0, alpha, power, test)
        return InvalidTest(
            f"n={n} samples cannot detect even TV=1 with power {power} at alpha={alpha} (k={k}, "
            f"test={test!r}); increase n to at least {need}"
        )

    if test == "tv":
        big_a = _log_weissman(k) + math.log(1.0 / min(alpha, 1.0 - power))
        eps = math.sqrt(2.0 * big_a / n)
        step = 1e-15
        while _tv_n_raw(k, min(eps, 1.0), alpha, power) > n and eps <= 1.0:
            eps *= 1.0 + step
            step *= 2.0
        if eps > 1.0:
            raise too_small()
        return eps
    crit = float(_sps.chi2.isf(alpha, k - 1))
    if _chi2_power_raw(k, n, 1.0, crit) < power:
        raise too_small()

    def gap(lam: float) -> float:
        return float(_sps.ncx2.sf(crit, k - 1, lam)) - power

    hi = 1.0
    while gap(hi) < 0.0:
        hi *= 2.0
    lam = float(_opt.brentq(gap, 0.0, hi, xtol=1e-14, rtol=4 * np.finfo(float).eps, maxiter=500))
    eps = min(1.0, math.sqrt(lam / (4.0 * n)))
    step = 1e-15
    while _chi2_power_raw(k, n, eps, crit) < power:  # make sure eps is on the detectable side
        eps = min(1.0, eps * (1.0 + step))
        step *= 2.0
    return eps
