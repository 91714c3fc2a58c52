"""The conformance kit as files engines load (:mod:`hsd_torch.conformance.kit`): Hugging Face folders
and GGUF exports of :mod:`hsd_core.conformance`'s designed checkpoints, and ``hsd conformance``."""

from __future__ import annotations

from hsd_core.extensions import Command

__all__ = ["COMMAND"]


def _main(argv: object) -> int:
    from .cli import main

    return main(argv)


COMMAND = Command(help="conformance of serving engines: hsd conformance kit --out DIR writes the kit of tiny designed "
                       "checkpoints (docs/conformance.md)", main=_main)
