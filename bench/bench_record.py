"""Where a benchmark's numbers come from, for its JSON record: the commit, the date, the machine.

Every bench script that writes a JSON result writes it through :func:`save` (or puts
:func:`provenance` in it itself), so each record says which code produced it, when, and on what.
``tests/bench/test_bench_index.py`` checks that every JSON result under bench/ carries the three
fields and that every script writing JSON calls this module.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

FIELDS = ("commit", "date", "machine")


def _cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo; elsewhere what ``platform`` knows), or its architecture."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """One line naming the machine: the platform, the CPU model, the core count, torch's version (when
    torch is installed) and, when the running script has imported torch and CUDA is available, the GPU."""
    parts = [platform.platform(), _cpu_model(), f"{os.cpu_count()} cores", f"Python {platform.python_version()}"]
    try:
        parts.append(f"torch {importlib.metadata.version('torch')}")
    except importlib.metadata.PackageNotFoundError:
        pass
    torch = sys.modules.get("torch")  # never imported here: a script without torch stays without it
    if torch is not None and torch.cuda.is_available():
        parts.append(f"GPU {torch.cuda.get_device_name(0)}")
    return ", ".join(parts)


def provenance() -> dict[str, Any]:
    """``{"commit", "dirty", "date", "machine"}``: this checkout's full commit (``git rev-parse HEAD``),
    whether its tracked files differ from that commit (the numbers then come from uncommitted code),
    the UTC time (ISO 8601, seconds), and :func:`machine`."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD") or "unknown: not a git checkout",
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine()}


def save(record: Any, path: str | os.PathLike[str] | None) -> None:
    """Write ``record`` as indented JSON to ``path`` (nothing when ``path`` is None). A dict record
    without a ``"commit"`` gets :func:`provenance`'s fields added (a record that has them keeps its own:
    a rewrite of an older run, such as ``bench/zoo.py --first-token-tv``, stamps its addition apart)."""
    if path:
        if isinstance(record, dict) and "commit" not in record:
            record = {**record, **provenance()}
        with open(path, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
