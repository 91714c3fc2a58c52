"""Recorded samples: the language-agnostic contract between a serving engine and hsd's audits.

A samples file is JSONL (UTF-8), one JSON object per draw, every line self-contained (format
``hsd-samples/1``, ``docs/auditing.md``, "Audit your own engine")::

    {"format": "hsd-samples/1", "engine": {"name": "vllm", "version": "0.32.0"}, "target": "gemma-3-270m",
     "speculative": null, "sampling": {"do_sample": true, "temperature": 1.0, "top_k": null, "top_p": null,
     "max_new_tokens": 32}, "seed": 12345, "prompt": "def fib(n):", "prompt_ids": [2, 1293, 16567],
     "ids": [523, 11], "finish_reason": "length"}

Required keys: ``format``, ``engine`` (an object with string ``name`` and ``version``),
``speculative`` (null: no speculation; else an object, free-form beyond an optional string
``method``), ``sampling`` (``do_sample`` a bool; ``temperature`` a number > 0, ``top_k`` null or an
int >= 1, ``top_p`` null or a number in (0, 1], all three ignored when greedy; ``max_new_tokens`` an
int >= 1), ``seed`` (an int, or null where the engine cannot seed), ``ids`` (the generated target
ids only, ints >= 0), and at least one of ``prompt`` (a str) and ``prompt_ids`` (a non-empty list of
the target's ids the engine conditioned on: authoritative when given). Optional: ``target`` (a
str), ``finish_reason`` (a str or null). Every line carries the same ``format``, ``engine``,
``target``, ``speculative`` and ``sampling``; seeds that are given are distinct (a repeated seed is
not an independent draw). Unknown keys are kept (:attr:`Draw.extra`) and ignored.

A file that breaks a rule is refused with one line, :class:`SamplesFormatError`
(``FILE:LINE: key 'K': what is wrong; what to do``). Numpy-free and torch-free: an engine's test
suite can import :func:`write_samples` / :func:`format_draw` alone.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FORMAT", "Draw", "Sampling", "SamplesAppender", "SamplesFile", "SamplesFormatError", "format_draw",
           "parse_samples", "read_samples", "recover_samples", "write_samples"]

FORMAT = "hsd-samples/1"
"""The ``format`` value of every line of a version-1 samples file."""

MAX_LINE_BYTES = 16 << 20
"""The longest line :func:`read_samples` reads (16 MiB: a draw of 100k ids with a prompt of as
many fits several times over); a longer one is refused in bounded memory."""
MAX_DRAWS = 1_000_000
"""The most draws :func:`parse_samples` reads from one file (an audit needs thousands)."""

_SHARED = ("format", "engine", "target", "speculative", "sampling")
_KNOWN = frozenset(_SHARED + ("seed", "prompt", "prompt_ids", "ids", "finish_reason"))


class SamplesFormatError(ValueError):
    """A samples file that breaks the format: one line, ``FILE:LINE: key 'K': what; what to do``."""


@dataclass(frozen=True)
class Sampling:
    """The sampling settings every draw of a file was made with (``top_k`` / ``top_p`` None: off;
    greedy: ``do_sample`` False, the other three then carry no meaning)."""

    do_sample: bool
    temperature: float
    top_k: int | None
    top_p: float | None
    max_new_tokens: int

    def to_json(self) -> dict[str, Any]:
        return {"do_sample": self.do_sample, "temperature": self.temperature, "top_k": self.top_k,
                "top_p": self.top_p, "max_new_tokens": self.max_new_tokens}

    def describe(self) -> str:
        """One phrase: ``greedy`` or ``temperature 1.0, top_k None, top_p 0.9``."""
        if not self.do_sample:
            return "greedy"
        return f"temperature {self.temperature}, top_k {self.top_k}, top_p {self.top_p}"


@dataclass(frozen=True)
class Draw:
    """One recorded draw: its ``seed`` (None: the engine could not seed), its prompt as text
    and / or the target's ids (``prompt_ids``, authoritative when given), the generated target
    ids, the engine's ``finish_reason``, the unknown keys of its line (``extra``) and the line
    number it came from (``line``, 1-based; 0 for a draw made in memory)."""

    ids: tuple[int, ...]
    seed: int | None = None
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    finish_reason: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    line: int = 0

    def prompt_key(self) -> tuple[Any, ...]:
        """What identifies the draw's prompt: its ids when given, else its text."""
        return ("ids",) + self.prompt_ids if self.prompt_ids is not None else ("text", self.prompt)


