"""The report of a sequence audit (:func:`hsd_core.seqaudit.audit_sequences`, and the PyTorch
backend's): :class:`SequenceAuditReport` (verdict, sizes, the tests, the power per family of
departures, every PIT; as markdown and as a plot) and :class:`FamilyPower`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from scipy import stats as sps  # type: ignore[import-untyped]

from .._plot import pyplot
from .checks import TestResult
from .family import Verdict

__all__ = ["DEFAULT_BINS", "FamilyPower", "SequenceAuditReport"]

F64 = NDArray[np.float64]

DEFAULT_BINS = 20
"""Bins of the pooled PIT chi-square."""

@dataclass(frozen=True)
class FamilyPower:
    """The smallest departure of one named family that the audit catches with probability >=
    ``power``: ``detectable`` is the family's parameter there (lambda for the mixture toward the
    drafter, the factor ``f`` for the temperature; None when even the largest on the grid is not
    caught, or for a fixed departure), ``mean_tv`` the mean per-token TV it amounts to at the met
    positions, ``caught`` the probability that the fixed departure (or the detectable one) is
    caught, ``by`` the test that catches it best, ``note`` what the family is."""

    family: str
    detectable: float | None
    mean_tv: float | None
    caught: float
    by: str
    note: str


@dataclass(frozen=True)
class SequenceAuditReport:
    """Result of :func:`hsd_core.seqaudit.audit_sequences` (its module docstring). ``tests`` ran
    each at ``alpha / m``; ``holm_rejected[i]`` is the corrected verdict of ``tests[i]``; ``families`` the power
    statement; ``detectable_tv`` the headline promise (mean per-token TV, ``detectable_by`` names
    its family); ``impossible`` the draws the target gives probability 0 as ``(sequence,
    position, id)``; ``malformed`` what was wrong with malformed sequences; ``pits`` and
    ``pit_positions`` every PIT and its position (for plots and further tests); ``prefix_cut`` the
    sequences audited on their prefix only (``length_mismatch="prefix"``)."""

    verdict: Verdict
    reason: str
    n: int
    tokens: int
    max_new_tokens: int
    alpha: float
    power: float
    seed: int
    m: int
    tests: tuple[TestResult, ...]
    holm_rejected: tuple[bool, ...]
    skipped: tuple[str, ...]
    families: tuple[FamilyPower, ...]
    detectable_tv: float | None
    detectable_by: str
    impossible: tuple[tuple[int, int, int], ...]
    malformed: tuple[str, ...]
    do_sample: bool = True
    processing: str = ""
    name: str = "sampler"
    cost: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    """What the teacher forcing cost in passes and calls (e.g. ``target passes``, ``provider calls``,
    ``provider positions``): counts, where :attr:`cost` has seconds."""
    pits: F64 = field(default_factory=lambda: np.zeros(0), repr=False, compare=False)
    pit_positions: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False,
                                             compare=False)
    bins: int = DEFAULT_BINS
    prefix_cut: tuple[str, ...] = ()
    n_needed: int | None = None
    """When the headline promise is above ``max_detectable_tv``: about how many sequences would
    bring it down to that (None otherwise, or when no grid point reaches it)."""

    @property
    def per_test_alpha(self) -> float:
        """``alpha / m``: the level at which each test ran."""
        return self.alpha / self.m

    def to_markdown(self, title: str | None = None) -> str:
        """The report as a markdown section: verdict, sizes, the tests, the power per family."""
        det = "n/a" if self.detectable_tv is None else f"{self.detectable_tv:.4g}"
        lines = [f"## {title or f'Sequence audit of {self.name}'}", "",
                 f"**Verdict: {self.verdict}** ({self.reason})", "",
                 f"- n = {self.n} sequences, {self.tokens} tokens (max_new_tokens {self.max_new_tokens}); "
                 + ("sampling" if self.do_sample else "greedy") + (f", {self.processing}" if self.processing else ""),
                 f"- family-wise alpha = {self.alpha:.3g} (Holm over m = {self.m} tests, each at "
                 f"{self.per_test_alpha:.3g}); power = {self.power}; seed = {self.seed}",
                 f"- headline promise: mean per-token TV {det} ({self.detectable_by})"]
        if self.cost:
            lines.append("- cost: " + ", ".join(f"{k} {v:.3g} s" for k, v in self.cost.items()))
        if self.calls:
            lines.append("- teacher forcing: " + ", ".join(f"{k} {v}" for k, v in self.calls.items()))
        if self.impossible:
            lines.append(f"- {len(self.impossible)} draws of probability 0 under the target, first "
                         + ", ".join(f"sequence {s} position {j} id {t}" for s, j, t in self.impossible[:5]))
        if self.malformed:
            lines.append(f"- {len(self.malformed)} malformed sequences, first: " + "; ".join(self.malformed[:3]))
        if self.prefix_cut:
            lines.append(f"- {len(self.prefix_cut)} sequences audited on their prefix only (length_mismatch='prefix': "
                         "cut after the first end id and at max_new_tokens), first: " + "; ".join(self.prefix_cut[:3]))
        lines += ["", "| test | statistic | p-value | n | Holm rejects |", "|---|---|---|---|---|"]
        for r, rej in zip(self.tests, self.holm_rejected):
            lines.append(f"| {r.name} | {r.statistic:.4g} | {r.p_value:.3g} | {r.n} | {'**yes**' if rej else 'no'} |")
        if self.skipped:
            lines += ["", "Skipped tests:"] + [f"- {s}" for s in self.skipped]
        lines += ["", f"What would be caught with probability >= {self.power} (at the met positions):", "",
                  "| departure | smallest caught | mean per-token TV | caught with probability | best test |",
                  "|---|---|---|---|---|"]
        for f in self.families:
            d = "n/a" if f.detectable is None else f"{f.detectable:.4g}"
            tv = "n/a" if f.mean_tv is None else f"{f.mean_tv:.4g}"
            lines.append(f"| {f.family} ({f.note}) | {d} | {tv} | {f.caught:.3g} | {f.by} |")
        return "\n".join(lines) + "\n"

    def save_plot(self, path: str) -> bool:
        """Write a PNG: the histogram of the pooled PITs with each bin's 99% band under
        uniformity (per bin), and the mean PIT per position with its 99% band. matplotlib is
        optional: without it, print a message to stderr and return False. Returns True if written."""
        plt = pyplot(path)
        if plt is None:
            return False
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        u = self.pits
        k = self.bins
        counts = np.histogram(u, bins=k, range=(0.0, 1.0))[0] if u.size else np.zeros(k)
        xs = (np.arange(k) + 0.5) / k
        a1.bar(xs, counts, width=0.9 / k, color="tab:orange", label="observed PITs")
        if u.size:
            lo, hi = sps.binom.ppf(0.005, u.size, 1 / k), sps.binom.ppf(0.995, u.size, 1 / k)
            a1.fill_between([0, 1], [lo, lo], [hi, hi], color="tab:blue", alpha=0.2,
                            label="99% band of each bin under uniformity")
            a1.axhline(u.size / k, color="tab:blue", lw=1)
        a1.set_xlabel("randomized PIT of each token under the target's conditional law")
        a1.set_ylabel("tokens")
        fig.suptitle(f"{self.name}: {self.verdict} ({self.n} sequences, {self.tokens} tokens)", fontsize=9)
        a1.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.02), ncol=2, borderaxespad=0.0)
        pos = self.pit_positions
        if u.size:
            js = np.unique(pos)
            means = np.array([u[pos == j].mean() for j in js])
            cnt = np.array([(pos == j).sum() for j in js])
            half = 2.576 * np.sqrt(1 / 12 / cnt)
            a2.fill_between(js, 0.5 - half, 0.5 + half, color="tab:blue", alpha=0.2,
                            label="99% band of each position's mean (pointwise)")
            a2.plot(js, means, "o-", color="tab:orange", ms=3, label="mean PIT")
        a2.axhline(0.5, color="tab:blue", lw=1)
        a2.set_xlabel("position of the new token (0 = first)")
        a2.set_ylabel("mean PIT")
        a2.set_ylim(0, 1)
        a2.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.02), ncol=2, borderaxespad=0.0)
        fig.tight_layout(rect=(0.0, 0.0, 1.0, 0.93))
        fig.savefig(path)
        plt.close(fig)
        return True
