"""``hsd``: command-line entry point. ``hsd audit`` audits every method on the built-in world.

For each method (and each deliberately lossy variant) it prints whether the exact law of its
output equals the target's (and the total variation if not), the expected target tokens per
target call, the first-position acceptance (enumerated, and the paper's closed form), and for
SLRS the drafter evaluations psi needs (with prefix sharing, and without).

Other packages add to the command through entry points (:mod:`hsd_core.extensions`): ``hsd NAME``
for the commands registered under ``hsd.commands`` (``hsd generate``, ``hsd conformance``) and the
subcommands ``hsd audit model|samples|endpoint|vllm`` (:data:`AUDIT_KINDS`) for those under
``hsd.audit_impls``, each subcommand with only its own options. This module imports none of them:
it reads their names from the installed metadata and imports one only when the command line needs
it, so ``hsd audit`` runs without torch, and ``hsd generate`` / ``hsd audit model`` without it say
what to install. The old spellings ``hsd audit --impl NAME``, ``hsd audit --samples-file F`` and
``hsd audit --endpoint URL`` keep working for one release, with one line on stderr naming the new one
(:func:`old_spelling_notice`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

from . import exact, extensions, variants
from .acceptance import closed_form_acceptance
from .methods import AR, SD, SLEM, SLRS, TLI, Method, State
from .worlds import Worldlet, builtin_world, from_spec


@dataclass(frozen=True)
class Row:
    """One line of the audit table."""

    name: str
    lossless: bool
    tv: float
    tokens_per_call: float
    acceptance: float
    closed_form: float | None
    psi_evaluations: str


def default_methods() -> list[Method]:
    """The methods ``hsd audit`` checks, in order."""
    return [AR(), SD(lookahead=2), SLEM(lookahead=2), TLI(lookahead=2), SLRS(lookahead=2),
            SLRS(lookahead=2, max_tokens=None),
            SLRS(lookahead=3, min_path_prob=0.05, proposal_map="longest_prefix"), SLEM(lookahead=2, greedy=True),
            TLI(lookahead=2, greedy=True), SLRS(lookahead=2, greedy=True)]


def label(m: Method) -> str:
    """A short display name (``TLI``, ``TLI/greedy``, ``SLRS/bounded``, ``variant:tli_raw_q`` ...)."""
    bounded = isinstance(m, SLRS) and m.bounded
    return m.name + ("/bounded" if bounded else "") + ("/greedy" if m.greedy else "")


def audit_row(m: Method, world: Worldlet, name: str | None = None) -> Row:
    """Exact audit of one method on ``world``."""
    drafter = world.same_vocab_drafter if isinstance(m, SD) else world.drafter
    a = exact.analyze(m, world.target, drafter, world.prompt, world.max_new_tokens)
    ref = exact.target_law(world.target, world.prompt, world.max_new_tokens, greedy=m.greedy)
    tv = exact.total_variation(a.law, ref)
    state = State(world.prompt, (), world.max_new_tokens)
    cf = closed_form_acceptance(m, world.target, drafter, state)
    psi = ""
    if type(m) is SLRS and not m.greedy:
        pl = m.psi(world.target, drafter, state)
        psi = f"{pl.evaluations} (naive {pl.naive_evaluations})"
    return Row(name or label(m), tv == 0, float(tv), float(a.tokens_per_call), float(a.first_acceptance),
               None if cf is None else float(cf), psi)


def format_rows(rows: Sequence[Row]) -> str:
    """The audit table as aligned text."""
    head = ("method", "exact law", "tokens/target call", "accept@1", "closed form", "psi drafter evals")
    body = [(r.name, "lossless" if r.lossless else f"LOSSY (TV {r.tv:.4f})", f"{r.tokens_per_call:.3f}",
             f"{r.acceptance:.3f}", "" if r.closed_form is None else f"{r.closed_form:.3f}", r.psi_evaluations)
            for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_audit() -> int:
    """Print the exact audit of every method and variant; returns 1 if a correct method is lossy."""
    world = builtin_world()
    print("hsd audit: exact output laws on the built-in toy world")
    print(f"  target vocab {list(world.target.vocab.tokens)} ({type(world.target.tokenizer).__name__}), "
          f"drafter vocab {list(world.drafter.vocab.tokens)} ({type(world.drafter.tokenizer).__name__}), "
          f"prompt {world.prompt!r}, max_new_tokens {world.max_new_tokens}")
    rows = [audit_row(m, world) for m in default_methods()]
    print()
    print(format_rows(rows))
    vrows = [audit_row(mk(), world, "variant:" + name) for name, mk in variants.VARIANTS.items()]
    print()
    print("Deliberately lossy variants (hsd_core.variants) on the same world (some bugs need a world "
          "that exposes them: see the pinned worlds below):")
    print(format_rows(vrows))
    print()
    print(f"The variants on their pinned worlds (hsd_core.variants.PINNED, max_new_tokens "
          f"{variants.PINNED_MAX_NEW_TOKENS}):")
    missed = []
    for name, mk in variants.VARIANTS.items():
        target, drafter, prompt = from_spec(variants.PINNED[name])
        n = variants.PINNED_MAX_NEW_TOKENS
        law = exact.output_law(mk(), target, drafter, prompt, n)
        ref = exact.target_law(target, prompt, n)
        tv = exact.total_variation(law, ref)
        diff = exact.first_difference(law, ref)
        if diff is None:
            missed.append(name)
            print(f"  {name:26s} lossless (NOT caught)")
        else:
            print(f"  {name:26s} LOSSY  TV {float(tv):.4f}  first differing sequence {diff[0]}: "
                  f"{diff[1]} vs target {diff[2]}")
    print()
    print("The token-tree variants on their pinned worlds (hsd_core.variants.TREE_PINNED, each with its "
          "max_new_tokens):")
    for name, mk in variants.TREE_VARIANTS.items():
        spec = variants.TREE_PINNED[name]
        target, drafter, prompt = from_spec(spec)
        n = int(spec["max_new_tokens"])
        law = exact.output_law(mk(), target, drafter, prompt, n)
        ref = exact.target_law(target, prompt, n)
        diff = exact.first_difference(law, ref)
        if diff is None:
            missed.append(name)
            print(f"  {name:32s} lossless (NOT caught)")
        else:
            print(f"  {name:32s} LOSSY  TV {float(exact.total_variation(law, ref)):.4f}  first differing "
                  f"sequence {diff[0]}: {diff[1]} vs target {diff[2]}")
    print()
    print("accept@1: probability that the first proposal of the first round is accepted (enumerated);"
          " closed form: the paper's one-position formula.")
    bad = [r.name for r in rows if not r.lossless]
    if bad or missed:
        print(f"ERROR: lossy methods: {bad}; variants not caught: {missed}")
        return 1
    return 0


def check_report_path(path: str) -> str | None:
    """Why ``path`` cannot take the sampled audit's report (None if it can): checked before any
    sampling, so a bad path fails in a second rather than after the whole audit. The report's folder
    is created; the PNGs go next to the report, so the path must name a file."""
    if not path or not path.strip():
        return "--report needs a file path (e.g. out/report.md); an empty path would scatter the PNGs"
    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        return f"--report {path!r} is a folder; name the report file in it (e.g. {os.path.join(path, 'report.md')})"
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        existed = os.path.exists(path)
        with open(path, "a", encoding="utf-8"):
            pass
        if not existed:
            os.remove(path)
    except OSError as e:
        return f"--report {path!r} cannot be written: {e.strerror or e}"
    return None


AUDIT_HELP = "the exact toy audit; hsd audit model|samples|endpoint|vllm: a real sampler or engine"

AUDIT_KINDS: dict[str, str] = {
    "model": "a Python implementation's sampler (--impl hsd_torch|transformers) over checkpoints",
    "samples": "an engine's recorded draws (a samples file) against --target's law",
    "endpoint": "draws sampled from an OpenAI-compatible server against --target's law",
    "vllm": "vLLM in its own venv: draws with and without speculation, audited",
}
"""The ``hsd audit KIND`` subcommands (name -> help line), each with only its own options; the
extensions registered under ``hsd.audit_impls`` serve them (:class:`hsd_core.extensions.AuditImpl`)."""

_AUDIT_USAGE = ("hsd audit [-h] [--sampled N] [--report PATH.md]\n"
                "       hsd audit {" + ",".join(AUDIT_KINDS) + "} [-h] ...")
_AUDIT_EPILOG = ("the subcommands, each with its own options and examples (hsd audit KIND -h):\n"
                 + "\n".join(f"  {k:9s} {h}" for k, h in AUDIT_KINDS.items())
                 + "\n  (engines on the conformance kit: hsd conformance)\n\n"
                 "examples:\n  hsd audit\n  hsd audit --sampled 20000 --report out/report.md")


class _ProbeError(Exception):
    """Raised by the first, quiet parse where argparse would print an error and exit."""


class _ProbeParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _ProbeError(message)


def build_parser(commands: Mapping[str, str | None], impls: Sequence[str],
                 impl_options: Sequence[extensions.AuditImpl] = (), *, probe: bool = False) -> argparse.ArgumentParser:
    """The ``hsd`` parser: the registered ``commands`` (name -> help line) and ``audit``, the toy
    audit (``--sampled``, ``--report``). ``audit`` also parses the old spelling (kept one release):
    ``--impl`` (the registered ``impls``) and the options of ``impl_options``, none of them in its
    help, which lists the ``hsd audit KIND`` subcommands instead. A probe parser neither prints help
    nor accepts abbreviations, and raises instead of exiting."""
    cls = _ProbeParser if probe else argparse.ArgumentParser
    parser = cls(prog="hsd", description="Verify lossless speculative decoding.", add_help=not probe,
                 allow_abbrev=not probe)
    sub = parser.add_subparsers(dest="command")
    for name, help_ in commands.items():
        sub.add_parser(name, add_help=False, help=help_)
    audit_p = sub.add_parser("audit", help=AUDIT_HELP, add_help=not probe, allow_abbrev=not probe,
                             usage=_AUDIT_USAGE, epilog=_AUDIT_EPILOG,
                             description="The exact audit of every method and deliberately lossy variant on the "
                                         "built-in toy world (no torch needed).",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    audit_p.add_argument("--sampled", type=int, default=0, metavar="N",
                         help="also audit every method and variant by sampling N outputs each (default 0: skip)")
    audit_p.add_argument("--report", default=None, metavar="PATH.md",
                         help="with --sampled, write a markdown report (and PNG plots if matplotlib is installed)")
    # the old spelling --impl NAME: the names come from the metadata (nothing imported); with none
    # registered any NAME parses and the run says what to install
    audit_p.add_argument("--impl", choices=list(impls) or None, metavar=None if impls else "NAME", default=None,
                         help=argparse.SUPPRESS)
    added: list[Callable[[argparse.ArgumentParser], None]] = []
    for ext in impl_options:
        if ext.add_arguments not in added:  # several names may register one extension
            added.append(ext.add_arguments)
            before = len(audit_p._actions)
            ext.add_arguments(audit_p)
            for action in audit_p._actions[before:]:  # hsd audit KIND -h lists them
                action.help = argparse.SUPPRESS
    return parser


def _parse(args_in: list[str], commands: Sequence[str],
           impls: Sequence[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace, extensions.AuditImpl | None]:
    """Parse an ``hsd`` command line that is neither a registered command's nor ``hsd audit KIND``'s,
    importing extensions only when it needs them. A quiet first parse with the core's options alone
    (no help, no abbreviations) decides: ``--impl NAME`` (the old spelling) imports that extension and
    parses with its options; a line the core's options account for, and ``hsd audit``'s help, import
    nothing; anything else (``hsd``'s help, an error, an abbreviation, an extension's option without
    ``--impl``: the old spelling ``--samples-file F`` / ``--endpoint URL``) imports every extension
    it can, so that the parse, the help and the errors are those of the whole command. Returns the
    parser, the arguments and the extension that runs them (None: the toy audit); raises
    :class:`~hsd_core.extensions.ExtensionUnavailable` if that one does not import."""
    bare = dict.fromkeys(commands)
    try:
        ns, rest = build_parser(bare, impls, probe=True).parse_known_args(args_in)
    except _ProbeError:
        ns, rest = argparse.Namespace(), ["?"]
    impl = getattr(ns, "impl", None)
    if impl is not None:  # hsd audit --impl NAME ...: that extension's options
        ext = extensions.load_audit_impl(impl)
        parser = build_parser(bare, impls, [ext])
        return parser, parser.parse_args(args_in), ext
    if not rest or (getattr(ns, "command", None) == "audit" and set(rest) <= {"-h", "--help"}):  # import nothing
        parser = build_parser(bare, impls)
        return parser, parser.parse_args(args_in), None
    helps: dict[str, str | None] = {}
    for name in commands:
        try:
            helps[name] = extensions.load_command(name).help
        except (extensions.ExtensionUnavailable, TypeError) as e:  # the help lists it all the same
            helps[name] = f"unavailable: {e}"
    loaded: dict[str, extensions.AuditImpl] = {}
    for name in impls:
        try:
            loaded[name] = extensions.load_audit_impl(name)
        except (extensions.ExtensionUnavailable, TypeError):
            pass  # its options are not offered; hsd audit KIND says what it needs
    parser = build_parser(helps, impls, list(loaded.values()))
    args = parser.parse_args(args_in)
    impl = getattr(args, "impl", None)
    if impl is None:
        given = _impl_options_given(args, list(loaded.values()))
        source = _source_extension(args, list(loaded.values()))
        if source is not None:  # --samples-file F / --endpoint URL: the engine's own draws, no --impl
            return parser, args, source
        if given:  # e.g. --samples N: the toy audit would run and ignore it
            parser.error(f"{', '.join(given)}: options of hsd audit {'|'.join(AUDIT_KINDS)} (hsd audit KIND -h), "
                         "given without one; without one hsd audit runs the exact toy audit (its sampled audit is "
                         "--sampled N)")
        return parser, args, None
    return parser, args, loaded[impl] if impl in loaded else extensions.load_audit_impl(impl)


def old_spelling_notice(args: argparse.Namespace) -> str:
    """The one line that ``hsd audit --impl NAME`` / ``--samples-file`` / ``--endpoint`` (the old
    spellings, kept one release) print on stderr: the new spelling."""
    name = getattr(args, "impl", None)
    if name is None:
        flag = "--samples-file" if getattr(args, "samples_file", None) is not None else "--endpoint"
        old, new = f"hsd audit {flag}", f"hsd audit {'samples' if flag == '--samples-file' else 'endpoint'} {flag}"
    elif name in AUDIT_KINDS:
        old, new = f"hsd audit --impl {name}", f"hsd audit {name}"
    else:
        old, new = f"hsd audit --impl {name}", f"hsd audit model --impl {name}"
    return f"hsd audit: note: `{old}` is now `{new}`; the old spelling goes in the next release"


def _model_impls(impls: Sequence[str]) -> list[str]:
    """The names ``hsd audit model --impl`` takes: a name that is also a kind (``vllm``) is that
    kind's own subcommand."""
    return [n for n in impls if n not in AUDIT_KINDS]


