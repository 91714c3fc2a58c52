"""The tests of a sequence audit, run on its evidence, and its verdict.

:func:`planned` names the family (the module docstring of :mod:`hsd_core.seqaudit`, "The family"),
:func:`run_tests` runs it into a :class:`~hsd_core.stats.TestFamily` (each test at ``alpha / m``; a
test that cannot run is skipped), and :func:`sequence_verdict` gives the verdict by
:func:`~hsd_core.stats.decide`: the exact checks, Holm, then the doubts about the power statement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats as sps  # type: ignore[import-untyped]

from ..context_bugs import AimedStats
from .checks import TestResult
from .family import TestFamily, Verdict, decide
from .gof import chi_square_gof
from .seqpower import PowerStatement
from .seqreport import FamilyPower

__all__ = ["SequenceVerdict", "first_groups", "planned", "run_tests", "sequence_verdict"]

F64 = NDArray[np.float64]

_MIN_POSITION_DRAWS = 20
_FIRST_GROUPS = 4


def first_groups(first: Mapping[int, tuple[F64, list[int]]], do_sample: bool) -> list[int]:
    """The prompts whose first tokens get a chi-square test: the (at most ``_FIRST_GROUPS``)
    with the most sequences, at least ``_MIN_POSITION_DRAWS`` of them (sampling only)."""
    if not do_sample:
        return []
    big = sorted((g for g, (_, t) in first.items() if len(t) >= _MIN_POSITION_DRAWS),
                 key=lambda g: (-len(first[g][1]), g))
    return big[:_FIRST_GROUPS]


def planned(positions: int, groups: Sequence[int], drafter: bool, do_sample: bool, aim: AimedStats) -> list[str]:
    """The names of the family's tests (its size ``m``)."""
    names = ["PIT KS (pooled)", "PIT chi-square (pooled)", "log-likelihood martingale"]
    names += [f"PIT KS (position {j})" for j in range(positions)]
    names += [f"first token after prompt {g} (chi-square)" for g in groups]
    if drafter:
        names.append("directional (toward the drafter)")
    if do_sample:
        names += [aim.test_name(k) for k in range(len(aim.whats))]
    return names


def _ks(u: F64, name: str, alpha: float, exact: bool) -> TestResult:
    res = sps.kstest(u, "uniform", method="exact" if exact else "asymp")
    p = float(res.pvalue)
    return TestResult(name, float(res.statistic), p, alpha, int(u.size), None, p <= alpha,
                      f"Kolmogorov-Smirnov of {u.size} PITs against U(0, 1)")


def run_tests(family: TestFamily, u: F64, upos: NDArray[np.int64], *, bins: int, positions: int, do_sample: bool,
              ll: tuple[float, float], direction: tuple[float, float] | None,
              first: Sequence[tuple[int, F64, list[int]]], aim: AimedStats) -> None:
    """Run the planned tests into ``family``: on the PITs ``u`` (at positions ``upos``), the
    log-likelihood martingale's sum and variance ``ll``, the directional ones toward the drafter
    (``direction``, None without a drafter) and toward each aimed bug (``aim``), and each tested
    prompt's first-token law and first tokens (``first``). Greedy audits run none."""
    a = family.per_test_alpha
    if not do_sample:
        family.skip("every test but the exact one (greedy: every token must equal the argmax)")
        return
    if u.size >= 5 * bins:
        family.add(_ks(u, "PIT KS (pooled)", a, exact=False))
        r = sps.chisquare(np.histogram(u, bins=bins, range=(0.0, 1.0))[0])
        family.add(TestResult("PIT chi-square (pooled)", float(r.statistic), float(r.pvalue), a, int(u.size),
                              bins - 1, float(r.pvalue) <= a, f"{bins} equal bins"))
    else:
        family.skip(f"pooled PIT tests: {u.size} tokens, fewer than {5 * bins}")
    if ll[1] > 0:
        z = ll[0] / math.sqrt(ll[1])
        pv = float(2 * sps.norm.sf(abs(z)))
        family.add(TestResult("log-likelihood martingale", z, pv, a, int(u.size), None, pv <= a,
                              "sum of log p(x) + H(p) over its conditional standard deviation"))
    else:
        family.skip("log-likelihood martingale: every law met is a point mass")
    for j in range(positions):
        uj = u[upos == j]
        if uj.size >= _MIN_POSITION_DRAWS:
            family.add(_ks(uj, f"PIT KS (position {j})", a, exact=uj.size <= 10_000))
        else:
            family.skip(f"PIT KS (position {j}): {uj.size} tokens, fewer than {_MIN_POSITION_DRAWS}")
    for g, law0, toks in first:
        test = f"first token after prompt {g} (chi-square)"
        family.run(test, lambda law0=law0, toks=toks, test=test: _renamed(test, chi_square_gof(  # type: ignore[misc]
            {int(t): float(law0[t]) for t in np.flatnonzero(law0 > 0)}, toks, a, min_kept_mass=0.0)))
    if direction is not None:
        if direction[1] > 0:
            z = direction[0] / math.sqrt(direction[1])
            pv = float(sps.norm.sf(z))
            family.add(TestResult("directional (toward the drafter)", z, pv, a, int(u.size), None, pv <= a,
                                  "sum of w(x) - E_p w, w = q / (p + q), over its standard deviation"))
        else:
            family.skip("directional test: no law met gives it any variance (q = p or point masses)")
    for k in range(len(aim.whats)):
        zk = aim.z(k)
        if zk is None:
            family.skip(f"{aim.test_name(k)}: no law met gives it any variance (the bug changes no law)")
            continue
        pv = float(sps.norm.sf(zk))
        family.add(TestResult(aim.test_name(k), zk, pv, a, int(u.size), None, pv <= a,
                              "sum of w(x) - E_p w, w = r / (p + r), r the target's law under that bug"))


