"""matplotlib, optional: the one place that imports it for the audits' plots."""

from __future__ import annotations

import importlib
import sys
from typing import Any


def pyplot(path: str) -> Any | None:
    """``matplotlib.pyplot`` on the Agg backend, or None (with a message to stderr naming ``path``,
    the plot skipped) when matplotlib is not installed: it is not a dependency of hsd."""
    try:
        mpl: Any = importlib.import_module("matplotlib")
        mpl.use("Agg")
        return importlib.import_module("matplotlib.pyplot")
    except ImportError:
        print(f"save_plot: matplotlib is not installed; skipped the plot {path!r} "
              "(pip install matplotlib to get it)", file=sys.stderr)
        return None
