"""Tests of hsd_core.stats: sizing formulas, calibration under the null, power against known
perturbations, pooling, multiple testing and the doctests.

Every statistical test below states its alpha (false-fail rate), its N and the smallest deviation
it detects. All randomness is on fixed seeds, so the suite is deterministic; the stated failure
probabilities are what a fresh seed would risk.
"""

from __future__ import annotations

import doctest
import importlib
import math
import pkgutil
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats as sps  # type: ignore[import-untyped]

import hsd_core.stats as hs
from hsd_core.stats import (
    InvalidTest,
    TestFamily,
    TestResult,
    assert_law_matches,
    bonferroni,
    chi_square_gof,
    chi_square_two_sample,
    counts_of,
    decide,
    empirical_law,
    g_test_gof,
    holm,
    min_num_samples_for_tv,
    min_tv_detectable,
    pool_cells,
    power_chi2,
    total_variation,
    tv_test,
    tv_two_sample,
)

# ---------------------------------------------------------------------------------------------
# Fixtures: a 16-cell exact law and exactly-TV-perturbed versions of it
# ---------------------------------------------------------------------------------------------

WEIGHTS16 = list(range(1, 17))  # p_i = i / 136, i = 1..16: non-uniform, smallest cell 1/136
LAW16: dict[tuple[int], Fraction] = {(i,): Fraction(w, 136) for i, w in enumerate(WEIGHTS16)}
# Outcomes of weights 16+15+14+13+10 = 68 carry exactly half the mass: moving mass in proportion
# to p between the two halves, q_i = p_i (1 + s_i * 2 eps), gives TV(p, q) = eps and
# sum (q-p)^2/p = 4 eps^2, the least favourable (diffuse) alternative for this null.
PLUS = {15, 14, 13, 12, 9}  # indices of weights 16, 15, 14, 13, 10


def perturbed16(eps: Fraction) -> dict[tuple[int], Fraction]:
    return {x: p * (1 + (2 * eps if x[0] in PLUS else -2 * eps)) for x, p in LAW16.items()}


def draw_counts(rng: np.random.Generator, law: dict[tuple[int], Fraction], n: int) -> dict[tuple[int], int]:
    keys = list(law)
    probs = np.array([float(law[x]) for x in keys])
    c = rng.multinomial(n, probs / probs.sum())
    return {x: int(v) for x, v in zip(keys, c)}


def uniform_and_diffuse(k: int, eps: float) -> tuple[dict[tuple[int], float], np.ndarray]:
    """Uniform null on k (even) cells and the diffuse alternative: half +2eps/k, half -2eps/k."""
    null = {(i,): 1.0 / k for i in range(k)}
    alt = np.array([1.0 / k + (2 * eps / k if i % 2 == 0 else -2 * eps / k) for i in range(k)])
    return null, alt


# ---------------------------------------------------------------------------------------------
# Sizing: agreement with the reference table (testing-and-style.md, section B2)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("k", "eps", "alpha", "power", "table_n"),
    [
        (8, 0.02, 1e-6, 0.99, 43_000),
        (16, 0.02, 1e-6, 0.99, 51_000),
        (32, 0.02, 1e-6, 0.99, 61_000),
        (8, 0.01, 1e-6, 0.99, 171_000),
        (16, 0.05, 1e-6, 0.99, 8_100),
        (8, 0.02, 1e-3, 0.9, 19_900),
    ],
)
def test_chi2_sizing_matches_table(k: int, eps: float, alpha: float, power: float, table_n: int) -> None:
    n = min_num_samples_for_tv(k, eps, alpha, power, test="chi2")
    assert abs(n - table_n) <= 0.03 * table_n, (n, table_n)
    # n is the smallest size reaching the power.
    assert power_chi2(k, n, eps, alpha) >= power
    assert power_chi2(k, n - 1, eps, alpha) < power


