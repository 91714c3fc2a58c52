"""vLLM's worker jobs, from hsd: which Python runs vLLM, the ``sample`` job's parts, and the job run.

:func:`find_python` finds vLLM's own venv's Python (vLLM pins its own torch and transformers, so hsd never
imports it); :func:`spec_entry`, :func:`file_entry` and :func:`build_job` make the worker's ``sample``
job (:mod:`hsd_torch.engines.vllm_worker`'s module docstring says its format); :func:`sample` runs it in
a guarded process group and reports the draws as the worker appends them. :mod:`hsd_torch.engines.vllm_audit`
(``hsd audit vllm``) re-exports every name here.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._procs import guarded, log_tail, stop_group

__all__ = ["PYTHON_ENV", "SETUP", "SPEC_METHODS", "VllmUnavailable", "WORKER", "WORKER_TAIL", "build_job",
           "file_entry", "find_python", "model_folder", "sample", "spec_entry"]

PYTHON_ENV = "HSD_VLLM_PYTHON"
"""The environment variable naming vLLM's Python (when ``--vllm-python`` is not given)."""
SETUP = "bench/engines/setup_vllm.sh"
WORKER = Path(__file__).with_name("vllm_worker.py")
"""The worker script, run by vLLM's Python (it imports nothing of hsd)."""
SPEC_METHODS = ("none", "ngram", "draft_model", "tli")


class VllmUnavailable(RuntimeError):
    """No usable vLLM Python (the message says how to get one), or the worker failed (the message
    holds the last lines of its log)."""


def find_python(given: str | None = None) -> str:
    """vLLM's Python: ``given`` (``--vllm-python``), else ``$HSD_VLLM_PYTHON``; it must be an
    executable file. :class:`VllmUnavailable` with one line saying how to build it otherwise."""
    path = given or os.environ.get(PYTHON_ENV)
    if not path:
        raise VllmUnavailable(f"no vLLM Python: give --vllm-python PATH or set {PYTHON_ENV} (build one with {SETUP}, "
                              "then VENV/bin/python)")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise VllmUnavailable(f"vLLM Python {path!r} is not an executable file (build one with {SETUP})")
    return path


def model_folder(name_or_path: str) -> str:
    """A checkpoint folder vLLM can load: a real model's name (:mod:`hsd_torch.models.real`,
    converted to safetensors first if needed), else the path itself."""
    from ..models import real as real_models

    if (name := real_models.named(name_or_path)) is not None:
        return str(real_models.folder(name))
    return name_or_path


def spec_entry(method: str, drafter: str | None, drafter_name: str | None = None, *, num_speculative_tokens: int = 4,
               draft_sample_method: str | None = None, rejection_sample_method: str | None = None
               ) -> dict[str, Any] | None:
    """The worker's ``speculative`` entry (also what the samples file records) for ``method``
    (:data:`SPEC_METHODS`; ``none`` gives None). ``drafter``: the drafter's folder (draft_model,
    tli); ``drafter_name``: what the file calls it (default: the folder)."""
    if method not in SPEC_METHODS:
        raise ValueError(f"speculative method {method!r}: one of {', '.join(SPEC_METHODS)}")
    if method == "none":
        return None
    out: dict[str, Any] = {"method": method, "num_speculative_tokens": int(num_speculative_tokens)}
    if method != "ngram":
        if drafter is None:
            raise ValueError(f"speculative method {method} needs a drafter (--drafter)")
        out.update(model=drafter, drafter=drafter_name or drafter)
        if draft_sample_method is not None:
            out["draft_sample_method"] = draft_sample_method
        if rejection_sample_method is not None:
            out["rejection_sample_method"] = rejection_sample_method
    elif draft_sample_method is not None or rejection_sample_method is not None:
        raise ValueError("--draft-sample-method and --rejection-sample-method need a drafter (draft_model or tli)")
    return out


