"""The samples-file engine: draws any other engine wrote (format ``hsd-samples/1``) audited against the
kit's exact law in the order the file's ``sampling.order`` names.

Each file becomes one case per prompt it holds (its ``prompt_ids`` must be the kit target's ids, BOS
first); the file's ``speculative.method`` (None: ``"none"``) is the case's mode, and its ``target``
(``conformance-kit/ROLE``, as the kit's engines write it) names the kit target it is audited against
(``target`` where the file names none or another model). :meth:`sample`
returns the file's draws of that prompt, whatever the seeds asked: the draws are what they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from hsd_core.samples import SamplesFile, read_samples

from .engines import Case, EngineRefused

__all__ = ["SamplesFileEngine"]


class SamplesFileEngine:
    """The engine over the samples files ``paths`` (read once, validated: a file that breaks the
    format raises :class:`hsd_core.samples.SamplesFormatError` at construction)."""

    name = "samples-file"
    order = "vllm"

    def __init__(self, paths: Sequence[Path]) -> None:
        self.files = [read_samples(p) for p in paths]

    def modes(self) -> Sequence[str]:
        return tuple(dict.fromkeys(self._mode(f) for f in self.files))

    @staticmethod
    def _mode(f: SamplesFile) -> str:
        return "none" if f.speculative is None else str(f.speculative.get("method", "speculative"))

    @staticmethod
    def _target(f: SamplesFile) -> str:
        from hsd_core.conformance import ROLES

        role = (f.target or "").removeprefix("conformance-kit/")
        return role if role in ROLES and role.startswith("target") else "target"

    def cases(self, kit: Path) -> list[tuple[str, Case]]:
        """``(name, case)`` for each file and each prompt in it (name: the file's stem)."""
        out: list[tuple[str, Case]] = []
        for f in self.files:
            prompts = list(dict.fromkeys(d.prompt_ids for d in f.draws))
            for p in prompts:
                if p is None:
                    raise EngineRefused(f"{f.path}: a draw without prompt_ids; the kit's audit needs the target's ids")
                out.append((Path(f.path).stem, Case(kit, tuple(p), f.sampling, self._mode(f),
                                                    settings={"file": f.path}, target=self._target(f))))
        return out

    def sample(self, case: Case, seeds: Sequence[int], out: Path | None = None) -> SamplesFile:
        path = case.settings.get("file")
        for f in self.files:
            if f.path == path:
                return replace(f, draws=tuple(d for d in f.draws if d.prompt_ids == case.prompt_ids))
        raise EngineRefused(f"no samples file {path!r} was given")

    def close(self) -> None:
        pass