@pytest.mark.parametrize(
    ("k", "tau", "delta", "table_n"),
    [(8, 0.01, 1e-6, 97_000), (16, 0.01, 1e-6, 125_000), (32, 0.01, 1e-6, 180_000),
     (16, 0.01, 1e-3, 90_000), (16, 0.05, 1e-6, 5_000)],
)
def test_tv_sizing_matches_table(k: int, tau: float, delta: float, table_n: int) -> None:
    # eps = 2 tau; with alpha = delta and power = 1 - delta, min(alpha, 1 - power) = delta.
    n = min_num_samples_for_tv(k, 2 * tau, delta, 1 - delta, test="tv")
    assert abs(n - table_n) <= 0.01 * table_n, (n, table_n)
    assert n == math.ceil((math.log(2**k - 2) + math.log(1 / delta)) / (2 * tau**2))


def test_g_sizing_equals_chi2_sizing() -> None:
    assert min_num_samples_for_tv(16, 0.05, 1e-6, 0.99, "g") == min_num_samples_for_tv(16, 0.05, 1e-6, 0.99, "chi2")


def test_chi2_sizing_by_monte_carlo() -> None:
    """The chi-square test at the computed n reaches the stated power, by simulation.

    k=8 uniform null, diffuse alternative at TV eps=0.05, alpha=1e-3, power 0.9 -> n=3183.
    R=2000 simulated runs of chi_square_gof; the number of rejections must lie in the binomial
    99.9% interval for rate 0.9 (about [1755, 1843], i.e. +-2.2 points of power), so a correct
    sizing fails this check with probability ~1e-3 on a fresh seed. A second run at 0.75 n checks
    power_chi2 itself (analytic 0.715) the same way, and shows n is not loose.
    """
    k, eps, alpha, power, runs = 8, 0.05, 1e-3, 0.9, 2000
    n = min_num_samples_for_tv(k, eps, alpha, power)
    assert n == 3183
    null, alt = uniform_and_diffuse(k, eps)
    rng = np.random.default_rng(20240611)
    for size, target in ((n, power), (int(0.75 * n), power_chi2(k, int(0.75 * n), eps, alpha))):
        draws = rng.multinomial(size, alt, size=runs)
        rejections = sum(
            chi_square_gof(null, {(i,): int(c[i]) for i in range(k)}, alpha).rejected for c in draws
        )
        lo, hi = sps.binom.interval(0.999, runs, target)
        assert lo <= rejections <= hi, (size, rejections, target * runs, (lo, hi))


# ---------------------------------------------------------------------------------------------
# Sizing: min_tv_detectable inverts min_num_samples_for_tv
# ---------------------------------------------------------------------------------------------

SIZING = settings(max_examples=300, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow])


@SIZING
@given(
    k=st.integers(2, 64),
    eps=st.floats(0.005, 1.0),
    alpha=st.floats(1e-9, 0.2),
    power=st.floats(0.5, 0.999),
    test=st.sampled_from(["chi2", "tv"]),
)
def test_min_tv_detectable_inverts_sizing(k: int, eps: float, alpha: float, power: float, test: str) -> None:
    n = min_num_samples_for_tv(k, eps, alpha, power, test)  # type: ignore[arg-type]
    e = min_tv_detectable(k, n, alpha, power, test)  # type: ignore[arg-type]
    assert 0 < e <= eps * (1 + 1e-9)
    assert min_num_samples_for_tv(k, e, alpha, power, test) <= n  # type: ignore[arg-type]
    assert min_num_samples_for_tv(k, e * (1 - 1e-6), alpha, power, test) > n  # type: ignore[arg-type]


@SIZING
@given(
    k=st.integers(2, 64),
    n=st.integers(1, 10**7),
    alpha=st.floats(1e-9, 0.2),
    power=st.floats(0.5, 0.999),
    test=st.sampled_from(["chi2", "tv"]),
)
def test_sizing_inverts_min_tv_detectable(k: int, n: int, alpha: float, power: float, test: str) -> None:
    try:
        e = min_tv_detectable(k, n, alpha, power, test)  # type: ignore[arg-type]
    except InvalidTest as err:
        assert "increase n to at least" in str(err)
        assert min_num_samples_for_tv(k, 1.0, alpha, power, test) > n  # type: ignore[arg-type]
        return
    assert 0 < e <= 1
    assert min_num_samples_for_tv(k, e, alpha, power, test) <= n  # type: ignore[arg-type]
    assert min_num_samples_for_tv(k, e * (1 - 1e-6), alpha, power, test) > n  # type: ignore[arg-type]


