"""The drafter's draws from top-p's kept heads (``hsd_torch.engine.drafting``, where no verification
reads the drafter's laws: SLEM) are the dense draws, bit for bit.

Where ``DraftColumns.laws_read`` is False, ``draft_tokens`` computes each position's law for the rows
still drafting alone and, under top-p on the CPU, keeps it as its kept head (``HeadLaw``; its
``prefix`` at ``n_draw``), drawing from the head's cumulative sum and reading the dynamic draft
length's confidence from the head's values. The claim is equality, for the same uniforms, of the
drafted columns and the masses read back (and of the confidence) with the dense path that SD, TLI and
SLRS keep. Checked deterministically (every comparison exact, no statistics), on:

* rows of one batch with heads of one id to hundreds, over a space that is not one run of ids (EOS
  last, removed ids), EOS in some heads; float32, bfloat16 and float64 logits; temperature 0.7;
  top-k off and 40; top-p 0.3, 0.9, 0.995; rounded logits (ties inside heads and across the
  boundary, where the head is not used and the dense law decides);
* ragged rows (a subset of the batch, out of the law's row order), ``n_draw`` below the space's width
  (head columns past it must not be drawn; a row whose whole head lies past it has no mass);
* uniforms 0, just below 1, ``1 - 2**-25`` (1.0 in float32), on partial sums and their neighbours;
* ``generate`` with SLEM and top-p on the tiny pair (two prompts, with and without ``min_confidence``)
  against the same run with the laws kept dense (``laws_read=True``, today's path): the same
  sequences, acceptances and recorded uniforms, with the head draws counted.

Teeth: the comparison rejects a head drawn without its ``n_draw`` prefix, and the confidence's
total taken by ``sum`` (another order of addition) differs between head and dense on these rows, so
the exact comparison of the confidence is not a tautology.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hsd_torch.engine import drafting, kernels  # noqa: E402
from hsd_torch.engine.kernels import HeadLaw  # noqa: E402
from hsd_torch.engine.laws import Processing, TextSpace, space_law  # noqa: E402
from _torch_checks import boundary_uniforms  # noqa: E402
from hsd_torch.engine.round_state import DraftColumns  # noqa: E402

V = 3000
EOS = 7
IDS = [i for i in range(V) if i % 11 != 4 and i != EOS] + [EOS]  # EOS last, 1 id in 11 removed: not one run
SPACE = TextSpace(IDS, V, torch.device("cpu"))
SCALES = torch.tensor([[16.0], [5.0], [2.0], [0.7], [9.0]], dtype=torch.float64)  # heads of ~1 to hundreds
DTYPES = [torch.float32, torch.bfloat16, torch.float64]
N_SHORT = 1500  # an n_draw below the space's width (TLI's slice shape)


def logits_batch(seed: int, tied: bool, dtype: torch.dtype) -> Any:
    """``[5, V]`` drafter logits of different peakedness; EOS raised in two rows; row 4's head lies
    past column ``N_SHORT`` (its ids raised there), so with ``n_draw = N_SHORT`` it has no mass."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((5, V), generator=g, dtype=torch.float64) * SCALES
    if tied:
        x = (x * 2).round() / 2
    x[1, EOS] = x[1].max() - 0.25
    x[3, EOS] = x[3].max()
    x[4, SPACE.ids[N_SHORT + 10]] = x[4].max() + 30.0  # a head of one id, past N_SHORT
    return x.to(dtype)


def fake_gen(temperature: float, top_k: int | None, top_p: float) -> Any:
    """What ``_step_law`` reads of the round state: the drafter's processing and removed ids."""
    return SimpleNamespace(d_process=Processing(temperature, top_k, top_p), d_drop=SPACE.drop_mask())


def same_floats(a: list[float], b: list[float]) -> bool:
    """Equal bit for bit as Python floats, a NaN equal to a NaN (a row with no mass: 0 / 0)."""
    return len(a) == len(b) and all(x == y or (np.isnan(x) and np.isnan(y)) for x, y in zip(a, b))


