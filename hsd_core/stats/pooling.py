"""Pooling of low-count cells before a chi-square test (:func:`pool_cells`)."""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Real

import numpy as np
from numpy.typing import NDArray

from .checks import K, InvalidTest, Law, Prob, Samples, _check_n, _validate_law
from .counts import counts_of

__all__ = ["OTHER", "pool_cells"]

OTHER = "other"
"""Label of the pooled cell returned by :func:`pool_cells`."""


def _expected_ok(n: int, p: Prob, min_expected: float) -> bool:
    return bool(n * p >= min_expected) and p > 0


def _check_pool_args(min_expected: float, min_kept_mass: float) -> None:
    if isinstance(min_expected, bool) or not isinstance(min_expected, Real) or not (
        0 < float(min_expected) < math.inf
    ):
        raise InvalidTest(f"min_expected={min_expected!r} must be a positive number (e.g. 5.0)")
    if isinstance(min_kept_mass, bool) or not isinstance(min_kept_mass, Real) or not (
        0 <= float(min_kept_mass) <= 1
    ):
        raise InvalidTest(f"min_kept_mass={min_kept_mass!r} must lie in [0, 1] (e.g. 0.9)")


def _too_sparse(lw: dict[K, Prob], exact: bool, total_p: Prob, need_mass: Prob, kept_mass: Prob, n: int,
                min_expected: float, min_kept_mass: float) -> InvalidTest:
    """The refusal of :func:`pool_cells` when the kept cells carry too little mass, with the smallest
    n that would pass: the top-m cells by probability, where m is the first prefix reaching the mass,
    are all kept once n * p_m >= min_expected."""
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
    return InvalidTest(
        f"too sparse for a chi-square test: only {float(kept_mass):.4f} of the probability lies in "
        f"cells with expected count >= {min_expected} at n={n} (need >= {min_kept_mass}); "
        f"increase n to at least {n_needed}"
    )


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
    _check_pool_args(min_expected, min_kept_mass)
    total_p: Prob = sum(lw.values(), Fraction(0)) if exact else math.fsum(float(v) for v in lw.values())

    # The threshold as the decimal it was written as (0.9 is 9/10, not the binary float above
    # it), so that an exact law keeping exactly 90% passes, as the same law in floats does.
    need_mass: Prob = Fraction(repr(float(min_kept_mass))) if exact else float(min_kept_mass) - 1e-12
    kept = [x for x, p in lw.items() if _expected_ok(n, p, min_expected)]
    kept_set = set(kept)
    kept_mass = (sum((lw[x] for x in kept), Fraction(0)) if exact
                 else math.fsum(float(lw[x]) for x in kept)) / total_p
    if kept_mass < need_mass:
        raise _too_sparse(lw, exact, total_p, need_mass, kept_mass, n, min_expected, min_kept_mass)

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