def test_sizing_validation() -> None:
    for bad_alpha in (0.0, 1.0, -0.1, float("nan"), True):
        with pytest.raises(InvalidTest, match="alpha"):
            min_num_samples_for_tv(8, 0.05, bad_alpha)
    with pytest.raises(InvalidTest, match="power"):
        min_num_samples_for_tv(8, 0.05, 1e-6, power=1.0)
    with pytest.raises(InvalidTest, match="eps"):
        min_num_samples_for_tv(8, 0.0, 1e-6)
    with pytest.raises(InvalidTest, match="eps"):
        min_num_samples_for_tv(8, 1.5, 1e-6)
    with pytest.raises(InvalidTest, match="k="):
        min_num_samples_for_tv(1, 0.05, 1e-6)
    with pytest.raises(InvalidTest, match="n="):
        min_tv_detectable(8, 0, 1e-6)
    with pytest.raises(ValueError, match="test="):
        min_num_samples_for_tv(8, 0.05, 1e-6, test="ks")  # type: ignore[arg-type]
    with pytest.raises(InvalidTest, match="increase n to at least"):
        min_tv_detectable(16, 3, 1e-6)


# ---------------------------------------------------------------------------------------------
# Calibration under the null
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gof", [chi_square_gof, g_test_gof])
def test_null_calibration(gof: object) -> None:
    """Under H0 (samples from LAW16 itself) the false-fail rate is alpha and p-values are uniform.

    alpha=0.05, N=2000 samples per run (smallest expected count 14.7, so no pooling), 300 runs:
    the number of rejections must lie in the binomial 99.9% interval for rate 0.05, about [4, 29],
    i.e. it detects a true false-fail rate outside roughly [0.013, 0.097]. The 300 p-values must
    pass a KS test against U(0,1) at level 1e-3 (detects a sup-CDF deviation of about 0.11).
    """
    assert callable(gof)
    alpha, n, runs = 0.05, 2000, 300
    rng = np.random.default_rng(9765456)
    results = [gof(LAW16, draw_counts(rng, LAW16, n), alpha) for _ in range(runs)]
    assert all(r.dof == 15 for r in results)
    rejections = sum(r.rejected for r in results)
    lo, hi = sps.binom.interval(0.999, runs, alpha)
    assert lo <= rejections <= hi, (rejections, (lo, hi))
    assert sps.kstest([r.p_value for r in results], "uniform").pvalue > 1e-3


def test_tv_test_null_false_fail_at_most_alpha() -> None:
    """The TV test is conservative: under H0 its false-fail rate is at most alpha for every n.

    alpha=0.05, N=2000, 300 runs: rejections must not exceed the upper end of the binomial 99.9%
    interval for rate 0.05 (about 29); (in practice it is 0: the bound is loose).
    """
    alpha, n, runs = 0.05, 2000, 300
    rng = np.random.default_rng(9765457)
    rejections = sum(tv_test(LAW16, draw_counts(rng, LAW16, n), alpha).rejected for _ in range(runs))
    assert rejections <= sps.binom.interval(0.999, runs, alpha)[1]


# ---------------------------------------------------------------------------------------------
# Tests with teeth: known perturbations are rejected at the sized N, and the null is accepted
# ---------------------------------------------------------------------------------------------

