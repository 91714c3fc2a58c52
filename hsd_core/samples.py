"""Samples files on disk: read (bounded), written (atomically), appended one draw at a time, recovered.

The format itself (its rules, :class:`Sampling`, :class:`Draw`, :class:`SamplesFile` and the validating
parser :func:`parse_samples`) is :mod:`hsd_core.samples_format`'s, re-exported here, so
``from hsd_core.samples import ...`` reaches every name of both. Numpy-free and torch-free: an engine's
test suite can import :func:`write_samples` / :func:`format_draw` alone.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .samples_format import FORMAT, MAX_DRAWS, ORDERS, PROCESSING_KEYS, Draw, LineChecker, Sampling, SamplesFile, \
    SamplesFormatError, _fail, parse_samples

__all__ = ["FORMAT", "MAX_DRAWS", "MAX_LINE_BYTES", "ORDERS", "PROCESSING_KEYS", "Draw", "Sampling", "SamplesAppender",
           "SamplesFile", "SamplesFormatError", "format_draw", "parse_samples", "read_samples", "recover_samples",
           "write_samples"]

MAX_LINE_BYTES = 16 << 20
"""The longest line :func:`read_samples` reads (16 MiB: a draw of 100k ids with a prompt of as
many fits several times over); a longer one is refused in bounded memory."""


def _lines(f: Any, path: str) -> Iterator[str]:
    """The lines of the binary file ``f``, decoded, each read with at most :data:`MAX_LINE_BYTES`
    bytes in memory (a longer line is refused before it is read whole)."""
    for no in itertools.count(1):
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES:
            raise _fail(path, no, None, f"longer than {MAX_LINE_BYTES:,} bytes: a draw's line is far shorter "
                                        "(MAX_LINE_BYTES)")
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _fail(path, 0, None, f"is not UTF-8 ({e.reason} at byte {e.start} of line {no})") from None


def read_samples(path: str | os.PathLike[str]) -> SamplesFile:
    """Read and validate the samples file at ``path`` (:func:`parse_samples`); a file that is not
    UTF-8 or does not open is refused with one line too."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            return parse_samples(_lines(f, p), p)
    except UnicodeDecodeError as e:
        raise _fail(p, 0, None, f"is not UTF-8 ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise _fail(p, 0, None, f"cannot be read: {e.strerror or e}") from None


def format_draw(draw: Draw, *, engine: Mapping[str, Any], sampling: Sampling | Mapping[str, Any],
                speculative: Mapping[str, Any] | None, target: str | None = None) -> str:
    """One line of a samples file (no newline) for ``draw`` with the file's shared settings
    (``sampling`` as a :class:`Sampling` or its JSON object); ``draw.extra`` keys are written too."""
    obj: dict[str, Any] = {"format": FORMAT, "engine": dict(engine)}
    if target is not None:
        obj["target"] = target
    obj["speculative"] = None if speculative is None else dict(speculative)
    obj["sampling"] = sampling.to_json() if isinstance(sampling, Sampling) else dict(sampling)
    obj["seed"] = draw.seed
    if draw.prompt is not None:
        obj["prompt"] = draw.prompt
    if draw.prompt_ids is not None:
        obj["prompt_ids"] = list(draw.prompt_ids)
    obj["ids"] = list(draw.ids)
    if draw.finish_reason is not None:
        obj["finish_reason"] = draw.finish_reason
    for k, v in draw.extra.items():
        obj.setdefault(k, v)
    return json.dumps(obj, ensure_ascii=False)


def write_samples(path: str | os.PathLike[str], draws: Sequence[Draw], *, engine: Mapping[str, Any],
                  sampling: Sampling | Mapping[str, Any], speculative: Mapping[str, Any] | None,
                  target: str | None = None) -> SamplesFile:
    """Write ``draws`` as a samples file at ``path`` (one :func:`format_draw` line each), then read
    it back (so what is written is what :func:`read_samples` accepts) and return it; refuses
    (:class:`SamplesFormatError`) what the reader would refuse. Atomic: the lines go to a
    temporary file beside ``path`` that then replaces it, so ``path`` holds the old file or the
    new one at every moment, never a part of either."""
    p = os.fspath(path)
    text = "".join(format_draw(d, engine=engine, sampling=sampling, speculative=speculative, target=target) + "\n"
                   for d in draws)
    parsed = parse_samples(text.splitlines(), p)
    tmp = f"{p}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return parsed


class SamplesAppender:
    """A samples file written one draw at a time, as the draws arrive: each :meth:`append` writes
    one whole line with a single ``write`` to a file opened for appending (no buffer in this
    process), so the file on disk is a valid samples file after every draw, and a run that is
    interrupted (an error, Ctrl-C, SIGKILL) keeps every draw appended before it. The file is created
    at the first draw (an empty file is not a samples file). Lines are validated as they are
    written (:class:`~hsd_core.samples_format.LineChecker`, the rules :func:`parse_samples` applies to
    each line: the shared settings in full on the first, the same settings and the draw's own fields
    on every later one), so what is written is what the reader takes."""

    def __init__(self, path: str | os.PathLike[str], *, engine: Mapping[str, Any],
                 sampling: Sampling | Mapping[str, Any], speculative: Mapping[str, Any] | None,
                 target: str | None = None) -> None:
        self.path = os.fspath(path)
        self._shared: dict[str, Any] = dict(engine=engine, sampling=sampling, speculative=speculative, target=target)
        self._fd: int | None = None
        self._check = LineChecker(self.path)
        self.written = 0

    def append(self, draw: Draw) -> None:
        """Append ``draw`` (one line, written and handed to the kernel before this returns)."""
        line = format_draw(draw, **self._shared)
        self._check.check(line, self.written + 1)
        data = (line + "\n").encode("utf-8")
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        self.written += 1

    def close(self) -> None:
        """Flush the file to disk (``fsync``) and close it; nothing when no draw was written."""
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> SamplesAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def recover_samples(path: str | os.PathLike[str]) -> SamplesFile | None:
    """The draws of a samples file written by a run that may have been interrupted (to resume it):
    None when ``path`` does not exist or holds no line; a last line without its newline that is
    not valid JSON (a write cut short by a crash) is cut off the file first. Everything else is
    read as :func:`read_samples` reads it (and refused as it refuses)."""
    p = os.fspath(path)
    if not os.path.exists(p):
        return None
    with open(p, "rb") as f:
        data = f.read()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        try:
            json.loads(data[cut:])
        except (ValueError, RecursionError):
            with open(p, "r+b") as f:
                f.truncate(cut)
            data = data[:cut]
    if not data.strip():
        return None
    return read_samples(p)
