"""The report of :func:`hsd_core.audit.audit_sampler`: :class:`AuditReport` (verdict, sizing, the
tests, the largest deviations; as markdown and as a plot)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .._plot import pyplot
from .checks import TestResult
from .family import Verdict

__all__ = ["AuditReport", "Deviation"]


@dataclass(frozen=True)
class Deviation:
    """One output with its observed and expected counts (expected: ``n * p``)."""

    output: Hashable
    observed: int
    expected: float


@dataclass(frozen=True)
class AuditReport:
    """Result of :func:`audit_sampler`.

    ``tests`` holds each test that ran, each at level ``alpha / m`` (its own ``alpha`` field);
    ``holm_rejected[i]`` is the Holm-corrected verdict of ``tests[i]`` at the family-wise
    ``alpha``. ``m`` counts the planned tests (skipped ones count as not rejected, which is
    conservative). ``detectable_tv`` is None when it cannot be computed (n too small); how it was
    obtained is ``detectable_by`` (the joint chi-square table, plus ``pooled_mass``, the mass of
    the cells pooled into one, which no pooled test sees inside; or the exact point-mass check).
    ``name`` names the sampler (title of the plot).
    """

    n: int
    alpha: float
    power: float
    eps: float | None
    m: int
    tests: tuple[TestResult, ...]
    holm_rejected: tuple[bool, ...]
    skipped: tuple[str, ...]
    k: int
    detectable_tv: float | None
    verdict: Verdict
    reason: str
    over: tuple[Deviation, ...]
    under: tuple[Deviation, ...]
    mode: Literal["exact", "two-sample"]
    rng_note: str = ""
    observed: Mapping[Any, int] = field(default_factory=dict, repr=False, compare=False)
    expected: Mapping[Any, float] = field(default_factory=dict, repr=False, compare=False)
    detectable_by: str = "joint chi-square"
    pooled_mass: float = 0.0
    name: str = "sampler"
    position_detectable: tuple[float | None, ...] = ()
    """Exact mode with ``positions``: for each position ``j``, the TV of the ``j``-th token's law (given
    that the output reaches ``j``) that its own test catches with probability ``power``, at the
    expected number of outputs reaching ``j`` (None: no power there)."""

    @property
    def per_test_alpha(self) -> float:
        """``alpha / m``: the level at which each test ran."""
        return self.alpha / self.m

    def to_markdown(self, title: str = "Sampler audit") -> str:
        """The report as a markdown section (verdict, sizing, test table, largest deviations)."""
        det = "n/a (n too small)" if self.detectable_tv is None else f"{self.detectable_tv:.4g}"
        lines = [
            f"## {title}", "",
            f"**Verdict: {self.verdict}** ({self.reason})", "",
            f"- mode: {self.mode}; n = {self.n} samples; support size k = {self.k}",
            f"- family-wise alpha = {self.alpha:.3g} (Holm over m = {self.m} tests, each at "
            f"{self.per_test_alpha:.3g}); power = {self.power}",
            f"- detectable TV ({self.detectable_by}, power {self.power}): {det}"
            + ("" if self.eps is None else f"; requested eps = {self.eps:.4g}"),
        ]
        if self.position_detectable:
            lines.append("- detectable TV of each position's own law (given the output reaches it): "
                         + ", ".join(f"position {j}: " + ("n/a" if d is None else f"{d:.4g}")
                                     for j, d in enumerate(self.position_detectable)))
        if self.pooled_mass > 0:
            lines.append(f"- pooled: {self.pooled_mass:.4g} of the probability lies in cells pooled into one "
                         "(expected count < 5); a discrepancy inside them is not seen, so the detectable TV "
                         "includes it")
        if self.rng_note:
            lines.append(f"- rng: {self.rng_note}")
        lines += ["", "| test | statistic | p-value | dof | n | Holm rejects |", "|---|---|---|---|---|---|"]
        for r, rej in zip(self.tests, self.holm_rejected):
            dof = "" if r.dof is None else str(r.dof)
            lines.append(f"| {r.name} | {r.statistic:.4g} | {r.p_value:.3g} | {dof} | {r.n} | "
                         f"{'**yes**' if rej else 'no'} |")
        if self.skipped:
            lines += ["", "Skipped tests:"] + [f"- {s}" for s in self.skipped]

        def table(title_: str, rows: Sequence[Deviation]) -> list[str]:
            out = ["", f"{title_} (observed vs expected count):", "",
                   "| output | observed | expected |", "|---|---|---|"]
            out += [f"| `{d.output!r}` | {d.observed} | {d.expected:.1f} |" for d in rows]
            if not rows:
                out.append("| (none) | | |")
            return out

        lines += table("Most over-represented outputs", self.over)
        lines += table("Most under-represented outputs", self.under)
        return "\n".join(lines) + "\n"

    def plot_data(self, max_bars: int = 40, band: float = 0.99) -> dict[str, Any]:
        """What :meth:`save_plot` draws: the ``max_bars`` outputs of largest expected count (then
        largest observed count), their observed and expected counts, the central ``band`` interval
        of each observed count under the reference (binomial; noise stays inside it, bias does
        not), and how many outputs (and what share of the samples) were cut from the plot."""
        from scipy import stats as sps  # type: ignore[import-untyped]

        everything = sorted(set(self.expected) | set(self.observed),
                            key=lambda x: (-self.expected.get(x, 0.0), -self.observed.get(x, 0), repr(x)))
        keys = everything[:max_bars]
        cut = everything[max_bars:]
        exp = [self.expected.get(x, 0.0) for x in keys]
        obs = [self.observed.get(x, 0) for x in keys]
        ps = [min(1.0, e / self.n) for e in exp]
        q = (1.0 - band) / 2.0
        lo = [float(sps.binom.ppf(q, self.n, p)) for p in ps]
        hi = [float(sps.binom.ppf(1.0 - q, self.n, p)) for p in ps]
        title = f"{self.name}: {self.verdict} (n={self.n})"
        if cut:
            cut_obs = sum(self.observed.get(x, 0) for x in cut)
            title += f"; {len(cut)} more outputs not shown ({cut_obs} samples, {cut_obs / self.n:.2%})"
        return {"keys": keys, "observed": obs, "expected": exp, "band_low": lo, "band_high": hi,
                "band": band, "n_cut": len(cut), "title": title}

    def save_plot(self, path: str, max_bars: int = 40, title: str | None = None, log: bool = False,
                  label: Callable[[Any], str] | None = None) -> bool:
        """Write a PNG of the observed counts against the expected ones to ``path``: the
        ``max_bars`` outputs of largest expected count as bars, the expected count of each as a
        marker with its 99% sampling band (:meth:`plot_data`), the sampler's name (``title``
        overrides it), the verdict and how many outputs were cut in the title; ``log=True`` for a
        log count scale. matplotlib is optional (not a dependency of hsd): without it, print a
        message to stderr and return False. ``label(output)`` gives each bar's tick label (default
        its ``repr``). The bands are per output (not simultaneous), as the legend says; the legend
        sits outside the axes, so it never covers a bar. Returns True if written.
        """
        plt = pyplot(path)
        if plt is None:
            return False
        d = self.plot_data(max_bars)
        if title is not None:
            d["title"] = title + d["title"][len(self.name):]
        xs = list(range(len(d["keys"])))
        ref = "reference" if self.mode == "two-sample" else "expected"
        fig, ax = plt.subplots(figsize=(max(6.0, 0.3 * len(xs)) + 3.0, 4.5))
        ax.bar(xs, d["observed"], width=0.6, color="tab:orange", label="observed")
        err_lo = [max(0.0, e - lo) for e, lo in zip(d["expected"], d["band_low"])]
        err_hi = [max(0.0, hi - e) for e, hi in zip(d["expected"], d["band_high"])]
        ax.errorbar(xs, d["expected"], yerr=[err_lo, err_hi], fmt="o", color="tab:blue", ms=3, capsize=2,
                    label=f"{ref} count, {d['band']:.0%} sampling band of each output (per output)")
        ax.set_xticks(xs)
        ax.set_xticklabels([(label or repr)(x) for x in d["keys"]], rotation=90, fontsize=6)
        ax.set_xlabel(f"output (the {len(xs)} of largest {ref} count)")
        ax.set_ylabel("count" + (" (log scale)" if log else ""))
        if log:
            ax.set_yscale("symlog", linthresh=1.0)
        ax.set_title(d["title"], fontsize=8)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return True
