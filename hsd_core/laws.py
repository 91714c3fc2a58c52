"""Probability vectors ("laws") and their validation.

A law is a tuple with one probability per vocabulary id (EOS included). Exact laws hold
``fractions.Fraction`` entries and sum to exactly 1; float laws hold Python floats (float64) and
sum to 1 within ``FLOAT_TOL``. Methods do their arithmetic on the entries, so the same code runs
exactly on rationals and approximately on floats.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from numbers import Rational, Real
from typing import Union

import numpy as np

Prob = Union[Fraction, float]
Law = tuple[Prob, ...]

FLOAT_TOL = 1e-9


class InvalidLawError(ValueError):
    """A model returned something that is not a probability vector over its vocabulary."""


def as_law(values: Iterable[object], size: int, where: str = "law") -> Law:
    """Validate ``values`` as a law of length ``size`` and return it as a tuple.

    Integers and Fractions give an exact law (Fractions); anything with a float gives a float law.
    Raises :class:`InvalidLawError` for something that is not a sequence (a dict, a str, ...), a
    wrong length, an entry that is not a number (a str such as ``"0.5"``, a bool), NaN or infinite
    entries, negative entries, or a sum that is not 1 (exactly for rationals, within ``FLOAT_TOL``
    for floats).
    """
    if isinstance(values, (Mapping, str, bytes)) or not isinstance(values, Iterable):
        raise InvalidLawError(
            f"{where}: is a {type(values).__name__}; a law is a sequence with one probability per id "
            "(EOS included), e.g. a list or a tuple")
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise InvalidLawError(f"{where}: is an array of shape {values.shape}; a law is 1-d")
        if values.dtype.kind == "f" and len(values) == size:
            return _float_array_law(values, where)
        vals: list[object] = values.tolist()
    else:
        vals = list(values)
    if len(vals) != size:
        raise InvalidLawError(f"{where}: has {len(vals)} entries, expected {size} (one per id, EOS included)")
    for i, v in enumerate(vals):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (Real, np.number)):
            raise InvalidLawError(f"{where}: entry {i} is {v!r} ({type(v).__name__}), not a number")
    exact = all(isinstance(v, (Rational, np.integer)) for v in vals)
    out: list[Prob] = []
    if exact:
        for v in vals:
            if isinstance(v, (int, np.integer)):
                out.append(Fraction(int(v)))
            else:
                assert isinstance(v, Rational)
                out.append(Fraction(int(v.numerator), int(v.denominator)))
    else:
        for i, v in enumerate(vals):
            try:
                f = float(v)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise InvalidLawError(f"{where}: entry {i} is {v!r}, not a number") from None
            out.append(f)
    for i, v in enumerate(out):
        if isinstance(v, float) and not math.isfinite(v):
            raise InvalidLawError(f"{where}: entry {i} is {v!r} (NaN or infinite)")
        if v < 0:
            raise InvalidLawError(f"{where}: entry {i} is negative ({v})")
    total = sum(out)
    if exact:
        if total != 1:
            raise InvalidLawError(f"{where}: sums to {total}, not exactly 1")
    elif abs(float(total) - 1.0) > FLOAT_TOL:
        raise InvalidLawError(f"{where}: sums to {float(total)!r}, not 1 (tolerance {FLOAT_TOL})")
    return tuple(out)


def _float_array_law(values: np.ndarray, where: str) -> Law:
    """The fast path of :func:`as_law` for a float numpy vector (a real model's output): the same
    checks, vectorized, and the same Python floats as the entry-by-entry path."""
    arr = values.astype(np.float64, copy=False)
    finite = np.isfinite(arr)
    if not finite.all():
        i = int(np.argmin(finite))
        raise InvalidLawError(f"{where}: entry {i} is {float(arr[i])!r} (NaN or infinite)")
    if (arr < 0).any():
        i = int(np.argmax(arr < 0))
        raise InvalidLawError(f"{where}: entry {i} is negative ({float(arr[i])})")
    out: Law = tuple(arr.tolist())
    total = sum(out)
    if abs(float(total) - 1.0) > FLOAT_TOL:
        raise InvalidLawError(f"{where}: sums to {float(total)!r}, not 1 (tolerance {FLOAT_TOL})")
    return out


def is_exact(law: Sequence[Prob]) -> bool:
    """True when every entry is a Fraction."""
    return all(isinstance(v, Fraction) for v in law)


def normalized(weights: Sequence[Prob]) -> Law | None:
    """``weights / sum(weights)`` as a law, or ``None`` when the total is zero (or not positive)."""
    total = sum(weights)
    if not total > 0:
        return None
    return tuple(w / total for w in weights)


def residual(p: Sequence[Prob], q: Sequence[Prob]) -> Law:
    """The rejection residual ``norm(max(p - q, 0))``.

    In exact arithmetic it is only needed when some ``p(x) < q(x)``, which makes the mass positive.
    With floats the mass can round to zero; then ``p`` itself is returned (the residual of a
    ``q`` that equals ``p`` up to rounding), so the sampler never divides by zero.
    """
    zero = p[0] - p[0]
    diff = [pi - qi if pi > qi else zero for pi, qi in zip(p, q)]
    r = normalized(diff)
    return tuple(p) if r is None else r


def argmax(law: Sequence[Prob]) -> int:
    """Index of the largest entry; ties go to the lowest index."""
    best = 0
    for i in range(1, len(law)):
        if law[i] > law[best]:
            best = i
    return best
