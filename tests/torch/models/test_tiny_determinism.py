"""``hsd_torch.models.tiny`` builds the same world in every process: the tokenizers
of every kind (vocabulary, merges, scores: the whole serialized JSON) and the models of
``conftest.py``'s ``models`` fixture, plus ``tiny_pair``, a Qwen2, a small Unigram (more characters
than pieces) and ``tokenizer_from_strings``, have equal digests when built in two fresh interpreters
with different ``PYTHONHASHSEED`` (and Rayon thread counts) and in this test process.

Before the fix, ``tokenizers``' ``UnigramTrainer`` gave the Unigram tokenizer other scores and ids
in every process (its words sit in a Rust hash map with per-process keys; see
``hsd_torch/models/_unigram.py``), so the models over it (same weights) gave their laws to other strings;
this test then failed on the ``unigram`` digests (each of 7 processes tried had its own
vocabulary order). Every digest is a plain equality: no tolerance, no seed to be lucky with.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

HERE = Path(__file__).resolve()
KINDS = ("byte_bpe", "unigram", "bpe_fallback")
TEXTS = ["def foo(x):\n    return x ** 2  # comment\n", "naïve café, 日本語 😀", "  two  spaces\r\n"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tokenizer_digests(tok: Any) -> dict[str, str]:
    """The serialized JSON (model vocabulary with scores or merges, normalizer, pre-tokenizer,
    decoder, added tokens), the ``get_vocab()`` contents, and the ids of a few texts."""
    return {"json": _sha(tok.backend_tokenizer.to_str().encode()),
            "vocab": _sha(repr(sorted(tok.get_vocab().items())).encode()),
            "ids": _sha(repr([tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]).encode())}


def model_digest(model: Any) -> str:
    """Every parameter and buffer (name, dtype, shape, bytes) and the config."""
    h = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def build_models(toks: dict[str, Any]) -> dict[str, Any]:
    """The models of ``conftest.py``'s ``models`` fixture (``test_processes_build_the_same_world`` checks
    they are)."""
    from _torch_checks import tiny_world_models

    return tiny_world_models(toks)


def world_digests(toks: dict[str, Any] | None = None, models: dict[str, Any] | None = None,
                  extras: bool = True) -> dict[str, Any]:
    """Digests of the tiny world: ``toks``/``models`` as given (default: built here)."""
    from hsd_torch.models import tiny

    toks = toks if toks is not None else {k: tiny.tiny_tokenizer(k) for k in KINDS}
    models = models if models is not None else build_models(toks)
    out: dict[str, Any] = {f"tokenizer/{k}": tokenizer_digests(toks[k]) for k in KINDS}
    out.update({f"model/{name}": model_digest(m) for name, m in sorted(models.items())})
    if extras:
        target, tt, drafter, dt = tiny.tiny_pair()
        out["tiny_pair"] = [model_digest(target), model_digest(drafter)]
        out["tiny_qwen2"] = model_digest(tiny.tiny_qwen2(toks["unigram"], seed=4))
        small = tiny.tiny_tokenizer("unigram", vocab_size=300, max_bytes=20_000)
        out["tokenizer/unigram-300"] = tokenizer_digests(small)
        strings = tiny.tokenizer_from_strings(["a", "b", "ab", "a", "ab", "abc"])
        out["tokenizer/from_strings"] = _sha(strings.to_str().encode())
    return out


def _start(hash_seed: str, rayon_threads: str) -> subprocess.Popen[str]:
    """A fresh interpreter that prints ``world_digests()`` as JSON."""
    env = dict(os.environ, PYTHONHASHSEED=hash_seed, RAYON_NUM_THREADS=rayon_threads, HF_HUB_OFFLINE="1")
    env.pop("TOKENIZERS_PARALLELISM", None)
    code = ("import json, runpy, sys; sys.path.insert(0, sys.argv[2]); "  # tests/torch: the shared _torch_checks
            "print(json.dumps(runpy.run_path(sys.argv[1])['world_digests']()))")
    return subprocess.Popen([sys.executable, "-c", code, str(HERE), str(HERE.parents[1])], env=env,
                            cwd=HERE.parents[3], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def test_processes_build_the_same_world(toks: dict[str, Any], models: dict[str, Any]) -> None:
    """Two fresh interpreters (PYTHONHASHSEED 0 with one Rayon thread, 1 with two) and this process
    (its own hash seed, conftest's ``toks`` and ``models`` fixtures) give equal digests, key by key;
    so the fixtures are also the world the subprocesses build."""
    procs = [_start("0", "1"), _start("1", "2")]
    try:
        assert set(toks) == set(KINDS) and set(models) == set(build_models(toks))
        here = world_digests(toks, models, extras=False)
        first, second = (_result(p) for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert first.keys() == second.keys() and here.keys() < first.keys()
    assert len(first) == 3 + 4 + 4
    differ = sorted(k for k in first if first[k] != second[k])
    assert not differ, f"built differently in two processes: {differ}"
    differ = sorted(k for k in here if here[k] != first[k])
    assert not differ, f"conftest's fixtures differ from a fresh build: {differ}"


def test_unigram_pieces_are_trained() -> None:
    """The Unigram tokenizer is a genuine trained Unigram LM: multi-character pieces with
    log-probability scores (by decreasing score, about a law), every character of the corpus a
    piece, byte fallback at ids 4..259."""
    import math

    from tokenizers import pre_tokenizers

    from hsd_torch.models import tiny

    tok = tiny.tiny_tokenizer("unigram")
    model = json.loads(tok.backend_tokenizer.to_str())["model"]
    assert model["type"] == "Unigram" and model["byte_fallback"] and len(tok) == 520
    assert [p for p, _ in model["vocab"][4:260]] == [f"<0x{b:02X}>" for b in range(256)]
    pieces = dict(model["vocab"][260:])
    scores = list(pieces.values())
    assert all(s < 0 for s in scores) and scores == sorted(scores, key=lambda s: -round(s, 6))
    assert abs(math.fsum(math.exp(s) for s in scores) - 1.0) < 0.05
    assert sum(len(p) > 1 for p in pieces) > 100 and "▁def" in pieces and "▁return" in pieces
    meta = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    chars = {c for text in tiny.stdlib_corpus(60_000) for w, _ in meta.pre_tokenize_str(text) for c in w}
    assert chars <= set(pieces)
    assert tok.tokenize("def foo(x):")[:1] == ["▁def"]
