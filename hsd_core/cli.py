"""``hsd``: command-line entry point. ``hsd audit`` audits every method on the built-in world.

For each method (and each deliberately lossy variant) it prints whether the exact law of its
output equals the target's (and the total variation if not), the expected target tokens per
target call, the first-position acceptance (enumerated, and the paper's closed form), and for
SLRS the drafter evaluations psi needs (with prefix sharing, and without).

Other packages add to the command through entry points (:mod:`hsd_core.extensions`): ``hsd NAME``
for the commands registered under ``hsd.commands`` (``hsd generate``) and ``hsd audit --impl NAME``
for those under ``hsd.audit_impls``. This module imports none of them: it reads their names from
the installed metadata and imports one only when the command line needs it, so ``hsd audit`` runs
without torch, and ``hsd generate`` / ``hsd audit --impl`` without it say what to install.
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


IMPL_HELP = "audit a real implementation's first tokens over local checkpoints (needs torch)"


class _ProbeError(Exception):
    """Raised by the first, quiet parse where argparse would print an error and exit."""


class _ProbeParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _ProbeError(message)


def build_parser(commands: Mapping[str, str | None], impls: Sequence[str],
                 impl_options: Sequence[extensions.AuditImpl] = (), *, probe: bool = False,
                 epilog: str | None = None) -> argparse.ArgumentParser:
    """The ``hsd`` parser: the registered ``commands`` (name -> help line) and ``audit``, whose
    ``--impl`` takes the registered ``impls`` and which has the options of ``impl_options``. A probe
    parser neither prints help nor accepts abbreviations, and raises instead of exiting."""
    cls = _ProbeParser if probe else argparse.ArgumentParser
    parser = cls(prog="hsd", description="Verify lossless speculative decoding.", add_help=not probe,
                 allow_abbrev=not probe)
    sub = parser.add_subparsers(dest="command")
    for name, help_ in commands.items():
        sub.add_parser(name, add_help=False, help=help_)
    audit_p = sub.add_parser("audit", help="exact audit of every method on the built-in toy world",
                             add_help=not probe, allow_abbrev=not probe, epilog=epilog)
    audit_p.add_argument("--sampled", type=int, default=0, metavar="N",
                         help="also audit every method and variant by sampling N outputs each (default 0: skip)")
    audit_p.add_argument("--report", default=None, metavar="PATH.md",
                         help="with --sampled, write a markdown report (and PNG plots if matplotlib is installed)")
    # --impl NAME: the names come from the metadata (nothing imported); with none registered any
    # NAME parses and the run says what to install
    audit_p.add_argument("--impl", choices=list(impls) or None, metavar=None if impls else "NAME", default=None,
                         help=IMPL_HELP)
    added: list[Callable[[argparse.ArgumentParser], None]] = []
    for ext in impl_options:
        if ext.add_arguments not in added:  # several names may register one extension
            added.append(ext.add_arguments)
            ext.add_arguments(audit_p)
    return parser


def _parse(args_in: list[str], commands: Sequence[str],
           impls: Sequence[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace, extensions.AuditImpl | None]:
    """Parse an ``hsd`` command line that is not a registered command's, importing extensions only
    when it needs them. A quiet first parse with the core's options alone (no help, no
    abbreviations) decides: ``--impl NAME`` imports that extension and parses with its options; a
    line the core's options account for imports nothing; anything else (help, an error, an
    abbreviation, an extension's option without ``--impl``) imports every extension it can, so that
    the parse, the help and the errors are those of the whole command. Returns the parser, the
    arguments and the ``--impl`` extension (None without ``--impl``); raises
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
    if not rest:  # the core's options account for the whole line: import nothing
        parser = build_parser(bare, impls)
        return parser, parser.parse_args(args_in), None
    helps: dict[str, str | None] = {}
    for name in commands:
        try:
            helps[name] = extensions.load_command(name).help
        except (extensions.ExtensionUnavailable, TypeError) as e:  # the help lists it all the same
            helps[name] = f"unavailable: {e}"
    loaded: dict[str, extensions.AuditImpl] = {}
    missing: list[str] = []
    for name in impls:
        try:
            loaded[name] = extensions.load_audit_impl(name)
        except (extensions.ExtensionUnavailable, TypeError) as e:
            missing.append(str(e))
    parser = build_parser(helps, impls, list(loaded.values()), epilog=missing[0] if missing else None)
    args = parser.parse_args(args_in)
    impl = getattr(args, "impl", None)
    if impl is None:
        given = _impl_options_given(args, list(loaded.values()))
        source = _source_extension(args, list(loaded.values()))
        if source is not None:  # --samples-file F / --endpoint URL: the engine's own draws, no --impl
            return parser, args, source
        if given:  # e.g. --samples N: the toy audit would run and ignore it
            parser.error(f"{', '.join(given)}: options of hsd audit --impl {'|'.join(impls) or 'NAME'}, given without "
                         "--impl; without it hsd audit runs the exact toy audit (its sampled audit is --sampled N)")
        return parser, args, None
    return parser, args, loaded[impl] if impl in loaded else extensions.load_audit_impl(impl)


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
    try:
        parser, args, impl = _parse(args_in, commands, extensions.names(extensions.AUDIT_IMPLS))
    except extensions.ExtensionUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    if impl is not None:  # a real implementation, audited by an extension (imports torch)
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
