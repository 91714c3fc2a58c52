"""``hsd audit --impl transformers|hsd_torch`` (issue 12, section 2) on tiny local checkpoints.

Sizes: 300 draws, top-k 3 (at most 9 outcomes for the first two tokens), family-wise alpha 1e-3:
detectable TV 0.21 at power 0.99 (printed by the command and asserted); the lossy run (the
sampler's temperature doubled behind the command's back, TV about 0.3) is found lossy and exits 1.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.cli import main  # noqa: E402

PROMPT = "def foo(x):\n"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hsd_torch import tiny

    root = tmp_path_factory.mktemp("ckpt")
    target, tt, _, dt = tiny.tiny_pair()
    target.save_pretrained(root / "t")
    tt.save_pretrained(root / "t")
    d = tiny.tiny_gpt2(dt, seed=1)
    d.save_pretrained(root / "d")
    dt.save_pretrained(root / "d")
    return root


def args(ckpt: Path, impl: str, *extra: str) -> list[str]:
    return ["audit", "--impl", impl, "--target", str(ckpt / "t"), "--drafter", str(ckpt / "d"), "--prompt", PROMPT,
            "--samples", "300", "--top-k", "3", *extra]


@pytest.mark.parametrize("impl", ["hsd_torch", "transformers"])
def test_impl_audit_passes_and_writes_the_report(ckpt: Path, impl: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "out" / "report.md"
    assert main(args(ckpt, impl, "--report", str(report))) == 0
    out = capsys.readouterr()
    assert "lossless-consistent" in out.out
    det = float(re.search(r"detectable TV ([0-9.]+)", out.out).group(1))  # type: ignore[union-attr]
    assert det <= 0.22
    assert "sampling" in out.err and "draw" in out.err  # the tqdm bar
    assert "Verdict: lossless-consistent" in report.read_text()


def test_greedy(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args(ckpt, "transformers", "--greedy", "--samples", "20")) == 0
    assert "exact point-mass check" in capsys.readouterr().out


def test_lossy_exits_non_zero(ckpt: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    g = sys.modules["hsd_torch.generate"]  # the module (hsd_torch.generate is also the function)
    real = g.generate

    def hot(*a: Any, **kw: Any) -> Any:
        kw["temperature"] = 2.0 * kw.get("temperature", 1.0)
        return real(*a, **kw)

    monkeypatch.setattr(g, "generate", hot)
    assert main(args(ckpt, "hsd_torch", "--method", "ar")) == 1
    assert "lossy" in capsys.readouterr().out


def test_missing_argument(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--impl", "hsd_torch", "--target", str(ckpt / "t")]) == 2
    assert "--drafter" in capsys.readouterr().err


@pytest.mark.parametrize("impl", ["hsd_torch", "transformers"])
def test_asks_for_one_token_more_than_it_audits(ckpt: Path, impl: str, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """transformers drafts nothing for the last new token: the samplers are asked for
    ``--positions + 1`` tokens so that the audited ones come out of rounds with room to draft."""
    import sys

    from transformers.generation.utils import GenerationMixin

    seen: list[int] = []
    if impl == "hsd_torch":
        g = sys.modules["hsd_torch.generate"]
        real = g.generate

        def spy(*a: Any, **kw: Any) -> Any:
            seen.append(kw["max_new_tokens"])
            return real(*a, **kw)

        monkeypatch.setattr(g, "generate", spy)
    else:
        real_hf = GenerationMixin.generate

        def spy_hf(self: Any, *a: Any, **kw: Any) -> Any:
            if "assistant_model" in kw:  # the audited call (not the assistant's own drafting calls)
                seen.append(kw["max_new_tokens"])
            return real_hf(self, *a, **kw)

        monkeypatch.setattr(GenerationMixin, "generate", spy_hf)
    assert main(args(ckpt, impl, "--samples", "20", "--positions", "1")) in (0, 1)
    capsys.readouterr()
    assert seen and set(seen) == {2}
