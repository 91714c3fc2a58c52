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

from hsd_core.samples import Sampling, SamplesFile

__all__ = ["Case", "Engine", "EngineRefused"]


class EngineRefused(RuntimeError):
    """The engine does not run this case (its own message, one line): recorded as a refusal."""


@dataclass(frozen=True)
class Case:
    """One cell of the matrix: ``kit`` the folder ``hsd conformance kit`` wrote; ``prompt_ids`` the
    target's ids (BOS first); ``sampling`` the processing; ``mode`` the speculative method
    (``"none"``: the null control; others are engine-specific names, e.g. ``"ngram"``,
    ``"draft"``, ``"tli"``); ``drafter`` the kit role of the drafter (``"drafter"``: the target's
    vocabulary, ``"drafter_sp"``: another tokenizer; None without one); ``settings`` the mode's
    options (``num_speculative_tokens``, ...)."""

    kit: Path
    prompt_ids: tuple[int, ...]
    sampling: Sampling
    mode: str = "none"
    drafter: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        """One short line naming the case."""
        spec = self.mode if self.drafter is None else f"{self.mode} ({self.drafter})"
        return f"{spec}, {self.sampling.describe()}, prompt {list(self.prompt_ids)}"


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
