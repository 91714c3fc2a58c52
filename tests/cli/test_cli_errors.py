"""``hsd audit --report`` is validated before any sampling; Ctrl-C exits
cleanly."""

from __future__ import annotations

import pathlib

import pytest

from hsd_core import cli, sampled_audit


def _no_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any audit run fail the test: validation must happen first."""
    def boom(*args: object, **kwargs: object) -> int:
        raise AssertionError("the audit ran before the report path was validated")
    monkeypatch.setattr(cli, "run_audit", boom)
    monkeypatch.setattr(sampled_audit, "sampled_audit_all", boom)


def test_empty_report_path_is_refused(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    _no_audit(monkeypatch)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        cli.main(["audit", "--sampled", "10", "--report", ""])
    assert e.value.code == 2
    assert "--report needs a file path" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["under_a_file", "folder"])
def test_bad_report_path_fails_before_sampling(kind: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    _no_audit(monkeypatch)
    (tmp_path / "file.txt").write_text("x")
    bad = tmp_path / "file.txt" / "report.md" if kind == "under_a_file" else tmp_path
    with pytest.raises(SystemExit) as e:
        cli.main(["audit", "--sampled", "10", "--report", str(bad)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--report" in err and "Traceback" not in err


def test_good_report_path_leaves_nothing_behind(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "new" / "r.md"
    assert cli.check_report_path(str(path)) is None
    assert not path.exists() and path.parent.is_dir()


def test_ctrl_c_exits_cleanly(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted() -> int:
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "run_audit", interrupted)
    assert cli.main(["audit"]) == 130
    assert capsys.readouterr().err.strip() == "hsd: interrupted"
