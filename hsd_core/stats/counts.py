"""Counts, empirical laws and total variation: the helpers on laws and samples."""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any, overload

import numpy as np
from numpy.typing import NDArray

from .checks import K, InvalidTest, Law, Samples, _validate_law

__all__ = ["counts_of", "empirical_law", "total_variation"]


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
