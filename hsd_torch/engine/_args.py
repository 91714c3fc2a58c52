"""Checks of plain arguments shared by ``generate``, its methods and ``audit_generate``: one rule
for what counts as an int or a real number, so every argument reads the same way.

An int is a Python ``int`` or a numpy integer (``np.int64(3)`` from an array), never a ``bool``
(``True`` is an int to Python, but never what was meant); a real number is that or a Python or
numpy float. Values come back as Python ``int`` / ``float``, so nothing downstream sees a numpy
scalar. Refusals are ``ValueError`` naming the argument and the value (the type of error that
``generate`` has always raised for its integer arguments).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["as_int", "is_int", "is_real"]


def is_int(value: Any) -> bool:
    """``value`` is an int or a numpy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
    """``value`` is an int or float, Python or numpy, not a bool."""
    return is_int(value) or isinstance(value, (float, np.floating))


def as_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as a Python int ``>= minimum``; ``ValueError`` naming ``name`` otherwise."""
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)

