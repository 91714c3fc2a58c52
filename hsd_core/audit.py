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
and does not change the verdict. A caller's ``doubts`` (an audit built on this one, such as the
PyTorch backend's, whose cells hide mass of their own) are asked after these, in order: each returns
why the audit cannot promise what it set out to ("inconclusive" with that reason) or None; its
``promise`` replaces the reason of "lossless-consistent". Every verdict is
:func:`~hsd_core.stats.decide`'s, called once.

Two-sample mode (``law_or_reference`` is a list of samples): the joint, positional and text laws
are compared with :func:`~hsd_core.stats.chi_square_two_sample` (and the joint law also with
:func:`~hsd_core.stats.tv_two_sample`); ``detectable_tv`` then uses the effective sample size
``n * n_ref / (n + n_ref)``, an approximation.

Where the code is: this module runs the audit; the outputs and cells its tests look at, and the
seeded chunked drawing, are :mod:`hsd_core.stats.outputs`; the promise and the sizing
:mod:`hsd_core.stats.promise`; the report :mod:`hsd_core.stats.report`; the tests are combined and
the verdict given as in every audit, by :mod:`hsd_core.stats.family` (:class:`~hsd_core.stats.TestFamily`,
:func:`~hsd_core.stats.decide`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from .seqaudit import SequenceAuditReport, audit_sequences
from .stats.checks import Prob as Prob
from .stats.checks import InvalidTest, TestResult, _check_alpha, _check_eps, _check_n, _check_power, _validate_law
from .stats.counts import counts_of
from .stats.family import TestFamily, Verdict, decide
from .stats.gof import gof_test
from .stats.homogeneity import chi_square_two_sample, tv_two_sample
from .stats.outputs import Output as Output
from .stats.outputs import (
    _as_output, _normalise_law, _position_counts, _position_law, _prefix_counts, _prefix_law, _pushforward,
    _text_counts, draw_chunks,
)
from .stats.promise import (
    AuditPlan, _joint_plan, _Plan, _position_detectables, _size_for, _two_sample_plan, audit_plan,
    min_num_samples_for_law, num_tests,
)
from .stats.report import AuditReport, Deviation
from .stats.sizing import min_num_samples_for_tv

__all__ = ["AuditReport", "SequenceAuditReport", "audit_sequences", "DEFAULT_CHUNK_SIZE", "DEFAULT_EPS", "DEFAULT_MAX_N", "DEFAULT_MAX_SIZED_N", "Deviation", "Verdict",
           "AuditPlan", "audit_plan", "audit_sampler", "draw_chunks", "min_num_samples_for_law"]

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
    doubts: Sequence[Callable[[], str | None]] = (),
    promise: Callable[[], str] | None = None,
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
    their number, so the test is valid as it stands. ``doubts``, ``promise``: an audit built on
    this one adds its own doubts and promise to the verdict (module docstring, "Verdicts").

    Everything is checked before the first draw. Raises :class:`~hsd_core.stats.InvalidTest` for
    out-of-range arguments (alpha, power, eps, n < 1; numpy numbers are fine), a law that is not a
    probability law (sum not 1, negative, NaN, empty), or an ``n`` the sizing would pick above
    ``max_n``; ``TypeError`` for law keys, reference outputs or sampler outputs that are not tuples
    (or lists) of int token ids."""
    alpha, power, eps, n, max_n, name = _checked_args(sample_fn, alpha, power, eps, n, max_n, name)
    ref = _Reference.of(law_or_reference)
    law, two_sample = ref.law, ref.two_sample
    k = max(2, sum(1 for p in ref.law_or_empirical.values() if p > 0))
    n_positions, pre_list, m = _plan(ref, positions, prefixes, text is not None)
    _check_drawing(seed, chunk_size, executor)
    a_test = alpha / m
    if n is None:
        n, eps = _sample_size(ref, eps, a_test, power, alpha, k, max_n)
    counts, rng_note = _draw(sample_fn, n, seed, executor, chunk_size, rng_note)
    family = TestFamily(alpha, m)
    joint_invalid = _run_family(family, ref, counts, n_positions, pre_list, text)
    plan = _two_sample_plan(counts, ref.counts, a_test, power) if two_sample else _joint_plan(law, n, a_test, power)
    verdict, reason = _verdict(family, joint_invalid, plan, ref, n, eps, a_test, power, k, doubts, promise)
    pos_det = [] if two_sample else _position_detectables(law, n, n_positions, a_test, power)
    expected = {s: n * float(p) for s, p in ref.law_or_empirical.items()}
    over, under = _deviations(expected, counts)
    return AuditReport(
        n=n, alpha=alpha, power=power, eps=eps, m=m,
        tests=family.results, holm_rejected=tuple(family.verdicts()), skipped=family.skipped, k=k,
        detectable_tv=plan.detectable, verdict=verdict, reason=reason, over=over, under=under,
        mode="two-sample" if two_sample else "exact", rng_note=rng_note,
        observed=dict(counts), expected=expected, detectable_by=plan.by, pooled_mass=plan.pooled_mass,
        name=name, position_detectable=tuple(pos_det),
    )


def _plan(ref: _Reference, positions: bool, prefixes: Sequence[Sequence[int]], text: bool
          ) -> tuple[int, list[Output], int]:
    """How many tests will run (module docstring): the positions tested, the prefixes checked (exact
    mode only, ``ValueError`` otherwise), and ``m``, the size of the family."""
    n_positions = max(len(s) for s in ref.law_or_empirical) if positions else 0
    pre_list = [_as_output(list(x) if isinstance(x, tuple) else x, f"prefixes[{i}]") for i, x in enumerate(prefixes)]
    if pre_list and ref.two_sample:
        raise ValueError("prefixes= needs an exact law (conditional tests are not run in two-sample mode)")
    return n_positions, pre_list, num_tests(ref.two_sample, n_positions, text, len(pre_list))


def _draw(sample_fn: Callable[..., Any], n: int, seed: int | None, executor: Executor | None, chunk_size: int,
          rng_note: str) -> tuple[dict[Output, int], str]:
    """The counts of ``n`` outputs of ``sample_fn`` (seeded and chunked with ``seed`` or ``executor``:
    :func:`draw_chunks`), each checked as a tuple of ids, and the rng note (fresh entropy recorded)."""
    if seed is not None or executor is not None:
        entropy = int(np.random.SeedSequence().entropy if seed is None else seed)  # type: ignore[arg-type]
        if seed is None:
            rng_note = (rng_note + "; " if rng_note else "") + f"fresh entropy {entropy}"
        raw = draw_chunks(sample_fn, n, entropy, int(chunk_size), executor)
        samples = [_as_output(x, f"sample_fn(rng) at draw {i}") for i, x in enumerate(raw)]
    else:
        samples = [_as_output(sample_fn(), f"sample_fn() at draw {i}") for i in range(n)]
    return counts_of(samples), rng_note


def _checked_args(sample_fn: object, alpha: float, power: float, eps: float | None, n: int | None, max_n: int,
                  name: str | None) -> tuple[float, float, float | None, int | None, int, str]:
    """:func:`audit_sampler`'s numeric arguments checked (``InvalidTest``), ``sample_fn`` callable
    (``TypeError``), and the sampler's name (default: ``sample_fn``'s qualified name)."""
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
    return alpha, power, eps, n, max_n, name


def _check_drawing(seed: int | None, chunk_size: int, executor: Executor | None) -> None:
    """The seeded / distributed drawing's arguments (:func:`audit_sampler`)."""
    if seed is not None and (isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer))
                             or seed < 0):
        raise InvalidTest(f"seed={seed!r} must be an int >= 0 (or None)")
    if isinstance(chunk_size, (bool, np.bool_)) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise InvalidTest(f"chunk_size={chunk_size!r} must be a positive integer")
    if executor is not None and not isinstance(executor, Executor):
        raise TypeError(f"executor must be a concurrent.futures.Executor, got {type(executor).__name__}")


