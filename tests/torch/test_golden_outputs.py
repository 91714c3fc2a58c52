"""Golden outputs of ``hsd_torch.generate``: the exact sequences, statistics
and consumed uniforms of every method, greedy and sampled, batch 1 and batch 4, on the tiny pairs
of ``conftest.py``, recorded before the backend's layout was reorganized
(``tests/torch/golden/generate.json``). A move of code must not change a single token, count or
uniform: the comparison is exact (uniforms as ``float.hex``).

The worlds are deterministic (``tests/torch/models/test_tiny_determinism.py``), the models float64 on
one thread, so the file holds on every clean clone. Re-record only for a change that is meant to
change outputs, and say so in its commit: ``python tests/torch/test_golden_outputs.py --record``
(``--record-new``: only the cases the file lacks, e.g. new methods, the others untouched).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from hsd_core.methods.tree import Dynamic, Static

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

GOLDEN = Path(__file__).resolve().parent / "golden" / "generate.json"
PROMPTS = ["def foo(x):\n", "Hello", "naïve café", "for i in range(10):\n    "]
MAX_NEW = 12

# (target model, target tokenizer, drafter model, drafter tokenizer, drafter temperature): conftest's
PAIRS: dict[str, tuple[str, str, str, str, float | None]] = {
    "bpe<-gpt2": ("llama_bpe", "byte_bpe", "gpt2_bpe", "byte_bpe", None),
    "bpe<-self": ("llama_bpe", "byte_bpe", "llama_bpe", "byte_bpe", 1.5),
    "fallback<-bpe": ("gpt2_fb_pad", "bpe_fallback", "llama_bpe", "byte_bpe", None),
    "bpe<-unigram": ("llama_bpe", "byte_bpe", "gpt2_uni_pad", "unigram", None),
    "unigram<-fallback": ("gpt2_uni_pad", "unigram", "gpt2_fb_pad", "bpe_fallback", None),
}
BOUNDED = {"method": "slrs", "lookahead": 3, "proposal_map": "longest_prefix", "min_path_prob": 0.05}
# (case name, pair, generate's options)
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("ar", "fallback<-bpe", {"method": "ar"}),
    ("sd", "bpe<-gpt2", {"method": "sd", "lookahead": 3}),
    ("sd-self", "bpe<-self", {"method": "sd", "lookahead": 4}),
    ("sd-topk", "bpe<-gpt2", {"method": "sd", "lookahead": 3, "top_k": 20}),
    ("tli", "fallback<-bpe", {"method": "tli", "lookahead": 3}),
    ("tli-uni", "bpe<-unigram", {"method": "tli", "lookahead": 4}),
    ("tli-topp", "unigram<-fallback", {"method": "tli", "lookahead": 3, "top_p": 0.9}),
    ("slem", "fallback<-bpe", {"method": "slem", "lookahead": 3}),
    ("slem-uni", "unigram<-fallback", {"method": "slem", "lookahead": 4}),
    ("slrs", "fallback<-bpe", {"method": "slrs", "lookahead": 1}),
    ("slrs-uni", "bpe<-unigram", {"method": "slrs", "lookahead": 1}),
    ("slrs-bounded", "fallback<-bpe", BOUNDED),
    ("slrs-bounded-uni", "unigram<-fallback", dict(BOUNDED, top_k=50)),
    ("slrs-multi", "fallback<-bpe", dict(BOUNDED, max_tokens=None)),
    ("slrs-multi-2", "bpe<-unigram", dict(BOUNDED, max_tokens=2)),
    # a drafter that is the target at another temperature: most drafts accepted (the other paths)
    ("tli-self", "bpe<-self", {"method": "tli", "lookahead": 4}),
    ("slem-self", "bpe<-self", {"method": "slem", "lookahead": 4}),
    ("slrs-self", "bpe<-self", {"method": "slrs", "lookahead": 1}),
    ("slrs-bounded-self", "bpe<-self", BOUNDED),
    ("slrs-multi-self", "bpe<-self", dict(BOUNDED, max_tokens=None)),
    # token trees (issue 50), recorded when they were added
    ("sd-tree", "bpe<-self", {"method": "sd", "tree": Static((2, 2, 1))}),
    ("sd-tree-dynamic", "bpe<-gpt2", {"method": "sd", "tree": Dynamic(6, 2, 4), "tree_draws": "iid"}),
    ("tli-tree", "fallback<-bpe", {"method": "tli", "tree": Static((3, 1))}),
    ("slem-tree", "bpe<-self", {"method": "slem", "tree": Dynamic(5, 2, 3)}),
]


def _cases() -> list[tuple[str, str, dict[str, Any], bool, int]]:
    return [(name, pair, kw, sample, batch) for name, pair, kw in CASES for sample in (False, True)
            for batch in (1, 4)]


def key(name: str, sample: bool, batch: int) -> str:
    return f"{name}/{'sampled' if sample else 'greedy'}/b{batch}"


def run(pair: str, kw: dict[str, Any], sample: bool, batch: int, toks: dict[str, Any],
        models: dict[str, Any]) -> dict[str, Any]:
    """One case's output as plain JSON data: sequences, every RowStats count but the wall time,
    and the consumed uniforms as ``float.hex``."""
    from hsd_torch import generate

    t, tt, d, dt, dtemp = PAIRS[pair]
    out = generate(models[t], None if kw["method"] == "ar" else models[d], PROMPTS[:batch],
                   target_tokenizer=toks[tt], drafter_tokenizer=None if kw["method"] == "ar" else toks[dt],
                   max_new_tokens=MAX_NEW, do_sample=sample, seed=7, drafter_temperature=dtemp,
                   record_uniforms=sample, mask_textless=True, **kw)  # recorded with ids without text removed
    stats = [{k: v for k, v in asdict(s).items() if k != "wall_time"} for s in out.stats]
    uniforms = None if out.uniforms is None else [[float(u).hex() for u in row] for row in out.uniforms]
    return {"sequences": out.sequences, "stats": stats, "uniforms": uniforms}


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


@pytest.mark.parametrize("name,pair,kw,sample,batch", _cases(), ids=[key(c[0], c[3], c[4]) for c in _cases()])
def test_outputs_equal_the_golden_ones(name: str, pair: str, kw: dict[str, Any], sample: bool, batch: int,
                                       toks: dict[str, Any], models: dict[str, Any], golden: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    got = run(pair, kw, sample, batch, toks, models)
    want = golden[key(name, sample, batch)]
    assert got["sequences"] == want["sequences"]
    assert got["stats"] == want["stats"]
    assert got["uniforms"] == want["uniforms"]


def test_the_golden_file_covers_every_case(golden: dict[str, Any]) -> None:
    """Every case has its record (and no stale one stays), and the sampled records consumed uniforms."""
    assert set(golden) == {key(c[0], c[3], c[4]) for c in _cases()}
    for k, v in golden.items():
        assert (v["uniforms"] is not None) == k.endswith(("sampled/b1", "sampled/b4"))
        if v["uniforms"] is not None:
            assert all(v["uniforms"]), k


def _record() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import conftest

    torch.set_num_threads(1)
    toks = conftest.toks.__wrapped__()  # type: ignore[attr-defined]
    models = conftest.models.__wrapped__(toks)  # type: ignore[attr-defined]
    data = {key(n, s, b): run(p, kw, s, b, toks, models) for n, p, kw, s, b in _cases()}
    GOLDEN.write_text(json.dumps(data, indent=None, separators=(",", ":")) + "\n")
    print(f"recorded {len(data)} cases in {GOLDEN}")


def _record_new() -> None:
    """Record only the cases the file lacks (cases added since; the others left byte for byte)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import conftest

    torch.set_num_threads(1)
    toks = conftest.toks.__wrapped__()  # type: ignore[attr-defined]
    models = conftest.models.__wrapped__(toks)  # type: ignore[attr-defined]
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    new = {key(n, s, b): run(p, kw, s, b, toks, models) for n, p, kw, s, b in _cases() if key(n, s, b) not in data}
    GOLDEN.write_text(json.dumps({**data, **new}, indent=None, separators=(",", ":")) + "\n")
    print(f"recorded {len(new)} new cases in {GOLDEN}")


if __name__ == "__main__" and "--record" in sys.argv:
    _record()
elif __name__ == "__main__" and "--record-new" in sys.argv:
    _record_new()
