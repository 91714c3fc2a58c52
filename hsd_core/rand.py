"""The randomness interface that every method is written against, so that the code that is sampled is the
code that is enumerated exactly (README.md, first section; `hsd_core.exact`).

A method draws all of its randomness through two calls::

    rand.categorical(probs) -> int    # an index with the given probabilities
    rand.bernoulli(prob)    -> bool   # True with probability ``prob``

Three implementations:

* :class:`NumpyRand` samples with a ``numpy.random.Generator`` (what users run);
* :class:`UniformRand` consumes explicit uniforms in [0, 1) by inverse CDF, so another backend fed
  the same uniforms can be compared output for output (``NumpyRand`` is exactly ``UniformRand``
  fed by ``rng.random()``);
* :class:`Enumerator` re-executes a function, replaying a prefix of choices and branching on the
  next one, and returns every outcome with its exact probability.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from fractions import Fraction
from typing import Protocol, TypeVar, Union

import numpy as np

from .laws import Prob

R = TypeVar("R", bound=Hashable)


class Rand(Protocol):
    """Source of the two random choices a method may make."""

    def categorical(self, probs: Sequence[Prob]) -> int: ...

    def bernoulli(self, prob: Prob) -> bool: ...


def _check_probs(probs: Sequence[Prob]) -> None:
    if len(probs) == 0:
        raise ValueError("categorical over an empty law")
    for i, p in enumerate(probs):
        if not p >= 0:
            raise ValueError(f"categorical: entry {i} is {p!r}, not a probability")
    if not sum(probs) > 0:
        raise ValueError("categorical: the law has no mass")


def inverse_cdf(probs: Sequence[Prob], u: float) -> int:
    """The index ``i`` with ``cdf(i-1) <= u * total < cdf(i)``, never one of probability zero.

    ``u`` must lie in [0, 1). Rounding can push ``u * total`` past the last partial sum; the
    result is then the last index of positive probability.
    """
    if not 0.0 <= u < 1.0:
        raise ValueError(f"uniform {u!r} is not in [0, 1)")
    _check_probs(probs)
    total = float(sum(probs))
    target = u * total
    acc = 0.0
    last = -1
    for i, p in enumerate(probs):
        if p > 0:
            acc += float(p)
            last = i
            if target < acc:
                return i
    return last


class UniformRand:
    """Inverse-CDF sampler over an explicit stream of uniforms in [0, 1).

    Each ``categorical`` or ``bernoulli`` call consumes one uniform; ``bernoulli(p)`` is
    ``u < p``. Raises ``RuntimeError`` when the stream runs out. ``used`` counts the uniforms read.
    """

    def __init__(self, uniforms: Iterable[float]) -> None:
        self._it: Iterator[float] = iter(uniforms)
        self.used = 0

    def _next(self) -> float:
        try:
            u = float(next(self._it))
        except StopIteration:
            raise RuntimeError(f"ran out of uniforms after {self.used}") from None
        self.used += 1
        return u

    def categorical(self, probs: Sequence[Prob]) -> int:
        _check_probs(probs)
        return inverse_cdf(probs, self._next())

    def bernoulli(self, prob: Prob) -> bool:
        if not 0 <= prob <= 1:
            raise ValueError(f"bernoulli probability {prob!r} is not in [0, 1]")
        return self._next() < float(prob)


class NumpyRand(UniformRand):
    """Sampler over a ``numpy.random.Generator``: ``UniformRand`` fed by ``rng.random()``.

    ``rng`` is anything :func:`as_generator` takes (an int seed, a Generator, a SeedSequence, None).
    """

    def __init__(self, rng: RngLike) -> None:
        rng = as_generator(rng)

        def stream() -> Iterator[float]:
            while True:
                yield float(rng.random())

        super().__init__(stream())


class CostLimitError(ValueError):
    """An exact computation (an enumeration, psi, an output law) would cost more than its stated
    limit; the message says what to lower (the lookahead, max_new_tokens) or which limit to raise."""


RngLike = Union[int, np.integer, np.random.Generator, np.random.SeedSequence, np.random.BitGenerator, None]


def as_generator(rng: object) -> np.random.Generator:
    """A ``numpy.random.Generator`` from what SPEC 7 (Scientific Python) accepts as ``rng``: an
    int seed, a ``Generator`` (used as it is), a ``SeedSequence`` or ``BitGenerator``, or None
    (fresh entropy from the OS). ``numpy.random.RandomState`` and ``random.Random`` raise
    ``TypeError`` with the line that converts them; so does anything else."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, np.random.RandomState) or type(rng).__module__ == "random":
        raise TypeError(
            f"rng is a legacy {type(rng).__module__}.{type(rng).__name__}; hsd follows SPEC 7 and takes an int "
            "seed, a numpy.random.Generator, a SeedSequence or None (e.g. rng=np.random.default_rng(0))")
    if rng is None or isinstance(rng, (np.random.SeedSequence, np.random.BitGenerator)):
        return np.random.default_rng(rng)
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, (bool, np.bool_)):
        if rng < 0:
            raise ValueError(f"rng seed {rng} must be >= 0")
        return np.random.default_rng(int(rng))
    raise TypeError(
        f"rng is a {type(rng).__name__}; pass an int seed, a numpy.random.Generator, a SeedSequence or None "
        "(or an hsd_core.rand.Rand such as UniformRand)")


