"""The vLLM side of ``hsd audit vllm``: a script run by **vLLM's own Python** (its venv pins
another torch and transformers than hsd's, so hsd never imports vLLM; it runs this file as
``VLLM_PYTHON vllm_worker.py MODE JOB.json`` and talks to it across the process boundary).

This file imports only the standard library, numpy and (inside the functions that need it) vLLM,
so it runs without hsd installed, and hsd's tests import its pure parts without vLLM.

Modes
-----
``sample JOB.json``
    Drives ``vllm.LLM`` offline: one engine (the target, with the job's speculative config or
    none) started once for the job's ``files``, each a sampling setting, its requests and its
    ``out`` path. Every request is seeded with its own ``SamplingParams(seed=...)``; a file's
    requests go in ``generate`` calls of ``chunk`` requests (default :data:`CHUNK`; vLLM batches
    them; each row keeps its own seeded generator, so the chunking changes no draw), and each
    chunk's lines are **appended** to ``out`` as soon as it returns (one ``write`` per line: the
    file is a valid samples file at every moment, and an interrupted run keeps every chunk it
    finished). A file entry with ``"resume": true`` keeps the lines ``out`` already holds (same
    shared settings, seeds of its requests; a last line cut short by a crash is dropped) and asks
    vLLM only for the missing seeds; a finished file is rewritten in request order (atomically).
    Writes each samples file (JSONL, format ``hsd-samples/1``:
    docs/auditing-engines.md): one line per request, the prompt ids the engine conditioned on (``TokensPrompt``), the new ids
    (with the end id when it stopped on one), the seed, the sampling and speculative settings, and
    under ``spec_stats`` vLLM's speculative-decoding counters accrued while the file was sampled
    (its Prometheus metrics ``vllm:spec_decode_num_drafts`` / ``num_draft_tokens`` /
    ``num_accepted_tokens`` / ``num_accepted_tokens_per_pos``, ``scope: "file"``: accrued while
    the chunk of the line was sampled, the same on every line of a chunk). Prints one JSON summary
    line per file (seconds, counters of the whole file, draws resumed) on its result channel.

``laws JOB.json``
    The engine's own teacher-forced law: one engine without speculation (``max_logprobs=-1``),
    kept alive. Each request line on stdin, ``{"pairs": [[prompt_ids, ids], ...]}``, is answered on
    the result channel with a JSON header line ``{"shapes": [[len(ids), V], ...], "dtype":
    "float32"}`` followed by the arrays' raw little-endian bytes, row ``j`` of pair ``i`` being
    vLLM's log-probabilities of the next token given ``prompt_ids + ids[:j]``: the
    ``prompt_logprobs=-1`` (full vocabulary) of the prompt ``prompt_ids + ids``. A failing request
    is answered ``{"error": "..."}``. The worker exits when stdin closes.

    These prompt log-probs are **raw** in vLLM 0.32: ``GPUModelRunner._get_prompt_logprobs_dict``
    takes ``model.compute_logits`` of the prompt's hidden states and ``Sampler.compute_logprobs``
    (``log_softmax`` in float32); no temperature, top-k, top-p or penalty touches them (with the
    default ``logprobs_mode="raw_logprobs"``, which the worker sets explicitly). vLLM would turn
    them into one Python ``dict`` of ``Logprob`` objects per position (1.3 s per position for a
    49k vocabulary, measured); the worker replaces that step
    (``LogprobsProcessor._update_prompt_logprobs``) with a dense float32 row per position, so a
    request costs a prefill, a full-vocabulary sort in the engine and a copy.

The result channel is the worker's original stdout, kept on a private descriptor; fd 1 is pointed
at stderr before vLLM loads, so that nothing vLLM or its subprocesses print can corrupt it.

Environment (set only when unset): ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB of KV cache),
``VLLM_CPU_OMP_THREADS_BIND=nobind`` with ``OMP_NUM_THREADS=1`` (one thread, no core pinned:
the machine is shared). Engines run with ``enforce_eager=True``, prefix caching off (a cached
prefix would return no prompt log-probs), and Gemma-3 with speculation needs
``disable_hybrid_kv_cache_manager=True`` (set whenever a speculative config is given).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import IO, Any

ENV_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
SPEC_METRICS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos")
FORMAT = "hsd-samples/1"
PROCESSING_KEYS = ("min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "penalty_last_n",
                   "logit_bias", "bad_words_ids", "allowed_token_ids", "min_tokens", "stop")
"""``hsd_core.samples.PROCESSING_KEYS`` but ``order`` (this worker runs in vLLM's venv, without hsd)."""
CHUNK = 64
"""Requests per ``generate`` call of the sample mode (each chunk is written as soon as it returns)."""
_SHARED = ("format", "engine", "target", "speculative", "sampling")


def llm_kwargs(job: dict[str, Any]) -> dict[str, Any]:
    """The ``vllm.LLM(**kw)`` of a job: its ``model`` folder, ``dtype`` (default float32, the
    precision of hsd's transformers reference; vLLM's CPU default would be bfloat16),
    ``max_model_len``, the engine ``seed``, and ``speculative_config`` from :func:`speculative_config`."""
    kw: dict[str, Any] = {
        "model": job["model"], "dtype": job.get("dtype", "float32"), "enforce_eager": True,
        "max_model_len": int(job.get("max_model_len", 1024)), "seed": int(job.get("engine_seed", 0)),
        "enable_prefix_caching": False, "disable_log_stats": False, "logprobs_mode": "raw_logprobs",
    }
    if job.get("laws"):
        kw["max_logprobs"] = -1
    spec = speculative_config(job.get("speculative"))
    if spec is not None:
        kw["speculative_config"] = spec
        kw["disable_hybrid_kv_cache_manager"] = True
    return kw


def speculative_config(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` dict from a job's ``speculative`` entry (None: no speculation).

    ``{"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": m, "prompt_lookup_min": 1}``;
    ``{"method": "draft_model", "model": FOLDER, "num_speculative_tokens": k}``, optionally with
    ``draft_sample_method`` (``greedy``, vLLM's default, or ``probabilistic``) and
    ``rejection_sample_method`` (``standard`` or ``block``, or ``synthetic``: lossy by design);
    ``{"method": "tli", "model": FOLDER, ...}`` is the draft model with
    ``use_heterogeneous_vocab=True`` (vLLM's token-level intersection for another vocabulary).
    Unknown keys are passed through; ``drafter`` (a name for the record) is dropped."""
    if spec is None:
        return None
    cfg = {k: v for k, v in spec.items() if k != "drafter"}
    method = cfg.get("method")
    if method == "tli":
        cfg["method"] = "draft_model"
        cfg["use_heterogeneous_vocab"] = True
    elif method not in ("ngram", "draft_model"):
        raise ValueError(f"speculative method {method!r}: one of ngram, draft_model, tli")
    if cfg["method"] == "ngram":
        cfg.setdefault("prompt_lookup_max", 4)
        cfg.setdefault("prompt_lookup_min", 1)
    elif "model" not in cfg:
        raise ValueError(f"speculative method {method!r} needs a drafter folder under 'model'")
    cfg.setdefault("num_speculative_tokens", 4)
    return cfg


def sampling_kwargs(sampling: dict[str, Any], seed: int | None) -> dict[str, Any]:
    """``SamplingParams(**kw)`` for one request: greedy is ``temperature=0``; otherwise the
    temperature, ``top_k`` (None: 0, vLLM's "off") and ``top_p`` (None: 1.0). Every other key of a
    samples file's ``sampling`` (``hsd_core.samples.PROCESSING_KEYS``) is carried: ``min_p``,
    ``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``, ``logit_bias`` (ids as
    ints), ``allowed_token_ids``, ``min_tokens``, ``stop``; absent ones stay at vLLM's neutral
    default. ``bad_words_ids`` is refused (``ValueError``: vLLM takes bad words as strings, which it
    tokenizes itself), as are ``penalty_last_n`` (llama.cpp's) and an ``order`` other than vLLM's.
    EOS is honoured, and ids are not detokenized unless there are stop strings (vLLM matches them
    on the text)."""
    kw: dict[str, Any] = {"max_tokens": int(sampling["max_new_tokens"]), "seed": seed, "detokenize": False}
    if sampling.get("do_sample", True):
        kw.update(temperature=float(sampling.get("temperature", 1.0)),
                  top_k=int(sampling.get("top_k") or 0),
                  top_p=1.0 if sampling.get("top_p") is None else float(sampling["top_p"]))
        if sampling.get("min_p") is not None:
            kw["min_p"] = float(sampling["min_p"])
    else:
        kw.update(temperature=0.0)
    order = sampling.get("order")
    if order not in (None, "vllm"):
        raise ValueError(f"sampling order {order!r}: vLLM applies its own order ('vllm')")
    for key in ("bad_words_ids", "penalty_last_n"):
        if sampling.get(key) not in (None, [], ()):
            raise ValueError(f"sampling key {key!r}: vLLM has no such parameter (bad words are strings there; the "
                             "penalty window is llama.cpp's)")
    for key in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        if sampling.get(key) is not None:
            kw[key] = float(sampling[key])
    if sampling.get("logit_bias"):
        kw["logit_bias"] = {int(i): float(b) for i, b in dict(sampling["logit_bias"]).items()}
    if sampling.get("allowed_token_ids") is not None:
        kw["allowed_token_ids"] = [int(i) for i in sampling["allowed_token_ids"]]
    if sampling.get("min_tokens"):
        kw["min_tokens"] = int(sampling["min_tokens"])
    stop = sampling.get("stop")
    if stop:
        kw["stop"] = [stop] if isinstance(stop, str) else [str(x) for x in stop]
        kw["detokenize"] = True
    return kw


def record_settings(job: dict[str, Any], s: dict[str, Any], version: str) -> dict[str, Any]:
    """The keys every line of a samples file shares: format, engine, target, speculative (the
    job's entry with the drafter's folder replaced by its name when given), sampling (``s``)."""
    spec = job.get("speculative")
    if spec is not None:
        spec = dict(spec)
        if "drafter" in spec:
            spec.pop("model", None)
    sampling = {"do_sample": bool(s.get("do_sample", True)), "temperature": float(s.get("temperature", 1.0)),
                "top_k": s.get("top_k"), "top_p": s.get("top_p"), "max_new_tokens": int(s["max_new_tokens"])}
    extra = {k: v for k, v in s.items() if k in PROCESSING_KEYS and v is not None}
    if extra:  # every processing key the draws were made with, and vLLM's order
        sampling.update(extra)
        sampling["order"] = "vllm"
    engine = {"name": "vllm", "version": version}
    if job.get("dtype", "float32") != "float32":
        engine["dtype"] = str(job["dtype"])
    if job.get("patch_vllm_cpu_expand"):
        engine["patch"] = PATCH_NAME
    return {"format": FORMAT, "engine": engine, "target": job.get("target"), "speculative": spec, "sampling": sampling}


def records(settings: dict[str, Any], requests: list[dict[str, Any]], outputs: list[Any],
            spec_stats: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One samples-file record per request: ``settings`` (:func:`record_settings`), the request's
    seed, prompt text (if any) and ids, and from vLLM's ``RequestOutput`` (in request order) the
    new ids and the finish reason."""
    if len(outputs) != len(requests):
        raise ValueError(f"vLLM returned {len(outputs)} outputs for {len(requests)} requests")
    lines = []
    for req, out in zip(requests, outputs):
        comp = out.outputs[0]
        rec = dict(settings)
        rec["seed"] = req.get("seed")
        if req.get("prompt") is not None:
            rec["prompt"] = req["prompt"]
        rec["prompt_ids"] = [int(t) for t in out.prompt_token_ids]
        rec["ids"] = [int(t) for t in comp.token_ids]
        rec["finish_reason"] = comp.finish_reason
        if spec_stats is not None:
            rec["spec_stats"] = spec_stats
        lines.append(rec)
    return lines


def spec_stats(metrics: list[Any]) -> dict[str, Any]:
    """vLLM's speculative-decoding counters from ``LLM.get_metrics()`` (Counter ``value`` or
    Vector ``values``), keyed by the metric's name without its ``vllm:spec_decode_`` prefix, with
    ``scope: "run"`` (totals over the whole run, not per draw)."""
    out: dict[str, Any] = {"scope": "run"}
    for m in metrics:
        name = getattr(m, "name", "")
        if name in SPEC_METRICS:
            key = name[len("vllm:spec_decode_"):]
            val = getattr(m, "values", None)
            out[key] = [int(v) for v in val] if val is not None else int(getattr(m, "value", 0))
    drafted = out.get("num_draft_tokens")
    if drafted:
        out["acceptance_rate"] = out.get("num_accepted_tokens", 0) / drafted
    return out


def _result_channel() -> IO[bytes]:
    """The original stdout, kept for results; fd 1 then points at stderr."""
    ch = os.fdopen(os.dup(1), "wb")
    sys.stdout.flush()
    os.dup2(2, 1)
    return ch


def _version() -> str:
    import importlib.metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return str(_vllm("vllm").__version__)


def _vllm(module: str) -> Any:
    """Import a vLLM module (by name: hsd's type checker has no vLLM)."""
    import importlib

    return importlib.import_module(module)


def _llm(job: dict[str, Any]) -> Any:
    if job.get("patch_vllm_cpu_expand"):
        patch_cpu_expand()
    return _vllm("vllm").LLM(**llm_kwargs(job))


EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def expand_kernel_impl(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any, replace_to: Any,
                       MAX_NUM_TOKENS: Any = None) -> None:
    """What vLLM's Triton ``expand_kernel`` computes, for any dtype, in torch: request ``i``'s value
    ``input_val[i]`` (``replace_to`` where it equals ``replace_from``) written in place into
    ``output[cu_num_tokens[i-1]:cu_num_tokens[i]]`` (``output`` keeps its dtype; entries past
    ``cu_num_tokens[-1]`` are left as they are).

    The replacement for vLLM-cpu 0.32.0's ``cpu_triton_utils._expand_kernel_impl``, which hands the
    C++ kernel ``_ensure_int64(output)``: for a float32 or int32 ``output`` (the expanded
    temperature, top-p, top-k of ``RejectionSampler``) that is a converted copy, written and dropped,
    so ``output`` keeps the uninitialized memory of ``x.new_empty`` (and the float inputs were
    truncated to integers on the way in)."""
    import torch

    cu = cu_num_tokens.to(torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    src = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    n = int(cu[-1]) if cu.numel() else 0
    output[:n].copy_(torch.repeat_interleave(src, counts).to(output.dtype))


PATCH_NAME = "cpu-expand+reject-placeholders"
"""``engine.patch`` of a samples file drawn with hsd's patch (job key ``patch_vllm_cpu_expand``):
:func:`expand_kernel_impl` and :func:`reject_kept_placeholders`. Files written before the second
fix joined it say ``cpu-expand`` (the expand fix alone); a baseline comparison tells them apart."""
REJECTION_KERNEL = "vllm.v1.sample.rejection_sampler.rejection_random_sample_kernel"
PLACEHOLDER = -1
"""vLLM's ``PLACEHOLDER_TOKEN_ID``: the draft id of a padded row and the value of an output slot left empty."""


def reject_kept_placeholders(output_token_ids: Any, cu_num_draft_tokens: Any, draft_token_ids: Any,
                             recovered_token_ids: Any) -> int:
    """Undo, in place, a placeholder draft that a rejection kernel accepted; returns how many rows it changed.

    ``output_token_ids`` is the kernel's ``[batch, max_spec_len + 1]`` integer output, ``cu_num_draft_tokens``
    the ``[batch]`` cumulative draft counts, ``draft_token_ids`` and ``recovered_token_ids`` the flat
    ``[num_draft_tokens]`` drafts and recovered tokens (torch tensors, any integer dtype). A row whose first
    placeholder (``< 0``) draft sits at position ``j`` and whose output equals its drafts up to and including
    ``j`` (every draft before it accepted, and the placeholder kept) gets ``recovered_token_ids`` at ``j`` and
    :data:`PLACEHOLDER` after it: what vLLM's Triton kernel emits, which rejects every ``draft_token_id < 0``
    (its comment: "-1 is used for padded draft token ids that should be rejected"). vLLM-cpu 0.32.0's C++
    kernel has no such test: it reads the target probability at index -1 and may keep the placeholder, and the
    request's first token is then drawn after it (docs/conformance.md, vLLM, finding 1). Other rows, and rows
    whose kernel already rejected at or before ``j``, are left as they are (a rejected draft's recovered token
    never equals that draft: the residual has no mass there, so an output equal to the drafts means they were
    accepted)."""
    drafts = draft_token_ids.reshape(-1)
    flat = [int(i) for i in (drafts < 0).nonzero().reshape(-1).tolist()]
    if not flat:
        return 0
    import bisect

    cu = [int(c) for c in cu_num_draft_tokens.reshape(-1).tolist()]
    done: set[int] = set()
    changed = 0
    for idx in flat:
        row = bisect.bisect_right(cu, idx)
        if row in done or row >= len(cu):
            continue
        done.add(row)
        start = cu[row - 1] if row else 0
        pos = idx - start
        kept = output_token_ids[row, :pos + 1].tolist() == drafts[start:idx + 1].tolist()
        if kept:
            output_token_ids[row, pos] = int(recovered_token_ids.reshape(-1)[idx])
            output_token_ids[row, pos + 1:] = PLACEHOLDER
            changed += 1
    return changed


def rejecting_placeholders(kernel: Any) -> Any:
    """vLLM's CPU rejection kernel ``kernel`` (``cpu_triton_utils._rejection_random_sample_kernel_impl``,
    its arguments in the Triton kernel's order) followed by :func:`reject_kept_placeholders` on its output.
    Idempotent: a kernel wrapped already is returned as it is."""
    if getattr(kernel, "_hsd_rejects_placeholders", False):
        return kernel

    def wrapped(output_token_ids: Any, cu_num_draft_tokens: Any, draft_token_ids: Any, draft_probs: Any,
                target_probs: Any, bonus_token_ids: Any, recovered_token_ids: Any, *args: Any, **kw: Any) -> None:
        kernel(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, bonus_token_ids,
               recovered_token_ids, *args, **kw)
        reject_kept_placeholders(output_token_ids, cu_num_draft_tokens, draft_token_ids, recovered_token_ids)

    wrapped._hsd_rejects_placeholders = True  # type: ignore[attr-defined]
    wrapped.__wrapped__ = kernel  # type: ignore[attr-defined]
    return wrapped


def patch_cpu_expand() -> None:
    """Opt-in fix (job key ``patch_vllm_cpu_expand``, recorded as :data:`PATCH_NAME`) of vLLM-cpu's rejection
    sampler: :func:`install_cpu_patch` in this process, and the engine made to run in this process:
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set (a spawned engine core would import vLLM afresh, unpatched)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    install_cpu_patch()


def install_cpu_patch() -> None:
    """hsd's whole patch in this process: :func:`install_cpu_expand` and :func:`install_placeholder_reject`."""
    install_cpu_expand()
    install_placeholder_reject()


def install_cpu_expand() -> None:
    """Install :func:`expand_kernel_impl` as the CPU override of vLLM's ``expand_kernel`` in this
    process, whether or not the platform has registered its overrides yet. Only this process: an
    engine core that vLLM spawns must install it itself (:mod:`hsd_torch.engines.vllm_server_launch`
    does so at import, which a spawned process repeats)."""
    cpu_tl = _vllm("vllm.utils.cpu_triton_utils")
    cpu_tl._expand_kernel_impl = expand_kernel_impl  # used if the platform registers later
    dispatcher = _vllm("vllm.triton_utils.dispatcher")
    if EXPAND_KERNEL in dispatcher._registry:  # registered already: override the override
        dispatcher.register_kernels({EXPAND_KERNEL: expand_kernel_impl})


def install_placeholder_reject() -> None:
    """Wrap vLLM's CPU rejection kernel with :func:`rejecting_placeholders` in this process, whether or not
    the platform has registered its overrides yet (as :func:`install_cpu_expand`; only this process)."""
    cpu_tl = _vllm("vllm.utils.cpu_triton_utils")
    wrapped = rejecting_placeholders(cpu_tl._rejection_random_sample_kernel_impl)
    cpu_tl._rejection_random_sample_kernel_impl = wrapped  # used if the platform registers later
    dispatcher = _vllm("vllm.triton_utils.dispatcher")
    if REJECTION_KERNEL in dispatcher._registry:  # registered already: wrap what was registered
        dispatcher.register_kernels({REJECTION_KERNEL: rejecting_placeholders(dispatcher._registry[REJECTION_KERNEL][1])})


def _minus(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The counters of :func:`spec_stats` accrued between two snapshots (one file's share)."""
    out: dict[str, Any] = {"scope": "file"}
    for k, v in after.items():
        if k in ("scope", "acceptance_rate"):
            continue
        w = before.get(k)
        out[k] = [x - y for x, y in zip(v, w or [0] * len(v))] if isinstance(v, list) else v - (w or 0)
    if out.get("num_draft_tokens"):
        out["acceptance_rate"] = out.get("num_accepted_tokens", 0) / out["num_draft_tokens"]
    return out


def saved_lines(out: str, settings: dict[str, Any], requests: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """The records ``out`` already holds, by seed, to resume a file: a last line without its
    newline that is not JSON (a write cut short) is cut off the file; ``ValueError`` when a record
    has other shared settings than ``settings``, a seed that none of ``requests`` has, or other
    prompt ids than its request."""
    if not os.path.exists(out):
        return {}
    with open(out, "rb") as f:
        data = f.read()
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        try:
            json.loads(data[cut:])
        except ValueError:
            with open(out, "r+b") as f:
                f.truncate(cut)
            data = data[:cut]
    wanted, got = {r.get("seed"): r for r in requests}, {}
    for no, raw in enumerate(data.decode("utf-8").splitlines(), 1):
        if not raw.strip():
            continue
        rec = json.loads(raw)
        for k in _SHARED:
            if rec.get(k) != settings.get(k):
                raise ValueError(f"{out}:{no}: key {k!r} is {json.dumps(rec.get(k))}, this job's is "
                                 f"{json.dumps(settings.get(k))}: resume only the run that wrote the file")
        if rec.get("seed") not in wanted:
            raise ValueError(f"{out}:{no}: seed {rec.get('seed')} is not one of this job's seeds: resume with the seeds "
                             "of the run that wrote the file")
        if [int(t) for t in wanted[rec["seed"]]["prompt_ids"]] != rec.get("prompt_ids"):
            raise ValueError(f"{out}:{no}: the draw of seed {rec['seed']} has other prompt ids than this job gives it")
        got[rec["seed"]] = rec
    return got


def _append(fd: int, recs: list[dict[str, Any]]) -> None:
    for rec in recs:
        view = memoryview((json.dumps(rec) + "\n").encode())
        while view:
            view = view[os.write(fd, view):]


def _rewrite(out: str, recs: list[dict[str, Any]]) -> None:
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for rec in recs:
            f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)


def run_sample(job: dict[str, Any], ch: IO[bytes]) -> None:
    """Mode ``sample`` (module docstring): one engine, then each of ``job["files"]`` in turn, each
    in chunks appended to its ``out`` as they return (resumed from it with ``"resume": true``)."""
    SamplingParams, TokensPrompt = _vllm("vllm").SamplingParams, _vllm("vllm.inputs").TokensPrompt
    t0 = time.perf_counter()
    llm = _llm(job)
    t_init = time.perf_counter() - t0
    speculative = job.get("speculative") is not None
    for file in job["files"]:
        reqs = file["requests"]
        settings = record_settings(job, file["sampling"], _version())
        out = file["out"]
        done = saved_lines(out, settings, reqs) if file.get("resume") else {}
        todo = [r for r in reqs if r.get("seed") not in done]
        chunk = max(1, int(file.get("chunk", CHUNK)))
        first_stats = spec_stats(llm.get_metrics()) if speculative else {}
        fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT | (0 if file.get("resume") else os.O_TRUNC), 0o644)
        t_gen = 0.0
        new: dict[Any, dict[str, Any]] = {}
        try:
            for c in range(0, len(todo), chunk):
                part = todo[c:c + chunk]
                prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in r["prompt_ids"]]) for r in part]
                params = [SamplingParams(**sampling_kwargs(file["sampling"], r.get("seed"))) for r in part]
                before = spec_stats(llm.get_metrics()) if speculative else {}
                t1 = time.perf_counter()
                outs = llm.generate(prompts, params, use_tqdm=False)
                t_gen += time.perf_counter() - t1
                stats = _minus(spec_stats(llm.get_metrics()), before) if speculative else None
                lines = records(settings, part, outs, stats)
                _append(fd, lines)
                new.update((r["seed"], rec) for r, rec in zip(part, lines))
        finally:
            os.close(fd)
        ordered = [done.get(r.get("seed")) or new[r.get("seed")] for r in reqs]
        _rewrite(out, ordered)
        total = _minus(spec_stats(llm.get_metrics()), first_stats) if speculative else None
        summary = {"out": out, "draws": len(ordered), "resumed": len(done), "init_s": t_init, "generate_s": t_gen,
                   "tokens": sum(len(r["ids"]) for r in ordered), "spec_stats": total, "version": _version()}
        ch.write((json.dumps(summary) + "\n").encode())
        ch.flush()


def _dense_prompt_logprobs() -> None:
    """Make vLLM's output processor keep each prompt position's log-probs as one dense float32
    row (numpy, indexed by token id) instead of a dict of ``Logprob`` objects."""
    import numpy as np

    LogprobsProcessor = _vllm("vllm.v1.engine.logprobs").LogprobsProcessor

    def update(self: Any, tensors: Any) -> None:
        token_ids, logprobs, *_ = tensors
        ids = np.asarray(token_ids.numpy() if hasattr(token_ids, "numpy") else token_ids)
        lps = np.asarray(logprobs.numpy() if hasattr(logprobs, "numpy") else logprobs, dtype=np.float32)
        width = max(int(ids.max()) + 1, self._hsd_width)
        for pos in range(ids.shape[0]):
            row = np.full(width, -np.inf, dtype=np.float32)
            row[ids[pos]] = lps[pos]
            self.prompt_logprobs.append(row)

    LogprobsProcessor._hsd_width = 0
    LogprobsProcessor._update_prompt_logprobs = update


def run_laws(job: dict[str, Any], ch: IO[bytes], requests: IO[str]) -> None:
    """Mode ``laws`` (module docstring)."""
    import numpy as np

    SamplingParams, TokensPrompt = _vllm("vllm").SamplingParams, _vllm("vllm.inputs").TokensPrompt
    LogprobsProcessor = _vllm("vllm.v1.engine.logprobs").LogprobsProcessor
    _dense_prompt_logprobs()
    job = dict(job, laws=True, speculative=None)
    llm = _llm(job)
    width = int(llm.llm_engine.model_config.get_vocab_size())
    LogprobsProcessor._hsd_width = width
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=-1, detokenize=False)
    ch.write((json.dumps({"ready": True, "vocab_size": width, "version": _version()}) + "\n").encode())
    ch.flush()
    for line in requests:
        if not line.strip():
            continue
        try:
            pairs = json.loads(line)["pairs"]
            prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p] + [int(t) for t in ids]) for p, ids in pairs]
            outs = llm.generate(prompts, params, use_tqdm=False)
            arrays = []
            for (p, ids), out in zip(pairs, outs):
                rows = out.prompt_logprobs[len(p):len(p) + len(ids)]
                arr = np.stack(rows) if rows else np.zeros((0, width), dtype=np.float32)
                arrays.append(np.ascontiguousarray(arr[:, :width], dtype="<f4"))
        except Exception as e:  # the caller gets the error and may go on
            ch.write((json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n").encode())
            ch.flush()
            continue
        ch.write((json.dumps({"shapes": [list(a.shape) for a in arrays], "dtype": "float32"}) + "\n").encode())
        for a in arrays:
            ch.write(a.tobytes())
        ch.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("sample", "laws"):
        print("usage: vllm_worker.py sample|laws JOB.json", file=sys.stderr)
        return 2
    for k, v in ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)
    with open(argv[1], encoding="utf-8") as f:
        job = json.load(f)
    ch = _result_channel()
    if argv[0] == "sample":
        run_sample(job, ch)
    else:
        run_laws(job, ch, sys.stdin)
    ch.close()
    return 0


if __name__ == "__main__":  # vLLM spawns processes that re-import the main module: guard
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # this folder holds hsd modules named vllm_*: never shadow vLLM's own
    sys.exit(main(sys.argv[1:]))
