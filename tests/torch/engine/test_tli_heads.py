"""TLI drafts from top-p's kept heads and pushes its q from them (``hsd_torch.engine.drafting`` with
``DraftColumns.heads_read``, :meth:`hsd_torch.vocab.bridge._Push.heads`, :func:`hsd_torch.methods.tli.push_laws`),
with the bits of the dense path (every drafter column written out, one ``index_add_`` over all of them).

Checked deterministically (every comparison exact, no statistics):

* the push from heads against the push of the dense laws, bit for bit, float32 and float64, on maps
  where up to 12 source columns share one destination, with dropped columns (-1), padding entries,
  heads of 0 to all columns, values of magnitudes 1 to 2**-60 (so the order of addition shows), and
  positions mixing heads and dense tensors;
* teeth: the same data pushed with each head's entries added in reverse column order, or with one
  entry dropped, differs from the dense push on these rows (so the equality above is not a tautology);
* ``generate`` with TLI and top-p (temperature 0.8, top-p 0.9) on two tiny pairs (float64 models,
  and float32 copies; one pair whose drafter's byte-fallback ids share target columns), batch 1 and
  batch 3 with ragged rows, with and without ``min_confidence``: the same sequences, recorded
  uniforms and acceptances as the same run with the laws forced dense (``heads_read=False``, the
  path before), with the heads path counted;
* a drafter with tied logits (top-p's boundary falls inside a tie, so the dense law decides) and
  rounds whose positions mix heads and dense laws: the same outputs again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hsd_torch.engine import drafting  # noqa: E402
from hsd_torch.engine.kernels import HeadLaw  # noqa: E402
from hsd_torch.methods import tli as tli_mod  # noqa: E402
from hsd_torch.methods.tli import TLI, push_laws  # noqa: E402
from hsd_torch.vocab.bridge import _Push  # noqa: E402

CPU = torch.device("cpu")


def random_heads(g: np.random.Generator, rows: int, n: int, dtype: Any) -> HeadLaw:
    """``rows`` laws over ``n`` columns given by random kept heads (0 to ``n`` entries a row, columns
    increasing, then padding), with values ``u * 2**-e`` for ``e`` in 0..60 (sums whose order of
    addition changes the rounding), one row all padding."""
    h = int(g.integers(1, n + 1))
    cols = np.full((rows, h), n, dtype=np.int64)
    vals = np.zeros((rows, h))
    for r in range(1, rows):
        m = int(g.integers(0, h + 1))
        cols[r, :m] = np.sort(g.choice(n, size=m, replace=False))
        vals[r, :m] = g.random(m) * 2.0 ** -g.integers(0, 61, size=m).astype(np.float64)
    return HeadLaw(torch.from_numpy(cols), torch.from_numpy(vals).to(dtype), n)


def shared_map(g: np.random.Generator, n_in: int, n_out: int, dropped: bool) -> list[int]:
    """A column map where destination 0 takes a third of the columns (up to ~12 sources) and the
    others are random (many to one), with some columns dropped (-1) if ``dropped``."""
    dst = g.integers(0, n_out, size=n_in)
    dst[g.random(n_in) < 1 / 3] = 0
    if dropped:
        dst[g.random(n_in) < 0.15] = -1
    return [int(x) for x in dst]


def reversed_push(push: _Push, law: HeadLaw) -> Any:
    """Teeth: each row's head entries added in reverse column order (another order of addition)."""
    return push.heads(law.cols.flip(-1), law.vals.flip(-1))


