"""What every test of :mod:`hsd_core.stats` shares: its result (:class:`TestResult`), its refusal
(:class:`InvalidTest`), and the checks of its arguments and laws, done before anything is computed."""

from __future__ import annotations

import math
import operator
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from numbers import Rational, Real
from typing import ClassVar, Literal, TypeVar, Union

__all__ = ["FLOAT_TOL", "InvalidTest", "Law", "Prob", "Samples", "TestName", "TestResult"]

K = TypeVar("K", bound=Hashable)
Prob = Union[float, Fraction]
Law = Mapping[K, Prob]
Samples = Union[Sequence[K], Mapping[K, int]]
TestName = Literal["chi2", "g", "tv"]

FLOAT_TOL = 1e-9
"""Float laws must sum to 1 within this tolerance (exact laws: exactly)."""


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