@dataclass(frozen=True)
class SamplesFile:
    """A validated samples file: the settings its lines share and its draws, in file order."""

    path: str
    engine: Mapping[str, Any]
    speculative: Mapping[str, Any] | None
    sampling: Sampling
    draws: tuple[Draw, ...]
    target: str | None = None

    @property
    def is_speculative(self) -> bool:
        return self.speculative is not None

    def engine_label(self) -> str:
        """``name version`` of the engine."""
        return f"{self.engine.get('name')} {self.engine.get('version')}"

    def describe(self) -> str:
        """One line: the engine, its speculation, its sampling, how many draws."""
        spec = "no speculation" if self.speculative is None else \
            "speculation " + json.dumps(dict(self.speculative), sort_keys=True)
        return (f"{os.path.basename(self.path)}: {len(self.draws)} draws of {self.engine_label()}, {spec}, "
                f"{self.sampling.describe()}, max_new_tokens {self.sampling.max_new_tokens}")

    def seeds(self) -> set[int]:
        return {d.seed for d in self.draws if d.seed is not None}


def _fail(path: str, line: int, key: str | None, what: str) -> SamplesFormatError:
    where = f"{path}:{line}" if line else path
    return SamplesFormatError(f"{where}: " + (f"key {key!r}: " if key else "") + what)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)) and math.isfinite(float(x))


def _ids(obj: Any, path: str, line: int, key: str, nonempty: bool) -> tuple[int, ...]:
    if not isinstance(obj, list):
        raise _fail(path, line, key, f"must be a list of int ids, got {type(obj).__name__}")
    for t in obj:
        if not _is_int(t) or t < 0:
            raise _fail(path, line, key, f"holds {t!r}: every id must be an int >= 0")
    if nonempty and not obj:
        raise _fail(path, line, key, "is empty: give the target's ids the engine conditioned on (or leave the key "
                                     "out and give 'prompt')")
    return tuple(obj)


def _sampling(obj: Any, path: str, line: int) -> Sampling:
    if not isinstance(obj, dict):
        raise _fail(path, line, "sampling", f"must be an object, got {type(obj).__name__}")
    for req in ("do_sample", "max_new_tokens"):
        if req not in obj:
            raise _fail(path, line, f"sampling.{req}", "missing")
    ds = obj["do_sample"]
    if not isinstance(ds, bool):
        raise _fail(path, line, "sampling.do_sample", f"must be true or false, got {ds!r}")
    mnt = obj["max_new_tokens"]
    if not _is_int(mnt) or mnt < 1:
        raise _fail(path, line, "sampling.max_new_tokens", f"must be an int >= 1, got {mnt!r}")
    t, k, p = obj.get("temperature", 1.0), obj.get("top_k"), obj.get("top_p")
    if ds:
        for key in ("temperature", "top_k", "top_p"):
            if key not in obj:
                raise _fail(path, line, f"sampling.{key}", "missing (null for top_k / top_p off)")
        if not _is_num(t) or t <= 0:
            raise _fail(path, line, "sampling.temperature", f"must be a number > 0 when do_sample is true, got {t!r} "
                                                            "(greedy: do_sample false)")
        if k is not None and (not _is_int(k) or k < 1):
            raise _fail(path, line, "sampling.top_k", f"must be null (off) or an int >= 1, got {k!r}")
        if p is not None and (not _is_num(p) or not 0 < p <= 1):
            raise _fail(path, line, "sampling.top_p", f"must be null (off) or a number in (0, 1], got {p!r}")
        return Sampling(True, float(t), k, None if p is None else float(p), mnt)
    return Sampling(False, 1.0, None, None, mnt)


def _engine(obj: Any, path: str, line: int) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise _fail(path, line, "engine", f"must be an object with 'name' and 'version', got {type(obj).__name__}")
    for k in ("name", "version"):
        if not isinstance(obj.get(k), str):
            raise _fail(path, line, f"engine.{k}", "missing or not a string")
    return obj


def _speculative(obj: Any, path: str, line: int) -> dict[str, Any] | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise _fail(path, line, "speculative", f"must be null (no speculation) or an object, got {type(obj).__name__}")
    if "method" in obj and not isinstance(obj["method"], str):
        raise _fail(path, line, "speculative.method", f"must be a string, got {obj['method']!r}")
    return obj