def dropped_push(push: _Push, law: HeadLaw) -> Any:
    """Teeth: each row's smallest positive entry left out."""
    v = law.vals.clone()
    pos = torch.where(v > 0, v, torch.full_like(v, float("inf")))
    at = pos.argmin(-1, keepdim=True)
    return push.heads(law.cols, v.scatter(-1, at, torch.zeros_like(at, dtype=v.dtype)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_push_from_heads_is_the_dense_push_bit_for_bit(dtype: Any) -> None:
    """200 random maps and head batches: ``_Push.heads`` equals ``_Push.__call__`` of the dense laws
    exactly, with and without dropped columns; the reversed-order and dropped-entry pushes differ
    from it on some rows (teeth)."""
    g = np.random.default_rng(7)
    rev_differ = drop_differ = 0
    for trial in range(200):
        n_in, n_out = int(g.integers(1, 40)), int(g.integers(1, 6))
        push = _Push(shared_map(g, n_in, n_out, trial % 2 == 1), n_out, CPU)
        law = random_heads(g, 6, n_in, dtype)
        want = push(law.dense())
        got = push.heads(law.cols, law.vals)
        assert got.dtype == want.dtype and torch.equal(got, want), (trial, n_in, n_out)
        assert torch.equal(got.view(-1).view(torch.int64 if dtype == torch.float64 else torch.int32),
                           want.view(-1).view(torch.int64 if dtype == torch.float64 else torch.int32))  # +0, not -0
        rev_differ += int(not torch.equal(reversed_push(push, law), want))
        drop_differ += int(not torch.equal(dropped_push(push, law), want))
    assert rev_differ >= 20 and drop_differ >= 150, (rev_differ, drop_differ)


def test_an_order_that_matters_on_one_shared_destination() -> None:
    """The smallest case the order shows in: three drafter columns with one target column, float32
    values 1, 2**-24, 2**-24. Ascending order rounds 1 + 2**-24 to 1 twice; reversed adds the two
    small ones first (1 + 2**-23, exact). The heads' push gives the ascending sum."""
    push = _Push([0, 0, 0], 1, CPU)
    law = HeadLaw(torch.tensor([[0, 1, 2]]), torch.tensor([[1.0, 2.0 ** -24, 2.0 ** -24]]), 3)
    assert float(push.heads(law.cols, law.vals)) == float(push(law.dense())) == 1.0
    assert float(reversed_push(push, law)) == 1.0 + 2.0 ** -23


def test_push_laws_mixes_heads_and_dense_positions() -> None:
    """``push_laws`` over positions of heads of different widths, dense tensors, or both, equals the push
    of the stacked dense laws bit for bit; heads over another width than the push reads are refused."""
    g = np.random.default_rng(3)
    for trial in range(40):
        n_in, n_out = int(g.integers(2, 30)), int(g.integers(1, 5))
        push = _Push(shared_map(g, n_in, n_out, trial % 3 == 0), n_out, CPU)
        heads = [random_heads(g, 4, n_in, torch.float32) for _ in range(int(g.integers(1, 5)))]
        dense = [x.dense() for x in heads]
        want = push(torch.stack(dense, dim=1))
        assert torch.equal(push_laws(push, heads), want)
        mixed: list[Any] = [x if j % 2 else d for j, (x, d) in enumerate(zip(heads, dense))]
        assert torch.equal(push_laws(push, mixed), want)
        assert torch.equal(push_laws(push, dense), want)
    with pytest.raises(ValueError, match="columns"):
        push_laws(_Push([0, 0], 1, CPU), [HeadLaw(torch.tensor([[0]]), torch.tensor([[1.0]]), 3)])


def test_at_rows_places_laws_in_the_batch() -> None:
    """``HeadLaw.at_rows``: the given rows in place, every other row the zero law (padding only)."""
    law = HeadLaw(torch.tensor([[1, 3], [0, 4]]), torch.tensor([[0.5, 0.25], [1.0, 0.0]]), 4)
    big = law.at_rows([2, 0], 3)
    assert torch.equal(big.dense(), torch.stack([law.dense()[1], torch.zeros(4), law.dense()[0]]))
    assert law.at_rows([0, 1], 2) is law
    with pytest.raises(ValueError, match="rows"):
        law.at_rows([0], 3)


# --------------------------------------------------------------------------------------------
# generate: the heads path against the dense path forced


def fp32(model: Any) -> Any:
    """A float32 copy (the fixture's models are shared and float64)."""
    import copy

    return copy.deepcopy(model).to(torch.float32)


PAIRS = {  # (target, its tokenizer, drafter, its tokenizer)
    "llama_uni": ("llama_bpe", "byte_bpe", "gpt2_uni_pad", "unigram"),
    "uni_fallback": ("gpt2_uni_pad", "unigram", "gpt2_fb_pad", "bpe_fallback"),  # byte-fallback ids share target ids
}
PROMPTS = {1: ["def foo(x):\n"], 3: ["def foo(x):\n", "naïve café", "x"]}


def run_both(target: Any, drafter: Any, tt: Any, dt: Any, prompts: list[str], monkeypatch: pytest.MonkeyPatch,
             min_confidence: float | None, top_p: float = 0.9, seed: int = 5) -> tuple[Any, Any, list[int]]:
    """``generate`` with TLI under top-p twice: as it runs, and with the laws forced dense
    (``heads_read=False``: the path before the heads). Returns both outputs and how many positions
    were pushed (from heads, dense) in the first run, and how many head positions some rows of the
    batch did not draft at (ragged)."""
    from hsd_torch import generate

    torch.set_num_threads(1)
    kw: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=dt, method="tli", lookahead=4,
                              max_new_tokens=23, do_sample=True, seed=seed, top_p=top_p, temperature=0.8,
                              record_uniforms=True, min_confidence=min_confidence)
    counts = [0, 0, 0]
    real, real_rows = tli_mod.push_laws, HeadLaw.at_rows

    def counted(push: Any, laws: Any) -> Any:
        for x in laws:
            counts[not isinstance(x, HeadLaw)] += 1
        return real(push, laws)

    def counted_rows(self: HeadLaw, rows: Any, batch: int) -> HeadLaw:
        counts[2] += len(rows) < batch
        return real_rows(self, rows, batch)

    with monkeypatch.context() as m:
        m.setattr(tli_mod, "push_laws", counted)
        m.setattr(HeadLaw, "at_rows", counted_rows)
        out = generate(target, drafter, prompts, **kw)
    real_setup = TLI.setup

    def dense_setup(self: TLI, gen: Any) -> None:
        real_setup(self, gen)
        self.cols = dataclasses.replace(self.cols, heads_read=False)

    with monkeypatch.context() as m:
        m.setattr(TLI, "setup", dense_setup)
        dense = generate(target, drafter, prompts, **kw)
    return out, dense, counts


def assert_same(out: Any, dense: Any) -> None:
    assert out.sequences == dense.sequences
    assert out.uniforms == dense.uniforms
    assert [s.accepted for s in out.stats] == [s.accepted for s in dense.stats]


@pytest.mark.parametrize("pair", sorted(PAIRS))
@pytest.mark.parametrize("precision", ["fp64", "fp32"])
@pytest.mark.parametrize("batch,min_confidence", [(1, None), (3, None), (3, 0.3)])
def test_generate_tli_from_heads_gives_the_dense_tokens(pair: str, precision: str, batch: int,
                                                        min_confidence: float | None, toks: dict[str, Any],
                                                        models: dict[str, Any],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """TLI with top-p: the drafter's laws go through the heads (counted: most positions), and the
    sequences, uniforms and acceptances equal the forced-dense run's. Batch 3's rows draft
    different lengths in some rounds (budgets after different acceptances; ``min_confidence``), so
    positions where some rows no longer draft are kept as batch-wide heads with empty rows (counted;
    the uni_fallback pair rejects every draft, so there the rows stay in step without
    ``min_confidence``, and every correction reads q's residual)."""
    t, tt, d, dt = PAIRS[pair]
    target, drafter = models[t], models[d]
    if precision == "fp32":
        target, drafter = fp32(target), fp32(drafter)
    out, dense, counts = run_both(target, drafter, toks[tt], toks[dt], PROMPTS[batch], monkeypatch, min_confidence)
    assert counts[0] > counts[1], counts
    assert_same(out, dense)
    if batch == 1:
        assert counts[2] == 0, counts
    elif min_confidence is not None or pair == "llama_uni":  # uni_fallback accepts nothing: rows move in step
        assert counts[2] > 0, counts


def test_the_uni_fallback_pair_shares_target_columns(toks: dict[str, Any]) -> None:
    """The pair the generate test pushes through has drafter ids that share a target column (the
    many-to-one push, where the order of addition matters)."""
    from hsd_torch.engine.laws import TextSpace
    from hsd_torch.vocab import VocabBridge
    from hsd_torch.vocab.text import TokenText

    tt, dt = TokenText(toks["unigram"], len(toks["unigram"]) + 32), TokenText(toks["bpe_fallback"],
                                                                             len(toks["bpe_fallback"]) + 16)
    bridge = VocabBridge(toks["unigram"], toks["bpe_fallback"], target_vocab_size=tt.vocab_size, drafter_vocab_size=dt.vocab_size)
    _, _, dst, _, _ = tli_mod.tli_columns(bridge, tt, dt, TextSpace.text(tt, CPU), TextSpace.text(dt, CPU), CPU)
    assert max(dst.count(c) for c in set(dst)) >= 2


@pytest.mark.parametrize("min_confidence", [None, 0.3])
def test_tied_drafter_logits_and_mixed_positions_keep_the_dense_tokens(min_confidence: float | None,
                                                                       toks: dict[str, Any], models: dict[str, Any],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A drafter whose output rows repeat every 8 ids (its logits tie in groups, so top-p's boundary falls
    inside a tie and the dense law decides: counted), and the tiny drafter with every other drafting
    position forced dense (rounds that mix heads and dense positions): the same outputs as forced dense."""
    import copy

    t, tt, d, dt = PAIRS["llama_uni"]
    tied = copy.deepcopy(models[d])
    with torch.no_grad():
        w = tied.lm_head.weight
        w.copy_(w[torch.arange(w.shape[0]) % 8])
    out, dense, counts = run_both(models[t], tied, toks[tt], toks[dt], PROMPTS[3], monkeypatch, min_confidence)
    assert counts[1] > 0, counts
    assert_same(out, dense)

    real = drafting.space_head_law
    calls = [0]

    def every_other(*args: Any) -> Any:
        calls[0] += 1
        got = real(*args)
        return got.dense() if calls[0] % 2 and isinstance(got, HeadLaw) else got

    monkeypatch.setattr(drafting, "space_head_law", every_other)
    out, dense, counts = run_both(models[t], models[d], toks[tt], toks[dt], PROMPTS[3], monkeypatch, min_confidence)
    assert counts[0] > 0 and counts[1] > 0, counts
    assert_same(out, dense)
