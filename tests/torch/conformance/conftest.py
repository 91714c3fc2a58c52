"""The conformance tests' kit: built once per test module (without GGUF exports) into a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hsd_torch.conformance.kit import build_kit

    out = tmp_path_factory.mktemp("kit")
    build_kit(out, gguf=False)
    return out
