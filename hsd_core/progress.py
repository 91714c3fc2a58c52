"""Progress of long work, for a person at a terminal and for a CI log alike (standard library; tqdm
when it is installed).

:func:`progress` returns a :class:`Progress` over ``total`` units of work (draws, sequences,
requests, cases):

* on a terminal (the stream is a TTY) with ``tqdm`` importable: a tqdm bar, with its rate and ETA;
* otherwise (a CI log, a pipe, no tqdm): one plain line each time another ``every`` (default 5 %) of
  the work is done, and at the end: ``hsd audit: teacher forcing 60/200 (30%), 4.1 sequences/s,
  ETA 34 s`` -- a log of a long run gets about twenty lines, never one per unit.

``HSD_PROGRESS=0`` turns every bar off, ``HSD_PROGRESS=lines`` forces the plain lines (also on a
terminal). Nothing is written before the first :meth:`Progress.update`, so an error raised before any
work is the only line on the stream. hsd_core requires nothing new: tqdm is used only when present.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import IO, Any

__all__ = ["Progress", "progress"]


def _fmt_seconds(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


class Progress:
    """``total`` units of work, ``update(k)`` as they are done, ``close()`` at the end (also a context
    manager). :func:`progress` chooses the form; this class is the plain-lines one and the wrapper of a
    tqdm bar."""

    def __init__(self, total: int, desc: str, unit: str = "it", *, stream: IO[str] | None = None,
                 mode: str = "lines", every: float = 0.05) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        if not 0 < every <= 1:
            raise ValueError(f"every must be in (0, 1], got {every}")
        self.total, self.desc, self.unit, self.mode, self.every = int(total), desc, unit, mode, every
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self._t0: float | None = None
        self._base = 0  # the units done when the clock started (not timed: they came at once, or before it)
        self._next = every
        self._bar: Any = None
        self._closed = False
        self._printed_at = -1

    def start(self) -> Progress:
        """Start the clock now (else it starts at the first :meth:`update`, which then has no rate):
        for a few long units, such as the phases of a conversion. Prints nothing."""
        if self._t0 is None:
            self._t0 = time.monotonic()
            self._base = self.done
        return self

    def update(self, k: int = 1) -> None:
        """``k`` more units done."""
        if self.mode == "off" or k <= 0:
            self.done += max(k, 0)
            return
        if self._t0 is None:  # the clock starts with the first units: they came at once, so they are not timed
            self._t0 = time.monotonic()
            self._base = self.done + k
        self.done += k
        if self.mode == "tqdm":
            if self._bar is None:
                from tqdm.auto import tqdm  # type: ignore[import-untyped]

                self._bar = tqdm(total=self.total or None, desc=self.desc, unit=self.unit, file=self.stream,
                                 dynamic_ncols=True)
            self._bar.update(k)
            return
        if self.total and self.done / self.total + 1e-12 >= self._next:
            self._line()
            frac = self.done / self.total
            self._next = (math.floor(frac / self.every + 1e-9) + 1) * self.every

    def _line(self) -> None:
        elapsed = time.monotonic() - (self._t0 or time.monotonic())
        timed = self.done - self._base  # the units done since the clock started
        rate = timed / elapsed if elapsed > 0 and timed > 0 else math.inf
        left = (self.total - self.done) / rate if rate > 0 and math.isfinite(rate) else math.inf
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        if not math.isfinite(rate) or rate <= 0:
            rate_s = f"- {self.unit}/s"
        else:
            rate_s = f"{rate:.3g} {self.unit}/s" if rate >= 1 else f"{1 / rate:.3g} s/{self.unit}"
        tail = f", ETA {_fmt_seconds(left)}" if self.done < self.total else f", {_fmt_seconds(elapsed)} in all"
        print(f"{self.desc} {self.done}/{self.total}{pct}, {rate_s}{tail}", file=self.stream, flush=True)
        self._printed_at = self.done

    def close(self) -> None:
        """End the bar (the plain form prints its last line if the last update did not)."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self.mode == "lines" and self._t0 is not None and self.done != self._printed_at:
            self._line()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _has_tqdm() -> bool:
    try:
        import tqdm  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return False
    return True


def progress(total: int, desc: str, unit: str = "it", *, stream: IO[str] | None = None,
             every: float = 0.05) -> Progress:
    """A :class:`Progress` over ``total`` units for ``stream`` (default stderr): a tqdm bar on a
    terminal when tqdm is installed, else a plain line per ``every`` of the work; ``HSD_PROGRESS``
    (``0``: off, ``lines``: plain lines) overrides (module docstring)."""
    s = stream if stream is not None else sys.stderr
    env = os.environ.get("HSD_PROGRESS", "").strip().lower()
    if env in ("0", "off", "no", "false"):
        mode = "off"
    elif env == "lines":
        mode = "lines"
    else:
        isatty = getattr(s, "isatty", None)
        mode = "tqdm" if callable(isatty) and isatty() and _has_tqdm() else "lines"
    return Progress(total, desc, unit, stream=s, mode=mode, every=every)
