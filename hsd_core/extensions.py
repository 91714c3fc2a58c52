"""Extensions: what other installed packages add to the ``hsd`` command and to ``hsd_lossless``.

``hsd_core`` imports nothing from the backend (``tests/test_imports.py`` checks it). A
package adds to hsd by registering objects under these entry-point groups in its metadata
(``[project.entry-points."GROUP"]`` in its pyproject.toml; this repository's registers the torch
backend's). ``hsd_core`` reads the names from the installed metadata, which imports nothing, and
imports an extension only when a command line or a call needs it: ``import hsd_core``, ``hsd audit``
and ``hsd_lossless`` with an exact law never import torch.

``hsd.commands``
    ``NAME = "module:attr"``, a :class:`Command`: ``hsd NAME ARGS...`` calls its ``main(ARGS)``
    (``hsd generate``).
``hsd.audit_impls``
    ``NAME = "module:attr"``, an :class:`AuditImpl`: the ``hsd audit KIND`` subcommands it serves
    (``hsd audit model --impl NAME``; ``samples``, ``endpoint``, ``vllm``: :data:`AuditImpl.kinds`)
    parse its options for that kind and call its ``run(args)``. The old spelling ``hsd audit --impl
    NAME ...`` (kept one release) adds all its options to the ``audit`` parser (several names may
    share one object, whose options are then added once).
``hsd.model_audits``
    ``NAME = "module:attr"``, a function ``(sample_fn, target, tokenizer, prompt, *, n, alpha, seed,
    **kw) -> report`` (the report as ``hsd_torch.auditing.first_tokens.audit_generate``'s): what ``hsd_lossless``
    runs for a target that is not an exact law (``Mapping``); the first one registered.

``hsd.sequence_audits``
    ``NAME = "module:attr"``, a function ``(sample_fn, target, tokenizer, prompts, *, n, alpha,
    seed, **kw) -> report`` (as ``hsd_torch.auditing.sequences.audit_sequences``): what ``hsd_lossless(...,
    sequences=True)`` runs for a model target; the first one registered.

An extension that is registered but does not import (torch missing), or a name that nothing
registers, raises :class:`ExtensionUnavailable` (an ``ImportError``), whose message says what to
install. Entry points are read from the installed metadata: after editing them, reinstall
(``pip install -e ".[dev,torch]"``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

__all__ = ["AUDIT_IMPLS", "COMMANDS", "INSTALL_HINT", "MODEL_AUDITS", "SEQUENCE_AUDITS", "AuditImpl", "Command",
           "ExtensionUnavailable", "load_audit_impl", "load_command", "load_model_audit", "load_sequence_audit", "names"]

COMMANDS = "hsd.commands"
AUDIT_IMPLS = "hsd.audit_impls"
MODEL_AUDITS = "hsd.model_audits"
SEQUENCE_AUDITS = "hsd.sequence_audits"
INSTALL_HINT = ('install the torch extra: pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu '
                '&& pip install -e ".[torch]" (a CPU torch; on a GPU machine your own CUDA torch first)')


@dataclass(frozen=True)
class Command:
    """An ``hsd NAME ...`` subcommand: ``help`` is its line in ``hsd -h``; ``main(argv)`` parses
    the arguments after ``NAME`` itself and returns the exit status."""

    help: str
    main: Callable[[Sequence[str]], int]


@dataclass(frozen=True)
class AuditImpl:
    """An implementation or engine that ``hsd audit`` audits. ``run(args)`` returns the exit status
    (``args.impl`` is the name it was chosen by; None for ``hsd audit samples`` and ``endpoint``).

    ``kinds`` maps each ``hsd audit KIND`` subcommand it serves (a name of
    :data:`hsd_core.cli.AUDIT_KINDS`) to the function that adds that subcommand's options alone;
    ``add_arguments(parser)`` adds every option it reads (the old spelling ``hsd audit --impl NAME``,
    kept one release). An extension without ``kinds`` is ``hsd audit model --impl NAME``, with the
    options of ``add_arguments``. A subcommand's namespace holds, besides its own options, every other
    option of ``add_arguments`` at its default, so that ``run`` reads the same names in both spellings
    (``--impl`` and ``--report`` are the core's)."""

    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    kinds: Mapping[str, Callable[[argparse.ArgumentParser], None]] = field(default_factory=dict)


class ExtensionUnavailable(ImportError):
    """A registered extension does not import (its dependencies are missing), or nothing is
    registered under the name asked for. The message names what needed it and what to install."""


def _entry_points(group: str) -> list[EntryPoint]:
    """The entry points of ``group``, each name once (the first wins), in metadata order."""
    seen: dict[str, EntryPoint] = {}
    for ep in entry_points(group=group):
        seen.setdefault(ep.name, ep)
    return list(seen.values())


def names(group: str) -> list[str]:
    """The names registered under ``group`` (read from the metadata: nothing is imported)."""
    return [ep.name for ep in _entry_points(group)]


def _load(group: str, name: str | None, what: str) -> Any:
    """Import the extension ``name`` of ``group`` (None: the first registered); ``what`` names the
    feature that needs it in the error."""
    eps = _entry_points(group)
    ep = next((e for e in eps if name is None or e.name == name), None)
    if ep is None:
        registered = f"nothing is registered under the entry-point group {group}" if not eps else \
            f"{group} has {', '.join(e.name for e in eps)}"
        raise ExtensionUnavailable(f"{what} needs torch and transformers ({registered}); {INSTALL_HINT}")
    try:
        return ep.load()
    except ImportError as e:
        raise ExtensionUnavailable(f"{what} needs torch and transformers ({e}); {INSTALL_HINT}") from e


def _check(obj: Any, kind: type[Any], group: str) -> Any:
    if not isinstance(obj, kind):
        raise TypeError(f"an entry point of {group} must name a {kind.__name__}, not {type(obj).__name__}")
    return obj


def load_command(name: str) -> Command:
    """The :class:`Command` registered as ``name`` under ``hsd.commands``."""
    cmd: Command = _check(_load(COMMANDS, name, f"hsd {name}"), Command, COMMANDS)
    return cmd


def load_audit_impl(name: str, what: str | None = None) -> AuditImpl:
    """The :class:`AuditImpl` registered as ``name`` under ``hsd.audit_impls`` (``what``: the command
    that needs it, for the error; default ``hsd audit --impl NAME``)."""
    impl: AuditImpl = _check(_load(AUDIT_IMPLS, name, what or f"hsd audit --impl {name}"), AuditImpl, AUDIT_IMPLS)
    return impl


def load_model_audit() -> Callable[..., Any]:
    """The first function registered under ``hsd.model_audits``."""
    fn = _load(MODEL_AUDITS, None, "hsd_lossless with a model (not a Mapping law)")
    if not callable(fn):
        raise TypeError(f"an entry point of {MODEL_AUDITS} must name a function, not {type(fn).__name__}")
    audit: Callable[..., Any] = fn
    return audit


def load_sequence_audit() -> Callable[..., Any]:
    """The first function registered under ``hsd.sequence_audits``."""
    fn = _load(SEQUENCE_AUDITS, None, "hsd_lossless(..., sequences=True) with a model")
    if not callable(fn):
        raise TypeError(f"an entry point of {SEQUENCE_AUDITS} must name a function, not {type(fn).__name__}")
    audit: Callable[..., Any] = fn
    return audit
