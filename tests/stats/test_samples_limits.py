"""A samples file that would exhaust memory is refused in bounded memory (issue 48, item 8): a line
longer than ``MAX_LINE_BYTES`` (checked without reading it whole: peak memory measured with
tracemalloc), more than ``MAX_DRAWS`` draws, JSON nested too deeply; and the writing side:
:class:`SamplesAppender` leaves a valid file after every draw, :func:`recover_samples` cuts a torn
last line, :func:`write_samples` is atomic. The limits are patched down so that the files stay small
(the code paths are the ones a 1 GB line or 10^7 draws take)."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest

from hsd_core import samples as sm
from hsd_core import samples_format
from hsd_core.samples import Draw, Sampling, SamplesAppender, SamplesFormatError, read_samples, recover_samples

ENGINE = {"name": "e", "version": "1"}
SAMPLING = Sampling(True, 1.0, None, None, 4)


def _line(seed: int) -> str:
    return sm.format_draw(Draw(ids=(1, 2), seed=seed, prompt="p"), engine=ENGINE, sampling=SAMPLING,
                          speculative=None)


def test_a_huge_line_is_refused_without_reading_it_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sm, "MAX_LINE_BYTES", 1 << 20)
    p = tmp_path / "huge.jsonl"
    with open(p, "w", encoding="utf-8") as f:
        f.write(_line(1) + "\n")
        f.write('{"ids": [' + "1, " * (8 << 20) + "1]}\n")  # a 24 MiB line
    tracemalloc.start()
    try:
        with pytest.raises(SamplesFormatError, match=r"huge\.jsonl:2: longer than 1,048,576 bytes"):
            read_samples(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak  # the 24 MiB line was never held


def test_too_many_draws_and_deep_nesting_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(samples_format, "MAX_DRAWS", 100)  # where the parser reads it
    p = tmp_path / "many.jsonl"
    p.write_text("".join(_line(s) + "\n" for s in range(101)), encoding="utf-8")
    with pytest.raises(SamplesFormatError, match=r"many\.jsonl:101: more than 100 draws"):
        read_samples(p)
    d = tmp_path / "deep.jsonl"
    d.write_text(_line(1)[:-1] + ', "x": ' + "[" * 200_000 + "]" * 200_000 + "}\n", encoding="utf-8")
    with pytest.raises(SamplesFormatError, match=r"deep\.jsonl:1: JSON nested too deeply"):
        read_samples(d)


def test_the_appender_leaves_a_valid_file_after_every_draw(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    with SamplesAppender(p, engine=ENGINE, sampling=SAMPLING, speculative=None) as app:
        assert not p.exists()  # no draw, no file (an empty file is not a samples file)
        for s in range(5):
            app.append(Draw(ids=(s,), seed=s, prompt="p"))
            assert [d.seed for d in read_samples(p).draws] == list(range(s + 1))
        with pytest.raises(SamplesFormatError):
            app.append(Draw(ids=(-1,), seed=9, prompt="p"))  # refused before anything is written
    assert len(read_samples(p).draws) == 5


def test_recover_cuts_a_torn_line_and_write_is_atomic(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    assert recover_samples(p) is None
    p.write_text(_line(1) + "\n" + _line(2)[:30], encoding="utf-8")
    got = recover_samples(p)
    assert got is not None and [d.seed for d in got.draws] == [1] and p.read_text().endswith("\n")
    sm.write_samples(p, [Draw(ids=(3,), seed=3, prompt="p")], engine=ENGINE, sampling=SAMPLING, speculative=None)
    assert [d.seed for d in read_samples(p).draws] == [3]
    assert os.listdir(tmp_path) == ["t.jsonl"]  # no temporary file left
    assert json.loads(p.read_text())["seed"] == 3
