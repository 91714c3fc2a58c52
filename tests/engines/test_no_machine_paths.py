"""No absolute path of one machine anywhere in the repository (issue 48, item 9): vLLM's venv defaults
to a user cache folder (bench/engines/setup_vllm.sh), and no file, script, doc or recorded log names
a folder of one machine (a shared work folder, a home directory). Reads the files git tracks (skipped outside a
git checkout)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MACHINE = re.compile(rb"(?<![\w.~<$-])/(?:work|home/[a-z_][\w-]*|Users/\w+|root)/")


def _tracked() -> list[Path]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    p = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True)
    if p.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / n for n in p.stdout.decode().split("\0") if n]


def test_no_absolute_machine_path_in_the_repository() -> None:
    found = []
    for f in _tracked():
        try:
            data = f.read_bytes()
        except OSError:
            continue
        for m in MACHINE.finditer(data):
            line = data.count(b"\n", 0, m.start()) + 1
            found.append(f"{f.relative_to(ROOT)}:{line}: {m.group().decode(errors='replace')}")
    assert not found, "absolute machine paths: " + "; ".join(found[:20])


def test_the_vllm_venv_defaults_to_a_user_cache() -> None:
    text = (ROOT / "bench/engines/setup_vllm.sh").read_text(encoding="utf-8")
    assert 'VENV="${1:-${HSD_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hsd/vllm-venv}}"' in text
