"""Stopping an engine's process group: vLLM's worker and server each start in a session of their own
(``start_new_session=True``, so their PID is their group's id) and spawn engine processes into it;
stopping one means stopping every process of that group, never leaving orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running (zombies, which only await their
    parent, do not count; read from ``/proc`` where there is one, else a signal 0 to the group)."""
    if os.path.isdir("/proc"):
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat", encoding="utf-8", errors="replace") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
                return True
        return False
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
