"""The options of each ``hsd audit KIND`` (``model``, ``samples``, ``endpoint``, ``vllm``), each list
built from groups defined once here, and each subcommand's examples (its ``--help`` epilog).

=============  ====================================================================================
kind           its options
=============  ====================================================================================
``model``      the checkpoints, the prompt and sampling, ``--samples``, ``--positions`` or
               ``--sequences`` (``--max-new-tokens``, ``--context-bugs``), hsd_torch's method
               options, the verdict, ``--max-minutes``, ``--threads`` (``--impl`` is the core's)
``samples``    ``--samples-file``, ``--baseline-file``, the checkpoints, the reference, the verdict
``endpoint``   ``--endpoint`` and the client's options, the checkpoints, the prompt and sampling,
               ``--samples``, ``--max-new-tokens``, the reference, the verdict
``vllm``       vLLM's own options (:func:`hsd_torch.engines.vllm_audit.add_arguments`), the
               checkpoints, the prompt and sampling, ``--samples``, ``--max-new-tokens``,
               ``--resume``, the reference target's ``--dtype``, the verdict
=============  ====================================================================================

``--report`` is the core's (:mod:`hsd_core.cli`), on every kind. :func:`all_options` adds every
option of every kind to one parser: the old spelling ``hsd audit --impl NAME`` / ``--samples-file`` /
``--endpoint`` (kept one release), whose parser hides them from ``hsd audit --help``. An option's
default is the same in every kind that has it and in :func:`all_options`, so a command line means the
same in both spellings; the runners read every option, and ``hsd_core.cli`` gives the options a kind
does not have their defaults.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..models.real import names as real_model_names
from . import args as ca

Adder = Callable[[argparse.ArgumentParser], None]


# --- the groups -------------------------------------------------------------------------------------

def models(p: argparse.ArgumentParser, drafter: str = "the drafter's checkpoint folder or real model (optional: it "
                                                     "gives the directional test its law)") -> None:
    """``--target``, ``--drafter`` and their tokenizers (``drafter``: the help of ``--drafter``)."""
    p.add_argument("--target", metavar="DIR", help="target checkpoint folder, or a real model: "
                   + ", ".join(real_model_names()) + " (hsd_torch.models.real)")
    p.add_argument("--drafter", metavar="DIR", help=drafter)
    p.add_argument("--target-tokenizer", metavar="DIR", help="default: --target")
    p.add_argument("--drafter-tokenizer", metavar="DIR", help="default: --drafter")


def prompt_and_sampling(p: argparse.ArgumentParser) -> None:
    """``--prompt``, ``--greedy``, ``--temperature``, ``--top-k``, ``--top-p``: the law sampled."""
    p.add_argument("--prompt", help="the prompt")
    p.add_argument("--greedy", action="store_true", help="greedy: every draw must equal the target's greedy output")
    p.add_argument("--temperature", type=ca.temperature, default=1.0,
                   help="default 1; a number in [%g, %g] (--greedy: argmax)" % ca.TEMPERATURE_RANGE)
    p.add_argument("--top-k", type=ca.top_k, default=None, metavar="K", help="keep the K most likely ids (0: off)")
    p.add_argument("--top-p", type=ca.top_p, default=None, metavar="P", help="nucleus sampling, P in (0, 1]")


def samples(p: argparse.ArgumentParser, default: str = "200 sequences") -> None:
    """``--samples N`` (``default``: what the kind takes without it)."""
    p.add_argument("--samples", type=ca.positive_int, default=None, metavar="N", help=f"draws (default {default})")


def sequence_options(p: argparse.ArgumentParser, only: str = "") -> None:
    """``--max-new-tokens L`` and ``--context-bugs``: the sequence audit's (``only``: a note on when)."""
    p.add_argument("--max-new-tokens", type=ca.positive_int, default=32, metavar="L",
                   help=f"{only}new tokens per sequence (default 32)")
    context_bugs(p, only)


def context_bugs(p: argparse.ArgumentParser, only: str = "") -> None:
    """``--context-bugs``: the sequence audit's aimed tests."""
    p.add_argument("--context-bugs", type=ca.context_bugs, default=None, metavar="NAMES",
                   help=f"{only}context bugs to aim a test at, comma-separated, or 'none' (default prompt_last_twice; "
                        "hsd_core.context_bugs)")


def verdict(p: argparse.ArgumentParser) -> None:
    """``--alpha``, ``--max-detectable-tv``, ``--seed``: what a verdict stands on."""
    p.add_argument("--alpha", type=ca.alpha, default=1e-3, help="family-wise false-fail rate (default 1e-3)")
    p.add_argument("--max-detectable-tv", type=ca.max_detectable_tv, default=0.1, metavar="TV",
                   help="'inconclusive' when the audit could only detect a larger TV (default 0.1; 1 to accept any)")
    p.add_argument("--seed", type=ca.seed, default=0, help="default 0 (an int >= 0)")


