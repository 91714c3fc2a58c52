"""The column spaces ``hsd_torch.generate`` computes its laws on, against the definitions they
replace: the processed law of ``process_logits`` (every id a law may put mass on, in hsd_core's
order), the pushforward of a law along a many-to-one map, and the cache's prefix search."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hsd_torch.generate import process_logits  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402
from hsd_torch.vocab import _Push  # noqa: E402

gen = importlib.import_module("hsd_torch.engine.entry")  # the module of the function hsd_torch.generate
from hsd_torch.engine.laws import TextSpace, space_law  # noqa: E402
from hsd_torch.engine.runner import common_prefix  # noqa: E402
CPU = torch.device("cpu")


@given(st.lists(st.integers(0, 2), max_size=40), st.integers(0, 40), st.lists(st.integers(0, 2), max_size=6))
@settings(max_examples=400, deadline=None)
def test_common_prefix(a: list[int], cut: int, tail: list[int]) -> None:
    b = a[:cut] + tail
    m = 0
    while m < min(len(a), len(b)) and a[m] == b[m]:
        m += 1
    assert common_prefix(a, b) == m


@pytest.mark.parametrize("ids", [[4, 5, 6, 7, 2], list(range(8)), [2, 3, 4], [1, 3, 5, 7, 0], [0, 1, 5, 6, 3, 7, 2]])
def test_space_select_is_the_columns(ids: list[int]) -> None:
    """A slice (one run of ids) or one index_select: either way the columns ``ids``, in order."""
    space = TextSpace(ids, 8, CPU)
    x = torch.randn(2, 3, 8)
    assert torch.equal(space.select(x), x[..., ids])
    assert torch.equal(space.select(x[:, 1]), x[:, 1][..., ids])
    assert all(space.pos[i] == c for c, i in enumerate(ids))
    assert sum(p >= 0 for p in space.pos) == len(ids)


@pytest.mark.parametrize("kind", ["byte_bpe", "unigram", "bpe_fallback"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("proc", [dict(temperature=1.0, top_k=None, top_p=None),
                                  dict(temperature=0.7, top_k=5, top_p=None),
                                  dict(temperature=1.3, top_k=None, top_p=0.6),
                                  dict(temperature=1.0, top_k=10**6, top_p=None)])
def test_space_law_is_the_processed_law(kind: str, dtype: torch.dtype, proc: dict[str, Any],
                                        toks: dict[str, Any]) -> None:
    """The law over the text space (ids with text increasing, EOS last; padded ids beyond the
    tokenizer dropped) is process_logits' law at those columns, and process_logits has no mass
    anywhere else: the same law, up to float rounding."""
    tok = toks[kind]
    width = len(tok) + 7  # a padded embedding
    text = TokenText(tok, width)
    space = TextSpace.text(text, CPU)
    assert space.ids[-1] == text.eos_id and space.ids[:-1] == sorted(space.ids[:-1])
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(3, 2, width, generator=g) * 4).to(dtype)
    logits[0, 0, :] = logits[0, 0, 5]  # ties everywhere
    full = process_logits(logits, text.text_mask, **proc)
    got = space_law(logits, space, ~text.text_mask, **proc)
    assert got.dtype == full.dtype and got.shape == (3, 2, space.n)
    rest = torch.ones(width, dtype=torch.bool)
    rest[space.cols] = False
    assert float(full[..., rest].abs().max()) == 0.0
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(got, full[..., space.cols], rtol=tol, atol=tol)


@pytest.mark.parametrize("split", [False, True])
def test_push_adds_the_masses_of_each_destination(split: bool) -> None:
    """_Push (hsd_torch.vocab, used by generate and by VocabBridge.push) is the pushforward: out[t] =
    sum of x[c] over the columns with dst[c] = t, added in ascending c (bit for bit: float32, sums of
    many terms); columns mapped to -1 are dropped; destinations nothing maps to get 0. The same
    with one index_add_ (the CPU's) and with the multiplicity levels used elsewhere."""
    g = np.random.default_rng(2)
    for trial in range(60):
        n_in, n_out = int(g.integers(1, 40)), int(g.integers(1, 9))
        dst = g.integers(-1 if trial % 2 else 0, n_out, size=n_in).tolist()
        push = _Push(dst, n_out, CPU, split=split)
        x = torch.tensor(g.random((2, 3, n_in)), dtype=torch.float32)
        want = torch.zeros(2, 3, n_out, dtype=torch.float32)
        for c, t in enumerate(dst):
            if t >= 0:
                want[..., t] += x[..., c]
        assert torch.equal(push(x), want), (trial, dst)
        kept = [t for t in dst if t >= 0]
        depth = max((kept.count(t) for t in set(kept)), default=0)
        assert len(push.levels) == (max(depth, 1) if split else 1)
    assert _Push([0, 1, 2], 3, CPU, split=True).levels[0][0] is None  # one-to-one: no index_select
    assert _Push([1, 0, 1], 2, CPU).levels[0][0] is None  # the CPU's one index_add_ reads x itself
    assert _Push([], 2, CPU)(torch.ones(4, 0)).tolist() == [[0.0, 0.0]] * 4
    with pytest.raises(ValueError, match="outside"):
        _Push([0, 3], 3, CPU)
    with pytest.raises(ValueError, match="outside"):
        _Push([0, -2], 3, CPU)


@pytest.mark.parametrize("method,target,tt,drafter,dt", [
    ("tli", "gpt2_uni_pad", "unigram", "gpt2_fb_pad", "bpe_fallback"),  # byte-fallback ids share strings
    ("slrs", "llama_bpe", "byte_bpe", "gpt2_uni_pad", "unigram"),  # many drafter ids per first target id
])
def test_generate_with_the_off_cpu_pushforward(method: str, target: str, tt: str, drafter: str, dt: str,
                                               toks: dict[str, Any], models: dict[str, Any],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The pushforward a GPU runs (one index_add_ per multiplicity level, where the CPU runs one
    index_add_) gives generate the same sampled tokens and the same uniforms, row for row: this is
    the device-specific part of TLI's q and SLRS's psi, checked here without a GPU."""
    kw: dict[str, Any] = dict(target_tokenizer=toks[tt], drafter_tokenizer=toks[dt], method=method,
                              lookahead=1 if method == "slrs" else 3, max_new_tokens=8, seed=3, record_uniforms=True)
    prompts = ["def foo(x):\n", "Hello", "naïve café", "x"]
    plain = gen.generate(models[target], models[drafter], prompts, **kw)
    real_init = _Push.__init__
    built: list[_Push] = []

    def levels_init(self: _Push, dst: Any, n_out: int, device: torch.device, split: bool | None = None) -> None:
        real_init(self, dst, n_out, device, split=True)
        built.append(self)

    monkeypatch.setattr(_Push, "__init__", levels_init)
    cols = importlib.import_module(f"hsd_torch.methods.{method}")  # the method's column maps, cached per device
    monkeypatch.setattr(cols, "_COLUMNS", type(cols._COLUMNS)(16))  # build them anew
    split = gen.generate(models[target], models[drafter], prompts, **kw)
    assert built and max(len(p.levels) for p in built) > 1, "the pushforward had no repeated destination"
    assert split.sequences == plain.sequences
    assert split.uniforms == plain.uniforms
