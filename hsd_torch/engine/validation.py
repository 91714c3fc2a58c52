"""Argument checks at ``hsd_torch``'s boundary (``generate``, its methods, ``audit_generate``, the
command line): one rule for what counts as an int or a real number, the ranges of the shared
arguments, the methods and which options each takes, the seed; and one exception type per kind of
mistake, so a caller can tell them apart:

- :class:`WrongType` (a ``TypeError``): an argument of the wrong type;
- :class:`OutOfRange` (a ``ValueError``): a value outside what the argument takes (where a
  ``ValueError`` has always been raised for a value of the wrong kind too, e.g. :func:`as_int`,
  this is the type raised);
- :class:`UnknownChoice` (a ``ValueError``): a name that is not one of the choices (``method``,
  ``proposal_map``);
- :class:`OptionNotTaken` (a ``ValueError``): an option the chosen method does not use;
- :class:`ConflictingArguments` (a ``ValueError``): arguments that cannot go together;
- :class:`NotSupported` (a ``NotImplementedError``): a combination that is valid but not
  implemented (SLRS settings whose psi would not finish).

All are :class:`InvalidArgument`. Each subclasses the built-in type ``generate`` has always raised
for that mistake, so ``except ValueError`` keeps working; messages are unchanged.

An int is a Python ``int`` or a numpy integer, never a ``bool`` (``True`` is an int to Python, but
never what was meant); a real number is that or a Python or numpy float. Values come back as Python
``int`` / ``float``, so nothing downstream sees a numpy scalar.

``hsd_core`` keeps its checks where they are, each kind already in one place: the statistics' in
``hsd_core/stats/checks.py`` (``hsd_core.stats.InvalidTest``), the methods' options in
``hsd_core/methods/base.py`` (``check_lookahead``, ``check_greedy``, ``check_method``), and the
models, vocabularies and tokenizers each check their own constructor's arguments (``ValueError``).
There is no second copy of one check to merge there, and its callers (the exact engine, the
strategies) catch ``ValueError`` as it is.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from hsd_core.laws import Prob
from hsd_core.methods.base import check_confidence

__all__ = ["METHODS", "OPTIONS", "TEMPERATURE_RANGE", "ConflictingArguments", "InvalidArgument", "NotSupported",
           "OptionNotTaken", "OutOfRange", "UnknownChoice", "WrongType", "as_int", "check_max_tokens", "check_method",
           "check_min_confidence", "check_min_path_prob", "check_seed",
           "check_temperature", "check_top_k", "check_top_p", "is_int", "is_real", "refuse_options_not_taken"]


class InvalidArgument(Exception):
    """A mistake in an argument, found at the boundary before any work (the base of the kinds below)."""


class WrongType(InvalidArgument, TypeError):
    """An argument of the wrong type."""


class OutOfRange(InvalidArgument, ValueError):
    """A value outside what its argument takes."""


class UnknownChoice(InvalidArgument, ValueError):
    """A name that is not one of its argument's choices."""


class OptionNotTaken(InvalidArgument, ValueError):
    """An option that the chosen method does not use."""


class ConflictingArguments(InvalidArgument, ValueError):
    """Arguments that cannot be given together (or one that needs another)."""


class NotSupported(InvalidArgument, NotImplementedError):
    """A valid combination of arguments that is not implemented."""


METHODS = ("ar", "sd", "tli", "slem", "slrs")
"""``generate``'s methods (``method=``, ``--method``)."""

OPTIONS = {"lookbehind": ("slem",), "resync": ("slem", "slrs"), "min_path_prob": ("slrs",), "proposal_map": ("slrs",),
           "max_tokens": ("slrs",), "tree": ("sd", "tli", "slem"),
           "tree_draws": ("sd", "tli", "slem"), "min_confidence": ("sd", "tli", "slem")}
"""``generate``'s method options and the methods that take them (the others refuse them when given:
``None``, or ``max_tokens=1``, counts as not given). ``lookahead`` is not here: every method but AR
drafts that many, and AR, which drafts nothing, accepts it too (the command line and the benches pass
one lookahead to every method); it is checked all the same."""


