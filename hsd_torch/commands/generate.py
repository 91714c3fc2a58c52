"""``hsd generate``: speculative generation over local Hugging Face checkpoints (docs/generate.md).

    hsd generate --target DIR --drafter DIR --method tli --prompt "def foo(x):" \\
        [--prompt ...] [--prompts-file FILE] [--max-new-tokens N] [--greedy] [--seed S] [--stats]
        [--min-confidence C]

``DIR`` are ``save_pretrained`` folders (model and tokenizer; ``--target-tokenizer`` /
``--drafter-tokenizer`` load the tokenizers from other folders). Everything is offline
(``HF_HUB_OFFLINE=1`` is set unless the environment says otherwise) and runs on the CPU unless
``--device`` says otherwise. Every prompt is one row of one :func:`hsd_torch.generate` call (row
``i`` draws from ``(seed, i)``, so a prompt's output does not depend on the others); a progress
bar (``tqdm``, which transformers brings) counts finished prompts on stderr when there are
several. The continuations go to stdout (one per prompt, under a ``=== [i] ===`` header when there
are several); ``--stats`` prints the per-prompt cost table after them.

:data:`COMMAND` is registered under the ``hsd.commands`` entry point ``generate`` (pyproject.toml):
``hsd_core.cli`` imports this module only for ``hsd generate`` (or for ``hsd -h``), so ``import
hsd_core`` and ``hsd audit`` never import torch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from hsd_core.extensions import Command

from . import args as ca
from ..models.real import names as real_model_names

METHODS = ca.METHODS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hsd generate",
                                description="Lossless speculative generation over local Hugging Face checkpoints.")
    a = p.add_argument
    a("--target", required=True, metavar="DIR", help="target checkpoint folder (save_pretrained), or a real model: "
      + ", ".join(real_model_names()) + " (hsd_torch.models.real)")
    a("--drafter", metavar="DIR", help="drafter checkpoint folder or real model (not needed for --method ar)")
    a("--target-tokenizer", metavar="DIR", help="tokenizer folder (default: --target)")
    a("--drafter-tokenizer", metavar="DIR", help="tokenizer folder (default: --drafter)")
    a("--method", default="tli", choices=METHODS,
      help="default tli; slrs: --lookahead 1, or any lookahead with --proposal-map longest_prefix and "
           "--min-path-prob TAU (bounded SLRS)")
    a("--prompt", action="append", default=[], help="a prompt (repeat for several)")
    a("--prompts-file", metavar="FILE", help="one prompt per line (\\n escapes are expanded)")
    a("--max-new-tokens", type=ca.positive_int, default=64, metavar="N", help="default 64")
    a("--lookahead", type=ca.positive_int, default=None, metavar="K",
      help=f"drafts per round (default {ca.DEFAULT_LOOKAHEAD}, as hsd_torch.generate; 1 for slrs)")
    a("--greedy", action="store_true", help="greedy decoding (argmax), no randomness")
    ca.add_draft_shape_options(p)
    a("--min-path-prob", type=ca.min_path_prob, default=None, metavar="TAU",
      help="bounded SLRS: stop drafting a path below this drafter probability")
    a("--proposal-map", choices=("retokenize", "longest_prefix"), default=None,
      help="SLRS's map from drafted text to the proposed target id (bounded SLRS: longest_prefix)")
    a("--max-tokens", type=ca.max_tokens, default=1, metavar="M",
      help="bounded SLRS: target ids proposed per round, each verified against psi given the ones before "
           "(default 1; 'all': up to the budget)")
    a("--temperature", type=ca.temperature, default=1.0,
      help="default 1; a number in [%g, %g] (--greedy: argmax)" % ca.TEMPERATURE_RANGE)
    a("--top-k", type=ca.top_k, default=None, metavar="K", help="keep the K most likely ids (0: off)")
    a("--top-p", type=ca.top_p, default=None, metavar="P", help="nucleus sampling, P in (0, 1]")
    a("--seed", type=ca.seed, default=0, metavar="S", help="default 0 (an int >= 0)")
    a("--mask-textless", action="store_true",
      help="remove ids without text (specials but EOS and the end ids) from the target's law; default: its own law")
    a("--device", default="cpu", help="torch device for both models (default cpu)")
    a("--dtype", default="float32", choices=("float32", "fp32", "bfloat16", "bf16", "float64", "fp64", "float16", "fp16"),
      help="the models' dtype, cast on load (default float32; bf16 is much cheaper on CPUs with AMX: greedy near ties "
           "are then decided in float32, docs/generate.md 'Reduced precision')")
    ca.add_threads(p)
    a("--stats", action="store_true", help="print the per-prompt stats table at the end")
    return p


def stats_table(prompts: Sequence[str], out: Any, method: str) -> str:
    """The per-prompt cost table of a :class:`hsd_torch.GenerateOutput`, with a total line."""
    head = ("#", "prompt", "new", "target calls", "tok/call", "proposed", "accepted", "accept rate",
            "drafter calls", "recomputed t/d")
    rows = []
    tot = [0, 0, 0, 0, 0, 0, 0]
    for i, (p, st) in enumerate(zip(prompts, out.stats)):
        short = p if len(p) <= 24 else p[:21] + "..."
        rate = f"{st.accepted / st.proposed:.2f}" if st.proposed else "-"
        rows.append((str(i), repr(short), str(st.new_tokens), str(st.target_calls),
                     f"{st.tokens_per_target_call:.2f}", str(st.proposed), str(st.accepted), rate,
                     str(st.drafter_calls), f"{st.target_recomputed}/{st.drafter_recomputed}"))
        for j, v in enumerate((st.new_tokens, st.target_calls, st.proposed, st.accepted, st.drafter_calls,
                               st.target_recomputed, st.drafter_recomputed)):
            tot[j] += v
    rows.append(("all", "", str(tot[0]), str(tot[1]), f"{tot[0] / tot[1]:.2f}" if tot[1] else "-", str(tot[2]),
                 str(tot[3]), f"{tot[3] / tot[2]:.2f}" if tot[2] else "-", str(tot[4]), f"{tot[5]}/{tot[6]}"))
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    wall = out.stats[0].wall_time if out.stats else 0.0
    lines.append(f"method {method}; wall time {wall:.2f} s; {tot[0] / wall if wall else 0:.1f} new tokens/s")
    return "\n".join(lines)


class _Progress:
    """tqdm on stderr if it is installed (transformers brings it), else a plain counter."""

    def __init__(self, total: int) -> None:
        self.total, self.n = total, 0
        self.bar: Any = None
        try:
            from tqdm import tqdm  # type: ignore[import-untyped]
            self.bar = tqdm(total=total, desc="hsd generate", unit="prompt", file=sys.stderr)
        except ImportError:  # pragma: no cover - tqdm comes with transformers
            pass

    def __call__(self, k: int) -> None:
        self.n += k
        if self.bar is not None:
            self.bar.update(k)
        else:  # pragma: no cover
            print(f"\rhsd generate: {self.n}/{self.total} prompts", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:  # pragma: no cover
            print(file=sys.stderr)


def _read_prompts(path: str) -> list[str]:
    """``--prompts-file``: one prompt per non-blank line (``\\n`` expanded), UTF-8."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ca.Refusal(f"--prompts-file {path!r}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ca.Refusal(f"--prompts-file {path!r} is not UTF-8 text (byte 0x{data[e.start]:02x} on line {line}): "
                         "save it as UTF-8") from None
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # as text mode reads them
    return [line.replace("\\n", "\n") for line in lines if line.strip()]