def compare_step(logits: Any, cols: DraftColumns, gen: Any, rows: list[int], g: np.random.Generator) -> bool:
    """One drafting position: the head path (``heads=True``, laws for ``rows`` alone) against the dense
    path (every row, what SD / TLI keep) on the same uniforms: the same confidence bits, masses, and
    columns (where the mass is positive: a row with none is not drafted from, whatever its column).
    Returns whether the head path held a ``HeadLaw``."""
    law, of = drafting._step_law(gen, logits, cols, rows, True)
    dense, every = drafting._step_law(gen, logits, cols, rows, False)
    assert of == rows and every == list(range(logits.shape[0]))
    at = [of.index(r) for r in rows]
    assert same_floats(drafting.confidence(law, at), drafting.confidence(dense, rows))
    us = [boundary_uniforms(dense[r], g, 10, 4) for r in rows]
    n = max(len(u) for u in us)
    us = [u + g.random(n - len(u)).tolist() for u in us]
    for i in range(n):
        u = torch.tensor([[us[a][i]] for a in range(len(rows))], dtype=dense.dtype)
        got, want = drafting._pick(law, at, u), drafting._pick(dense, rows, u)
        assert got[1] == want[1], (rows, i, got, want)
        assert [c if m > 0 else -1 for c, m in zip(*got)] == [c if m > 0 else -1 for c, m in zip(*want)], (rows, i)
        assert all(c < cols.n_draw for c, m in zip(*got) if m > 0)
    return isinstance(law, HeadLaw)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_draft_from_the_kept_heads_is_the_dense_draft_bit_for_bit(dtype: torch.dtype) -> None:
    """Every row set (all, ragged subsets out of order), ``n_draw`` full and short, top-p and top-k
    settings, tied and untied logits: head and dense drafts agree exactly; the heads decide most cases."""
    g = np.random.default_rng(11)
    on_heads = cases = 0
    for seed, tied in ((0, False), (1, True), (2, False)):
        logits = logits_batch(seed, tied, dtype)
        for n_draw in (SPACE.n, N_SHORT):
            cols = DraftColumns(SPACE, n_draw, None, stop_on_empty=True, laws_read=False)
            for top_p in (0.3, 0.9, 0.995):
                for top_k in (None, 40):
                    gen = fake_gen(0.7, top_k, top_p)
                    for rows in ([0, 1, 2, 3, 4], [3, 1], [4, 0, 2]):
                        on_heads += compare_step(logits, cols, gen, sorted(rows), g)
                        cases += 1
    print(f"{dtype}: {on_heads} of {cases} positions drawn on their heads")
    assert on_heads >= (cases // 4 if dtype == torch.bfloat16 else cases // 2), (on_heads, cases)


def test_a_short_n_draw_reaches_no_head_column_past_it() -> None:
    """Row 4's whole head lies past ``N_SHORT``: its prefix has no mass (the row stops drafting, as the
    dense slice says), and a head drawn without the prefix (teeth) proposes a column past ``n_draw``."""
    logits = logits_batch(0, False, torch.float32)
    cols = DraftColumns(SPACE, N_SHORT, None, stop_on_empty=True, laws_read=False)
    gen = fake_gen(0.7, None, 0.9)
    law, _ = drafting._step_law(gen, logits, cols, [4], True)
    assert isinstance(law, HeadLaw)
    assert drafting._pick(law, [0], torch.tensor([[0.5]]))[1] == [0.0]
    full, _ = drafting._step_law(gen, logits, dataclasses.replace(cols, n_draw=SPACE.n), [4], True)
    assert isinstance(full, HeadLaw)
    picked, mass = drafting._pick(full, [0], torch.tensor([[0.5]]))
    assert mass[0] > 0 and picked[0] >= N_SHORT  # what compare_step's checks reject


def test_the_confidence_from_the_heads_needs_the_draws_sum() -> None:
    """Teeth for the confidence comparison: ``amax / sum`` (``torch.sum`` adds in another order)
    differs between the heads and the dense rows on some of these laws, while ``confidence`` (the
    left-to-right total a draw reads) never does."""
    differ = 0
    for seed in range(6):
        logits = logits_batch(seed, False, torch.float32)
        cols = DraftColumns(SPACE, SPACE.n, None, stop_on_empty=True, laws_read=False)
        gen = fake_gen(0.7, None, 0.995)
        law, _ = drafting._step_law(gen, logits, cols, list(range(5)), True)
        dense, _ = drafting._step_law(gen, logits, cols, list(range(5)), False)
        assert isinstance(law, HeadLaw)
        assert drafting.confidence(law, range(5)) == drafting.confidence(dense, range(5))
        differ += int(((law.vals.amax(-1) / law.vals.sum(-1)) != (dense.amax(-1) / dense.sum(-1))).sum())
    assert differ > 0


@pytest.mark.parametrize("min_confidence", [None, 0.15])
def test_generate_slem_drafts_from_the_heads_with_the_dense_tokens(min_confidence: float | None,
                                                                   llama_uni: dict[str, Any],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """SLEM with top-p on the tiny pair, two prompts (ragged rows: they stop at different lengths):
    the drafter's draws read the kept heads (counted), and the sequences, acceptances and recorded
    uniforms equal those of the same run with the drafter's laws kept dense (``laws_read=True``)."""
    from hsd_torch import generate
    from hsd_torch.methods.slem import SLEM

    torch.set_num_threads(1)
    kw: dict[str, Any] = dict(target_tokenizer=llama_uni["tt"], drafter_tokenizer=llama_uni["dt"], method="slem",
                              lookahead=4, max_new_tokens=16, do_sample=True, seed=5, top_p=0.9, temperature=0.8,
                              record_uniforms=True, min_confidence=min_confidence)
    real_draw = kernels._draw_host
    head_draws = [0, 0]  # (from a head, dense)

    def counted(probs: Any, u: Any, cols: Any = None) -> Any:
        head_draws[cols is None] += 1
        return real_draw(probs, u, cols)

    monkeypatch.setattr(kernels, "_draw_host", counted)
    prompts = ["def foo(x):\n", "naïve café"]
    out = generate(llama_uni["target"], llama_uni["drafter"], prompts, **kw)
    on_heads = head_draws[0]
    assert on_heads > 0
    real_setup = SLEM.setup

    def dense_setup(self: SLEM, gen: Any) -> None:
        real_setup(self, gen)
        self.cols = dataclasses.replace(self.cols, laws_read=True)

    monkeypatch.setattr(SLEM, "setup", dense_setup)
    head_draws[:] = [0, 0]
    again = generate(llama_uni["target"], llama_uni["drafter"], prompts, **kw)
    assert head_draws[0] < on_heads  # the drafter's draws went dense (the target's may still read heads)
    assert again.sequences == out.sequences
    assert again.uniforms == out.uniforms
    assert [s.accepted for s in again.stats] == [s.accepted for s in out.stats]
