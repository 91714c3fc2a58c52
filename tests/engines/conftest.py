"""Fixtures of the vLLM tests (markers ``slow`` and ``engines``): vLLM's Python
(``HSD_VLLM_PYTHON``, built by bench/engines/setup_vllm.sh) and SmolLM2-135M-Instruct
(hsd_torch.models.real). Each skips with the reason when missing; ``HSD_REQUIRE_VLLM=1`` turns the
skip into a failure (a machine that must run these)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from hsd_torch.engines import vllm_audit as va

SMOL = "smollm2-135m-instruct"


def _missing(reason: str) -> None:
    if os.environ.get("HSD_REQUIRE_VLLM") == "1":
        pytest.fail(f"HSD_REQUIRE_VLLM=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def vllm_python() -> str:
    try:
        return va.find_python(None)
    except va.VllmUnavailable as e:
        _missing(f"vLLM's venv is not available: {e}")
        raise


@pytest.fixture(scope="module")
def smol() -> tuple[Any, Any]:
    import torch

    from hsd_torch.models import real as real_models

    torch.set_num_threads(1)
    if SMOL not in real_models.available():
        _missing(f"{SMOL} is not installed: {real_models.install_command(SMOL)}")
    return real_models.load(SMOL)
