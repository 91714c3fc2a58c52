"""The flat module names ``hsd_torch`` had before its folders, kept importable.

``hsd_torch`` was one folder of modules; they now live in folders that show the architecture
(``engine/``, ``vocab/``, ``auditing/``, ``models/``, ``commands/``; README.md, "Layout"). Every old
dotted name still imports, and it is **the same module object** as the new one, so
``import hsd_torch.seqaudit``, ``from hsd_torch.tiny import tiny_llama``, ``python -m hsd_torch.tiny``
and ``monkeypatch.setattr(hsd_torch.kernels, ...)`` keep working and patch what the new name sees.

How: :data:`MOVED` maps each old name to its new module; :class:`OldNames`, a finder put first on
``sys.meta_path`` when ``hsd_torch`` is imported, answers an import of an old name by importing the
new module and registering that very object under the old name too (its ``__name__`` and
``__spec__`` stay the new ones). ``hsd_torch.generate`` is the function :func:`hsd_torch.generate`,
as it always was; the module of that name is registered in ``sys.modules`` when the package loads,
so that importing it never rebinds the package attribute.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import CodeType, ModuleType

#: "hsd_torch"; another name when a copy is imported beside it (bench/overhead_ab.py does)
PACKAGE = __name__.rpartition(".")[0]

#: old module (under ``hsd_torch``) -> its new place (under ``hsd_torch``).
MOVED: dict[str, str] = {
    "_args": "engine._args",
    "_cache": "engine._cache",
    "_columns": "engine._columns",
    "_head": "engine._head",
    "_ids": "auditing._ids",
    "_precision": "engine._precision",
    "_unigram": "models._unigram",
    "audit": "auditing.first_tokens",
    "cli": "commands.generate",
    "cli_args": "commands.args",
    "cli_audit": "commands.audit",
    "cli_engine": "commands.engine",
    "drafting": "engine.drafting",
    "engine_audit": "auditing.samples",
    "forcing": "auditing.forcing",
    "genconfig": "engine.genconfig",
    "generate": "engine.entry",
    "kernels": "engine.kernels",
    "laws": "engine.laws",
    "mirror": "models.mirror",
    "processors": "engine.processors",
    "prompts": "engine.prompts",
    "real_models": "models.real",
    "real_tokenizers": "models.real_tokenizers",
    "reference": "auditing.reference",
    "rounds": "engine.rounds",
    "runner": "engine.runner",
    "seqaudit": "auditing.sequences",
    "text": "vocab.text",
    "textaudit": "auditing.text_sequences",
    "tiny": "models.tiny",
    "variants": "auditing.variants",
    "verification": "engine.verification",
}


def new_name(old: str) -> str | None:
    """The new dotted name of an old one (``hsd_torch.seqaudit`` -> ``hsd_torch.auditing.sequences``;
    ``hsd_torch.seqaudit.audit_sequences``, a function, gives None), or None for a name that did not move."""
    prefix, _, short = old.partition(".")
    if prefix != PACKAGE or short not in MOVED:
        return None
    return f"{PACKAGE}.{MOVED[short]}"


class _AliasSpec(importlib.machinery.ModuleSpec):
    """The spec of an old name: ``parent`` is the new module's package, so that ``python -m
    hsd_torch.tiny`` (which runs the new module's code under ``__main__``) resolves its relative imports."""

    def __init__(self, old: str, new: str, loader: importlib.abc.Loader, origin: str | None) -> None:
        super().__init__(old, loader, origin=origin)
        self.new = new

    @property
    def parent(self) -> str:
        return self.new.rpartition(".")[0]


class _Alias(importlib.abc.Loader):
    """Loads an old name as the new module itself (imported once, under its new name)."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system has just set ``module.__spec__`` to the old name's spec: put the real one back
        module.__spec__ = self.spec

    def get_code(self, fullname: str) -> CodeType | None:
        """The new module's code (what ``runpy`` runs for ``python -m <old name>``)."""
        spec = importlib.util.find_spec(self.new)
        loader = spec.loader if spec is not None else None
        if not isinstance(loader, importlib.abc.InspectLoader):
            return None
        return loader.get_code(self.new)


class OldNames(importlib.abc.MetaPathFinder):
    """The finder of the old module names (see the module's docstring)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        spec = importlib.util.find_spec(new)
        if spec is None:
            return None
        return _AliasSpec(fullname, new, _Alias(new), spec.origin)


def install() -> None:
    """Put :class:`OldNames` first on ``sys.meta_path`` (once): first, so that no other finder (an
    editable install's, a stale copy's) answers an old name with a file of its own."""
    if not any(isinstance(f, OldNames) for f in sys.meta_path):
        sys.meta_path.insert(0, OldNames())


def old_module(short: str) -> ModuleType:
    """``hsd_torch.<short>`` for an old module name, imported (the package's ``__getattr__``)."""
    return importlib.import_module(f"{PACKAGE}.{short}")