def _draw(obj: Any, path: str, line: int) -> Draw:
    if not isinstance(obj, dict):
        raise _fail(path, line, None, f"a line must be a JSON object, got {type(obj).__name__}")
    for k in ("format", "engine", "speculative", "sampling", "seed", "ids"):
        if k not in obj:
            raise _fail(path, line, k, "missing" + (" (null: no speculation)" if k == "speculative" else
                                                    " (null where the engine cannot seed)" if k == "seed" else ""))
    if obj["format"] != FORMAT:
        raise _fail(path, line, "format", f"is {obj['format']!r}; this hsd reads {FORMAT!r}")
    seed = obj["seed"]
    if seed is not None and not _is_int(seed):
        raise _fail(path, line, "seed", f"must be an int or null, got {seed!r}")
    prompt, pids = obj.get("prompt"), obj.get("prompt_ids")
    if prompt is None and pids is None:
        raise _fail(path, line, "prompt", "missing: give 'prompt' (text) and / or 'prompt_ids' (the target's ids)")
    if prompt is not None and not isinstance(prompt, str):
        raise _fail(path, line, "prompt", f"must be a string, got {type(prompt).__name__}")
    fr = obj.get("finish_reason")
    if fr is not None and not isinstance(fr, str):
        raise _fail(path, line, "finish_reason", f"must be a string or null, got {fr!r}")
    target = obj.get("target")
    if target is not None and not isinstance(target, str):
        raise _fail(path, line, "target", f"must be a string, got {target!r}")
    return Draw(ids=_ids(obj["ids"], path, line, "ids", False), seed=seed, prompt=prompt,
                prompt_ids=None if pids is None else _ids(pids, path, line, "prompt_ids", True), finish_reason=fr,
                extra={k: v for k, v in obj.items() if k not in _KNOWN}, line=line)


def parse_samples(lines: Iterable[str], path: str = "<samples>") -> SamplesFile:
    """Validate the lines of a samples file (module docstring) and return it as a
    :class:`SamplesFile`; blank lines are skipped. Raises :class:`SamplesFormatError` (one line
    naming ``path``, the line number and the key) at the first rule broken."""
    draws: list[Draw] = []
    first: dict[str, Any] | None = None
    first_line = 0
    sampling: Sampling | None = None
    seen: dict[int, int] = {}
    for no, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        if len(draws) >= MAX_DRAWS:
            raise _fail(path, no, None, f"more than {MAX_DRAWS:,} draws: hsd reads at most MAX_DRAWS per file (split "
                                        "the file; an audit needs far fewer)")
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise _fail(path, no, None, f"not valid JSON ({e.msg} at column {e.colno}): one JSON object per line") \
                from None
        except RecursionError:
            raise _fail(path, no, None, "JSON nested too deeply: a draw is a flat object of lists of ids") from None
        d = _draw(obj, path, no)
        if first is None:
            _engine(obj["engine"], path, no)
            _speculative(obj["speculative"], path, no)
            sampling = _sampling(obj["sampling"], path, no)
            first, first_line = {k: obj.get(k) for k in _SHARED}, no
        else:
            for k in _SHARED:
                if obj.get(k) != first[k]:
                    raise _fail(path, no, k, f"mixed settings: {json.dumps(obj.get(k))} here, "
                                             f"{json.dumps(first[k])} on line {first_line}; write one file per setting")
        if d.seed is not None:
            if d.seed in seen:
                raise _fail(path, no, "seed", f"{d.seed} repeats line {seen[d.seed]}: a repeated seed is not an "
                                              "independent draw; give every draw its own seed")
            seen[d.seed] = no
        draws.append(d)
    if first is None or sampling is None:
        raise _fail(path, 0, None, "holds no draws: one JSON object per line, one line per draw")
    return SamplesFile(path=path, engine=first["engine"], speculative=first["speculative"], sampling=sampling,
                       draws=tuple(draws), target=first["target"])


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
    written (:func:`parse_samples` on the line alone), so what is written is what the reader takes."""

    def __init__(self, path: str | os.PathLike[str], *, engine: Mapping[str, Any],
                 sampling: Sampling | Mapping[str, Any], speculative: Mapping[str, Any] | None,
                 target: str | None = None) -> None:
        self.path = os.fspath(path)
        self._shared: dict[str, Any] = dict(engine=engine, sampling=sampling, speculative=speculative, target=target)
        self._fd: int | None = None
        self.written = 0

    def append(self, draw: Draw) -> None:
        """Append ``draw`` (one line, written and handed to the kernel before this returns)."""
        line = format_draw(draw, **self._shared)
        parse_samples([line], self.path)
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
