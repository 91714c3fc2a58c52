"""bench/generate.py's charts: a colour legend on each, the method names of the speed-up-vs-bound
chart never overlapping (they once piled up on clustered points), and transformers' lossy sampled
UAG marked LOSSY wherever it is drawn (it was the fastest unmarked bar)."""

from __future__ import annotations

import importlib.util
import sys
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def gen() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("generate_bench_plots", BENCH / "generate.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def _methods() -> dict[str, dict[str, float]]:
    """Twelve methods whose points nearly coincide (the case that overlapped), the lossy one fastest."""
    m = {}
    for i, k in enumerate(["hsd:sd", "hsd:tli", "hsd:slem", "hsd:slrs", "hf:sd", "hf:uag"]):
        for j, mode in enumerate(["greedy", "sample"]):
            m[f"{k}-{mode}@b1"] = {"bound_median": 1.5 + 0.001 * i, "speedup_median": 1.4 + 0.001 * j,
                                   "tokens_per_s": 50.0 + i}
    m["hf:uag-sample@b1"].update(tokens_per_s=99.0, bound_median=2.0, speedup_median=1.9)
    return m


def test_bound_chart_names_do_not_overlap_and_it_has_a_legend(gen: Any) -> None:
    import matplotlib.pyplot as plt

    fig = gen.bound_figure(plt, _methods())
    try:
        fig.canvas.draw()
        ax = fig.axes[0]
        from matplotlib.text import Text

        boxes = [Text.get_window_extent(t) for t in ax.texts]  # the names alone, not their leader lines
        assert len(boxes) == 12
        assert not [(a, b) for a, b in combinations(boxes, 2) if a.overlaps(b)]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any("hsd_torch" in t for t in legend) and any("LOSSY" in t for t in legend)
        assert any(t.get_text() == "hf:uag-sample (LOSSY)" for t in ax.texts)
    finally:
        plt.close(fig)


def test_tokens_chart_marks_the_lossy_sampler(gen: Any) -> None:
    import matplotlib.pyplot as plt

    fig = gen.tokens_per_s_figure(plt, _methods(), ["greedy", "sample"])
    try:
        ax = fig.axes[1]
        labels = [t.get_text() for t in ax.get_yticklabels()]
        lossy = [i for i, t in enumerate(labels) if "LOSSY" in t]
        assert [labels[i] for i in lossy] == ["hf:uag (LOSSY)"]
        assert ax.patches[lossy[0]].get_hatch() == "//"
        assert any("LOSSY" in t.get_text() for t in ax.get_legend().get_texts())
        assert not any("LOSSY" in t.get_text() for t in fig.axes[0].get_yticklabels())  # greedy UAG is lossless
    finally:
        plt.close(fig)
