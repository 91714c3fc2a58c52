"""The power statement of a sequence audit: what it would catch, and with what probability.

From the ingredients :class:`~hsd_core.stats.alternatives.Alternatives` summed over the power
subsample, :class:`PowerStatement` gives the power of each test (at level ``a``, for the tokens
seen or a multiple of them) under every departure, the best test for each, the smallest departure
of each family caught with probability >= ``power`` (:class:`~hsd_core.stats.seqreport.FamilyPower`),
the headline promise, and how many more sequences would bring it down to a given TV (the module
docstring of :mod:`hsd_core.seqaudit`, "The promise").
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray
from scipy import stats as sps  # type: ignore[import-untyped]

from ..context_bugs import AimedStats
from .alternatives import TEMPERATURE_FACTORS, Alternatives
from .seqreport import FamilyPower

__all__ = ["PowerStatement"]

F64 = NDArray[np.float64]


class PowerStatement:
    """The power statement over ``alt`` (flushed) and the aimed tests' sums ``aim``, for ``tokens``
    audited tokens, ``bins`` PIT bins, with or without a drafter, at the audit's ``power``."""

    def __init__(self, alt: Alternatives, aim: AimedStats, *, tokens: int, bins: int, drafter: bool,
                 power: float) -> None:
        self.alt, self.aim = alt, aim
        self.tokens, self.bins, self.drafter, self.power = tokens, bins, drafter, power

    def powers(self, a: float, scale: float = 1.0) -> dict[str, F64]:
        """Power of each test (at level ``a``) under every alternative, for ``scale`` times the
        tokens seen."""
        alt = self.alt
        n_alt = len(alt.names)
        out: dict[str, F64] = {}
        if alt.steps == 0 or self.tokens == 0:
            return {"none": np.zeros(n_alt)}
        n_tok = self.tokens * scale
        k = self.bins
        pi = alt.bins / alt.steps
        nc = n_tok * k * ((pi - 1.0 / k) ** 2).sum(axis=1)
        crit = sps.chi2.isf(a, k - 1)
        out["PIT chi-square (pooled)"] = np.asarray(sps.ncx2.sf(crit, k - 1, nc), dtype=np.float64)
        mean_ratio = n_tok / alt.steps
        if alt.null_ll_var > 0:
            mu, s1 = alt.ll_mu * mean_ratio, np.sqrt(alt.ll_var * mean_ratio)
            s0 = math.sqrt(alt.null_ll_var * mean_ratio)
            z = float(sps.norm.isf(a / 2))
            s1 = np.where(s1 > 0, s1, 1e-300)
            out["log-likelihood martingale"] = sps.norm.cdf((mu - z * s0) / s1) + sps.norm.cdf((-mu - z * s0) / s1)
        if self.drafter and alt.null_dir_var > 0:
            mu, s1 = alt.dir_mu * mean_ratio, np.sqrt(alt.dir_var * mean_ratio)
            s0 = math.sqrt(alt.null_dir_var * mean_ratio)
            z = float(sps.norm.isf(a))
            s1 = np.where(s1 > 0, s1, 1e-300)
            out["directional (toward the drafter)"] = sps.norm.cdf((mu - z * s0) / s1)
        with np.errstate(over="ignore", invalid="ignore"):
            out["a draw of probability 0"] = 1.0 - np.exp(alt.log_keep * mean_ratio)
        return out

    def best(self, a: float, scale: float = 1.0) -> tuple[F64, list[str]]:
        pw = self.powers(a, scale)
        names = list(pw)
        arr = np.nan_to_num(np.array([pw[k] for k in names]), nan=0.0)
        return arr.max(axis=0), [names[i] for i in arr.argmax(axis=0)]

    def families(self, a: float) -> list[FamilyPower]:
        alt = self.alt
        if alt.steps == 0:
            return []
        best, by = self.best(a)
        tv = alt.tv / alt.steps
        out: list[FamilyPower] = []
        if self.drafter:
            idx = alt.index("mixture")
            hit = [i for i in idx if best[i] >= self.power]
            if hit:
                i = hit[0]
                out.append(FamilyPower("mixture toward the drafter", alt.names[i][1], float(tv[i]), float(best[i]),
                                       by[i], "(1 - lambda) p + lambda q; detectable: lambda"))
            else:
                i = idx[-1]
                out.append(FamilyPower("mixture toward the drafter", None, None, float(best[i]), by[i],
                                       "(1 - lambda) p + lambda q; not caught even at lambda = 1"))
        hot, cold = alt.index("hotter"), alt.index("colder")
        found = None
        for i, j in zip(hot, cold):
            if best[i] >= self.power and best[j] >= self.power:
                found = (i, j)
                break
        if found:
            i, j = found
            out.append(FamilyPower("temperature off by a factor", alt.names[i][1], float(max(tv[i], tv[j])),
                                   float(min(best[i], best[j])), by[i] if best[i] <= best[j] else by[j],
                                   "p^(1/f) and p^f renormalized; detectable: f"))
        else:
            out.append(FamilyPower("temperature off by a factor", None, None, float(min(best[hot[-1]], best[cold[-1]])),
                                   by[hot[-1]], f"p^(1/f) and p^f; not caught even at f = {TEMPERATURE_FACTORS[-1]:.3g}"))
        for fam, note in (("one fewer", "the least likely token of each law removed (top-k / top-p off by one)"),
                          ("one more", "the raw law's next token added (top-k / top-p off by one)")):
            for i in alt.index(fam):
                out.append(FamilyPower(f"one token {fam.split()[1]}", None, float(tv[i]), float(best[i]), by[i], note))
        aim = self.aim
        for k, what in enumerate(aim.whats):
            pw, how = aim.caught(k, a)
            out.append(FamilyPower(f"context bug: {what}", None, float(aim.tv[k]) / max(1, aim.steps), pw, how,
                                   "the target's law under that context at every met position; by its aimed test"))
        return out

    def headline(self, fams: list[FamilyPower]) -> FamilyPower | None:
        want = "mixture toward the drafter" if self.drafter else "temperature off by a factor"
        for f in fams:
            if f.family == want:
                return f
        return None

    def scale_needed(self, a: float, family: str, max_tv: float) -> float | None:
        """The factor by which the number of sequences must grow for ``family`` to be caught at a
        mean per-token TV <= ``max_tv`` (None if no grid point qualifies up to x10^4)."""
        alt = self.alt
        tv = alt.tv / max(1, alt.steps)
        if family == "mixture toward the drafter":
            cand = [[i] for i in alt.index("mixture") if tv[i] <= max_tv]
        else:
            cand = [[i, j] for i, j in zip(alt.index("hotter"), alt.index("colder")) if max(tv[i], tv[j]) <= max_tv]
        if not cand:
            return None
        hi = 1e4
        if not any(self.best(a, hi)[0][c].min() >= self.power for c in cand):
            return None
        lo = 1.0
        for _ in range(40):
            mid = math.sqrt(lo * hi)
            b = self.best(a, mid)[0]
            if any(b[c].min() >= self.power for c in cand):
                hi = mid
            else:
                lo = mid
        return hi