def _probe_impl(argv: Sequence[str]) -> str | None:
    """The value of ``--impl`` in ``argv`` (None if absent or unparseable), imports nothing."""
    probe = _ProbeParser(add_help=False, allow_abbrev=False)
    probe.add_argument("--impl")
    try:
        name: str | None = probe.parse_known_args(list(argv))[0].impl
    except _ProbeError:
        return None
    return name


def _kind_extension(kind: str, argv: Sequence[str], impls: Sequence[str]) -> extensions.AuditImpl:
    """The extension that serves ``hsd audit KIND ARGV``: for ``model``, the one ``--impl NAME``
    names (without a valid one, the first that serves ``model``, for the help and the error); for
    another kind, the one registered under the kind's name, else the first registered that serves
    it. Imports only what it tries; raises :class:`~hsd_core.extensions.ExtensionUnavailable` when
    none imports."""
    what = f"hsd audit {kind}"
    candidates = [kind] if kind in impls else list(impls)
    if kind == "model":
        candidates = _model_impls(impls)
        name = _probe_impl(argv)
        if name in candidates:
            candidates, what = [name], f"hsd audit model --impl {name}"
    unavailable: list[Exception] = []
    for name in candidates:
        try:
            ext = extensions.load_audit_impl(name, what)
        except extensions.ExtensionUnavailable as e:
            unavailable.append(e)
            continue
        if kind in ext.kinds or (kind == "model" and not ext.kinds):
            return ext
    if unavailable:
        raise unavailable[0]
    served = (f"{extensions.AUDIT_IMPLS} has {', '.join(impls)}, none of which serves it" if impls
              else f"nothing is registered under the entry-point group {extensions.AUDIT_IMPLS}")
    raise extensions.ExtensionUnavailable(f"{what} needs torch and transformers ({served}); {extensions.INSTALL_HINT}")


