"""``hsd audit samples --samples-file F --target T`` and ``hsd audit endpoint --endpoint URL --target T``:
audits of engines that run outside hsd (:func:`hsd_torch.auditing.samples.audit_samples`). No ``--impl``:
the draws are the engine's (a samples file, :mod:`hsd_core.samples`) or are drawn from its
OpenAI-compatible server (:mod:`hsd_core.endpoint`). Their options are
:mod:`hsd_torch.commands.audit_options`'; :mod:`hsd_torch.commands.audit` hands a command line that
gives ``--samples-file`` or ``--endpoint`` to :func:`run`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from hsd_core.context_bugs import DEFAULT_CONTEXT_BUGS

from . import args as ca

__all__ = ["problem_before_loading", "run"]


def problem_before_loading(args: argparse.Namespace) -> str | None:
    """What stops an engine audit before any model is loaded (None if nothing)."""
    if args.samples_file is not None and args.endpoint is not None:
        return "give --samples-file or --endpoint, not both"
    if getattr(args, "impl", None) is not None:
        src = "--samples-file" if args.samples_file is not None else "--endpoint"
        return f"{src} audits an engine's own draws: no --impl (--impl {args.impl} samples a Python implementation)"
    if args.target is None:
        return "an engine audit needs --target DIR|NAME (the model the engine serves)"
    if args.samples_file is not None:
        if args.baseline_endpoint is not None:
            return "--baseline-endpoint goes with --endpoint (with --samples-file: --baseline-file)"
        given = [o for o, bad in (("--prompt", args.prompt is not None), ("--samples", args.samples is not None),
                                  ("--greedy", args.greedy), ("--temperature", args.temperature != 1.0),
                                  ("--top-k", args.top_k is not None), ("--top-p", args.top_p is not None),
                                  ("--max-new-tokens", args.max_new_tokens != 32),
                                  ("--speculative", args.speculative is not None),
                                  ("--server-kind", args.server_kind is not None),
                                  ("--save-samples", args.save_samples is not None),
                                  ("--resume", args.resume), ("--retries", args.retries != 3)) if bad]
        if given:
            return f"{', '.join(given)}: the samples file says its prompts and settings; not with --samples-file"
        for f in (args.samples_file, args.baseline_file):
            if f is not None and not os.path.isfile(f):
                return f"{f!r} is not a file"
    else:
        if args.baseline_file is not None:
            return "--baseline-file goes with --samples-file (with --endpoint: --baseline-endpoint)"
        if args.prompt is None:
            return "--endpoint needs --prompt"
        if args.resume and args.save_samples is None:
            return "--resume continues the run saved by --save-samples DIR: give that DIR"
        from hsd_core.endpoint import EndpointError, check_endpoint

        try:
            for u in (args.endpoint, args.baseline_endpoint):
                if u is not None:
                    check_endpoint(u, args.allow_remote)
        except EndpointError as e:
            return str(e)
        if args.speculative is not None:
            try:
                spec = json.loads(args.speculative)
            except json.JSONDecodeError:
                return f"--speculative {args.speculative!r} is not JSON (an object, or null)"
            if spec is not None and not isinstance(spec, dict):
                return "--speculative must be a JSON object (or null: no speculation)"
    if args.positions != 2 or args.sequences:
        return "an engine audit runs the sequence audit and the first-token audit itself: no --positions / --sequences"
    if args.reference != "transformers" and ":" not in args.reference:
        return f"--reference {args.reference!r}: give transformers or MODULE:ATTR (a law provider)"
    return ca.folders_problem(args.target, args.drafter, args.target_tokenizer, args.drafter_tokenizer)


def _provider(spec: str) -> Any:
    mod, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(mod)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"--reference {spec!r} cannot be loaded: {ca.one_line(e)}") from None
    if not callable(obj):
        raise ValueError(f"--reference {spec!r} is a {type(obj).__name__}, not a callable law provider")
    return obj


def _endpoint_files(args: argparse.Namespace, tt: Any, width: int) -> tuple[Any, Any, list[str]]:
    """The draws of ``--endpoint`` and ``--baseline-endpoint`` (None without one), each appended to
    ``--save-samples DIR``'s file as it arrives (``--resume``: continued from it), and a note per
    endpoint on its retries. Ids outside the target's ``width`` ids are refused as engine errors."""
    from hsd_core.endpoint import EndpointStats, check_endpoint, sample_endpoint
    from hsd_core.progress import progress
    from hsd_core.samples import Sampling
    from hsd_core.seqaudit import sequence_seeds

    from ..vocab.text import TokenText

    n = args.samples if args.samples is not None else 200
    sampling = Sampling(not args.greedy, 1.0 if args.greedy else args.temperature, None if args.greedy else
                        (args.top_k or None), None if args.greedy else args.top_p, args.max_new_tokens,
                        order="llama.cpp" if args.server_kind == "llama.cpp" else None)
    pid = TokenText.get(tt, width).prompt_ids(args.prompt)
    spec = {"method": "unknown"} if args.speculative is None else json.loads(args.speculative)
    kw = dict(model=args.model, allow_remote=args.allow_remote, max_requests=args.max_requests,
              timeout=args.request_timeout, time_budget=args.time_budget, target=args.target,
              concurrency=args.concurrency, retries=args.retries, vocab_size=width, resume=args.resume,
              server_kind=args.server_kind)
    if args.baseline_endpoint is not None:  # two servers, one engine: one label (their URLs differ, at least by port)
        kw["engine"] = {"name": "openai-compatible endpoints",
                        "version": f"{check_endpoint(args.endpoint, True)} with speculation, "
                                   f"{check_endpoint(args.baseline_endpoint, True)} without"}
    if args.save_samples:
        os.makedirs(args.save_samples, exist_ok=True)
    files: list[Any] = []
    notes: list[str] = []
    for url, s, sp, name in ((args.endpoint, args.seed, spec, "endpoint"),
                             (args.baseline_endpoint, args.seed + 1, None, "baseline")):
        if url is None:
            files.append(None)
            continue
        stats = EndpointStats()
        out = os.path.join(args.save_samples, f"{name}.jsonl") if args.save_samples else None
        with progress(n, f"hsd audit: drawing from the {name} {url}", "draw") as bar:
            files.append(sample_endpoint(url, [args.prompt], [pid], sequence_seeds(s, n), sampling, speculative=sp,
                                         out=out, stats=stats, on_draw=bar.update, **kw))
        notes.append(f"{name} {url}: {stats.requests} requests, {stats.describe()}")
    return files[0], files[1], notes


