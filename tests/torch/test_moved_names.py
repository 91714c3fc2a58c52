"""The flat module names of hsd_torch's earlier layout (``hsd_torch.audit``, ``hsd_torch.tiny``, ...)
still import, and each is the very module object of its new name (:mod:`hsd_torch._moved`): so code
written against them, monkeypatches through them and ``python -m hsd_torch.tiny`` keep working."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import hsd_torch  # noqa: E402
from hsd_torch import _moved  # noqa: E402

PKG = Path(hsd_torch.__file__).resolve().parent


def test_every_old_name_is_the_new_module() -> None:
    for old, new in _moved.MOVED.items():
        assert not (PKG / f"{old}.py").exists(), f"hsd_torch/{old}.py is back: drop it from MOVED or the file"
        a = importlib.import_module(f"hsd_torch.{old}")
        b = importlib.import_module(f"hsd_torch.{new}")
        assert a is b, old
        assert a.__name__ == f"hsd_torch.{new}" and a.__spec__ is not None and a.__spec__.name == a.__name__, old
        if old != "generate":
            assert getattr(hsd_torch, old) is b, old


def test_from_imports_and_attributes_through_old_names() -> None:
    from hsd_torch.audit import audit_generate, audit_sequences
    from hsd_torch.auditing.first_tokens import audit_generate as new_generate_audit
    from hsd_torch.auditing.sequences import audit_sequences as new_sequence_audit
    from hsd_torch.seqaudit import audit_sequences as old_sequence_audit
    from hsd_torch.text import TokenText
    from hsd_torch.tiny import tiny_tokenizer
    from hsd_torch.vocab import VocabBridge, _Push, tokenizer_state
    from hsd_torch.vocab.bridge import VocabBridge as new_bridge
    from hsd_torch.vocab.text import TokenText as new_text

    assert audit_generate is new_generate_audit and audit_sequences is old_sequence_audit is new_sequence_audit
    assert TokenText is new_text and VocabBridge is new_bridge and callable(tiny_tokenizer)
    assert _Push.__module__ == "hsd_torch.vocab.bridge" and callable(tokenizer_state)


def test_generate_stays_the_function() -> None:
    """``hsd_torch.generate`` is the function, even after its old module name is imported."""
    import hsd_torch.generate  # noqa: F401
    from hsd_torch.engine.entry import generate

    assert hsd_torch.generate is generate and callable(hsd_torch.generate)
    assert sys.modules["hsd_torch.generate"] is importlib.import_module("hsd_torch.engine.entry")
    mod = importlib.import_module("hsd_torch.generate")
    assert mod.generate is generate and mod.process_logits is not None


def test_a_patch_through_the_old_name_is_seen_through_the_new(monkeypatch: pytest.MonkeyPatch) -> None:
    sentinel = object()
    monkeypatch.setattr("hsd_torch.kernels.sample", sentinel)
    from hsd_torch.engine import kernels

    assert kernels.sample is sentinel


def test_an_old_name_imported_first_is_still_the_new_module() -> None:
    """In a fresh interpreter, the old name imported before the new one: one module, under the new name."""
    import subprocess

    code = ("import sys, hsd_torch.seqaudit as a, hsd_torch.auditing.sequences as b; "
            "assert a is b and a.__spec__.name == 'hsd_torch.auditing.sequences', a.__spec__; "
            "assert sys.modules['hsd_torch.seqaudit'] is b; print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=PKG.parent)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


@pytest.mark.parametrize("old", ["hsd_torch.tiny", "hsd_torch.models.tiny"])
def test_python_m_runs_the_module_by_its_old_name_too(old: str) -> None:
    """``python -m hsd_torch.tiny --help`` in a fresh interpreter, as a user runs it: the old name runs
    the new code. (A subprocess, not runpy inside pytest: pytest's assertion rewriter claims the package's
    modules when an ``hsd.egg-info`` lies in the working directory, as after ``pip install -e .``.)"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", old, "--help"], capture_output=True, text=True, env=env,
                          cwd=PKG.parent, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--out DIR" in done.stdout


def test_an_unknown_old_name_still_fails() -> None:
    missing = "no_such_module"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"hsd_torch.{missing}")  # spelled so that the cited-names check does not read it
    with pytest.raises(AttributeError):
        getattr(hsd_torch, missing)
    assert _moved.new_name("hsd_torch.seqaudit") == "hsd_torch.auditing.sequences"
    assert _moved.new_name("hsd_torch.seqaudit.audit_sequences") is None
    assert _moved.new_name("hsd_torch.methods") is None