def test_perturbed_law_rejected_at_sized_n() -> None:
    """alpha=1e-6, N = min_num_samples_for_tv(16, 0.05, 1e-6, 0.99) = 8082, detects TV >= 0.05
    with power 0.99 (the perturbation is exactly the least favourable one at TV 0.05). On the
    fixed seed the perturbed law must be rejected (chi2, G, assert_law_matches) and the true law
    accepted (false-fail 1e-6)."""
    eps = Fraction(1, 20)
    q = perturbed16(eps)
    assert sum(q.values()) == 1 and total_variation(LAW16, q) == eps
    n = min_num_samples_for_tv(16, 0.05, 1e-6, 0.99)
    assert n == 8082
    rng = np.random.default_rng(12345)
    bad = draw_counts(rng, q, n)
    good = draw_counts(rng, LAW16, n)
    assert chi_square_gof(LAW16, bad, 1e-6).rejected
    assert g_test_gof(LAW16, bad, 1e-6).rejected
    with pytest.raises(AssertionError, match="over-represented") as info:
        assert_law_matches(LAW16, bad, alpha=1e-6, eps=0.05, power=0.99)
    message = str(info.value)
    assert "p_value=" in message and "alpha=1e-06" in message and f"n={n}" in message
    assert "under-represented" in message and "observed" in message and "expected" in message
    for test in ("chi2", "g"):
        result = assert_law_matches(LAW16, good, alpha=1e-6, eps=0.05, power=0.99, test=test)
        assert not result.rejected and result.n == n


def test_perturbed_law_rejected_by_tv_test() -> None:
    """alpha=1e-6, N = min_num_samples_for_tv(16, 0.05, 1e-6, 0.99, "tv") = 19925, detects TV >=
    0.05 with false-pass <= 1e-6 (non-asymptotic). Fixed seed: the TV-0.05 law is rejected, the
    true law accepted."""
    q = perturbed16(Fraction(1, 20))
    n = min_num_samples_for_tv(16, 0.05, 1e-6, 0.99, test="tv")
    assert n == 19925
    rng = np.random.default_rng(54321)
    r_bad = tv_test(LAW16, draw_counts(rng, q, n), 1e-6)
    assert r_bad.rejected and r_bad.p_value <= 1e-6
    with pytest.raises(AssertionError, match="tv test rejected"):
        assert_law_matches(LAW16, draw_counts(rng, q, n), alpha=1e-6, eps=0.05, test="tv")
    r_good = assert_law_matches(LAW16, draw_counts(rng, LAW16, n), alpha=1e-6, eps=0.05, test="tv")
    assert not r_good.rejected and r_good.dof is None


def test_concentrated_perturbation_rejected() -> None:
    """alpha=1e-6, N=8082 (sized for the diffuse TV-0.05 bias): a concentrated bias moving 0.05 of
    mass from the largest cell (16/136) to the smallest (1/136) has sum (q-p)^2/p = 0.36, 36x the
    diffuse 4 eps^2 = 0.01, so power ~1 (n sized for diffuse TV 0.05 detects this one at TV ~0.008)."""
    q = dict(LAW16)
    q[(15,)] -= Fraction(1, 20)
    q[(0,)] += Fraction(1, 20)
    rng = np.random.default_rng(777)
    assert chi_square_gof(LAW16, draw_counts(rng, q, 8082), 1e-6).rejected


def test_zero_probability_samples_reject_outright() -> None:
    law = {(0,): Fraction(1, 2), (1,): Fraction(1, 2), (2,): Fraction(0)}
    samples = [(0,)] * 500 + [(1,)] * 499 + [(2,)]
    for test in (chi_square_gof, g_test_gof, tv_test):
        r = test(law, samples, 1e-6)
        assert r.rejected and r.p_value == 0.0 and r.statistic == math.inf
        assert "(2,)" in r.detail and "probability 0" in r.detail
    # An outcome absent from the law counts as probability 0.
    law2: dict[tuple[int, ...], Fraction] = {(0,): Fraction(1, 2), (1,): Fraction(1, 2)}
    r = chi_square_gof(law2, {(0,): 10, (7, 7): 1}, 0.01)
    assert r.rejected and "(7, 7)" in r.detail
    with pytest.raises(AssertionError, match=r"\(2,\)"):
        assert_law_matches(law, samples)
    # ... also for a point-mass law, which is otherwise checked exactly.
    point = {(3,): Fraction(1)}
    assert not assert_law_matches(point, [(3,)] * 10).rejected
    with pytest.raises(AssertionError, match=r"\(4,\)"):
        assert_law_matches(point, [(3,)] * 10 + [(4,)])