def reference_dtype(p: argparse.ArgumentParser) -> None:
    """``--dtype``: the reference target's (the engine audits')."""
    p.add_argument("--dtype", default="float32", choices=("float32", "fp32", "bfloat16", "bf16", "float16", "fp16"),
                   help="the dtype of the target whose teacher-forced law is the reference (default float32; bf16 "
                        "needs about half the memory and time on a CPU with AMX, and the report states what it "
                        "changes in the reference)")


def reference(p: argparse.ArgumentParser) -> None:
    """``--reference transformers|MODULE:ATTR`` and ``--dtype``: the engine audits' reference law."""
    reference_dtype(p)
    p.add_argument("--reference", metavar="transformers|MODULE:ATTR", default="transformers",
                   help="the reference law: transformers' teacher-forced law of --target (default), or a law provider "
                        "(prompt_ids, ids) -> [len(ids), V] raw log-probabilities named by MODULE:ATTR")


def resume(p: argparse.ArgumentParser, what: str) -> None:
    """``--resume`` (``what``: the folder it continues)."""
    p.add_argument("--resume", action="store_true",
                   help=f"continue the run saved in {what} (the same options; only the missing seeds are sampled)")


def _model_only(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--positions", type=ca.positive_int, default=2, help="new tokens audited (default 2; not with --sequences)")
    a("--sequences", action="store_true",
      help="audit every token of whole sequences by teacher forcing (hsd_torch.auditing.sequences.audit_sequences)")
    sequence_options(p, "with --sequences: ")
    a("--method", default=None, choices=ca.METHODS, help="hsd_torch method (default tli; not with --impl transformers)")
    a("--min-path-prob", type=ca.min_path_prob, default=None, metavar="TAU",
      help="hsd_torch bounded SLRS's probability stop")
    a("--proposal-map", choices=("retokenize", "longest_prefix"), default=None,
      help="hsd_torch SLRS's proposal map (bounded SLRS: longest_prefix)")
    a("--lookahead", type=ca.positive_int, default=None,
      help=f"hsd_torch drafts per round (default {ca.DEFAULT_LOOKAHEAD}, as hsd_torch.generate and hsd generate; 1 "
           "for slrs)")
    ca.add_draft_shape_options(p, "hsd_torch ")
    a("--max-minutes", type=ca.positive_float, default=20.0, metavar="M",
      help="refuse (after the first draws) a run whose sampling alone is estimated above M minutes, naming the "
           "--samples that fits (default 20)")
    ca.add_threads(p)


def _samples_files(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--samples-file", metavar="F", required=required,
                   help="the engine's recorded draws (JSONL, format hsd-samples/1, docs/auditing.md)")
    p.add_argument("--baseline-file", metavar="F", help="the same engine's draws without speculation: the null control "
                                                       "and the two-sample test")


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return v


def _endpoint_client(p: argparse.ArgumentParser, required: bool) -> None:
    a = p.add_argument
    a("--endpoint", metavar="URL", required=required,
      help="the OpenAI-compatible server to sample (its /v1 base; loopback only unless --allow-remote)")
    a("--baseline-endpoint", metavar="URL", help="the same engine's server without speculation (the null control)")
    a("--allow-remote", action="store_true", help="allow an endpoint that is not loopback")
    a("--model", metavar="NAME", help="the served model's name (default: the first of GET /models)")
    a("--max-requests", type=ca.positive_int, default=10_000, metavar="N", help="at most N requests per endpoint")
    a("--request-timeout", type=_positive_float, default=60.0, metavar="S", help="seconds per request (default 60)")
    a("--time-budget", type=_positive_float, default=3600.0, metavar="S",
      help="seconds for all requests to one endpoint (default 3600)")
    a("--concurrency", type=ca.positive_int, default=1, metavar="N",
      help="requests in flight at once (default 1; a batching server such as vLLM draws faster with more)")
    a("--server-kind", choices=("vllm", "llama.cpp", "sglang"), default=None,
      help="the server's kind; every sampling stage the audit does not set is then sent at its neutral value "
           "(llama.cpp's defaults are top-k 40, top-p 0.95, min-p 0.05, penalties, DRY, XTC, ...; vLLM's and "
           "SGLang's come from the model's generation config) and recorded in the samples file; llama.cpp's draws "
           "follow its order of stages (top-p before temperature). Default: only the stages set are sent")
    a("--speculative", metavar="JSON", default=None,
      help="what the server speculates with, as the samples format's JSON object (default {\"method\": \"unknown\"})")
    a("--save-samples", metavar="DIR", help="write the draws as samples files into DIR (endpoint.jsonl, "
                                           "baseline.jsonl), each draw appended as it arrives")
    resume(p, "--save-samples DIR")
    a("--retries", type=ca.int_at_least(0), default=3, metavar="N",
      help="retries per draw of HTTP 429/500/502/503/504 and resets, with backoff (default 3; 0: none; another 4xx "
           "is never retried)")


# --- the kinds ----------------------------------------------------------------------------------------

def model(p: argparse.ArgumentParser) -> None:
    """``hsd audit model --impl hsd_torch|transformers``: a Python implementation's sampler."""
    models(p, "drafter / assistant checkpoint (not needed for --impl hsd_torch --method ar)")
    prompt_and_sampling(p)
    samples(p, "20000; with --sequences 200 sequences")
    _model_only(p)
    verdict(p)
    p.epilog = p.epilog or _examples(
        "hsd audit model --impl hsd_torch --target pair/target --drafter pair/drafter --method tli "
        "--prompt 'def foo(x):' --samples 2000",
        "hsd audit model --impl transformers --target DIR --drafter DIR --prompt 'def foo(x):' --samples 20000 "
        "--report out/report.md",
        "hsd audit model --impl hsd_torch --target DIR --drafter DIR --prompt 'import os' --sequences "
        "--max-new-tokens 32 --samples 200")


def samples_file(p: argparse.ArgumentParser) -> None:
    """``hsd audit samples``: an engine's recorded draws."""
    _samples_files(p, required=True)
    models(p)
    reference(p)
    context_bugs(p)
    verdict(p)
    p.epilog = p.epilog or _examples(
        "hsd audit samples --samples-file bench/engines/samples/gemma-tli-smol-t1.jsonl --baseline-file "
        "bench/engines/samples/gemma-none-t1.jsonl --target gemma-3-270m --drafter smollm2-135m-instruct",
        "hsd audit samples --samples-file spec.jsonl --target DIR --dtype bfloat16 --report out/engine.md")


def endpoint(p: argparse.ArgumentParser) -> None:
    """``hsd audit endpoint``: draws sampled from an OpenAI-compatible server."""
    _endpoint_client(p, required=True)
    models(p)
    prompt_and_sampling(p)
    samples(p)
    sequence_options(p)
    reference(p)
    verdict(p)
    p.epilog = p.epilog or _examples(
        "hsd audit endpoint --endpoint http://127.0.0.1:8000/v1 --baseline-endpoint http://127.0.0.1:8001/v1 "
        "--target gemma-3-270m --prompt 'def fib(n):' --samples 400 --max-new-tokens 32",
        "hsd audit endpoint --endpoint http://127.0.0.1:8080/v1 --server-kind llama.cpp --target DIR --prompt 'Hi' "
        "--save-samples runs/ep --resume")


def vllm(p: argparse.ArgumentParser) -> None:
    """``hsd audit vllm``: vLLM driven in its own venv, with speculation and without."""
    from ..engines import vllm_audit  # numpy only

    vllm_audit.add_arguments(p)
    models(p, "the drafter (--spec draft_model or tli)")
    prompt_and_sampling(p)
    samples(p)
    sequence_options(p)
    resume(p, "--samples-dir DIR")
    reference_dtype(p)
    verdict(p)
    p.epilog = p.epilog or _examples(
        "hsd audit vllm --target gemma-3-270m --drafter smollm2-135m-instruct --spec tli --prompt 'def fib(n):'",
        "hsd audit vllm --target smollm2-135m-instruct --spec ngram --patch-vllm-cpu-expand --prompt 'def fib(n):' "
        "--samples 60 --reference vllm")


KINDS: dict[str, Adder] = {"model": model, "samples": samples_file, "endpoint": endpoint, "vllm": vllm}
"""The ``hsd audit KIND`` subcommands served by hsd_torch, each with the function that adds its options."""


def all_options(p: argparse.ArgumentParser) -> None:
    """Every kind's options on one parser (the old spelling ``hsd audit --impl NAME ...``): the
    model audit's, the engine audits' (``--samples-file``, ``--endpoint``, ...) and vLLM's."""
    models(p, "drafter / assistant checkpoint (with --impl; not needed for --impl hsd_torch --method ar)")
    prompt_and_sampling(p)
    samples(p, "20000; with --sequences 200 sequences")
    _model_only(p)
    verdict(p)
    _samples_files(p, required=False)
    _endpoint_client(p, required=False)
    reference(p)
    from ..engines import vllm_audit  # numpy only: --vllm-python, --spec, ... (its --reference is the one above)

    vllm_audit.add_arguments(p)


def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join("  " + line for line in lines)
