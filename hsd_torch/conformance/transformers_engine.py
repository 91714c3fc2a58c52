"""transformers' own ``generate`` as a conformance engine over the kit: its sampling as the null
control (mode ``"none"``), assisted generation with the same-vocabulary drafter (``"assisted"``,
``num_assistant_tokens`` fixed, schedule ``constant``), and universal assisted generation with the
SentencePiece-style drafter (``"uag"``: ``assistant_tokenizer`` given; with sampling transformers
runs its universal speculative decoding, USD). transformers 5.25 as installed, unpatched: its known
USD and cache faults (bench/transformers_uag_patch.py, docs/auditing-transformers.md) show as what
they are, lossy or crashed.

Processing in transformers' order (:mod:`hsd_core.processing`): temperature, top-k (0: off), top-p,
min-p, repetition penalty, ``sequence_bias`` for logit bias, ``bad_words_ids``, ``min_new_tokens``,
stop strings; presence / frequency penalties and allowed ids are refused. One draw per call (assisted
generation takes one row), seeded with ``torch.manual_seed(seed)``. Acceptance is not measured
(transformers reports no counts per draw).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hsd_core import conformance as kc
from hsd_core.samples import Draw, SamplesFile

from .engines import Case, EngineRefused, KitEngine

__all__ = ["TransformersEngine"]

MODES = {"none": None, "assisted": "drafter", "uag": "drafter_sp"}


class TransformersEngine(KitEngine):
    """The engine (module docstring) over the kit folder ``kit``."""

    order = "transformers"

    def __init__(self, kit: Path) -> None:
        import transformers

        super().__init__(kit)
        self.version = transformers.__version__
        self.name = f"transformers {self.version}"

    def modes(self) -> Sequence[str]:
        return tuple(MODES)

    def kwargs(self, case: Case) -> dict[str, Any]:
        """``generate``'s keyword arguments for ``case``'s processing (:class:`EngineRefused` for what
        transformers does not offer)."""
        s = case.sampling
        if s.order not in (None, "transformers"):
            raise EngineRefused(f"transformers applies its own order of processing, not {s.order}'s")
        for key in ("presence_penalty", "frequency_penalty", "allowed_token_ids", "penalty_last_n"):
            if key in s.processing():
                raise EngineRefused(f"transformers' generate has no {key}")
        kw: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, "do_sample": s.do_sample,
                              "eos_token_id": kc.EOS, "pad_token_id": kc.PAD}
        if s.do_sample:
            kw.update(temperature=s.temperature, top_k=s.top_k or 0, top_p=1.0 if s.top_p is None else s.top_p)
            if s.min_p is not None:
                kw["min_p"] = s.min_p
        if s.repetition_penalty != 1.0:
            kw["repetition_penalty"] = s.repetition_penalty
        if s.logit_bias:
            kw["sequence_bias"] = {(i,): b for i, b in s.logit_bias}
        if s.bad_words_ids:
            kw["bad_words_ids"] = [list(w) for w in s.bad_words_ids]
        if s.min_tokens:
            kw["min_new_tokens"] = s.min_tokens
        if s.stop:
            kw["stop_strings"] = list(s.stop)
        return kw

    def sample(self, case: Case, seeds: Sequence[int], out: Path | None = None) -> SamplesFile:
        import torch

        if case.mode not in MODES:
            raise EngineRefused(f"transformers has no mode {case.mode!r} here (it offers {', '.join(MODES)})")
        kw = self.kwargs(case)
        target, ttok = self._load(case.target)
        extra: dict[str, Any] = {}
        role = MODES[case.mode]
        if case.sampling.stop or role == "drafter_sp":
            extra["tokenizer"] = ttok
        if role is not None:
            drafter, dtok = self._load(role)
            k = int(case.settings.get("num_speculative_tokens", 3))
            drafter.generation_config.num_assistant_tokens = k
            drafter.generation_config.num_assistant_tokens_schedule = "constant"
            drafter.generation_config.assistant_confidence_threshold = 0.0
            extra["assistant_model"] = drafter
            if role == "drafter_sp":
                extra["assistant_tokenizer"] = dtok
        spec = None if role is None else {"method": case.mode, "drafter": role,
                                          "num_speculative_tokens": int(case.settings.get("num_speculative_tokens", 3))}
        shared: dict[str, Any] = dict(engine={"name": "transformers", "version": self.version},
                                      sampling=case.sampling, speculative=spec, target=f"conformance-kit/{case.target}")
        x = torch.tensor([list(case.prompt_ids)])

        def draw(chunk: list[int]) -> list[Draw]:
            seed = int(chunk[0])  # one draw per call: chunks of one seed
            torch.manual_seed(seed)
            with torch.inference_mode():
                o = target.generate(x, attention_mask=torch.ones_like(x), **kw, **extra)
            ids = [int(t) for t in o[0, x.shape[1]:]]
            if kc.EOS in ids:
                ids = ids[:ids.index(kc.EOS) + 1]
            return [Draw(tuple(i for i in ids if i != kc.PAD), seed=seed, prompt_ids=tuple(case.prompt_ids))]

        return self.collect(out, seeds, shared, draw, 1, "<transformers>")
