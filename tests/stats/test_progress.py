"""hsd_core.progress: a plain line per few percent in a log (never one per unit), a tqdm bar on a
terminal, nothing before the first unit, HSD_PROGRESS to turn it off or force lines."""

from __future__ import annotations

import io

import pytest

from hsd_core.progress import Progress, progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_five_percent_with_rate_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HSD_PROGRESS", raising=False)
    out = io.StringIO()
    with progress(1000, "hsd audit: draws", "draw", stream=out) as bar:
        assert bar.mode == "lines"
        for _ in range(1000):
            bar.update(1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 20, lines  # 5 %, 10 %, ..., 100 %: not one per draw
    assert lines[0].startswith("hsd audit: draws 50/1000 (5%), ") and "draw/s, ETA " in lines[0]
    assert lines[-1].startswith("hsd audit: draws 1000/1000 (100%), ") and " in all" in lines[-1]


def test_nothing_is_written_before_the_first_unit_and_an_early_end_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HSD_PROGRESS", raising=False)
    out = io.StringIO()
    bar = progress(100, "x", stream=out)
    assert out.getvalue() == ""
    bar.close()
    assert out.getvalue() == ""  # closed before any work: still nothing
    out = io.StringIO()
    with progress(100, "x", stream=out) as bar:
        bar.update(5)
        bar.update(2)  # stopped at 7 % (an error, a budget): the last state is printed on close
    lines = out.getvalue().splitlines()
    assert [ln.split(",")[0] for ln in lines] == ["x 5/100 (5%)", "x 7/100 (7%)"], lines


def test_big_steps_print_one_line_each(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HSD_PROGRESS", raising=False)
    out = io.StringIO()
    with progress(10, "cases", stream=out) as bar:
        for _ in range(10):
            bar.update(1)  # each update is 10 %: a line each
    assert [ln.split(",")[0] for ln in out.getvalue().splitlines()] == [f"cases {i}/10 ({10 * i}%)" for i in range(1, 11)]


def test_terminal_tqdm_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tqdm")
    monkeypatch.delenv("HSD_PROGRESS", raising=False)
    tty = _Tty()
    bar = progress(10, "draws", stream=tty)
    assert bar.mode == "tqdm"
    bar.update(5)
    bar.close()
    assert "5/10" in tty.getvalue()
    monkeypatch.setenv("HSD_PROGRESS", "lines")
    assert progress(10, "d", stream=_Tty()).mode == "lines"
    monkeypatch.setenv("HSD_PROGRESS", "0")
    quiet = io.StringIO()
    with progress(10, "d", stream=quiet) as off:
        off.update(10)
    assert off.mode == "off" and off.done == 10 and quiet.getvalue() == ""


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="total must be >= 0"):
        Progress(-1, "x")
    with pytest.raises(ValueError, match="every must be in"):
        Progress(1, "x", every=0)


def test_slow_units_show_seconds_per_unit_and_start_starts_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A few long units (a conversion's phases): the clock runs from ``start()``, so the first line has a
    rate, given as seconds per unit when below one unit a second."""
    import hsd_core.progress as hp

    monkeypatch.delenv("HSD_PROGRESS", raising=False)
    now = [100.0]
    monkeypatch.setattr(hp.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    with progress(3, "phase", "phase", stream=out, every=1 / 3).start() as bar:
        now[0] += 20
        bar.update(1)
        now[0] += 40
        bar.update(1)
    lines = out.getvalue().splitlines()
    assert lines[0] == "phase 1/3 (33%), 20 s/phase, ETA 40 s", lines
    assert lines[1] == "phase 2/3 (67%), 30 s/phase, ETA 30 s", lines


def test_units_that_come_at_once_are_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first update (a chunk of 64 draws, or draws resumed from a file) starts the clock and is not
    counted in the rate: its line shows no rate (before: 64 draws in microseconds, about 1e7 draw/s);
    the rate after it counts only the units done since."""
    monkeypatch.delenv("HSD_PROGRESS", raising=False)
    now = [100.0]
    monkeypatch.setattr("hsd_core.progress.time.monotonic", lambda: now[0])
    out = io.StringIO()
    with progress(200, "d", "draw", stream=out) as bar:
        bar.update(64)
        now[0] += 2.0
        bar.update(64)  # 64 draws in 2 s since the clock started
    first, second = out.getvalue().splitlines()[:2]
    assert first == "d 64/200 (32%), - draw/s, ETA ?", first
    assert second == "d 128/200 (64%), 32 draw/s, ETA 2 s", second
