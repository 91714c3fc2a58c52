"""Engine processes that never outlive hsd: process groups, a guard with a parent-death signal and
a watchdog, and stopping a group.

vLLM's worker and server (and any engine hsd starts: llama-server, ...) run under a **guard**
(:func:`guarded`: this file run as a script by hsd's own Python, standard library only) started in a
session of its own (``start_new_session=True``: the guard's PID is its group's id). The guard starts
the engine in its group (the engine's own children, vLLM's engine-core processes, join it too) and
ends the whole group when hsd is gone, however it went (SIGKILL included):

* on Linux the kernel tells it at once (``prctl(PR_SET_PDEATHSIG, SIGTERM)``, set on the guard);
* everywhere, a watchdog sees its parent change (``os.getppid()``, checked every 0.2 s);
* a SIGTERM, SIGINT or SIGHUP to the guard does the same.

Ending the group: SIGTERM to every process of it, then SIGKILL to all after ``GRACE`` seconds. The
guard's exit status is the engine's (128 + N for an engine killed by signal N); its standard input
and outputs are the engine's (inherited), so pipes to the engine work unchanged. An engine process
that leaves the group on purpose (``setsid``) escapes it: none of vLLM's does.

:func:`stop_group` is how hsd itself stops such a group (a timeout, an interrupt, the end of a run).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

GRACE = 5.0
"""Seconds the guard waits between SIGTERM and SIGKILL of its group."""
WATCH_EVERY = 0.2
"""Seconds between two checks of the guard's watchdog."""


def log_tail(path: str, n: int = 15) -> str:
    """The last ``n`` non-blank lines of an engine's log, each stripped, joined by `` | `` (one line
    for an error message); ``(no log)`` when it cannot be read. A server's log (default 15: its error
    comes before its shutdown lines) and a worker's (3: a traceback's last lines name the error) alike."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-n:])


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running (zombies, which only await their
    parent, do not count; read from ``/proc`` where there is one, else a signal 0 to the group)."""
    if os.path.isdir("/proc"):
        return _in_group(pgid, None)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; nothing when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _settle(pgid: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)


def stop_group(proc: Any, grace: float) -> None:
    """Stop ``proc`` (a ``subprocess.Popen`` started with ``start_new_session=True``) and every
    process of its group: SIGTERM to the group; SIGKILL to the group if its leader or any other of
    its processes still runs after ``grace`` seconds (each); then wait (10 s at most) until
    :func:`group_alive` says none is left."""
    pgid = proc.pid  # start_new_session: the process leads its own group
    signal_group(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    _settle(pgid, grace)
    if group_alive(pgid) or proc.poll() is None:
        signal_group(pgid, signal.SIGKILL)
        proc.wait()
        _settle(pgid, 10.0)


def guarded(cmd: Sequence[str]) -> list[str]:
    """``cmd`` run under the guard (module docstring): start the list this returns with
    ``subprocess.Popen(..., start_new_session=True)``; the engine then ends when hsd does."""
    return [sys.executable, os.path.abspath(__file__), "guard", str(os.getpid()), "--", *cmd]


def _parent_death_signal(sig: int) -> None:
    """Ask the kernel for ``sig`` when this process's parent dies (Linux ``prctl``; nothing elsewhere:
    the watchdog covers it)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _end_group(child: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM to this process's group (the guard ignores it), SIGKILL to the group after
    :data:`GRACE` seconds if any of it still runs (the guard goes with it)."""
    pgid = os.getpgrp()
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline:
        if child is not None:
            child.poll()
        if not _others_alive(pgid):
            return
        time.sleep(0.05)
    signal_group(pgid, signal.SIGKILL)


def _others_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` other than this one still runs (not a zombie)."""
    if os.path.isdir("/proc"):
        return _in_group(pgid, os.getpid())
    return True  # no /proc: wait the whole grace, then SIGKILL


def _in_group(pgid: int, skip: int | None) -> bool:
    """Whether ``/proc`` shows a running process (not a zombie) of group ``pgid`` other than ``skip``."""
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == skip:
            continue
        try:
            with open(f"/proc/{d}/stat", encoding="utf-8", errors="replace") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def guard(parent: int, cmd: Sequence[str]) -> int:
    """The guard's work (module docstring): run ``cmd`` in this process's group while process
    ``parent`` (hsd) is its parent; end the group when it is not, or on SIGTERM / SIGINT / SIGHUP.
    Returns the engine's exit status (128 + N when signal N ended it)."""
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: stop.append(s))
    _parent_death_signal(signal.SIGTERM)
    child = None
    if os.getppid() == parent:  # hsd may have died before the signal above was asked for
        child = subprocess.Popen(list(cmd))
    while child is not None and child.poll() is None and not stop and os.getppid() == parent:
        time.sleep(WATCH_EVERY)
    if child is None or child.returncode is None:
        _end_group(child)
        return 128 + signal.SIGTERM
    _end_group(child)  # the engine ended: its own children go with it
    rc = child.returncode
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":  # the guard: python _procs.py guard PARENT_PID -- CMD...
    if len(sys.argv) < 5 or sys.argv[1] != "guard" or sys.argv[3] != "--":
        sys.exit("usage: _procs.py guard PARENT_PID -- CMD...")
    sys.exit(guard(int(sys.argv[2]), sys.argv[4:]))
