"""``hsd audit model --impl transformers|hsd_torch ...``: audit a speculative ``generate()`` over local
checkpoints with :func:`hsd_torch.auditing.first_tokens.audit_generate`. :data:`AUDIT` (its options and its runner)
is registered under the ``hsd.audit_impls`` entry points ``transformers`` and ``hsd_torch``
(pyproject.toml), and also runs ``hsd audit samples`` / ``hsd audit endpoint``
(:mod:`hsd_torch.commands.engine`); :data:`VLLM` is ``hsd audit vllm``. Each kind's options are
:mod:`hsd_torch.commands.audit_options`'. ``hsd_core.cli`` imports this module only when a kind (or
the old spelling ``hsd audit --impl NAME``) is given, so that ``import hsd_core`` and ``hsd audit``
never import torch.

``--impl transformers`` samples ``target.generate(input_ids, assistant_model=drafter,
tokenizer=tt, assistant_tokenizer=dt, ...)`` (universal assisted generation; with the same
tokenizer, plain assisted generation), seeded by ``torch.manual_seed(seed)`` per draw; its law is
the target's plain law (no id removed), and ``top_k`` unset is passed as ``top_k=0`` (transformers
otherwise applies its default top-k 50). ``--impl hsd_torch`` samples :func:`hsd_torch.generate`
(``--method``), whose law is the target's own over every id too (``generate``'s default,
``mask_textless=False``). Both are asked for
one token more than ``--positions`` (the audit reads the first ``--positions``), so that every
audited token comes out of a round with room to draft: transformers drafts nothing for the last
new token, so ``--positions 1`` with ``max_new_tokens=1`` would audit no speculation at all.

With ``--sequences``, transformers' sampler gets its own deep copy of the drafter: its sampled
assisted generation prunes and re-indexes its assistant in place, and the audit's directional test
must read the drafter as given (``audit_sequences`` refuses a sampler that changed it).

Before the first draw the first-token audit prints on stderr what its ``--samples`` draws will be
able to detect (a ``plan:`` line: the TV the report will state). Cost: after the first draws (at least 2 s of sampling or 10 draws) the command prints the
estimated time of the whole sampling on stderr and refuses to go on (exit status 2) when it is
above ``--max-minutes`` (default 20), naming the ``--samples`` that fits; the sequence audit then
prints its own estimate after the first chunk, teacher forcing and the departure it should catch
included. Progress (:mod:`hsd_core.progress`: a bar on a terminal, a line per 5 % in a log) is counted
per draw (hsd_torch's rows as they finish), and with ``--sequences`` per sequence sampled and teacher forced.
``--threads`` sets torch's CPU threads (default 1).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from hsd_core.context_bugs import DEFAULT_CONTEXT_BUGS
from hsd_core.extensions import AuditImpl
from hsd_core.progress import Progress, progress

from ..auditing.first_tokens import GenerateAuditReport, audit_generate, audit_sequences
from . import args as ca
from . import audit_options
from . import engine as cli_engine


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every option of every ``hsd audit`` kind on one parser: the old spelling ``hsd audit --impl
    NAME`` / ``--samples-file`` / ``--endpoint`` (:func:`hsd_torch.commands.audit_options.all_options`;
    each ``hsd audit KIND`` has its own list, :data:`hsd_torch.commands.audit_options.KINDS`)."""
    audit_options.all_options(p)