def _problem_before_loading(args: argparse.Namespace) -> str | None:
    """What stops the run before any model is loaded: a folder that holds no checkpoint or no
    tokenizer, a device this machine cannot use (None if nothing)."""
    drafter = args.drafter if args.method != "ar" else None
    problem = ca.folders_problem(args.target, drafter, args.target_tokenizer, args.drafter_tokenizer)
    if problem is not None:
        return problem
    return ca.device_problem(args.device)


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    import torch
    from transformers import AutoTokenizer

    from transformers.utils import logging as hf_logging

    from ..models import real as real_models
    from ..engine._precision import as_dtype

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers' own bar per checkpoint; this process only
    dtype = as_dtype(args.dtype) or torch.float32

    def model(path: str, role: str) -> Any:
        try:
            if (name := real_models.named(path)) is not None:
                m = real_models.load(name, dtype=dtype)[0]
            else:
                m = real_models.load_checkpoint(path, dtype)  # damaged or mismatched weights: one line
        except (OSError, ValueError) as e:
            raise ca.Refusal(f"cannot load the {role} from --{role} {path!r}: {ca.one_line(e)}") from None
        return m.to(args.device).eval()

    def tokenizer(path: str, role: str) -> Any:
        try:
            if (name := real_models.named(path)) is not None:
                return real_models.load_tokenizer(name)
            return AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as e:
            raise ca.Refusal(f"cannot load the {role} tokenizer from {path!r}: {ca.one_line(e)}") from None

    target = model(args.target, "target")
    tt = tokenizer(args.target_tokenizer or args.target, "target")
    drafter = dt = None
    if args.method != "ar":
        drafter = model(args.drafter, "drafter")
        dt = tokenizer(args.drafter_tokenizer or args.drafter, "drafter")
    return target, tt, drafter, dt


