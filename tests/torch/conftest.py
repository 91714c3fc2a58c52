"""Fixtures shared by the hsd_torch suites: the tiny tokenizers of three kinds and float64 tiny
models over them (random init, peaked heads; two with padded embeddings). Module-scoped, as each
suite had them; imports are inside the fixtures, so collecting this folder needs no torch."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def toks() -> dict[str, Any]:
    from hsd_torch.models import tiny

    return {k: tiny.tiny_tokenizer(k) for k in ("byte_bpe", "unigram", "bpe_fallback")}


@pytest.fixture(scope="module")
def models(toks: dict[str, Any]) -> dict[str, Any]:
    from _torch_checks import tiny_world_models

    return tiny_world_models(toks)


@pytest.fixture(scope="module")
def llama_uni(toks: dict[str, Any], models: dict[str, Any]) -> dict[str, Any]:
    """The tiny Llama target (byte-level BPE) and GPT-2 drafter (Unigram, padded embedding) as a dict:
    ``target``, ``tt`` (its tokenizer), ``drafter``, ``dt``."""
    return {"target": models["llama_bpe"], "tt": toks["byte_bpe"], "drafter": models["gpt2_uni_pad"],
            "dt": toks["unigram"]}


@pytest.fixture(scope="session")
def bench_module() -> Callable[[str], ModuleType]:
    """Loads ``bench/<name>.py`` as a module (with ``bench/`` importable while it loads, for the
    scripts that import each other)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import suite_helpers

    def load(name: str) -> ModuleType:
        return suite_helpers.bench_script(f"{name}.py")
    return load
