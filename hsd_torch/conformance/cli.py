"""``hsd conformance``'s command line: ``kit`` (:func:`hsd_torch.conformance.kit.build_kit`) and ``run``
(:func:`hsd_torch.conformance.matrix.main`), apart from both so that neither imports the other's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .kit import build_kit
from .matrix import add_arguments
from .matrix import main as run_main

__all__ = ["main"]


def main(argv: Any = None) -> int:
    """``hsd conformance kit --out DIR [--no-gguf]``: write the kit (:mod:`hsd_torch.conformance.kit`). A folder that
    cannot be written: one ``error:`` line, exit status 2. ``hsd conformance run ...``: the matrix
    (:func:`hsd_torch.conformance.matrix.main`)."""
    import argparse
    import sys
    import time

    ap = argparse.ArgumentParser(prog="hsd conformance", description="Conformance of serving engines against exact "
                                 "laws (docs/conformance.md).")
    sub = ap.add_subparsers(dest="what", required=True)
    k = sub.add_parser("kit", help="write the kit of tiny designed checkpoints (HF folders, GGUF, kit.json)")
    k.add_argument("--out", required=True, metavar="DIR")
    k.add_argument("--no-gguf", action="store_true", help="skip the GGUF exports")

    r = sub.add_parser("run", help="the matrix: engines x speculative modes x processing cases over the kit, "
                       "audited against its exact laws, with a report (exit 0: every case conforms)")
    add_arguments(r)
    args = ap.parse_args(argv)
    if args.what == "run":
        return run_main(args, f"{ap.prog} run")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"{ap.prog}: error: --out {args.out!r} is a file; give a folder (created if missing)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        paths = build_kit(out, gguf=not args.no_gguf)
    except OSError as e:
        print(f"{ap.prog}: error: writing to --out {args.out!r} failed ({e.strerror or type(e).__name__})",
              file=sys.stderr)
        return 2
    for name, p in paths.items():
        print(f"{name}: {p}")
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0