def is_int(value: Any) -> bool:
    """``value`` is an int or a numpy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
    """``value`` is an int or float, Python or numpy, not a bool."""
    return is_int(value) or isinstance(value, (float, np.floating))


def as_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as a Python int ``>= minimum``; :class:`OutOfRange` naming ``name`` otherwise."""
    if not is_int(value) or value < minimum:
        raise OutOfRange(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_method(method: Any) -> str:
    """``method`` if it is one of :data:`METHODS`; :class:`UnknownChoice` otherwise."""
    if not isinstance(method, str) or method not in METHODS:
        raise UnknownChoice(f"method must be one of {METHODS}, got {method!r}")
    return method


def refuse_options_not_taken(method: str, given: dict[str, bool], values: dict[str, Any]) -> None:
    """:class:`OptionNotTaken` for the first option of :data:`OPTIONS` given (``given[option]``)
    to a method that does not take it, naming the methods that do and the value (``values``)."""
    for option, takers in OPTIONS.items():
        if given[option] and method not in takers:
            raise OptionNotTaken(f"{option} is an option of method {' or '.join(map(repr, takers))} only; method "
                                 f"{method!r} does not use it (got {option}={values[option]!r})")


def check_max_tokens(max_tokens: Any) -> int | None:
    """SLRS's ``max_tokens``: None or an int >= 1 (as a Python int); :class:`OutOfRange` otherwise."""
    if max_tokens is not None and (not is_int(max_tokens) or max_tokens < 1):
        raise OutOfRange(f"max_tokens must be None or an int >= 1, got {max_tokens!r}")
    return None if max_tokens is None else int(max_tokens)


def check_min_path_prob(min_path_prob: Any) -> float | None:
    """Bounded SLRS's ``min_path_prob``: None or a number in ``(0, 1]`` (as a float);
    :class:`OutOfRange` otherwise (NaN included)."""
    if min_path_prob is not None and (not is_real(min_path_prob) or not 0 < min_path_prob <= 1):
        raise OutOfRange(f"min_path_prob must be None or a number in (0, 1], got {min_path_prob!r}")
    return None if min_path_prob is None else float(min_path_prob)


def check_min_confidence(min_confidence: Any) -> Prob | None:
    """SD's, TLI's and SLEM's ``min_confidence`` (the dynamic draft length): None or a probability in
    ``(0, 1]``, checked by ``hsd_core``'s own rule (:func:`hsd_core.methods.base.check_confidence`,
    whose value it returns: an int as a ``Fraction``, a numpy number as a float), its ``TypeError``
    as :class:`WrongType` and its ``ValueError`` as :class:`OutOfRange`, same message."""
    try:
        return check_confidence(min_confidence)
    except TypeError as e:
        raise WrongType(str(e)) from None
    except ValueError as e:
        raise OutOfRange(str(e)) from None


def check_seed(seed: Any) -> None:
    """``seed`` is an int >= 0 (numpy integers too), a ``torch.Generator`` or None;
    :class:`OutOfRange` otherwise (the type ``generate`` has always raised)."""
    torch = sys.modules.get("torch")
    if seed is None or (torch is not None and isinstance(seed, torch.Generator)):
        return
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise OutOfRange(f"seed must be an int >= 0, a torch.Generator or None, got {seed!r}")


TEMPERATURE_RANGE = (1e-3, 1e3)
"""The temperatures ``generate`` (``temperature``, ``drafter_temperature``) and ``audit_generate``
accept (:func:`check_temperature`). The processed law is ``softmax(logits / T)`` in float32 (float64
for float64 logits), and the range keeps it computable and meaningful:

- ``T`` must be finite: ``T = inf`` turns the removed ids' ``-inf`` logits into NaN (with top-p the
  whole row is NaN: a mid-generation "NaN or infinite logits?") and every other logit into 0, the
  uniform law whatever the model says;
- ``T`` must not underflow: ``1e-45`` is a float32 subnormal and ``1e-46`` rounds to 0, so
  ``logits / T`` overflows to ``inf`` and the softmax is NaN. From ``1e-3`` up, ``logits / T`` is
  finite in float32 for every ``|logit| < 3.4e35`` (any model's), and below it nothing is left to
  gain: at ``T = 1e-3`` a logit gap of 0.1 is already a factor ``e^-100 = 4e-44``, under float32's
  smallest normal, so the law is the greedy one to float32 resolution (use ``do_sample=False``);
- at ``T = 1e3`` a logit gap of 10 (a typical spread) is a factor ``e^0.01``: the law is the uniform
  one over the ids with text to within 1 %; a larger value adds nothing but the risk of a mistake."""


def check_temperature(value: Any, name: str = "temperature") -> float:
    """``value`` as a float in :data:`TEMPERATURE_RANGE` (why that range: its docstring), for
    ``generate``, ``audit_generate`` and the command line alike: ``TypeError`` for anything but a
    real number (Python or numpy; not a bool), ``ValueError`` outside the range (NaN and infinities
    included), both naming ``name`` and the range."""
    lo, hi = TEMPERATURE_RANGE
    msg = f"{name} must be a number in [{lo:g}, {hi:g}] (finite, and logits / {name} finite in float32), got {value!r}"
    if not is_real(value):
        raise WrongType(msg)
    t = float(value)
    if not (math.isfinite(t) and lo <= t <= hi):
        raise OutOfRange(msg + (": for greedy decoding use do_sample=False" if 0 <= t < lo else ""))
    return t


def check_top_k(value: Any) -> int | None:
    """``value`` as None or an int >= 1 (numpy integers too, not a bool); 0 is None (off, as
    transformers spells it); ``ValueError`` otherwise."""
    if value is None:
        return None
    if not is_int(value) or value < 0:
        raise OutOfRange(f"top_k must be None, 0 (off) or an int >= 1, got {value!r}")
    return int(value) or None


def check_top_p(value: Any) -> float | None:
    """``value`` as None or a float in ``(0, 1]``; ``ValueError`` otherwise (NaN included),
    ``TypeError`` for a value that is not a real number (Python or numpy; not a bool)."""
    if value is None:
        return None
    msg = f"top_p must be None or a number in (0, 1], got {value!r}"
    if not is_real(value):
        raise WrongType(msg)
    p = float(value)
    if not 0 < p <= 1:
        raise OutOfRange(msg)
    return p
