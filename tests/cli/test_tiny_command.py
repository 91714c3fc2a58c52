"""``python -m hsd_torch.models.tiny --out DIR`` refuses a folder it cannot write with one ``error:``
line and exit status 2, before any model is built: no traceback."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_torch.models import tiny  # noqa: E402


def never_built(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a model was built for an --out that cannot be written")


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``main(argv)`` in this process; assert exit status 2 and one ``error:`` line; return it."""
    assert tiny.main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m hsd_torch.models.tiny: error: "), err
    assert "--out" in lines[0], err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("where", ["out", "target", "drafter", "parent"])
def test_a_file_in_the_way_is_refused(where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiny, "save_tiny_pair", never_built)
    out = tmp_path / "pair"
    if where == "out":
        out.write_text("x")
    elif where == "parent":  # a folder below a file: cannot be created
        (tmp_path / "f").write_text("x")
        out = tmp_path / "f" / "pair"
    else:
        out.mkdir()
        (out / where).write_text("x")
    line = refused(["--out", str(out)], capsys)
    assert repr(str(out)) in line
    assert ("is a file" in line) if where != "parent" else ("cannot be written" in line), line


def test_an_unwritable_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # permissions cannot be relied on (a test may run as root): the probe write is made to fail
    monkeypatch.setattr(tiny, "save_tiny_pair", never_built)

    def denied(self: Path, data: bytes) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "write_bytes", denied)
    line = refused(["--out", str(tmp_path / "pair")], capsys)
    assert "cannot be written (Permission denied)" in line, line


def test_a_failed_save_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tiny, "save_tiny_pair", full)
    line = refused(["--out", str(tmp_path / "pair")], capsys)
    assert "failed (No space left on device)" in line, line


@pytest.mark.parametrize("seed", ["-1", "x"])
def test_a_bad_seed_is_refused_by_argparse(seed: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        tiny.main(["--out", str(tmp_path), "--seed", seed])
    assert e.value.code == 2
    assert "argument --seed: needs an int >= 0" in capsys.readouterr().err


def test_the_module_refuses_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    res = subprocess.run([sys.executable, "-m", "hsd_torch.models.tiny", "--out", str(tmp_path / "f")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip() == f"python -m hsd_torch.models.tiny: error: --out {str(tmp_path / 'f')!r}: " \
                                 f"{str(tmp_path / 'f')!r} is a file; give a folder (created if missing)"