class _Branch(BaseException):  # not an Exception: method code must not swallow it
    def __init__(self, options: list[tuple[object, Prob]]) -> None:
        super().__init__()
        self.options = options


class _Replay:
    """Replays fixed choices, then raises :class:`_Branch` with the options of the next one.

    Replayed choices are returned without recomputing their options (they were checked when the
    branch was first taken), which keeps re-execution cheap.
    """

    def __init__(self, prefix: Sequence[object]) -> None:
        self._prefix = prefix
        self._pos = 0

    def categorical(self, probs: Sequence[Prob]) -> int:
        if self._pos < len(self._prefix):
            c = self._prefix[self._pos]
            self._pos += 1
            assert isinstance(c, int)
            return c
        _check_probs(probs)
        total = sum(probs)
        if total == 1:
            raise _Branch([(i, p) for i, p in enumerate(probs) if p > 0])
        raise _Branch([(i, p / total) for i, p in enumerate(probs) if p > 0])

    def bernoulli(self, prob: Prob) -> bool:
        if self._pos < len(self._prefix):
            c = self._prefix[self._pos]
            self._pos += 1
            assert isinstance(c, bool)
            return c
        if not 0 <= prob <= 1:
            raise ValueError(f"bernoulli probability {prob!r} is not in [0, 1]")
        one = prob - prob + 1
        raise _Branch([(b, w) for b, w in ((True, prob), (False, one - prob)) if w > 0])


class Enumerator:
    """Exact law of a randomized function, by re-execution with replayed choices.

    ``Enumerator().law(fn)`` calls ``fn(rand)`` once per complete path of choices and returns a dict
    mapping each distinct result to the sum of its paths' probabilities (products of the branch
    probabilities, Fractions when the laws are exact). Zero-probability branches are never taken.
    ``fn`` must be deterministic given its choices. ``paths`` and ``calls`` count the complete paths
    and the executions of ``fn`` made by the last ``law`` call.
    """

    def __init__(self) -> None:
        self.paths = 0
        self.calls = 0

    def law(self, fn: Callable[[Rand], R], max_calls: int | None = None) -> dict[R, Prob]:
        """The exact law of ``fn``'s result. With ``max_calls``, raise :class:`CostLimitError`
        before the ``max_calls + 1``-th execution of ``fn``."""
        out: dict[R, Prob] = {}
        one: Prob = Fraction(1)
        stack: list[tuple[list[object], Prob]] = [([], one)]
        self.paths = self.calls = 0
        while stack:
            prefix, prob = stack.pop()
            if max_calls is not None and self.calls >= max_calls:
                raise CostLimitError(f"the enumeration needs more than {max_calls} executions")
            self.calls += 1
            try:
                result = fn(_Replay(prefix))
            except _Branch as b:
                for choice, w in reversed(b.options):
                    stack.append((prefix + [choice], prob * w))
                continue
            self.paths += 1
            out[result] = out[result] + prob if result in out else prob
        return out