@dataclass(frozen=True)
class _Reference:
    """What the samples are compared with: an exact ``law`` (exact mode), or reference samples
    (two-sample mode: their ``counts`` and the empirical law of ``n`` of them)."""

    two_sample: bool
    law: dict[Output, Prob]
    counts: dict[Output, int]
    law_or_empirical: dict[Output, Prob]

    @staticmethod
    def of(law_or_reference: object) -> _Reference:
        """The reference, checked before the first draw (``TypeError``, ``ValueError``, ``InvalidTest``)."""
        if isinstance(law_or_reference, Mapping):
            law = _normalise_law(law_or_reference)
            if not law:
                raise ValueError("the law is empty")
            _validate_law(law)  # sums to 1, no negative / NaN entries: before the first draw
            return _Reference(False, law, {}, law)
        if isinstance(law_or_reference, (str, bytes)) or not isinstance(law_or_reference, (Sequence, np.ndarray)):
            raise TypeError("law_or_reference must be a Mapping {output tuple: probability} or a sequence of "
                            f"reference outputs, got {type(law_or_reference).__name__}")
        counts = counts_of([_as_output(s, f"reference output {i}") for i, s in enumerate(law_or_reference)])
        if not counts:
            raise ValueError("the reference sample is empty")
        n_ref = sum(counts.values())
        return _Reference(True, {}, counts, {s: Fraction(c, n_ref) for s, c in counts.items()})


def _sample_size(ref: _Reference, eps: float | None, a_test: float, power: float, alpha: float, k: int,
                 max_n: int) -> tuple[int, float | None]:
    """``(n, eps)`` when :func:`audit_sampler` is given no ``n`` (module docstring, "Sizing"): the
    reference's size in two-sample mode; else sized from ``eps`` (by default the larger of
    :data:`DEFAULT_EPS` and the promise at :data:`DEFAULT_MAX_N`), refused above ``max_n``."""
    if ref.two_sample:
        return sum(ref.counts.values()), eps
    law = ref.law
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
    return n, eps


