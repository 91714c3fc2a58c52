"""``hsd_torch.generate`` as a conformance engine: the kit's target and drafters loaded with
transformers in float32, AR as the null control (mode ``"none"``), SD with the same-vocabulary
drafter, TLI, SLEM and SLRS with the SentencePiece-style drafter.

Processing: ``generate`` applies temperature, top-k and top-p (in that order), transformers'
``min_new_tokens`` and stop strings; a case that sets anything else (min-p, penalties, logit bias,
bad words, allowed ids) or names an order other than transformers' is refused
(:class:`~hsd_torch.conformance.engines.EngineRefused`) with one line naming what.

Draws are made in batches of :attr:`HsdTorchEngine.batch` rows, ``generate(seed=s)`` with ``s`` the
batch's first seed (row ``j`` of the batch draws from ``SeedSequence(s).spawn(...)[j]``, so the rows
are independent); each draw records its own seed from the case's list, the batch's seed and row,
and the engine's counts for it (``new_tokens``, ``target_calls``, ``proposed``, ``accepted``), which
the acceptance test reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hsd_core.samples import Draw, SamplesFile

from .engines import Case, EngineRefused, KitEngine

__all__ = ["HsdTorchEngine", "METHOD_OF_MODE"]

METHOD_OF_MODE = {"none": "ar", "sd": "sd", "tli": "tli", "slem": "slem", "slrs": "slrs"}
"""The engine's modes and the ``generate`` method each runs."""

DEFAULT_DRAFTER = {"sd": "drafter", "tli": "drafter_sp", "slem": "drafter_sp", "slrs": "drafter_sp"}
SUPPORTED = ("min_tokens", "stop", "order")


def refusal(case: Case) -> str | None:
    """Why ``hsd_torch.generate`` does not run ``case``'s processing (None: it does)."""
    s = case.sampling
    other = [k for k in s.processing() if k not in SUPPORTED]
    if other:
        return (f"hsd_torch.generate applies temperature, top-k, top-p, min_new_tokens and stop strings only; "
                f"this case sets {', '.join(other)}")
    if s.order not in (None, "transformers"):
        return f"hsd_torch.generate follows transformers' order of processing, not {s.order}'s"
    return None


class HsdTorchEngine(KitEngine):
    """The engine (module docstring) over the kit folder ``kit``; models load at the first draw."""

    batch = 500
    order = "transformers"

    def __init__(self, kit: Path) -> None:
        import hsd_torch

        super().__init__(kit)
        self.name = f"hsd_torch {getattr(hsd_torch, '__version__', 'dev')}"

    def modes(self) -> Sequence[str]:
        return tuple(METHOD_OF_MODE)

    def lookahead(self, case: Case) -> int:
        """The drafts per round ``generate`` is asked for (``settings["num_speculative_tokens"]``;
        default 3, SLRS 1)."""
        return int(case.settings.get("num_speculative_tokens", 1 if case.mode == "slrs" else 3))

    def speculative(self, case: Case) -> dict[str, Any] | None:
        """The samples file's ``speculative`` object for ``case`` (None for the null control)."""
        if case.mode == "none":
            return None
        return {"method": case.mode, "drafter": case.drafter or DEFAULT_DRAFTER[case.mode],
                "num_speculative_tokens": self.lookahead(case)}

    def sample(self, case: Case, seeds: Sequence[int], out: Path | None = None) -> SamplesFile:
        import hsd_torch

        if case.mode not in METHOD_OF_MODE:
            raise EngineRefused(f"hsd_torch has no mode {case.mode!r} (it offers {', '.join(METHOD_OF_MODE)})")
        why = refusal(case)
        if why:
            raise EngineRefused(why)
        method = METHOD_OF_MODE[case.mode]
        target, ttok = self._load(case.target)
        drafter, dtok = (None, None) if method == "ar" else self._load(case.drafter or DEFAULT_DRAFTER[case.mode])
        s = case.sampling
        shared: dict[str, Any] = dict(engine={"name": "hsd_torch", "version": self.name.split()[-1]},
                                      sampling=s, speculative=self.speculative(case), target=f"conformance-kit/{case.target}")

        def draw(chunk: list[int]) -> list[Draw]:
            o = hsd_torch.generate(target, drafter, input_ids=[list(case.prompt_ids)] * len(chunk),
                                   target_tokenizer=ttok, drafter_tokenizer=dtok, method=method,
                                   lookahead=self.lookahead(case), max_new_tokens=s.max_new_tokens,
                                   do_sample=s.do_sample, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                   seed=int(chunk[0]), min_new_tokens=s.min_tokens or None,
                                   stop_strings=list(s.stop) or None)
            return [Draw(tuple(int(i) for i in ids), seed=int(seed), prompt_ids=tuple(case.prompt_ids),
                         extra={"generate_seed": int(chunk[0]), "row": j, "new_tokens": st.new_tokens,
                                "target_calls": st.target_calls, "proposed": st.proposed, "accepted": st.accepted})
                    for j, (seed, ids, st) in enumerate(zip(chunk, o.sequences, o.stats))]

        return self.collect(out, seeds, shared, draw, self.batch, "<hsd_torch>")
