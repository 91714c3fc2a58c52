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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hsd_core.samples import Draw, Sampling, SamplesFile, recover_samples

__all__ = ["Case", "Engine", "EngineRefused", "resume"]


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