def file_entry(prompt_ids: Sequence[Sequence[int]], prompts: Sequence[str | None], seeds: Sequence[int], out: str,
               *, do_sample: bool, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
               max_new_tokens: int = 32, resume: bool = False, processing: dict[str, Any] | None = None
               ) -> dict[str, Any]:
    """One samples file of a worker job: draw ``i`` conditions on ``prompt_ids[i % len]`` (recorded
    with the text ``prompts[i % len]``), is seeded with ``seeds[i]`` (distinct) and sampled with the
    given settings (``do_sample=False``: greedy); the draws are appended to ``out`` as they come
    (``resume``: keep the draws ``out`` holds and sample only the missing seeds; the worker's
    module docstring); ``processing``: the other keys of the draws' ``sampling``
    (:meth:`hsd_core.samples.Sampling.processing`, e.g. ``min_p``, ``logit_bias``, ``stop``), which the
    worker passes to vLLM (``vllm_worker.sampling_kwargs``) and records."""
    if not prompt_ids or len(prompt_ids) != len(prompts):
        raise ValueError("give one list of prompt ids per prompt (and at least one)")
    if len(set(seeds)) != len(seeds):
        raise ValueError("the seeds of a samples file must be distinct (a repeated seed is not an independent draw)")
    reqs = [{"prompt": prompts[i % len(prompts)], "prompt_ids": [int(t) for t in prompt_ids[i % len(prompt_ids)]],
             "seed": int(s)} for i, s in enumerate(seeds)]
    entry: dict[str, Any] = {"out": out, "requests": reqs,
            "sampling": {"do_sample": do_sample, "temperature": float(temperature), "top_k": top_k or None,
                         "top_p": top_p, "max_new_tokens": int(max_new_tokens),
                         **{k: v for k, v in (processing or {}).items() if k != "order"}}}
    if resume:
        entry["resume"] = True
    return entry


def build_job(target: str, files: Sequence[dict[str, Any]], speculative: dict[str, Any] | None, *,
              target_name: str | None = None, dtype: str = "float32", max_model_len: int = 1024,
              patch_vllm_cpu_expand: bool = False) -> dict[str, Any]:
    """The worker's ``sample`` job: one engine serving the folder ``target`` with ``speculative``
    (:func:`spec_entry`), sampling each of ``files`` (:func:`file_entry`) in turn;
    ``patch_vllm_cpu_expand``: run vLLM with hsd's fix of its CPU expand kernel
    (``vllm_worker.patch_cpu_expand``; docs/auditing-engines.md)."""
    if not files:
        raise ValueError("a job needs at least one file")
    job = {"model": target, "target": target_name or target, "dtype": dtype, "max_model_len": max_model_len,
           "speculative": speculative, "files": list(files)}
    if patch_vllm_cpu_expand:
        job["patch_vllm_cpu_expand"] = True
    return job


WORKER_TAIL = 3
"""Lines of a worker's log in its error message (:func:`~hsd_torch.engines._procs.log_tail`): a
traceback's last lines name the error."""


class _NewLines:
    """The lines appended to a file since the last call (the worker appends each chunk of draws)."""

    def __init__(self, path: str) -> None:
        self.path, self.offset = path, 0

    def __call__(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return 0
        whole = data.rfind(b"\n") + 1  # a line still being written is counted once it is whole
        self.offset += whole
        return data[:whole].count(b"\n")


def sample(python: str, job: dict[str, Any], log: str | None = None, timeout: float | None = None,
           on_draw: Callable[[int], None] | None = None, poll: float = 1.0) -> list[dict[str, Any]]:
    """Run the worker's ``sample`` mode on ``job`` (:func:`build_job`) with vLLM's ``python``; each
    samples file is written to its ``out``. Returns the worker's summary per file (``init_s``,
    ``generate_s``, ``tokens``, ``spec_stats``, ``version``); vLLM's log goes to ``log`` (default:
    the first file's ``out`` + ``.log``). :class:`VllmUnavailable` with the log's last lines if it
    fails. ``on_draw(k)``: called (every ``poll`` seconds while the worker runs, and at its end) with
    the number of draws its files gained, the ones a resumed file already holds first: a progress
    bar's ``update``."""
    log = log or job["files"][0]["out"] + ".log"
    counters = [_NewLines(f["out"]) for f in job["files"]] if on_draw is not None else []

    def report() -> None:
        k = sum(c() for c in counters)
        if on_draw is not None and k:
            on_draw(k)

    report()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
        path = f.name
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        with open(log, "w", encoding="utf-8") as err, tempfile.TemporaryFile() as out:
            proc = subprocess.Popen(guarded([python, str(WORKER), "sample", path]), stdout=out, stderr=err,
                                    start_new_session=True)
            try:
                while True:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise subprocess.TimeoutExpired(proc.args, timeout or 0.0)
                    try:
                        proc.wait(timeout=poll if left is None else min(poll, left))
                        break
                    except subprocess.TimeoutExpired:
                        report()
            except BaseException:  # a timeout or an interrupt: vLLM's engine processes go with the worker
                stop_group(proc, grace=10.0)
                raise
            report()
            out.seek(0)
            stdout = out.read()
    finally:
        os.unlink(path)
    if proc.returncode != 0:
        raise VllmUnavailable(f"the vLLM worker failed (exit status {proc.returncode}; log {log}): "
                              f"{log_tail(log, WORKER_TAIL)}")
    return [json.loads(ln) for ln in stdout.decode().splitlines() if ln.strip()]