def test_under_powered_assert_raises_invalid_test() -> None:
    rng = np.random.default_rng(1)
    with pytest.raises(InvalidTest, match=r"under-powered: need n >= 8082"):
        assert_law_matches(LAW16, draw_counts(rng, LAW16, 1000), alpha=1e-6, eps=0.05, power=0.99)
    with pytest.raises(InvalidTest, match=r"under-powered: need n >= 19925"):
        assert_law_matches(LAW16, draw_counts(rng, LAW16, 8082), alpha=1e-6, eps=0.05, test="tv")


# ---------------------------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------------------------

SPARSE = {"head": Fraction(1, 2), **{f"t{i}": Fraction(1, 200) for i in range(100)}}


def test_pooling_raises_when_kept_mass_too_small() -> None:
    # At n=999 each tail cell expects 4.995 < 5: only the head (mass 0.5 < 0.9) is kept.
    with pytest.raises(InvalidTest, match="increase n to at least 1000"):
        pool_cells(SPARSE, {}, 999)
    with pytest.raises(InvalidTest, match="too sparse"):
        chi_square_gof(SPARSE, ["head"] * 100 + ["t0"] * 100, 0.01)
    labels, expected, observed = pool_cells(SPARSE, {}, 1000)
    assert labels == list(SPARSE) and expected.sum() == pytest.approx(1000) and observed.sum() == 0


def test_pooling_other_cell() -> None:
    law = {"a": Fraction(1, 2), "b": Fraction(9, 20), "c": Fraction(1, 40), "d": Fraction(1, 40)}
    counts = {"a": 55, "b": 40, "c": 3, "d": 2}
    labels, expected, observed = pool_cells(law, counts, 100)
    assert labels == ["a", "b", hs.OTHER]
    assert expected.tolist() == [50.0, 45.0, 5.0] and observed.tolist() == [55, 40, 5]
    # A pooled cell with a small positive expected count absorbs the smallest kept cell.
    law2 = {"a": Fraction(1, 2), "b": Fraction(9, 20), "c": Fraction(1, 20)}
    labels2, exp2, obs2 = pool_cells(law2, {"a": 30, "b": 27, "c": 3}, 60, absorb_small_other=True)
    assert labels2 == ["a", hs.OTHER] and exp2.tolist() == [30.0, 30.0] and obs2.tolist() == [30, 30]
    # An empty pooled cell is dropped; zero-probability outcomes never count as kept.
    labels3, _, _ = pool_cells({"a": 0.5, "b": 0.5, "z": 0.0}, {"a": 50, "b": 50}, 100)
    assert labels3 == ["a", "b"]
    with pytest.raises(ValueError, match="n="):
        pool_cells(law, counts, 99)


def test_too_few_cells_after_pooling() -> None:
    with pytest.raises(InvalidTest, match="point mass"):
        chi_square_gof({(0,): Fraction(1)}, [(0,)] * 10, 0.01)
    # 0.95 / 0.05 at n=20: the pooled cell (expected 1) absorbs the only kept cell.
    with pytest.raises(InvalidTest, match="increase n"):
        chi_square_gof({0: 0.95, 1: 0.05}, [0] * 19 + [1], 0.01)


# ---------------------------------------------------------------------------------------------
# Input validation and helpers
# ---------------------------------------------------------------------------------------------

def test_law_and_sample_validation() -> None:
    with pytest.raises(InvalidTest, match="sums to"):
        chi_square_gof({0: Fraction(1, 2), 1: Fraction(1, 3)}, [0, 1], 0.01)
    with pytest.raises(InvalidTest, match="sums to"):
        tv_test({0: 0.5, 1: 0.5 + 1e-6}, [0, 1], 0.01)
    assert not tv_test({0: 0.5, 1: 0.5 + 1e-12}, [0, 1], 0.01).rejected  # within FLOAT_TOL
    with pytest.raises(InvalidTest, match="negative"):
        chi_square_gof({0: 1.5, 1: -0.5}, [0, 1], 0.01)
    with pytest.raises(InvalidTest, match="NaN"):
        chi_square_gof({0: float("nan"), 1: 0.5}, [0, 1], 0.01)
    with pytest.raises(InvalidTest, match="empty"):
        chi_square_gof({0: 0.5, 1: 0.5}, [], 0.01)
    with pytest.raises(InvalidTest, match="empty"):
        tv_two_sample([0], [], 0.01)
    with pytest.raises(InvalidTest, match="alpha"):
        g_test_gof({0: 0.5, 1: 0.5}, [0, 1], 1.5)
    with pytest.raises(ValueError, match="negative"):
        counts_of({0: -1})
    with pytest.raises(ValueError, match="hashable"):
        counts_of([[0, 1]])  # type: ignore[type-var]


