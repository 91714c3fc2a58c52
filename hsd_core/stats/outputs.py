"""The outputs of a sampler audit (:func:`hsd_core.audit.audit_sampler`) and the cells its tests
look at: outputs checked as tuples of int ids, the conditional laws and counts of a position, of
the token after a prefix, and of the decoded text; and the seeded, chunked drawing of the samples
(:func:`draw_chunks`)."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

import numpy as np

from .checks import Prob

__all__ = ["Output", "draw_chunks"]

Output = tuple[int, ...]


def _is_token(t: object) -> bool:
    return isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_))


def _as_output(x: object, what: str) -> Output:
    """``x`` as a tuple of Python ints; ``TypeError`` unless it is a tuple, a list or a 1-d integer
    array of ints (numpy integers included): ``(1.7,)``, a dict, a str, None or a bare int are
    refused rather than coerced."""
    if isinstance(x, np.ndarray) and x.ndim == 1 and x.dtype.kind in "iu":
        return tuple(int(t) for t in x.tolist())
    if isinstance(x, (tuple, list)) and all(_is_token(t) for t in x):
        return tuple(int(t) for t in x)
    raise TypeError(
        f"{what} is {x!r} ({type(x).__name__}); outputs are tuples (or lists) of int token ids, e.g. (3, 1)")


def _normalise_law(law: object) -> dict[Output, Prob]:
    """The law with its keys checked (tuples of ints, numpy ints allowed) and made Python ints;
    probabilities are left for :func:`~hsd_core.stats.checks._validate_law` to check."""
    if not isinstance(law, Mapping):
        raise TypeError(f"the law must be a Mapping from output tuples to probabilities, got {type(law).__name__}")
    out: dict[Output, Any] = {}
    for s, p in law.items():
        if not isinstance(s, tuple):
            raise TypeError(f"law key {s!r} ({type(s).__name__}) must be a tuple of int token ids, e.g. (3, 1)")
        out[_as_output(s, f"law key {s!r}")] = p
    return out


def _position_law(law: Mapping[Output, Prob], j: int) -> dict[int, Prob]:
    """Exact law of the j-th token given len(output) > j (empty if no output reaches j)."""
    raw: dict[int, Prob] = {}
    for s, p in law.items():
        if len(s) > j and p > 0:
            raw[s[j]] = raw.get(s[j], 0) + p
    total = sum(raw.values())
    return {t: p / total for t, p in raw.items()} if total > 0 else {}


def _position_counts(counts: Mapping[Output, int], j: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for s, c in counts.items():
        if len(s) > j:
            out[s[j]] = out.get(s[j], 0) + c
    return out


def _prefix_law(law: Mapping[Output, Prob], pre: Output) -> dict[int, Prob]:
    """Exact law of the token after ``pre`` given that the output starts with ``pre`` and goes on."""
    k = len(pre)
    raw: dict[int, Prob] = {}
    for s, p in law.items():
        if len(s) > k and s[:k] == pre and p > 0:
            raw[s[k]] = raw.get(s[k], 0) + p
    total = sum(raw.values())
    return {t: p / total for t, p in raw.items()} if total > 0 else {}


def _prefix_counts(counts: Mapping[Output, int], pre: Output) -> dict[int, int]:
    k = len(pre)
    out: dict[int, int] = {}
    for s, c in counts.items():
        if len(s) > k and s[:k] == pre:
            out[s[k]] = out.get(s[k], 0) + c
    return out


def _draw_chunk(sample_fn: Callable[[np.random.Generator], Any], entropy: int, j: int, size: int) -> list[Any]:
    """Chunk ``j``: ``size`` draws with ``default_rng(SeedSequence(entropy, spawn_key=(j,)))``, the
    ``j``-th child of ``SeedSequence(entropy).spawn``. Module level, so executors can pickle it."""
    rng = np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(j,)))
    return [sample_fn(rng) for _ in range(size)]


_NOT_PICKLABLE = ("sample_fn must be picklable to run on a process or cluster executor ({why}): define it at "
                  "module level (not a lambda, closure or local class), or as functools.partial of a "
                  "module-level function; load big objects (models) lazily inside the worker")


def draw_chunks(sample_fn: Callable[[np.random.Generator], Any], n: int, seed: int, chunk_size: int = 1000,
                executor: Executor | None = None) -> list[Any]:
    """``n`` draws ``sample_fn(rng)``, in chunks of ``chunk_size`` with independent
    ``SeedSequence(seed).spawn`` children (see :func:`audit_sampler`), serially or on ``executor``;
    the result depends on ``(seed, chunk_size)`` only, not on the executor. ``TypeError`` naming
    the fix when a process executor cannot pickle ``sample_fn``."""
    sizes = [min(chunk_size, n - start) for start in range(0, n, chunk_size)]
    if executor is None:
        chunks = [_draw_chunk(sample_fn, seed, j, s) for j, s in enumerate(sizes)]
    else:
        if isinstance(executor, ProcessPoolExecutor):
            try:
                pickle.dumps(sample_fn)
            except Exception as e:  # pickle raises PicklingError, AttributeError or TypeError
                raise TypeError(_NOT_PICKLABLE.format(why=f"{type(e).__name__}: {e}")) from e
        try:
            futures = [executor.submit(_draw_chunk, sample_fn, seed, j, s) for j, s in enumerate(sizes)]
            chunks = [f.result() for f in futures]
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            if "pickl" not in str(e).lower():
                raise
            raise TypeError(_NOT_PICKLABLE.format(why=f"{type(e).__name__}: {e}")) from e
    return [x for c in chunks for x in c]


def _pushforward(law: Mapping[Output, Prob], f: Callable[[Output], str]) -> dict[str, Prob]:
    out: dict[str, Prob] = {}
    for s, p in law.items():
        if p > 0:
            key = f(s)
            out[key] = out.get(key, 0) + p
    return out


def _text_counts(counts: Mapping[Output, int], f: Callable[[Output], str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s, c in counts.items():
        key = f(s)
        out[key] = out.get(key, 0) + c
    return out
