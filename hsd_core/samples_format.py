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
str), ``finish_reason`` (a str or null; ``"stop"``: the draw ended on a stop string of
``sampling.stop``, its last id the one whose text completed it). Every line carries the same ``format``, ``engine``,
``target``, ``speculative`` and ``sampling``; seeds that are given are distinct (a repeated seed is
not an independent draw). Unknown keys of a line are kept (:attr:`Draw.extra`) and ignored;
an unknown key of ``sampling`` is refused, since it may change the law (issue 48).

**Processing.** ``sampling`` may also hold (each optional, null or absent: off): ``min_p`` (in
[0, 1]), ``repetition_penalty`` (> 0; 1 off), ``presence_penalty`` and ``frequency_penalty``
(numbers; 0 off), ``penalty_last_n`` (llama.cpp's penalty window, an int; -1 every id),
``logit_bias`` (``{"id": bias}``, ids as decimal strings, the OpenAI form), ``bad_words_ids``
(a list of non-empty id lists: the engine's tokenization of its bad words), ``allowed_token_ids``
(a non-empty id list), ``min_tokens`` (an int >= 0), ``stop`` (a string or a list of them) and
``order``, the engine whose order of stages the draws followed (``"vllm"``, ``"llama.cpp"`` or
``"transformers"``: :mod:`hsd_core.processing` states each order and computes its law), required
as soon as any other of these keys is set. :class:`Sampling` writes them only when set, so a
file with temperature, top-k and top-p alone reads as before.

A file that breaks a rule is refused with one line, :class:`SamplesFormatError`
(``FILE:LINE: key 'K': what is wrong; what to do``). Numpy-free and torch-free: an engine's test
suite can import :func:`~hsd_core.samples.write_samples` / :func:`~hsd_core.samples.format_draw` alone.

This module holds the format (its data classes and the validating parser, :func:`parse_samples`);
:mod:`hsd_core.samples` reads and writes files of it (and re-exports every name here).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FORMAT", "MAX_DRAWS", "ORDERS", "PROCESSING_KEYS", "Draw", "LineChecker", "Sampling", "SamplesFile",
           "SamplesFormatError",
           "parse_samples"]

FORMAT = "hsd-samples/1"
"""The ``format`` value of every line of a version-1 samples file."""

MAX_DRAWS = 1_000_000
"""The most draws :func:`parse_samples` reads from one file (an audit needs thousands)."""

_SHARED = ("format", "engine", "target", "speculative", "sampling")
_KNOWN = frozenset(_SHARED + ("seed", "prompt", "prompt_ids", "ids", "finish_reason"))


class SamplesFormatError(ValueError):
    """A samples file that breaks the format: one line, ``FILE:LINE: key 'K': what; what to do``."""


ORDERS = ("vllm", "llama.cpp", "transformers")
"""The engines whose order of processing stages a file may name (``sampling.order``;
:mod:`hsd_core.processing` computes the law in each)."""

PROCESSING_KEYS = ("min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "penalty_last_n",
                   "logit_bias", "bad_words_ids", "allowed_token_ids", "min_tokens", "stop", "order")
"""The optional ``sampling`` keys beyond ``do_sample``, ``temperature``, ``top_k``, ``top_p`` and
``max_new_tokens`` (module docstring); any other key is refused."""


@dataclass(frozen=True)
class Sampling:
    """The sampling settings every draw of a file was made with (``top_k`` / ``top_p`` None: off;
    greedy: ``do_sample`` False, temperature, top-k, top-p and min-p then carry no meaning; the
    penalties, bias, bad words, allowed ids and min_tokens act on greedy draws too).

    Beyond temperature, top-k and top-p (module docstring, "Processing"): ``min_p`` (None: off),
    ``repetition_penalty`` (1: off), ``presence_penalty`` / ``frequency_penalty`` (0: off),
    ``penalty_last_n`` (llama.cpp's penalty window; None: every id), ``logit_bias`` (``(id, bias)``
    pairs, ids increasing), ``bad_words_ids`` (id sequences), ``allowed_token_ids`` (None: every id),
    ``min_tokens`` (end ids held back before that many new ids), ``stop`` (stop strings) and
    ``order``, the engine whose order of stages applies (:data:`ORDERS`; None: temperature, top-k,
    top-p in that order, vLLM's and transformers' order, the only processing then allowed)."""

    do_sample: bool
    temperature: float
    top_k: int | None
    top_p: float | None
    max_new_tokens: int
    min_p: float | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    order: str | None = None

    def processing(self) -> dict[str, Any]:
        """The settings beyond temperature, top-k and top-p that differ from their defaults, as
        the file's JSON writes them (empty: plain temperature / top-k / top-p sampling)."""
        out: dict[str, Any] = {}
        for key in PROCESSING_KEYS:
            v = getattr(self, key)
            if v == _DEFAULTS[key]:
                continue
            if key == "logit_bias":
                v = {str(i): b for i, b in v}
            elif key == "bad_words_ids":
                v = [list(w) for w in v]
            elif key in ("allowed_token_ids", "stop"):
                v = list(v)
            out[key] = v
        return out

    def to_json(self) -> dict[str, Any]:
        return {"do_sample": self.do_sample, "temperature": self.temperature, "top_k": self.top_k,
                "top_p": self.top_p, "max_new_tokens": self.max_new_tokens, **self.processing()}

    def describe(self) -> str:
        """One phrase: ``greedy`` or ``temperature 1.0, top_k None, top_p 0.9``, then the other
        settings that are set (``, min_tokens 24, logit_bias {"30": 5}, order vllm``)."""
        extra = "".join(f", {k} {json.dumps(v)}" for k, v in self.processing().items())
        if not self.do_sample:
            return "greedy" + extra
        return f"temperature {self.temperature}, top_k {self.top_k}, top_p {self.top_p}" + extra


_DEFAULTS: dict[str, Any] = {"min_p": None, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                             "frequency_penalty": 0.0, "penalty_last_n": None, "logit_bias": (),
                             "bad_words_ids": (), "allowed_token_ids": None, "min_tokens": 0, "stop": (),
                             "order": None}


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


_BASE_KEYS = ("do_sample", "temperature", "top_k", "top_p", "max_new_tokens")


def _id_list(v: Any, path: str, line: int, key: str, nonempty: bool = True) -> tuple[int, ...]:
    if not isinstance(v, list) or (nonempty and not v) or not all(_is_int(t) and t >= 0 for t in v):
        raise _fail(path, line, key, f"must be a {'non-empty ' if nonempty else ''}list of int ids >= 0, got "
                                     f"{json.dumps(v)}")
    return tuple(v)


def _processing(obj: dict[str, Any], path: str, line: int) -> dict[str, Any]:
    """The optional processing keys of ``sampling`` (module docstring, "Processing"), checked."""
    out: dict[str, Any] = {}
    k = "sampling."
    if obj.get("min_p") is not None:
        v = obj["min_p"]
        if not _is_num(v) or not 0 <= v <= 1:
            raise _fail(path, line, k + "min_p", f"must be null (off) or a number in [0, 1], got {v!r}")
        out["min_p"] = float(v)
    for key, lo in (("repetition_penalty", 0.0), ("presence_penalty", None), ("frequency_penalty", None)):
        if obj.get(key) is not None:
            v = obj[key]
            if not _is_num(v) or (lo is not None and not v > lo):
                raise _fail(path, line, k + key, f"must be a number{' > 0' if lo is not None else ''}, got {v!r}")
            out[key] = float(v)
    if obj.get("penalty_last_n") is not None:
        v = obj["penalty_last_n"]
        if not _is_int(v) or v < -1:
            raise _fail(path, line, k + "penalty_last_n", f"must be null or an int >= -1 (-1: every id), got {v!r}")
        out["penalty_last_n"] = None if v == -1 else v
    if obj.get("logit_bias") is not None:
        v = obj["logit_bias"]
        if not isinstance(v, dict):
            raise _fail(path, line, k + "logit_bias", f"must be an object {{\"id\": bias}}, got {json.dumps(v)}")
        pairs = []
        for i, b in v.items():
            if not (isinstance(i, str) and i.isdigit()) or not _is_num(b):
                raise _fail(path, line, k + "logit_bias", f"entry {i!r}: {b!r}: keys are ids written as decimal "
                                                          "strings, values finite numbers")
            pairs.append((int(i), float(b)))
        out["logit_bias"] = tuple(sorted(pairs))
    if obj.get("bad_words_ids") is not None:
        v = obj["bad_words_ids"]
        if not isinstance(v, list):
            raise _fail(path, line, k + "bad_words_ids", f"must be a list of id lists, got {json.dumps(v)}")
        out["bad_words_ids"] = tuple(_id_list(w, path, line, k + "bad_words_ids") for w in v)
    if obj.get("allowed_token_ids") is not None:
        out["allowed_token_ids"] = tuple(sorted(set(_id_list(obj["allowed_token_ids"], path, line,
                                                             k + "allowed_token_ids"))))
    if obj.get("min_tokens") is not None:
        v = obj["min_tokens"]
        if not _is_int(v) or v < 0:
            raise _fail(path, line, k + "min_tokens", f"must be an int >= 0, got {v!r}")
        out["min_tokens"] = v
    if obj.get("stop") is not None:
        v = obj["stop"]
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise _fail(path, line, k + "stop", f"must be a non-empty string or a list of them, got {json.dumps(v)}")
        out["stop"] = tuple(v)
    if obj.get("order") is not None:
        v = obj["order"]
        if v not in ORDERS:
            raise _fail(path, line, k + "order", f"is {v!r}; one of {', '.join(map(repr, ORDERS))} (the engine whose "
                                                 "order of processing stages the draws followed)")
        out["order"] = v
    extra = sorted(set(out) - {"order"})
    if extra and "order" not in out:
        raise _fail(path, line, k + "order", f"missing: {', '.join(extra)} set, and the law depends on the order in "
                                             f"which the engine applies its stages; give one of {', '.join(ORDERS)}")
    return out


def _sampling(obj: Any, path: str, line: int) -> Sampling:
    if not isinstance(obj, dict):
        raise _fail(path, line, "sampling", f"must be an object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(_BASE_KEYS) - set(PROCESSING_KEYS))
    if unknown:
        raise _fail(path, line, f"sampling.{unknown[0]}", "is not a setting hsd models, and it may change the law the "
                                                          "draws follow: refused rather than ignored (hsd reads "
                                                          f"{', '.join(_BASE_KEYS + PROCESSING_KEYS)}); remove it only "
                                                          "if the engine did not apply it")
    for req in ("do_sample", "max_new_tokens"):
        if req not in obj:
            raise _fail(path, line, f"sampling.{req}", "missing")
    ds = obj["do_sample"]
    if not isinstance(ds, bool):
        raise _fail(path, line, "sampling.do_sample", f"must be true or false, got {ds!r}")
    mnt = obj["max_new_tokens"]
    if not _is_int(mnt) or mnt < 1:
        raise _fail(path, line, "sampling.max_new_tokens", f"must be an int >= 1, got {mnt!r}")
    proc = _processing(obj, path, line)
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
        return Sampling(True, float(t), k, None if p is None else float(p), mnt, **proc)
    proc.pop("min_p", None)  # greedy: no meaning, as temperature, top-k and top-p
    return Sampling(False, 1.0, None, None, mnt, **proc)


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


class LineChecker:
    """The rules of a samples file, line by line (what :func:`parse_samples` applies to each line):
    :meth:`check` validates one line and returns its draw. The first line checked has its shared
    settings (engine, speculative, sampling, target) validated; every later line must hold the same
    ones (a dictionary comparison: "mixed settings" otherwise) and its own fields are validated. Seeds
    repeated across lines are :func:`parse_samples`'s check, not this one's. What
    :class:`hsd_core.samples.SamplesAppender` runs on each line it writes."""

    def __init__(self, path: str = "<samples>") -> None:
        self.path = path
        self.first: dict[str, Any] | None = None
        self.first_line = 0
        self.sampling: Sampling | None = None

    def check(self, raw: str, no: int) -> Draw:
        """The draw of line ``raw`` (line number ``no``), validated; :class:`SamplesFormatError` at the
        first rule it breaks."""
        path = self.path
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise _fail(path, no, None, f"not valid JSON ({e.msg} at column {e.colno}): one JSON object per line") \
                from None
        except RecursionError:
            raise _fail(path, no, None, "JSON nested too deeply: a draw is a flat object of lists of ids") from None
        d = _draw(obj, path, no)
        if self.first is None:
            _engine(obj["engine"], path, no)
            _speculative(obj["speculative"], path, no)
            self.sampling = _sampling(obj["sampling"], path, no)
            self.first, self.first_line = {k: obj.get(k) for k in _SHARED}, no
        else:
            for k in _SHARED:
                if obj.get(k) != self.first[k]:
                    raise _fail(path, no, k, f"mixed settings: {json.dumps(obj.get(k))} here, "
                                             f"{json.dumps(self.first[k])} on line {self.first_line}; write one file "
                                             "per setting")
        return d


def parse_samples(lines: Iterable[str], path: str = "<samples>") -> SamplesFile:
    """Validate the lines of a samples file (module docstring) and return it as a
    :class:`SamplesFile`; blank lines are skipped. Raises :class:`SamplesFormatError` (one line
    naming ``path``, the line number and the key) at the first rule broken."""
    draws: list[Draw] = []
    check = LineChecker(path)
    seen: dict[int, int] = {}
    for no, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        if len(draws) >= MAX_DRAWS:
            raise _fail(path, no, None, f"more than {MAX_DRAWS:,} draws: hsd reads at most MAX_DRAWS per file (split "
                                        "the file; an audit needs far fewer)")
        d = check.check(raw, no)
        if d.seed is not None:
            if d.seed in seen:
                raise _fail(path, no, "seed", f"{d.seed} repeats line {seen[d.seed]}: a repeated seed is not an "
                                              "independent draw; give every draw its own seed")
            seen[d.seed] = no
        draws.append(d)
    first, sampling = check.first, check.sampling
    if first is None or sampling is None:
        raise _fail(path, 0, None, "holds no draws: one JSON object per line, one line per draw")
    return SamplesFile(path=path, engine=first["engine"], speculative=first["speculative"], sampling=sampling,
                       draws=tuple(draws), target=first["target"])