def test_helpers() -> None:
    assert counts_of(np.array([[0, 1], [0, 1], [2, 3]])) == {(0, 1): 2, (2, 3): 1}
    assert counts_of(np.array([5, 5, 6])) == {5: 2, 6: 1}
    assert empirical_law({"a": 1, "b": 3}) == {"a": 0.25, "b": 0.75}
    assert total_variation(LAW16, perturbed16(Fraction(1, 10))) == Fraction(1, 10)
    tv = total_variation({0: 0.25, 1: 0.75}, {1: 0.5, 2: 0.5})
    assert isinstance(tv, float) and tv == pytest.approx(0.5)  # (0.25 + 0.25 + 0.5) / 2


# ---------------------------------------------------------------------------------------------
# Families of tests
# ---------------------------------------------------------------------------------------------

def test_holm_and_bonferroni_known_inputs() -> None:
    assert holm([0.01, 0.02, 0.04], 0.05) == [True, True, True]
    assert bonferroni([0.01, 0.02, 0.04], 0.05) == [True, False, False]
    # Sorted: 0.005 <= 0.05/4, 0.01 <= 0.05/3, then 0.03 > 0.05/2 stops the step-down.
    assert holm([0.01, 0.04, 0.03, 0.005], 0.05) == [True, False, False, True]
    assert bonferroni([0.01, 0.04, 0.03, 0.005], 0.05) == [True, False, False, True]
    assert holm([0.2, 0.3], 0.05) == [False, False] and holm([], 0.05) == []
    assert holm([0.0125, 0.0125, 0.0125, 0.0125], 0.05) == [True] * 4  # ties at alpha/m
    with pytest.raises(ValueError, match="p_values"):
        holm([1.5], 0.05)


def _result(p: float, alpha: float) -> TestResult:
    return TestResult("t", 0.0, p, alpha, 100, None, p <= alpha, "")


def test_test_family() -> None:
    fam = TestFamily(0.03, 3)
    assert fam.per_test_alpha == pytest.approx(0.01) and fam.family_wise_alpha == 0.03
    for p in (0.009, 0.014):
        fam.add(_result(p, fam.per_test_alpha))
    # Holm over the declared m=3: 0.009 <= 0.01, 0.014 <= 0.015; the missing test counts as p=1.
    assert fam.verdicts() == [True, True]
    fam.add(_result(0.5, fam.per_test_alpha))
    assert fam.verdicts() == [True, True, False]
    with pytest.raises(ValueError, match="m=3"):
        fam.add(_result(0.5, fam.per_test_alpha))
    bon = TestFamily(0.03, 3, method="bonferroni")
    for p in (0.009, 0.014, 0.5):
        bon.add(_result(p, bon.per_test_alpha))
    assert bon.verdicts() == [True, False, False]
    with pytest.raises(InvalidTest):
        TestFamily(1.0, 3)


def test_a_family_runs_and_skips_tests() -> None:
    """``run`` adds a test's result, or records it as skipped (with why) when it raises InvalidTest;
    skipped tests count as not rejected (Holm over the declared m=3: 0.009 <= 0.03 / 3)."""
    fam = TestFamily(0.03, 3)

    def refuse() -> TestResult:
        raise InvalidTest("too sparse")
    assert fam.run("a", lambda: _result(0.009, fam.per_test_alpha)) is not None
    assert fam.run("b", refuse) is None
    fam.skip("c: no sample reaches it")
    assert fam.skipped == ("b: too sparse", "c: no sample reaches it")
    assert [r.p_value for r in fam.results] == [0.009] and fam.verdicts() == [True]
    assert fam.rejected() == list(fam.results)
    with pytest.raises(ValueError):  # anything but InvalidTest is a bug, not a skipped test
        fam.run("d", lambda: (_ for _ in ()).throw(ValueError("bug")))  # type: ignore[arg-type,return-value]


