"""What a sampler audit (:func:`hsd_core.audit.audit_sampler`) can promise at a sample size, and
the sample size it picks for a TV to detect (the module docstring of :mod:`hsd_core.audit`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .checks import InvalidTest, Prob, _check_alpha, _check_eps, _check_n, _check_power, _validate_law
from .outputs import Output, _normalise_law, _position_law
from .pooling import OTHER, pool_cells
from .sizing import min_num_samples_for_tv, min_tv_detectable

__all__ = ["AuditPlan", "audit_plan", "min_num_samples_for_law", "num_tests"]

_MIN_EXPECTED = 5.0


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
    """The honest promise of the joint test at ``n`` samples (module docstring of :mod:`hsd_core.audit`).

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


def _position_detectables(law: Mapping[Output, Prob], n: int, n_positions: int, a_test: float,
                          power: float) -> list[float | None]:
    """For each position ``j``, the TV of the ``j``-th token's law (given that the output reaches
    ``j``) that its own test catches with probability ``power`` at the expected number of outputs
    reaching ``j`` (None: no power there)."""
    out: list[float | None] = []
    for j in range(n_positions):
        pl = _position_law(law, j)
        reach = sum(float(p) for s, p in law.items() if len(s) > j)
        n_j = int(n * reach)
        out.append(_joint_plan(pl, n_j, a_test, power).detectable if pl and n_j > 0 else None)
    return out


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


def num_tests(two_sample: bool, positions: int, text: bool, prefixes: int) -> int:
    """How many tests :func:`hsd_core.audit.audit_sampler` runs (the Holm family's size ``m``): the
    joint test and its companions (two in two-sample mode, three against a law), one per tested
    position, one for the text, one per prefix."""
    return (2 if two_sample else 3) + positions + (1 if text else 0) + prefixes


@dataclass(frozen=True)
class AuditPlan:
    """What :func:`hsd_core.audit.audit_sampler` will be able to promise before it draws: with ``n``
    draws, every law at TV >= ``detectable_tv`` from the reference law is caught with probability
    >= ``power`` (None: no TV below 1), by ``by``; ``tests`` tests share the family-wise ``alpha``."""

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
    m = num_tests(False, max(len(s) for s in lw) if positions else 0, text, int(prefixes))
    plan = _joint_plan(lw, n, alpha / m, power)
    return AuditPlan(n, alpha, power, m, plan.detectable, plan.by)