def main(argv: Sequence[str] | None = None) -> int:
    """``hsd generate ...``; returns the exit status.

    Every bad argument is refused before any model is loaded, with exit status 2: a range, a
    choice or a missing option while parsing (:mod:`hsd_torch.commands.args`: argparse's usage and one
    ``error:`` line), then the prompts file, the method's options, the folders and the device (one
    ``error:`` line, :class:`~hsd_torch.commands.args.Refusal`). A checkpoint that does not load, and a
    ``ValueError`` or ``NotImplementedError`` from :func:`hsd_torch.generate` (the library refusing
    an argument or an input it cannot go on with), are one ``error:`` line too, exit status 2. Any
    other exception (``TypeError``, ``AssertionError``, ``RuntimeError``, ...) is a bug or a failure
    of the machine, not of the command line, and keeps its traceback."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _run(args, parser)
    except ca.Refusal as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    prompts = list(args.prompt)
    if args.prompts_file:
        prompts += _read_prompts(args.prompts_file)
    if not prompts:
        parser.error("give at least one --prompt or a --prompts-file")
    if args.method != "ar" and not args.drafter:
        parser.error(f"--method {args.method} needs --drafter DIR")
    lookahead = args.lookahead if args.lookahead is not None else ca.default_lookahead(args.method)

    from ..engine.entry import generate

    # the method's options, as generate checks them first, in the flags' words
    if args.tree is not None and args.lookahead is not None:
        parser.error("--lookahead and --tree: a tree's depth is its lookahead; give one of them")
    problem = ca.method_problem(args.method, lookahead, args.greedy, args.min_path_prob, args.proposal_map,
                                args.max_tokens, args.tree, args.tree_draws, args.min_confidence)
    if problem is None:
        problem = _problem_before_loading(args)
    if problem is None and args.method == "sd":  # the tokenizers only: refused before either model loads
        problem = ca.sd_tokenizer_problem("sd", ca.load_tokenizer(args.target_tokenizer or args.target),
                                          ca.load_tokenizer(args.drafter_tokenizer or args.drafter))
    if problem is not None:
        raise ca.Refusal(problem)
    ca.set_threads(args.threads, args.device)
    t0 = time.perf_counter()
    target, tt, drafter, dt = _load(args)
    load_s = time.perf_counter() - t0
    bar = _Progress(len(prompts)) if len(prompts) > 1 else None
    try:
        out = generate(target, drafter, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method=args.method,
                       lookahead=lookahead, max_new_tokens=args.max_new_tokens, do_sample=not args.greedy,
                       temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                       progress=bar, min_path_prob=args.min_path_prob, proposal_map=args.proposal_map,
                       max_tokens=args.max_tokens, mask_textless=args.mask_textless, tree=args.tree,
                       tree_draws=args.tree_draws, min_confidence=args.min_confidence)
    except (ValueError, NotImplementedError) as e:  # not TypeError & co.: the CLI typed every value
        raise ca.Refusal(ca.one_line(e)) from None
    finally:
        if bar is not None:
            bar.close()
    for i, text in enumerate(out.texts):
        if len(prompts) > 1:
            print(f"=== [{i}] {prompts[i]!r} ===")
        print(text)
    if args.stats:
        print()
        print(stats_table(prompts, out, args.method))
        print(f"(models loaded in {load_s:.1f} s)")
    return 0


COMMAND = Command(help="speculative generation over local checkpoints (needs torch; hsd generate -h)", main=main)
"""What the ``hsd.commands`` entry point ``generate`` names."""


if __name__ == "__main__":
    sys.exit(main())
