"""How an audit combines its tests and reaches its verdict: one way, for every audit of hsd.

An audit plans ``m`` tests, runs each at ``alpha / m`` (:attr:`TestFamily.per_test_alpha`), adds
each result to a :class:`TestFamily` (a test that cannot give a meaningful answer is recorded as
skipped and counts as not rejected, which is conservative), and reads the corrected rejections
(:meth:`TestFamily.verdicts`: Holm by default, so the family-wise false-fail rate is at most
``alpha``). :func:`decide` then turns the family, the audit's exact checks and its doubts about
its own power into the verdict. The sampler audit (:mod:`hsd_core.audit`), the sequence audit
(:mod:`hsd_core.seqaudit`) and the two-sample audit (:mod:`hsd_core.twosample`) all go through
these two, so changing how audits combine their tests is a change here; the audits built on them
(the PyTorch backend's) hand their own doubts to these audits, and audits made of audits (the engine
audits) combine verdicts by :mod:`hsd_core.stats.combine`, which decides by :func:`decide` too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from numbers import Real
from typing import ClassVar, Literal

from .checks import InvalidTest, TestResult, _check_alpha, _check_int

__all__ = ["TestFamily", "Verdict", "bonferroni", "decide", "holm"]

Verdict = Literal["lossless-consistent", "lossy", "inconclusive"]
"""An audit's verdict: a test or an exact check rejects ("lossy"); nothing rejects but the audit
cannot promise what it set out to ("inconclusive"); nothing rejects and the promise holds."""


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
    ``family_wise_alpha`` is ``alpha_total``. :meth:`run` adds a test's result, or records it as
    skipped when it raises :class:`~hsd_core.stats.InvalidTest`; :meth:`skip` records a planned
    test that cannot run.

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
        self._skipped: list[str] = []

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

    def run(self, label: str, test: Callable[[], TestResult]) -> TestResult | None:
        """Run one planned test and add its result; when it raises :class:`~hsd_core.stats.InvalidTest`
        (it cannot give a meaningful answer), record ``"<label>: <why>"`` as skipped and return None."""
        try:
            result = test()
        except InvalidTest as e:
            self.skip(f"{label}: {e}")
            return None
        self.add(result)
        return result

    def skip(self, why: str) -> None:
        """Record a planned test that cannot run (``why`` names it and says why): it counts as not rejected."""
        self._skipped.append(why)

    @property
    def skipped(self) -> tuple[str, ...]:
        """The planned tests that could not run, each with why, in order."""
        return tuple(self._skipped)

    def rejected(self) -> list[TestResult]:
        """The added results whose corrected verdict is a rejection, in order."""
        return [r for r, rej in zip(self._results, self.verdicts()) if rej]

    def verdicts(self) -> list[bool]:
        """Corrected rejections, one per added result, in order."""
        ps = [r.p_value for r in self._results] + [1.0] * (self.m - len(self._results))
        rule = holm if self.method == "holm" else bonferroni
        return rule(ps, self.family_wise_alpha)[: len(self._results)]


def decide(family: TestFamily | None, *, failures: Sequence[str] = (),
           doubts: Iterable[Callable[[], str | None]] = (), promise: Callable[[], str]) -> tuple[Verdict, str]:
    """The verdict of an audit and its reason, by one rule for every audit:

    1. "lossy" when an exact check failed: ``failures`` (each says what), joined by "; ";
    2. "lossy" when the family's correction (Holm) rejects a test of ``family``: "Holm rejects <the
       tests> at family-wise alpha <alpha>";
    3. "inconclusive" when ``family`` is given and none of its tests could run: "no test could run:
       <the skipped tests>";
    4. "inconclusive" with the first of ``doubts`` that gives a reason (each is called in order
       until one returns a str: why the audit cannot promise what it set out to, e.g. no power);
    5. else "lossless-consistent" with ``promise()`` (what the audit would have caught).

    A rejection needs no power, so steps 1-2 come before any doubt. ``family=None`` is an exact
    comparison with no statistical family (greedy audits): steps 2-3 do not apply.

    >>> fam = TestFamily(0.01, 2)
    >>> _ = fam.run("t", lambda: TestResult("t", 9.0, 1e-4, 0.005, 100, 1, True, ""))
    >>> decide(fam, promise=lambda: "fine")
    ('lossy', 'Holm rejects t at family-wise alpha 0.01')
    >>> decide(TestFamily(0.01, 2), doubts=[lambda: None, lambda: "no power"], promise=lambda: "fine")
    ('inconclusive', 'no test could run: ')
    """
    if failures:
        return "lossy", "; ".join(failures)
    if family is not None:
        hit = family.rejected()
        if hit:
            rule = "Holm" if family.method == "holm" else "Bonferroni"
            return "lossy", (f"{rule} rejects {', '.join(t.name for t in hit)} at family-wise alpha "
                             f"{family.family_wise_alpha:.3g}")
        if not family.results:
            return "inconclusive", "no test could run: " + "; ".join(family.skipped)
    for doubt in doubts:
        why = doubt()
        if why is not None:
            return "inconclusive", why
    return "lossless-consistent", promise()