def _renamed(name: str, r: TestResult) -> TestResult:
    return TestResult(name, r.statistic, r.p_value, r.alpha, r.n, r.dof, r.rejected, r.detail)


@dataclass(frozen=True)
class SequenceVerdict:
    """A sequence audit's verdict and reason, its headline promise (``detectable``, a mean
    per-token TV, and ``by``, its family) and, when that promise is too weak, about how many
    sequences would bring it to ``max_detectable_tv`` (``n_needed``)."""

    verdict: Verdict
    reason: str
    detectable: float | None
    by: str
    n_needed: int | None


def sequence_verdict(family: TestFamily, statement: PowerStatement, head: FamilyPower | None, *,
                     impossible: Sequence[tuple[int, int, int]], malformed: Sequence[str], do_sample: bool,
                     tokens: int, n: int, max_detectable_tv: float | None) -> SequenceVerdict:
    """The verdict (module docstring of :mod:`hsd_core.seqaudit`, "Verdicts"): "lossy" on a draw of
    probability 0 or a malformed sequence, or when Holm rejects; greedy: "lossless-consistent" when
    every token is the argmax; else "inconclusive" when the headline promise ``head`` is missing or
    above ``max_detectable_tv``."""
    failures = []
    if impossible:
        s, j, t = impossible[0]
        failures.append(f"{len(impossible)} tokens the target gives probability 0 (first: sequence {s}, "
                        f"position {j}, id {t})")
    if malformed:
        failures.append(f"{len(malformed)} malformed sequences ({malformed[0]})")
    if not do_sample:
        verdict, reason = decide(None, failures=failures, doubts=[lambda: None if tokens else "no tokens"],
                                 promise=lambda: f"all {tokens} tokens equal the target's argmax")
        return SequenceVerdict(verdict, reason, None, "" if failures else "greedy: exact check", None)
    detectable = None if head is None else head.mean_tv
    by = "" if head is None else head.family
    n_needed: int | None = None
    a, power = family.per_test_alpha, statement.power

    def no_grid_point() -> str | None:
        return None if detectable is not None else (
            f"no test rejects, but no {by or 'departure'} on the grid would be caught with probability >= {power}; "
            "increase n")

    def too_weak() -> str | None:
        nonlocal n_needed
        if max_detectable_tv is None or detectable is None or detectable <= max_detectable_tv:
            return None
        grow = statement.scale_needed(a, by, max_detectable_tv)
        n_needed = None if grow is None else math.ceil(grow * n)
        more = "" if n_needed is None else f"; about n = {n_needed} sequences would reach it"
        return (f"no test rejects, but the smallest {by} caught with probability >= {power} is at mean per-token TV "
                f"{detectable:.4g} > max_detectable_tv {max_detectable_tv:.4g}{more}")

    verdict, reason = decide(family, failures=failures, doubts=[no_grid_point, too_weak], promise=lambda: (
        f"no test rejects at family-wise alpha {family.family_wise_alpha:.3g}; a {by} at mean per-token TV >= "
        f"{detectable:.4g} would be caught with probability >= {power} (at the met positions)"))
    return SequenceVerdict(verdict, reason, detectable, by, n_needed)
