"""``hsd audit --sampled N --report PATH`` audits every method and variant by sampling."""

from __future__ import annotations

import pathlib

from hsd_core import variants
from hsd_core.cli import default_methods, label, main


def test_sampled_audit_writes_report(tmp_path: pathlib.Path, capsys: object) -> None:
    report = tmp_path / "new_dir" / "report.md"  # the folder is created
    assert main(["audit", "--sampled", "300", "--report", str(report)]) == 0
    captured = capsys.readouterr()  # type: ignore[attr-defined]
    assert report.exists()
    text = report.read_text(encoding="utf-8")
    names = [label(m) for m in default_methods()] + ["variant:" + n for n in [*variants.VARIANTS,
                                                                             *variants.TREE_VARIANTS]]
    for name in names:
        assert f"| {name} |" in text, name
        assert f"## {name}\n" in text, name
        assert name in captured.out
    total = len(names)
    assert f"[1/{total}]" in captured.err and f"[{total}/{total}]" in captured.err
    assert "detectable TV" in captured.out
    pngs = sorted(p.name for p in report.parent.glob("report_*.png"))  # matplotlib is in the dev extra
    assert len(pngs) == total and all(f"]({p})" in text for p in pngs)


def test_plain_audit_has_no_sampled_section(capsys: object) -> None:
    assert main(["audit"]) == 0
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert "Sampled audit" not in out