def test_decide_is_one_rule_for_every_audit() -> None:
    """The order of :func:`decide`: exact failures, then Holm, then "no test could run", then the
    first doubt that speaks (later ones are not even asked), else the promise."""
    asked: list[str] = []

    def doubt(name: str, why: str | None) -> Callable[[], str | None]:
        def f() -> str | None:
            asked.append(name)
            return why
        return f

    def fam(*ps: float) -> TestFamily:
        f = TestFamily(0.01, 3)
        for i, p in enumerate(ps):
            f.run(f"t{i}", lambda p=p, i=i: TestResult(f"t{i}", 0.0, p, f.per_test_alpha, 100, None,  # type: ignore[misc]
                                                       p <= f.per_test_alpha, ""))
        return f

    assert decide(fam(0.5), failures=["1 draw of probability 0"], promise=lambda: "x") == (
        "lossy", "1 draw of probability 0")
    assert decide(fam(1e-4, 0.5, 1e-3), doubts=[doubt("a", "no power")], promise=lambda: "x") == (
        "lossy", "Holm rejects t0, t2 at family-wise alpha 0.01")
    assert asked == []
    assert decide(TestFamily(0.01, 2), promise=lambda: "x") == ("inconclusive", "no test could run: ")
    assert decide(fam(0.5), doubts=[doubt("a", None), doubt("b", "no power"), doubt("c", "never")],
                  promise=lambda: "x") == ("inconclusive", "no power")
    assert asked == ["a", "b"]
    assert decide(fam(0.5), doubts=[doubt("d", None)], promise=lambda: "caught at TV 0.1") == (
        "lossless-consistent", "caught at TV 0.1")
    assert decide(None, doubts=[doubt("e", None)], promise=lambda: "all equal") == ("lossless-consistent", "all equal")


# ---------------------------------------------------------------------------------------------
# Two-sample tests
# ---------------------------------------------------------------------------------------------

def test_two_sample_tests() -> None:
    """alpha=1e-6, N=20000 per sample, laws LAW16 and its TV-0.1 diffuse perturbation.

    chi2 homogeneity: noncentrality ~ (N/2) * 4 TV^2 = 400 at dof 15, power ~1; it detects a diffuse TV
    of ~0.045 with power 0.99 (noncentrality 81). tv_two_sample (k=16): threshold tau_a + tau_b = 0.051, so it detects
    TV >= 0.10 with false-pass <= 1e-6. Equal laws must be accepted (false-fail <= 1e-6).
    """
    n, alpha = 20_000, 1e-6
    q = perturbed16(Fraction(1, 10))
    rng = np.random.default_rng(2718)
    a, b = draw_counts(rng, LAW16, n), draw_counts(rng, q, n)
    a2 = draw_counts(rng, LAW16, n)
    r = chi_square_two_sample(a, b, alpha)
    assert r.rejected and r.dof == 15 and r.n == 2 * n
    assert tv_two_sample(a, b, alpha, k=16).rejected
    assert tv_two_sample(a, b, alpha).rejected
    assert not chi_square_two_sample(a, a2, alpha).rejected
    r_tv = tv_two_sample(a, a2, alpha, k=16)
    assert not r_tv.rejected and r_tv.p_value > alpha
    with pytest.raises(InvalidTest, match="k=3"):
        tv_two_sample(a, a2, alpha, k=3)
    with pytest.raises(InvalidTest, match="increase the sample sizes"):
        chi_square_two_sample([0, 1], [1, 0], alpha)


# ---------------------------------------------------------------------------------------------
# Doctests
# ---------------------------------------------------------------------------------------------

def test_doctests() -> None:
    """The doctests of every module of the package :mod:`hsd_core.stats` (``testmod`` of the package
    alone would see none of the functions it re-exports)."""
    attempted = 0
    for info in pkgutil.iter_modules(hs.__path__):
        result = doctest.testmod(importlib.import_module(f"hsd_core.stats.{info.name}"), optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, info.name
        attempted += result.attempted
    assert attempted >= 20