def load(path: str, tokenizer_path: str | None, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """The model at ``path`` (a checkpoint folder or a real model's name) in ``dtype``, in eval mode,
    and its tokenizer (from ``tokenizer_path`` when given)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from ..models import real as real_models

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # a bar per checkpoint (as hsd generate)
    if (name := real_models.named(path)) is not None:
        model, tok = real_models.load(name, dtype=dtype)
    else:
        model, tok = real_models.load_checkpoint(path, dtype), None  # damaged or mismatched weights: one line
    model.eval()
    tok_path = tokenizer_path or path
    if tok is not None and tokenizer_path is None:
        return model, tok
    if (tname := real_models.named(tok_path)) is not None:
        return model, real_models.load_tokenizer(tname)
    return model, AutoTokenizer.from_pretrained(tok_path)


def _uses_drafter(args: argparse.Namespace) -> bool:
    """transformers' assisted generation always has an assistant; hsd_torch's ``ar`` has none."""
    return not (args.impl == "hsd_torch" and args.method == "ar")


_HSD_TORCH_ONLY = (("method", "--method"), ("lookahead", "--lookahead"), ("min_path_prob", "--min-path-prob"),
                   ("proposal_map", "--proposal-map"), ("tree", "--tree"), ("tree_draws", "--tree-draws"),
                   ("min_confidence", "--min-confidence"))


def problem_before_loading(args: argparse.Namespace) -> str | None:
    """What stops ``hsd audit --impl`` before any model is loaded (None if nothing): a missing
    option, a folder that holds no checkpoint or no tokenizer, hsd_torch method options that
    ``generate`` would refuse. The ranges were checked while parsing (:mod:`hsd_torch.commands.args`)."""
    if args.target is None:
        return f"--impl {args.impl} needs --target DIR"
    if getattr(args, "dtype", "float32") not in ("float32", "fp32"):
        return (f"--dtype {args.dtype} is the engine audits' (the reference target of --samples-file, --endpoint, --impl "
                f"vllm); --impl {args.impl} samples and audits the model in float32")
    if args.impl == "transformers":
        given = [flag for dest, flag in _HSD_TORCH_ONLY if getattr(args, dest) is not None]
        if given:
            return (f"{', '.join(given)}: options of --impl hsd_torch; transformers' assisted generation has no such "
                    "setting (it picks its own number of drafts), so they would be ignored")
    else:
        if args.tree is not None and args.lookahead is not None:
            return "--lookahead and --tree: a tree's depth is its lookahead; give one of them"
        args.method = args.method or "tli"
        args.lookahead = args.lookahead if args.lookahead is not None else ca.default_lookahead(args.method)
    if _uses_drafter(args) and args.drafter is None:
        if args.impl == "hsd_torch":
            return f"--method {args.method} needs --drafter DIR (only --method ar runs without a drafter)"
        return f"--impl {args.impl} needs --drafter DIR (the assistant model of assisted generation)"
    if args.prompt is None:
        return f"--impl {args.impl} needs --prompt"
    if args.sequences and args.positions != 2:
        return "--positions is the first-token audit's; with --sequences every token is audited (--max-new-tokens L)"
    if not args.sequences and args.max_new_tokens != 32:
        return "--max-new-tokens is the sequence audit's: add --sequences (the first-token audit takes --positions)"
    if not args.sequences and args.context_bugs is not None:
        return "--context-bugs is the sequence audit's: add --sequences"
    drafter = args.drafter if _uses_drafter(args) else None
    problem = ca.folders_problem(args.target, drafter, args.target_tokenizer, args.drafter_tokenizer)
    if problem is not None:
        return problem
    if args.impl == "hsd_torch":
        problem = ca.method_problem(args.method, args.lookahead, args.greedy, args.min_path_prob, args.proposal_map, 1,
                                    args.tree, args.tree_draws, args.min_confidence)
        if problem is None and args.method == "sd":  # the tokenizers only: before either model loads
            problem = ca.sd_tokenizer_problem("sd", ca.load_tokenizer(args.target_tokenizer or args.target),
                                              ca.load_tokenizer(args.drafter_tokenizer or args.drafter))
        return problem
    return None


class _Sampler:
    """``(prompt, seed) -> new ids`` for one implementation, with a progress bar (per draw,
    and per finished row of hsd_torch's batches); ``batch`` (hsd_torch) samples a list of prompts
    in one call, row streams from the first seed. After the first draws it prints the estimated
    sampling time of all ``n`` and raises ``ValueError`` when it is above ``--max-minutes``."""

    def __init__(self, args: argparse.Namespace, target: Any, tt: Any, drafter: Any, dt: Any, bar: Any,
                 n: int) -> None:
        self.a, self.target, self.tt, self.drafter, self.dt, self.bar = args, target, tt, drafter, dt, bar
        self.budget = args.max_new_tokens if args.sequences else args.positions + 1
        self.n, self.done, self.spent, self.estimated = n, 0, 0.0, False

    def _timed(self, k: int, t0: float) -> None:
        """Count ``k`` draws that took the time since ``t0``; once (2 s or 10 draws in, before the
        end) print the estimate and refuse a run above the budget."""
        self.done += k
        self.spent += time.perf_counter() - t0
        if self.estimated or self.done >= self.n or (self.spent < 2.0 and self.done < 10):
            return
        self.estimated = True
        each = self.spent / self.done
        total = each * self.n
        what = "sequences" if self.a.sequences else "draws"
        print(f"\nhsd audit: sampling {self.n} {what} should take about {total / 60:.1f} min here (the first "
              f"{self.done} took {each:.2f} s each)" + ("; teacher forcing comes on top" if self.a.sequences else ""),
              file=sys.stderr)
        if total > 60 * self.a.max_minutes:
            fits = max(1, math.floor(60 * self.a.max_minutes / each))
            raise ValueError(f"--samples {self.n} would take about {total / 60:.0f} min of sampling alone here (the "
                             f"first {self.done} {what} took {each:.2f} s each), more than --max-minutes "
                             f"{self.a.max_minutes:g}: choose --samples {fits} or fewer (about {self.a.max_minutes:g} "
                             "min; the report states what that size can detect), or raise --max-minutes")

    def batch(self, prompts: list[str], seeds: list[int]) -> list[list[int]]:
        from ..engine.entry import generate

        a = self.a
        t0 = time.perf_counter()
        out = generate(self.target, self.drafter, prompts, target_tokenizer=self.tt, drafter_tokenizer=self.dt,
                       method=a.method, lookahead=a.lookahead, max_new_tokens=self.budget, do_sample=not a.greedy,
                       temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=seeds[0],
                       min_path_prob=a.min_path_prob, proposal_map=a.proposal_map, tree=a.tree, tree_draws=a.tree_draws,
                       min_confidence=a.min_confidence, progress=self.bar.update).sequences
        self._timed(len(prompts), t0)
        return [list(r) for r in out]

    def __call__(self, prompt: str, seed: int) -> list[int]:
        t0 = time.perf_counter()
        a = self.a
        if a.impl == "hsd_torch":
            from ..engine.entry import generate

            ids = generate(self.target, self.drafter, prompt, target_tokenizer=self.tt, drafter_tokenizer=self.dt,
                           method=a.method, lookahead=a.lookahead, max_new_tokens=self.budget,
                           do_sample=not a.greedy, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p,
                           seed=seed, min_path_prob=a.min_path_prob, proposal_map=a.proposal_map, tree=a.tree,
                           tree_draws=a.tree_draws, min_confidence=a.min_confidence).sequences[0]
        else:
            torch.manual_seed(seed)
            x = self.tt(prompt, return_tensors="pt")
            kw: dict[str, Any] = {"max_new_tokens": self.budget, "do_sample": not a.greedy}
            if not a.greedy:
                kw.update(temperature=a.temperature, top_k=a.top_k or 0, top_p=1.0 if a.top_p is None else a.top_p)
            if self.dt is not None:
                kw.update(tokenizer=self.tt, assistant_tokenizer=self.dt)
            with torch.inference_mode():
                out = self.target.generate(**x, assistant_model=self.drafter, **kw)
            ids = out[0, x["input_ids"].shape[1]:].tolist()
        self.bar.update(1)
        self._timed(1, t0)
        return list(ids)


def _name(args: argparse.Namespace) -> str:
    """The audited sampler as the report names it: the implementation, hsd_torch's method and the
    options that change how it drafts (a tree's shape, the confidence stop)."""
    if args.impl != "hsd_torch":
        return f"{args.impl} UAG"
    extra = ([f"tree {ca.tree_text(args.tree)}"] if args.tree is not None else []) + \
        ([f"tree draws {args.tree_draws}"] if args.tree_draws is not None else []) + \
        ([f"min confidence {args.min_confidence:g}"] if args.min_confidence is not None else [])
    return f"{args.impl} {args.method}" + (f" ({', '.join(extra)})" if extra else "")


def run(args: argparse.Namespace) -> int:
    """Run the audit; print the verdict; write the report; 1 on "lossy", 0 otherwise.

    Exit status 2 with one ``hsd audit: error:`` line: a problem found before loading
    (:func:`problem_before_loading`), a checkpoint that does not load, or a ``ValueError`` /
    ``NotImplementedError`` from the sampler or :func:`~hsd_torch.auditing.first_tokens.audit_generate` (the
    library refusing an argument, or a test that cannot give an answer:
    ``hsd_core.stats.InvalidTest``). Any other exception is a bug and keeps its traceback."""

    def error(message: str) -> int:
        print(f"hsd audit: error: {message}", file=sys.stderr)
        return 2

    if args.samples_file is not None or args.endpoint is not None:
        return cli_engine.run(args, cli_engine.loader(load, args))
    try:
        problem = problem_before_loading(args)
    except ca.Refusal as e:  # a tokenizer that does not load (the sd check reads both)
        return error(str(e))
    if problem is not None:
        return error(problem)
    ca.set_threads(args.threads)
    loaded: dict[str, tuple[Any, Any]] = {"drafter": (None, None)}
    for role, path, tok in (("target", args.target, args.target_tokenizer),
                            ("drafter", args.drafter if _uses_drafter(args) else None, args.drafter_tokenizer)):
        if path is None:
            continue
        try:
            loaded[role] = load(path, tok)
        except (OSError, ValueError) as e:
            return error(f"cannot load the {role} (--{role} {path!r}"
                         + (f", --{role}-tokenizer {tok!r}" if tok else "") + f"): {ca.one_line(e)}")
    (target, tt), (drafter, dt) = loaded["target"], loaded["drafter"]
    same = dt is not None and len(tt) == len(dt) and tt.get_vocab() == dt.get_vocab()
    n = args.samples if args.samples is not None else (200 if args.sequences else 20000)
    # sequences: one bar over the sequences sampled and teacher forced (a chunk at a time); draws: each draw
    bar = progress(n, f"hsd audit: sampling and teacher forcing ({args.impl})", "sequence") if args.sequences \
        else progress(n, f"hsd audit: sampling {args.impl}", "draw")
    # transformers' sampled UAG rewrites its assistant in place: with --sequences (whose directional test reads
    # the drafter) it samples with its own copy, and the audit reads the untouched one
    own = copy.deepcopy(drafter) if (args.sequences and args.impl == "transformers" and drafter is not None) else drafter
    sampler = _Sampler(args, target, tt, own, None if (same and args.impl == "transformers") else dt,
                       Progress(0, "", mode="off") if args.sequences else bar, n)
    if args.sequences:
        return _run_sequences(args, n, sampler, target, tt, drafter, dt, bar, error)
    try:
        try:
            rep: GenerateAuditReport = audit_generate(
                None if args.impl == "hsd_torch" else sampler, target, tt, args.prompt, n=n, positions=args.positions, do_sample=not args.greedy,
                temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, alpha=args.alpha, seed=args.seed,
                mask_textless=False, max_detectable_tv=args.max_detectable_tv,
                sample_batch_fn=sampler.batch if args.impl == "hsd_torch" else None,
                name=_name(args), progress=lambda line: print("hsd audit: " + line, file=sys.stderr))
        finally:
            bar.close()
    except (ValueError, NotImplementedError) as e:  # not TypeError & co.: argparse typed every value
        return error(ca.one_line(e))
    det = "n/a" if rep.detectable_tv is None else f"{rep.detectable_tv:.4g}"
    print(f"{rep.name}: {rep.verdict} (n={rep.n}, alpha={rep.alpha:.3g}, detectable TV {det}, "
          f"TV {rep.tv_corrected:.4g} (bias-corrected, 95% interval [{rep.tv_ci[0]:.4g}, {rep.tv_ci[1]:.4g}]), "
          f"plug-in TV {rep.tv_estimate:.4g}: a lossless sampler's plug-in shows up to {rep.tv_null_q95:.4g})")
    print(f"  {rep.reason}")
    if args.report:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        md = rep.to_markdown()
        png = os.path.splitext(args.report)[0] + ".png"
        if rep.save_plot(png, tokenizer=tt):
            md += f"\n![observed vs expected]({os.path.basename(png)})\n"
        with open(args.report, "w", encoding="utf-8") as f:
            f.write(md)
        print(f"  report written to {args.report}")
    return 1 if rep.verdict == "lossy" else 0


def _run_sequences(args: argparse.Namespace, n: int, sampler: _Sampler, target: Any, tt: Any, drafter: Any, dt: Any,
                   bar: Any, error: Callable[[str], int]) -> int:
    """``--sequences``: :func:`~hsd_torch.auditing.sequences.audit_sequences` (hsd_torch batched 16 sequences
    per call; transformers one per call, as its assisted generation takes batch 1), the drafter's
    law giving the directional test; prints the verdict and the power per family."""
    batched = args.impl == "hsd_torch"
    try:
        try:
            rep = audit_sequences(
                None if batched else sampler, target, tt, args.prompt, n=n, max_new_tokens=args.max_new_tokens,
                do_sample=not args.greedy, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                alpha=args.alpha, seed=args.seed, drafter=drafter, drafter_tokenizer=None if drafter is None else dt,
                max_detectable_tv=args.max_detectable_tv,
                sample_batch_fn=sampler.batch if batched else None,
                context_bugs=DEFAULT_CONTEXT_BUGS if args.context_bugs is None else args.context_bugs,
                name=_name(args),
                progress=lambda line: print("hsd audit: " + line, file=sys.stderr) if line.startswith("estimate")
                else None, on_chunk=bar.update)
        finally:
            bar.close()
    except (ValueError, NotImplementedError) as e:
        return error(ca.one_line(e))
    det = "n/a" if rep.detectable_tv is None else f"{rep.detectable_tv:.4g}"
    print(f"{rep.name}: {rep.verdict} ({rep.n} sequences, {rep.tokens} tokens, alpha={rep.alpha:.3g}, detectable "
          f"mean per-token TV {det}: {rep.detectable_by})")
    print(f"  {rep.reason}")
    for fam in rep.families:
        d = "n/a" if fam.detectable is None else f"{fam.detectable:.4g}"
        tv = "n/a" if fam.mean_tv is None else f"{fam.mean_tv:.4g}"
        print(f"  {fam.family}: smallest caught {d} (mean per-token TV {tv}), caught with probability "
              f"{fam.caught:.3g} ({fam.by})")
    print("  cost: " + ", ".join(f"{k} {v:.1f} s" for k, v in rep.cost.items()))
    if args.report:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        md = rep.to_markdown()
        png = os.path.splitext(args.report)[0] + ".png"
        if rep.save_plot(png):
            md += f"\n![PITs]({os.path.basename(png)})\n"
        with open(args.report, "w", encoding="utf-8") as f:
            f.write(md)
        print(f"  report written to {args.report}")
    return 1 if rep.verdict == "lossy" else 0


AUDIT = AuditImpl(add_arguments=add_arguments, run=run,
                  kinds={k: audit_options.KINDS[k] for k in ("model", "samples", "endpoint")})
"""What the ``hsd.audit_impls`` entry points ``transformers`` and ``hsd_torch`` name: ``hsd audit model
--impl transformers|hsd_torch``, ``hsd audit samples`` and ``hsd audit endpoint`` (and the old
spellings ``hsd audit --impl transformers|hsd_torch`` / ``--samples-file`` / ``--endpoint``)."""


def run_vllm(args: argparse.Namespace) -> int:
    """``hsd audit vllm``: :func:`hsd_torch.engines.vllm_audit.run` (vLLM runs in its own venv)."""
    from ..engines import vllm_audit as engines_vllm

    ref_load = cli_engine.loader(load, args)
    return engines_vllm.run(args, ref_load, lambda ns: cli_engine.run(ns, ref_load))


VLLM = AuditImpl(add_arguments=add_arguments, run=run_vllm, kinds={"vllm": audit_options.vllm})
"""What the ``hsd.audit_impls`` entry point ``vllm`` names: ``hsd audit vllm`` (old spelling ``hsd
audit --impl vllm``, whose options are ``--impl transformers``'s, so that they are added once)."""
