"""Import boundaries: the core never pulls in torch; the backend exposes its contract names."""

import subprocess
import sys

import pytest


def test_import_hsd_core_does_not_import_torch() -> None:
    code = "import hsd_core, hsd_core.cli, sys; assert 'torch' not in sys.modules, 'hsd_core imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_hsd_torch_exposes_its_contract_names() -> None:
    pytest.importorskip("torch")
    import hsd_torch
    from hsd_torch.kernels import Verified, exact_match_verify, rejection_verify, sample
    from hsd_torch.vocab import VocabBridge

    assert hsd_torch.sample is sample and hsd_torch.rejection_verify is rejection_verify
    assert hsd_torch.exact_match_verify is exact_match_verify and hsd_torch.VocabBridge is VocabBridge
    assert hsd_torch.Verified is Verified
