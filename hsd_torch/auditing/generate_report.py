"""The report of the first-token audit (:func:`hsd_torch.auditing.first_tokens.audit_generate`):
:class:`GenerateAuditReport`, its cells decoded by the target tokenizer, the deviations beyond chance,
and the TV on the coarse table (plug-in, bootstrap interval, bias-corrected, a lossless sampler's
95th percentile)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hsd_core.audit import AuditReport, Deviation, Verdict

from .cells import ANY, RARE

__all__ = ["DecodedDeviation", "GenerateAuditReport"]


@dataclass(frozen=True)
class DecodedDeviation:
    """A cell with its tokens decoded (``*``: any continuation, ``<rare>``: a pooled rare token)."""

    output: tuple[int, ...]
    text: str
    observed: int
    expected: float


@dataclass(frozen=True)
class GenerateAuditReport:
    """Result of :func:`audit_generate`: ``verdict`` as :mod:`hsd_core.audit`; ``core`` the
    underlying :class:`~hsd_core.audit.AuditReport` on the coarse table; ``detectable_tv`` includes
    the mass hidden in the coarse cells (``coarse_mass``) and in ``core``'s pooled cell."""

    verdict: Verdict
    reason: str
    n: int
    alpha: float
    seed: int
    positions: int
    do_sample: bool
    processing: str
    detectable_tv: float | None
    tv_estimate: float
    tv_ci: tuple[float, float]
    tv_null_q95: float
    cells: int
    coarse_mass: float
    forward_passes: int
    conditional_prefixes: tuple[tuple[int, ...], ...]
    over: tuple[DecodedDeviation, ...]
    under: tuple[DecodedDeviation, ...]
    core: AuditReport = field(repr=False)
    prompt: str = ""
    name: str = "sampler"
    tv_corrected: float = float("nan")
    """The bias-corrected TV estimate (inside ``tv_ci`` by construction; ``tv_estimate`` is the
    plug-in, biased upward, which ``tv_null_q95`` is the null quantile of)."""
    position_detectable: tuple[float | None, ...] = ()
    """For each position ``j``, the TV of the ``j``-th token's law that its own test catches with
    probability ``power``: ``core.position_detectable[j]`` plus the mass the coarse cells hide at
    ``j`` (rare tokens and unexpanded prefixes, given that the output reaches ``j``; None: no power)."""
    provider_calls: int | None = None
    """With a law provider as the reference: the calls this audit made of it (one per expanded prefix,
    and the processing fit's of a lossy verdict); None: the target's forward passes were the reference."""

    def to_markdown(self, title: str | None = None) -> str:
        """The report as markdown: the verdict, the sizing, the TV estimate, the decoded largest
        deviations, then ``core``'s test table."""
        det = "n/a (no power)" if self.detectable_tv is None else f"{self.detectable_tv:.4g}"
        lines = [f"# {title or 'Audit of ' + self.name}", "",
                 f"**Verdict: {self.verdict}** ({self.reason})", "",
                 f"- prompt {self.prompt!r}; first {self.positions} new tokens; "
                 f"{'sampling' if self.do_sample else 'greedy'}; processing: {self.processing}",
                 f"- n = {self.n} draws, seed {self.seed}; family-wise alpha {self.alpha:.3g} (Holm over "
                 f"{self.core.m} tests)",
                 f"- detectable TV (power {self.core.power}): {det} (includes {self.coarse_mass:.4g} of mass in "
                 f"pooled rare / unexpanded cells and {self.core.pooled_mass:.4g} pooled by the tests)",
                 f"- estimated TV on the {self.cells}-cell table: {self.tv_corrected:.4g} (bias-corrected; 95% basic "
                 f"bootstrap interval {self.tv_ci[0]:.4g} to {self.tv_ci[1]:.4g}); plug-in TV {self.tv_estimate:.4g}, "
                 f"which a lossless sampler shows up to {self.tv_null_q95:.4g} (95th percentile)",
                 "- detectable TV of each position's own law (its rare / unexpanded cells' mass included): "
                 + ", ".join(f"position {j}: " + ("n/a" if d is None else f"{d:.4g}")
                             for j, d in enumerate(self.position_detectable)),
                 (f"- reference: {self.provider_calls} calls of the law provider (one per expanded prefix"
                  f"{', the fit included' if self.provider_calls > self.forward_passes else ''})"
                  if self.provider_calls is not None else f"- reference: {self.forward_passes} target forward passes")
                 + (f"; next-token tests after {len(self.conditional_prefixes)} frequent prefixes"
                    if self.conditional_prefixes else "")]

        def table(name: str, rows: Sequence[DecodedDeviation]) -> list[str]:
            out = ["", f"{name} (observed vs expected count; only cells beyond chance: binomial p < 1% / "
                   f"{self.cells} cells):", "", "| cell (ids) | text | observed | expected |", "|---|---|---|---|"]
            out += [f"| `{d.output}` | `{d.text}` | {d.observed} | {d.expected:.1f} |" for d in rows]
            return out + (["| (none) | | | |"] if not rows else [])

        lines += table("Most over-represented", self.over)
        lines += table("Most under-represented", self.under)
        lines += ["", self.core.to_markdown(title="Tests (hsd_core.audit)").replace("## ", "## ", 1)]
        return "\n".join(lines) + "\n"

    def save_plot(self, path: str, max_bars: int = 40, log: bool = False, tokenizer: Any = None) -> bool:
        """The PNG of :meth:`hsd_core.audit.AuditReport.save_plot`; each cell labelled by its ids and,
        with ``tokenizer`` (the target's), its decoded text (``<any>``: any continuation, ``<rare>``:
        the pooled rare tokens)."""
        def label(cell: Any) -> str:
            ids = ",".join("*" if t == ANY else "rare" if t == RARE else str(t) for t in cell)
            return f"{_decode(tokenizer, tuple(cell))} [{ids}]" if tokenizer is not None else f"[{ids}]"
        return self.core.save_plot(path, max_bars=max_bars, log=log, label=label)


