"""Where a benchmark's numbers come from, for its JSON record: the commit, the date, the machine."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def provenance() -> dict[str, Any]:
    """``{"commit", "date", "machine"}``: this checkout's short commit (with ``+`` when the working tree
    differs from it), the UTC time, and the machine's architecture and core count."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True).stdout.strip()

    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {"commit": git("rev-parse", "--short", "HEAD") + ("+" if dirty else ""),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores"}


def save(record: Any, path: str | None) -> None:
    """Write ``record`` as indented JSON to ``path`` (nothing when ``path`` is None)."""
    if path:
        with open(path, "w") as f:
            json.dump(record, f, indent=1)
