"""The conformance matrix: engine x speculative mode x processing case x prompt over a kit, audited
against the kit's exact laws (``hsd conformance run``; docs/conformance.md, "The matrix run").

* Engines are registered in one place, :data:`ENGINES` (name -> factory taking the kit folder); an
  engine is anything with the :class:`~hsd_torch.conformance.engines.Engine` protocol, plus an
  optional ``order`` attribute: the engine whose order of processing stages it follows
  (:data:`hsd_core.samples.ORDERS`; default ``"vllm"``), which the cases' laws then follow.
* :data:`CASES` is the default matrix of processing cases, each aimed at a designed feature of the
  kit (the top-p boundary rows, ties, EOS early, min_tokens, stop strings, penalties, logit bias,
  min-p, bad words, allowed ids, greedy), plus a prompt with a repeated n-gram (``ngram_repeat``) so
  that prompt-lookup drafters have something to propose.
* Every engine runs mode ``"none"`` (the null control: the same engine without speculation) for each
  case beside its speculative modes. Each case's draws are appended to
  ``OUT/samples/ENGINE/MODE/CASE-pK.jsonl`` as they arrive; a second run with the same ``--out``
  goes on from them.
* A case's outcome is one of :data:`hsd_torch.conformance.audit.VERDICTS`: an engine's refusal
  (:class:`~hsd_torch.conformance.engines.EngineRefused`) and any other exception (a crash) are
  recorded with their message, never as a verdict; an ambiguous law is ``not determinable``.
* The report: ``OUT/report.md``, ``OUT/report.json`` and ``OUT/report.png`` (a grid of verdicts and
  acceptance ratios; skipped without matplotlib).
* Progress (:mod:`hsd_core.progress`, on stderr): a bar over the run's cells and one over the draws
  of the cell running (the engine reports draws as they arrive: ``on_draw`` in
  :mod:`hsd_torch.conformance.engines`); in a log, a line per 5 % of the cells and per 25 % of a
  cell's draws. Each cell's outcome is a line of its own on stdout.

The report and the exit status (0 conforms, 1 lossy, 3 a performance defect, 4 a crash or an
inconclusive case, 2 a usage error) are :mod:`hsd_torch.conformance.report`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsd_core import conformance as kc
from hsd_core.processing import AmbiguousLawError
from hsd_core.progress import Progress, progress as progress_bar
from hsd_core.samples import Sampling, SamplesFile

from .audit import acceptance, audit_draws
from .engines import Case, Engine, EngineRefused
from .report import Row, acceptance_text, exit_status, write_report

__all__ = ["CASES", "ENGINES", "MODE_SPECS", "ProcessingCase", "Row", "add_arguments", "exit_status", "main", "run_matrix",
           "write_report"]


def _t(text: str) -> int:
    return kc.kit_model("target").id_of_text[text]


def _prompt(*texts: str) -> tuple[int, ...]:
    return (kc.BOS,) + tuple(_t(x) for x in texts)


@dataclass(frozen=True)
class ProcessingCase:
    """One processing of the default matrix: ``name``, the :class:`Sampling` (``order`` left None: each
    engine's own order is put in when the case sets processing beyond temperature / top-k / top-p),
    its prompts (the target's ids, BOS first), what it aims at and the kit ``target`` it runs on
    (``"target"``, or ``"target_pos"``: the target whose law depends on position ids and on the id two
    back, :mod:`hsd_core.conformance`)."""

    name: str
    sampling: Sampling
    prompts: tuple[tuple[int, ...], ...]
    aim: str
    target: str = "target"

    def for_engine(self, order: str) -> Sampling:
        """The sampling as ``order``'s engine runs it."""
        s = self.sampling
        return dataclasses.replace(s, order=order) if s.processing() else s


def _s(max_new: int = 3, **kw: Any) -> Sampling:
    do_sample = kw.pop("do_sample", True)
    return Sampling(do_sample, kw.pop("temperature", 1.0), kw.pop("top_k", None), kw.pop("top_p", None), max_new, **kw)


CASES: tuple[ProcessingCase, ...] = (
    ProcessingCase("plain", _s(), (_prompt(),), "the raw law from BOS: peaked, flat and tied rows, EOS rising"),
    ProcessingCase("temperature", _s(temperature=0.7), (_prompt(),), "temperature 0.7"),
    ProcessingCase("top_k", _s(top_k=3), (_prompt(),), "top-k 3; ties at the boundary after ' sat' are kept"),
    ProcessingCase("top_p_inside", _s(top_p=kc.TOP_P), (_prompt(" cat"),), "top-p 0.8 with '.' just inside"),
    ProcessingCase("top_p_outside", _s(top_p=kc.TOP_P), (_prompt(" dog"),), "top-p 0.8 with '.' just outside"),
    ProcessingCase("eos_early", _s(4), (_prompt("a"),), "EOS mass 1/2 at the first position"),
    ProcessingCase("greedy", _s(do_sample=False), (_prompt(" the"),), "greedy on a peaked row"),
    ProcessingCase("greedy_tie", _s(do_sample=False), (_prompt(" sat"), _prompt(" ")),
                   "greedy at exact ties: the lowest id"),
    ProcessingCase("greedy_near_tie", _s(do_sample=False), (_prompt(" on"),), "greedy at logits 0 and 2^-12"),
    ProcessingCase("min_tokens", _s(4, min_tokens=2), (_prompt("a"),), "EOS held back for two ids where it is likely"),
    ProcessingCase("stop", _s(4, stop=(".",)), (_prompt(" cat"),), "the stop string '.' ends the draw"),
    ProcessingCase("min_p", _s(min_p=0.15), (_prompt(),), "min-p 0.15"),
    ProcessingCase("repetition_penalty", _s(repetition_penalty=1.5), (_prompt(" sat"),), "repetition penalty 1.5"),
    ProcessingCase("presence_frequency", _s(presence_penalty=0.5, frequency_penalty=0.3), (_prompt(" sat"),),
                   "presence 0.5 and frequency 0.3 penalties"),
    ProcessingCase("logit_bias", _s(logit_bias=((_t("a"), 2.0),)), (_prompt(),), "logit bias +2 on 'a'"),
    ProcessingCase("bad_words", _s(bad_words_ids=((_t(" cat"),),)), (_prompt(),), "' cat' banned"),
    ProcessingCase("allowed_ids", _s(allowed_token_ids=(kc.EOS, _t(" the"), _t(" cat"), _t(" dog"), _t(" sat"))),
                   (_prompt(),), "only EOS, ' the', ' cat', ' dog', ' sat' allowed"),
    ProcessingCase("ngram_repeat", _s(4), (_prompt(" the", " cat", " sat", " the"),),
                   "a repeated n-gram for prompt lookup (vLLM's ngram, which looks up after each sampled id): after "
                   "the likeliest first id ' cat' (0.90) it drafts ' sat the cat', accepted with 0.5, 0.25 and 0.90; "
                   "the kit's other prompts hold no repeat to look up"),
    ProcessingCase("pos_plain", _s(4), (_prompt(" the", " cat"),), "target_pos: a previous-token head (RoPE) "
                   "copies the id two back; position ids not rolled back or a rejected column left in the cache show",
                   target="target_pos"),
)
"""The default matrix of processing cases (module docstring)."""

MODE_SPECS: dict[str, tuple[str | None, dict[str, Any], str | None]] = {
    "none": (None, {}, None),
    "sd": ("drafter", {"num_speculative_tokens": 3}, "sd"),
    "tli": ("drafter_sp", {"num_speculative_tokens": 3}, "tli"),
    "slem": ("drafter_sp", {"num_speculative_tokens": 3}, None),
    "slrs": ("drafter_sp", {"num_speculative_tokens": 1}, None),
    "assisted": ("drafter", {"num_speculative_tokens": 3}, None),
    "uag": ("drafter_sp", {"num_speculative_tokens": 3}, None),
    "ngram": (None, {"num_speculative_tokens": 3}, None),
    "draft_model": ("drafter", {"num_speculative_tokens": 3}, "sd"),
    # llama.cpp's server (hsd_torch/conformance/llama_server.py): its draft model drafts greedily (or, with
    # -probabilistic, from its own unprocessed law), so SD's expectation does not apply
    "draft-simple": ("drafter", {"num_speculative_tokens": 3}, None),
    "draft-simple-probabilistic": ("drafter", {"num_speculative_tokens": 3}, None),
    "ngram-simple": (None, {}, None), "ngram-map-k": (None, {}, None), "ngram-map-k4v": (None, {}, None),
    "ngram-mod": (None, {}, None), "ngram-cache": (None, {}, None),
}
"""Mode -> (the kit drafter it uses, its settings, the ``expected_acceptance`` method whose exact
expectation applies to it, None where hsd has none for that engine's method). TLI's is the exact
engine's over the kit's whole vocabularies (:func:`hsd_core.conformance.toy_models`: the target's BPE
holds the merge steps `` c`` and `` ca`` that the SentencePiece drafter proposes, so they are in the
intersection)."""


def _hsd_torch(kit: Path) -> Engine:
    from .hsd_engine import HsdTorchEngine

    return HsdTorchEngine(kit)


def _transformers(kit: Path) -> Engine:
    from .transformers_engine import TransformersEngine

    return TransformersEngine(kit)


def _vllm(kit: Path) -> Engine:
    from .vllm_engine import VllmEngine

    return VllmEngine(kit)


def _vllm_patched(kit: Path) -> Engine:
    from .vllm_engine import VllmEngine

    return VllmEngine(kit, patch_cpu_expand=True)


def _llama_cpp(kit: Path) -> Engine:
    from .llama_server import LlamaServerEngine

    return LlamaServerEngine()


ENGINES: dict[str, Callable[[Path], Engine]] = {"hsd_torch": _hsd_torch, "transformers": _transformers, "vllm": _vllm,
                                                "vllm_patched": _vllm_patched, "llama.cpp": _llama_cpp}
"""Engine name -> factory (the kit folder -> an :class:`Engine`): the one place an adapter is registered."""


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


Bars = Callable[[int, str, str], Progress]
"""``(total, description, unit) -> Progress``: how the matrix makes its bars (:func:`hsd_core.progress.progress`)."""


def _sample(engine: Engine, case: Case, n: int, out: Path | None, bar: Progress | None) -> SamplesFile:
    """``engine.sample`` of seeds ``0..n-1`` with ``bar`` moved by the engine's ``on_draw`` while it runs
    (when it has one), then topped up to the draws it returned."""
    hook = hasattr(engine, "on_draw") and bar is not None
    if hook and bar is not None:
        setattr(engine, "on_draw", bar.update)
    try:
        got = engine.sample(case, list(range(n)), out)
    finally:
        if hook:
            setattr(engine, "on_draw", None)
    if bar is not None:
        bar.update(len(got.draws) - bar.done)
    return got


def audit_case(engine: Engine, engine_name: str, case: Case, case_name: str, n: int, alpha: float,
               out: Path | None, bar: Progress | None = None) -> Row:
    """Draw ``n`` samples of ``case`` from ``engine`` (appended to ``out``) and audit them: a
    :class:`Row` with the outcome (refusals, crashes and ambiguous laws recorded as such). ``bar``:
    the cell's progress over its ``n`` draws (moved here, closed by the caller)."""
    row = Row(engine_name, case.mode, case_name, case.prompt_ids, "crashed", "", samples=str(out) if out else None)
    t0 = time.perf_counter()
    try:
        law = kc.sequence_law(kc.kit_model(case.target), case.prompt_ids, case.sampling)
        row.times["law"] = time.perf_counter() - t0
    except AmbiguousLawError as e:
        row.outcome, row.reason = "not determinable", str(e)
        return row
    except ValueError as e:  # a setting the engine's order does not have: no law, the engine cannot run it
        row.outcome, row.reason = "refused", f"no {case.sampling.order}-order law: {e}"
        return row
    t0 = time.perf_counter()
    try:
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
        got = _sample(engine, case, n, out, bar)
    except EngineRefused as e:
        row.outcome, row.reason = "refused", str(e).strip().splitlines()[0] if str(e).strip() else "refused"
        return row
    except Exception as e:  # noqa: BLE001  (an engine's crash is a result of the matrix)
        row.outcome, row.reason = "crashed", _one_line(e)
        row.tests = [{"traceback": traceback.format_exc(limit=4)}]
        return row
    row.seconds = row.times["draws"] = time.perf_counter() - t0
    draws = got.draws
    if not draws:
        row.outcome, row.reason = "crashed", "the engine returned no draws"
        return row
    t0 = time.perf_counter()
    a = audit_draws(draws, law, alpha)
    row.outcome, row.reason, row.n, row.tests = a.verdict, a.reason, a.n, [dataclasses.asdict(t) for t in a.tests]
    row.times["audit"] = time.perf_counter() - t0
    method = MODE_SPECS.get(case.mode, (None, {}, None))[2]
    s = case.sampling
    if method and s.do_sample and not s.processing():
        t0 = time.perf_counter()
        k = int(case.settings.get("num_speculative_tokens", 3))
        exp = kc.expected_acceptance(case.prompt_ids, method, k, s.max_new_tokens, sampling=s, drafter_sampling=s,
                                     target=case.target)
        acc = acceptance(draws, exp["tokens_per_call"], alpha)
        if acc is not None:
            row.acceptance = dataclasses.asdict(acc)
            if acc.defect and row.outcome == "conforms":
                row.outcome = "performance defect"
                row.reason = "the draws conform, but it accepts less than the method promises: " + acc.describe()
        row.times["expected_acceptance"] = time.perf_counter() - t0
    return row


def run_matrix(kit: Path, engines: Sequence[str], *, modes: Sequence[str] | None = None,
               cases: Sequence[ProcessingCase] = CASES, n: int = 2000, alpha: float = 1e-3, out: Path | None = None,
               registry: dict[str, Callable[[Path], Engine]] | None = None,
               progress: Callable[[Row], None] | None = None, bars: Bars | None = None) -> list[Row]:
    """The matrix (module docstring) over ``kit`` for the named engines of ``registry`` (default
    :data:`ENGINES`): for each engine, each case, each prompt, the null control then each of the
    engine's modes in ``modes`` (None: all); ``n`` draws a cell, family-wise ``alpha`` a cell. The
    engines are started first (an engine whose factory raises is one ``crashed`` row), so that the
    cells are counted before the first runs: ``bars`` makes a bar over them and one over each cell's
    draws (None: no bars); ``progress(row)`` is called as each row is made."""
    reg = ENGINES if registry is None else registry
    rows: list[Row] = []

    def add(r: Row) -> None:
        rows.append(r)
        if progress is not None:
            progress(r)

    started: list[tuple[str, Engine]] = []
    for name in engines:
        try:
            started.append((name, reg[name](kit)))
        except Exception as e:  # noqa: BLE001
            add(Row(name, "*", "*", (), "crashed", "the engine did not start: " + _one_line(e)))
    plan = [(name, engine, pc, k, prompt, mode) for name, engine in started
            for pc in cases for k, prompt in enumerate(pc.prompts)
            for mode in [m for m in engine.modes() if modes is None or m in modes or m == "none"]]
    cells = bars(len(plan), "hsd conformance: cells", "cell") if bars is not None else None
    try:
        for i, (name, engine, pc, k, prompt, mode) in enumerate(plan):
            drafter, settings, _ = MODE_SPECS.get(mode, (None, {}, None))
            case = Case(kit, prompt, pc.for_engine(getattr(engine, "order", "vllm")), mode, drafter, settings, pc.target)
            path = None if out is None else out / "samples" / name / mode / f"{pc.name}-p{k}.jsonl"
            bar = bars(n, f"hsd conformance: {name} {mode} {pc.name} p{k}", "draw") if bars is not None else None
            try:
                add(audit_case(engine, name, case, pc.name, n, alpha, path, bar))
            finally:
                if bar is not None:
                    bar.close()
            if cells is not None:
                cells.update()
            if i + 1 == len(plan) or plan[i + 1][1] is not engine:
                engine.close()
    finally:
        if cells is not None:
            cells.close()
        for _, engine in started:
            engine.close()
    return rows


def audit_samples_files(kit: Path, paths: Sequence[Path], alpha: float = 1e-3) -> list[Row]:
    """The samples-file engine's rows: each file, each prompt in it, audited against the kit's law
    in the file's order."""
    from hsd_core.samples import SamplesFormatError

    from .samples_engine import SamplesFileEngine

    rows: list[Row] = []
    for p in paths:
        try:
            eng = SamplesFileEngine([p])
            cases = eng.cases(kit)
        except (SamplesFormatError, EngineRefused) as e:
            rows.append(Row("samples-file", "*", Path(p).stem, (), "crashed", str(e).splitlines()[0], samples=str(p)))
            continue
        rows.extend(audit_case(eng, eng.name, case, name, 0, alpha, None) for name, case in cases)
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``hsd conformance run``'s options."""
    p.add_argument("--kit", metavar="DIR", help="the kit folder (hsd conformance kit); default: built into OUT/kit")
    p.add_argument("--out", metavar="DIR", help="samples files and the report go here (resumable); required but "
                   "with --list")
    p.add_argument("--engine", action="append", metavar="NAME", help=f"an engine ({', '.join(ENGINES)}); repeat; "
                   "default hsd_torch")
    p.add_argument("--mode", action="append", metavar="MODE", help="a speculative mode (the null control 'none' "
                   "always runs); repeat; default every mode of each engine")
    p.add_argument("--case", action="append", metavar="NAME", help="a processing case (--list shows them); repeat")
    p.add_argument("--samples", action="append", metavar="FILE", help="audit this samples file against the kit "
                   "(the samples-file engine); repeat; with it no engine runs unless --engine is given")
    p.add_argument("-n", "--n", type=int, default=2000, help="draws per cell (default 2000)")
    p.add_argument("--alpha", type=float, default=1e-3, help="family-wise false-fail rate per cell (default 1e-3)")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="hsd_torch draws in N worker processes "
                   "(default 1: in this one; the draws are the same)")
    p.add_argument("--list", action="store_true", help="list the engines, modes and cases, and exit")


def main(args: argparse.Namespace, prog: str = "hsd conformance run") -> int:
    """Run the matrix from parsed :func:`add_arguments` options: print a line a cell (stdout) with the
    bars of :func:`run_matrix` on stderr (a line per 5 % of the cells and per 25 % of a cell's draws in
    a log; ``HSD_PROGRESS`` as :mod:`hsd_core.progress` says), write the report, return
    :func:`exit_status` (2 on a usage error, one ``error:`` line)."""
    def usage(msg: str) -> int:
        print(f"{prog}: error: {msg}", file=sys.stderr)
        return 2

    if args.list:
        print("engines: " + ", ".join(ENGINES))
        print("modes: " + ", ".join(MODE_SPECS))
        for pc in CASES:
            on = "" if pc.target == "target" else f" (on {pc.target})"
            print(f"case {pc.name}{on}: {pc.sampling.describe()}, max_new_tokens {pc.sampling.max_new_tokens}; {pc.aim}")
        return 0
    if args.out is None:
        return usage("the following arguments are required: --out")
    engines = args.engine or ([] if args.samples else ["hsd_torch"])
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        return usage(f"unknown engine {unknown[0]!r}; one of {', '.join(ENGINES)}")
    bad_mode = [m for m in (args.mode or []) if m not in MODE_SPECS]
    if bad_mode:
        return usage(f"unknown mode {bad_mode[0]!r}; one of {', '.join(MODE_SPECS)}")
    names = {pc.name for pc in CASES}
    bad_case = [c for c in (args.case or []) if c not in names]
    if bad_case:
        return usage(f"unknown case {bad_case[0]!r}; one of {', '.join(sorted(names))}")
    if args.n < 1 or not (0 < args.alpha < 1):
        return usage("--n must be >= 1 and --alpha in (0, 1)")
    if args.workers < 1:
        return usage("--workers must be >= 1")
    missing = [f for f in (args.samples or []) if not Path(f).is_file()]
    if missing:
        return usage(f"--samples {missing[0]!r} is not a file")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        return usage(f"--out {args.out!r} is a file; give a folder")
    kit = Path(args.kit) if args.kit else out / "kit"
    if args.kit and not (kit / "kit.json").is_file():
        return usage(f"--kit {args.kit!r} holds no kit.json; build one with hsd conformance kit --out DIR")
    if not args.kit and not (kit / "kit.json").is_file():
        from .kit import build_kit

        build_kit(kit, gguf=True)  # the GGUF files too: llama.cpp's server loads them
    cases = [pc for pc in CASES if not args.case or pc.name in args.case]

    def show(r: Row) -> None:
        acc = f", tokens/call {acceptance_text(r)}" if r.acceptance else ""
        print(f"{r.engine} {r.mode} {r.case} {list(r.prompt_ids)}: {r.outcome} ({r.n} draws, {r.seconds:.1f} s{acc})"
              + (f": {r.reason}" if r.outcome not in ("conforms",) else ""), flush=True)

    def bars(total: int, desc: str, unit: str) -> Progress:
        return progress_bar(total, desc, unit, every=0.05 if unit == "cell" else 0.25)

    t0 = time.perf_counter()
    registry = dict(ENGINES)
    if args.workers > 1:
        workers = args.workers

        def hsd_torch_workers(k: Path) -> Engine:
            from .hsd_engine import HsdTorchEngine

            return HsdTorchEngine(k, workers=workers)

        registry["hsd_torch"] = hsd_torch_workers
    rows = run_matrix(kit, engines, modes=args.mode, cases=cases, n=args.n, alpha=args.alpha, out=out, progress=show,
                      bars=bars, registry=registry)
    if args.samples:
        for r in audit_samples_files(kit, [Path(f) for f in args.samples], args.alpha):
            show(r)
            rows.append(r)
    meta = {"kit": str(kit), "n": args.n, "alpha": args.alpha, "engines": engines, "workers": args.workers,
            "seconds": time.perf_counter() - t0}
    paths = write_report(rows, out, meta)
    for k, p in paths.items():
        print(f"report ({k}): {p}")
    return exit_status(rows)
