"""The conformance matrix's report (``hsd conformance run``; docs/conformance.md, "The report"): one
:class:`Row` per cell, :func:`exit_status` for CI, and :func:`write_report`: ``OUT/report.json``
(every row with its tests), ``OUT/report.md`` (one line a cell) and ``OUT/report.png`` (a grid of
verdicts and acceptance ratios; skipped without matplotlib).

Exit status: 0 every audited case conforms; 1 a case is lossy; 3 a case is a performance defect
(none lossy); 4 a crash or an inconclusive case (none lossy or defective); 2 is the command's usage
error.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["COLOURS", "Row", "acceptance_text", "exit_status", "write_report"]


@dataclass
class Row:
    """One cell of the matrix's report."""

    engine: str
    mode: str
    case: str
    prompt_ids: tuple[int, ...]
    outcome: str
    reason: str
    n: int = 0
    seconds: float = 0.0
    samples: str | None = None
    tests: list[dict[str, Any]] = field(default_factory=list)
    acceptance: dict[str, Any] | None = None
    times: dict[str, float] = field(default_factory=dict)
    """Wall seconds of the cell's parts: ``law`` (the kit's exact law of the case), ``draws`` (the
    engine, its samples file included: :attr:`seconds`), ``audit`` (the tests of the draws) and
    ``expected_acceptance`` (the exact expectation and the acceptance test), each where it ran."""

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["prompt_ids"] = list(self.prompt_ids)
        return d


def exit_status(rows: Sequence[Row]) -> int:
    """0, 1, 3 or 4 (module docstring)."""
    got = {r.outcome for r in rows}
    if "lossy" in got:
        return 1
    if "performance defect" in got:
        return 3
    if got & {"crashed", "inconclusive"}:
        return 4
    return 0


def acceptance_text(r: Row) -> str:
    """``measured [low, high] / expected`` tokens per target call of ``r`` ("" without a measure)."""
    a = r.acceptance
    if not a:
        return ""
    return f"{a['measured']:.3f} [{a['low']:.3f}, {a['high']:.3f}] / {a['expected']:.3f}"


def _tv_text(r: Row) -> str:
    tv = {t.get("name"): t.get("detectable_tv") for t in r.tests}
    parts = [f"{k.split(' (')[0]} {v:.3g}" for k, v in tv.items()
             if v is not None and k in ("whole draws", "length", "position 0 (first token)")]
    return ", ".join(parts)


def write_report(rows: Sequence[Row], out: Path, meta: dict[str, Any]) -> dict[str, Path]:
    """``out/report.json`` (every row with its tests), ``out/report.md`` (one line a cell) and
    ``out/report.png`` (the grid; skipped without matplotlib): the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "md": out / "report.md"}
    status = exit_status(rows)
    doc = {"format": "hsd-conformance-report/1", **meta, "exit_status": status, "rows": [r.to_json() for r in rows]}
    paths["json"].write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    lines = ["# Conformance run", "", f"kit `{meta.get('kit')}`, {meta.get('n')} draws a cell, family-wise alpha "
             f"{meta.get('alpha')} a cell (Holm); exit status {status}.", "",
             "Outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), "",
             "| engine | mode | case | prompt | outcome | draws | s | tokens/call measured [interval] / expected | "
             "detectable TV (power 0.99) | reason |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        reason = r.reason.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.engine} | {r.mode} | {r.case} | {list(r.prompt_ids)} | **{r.outcome}** | {r.n} | "
                     f"{r.seconds:.1f} | {acceptance_text(r)} | {_tv_text(r)} | {reason} |")
    paths["md"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    png = _plot(rows, out / "report.png")
    if png is not None:
        paths["png"] = png
    return paths


COLOURS = {"conforms": "#4caf50", "lossy": "#e53935", "performance defect": "#fb8c00", "inconclusive": "#fdd835",
           "not determinable": "#9e9e9e", "refused": "#e0e0e0", "crashed": "#8e24aa"}


def _plot(rows: Sequence[Row], path: Path) -> Path | None:
    from hsd_core._plot import pyplot

    plt = pyplot(str(path))
    if plt is None or not rows:
        return None
    ys = list(dict.fromkeys((r.engine, r.mode) for r in rows))
    xs = list(dict.fromkeys(f"{r.case}/{list(r.prompt_ids)[1:]}" for r in rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(xs) + 3), max(2.5, 0.45 * len(ys) + 1.5)))
    for r in rows:
        x, y = xs.index(f"{r.case}/{list(r.prompt_ids)[1:]}"), ys.index((r.engine, r.mode))
        ax.add_patch(plt.Rectangle((x, y), 1, 1, color=COLOURS.get(r.outcome, "white"), ec="white"))
        if r.acceptance:
            ax.text(x + .5, y + .5, f"{r.acceptance['measured'] / r.acceptance['expected']:.2f}", ha="center",
                    va="center", fontsize=7)
    ax.set_xlim(0, len(xs))
    ax.set_ylim(0, len(ys))
    ax.set_xticks([i + .5 for i in range(len(xs))], xs, rotation=60, ha="right", fontsize=7)
    ax.set_yticks([i + .5 for i in range(len(ys))], [f"{e} {m}" for e, m in ys], fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    ax.legend(handles, list(COLOURS), fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title("conformance: outcome per cell (number: measured / expected tokens per target call)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
