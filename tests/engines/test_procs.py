"""Engine processes never outlive hsd (:mod:`hsd_torch.engines._procs`): an "engine" (a Python script
that starts a child of its own and sleeps, as vLLM's server starts its engine-core processes) run
under the guard by an "hsd" process, which is then killed with SIGKILL: the engine's whole group
must be gone within a few seconds. The control: the same engine started without the guard (only a
process group, as before) survives the SIGKILL of its parent. Fast tier (about 3 s), POSIX only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hsd_torch.engines import _procs

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")

ENGINE = ("import subprocess, sys, time; "
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")


def _hsd(tmp_path: Path, with_guard: bool) -> tuple[subprocess.Popen[bytes], int]:
    """An "hsd" process that starts the engine (under the guard or not) and sleeps; the engine's
    group id, read back from the file the "hsd" process writes."""
    pg = tmp_path / f"pgid-{with_guard}"
    code = ("import importlib.util, subprocess, sys, time; "  # _procs alone: hsd_torch would import torch (s)
            f"spec = importlib.util.spec_from_file_location('_procs', {_procs.__file__!r}); "
            "_procs = importlib.util.module_from_spec(spec); spec.loader.exec_module(_procs); "
            f"cmd = [sys.executable, '-c', {ENGINE!r}]; "
            f"p = subprocess.Popen(_procs.guarded(cmd) if {with_guard} else cmd, start_new_session=True); "
            f"open({str(pg)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while not (pg.exists() and pg.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pgid = int(pg.read_text())
    # the engine and its child are both up (the group holds the engine, its child, and the guard)
    while _count(pgid) < (3 if with_guard else 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, pgid


def _count(pgid: int) -> int:
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", encoding="utf-8", errors="replace") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            n += len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid
    return n


def _gone_within(pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _procs.group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _procs.group_alive(pgid)


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="counts processes in /proc")
def test_the_engine_group_dies_with_hsd_even_by_sigkill(tmp_path: Path) -> None:
    hsd, pgid = _hsd(tmp_path, with_guard=False)  # the control: a process group alone outlives hsd
    try:
        hsd.kill()
        hsd.wait()
        time.sleep(0.5)
        assert _procs.group_alive(pgid)
    finally:
        _procs.signal_group(pgid, signal.SIGKILL)
    hsd, pgid = _hsd(tmp_path, with_guard=True)
    try:
        assert _count(pgid) == 3
        hsd.kill()
        hsd.wait()
        assert _gone_within(pgid, 8.0)
    finally:
        _procs.signal_group(pgid, signal.SIGKILL)


def test_the_guard_passes_status_and_streams_through(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "import sys; print(sys.stdin.read().upper()); sys.exit(3)"]
    p = subprocess.run(_procs.guarded(cmd), input=b"ids", capture_output=True, start_new_session=True, timeout=30)
    assert p.returncode == 3 and p.stdout.strip() == b"IDS"


def test_stop_group_ends_a_guarded_engine_and_its_children() -> None:
    p = subprocess.Popen(_procs.guarded([sys.executable, "-c", ENGINE]), start_new_session=True)
    deadline = time.monotonic() + 30
    while _procs.group_alive(p.pid) and _count(p.pid) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    _procs.stop_group(p, grace=5.0)
    assert not _procs.group_alive(p.pid) and p.returncode is not None


def test_log_tail_is_the_last_non_blank_lines_on_one_line(tmp_path: Path) -> None:
    """The one tail of every engine's log in error messages (servers: 15 lines, vLLM's worker: 3):
    blank lines are not counted, each line is stripped, an unreadable log says so."""
    from hsd_torch.engines import vllm_jobs

    log = tmp_path / "engine.log"
    log.write_text("start\n\nTraceback (most recent call last):\n  File \"w.py\", line 3\n\n"
                   "RuntimeError: boom   \n\n\n", encoding="utf-8")
    assert _procs.log_tail(str(log), vllm_jobs.WORKER_TAIL) == \
        'Traceback (most recent call last): | File "w.py", line 3 | RuntimeError: boom'
    assert _procs.log_tail(str(log)) == 'start | Traceback (most recent call last): | File "w.py", line 3 | ' \
        "RuntimeError: boom"
    assert _procs.log_tail(str(tmp_path / "missing.log")) == "(no log)"