def loader(load: Callable[..., tuple[Any, Any]], args: argparse.Namespace) -> Callable[[str, str | None], tuple[Any, Any]]:
    """``load(path, tokenizer_path)`` with the engine audits' ``--dtype`` (the reference target's dtype)."""
    import torch

    from ..engine._precision import as_dtype

    dtype = as_dtype(getattr(args, "dtype", None) or "float32") or torch.float32
    return lambda path, tok: load(path, tok, dtype)


def run(args: argparse.Namespace, load: Callable[[str, str | None], tuple[Any, Any]]) -> int:
    """Run the engine audit (``load(path, tokenizer_path) -> (model, tokenizer)`` loads the target
    and the drafter: :func:`hsd_torch.commands.audit.load`, given by the caller so that this module does
    not import the one that imports it); print the verdict, the reference and each part's verdict; write the
    report; 1 on "lossy", 0 otherwise, 2 with one ``hsd audit: error:`` line for a refused input
    (a samples file that breaks the format, an endpoint that cannot be audited, a bad option)."""
    from hsd_core.endpoint import EndpointError
    from hsd_core.samples import SamplesFormatError

    from ..auditing._ids import _width
    from ..auditing.samples import audit_samples

    def error(message: str) -> int:
        print(f"hsd audit: error: {message}", file=sys.stderr)
        return 2

    problem = problem_before_loading(args)
    if problem is not None:
        return error(problem)
    try:
        from hsd_core.samples import read_samples

        spec = read_samples(args.samples_file) if args.samples_file is not None else None
        base = read_samples(args.baseline_file) if args.baseline_file is not None else None
    except SamplesFormatError as e:
        return error(str(e))
    sampled: list[str] = []
    loaded = {}
    for role, path, tok in (("target", args.target, args.target_tokenizer),
                            ("drafter", args.drafter, args.drafter_tokenizer)):
        if path is None:
            continue
        try:
            loaded[role] = load(path, tok)
        except (OSError, ValueError) as e:
            return error(f"cannot load the {role} (--{role} {path!r}): {ca.one_line(e)}")
    target, tt = loaded["target"]
    drafter, dt = loaded.get("drafter", (None, None))
    try:
        reference = None if args.reference == "transformers" else _provider(args.reference)
        if spec is None:
            spec, base, sampled = _endpoint_files(args, tt, _width(target))
        rep = audit_samples(spec, target, tt, reference=reference, reference_name=None if reference is None else
                            args.reference, baseline=base, drafter=drafter, drafter_tokenizer=dt, alpha=args.alpha,
                            seed=args.seed, max_detectable_tv=args.max_detectable_tv,
                            context_bugs=DEFAULT_CONTEXT_BUGS if args.context_bugs is None else args.context_bugs,
                            progress=lambda line: print(f"  {line}", file=sys.stderr))
    except (EndpointError, SamplesFormatError, ValueError, NotImplementedError) as e:
        return error(ca.one_line(e))
    if sampled:  # the endpoints' retries and resumed draws: in the report as in its notes
        rep = dataclasses.replace(rep, notes=rep.notes + tuple(sampled))
    print(f"engine audit: {rep.verdict} ({rep.reason})")
    print(f"  reference: {rep.reference}")
    print(f"  audited: {rep.audited.describe}: {rep.audited.verdict} against the reference")
    if rep.null_control is not None:
        print(f"  null control: {rep.null_control.describe}: {rep.null_control.verdict} against the reference")
    if rep.two_sample is not None:
        print(f"  two-sample: {rep.two_sample.verdict} ({rep.two_sample.reason})")
    for n in rep.notes:
        print(f"  note: {n}")
    if args.report:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        with open(args.report, "w", encoding="utf-8") as f:
            f.write(rep.to_markdown())
        print(f"  report written to {args.report}")
    return 1 if rep.verdict == "lossy" else 0