def _decode(tokenizer: Any, cell: tuple[int, ...]) -> str:
    """A cell's tokens as text: each id's decoded text (repr) with its token form where that text
    is ambiguous (a byte token decodes to U+FFFD alone, a token may decode to ``*``), ``<any>``
    for "any continuation" and ``<rare>`` for the pooled rare tokens (the cell's ids are printed
    beside it)."""
    parts = []
    for t in cell:
        if t == ANY:
            parts.append("<any>")
        elif t == RARE:
            parts.append("<rare>")
        else:
            try:
                text = tokenizer.decode([t])
            except Exception:  # an id outside the tokenizer (padded embedding)
                parts.append(f"<id {t}>")
                continue
            shown = repr(text)[1:-1]
            if "\ufffd" in text or text.strip() in ("", "*", "<any>", "<rare>"):
                try:
                    shown += f" (token {tokenizer.convert_ids_to_tokens(t)!r})"
                except Exception:
                    pass
            parts.append(shown)
    return " | ".join(parts)


def _significant(rows: Sequence[Deviation], n: int, cells: int) -> tuple[Deviation, ...]:
    """The rows whose count departs from its expectation beyond chance: a two-sided binomial
    p-value below 0.01 / ``cells`` (Bonferroni over the table at 1%)."""
    from scipy import stats as sps  # type: ignore[import-untyped]

    out = []
    for d in rows:
        p = min(1.0, d.expected / n) if n else 0.0
        pv = 0.0 if p <= 0 else float(sps.binomtest(d.observed, n, p).pvalue)
        if pv < 0.01 / max(1, cells):
            out.append(d)
    return tuple(out)


def _tv_stats(law: Mapping[tuple[int, ...], float], observed: Mapping[Any, int], n: int,
              seed: int) -> tuple[float, tuple[float, float], float, float]:
    """The plug-in TV, its 95% basic bootstrap interval, a lossless sampler's 95th percentile of the
    plug-in TV, and the bias-corrected estimate ``2 * plug-in - median(bootstrap)`` (clipped to
    [0, 1]), which lies inside the interval by construction (the plug-in may not: it is biased up)."""
    keys = list(dict.fromkeys(list(law) + list(observed)))
    p = np.array([law.get(k, 0.0) for k in keys])
    p = p / p.sum()
    c = np.array([observed.get(k, 0) for k in keys], dtype=np.float64)
    phat = c / max(1, c.sum())
    est = 0.5 * float(np.abs(phat - p).sum())
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2**31,)))
    boot = rng.multinomial(n, phat, size=200) / n
    tvb = 0.5 * np.abs(boot - p).sum(axis=1)
    null = 0.5 * np.abs(rng.multinomial(n, p, size=200) / n - p).sum(axis=1)
    # basic (reflected) bootstrap interval: the plug-in TV is biased upward, and so is its bootstrap
    lo = min(1.0, max(0.0, 2 * est - float(np.quantile(tvb, 0.975))))
    hi = min(1.0, max(0.0, 2 * est - float(np.quantile(tvb, 0.025))))
    corrected = min(hi, max(lo, 2 * est - float(np.median(tvb))))
    return est, (lo, hi), float(np.quantile(null, 0.95)), corrected
