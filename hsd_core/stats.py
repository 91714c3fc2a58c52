"""Sized statistical tests for samplers: goodness of fit, two-sample tests, sizing, multiple testing.

``hsd_core`` proves losslessness exactly, on ``fractions.Fraction`` laws. The tests here check the
*sampler implementations* (indexing, RNG use, float paths) against those exact laws, so every test
is a designed experiment, as in TFP's ``statistical_testing``:

* pick a false-fail rate ``alpha`` (the probability that a correct sampler fails the test),
* pick a discrepancy to detect, as a total-variation distance ``eps``, and a ``power``
  (1 - false-pass rate against any law at TV >= eps),
* derive the sample size with :func:`min_num_samples_for_tv` (or, for a given sample size, the
  smallest detectable TV with :func:`min_tv_detectable`), and run the test.

Glossary
--------
law
    A ``Mapping[K, float | Fraction]`` from hashable outcomes (typically tuples of token ids) to
    probabilities. Exact laws (all entries ``Fraction``/``int``) must sum to exactly 1; float laws
    to 1 within ``FLOAT_TOL``. Outcomes absent from the mapping have probability 0.
samples
    A ``Sequence[K]`` of outcomes, or a ``Mapping[K, int]`` of counts (see :func:`counts_of`).
cell
    One outcome of the law in a chi-square table. Cells whose expected count ``n*p`` is below
    ``min_expected`` are pooled into one ``"other"`` cell (:func:`pool_cells`).
false fail / false pass
    Rejecting a correct sampler / accepting a wrong one. Families of tests share one false-fail
    budget through :class:`TestFamily` (Holm or Bonferroni).

Two kinds of tests are offered. The chi-square and G tests (:func:`chi_square_gof`,
:func:`g_test_gof`, :func:`chi_square_two_sample`) rely on the usual asymptotics (every pooled
cell has an expected count >= 5). The TV tests (:func:`tv_test`, :func:`tv_two_sample`) are
distribution-free: their false-fail rate is at most ``alpha`` for every n, by the L1 deviation
bound of Weissman, Ordentlich, Seroussi, Verdu and Weinberger (2003),
``P(||p_hat - p||_1 >= e) <= (2^k - 2) exp(-n e^2 / 2)``, but they need about 2-3 times more
samples. A sample on an outcome of probability 0 rejects every one-sample test outright.

Errors: :class:`InvalidTest` (a ``ValueError``) means "this configuration cannot give a meaningful
answer" (too few samples, too sparse a law, unreachable power, bad alpha); its message says what
to change. ``AssertionError`` (from :func:`assert_law_matches`) means "the sampler is wrong".
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from numbers import Rational, Real
from typing import Any, ClassVar, Literal, TypeVar, Union, overload

import numpy as np
from numpy.typing import NDArray
from scipy import optimize as _opt  # type: ignore[import-untyped]
from scipy import stats as _sps

__all__ = [
    "FLOAT_TOL", "OTHER", "InvalidTest", "TestFamily", "TestResult",
    "assert_law_matches", "bonferroni", "chi_square_gof", "chi_square_two_sample", "counts_of",
    "empirical_law", "g_test_gof", "holm", "min_num_samples_for_tv", "min_tv_detectable",
    "pool_cells", "power_chi2", "total_variation", "tv_test", "tv_two_sample",
]

K = TypeVar("K", bound=Hashable)
Prob = Union[float, Fraction]
Law = Mapping[K, Prob]
Samples = Union[Sequence[K], Mapping[K, int]]
TestName = Literal["chi2", "g", "tv"]

FLOAT_TOL = 1e-9
"""Float laws must sum to 1 within this tolerance (exact laws: exactly)."""

OTHER = "other"
"""Label of the pooled cell returned by :func:`pool_cells`."""

_LN2 = math.log(2.0)
_TESTS = ("chi2", "g", "tv")


class InvalidTest(ValueError):
    """The test configuration cannot give a meaningful answer; the message says what to change.

    Raised for too few samples (under-powered or too sparse for pooling), unreachable power, an
    alpha/power/eps/k/n out of range, empty samples, or a law that is not a probability law. It is
    distinct from ``AssertionError``, which means the sampler was found to be wrong.
    """


@dataclass(frozen=True)
class TestResult:
    """Outcome of one statistical test.

    ``rejected`` is True iff the test rejects the null hypothesis (the sampler's law equals the
    given law, or the two samples share a law) at level ``alpha``. ``p_value`` is a valid (for the
    TV tests: conservative) p-value, so ``rejected`` implies ``p_value <= alpha`` (up to rounding).
    ``dof`` is the chi-square degrees of freedom, or None for tests without one. ``detail`` is a
    human-readable account (cells, pooling, thresholds, offending outcomes).
    """

    __test__: ClassVar[bool] = False  # not a pytest test class

    name: str
    statistic: float
    p_value: float
    alpha: float
    n: int
    dof: int | None
    rejected: bool
    detail: str


# ---------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------

def _check_prob_param(value: float, name: str, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidTest(f"{name}={value!r} must be a number strictly between 0 and 1 (e.g. {example})")
    v = float(value)
    if not (0.0 < v < 1.0):
        raise InvalidTest(f"{name}={value!r} must lie strictly between 0 and 1 (e.g. {example})")
    return v


def _check_alpha(alpha: float, name: str = "alpha") -> float:
    return _check_prob_param(alpha, name, f"{name}=1e-6")


def _check_power(power: float) -> float:
    return _check_prob_param(power, "power", "power=0.99")


def _check_int(value: int, name: str, minimum: int) -> int:
    if isinstance(value, bool):
        raise InvalidTest(f"{name}={value!r} must be an integer >= {minimum}")
    try:
        v = operator.index(value)
    except TypeError:
        raise InvalidTest(f"{name}={value!r} must be an integer >= {minimum}") from None
    if v < minimum:
        raise InvalidTest(f"{name}={value!r} must be an integer >= {minimum}")
    return v


def _check_k(k: int) -> int:
    return _check_int(k, "k", 2)


def _check_n(n: int) -> int:
    return _check_int(n, "n", 1)


def _check_eps(eps: float) -> float:
    if isinstance(eps, bool) or not isinstance(eps, Real):
        raise InvalidTest(f"eps={eps!r} must be a TV distance in (0, 1]")
    v = float(eps)
    if not (0.0 < v <= 1.0):
        raise InvalidTest(f"eps={eps!r} must be a TV distance in (0, 1] (TV is at most 1)")
    return v


def _check_test(test: str) -> TestName:
    if test not in _TESTS:
        raise ValueError(f"test={test!r} is not one of {_TESTS}")
    return test  # type: ignore[return-value]


def _validate_law(law: Law[K], where: str = "law") -> tuple[dict[K, Prob], bool]:
    """Return (law as a dict of Fraction or float entries, exact?) or raise InvalidTest."""
    if not isinstance(law, Mapping):
        raise ValueError(f"{where} must be a Mapping from outcomes to probabilities, got {type(law).__name__}")
    if len(law) == 0:
        raise InvalidTest(f"{where} is empty; a law needs at least one outcome with probability 1")
    out: dict[K, Prob] = {}
    exact = True
    for x, v in law.items():
        if isinstance(v, bool):
            raise InvalidTest(f"{where}[{x!r}] = {v!r} is a bool, not a probability")
        if isinstance(v, Rational):
            out[x] = Fraction(int(v.numerator), int(v.denominator))
        elif isinstance(v, Real):
            f = float(v)
            if not math.isfinite(f):
                raise InvalidTest(f"{where}[{x!r}] = {v!r} is NaN or infinite")
            out[x] = f
            exact = False
        else:
            raise InvalidTest(f"{where}[{x!r}] = {v!r} is not a number")
        if out[x] < 0:
            raise InvalidTest(f"{where}[{x!r}] = {v!r} is negative")
    if exact:
        total = sum(out.values(), Fraction(0))
        if total != 1:
            raise InvalidTest(f"{where} sums to {total} (exact law), not 1; normalise it")
    else:
        ftotal = math.fsum(float(v) for v in out.values())
        if abs(ftotal - 1.0) > FLOAT_TOL:
            raise InvalidTest(f"{where} sums to {ftotal!r}, not 1 within {FLOAT_TOL}; normalise it")
    return out, exact


def _log_weissman(k: int) -> float:
    """ln(2^k - 2) for k >= 2, computed in log space (no overflow for any k)."""
    return k * _LN2 + math.log1p(-(2.0 ** (1 - k)))


# ---------------------------------------------------------------------------------------------
# Helpers on laws and samples
# ---------------------------------------------------------------------------------------------

@overload
def counts_of(samples: NDArray[Any]) -> dict[Any, int]: ...
@overload
def counts_of(samples: Samples[K]) -> dict[K, int]: ...


def counts_of(samples: Samples[K] | NDArray[Any]) -> dict[Any, int]:
    """Count the outcomes in ``samples``; a ``Mapping`` is taken as counts already.

    Returns a dict from outcome to positive count (zero counts are dropped), in order of first
    appearance. A 1-d numpy array counts its elements; a 2-d array counts its rows as tuples.
    Raises ``ValueError`` for negative or non-integer counts or unhashable outcomes.

    >>> counts_of([(0,), (1,), (0,)])
    {(0,): 2, (1,): 1}
    >>> counts_of({"a": 3, "b": 0})
    {'a': 3}
    """
    if isinstance(samples, Mapping):
        out: dict[Any, int] = {}
        for x, c in samples.items():
            if isinstance(c, bool):
                raise ValueError(f"count for {x!r} is {c!r}, not an integer")
            try:
                ci = operator.index(c)
            except TypeError:
                raise ValueError(f"count for {x!r} is {c!r}, not an integer") from None
            if ci < 0:
                raise ValueError(f"count for {x!r} is {ci}, negative")
            if ci > 0:
                out[x] = ci
        return out
    items: Iterable[Any]
    if isinstance(samples, np.ndarray):
        if samples.ndim == 1:
            items = samples.tolist()
        elif samples.ndim == 2:
            items = [tuple(row) for row in samples.tolist()]
        else:
            raise ValueError(f"a numpy array of samples must be 1-d or 2-d, got shape {samples.shape}")
    else:
        items = samples
    try:
        return dict(Counter(items))
    except TypeError:
        raise ValueError("outcomes must be hashable (use tuples of ints, not lists or arrays)") from None


def empirical_law(samples: Samples[K]) -> dict[K, float]:
    """The empirical law of ``samples``: each observed outcome's count divided by the total.

    Raises :class:`InvalidTest` for empty samples.

    >>> empirical_law([(0,), (1,), (1,), (1,)])
    {(0,): 0.25, (1,): 0.75}
    """
    counts = counts_of(samples)
    n = sum(counts.values())
    if n == 0:
        raise InvalidTest("samples are empty; draw at least one sample")
    return {x: c / n for x, c in counts.items()}


def total_variation(law_a: Law[K], law_b: Law[K]) -> float | Fraction:
    """TV(a, b) = 1/2 sum_x |a(x) - b(x)| over the union of outcomes (absent ones count as 0).

    Exact (a ``Fraction``) when both laws are exact, else a float. Both must be valid laws.

    >>> total_variation({"x": Fraction(1, 2), "y": Fraction(1, 2)}, {"x": Fraction(1, 4), "y": Fraction(3, 4)})
    Fraction(1, 4)
    >>> total_variation({"x": 1.0}, {"y": 1.0})
    1.0
    """
    a, exact_a = _validate_law(law_a, "law_a")
    b, exact_b = _validate_law(law_b, "law_b")
    keys = list(a) + [x for x in b if x not in a]
    if exact_a and exact_b:
        zero = Fraction(0)
        return sum((abs(Fraction(a.get(x, zero)) - Fraction(b.get(x, zero))) for x in keys), zero) / 2
    return 0.5 * math.fsum(abs(float(a.get(x, 0.0)) - float(b.get(x, 0.0))) for x in keys)


# ---------------------------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------------------------

def _expected_ok(n: int, p: Prob, min_expected: float) -> bool:
    return bool(n * p >= min_expected) and p > 0


def pool_cells(
    law: Law[K],
    counts: Samples[K],
    n: int,
    min_expected: float = 5.0,
    min_kept_mass: float = 0.9,
    *,
    absorb_small_other: bool = False,
) -> tuple[list[K | str], NDArray[np.float64], NDArray[np.int64]]:
    """Pool cells with small expected counts, as PyTorch, vLLM and SciPy do before a chi-square test.

    Keeps, in the law's order, every outcome with ``n * p >= min_expected`` (and p > 0), and pools
    the rest of the law, together with any observed outcome outside it, into one cell labelled
    :data:`OTHER` (placed last). The pooled cell is dropped when its expected and observed counts
    are both 0. Returns ``(labels, expected, observed)`` with ``expected.sum() == n`` (float laws
    are renormalised; they sum to 1 within ``FLOAT_TOL``).

    ``counts`` are the observed counts (or samples; see :func:`counts_of`); ``n`` is the sample
    size used for the expected counts and must equal their total, unless ``counts`` is empty
    (planning: "would n samples pool acceptably?").

    With ``absorb_small_other=True`` (what :func:`chi_square_gof` and :func:`g_test_gof` use), a
    pooled cell whose expected count is positive but below ``min_expected`` also absorbs the kept
    cell with the smallest expected count, so that no cell of the table has a small positive
    expected count.

    Raises :class:`InvalidTest` if the kept cells (before any absorption) carry less than
    ``min_kept_mass`` of the probability; the message gives the smallest n that would pass.

    >>> law = {"a": Fraction(1, 2), "b": Fraction(9, 20), "c": Fraction(1, 20)}
    >>> labels, expected, observed = pool_cells(law, {"a": 30, "b": 27, "c": 3}, 60)
    >>> labels, expected.tolist(), observed.tolist()
    (['a', 'b', 'other'], [30.0, 27.0, 3.0], [30, 27, 3])
    """
    lw, exact = _validate_law(law)
    obs = counts_of(counts)
    n = _check_n(n)
    total_obs = sum(obs.values())
    if total_obs != 0 and total_obs != n:
        raise ValueError(f"counts sum to {total_obs} but n={n}; pass n=sum of the counts")
    if isinstance(min_expected, bool) or not isinstance(min_expected, Real) or not (
        0 < float(min_expected) < math.inf
    ):
        raise InvalidTest(f"min_expected={min_expected!r} must be a positive number (e.g. 5.0)")
    if isinstance(min_kept_mass, bool) or not isinstance(min_kept_mass, Real) or not (
        0 <= float(min_kept_mass) <= 1
    ):
        raise InvalidTest(f"min_kept_mass={min_kept_mass!r} must lie in [0, 1] (e.g. 0.9)")
    total_p: Prob = sum(lw.values(), Fraction(0)) if exact else math.fsum(float(v) for v in lw.values())

    # The threshold as the decimal it was written as (0.9 is 9/10, not the binary float above
    # it), so that an exact law keeping exactly 90% passes, as the same law in floats does.
    need_mass: Prob = Fraction(repr(float(min_kept_mass))) if exact else float(min_kept_mass) - 1e-12
    kept = [x for x, p in lw.items() if _expected_ok(n, p, min_expected)]
    kept_set = set(kept)
    kept_mass = (sum((lw[x] for x in kept), Fraction(0)) if exact
                 else math.fsum(float(lw[x]) for x in kept)) / total_p
    if kept_mass < need_mass:
        # Smallest n whose kept cells carry min_kept_mass: the top-m cells by probability, where m
        # is the first prefix reaching the mass, are all kept once n * p_m >= min_expected.
        probs = sorted((p for p in lw.values() if p > 0), reverse=True)
        cum: Prob = Fraction(0) if exact else 0.0
        p_m = probs[-1]
        for p in probs:
            cum = cum + p
            if cum / total_p >= need_mass:
                p_m = p
                break
        n_needed = max(1, math.ceil(float(min_expected) / float(p_m)))
        while not _expected_ok(n_needed, p_m, min_expected):
            n_needed += 1
        while n_needed > 1 and _expected_ok(n_needed - 1, p_m, min_expected):
            n_needed -= 1
        raise InvalidTest(
            f"too sparse for a chi-square test: only {float(kept_mass):.4f} of the probability lies in "
            f"cells with expected count >= {min_expected} at n={n} (need >= {min_kept_mass}); "
            f"increase n to at least {n_needed}"
        )

    exp_kept = [float(n * lw[x] / total_p) for x in kept]
    obs_kept = [obs.get(x, 0) for x in kept]
    exp_other = 0.0
    if len(kept) < len(lw):
        rest = [lw[x] for x in lw if x not in kept_set]
        exp_other = float(n * (sum(rest, Fraction(0)) if exact else math.fsum(float(v) for v in rest)) / total_p)
    obs_other = (total_obs - sum(obs_kept)) if total_obs else 0

    if absorb_small_other and 0.0 < exp_other < float(min_expected) and kept:
        j = min(range(len(kept)), key=lambda i: exp_kept[i])
        exp_other += exp_kept.pop(j)
        obs_other += obs_kept.pop(j)
        kept.pop(j)

    labels: list[K | str] = list(kept)
    expected = list(exp_kept)
    observed = list(obs_kept)
    if exp_other > 0.0 or obs_other > 0:
        labels.append(OTHER)
        expected.append(exp_other)
        observed.append(obs_other)
    exp_arr = np.asarray(expected, dtype=np.float64)
    if exp_arr.size and exp_arr.sum() > 0:
        exp_arr *= n / exp_arr.sum()  # remove float round-off so that sum(expected) == n
    return labels, exp_arr, np.asarray(observed, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# One-sample tests
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Two-sample tests
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Sizing
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# The assertion
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Families of tests
# ---------------------------------------------------------------------------------------------

def _check_p_values(p_values: Sequence[float]) -> list[float]:
    out: list[float] = []
    for i, p in enumerate(p_values):
        if isinstance(p, bool) or not isinstance(p, Real) or not (0.0 <= float(p) <= 1.0):
            raise ValueError(f"p_values[{i}] = {p!r} is not a probability in [0, 1]")
        out.append(float(p))
    return out


def bonferroni(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Bonferroni: reject test i iff ``p_i <= alpha / m``; family-wise false-fail rate <= alpha.

    >>> bonferroni([0.01, 0.02, 0.04], 0.05)
    [True, False, False]
    """
    alpha = _check_alpha(alpha)
    ps = _check_p_values(p_values)
    m = len(ps)
    return [p <= alpha / m for p in ps]


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm step-down: sort the p-values ascending and reject the i-th smallest (i = 0, 1, ...)
    while ``p_(i) <= alpha / (m - i)``, stopping at the first that fails. Rejections are returned
    in the original order. Family-wise false-fail rate <= alpha, and it rejects everything
    Bonferroni rejects.

    >>> holm([0.01, 0.02, 0.04], 0.05)
    [True, True, True]
    >>> holm([0.01, 0.04, 0.03, 0.005], 0.05)
    [True, False, False, True]
    """
    alpha = _check_alpha(alpha)
    ps = _check_p_values(p_values)
    m = len(ps)
    out = [False] * m
    for i, j in enumerate(sorted(range(m), key=lambda j: ps[j])):
        if ps[j] <= alpha / (m - i):
            out[j] = True
        else:
            break
    return out


class TestFamily:
    """A family of ``m`` statistical tests sharing one family-wise false-fail budget.

    Run each test at ``per_test_alpha`` (= ``alpha_total / m``), ``add`` its result, and read the
    corrected ``verdicts()`` (True = rejected), by Holm (default) or Bonferroni over the declared
    ``m`` tests (tests not yet added count as not rejected, which is conservative).
    ``family_wise_alpha`` is ``alpha_total``.

    >>> fam = TestFamily(0.05, 2)
    >>> fam.per_test_alpha
    0.025
    >>> for p in (0.01, 0.04):
    ...     fam.add(TestResult("t", 0.0, p, fam.per_test_alpha, 100, None, p <= 0.025, ""))
    >>> fam.verdicts()
    [True, True]
    """

    __test__: ClassVar[bool] = False  # not a pytest test class

    def __init__(self, alpha_total: float, m: int, method: Literal["holm", "bonferroni"] = "holm") -> None:
        self.family_wise_alpha: float = _check_alpha(alpha_total, "alpha_total")
        self.m: int = _check_int(m, "m", 1)
        if method not in ("holm", "bonferroni"):
            raise ValueError(f"method={method!r} must be 'holm' or 'bonferroni'")
        self.method: Literal["holm", "bonferroni"] = method
        self._results: list[TestResult] = []

    @property
    def per_test_alpha(self) -> float:
        """``alpha_total / m``: the level at which to run each test of the family."""
        return self.family_wise_alpha / self.m

    @property
    def results(self) -> tuple[TestResult, ...]:
        """The results added so far, in order."""
        return tuple(self._results)

    def add(self, result: TestResult) -> None:
        """Add one result; raises ``ValueError`` beyond the declared ``m`` tests."""
        if not isinstance(result, TestResult):
            raise ValueError(f"expected a TestResult, got {type(result).__name__}")
        if len(self._results) >= self.m:
            raise ValueError(f"the family was declared with m={self.m} tests; create it with a larger m")
        self._results.append(result)

    def verdicts(self) -> list[bool]:
        """Corrected rejections, one per added result, in order."""
        ps = [r.p_value for r in self._results] + [1.0] * (self.m - len(self._results))
        rule = holm if self.method == "holm" else bonferroni
        return rule(ps, self.family_wise_alpha)[: len(self._results)]
