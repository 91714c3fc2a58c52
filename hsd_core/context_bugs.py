"""Tests aimed at named context bugs, for the sequence audits (:mod:`hsd_core.seqaudit`).

A context bug feeds the target a wrong context: the sampler then draws every token from the target's
law *under that context*, ``r_t = p(. | bug(prompt), x_<t)``, instead of ``p_t = p(. | prompt,
x_<t)``. Such a departure moves each law in its own direction, so the pooled PIT tests average it
out and the log-likelihood martingale sees only what is left of its KL once the entropy changes
cancel: measured on a trained pair, the prompt's last id fed twice moves the laws by a mean
per-token TV of 0.054 and passes 200 sequences of 32 tokens (``docs/auditing.md``). When the bug is
named, its law is known: teacher-force the sequences once more through ``bug(prompt)`` and test
toward ``r_t``, as the directional test does toward the drafter: with ``w_t = r_t / (p_t + r_t)``
(in [0, 1]), ``D = sum_t (w_t(x_t) - E_{p_t} w_t)`` over ``sqrt(sum_t Var_{p_t} w_t)``, one-sided.
``w_t`` depends on the history only, so under losslessness ``D`` is a martingale with known
conditional variance (referred to N(0, 1) by the martingale central limit theorem, checked by
simulation in ``tests/stats/test_audit_sequences.py``), whatever the bug.

The power is exact in the same sense as the rest of the statement (normal approximation at the met
positions, every position, no subsample): with ``r_t`` given, the mean and variance of each
``w_t(x)`` under ``r_t`` (conditioned on ``p_t``'s support: a draw outside it is a draw of
probability 0, caught at once) give the probability that the aimed test alone catches the bug.
Only the named bugs are aimed at: a context bug that is not on the list gets no aimed test.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats as sps  # type: ignore[import-untyped]

__all__ = ["CONTEXT_BUGS", "DEFAULT_CONTEXT_BUGS", "ContextBug", "context_bugs"]

F64 = NDArray[np.float64]
_TINY = 1e-14  # a position's null variance of w below this is rounding (w = 1/2 exactly when r = p)


@dataclass(frozen=True)
class ContextBug:
    """One named context bug: ``what`` it does (the test is named after it) and ``context``, the
    prompt's ids as the bug feeds them (an empty list: the bug leaves nothing to condition on, and
    sequences after that prompt give the aimed test no evidence)."""

    name: str
    what: str
    context: Callable[[Sequence[int]], list[int]]


def _last_twice(ids: Sequence[int]) -> list[int]:
    return [*ids, *ids[-1:]]


def _last_dropped(ids: Sequence[int]) -> list[int]:
    return list(ids[:-1])


CONTEXT_BUGS: dict[str, ContextBug] = {b.name: b for b in [
    ContextBug("prompt_last_twice", "the prompt's last id fed twice", _last_twice),
    ContextBug("prompt_last_dropped", "the prompt's last id dropped", _last_dropped),
]}
"""Name -> :class:`ContextBug`: the prefill off-by-ones (the whole prompt prefilled, then its last id
fed again as the first decoding step; or the prompt prefilled without its last id)."""

DEFAULT_CONTEXT_BUGS: tuple[str, ...] = ("prompt_last_twice",)
"""The context bugs the audits aim at unless told otherwise: the most common prefill off-by-one. Each
costs one more teacher-forced pass of the target."""


def context_bugs(names: Sequence[str] | None) -> tuple[ContextBug, ...]:
    """The :class:`ContextBug` of each name (None or empty: none). ``TypeError`` for a bare str (a
    sequence of names is wanted), ``ValueError`` for an unknown or repeated name."""
    if names is None:
        return ()
    if isinstance(names, str):
        raise TypeError(f"context_bugs must be a sequence of names, got the str {names!r} (write ({names!r},))")
    out = []
    for nm in names:
        if not isinstance(nm, str) or nm not in CONTEXT_BUGS:
            raise ValueError(f"unknown context bug {nm!r}; known: {', '.join(sorted(CONTEXT_BUGS))}")
        out.append(CONTEXT_BUGS[nm])
    if len({b.name for b in out}) != len(out):
        raise ValueError(f"context_bugs names a bug twice: {list(names)}")
    return tuple(out)


class AimedStats:
    """The aimed tests' sums over the audited positions, one per named bug: the statistic ``D``'s
    numerator and null variance, and under the bug's own law the mean shift, variance, TV and the
    log-probability of never drawing outside the target's support (module docstring)."""

    def __init__(self, whats: Sequence[str]) -> None:
        self.whats = tuple(whats)
        k = len(self.whats)
        self.steps = 0
        self.sum, self.var0 = np.zeros(k), np.zeros(k)
        self.mu1, self.var1 = np.zeros(k), np.zeros(k)
        self.tv, self.log_keep = np.zeros(k), np.zeros(k)

    def add(self, p: F64, x: NDArray[np.int64], laws: Sequence[F64]) -> None:
        """Add ``m`` positions: ``p [m, V]`` the target's laws, ``x [m]`` the draws (each with ``p > 0``),
        ``laws[k] [m, V]`` the target's laws under bug ``k``."""
        if len(laws) != len(self.whats):
            raise ValueError(f"aimed: {len(laws)} laws given for {len(self.whats)} named bugs")
        rows = np.arange(p.shape[0])
        on = p > 0
        full = bool(on.all())  # no id outside p's support: r needs no conditioning on it
        dot = np.einsum
        for k, r in enumerate(laws):
            r = np.asarray(r, dtype=np.float64)
            if r.shape != p.shape:
                raise ValueError(f"aimed law {k} has shape {r.shape}, p has {p.shape}")
            s = p + r
            w = r / np.where(s > 0, s, 1.0)  # 0 where p = r = 0
            ew = dot("ij,ij->i", p, w)
            v0 = dot("ij,ij,ij->i", p, w, w) - ew ** 2
            live = v0 > _TINY  # r = p (w = 1/2 on p's support) up to rounding: no evidence, not noise
            self.sum[k] += float(np.where(live, w[rows, x] - ew, 0.0).sum())
            self.var0[k] += float(np.where(live, v0, 0.0).sum())
            r_on = r if full else np.where(on, r, 0.0)
            keep = r_on.sum(axis=1)
            den = np.where(keep > 0, keep, 1.0)
            e1 = dot("ij,ij->i", r_on, w) / den
            e2 = dot("ij,ij,ij->i", r_on, w, w) / den
            self.mu1[k] += float(np.where(live, e1 - ew, 0.0).sum())
            self.var1[k] += float(np.where(live, np.clip(e2 - e1 ** 2, 0.0, None), 0.0).sum())
            self.tv[k] += float(0.5 * np.abs(r - p).sum())
            with np.errstate(divide="ignore"):
                self.log_keep[k] += float(np.log(np.clip(keep, 0.0, 1.0)).sum())
        self.steps += int(p.shape[0])

    def test_name(self, k: int) -> str:
        return f"directional (toward {self.whats[k]})"

    def z(self, k: int) -> float | None:
        """The standardized statistic of bug ``k`` (None when no law met gives it any variance)."""
        return None if self.var0[k] <= 0 else float(self.sum[k] / math.sqrt(self.var0[k]))

    def caught(self, k: int, a: float) -> tuple[float, str]:
        """The probability that a sampler with bug ``k`` is caught at level ``a`` by its aimed test or
        by a draw of probability 0 (at the met positions), and which of the two does it best."""
        zero = 1.0 - math.exp(self.log_keep[k]) if self.log_keep[k] > -700 else 1.0
        aimed = 0.0
        if self.var0[k] > 0:
            s1 = math.sqrt(self.var1[k]) if self.var1[k] > 0 else 1e-300
            aimed = float(sps.norm.cdf((self.mu1[k] - float(sps.norm.isf(a)) * math.sqrt(self.var0[k])) / s1))
        return (aimed, self.test_name(k)) if aimed >= zero else (zero, "a draw of probability 0")
