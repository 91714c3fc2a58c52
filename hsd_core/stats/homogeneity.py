"""Two-sample tests: do two samples come from the same (unknown) law?"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _sps  # type: ignore[import-untyped]

from .checks import _LN2, K, InvalidTest, Samples, TestResult, _check_alpha, _check_k, _log_weissman
from .counts import counts_of
from .pooling import OTHER

__all__ = ["chi_square_two_sample", "tv_two_sample"]


def _two_counts(samples_a: Samples[K], samples_b: Samples[K]) -> tuple[dict[K, int], dict[K, int], int, int]:
    ca, cb = counts_of(samples_a), counts_of(samples_b)
    na, nb = sum(ca.values()), sum(cb.values())
    if na == 0 or nb == 0:
        raise InvalidTest(f"samples are empty (n_a={na}, n_b={nb}); draw at least one sample in each")
    return ca, cb, na, nb


def chi_square_two_sample(samples_a: Samples[K], samples_b: Samples[K], alpha: float, *,
                          min_expected: float = 5.0) -> TestResult:
    """Chi-square test of homogeneity: do the two samples come from the same (unknown) law?

    Builds the 2 x k contingency table over the outcomes seen in either sample, pools every
    outcome whose expected count (row total * column total / N) is below ``min_expected`` in
    either row into one ``"other"`` column (which, if still small, absorbs the kept column with
    the smallest total), and runs ``scipy.stats.chi2_contingency(table, correction=False)``.
    Rejects iff ``p_value <= alpha``; asymptotic false-fail rate ``alpha``.

    Raises :class:`InvalidTest` for empty samples or fewer than 2 columns after pooling.

    >>> r = chi_square_two_sample([0] * 50 + [1] * 50, [0] * 48 + [1] * 52, alpha=0.01)
    >>> r.rejected, r.dof
    (False, 1)
    """
    alpha = _check_alpha(alpha)
    ca, cb, na, nb = _two_counts(samples_a, samples_b)
    cats = list(ca) + [x for x in cb if x not in ca]
    big_n = na + nb
    small_row = min(na, nb)
    col_tot = {x: ca.get(x, 0) + cb.get(x, 0) for x in cats}
    kept = [x for x in cats if small_row * col_tot[x] / big_n >= min_expected]
    kept_set = set(kept)
    other_a = sum(ca.get(x, 0) for x in cats if x not in kept_set)
    other_b = sum(cb.get(x, 0) for x in cats if x not in kept_set)
    if other_a + other_b > 0 and small_row * (other_a + other_b) / big_n < min_expected and kept:
        j = min(range(len(kept)), key=lambda i: col_tot[kept[i]])
        x = kept.pop(j)
        other_a += ca.get(x, 0)
        other_b += cb.get(x, 0)
    rows_a = [ca.get(x, 0) for x in kept]
    rows_b = [cb.get(x, 0) for x in kept]
    labels: list[K | str] = list(kept)
    if other_a + other_b > 0:
        rows_a.append(other_a)
        rows_b.append(other_b)
        labels.append(OTHER)
    if len(labels) < 2:
        raise InvalidTest(
            f"only {len(labels)} column left after pooling (n_a={na}, n_b={nb}); need >= 2 outcomes with "
            f"expected count >= {min_expected} in both samples: increase the sample sizes"
        )
    table = np.array([rows_a, rows_b], dtype=np.int64)
    res = _sps.chi2_contingency(table, correction=False)
    stat, p, dof = float(res[0]), float(res[1]), int(res[2])
    detail = (f"2 x {len(labels)} table (n_a={na}, n_b={nb}; {len(cats) - len(kept)} outcome(s) pooled "
              f"into {OTHER!r}), dof={dof}")
    return TestResult(name="chi2_two_sample", statistic=stat, p_value=p, alpha=alpha, n=big_n,
                      dof=dof, rejected=bool(p <= alpha), detail=detail)


def tv_two_sample(samples_a: Samples[K], samples_b: Samples[K], alpha: float, *,
                  k: int | None = None) -> TestResult:
    """Distribution-free two-sample test: reject iff TV(p_hat_a, p_hat_b) > tau_a + tau_b.

    ``tau_x = sqrt((ln(2^k - 2) + ln(2/alpha)) / (2 n_x))``, so that under the null (one law p)
    ``P(TV(p_hat_x, p) >= tau_x) <= alpha/2`` for each sample and, by the triangle inequality,
    the false-fail rate is at most ``alpha``. ``k`` is the support size of the (unknown) law: pass
    it when known, which makes the guarantee rigorous. By default it is the number of distinct
    outcomes seen in either sample (at least 2), which is exact when every outcome of the law was
    observed. ``p_value = min(1, 2 (2^k - 2) exp(-2 stat^2 / c^2))`` with
    ``c = 1/sqrt(n_a) + 1/sqrt(n_b)`` (the smallest alpha at which the test would reject).
    ``n`` in the result is ``n_a + n_b``.

    >>> r = tv_two_sample([0] * 500 + [1] * 500, [0] * 510 + [1] * 490, alpha=0.01)
    >>> r.rejected, round(r.statistic, 3)
    (False, 0.01)
    """
    alpha = _check_alpha(alpha)
    ca, cb, na, nb = _two_counts(samples_a, samples_b)
    cats = list(ca) + [x for x in cb if x not in ca]
    if k is None:
        k_eff = max(2, len(cats))
    else:
        k_eff = _check_k(k)
        if k_eff < len(cats):
            raise InvalidTest(f"k={k} but the samples show {len(cats)} distinct outcomes; pass k >= {len(cats)}")
    stat = 0.5 * math.fsum(abs(ca.get(x, 0) / na - cb.get(x, 0) / nb) for x in cats)
    log_w = _log_weissman(k_eff)
    big_l = log_w + math.log(2.0 / alpha)
    tau_a, tau_b = math.sqrt(big_l / (2.0 * na)), math.sqrt(big_l / (2.0 * nb))
    c = 1.0 / math.sqrt(na) + 1.0 / math.sqrt(nb)
    log_p = _LN2 + log_w - 2.0 * stat * stat / (c * c)
    p_value = 1.0 if log_p >= 0.0 else math.exp(log_p)
    detail = (f"TV(p_hat_a, p_hat_b) = {stat:.4g} vs threshold tau_a + tau_b = {tau_a:.4g} + {tau_b:.4g} "
              f"(k={k_eff}, n_a={na}, n_b={nb})")
    return TestResult(name="tv_two_sample", statistic=stat, p_value=p_value, alpha=alpha,
                      n=na + nb, dof=None, rejected=stat > tau_a + tau_b, detail=detail)