def _run_family(family: TestFamily, ref: _Reference, counts: Mapping[Output, int], n_positions: int,
                pre_list: Sequence[Output], text: Callable[[Output], str] | None) -> str | None:
    """Run the planned tests (module docstring) into ``family``; return why the joint chi-square
    test could not run (None when it ran)."""
    a_test = family.per_test_alpha
    law, rc = ref.law, ref.counts
    joint_invalid = None
    if ref.two_sample:
        if family.run("joint chi2", lambda: _two("chi2", "joint", counts, rc, a_test)) is None:
            joint_invalid = family.skipped[-1]
        family.run("joint tv", lambda: _two("tv", "joint", counts, rc, a_test))
    else:
        for kind in ("chi2", "g_test", "tv"):
            ran = family.run(f"joint {kind}",
                             lambda kind=kind: _gof(kind, "joint", law, counts, a_test))  # type: ignore[misc]
            if ran is None and kind == "chi2":
                joint_invalid = family.skipped[-1]
    for j in range(n_positions):
        pc = _position_counts(counts, j)
        label = f"position {j}"
        if not pc:
            family.skip(f"{label}: no sample reaches position {j}")
            continue
        if ref.two_sample:
            rcj = _position_counts(rc, j)
            if not rcj:
                family.skip(f"{label}: no reference sample reaches position {j}")
                continue
            family.run(label,
                       lambda pc=pc, rcj=rcj, label=label: _two("chi2", label, pc, rcj, a_test))  # type: ignore[misc]
        else:
            pl = _position_law(law, j) or {-1: Fraction(1)}  # empty: samples reach a position the law never reaches
            family.run(label,
                       lambda pc=pc, pl=pl, label=label: _gof("chi2", label, pl, pc, a_test))  # type: ignore[misc]
    for pre in pre_list:
        label = f"after {pre}"
        cc = _prefix_counts(counts, pre)
        if not cc:
            family.skip(f"{label}: no sample starts with {pre} and goes on")
            continue
        cl = _prefix_law(law, pre) or {-1: Fraction(1)}
        family.run(label, lambda cc=cc, cl=cl, label=label: _gof("chi2", label, cl, cc, a_test))  # type: ignore[misc]
    if text is not None:
        tc = _text_counts(counts, text)
        if ref.two_sample:
            rt = _text_counts(rc, text)
            family.run("text", lambda: _two("chi2", "text", tc, rt, a_test))
        else:
            tl = _pushforward(law, text)
            family.run("text", lambda: _gof("chi2", "text", tl, tc, a_test))
    return joint_invalid


def _verdict(family: TestFamily, joint_invalid: str | None, plan: _Plan, ref: _Reference, n: int,
             eps: float | None, a_test: float, power: float, k: int, doubts: Sequence[Callable[[], str | None]] = (),
             promise: Callable[[], str] | None = None) -> tuple[Verdict, str]:
    """The verdict (:func:`hsd_core.stats.decide`) with this audit's doubts (module docstring, "Verdicts"),
    then the caller's ``doubts``; ``promise`` (when given) is the reason of "lossless-consistent"."""
    detectable = plan.detectable

    def cannot_run() -> str | None:
        return None if joint_invalid is None else f"the joint test cannot run: {joint_invalid}"

    def no_power() -> str | None:
        return None if detectable is not None else (
            f"no test rejects, but n={n} has no power: no TV below 1 is detected with probability {power} "
            f"({plan.by}); increase n")

    def under_powered() -> str | None:
        if eps is None or detectable is None or detectable <= eps:
            return None
        need = (_size_for(ref.law, eps, a_test, power, k) if not ref.two_sample
                else min_num_samples_for_tv(k, eps, a_test, power))
        return (f"under-powered: detecting TV {eps:.4g} with power {power} needs n >= {need}, got n={n} "
                f"(detectable TV {detectable:.4g})")

    return decide(family, doubts=[cannot_run, no_power, under_powered, *doubts], promise=promise or (lambda: (
        f"no test rejects at family-wise alpha {family.family_wise_alpha:.3g}; any law at TV >= {detectable:.4g} "
        f"would be caught with probability >= {power} ({plan.by})")))


def _deviations(expected: Mapping[Output, float], counts: Mapping[Output, int]
                ) -> tuple[tuple[Deviation, ...], tuple[Deviation, ...]]:
    """The (at most) 5 most over- and under-represented outputs."""
    keys = list(expected) + [s for s in counts if s not in expected]
    dev = [Deviation(s, counts.get(s, 0), expected.get(s, 0.0)) for s in keys]
    over = tuple(sorted((d for d in dev if d.observed > d.expected), key=lambda d: d.expected - d.observed)[:5])
    under = tuple(sorted((d for d in dev if d.observed < d.expected), key=lambda d: d.observed - d.expected)[:5])
    return over, under
