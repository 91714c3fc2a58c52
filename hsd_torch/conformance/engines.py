"""What the conformance matrix asks of an engine: one small protocol, so each engine (hsd_torch,
transformers, vLLM, llama.cpp's server, a samples file) is an adapter of its own.

A :class:`Case` is one cell of the matrix: a prompt of the kit, a processing
(:class:`hsd_core.samples.Sampling`, whose ``order`` names the engine order its reference law
follows), a speculative mode (``"none"`` for the null control) and that mode's settings. An
:class:`Engine` draws ``len(seeds)`` completions of a case, one per seed, and returns them as a
:class:`hsd_core.samples.SamplesFile` (written to ``out`` as they arrive when ``out`` is given, so a
run that stops keeps its draws). An engine that does not offer a case (a mode it lacks, a parameter
it refuses with speculation) raises :class:`EngineRefused` with the engine's own message; anything
else it raises is a crash. Both are results of the matrix, never verdicts.

**Progress.** An engine may have an ``on_draw`` attribute (None by default): the matrix sets it to a
callable for the length of a :meth:`Engine.sample` call, and the engine calls it with ``k`` as ``k``
more draws arrive (the resumed ones first), so the run's bar moves within a cell. The matrix tops
the bar up to the draws returned when an engine reports none (a worker that writes its file alone).

:class:`KitEngine` is what the in-process engines (hsd_torch, transformers) share: the kit's
checkpoints loaded once per role, and :meth:`KitEngine.collect`, the loop that resumes a file,
draws the missing seeds a chunk at a time (in this process, or in worker processes that return each
chunk's draws in order), appends each draw as it arrives and reports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hsd_core.samples import (
    Draw, Sampling, SamplesAppender, SamplesFile, format_draw, parse_samples, read_samples, recover_samples,
)
from hsd_core.samples_format import LineChecker

__all__ = ["Case", "Engine", "EngineRefused", "KitEngine", "resume"]


class EngineRefused(RuntimeError):
    """The engine does not run this case (its own message, one line): recorded as a refusal."""


@dataclass(frozen=True)
class Case:
    """One cell of the matrix: ``kit`` the folder ``hsd conformance kit`` wrote; ``prompt_ids`` the
    target's ids (BOS first); ``sampling`` the processing; ``mode`` the speculative method
    (``"none"``: the null control; others are engine-specific names, e.g. ``"ngram"``,
    ``"draft"``, ``"tli"``); ``drafter`` the kit role of the drafter (``"drafter"``: the target's
    vocabulary, ``"drafter_sp"``: another tokenizer; None without one); ``settings`` the mode's
    options (``num_speculative_tokens``, ...); ``target`` the kit role of the target (``"target"``, or
    ``"target_pos"``: the target whose law depends on position ids, :mod:`hsd_core.conformance`)."""

    kit: Path
    prompt_ids: tuple[int, ...]
    sampling: Sampling
    mode: str = "none"
    drafter: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    target: str = "target"

    def label(self) -> str:
        """One short line naming the case."""
        spec = self.mode if self.drafter is None else f"{self.mode} ({self.drafter})"
        on = "" if self.target == "target" else f", target {self.target}"
        return f"{spec}, {self.sampling.describe()}, prompt {list(self.prompt_ids)}{on}"


class Engine(Protocol):
    """An engine the matrix drives (module docstring)."""

    name: str
    """``name version`` of the engine, as recorded in the samples files."""

    def modes(self) -> Sequence[str]:
        """The speculative modes it offers (``"none"`` first)."""
        ...

    def sample(self, case: Case, seeds: Sequence[int], out: Path | None = None) -> SamplesFile:
        """``len(seeds)`` draws of ``case``, one per seed, in seed order; :class:`EngineRefused` if
        the engine does not run the case."""
        ...

    def close(self) -> None:
        """Stop what the engine started (servers, workers)."""
        ...


def resume(out: Path | None, seeds: Sequence[int]) -> tuple[list[Draw], list[int]]:
    """The draws a run already appended to ``out`` (None, or no file: none) and the seeds still to
    draw, in order: an engine adapter calls this first so an interrupted run goes on where it stopped
    (:func:`hsd_core.samples.recover_samples`). A file holding a seed outside ``seeds`` is refused
    (``ValueError``: it belongs to another run)."""
    got = recover_samples(out) if out is not None else None
    if got is None:
        return [], list(seeds)
    done = [d for d in got.draws]
    have = {d.seed for d in done}
    extra = {x for x in have if x is not None} - set(seeds)
    if extra:
        raise ValueError(f"{out}: holds draws of seeds {sorted(extra)[:3]} outside this run's; delete it or pick "
                         "another --out")
    return done, [s for s in seeds if s not in have]


class KitEngine:
    """The part the in-process engines share (module docstring): ``kit`` the kit folder, its
    checkpoints loaded at first use with transformers in float32 (:meth:`_load`, one model and
    tokenizer per role), ``on_draw`` the matrix's progress hook and :meth:`collect`."""

    on_draw: Callable[[int], None] | None = None

    def __init__(self, kit: Path) -> None:
        self.kit = Path(kit)
        self._models: dict[str, tuple[Any, Any]] = {}

    def _load(self, role: str) -> tuple[Any, Any]:
        """The kit's ``role`` as ``(model, tokenizer)``: transformers, float32, eval mode; loaded once."""
        if role not in self._models:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            model: Any = AutoModelForCausalLM.from_pretrained(self.kit / role, dtype=torch.float32)
            model.eval()
            self._models[role] = (model, AutoTokenizer.from_pretrained(self.kit / role))
        return self._models[role]

    def _report(self, k: int) -> None:
        if self.on_draw is not None and k > 0:
            self.on_draw(k)

    def collect(self, out: Path | None, seeds: Sequence[int], shared: Mapping[str, Any],
                draw: Callable[[list[int]], Iterable[Draw]], chunk: int = 1, label: str = "<engine>",
                map_chunks: Callable[[list[list[int]]], Iterable[Iterable[Draw]]] | None = None) -> SamplesFile:
        """The draws of ``seeds`` as a :class:`SamplesFile`: those ``out`` already holds (:func:`resume`),
        then ``draw(seeds)`` for the missing ones ``chunk`` seeds at a time, in order, each draw
        appended to ``out`` as it arrives (or kept in memory without ``out``: the file is then named
        ``label``) and reported to :attr:`on_draw`. ``shared``: each line's ``engine``, ``sampling``,
        ``speculative`` and ``target``. ``map_chunks`` (None: ``draw`` on each chunk in turn, here):
        the chunks' draws, in chunk order, however it makes them (e.g. worker processes).

        The draws come back from memory (``line`` 0), not re-read from ``out``: every draw was
        validated as it arrived, from these same ``shared`` settings (as a line of ``out`` by
        :class:`~hsd_core.samples.SamplesAppender`, or by the same line rules,
        :class:`~hsd_core.samples_format.LineChecker`, without ``out``), so a malformed draw is refused
        on either path; a resumed file is read back whole, so that settings it holds from another
        run are refused (mixed settings) as :func:`~hsd_core.samples.read_samples` refuses them."""
        if len(set(seeds)) != len(seeds):
            raise ValueError("seeds repeat: a repeated seed is not an independent draw")
        done, todo = resume(out, seeds)
        self._report(len(done))
        made: list[Draw] = []
        app = SamplesAppender(out, **shared) if out is not None else None
        check = LineChecker(label) if out is None else None
        step = max(1, chunk)
        chunks = [list(todo[k:k + step]) for k in range(0, len(todo), step)]
        try:
            for got in (map_chunks(chunks) if map_chunks is not None else map(draw, chunks)):
                k = len(made)
                for d in got:
                    if app is not None:
                        app.append(d)
                    elif check is not None:  # validated as the appender validates its lines
                        check.check(format_draw(d, **shared), len(made) + 1)
                    made.append(d)
                self._report(len(made) - k)
        finally:
            if app is not None:
                app.close()
        if out is not None and done:
            return read_samples(out)
        if not made:  # nothing drawn: the file as parsed (an empty one is refused there)
            return read_samples(out) if out is not None else parse_samples([], label)
        first = parse_samples([format_draw(made[0], **shared)], label)  # the shared settings, validated
        return dataclasses.replace(first, path=str(out) if out is not None else label, draws=tuple(made))

    def close(self) -> None:
        self._models.clear()