def build_kind_parser(kind: str, impls: Sequence[str], ext: extensions.AuditImpl) -> argparse.ArgumentParser:
    """The parser of ``hsd audit KIND``: ``ext``'s options for that kind alone (with its examples,
    if it sets an epilog), ``--report``, and for ``model`` ``--impl``. Every other option of ``ext``
    is in the namespace at its default, so that ``ext.run`` reads what it reads in the old spelling;
    ``args.impl`` is the kind's name where an extension is registered under it (``vllm``), else None."""
    p = argparse.ArgumentParser(prog=f"hsd audit {kind}", description=f"hsd audit {kind}: {AUDIT_KINDS[kind]}.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if kind == "model":
        names = _model_impls(impls)
        p.add_argument("--impl", required=True, choices=names or None, metavar=None if names else "NAME",
                       help="the implementation whose sampler is audited")
    ext.kinds.get(kind, ext.add_arguments)(p)
    p.add_argument("--report", default=None, metavar="PATH.md",
                   help="write the audit's report to PATH.md (markdown; a model audit adds PNG plots beside it "
                        "where matplotlib is installed)")
    every = argparse.ArgumentParser(add_help=False)
    ext.add_arguments(every)
    own = {a.dest for a in p._actions}
    p.set_defaults(**{a.dest: a.default for a in every._actions if a.dest not in own})
    if kind != "model":
        p.set_defaults(impl=kind if kind in impls else None)
    return p


def run_audit_kind(kind: str, argv: Sequence[str], impls: Sequence[str]) -> int:
    """``hsd audit KIND ARGV...``: parse with :func:`build_kind_parser` and run the extension that
    serves the kind; exit status 2 and one line when none imports (what to install)."""
    try:
        ext = _kind_extension(kind, argv, impls)
    except extensions.ExtensionUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    parser = build_kind_parser(kind, impls, ext)
    if kind == "model" and (name := _probe_impl(argv)) in AUDIT_KINDS:
        parser.error(f"--impl {name} is its own subcommand: hsd audit {name} (hsd audit {name} -h)")
    args = parser.parse_args(list(argv))
    if args.report is not None and (problem := check_report_path(args.report)) is not None:
        parser.error(problem)
    return ext.run(args)


SOURCE_OPTIONS = ("samples_file", "endpoint")
"""Options (argparse dests) that give the draws themselves (an engine's samples file, its server):
with one of them, ``hsd audit`` runs the extension that defines it without ``--impl``."""


def _source_extension(args: argparse.Namespace, exts: Sequence[extensions.AuditImpl]) -> extensions.AuditImpl | None:
    """The extension defining the first of :data:`SOURCE_OPTIONS` that ``args`` sets (None if none is set)."""
    for dest in SOURCE_OPTIONS:
        if getattr(args, dest, None) is None:
            continue
        for ext in exts:
            p = argparse.ArgumentParser(add_help=False)
            ext.add_arguments(p)
            if any(a.dest == dest for a in p._actions):
                return ext
    return None


def _impl_options_given(args: argparse.Namespace, exts: Sequence[extensions.AuditImpl]) -> list[str]:
    """The ``--impl`` extensions' options (not the core's) that ``args`` sets to other than their
    defaults, as ``--option`` strings."""
    out: list[str] = []
    for ext in exts:
        p = argparse.ArgumentParser(add_help=False)
        ext.add_arguments(p)
        for action in p._actions:
            if not action.option_strings:
                continue
            if getattr(args, action.dest, action.default) != action.default:
                opt = action.option_strings[-1]
                if opt not in out:
                    out.append(opt)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hsd`` console script. Ctrl-C exits with status 130 and one line."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("hsd: interrupted", file=sys.stderr)
        return 130


def run_command(name: str, argv: Sequence[str]) -> int:
    """``hsd NAME ...`` for a command registered under ``hsd.commands`` (``hsd generate``): the
    extension is imported only here, so that ``import hsd_core`` and ``hsd audit`` never import
    torch; a clear message, exit status 2, when it does not import."""
    try:
        command = extensions.load_command(name)
    except extensions.ExtensionUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    return command.main(argv)


def _main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    commands = [n for n in extensions.names(extensions.COMMANDS) if n != "audit"]
    if args_in[:1] and args_in[0] in commands:  # the command parses its own arguments
        return run_command(args_in[0], args_in[1:])
    impls = extensions.names(extensions.AUDIT_IMPLS)
    if args_in[:1] == ["audit"] and args_in[1:2] and args_in[1] in AUDIT_KINDS:
        return run_audit_kind(args_in[1], args_in[2:], impls)
    try:
        parser, args, impl = _parse(args_in, commands, impls)
    except extensions.ExtensionUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    if impl is not None:  # the old spelling of a real implementation or engine (imports torch)
        print(old_spelling_notice(args), file=sys.stderr)
        if args.report is not None and (problem := check_report_path(args.report)) is not None:
            parser.error(problem)
        return impl.run(args)
    if args.command in (None, "audit"):
        sampled, report = getattr(args, "sampled", 0), getattr(args, "report", None)
        if sampled < 0:
            parser.error("--sampled N needs N >= 0")
        if report is not None and sampled == 0:
            parser.error("--report needs --sampled N with N > 0")
        if report is not None:
            problem = check_report_path(report)
            if problem is not None:
                parser.error(problem)
        rc = run_audit()
        if sampled > 0:
            from .sampled_audit import sampled_audit_all
            rc = max(rc, sampled_audit_all([(label(m), m) for m in default_methods()], sampled, report))
        return rc
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
