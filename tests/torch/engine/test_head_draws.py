"""Draws from top-p's kept heads (``hsd_torch.engine.kernels.HeadLaw``, ``LazyLaw.draw``) are the
dense draws, bit for bit.

Where only draws and single values read a target law (verification with top-p), ``generate`` keeps
the law as its kept columns in increasing order and their values, and draws from those alone (the
cumulative sum over the head, not over every column; no dense write-back). The claim is equality of
the drawn column and of the total mass read back, for the same uniform, with the draw from the
dense law. Checked here, deterministically (no statistics: every comparison is exact), on:

* laws of four rows in one block with heads of different sizes (one id, a few, hundreds), over a
  space that is not one run of ids (EOS last, removed ids), EOS inside some heads;
* float32, bfloat16 and float64 logits; temperature 0.7; top-k off and 40; top-p 0.3, 0.9, 0.995
  and a top-p equal to a kept mass (the boundary on a partial sum);
* logits with ties (rounded: ties inside heads, and ties across the boundary, where the head is not
  used and the dense law decides);
* uniforms 0, just below 1, ``1 - 2**-25`` (1.0 in float32: ``u * total`` is the total, the
  last-positive-column rule), on the partial sums themselves and their float32 neighbours;
* the verification kernels themselves (``_exact_match_host``, SLEM's; ``_rejection_host``, TLI's and
  SD's, whose ratio tests read ``p(x)`` from the heads and whose bonus and correction at batch 1 are
  drawn from them: emitted ids, counts, ``bad``) and ``generate`` (SLEM and TLI, tiny pair: the same
  tokens as with every law written out).

The check has teeth: a head whose entries are in another order (the same law, written out) draws
other columns for some of these uniforms, and the comparison rejects it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hsd_torch.engine import kernels, verification  # noqa: E402
from hsd_torch.engine.kernels import HeadLaw, LazyLaw, _draw_host, _exact_match_host, _rejection_host  # noqa: E402
from _torch_checks import boundary_uniforms  # noqa: E402
from hsd_torch.engine.laws import TextSpace, space_head_law, space_law  # noqa: E402

V = 3000
EOS = 7
IDS = [i for i in range(V) if i % 11 != 4 and i != EOS] + [EOS]  # EOS last, 1 id in 11 removed: not one run
SPACE = TextSpace(IDS, V, torch.device("cpu"))
DROP = SPACE.drop_mask()
SCALES = torch.tensor([[16.0], [5.0], [2.0], [0.7]], dtype=torch.float64)  # heads of ~1, a few, tens, hundreds
DTYPES = [torch.float32, torch.bfloat16, torch.float64]


def logits_block(seed: int, tied: bool, dtype: torch.dtype) -> Any:
    """``[2, 2, V]`` logits: four laws of different peakedness (rows of one block), EOS raised in two."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((4, V), generator=g, dtype=torch.float64) * SCALES
    if tied:
        x = (x * 2).round() / 2
    x[1, EOS] = x[1].max() - 0.25  # EOS inside the head, ahead of ids that follow it in id order
    x[3, EOS] = x[3].max()
    return x.to(dtype).view(2, 2, V)


def laws_of(logits: Any, temperature: float, top_k: int | None, top_p: float
            ) -> tuple[LazyLaw, Any]:
    """The lazy law ``generate`` builds (``space_head_law``) and the dense laws ``[2, 2, n]`` of the same logits."""
    lz = LazyLaw(logits, lambda b: space_head_law(b, SPACE, DROP, temperature, top_k, top_p), sparse=True)
    return lz, space_law(logits, SPACE, DROP, temperature, top_k, top_p)


def assert_same_draws(draw: Callable[[list[tuple[int, int]], list[float]], tuple[list[int], list[float]]],
                      dense: Any, pairs: list[tuple[int, int]], g: np.random.Generator) -> int:
    """Every row of ``pairs`` drawn with each of its special uniforms (the rows of one call taking
    their own): the same ids and totals as ``_draw_host`` on the dense rows. Returns the draws compared."""
    rows = torch.stack([dense[b, j] for b, j in pairs])
    us = [boundary_uniforms(rows[i], g, 12, 6) for i in range(len(pairs))]
    n = max(len(u) for u in us)
    us = [u + g.random(n - len(u)).tolist() for u in us]
    for i in range(n):
        u = [row[i] for row in us]
        got, want = draw(pairs, u), _draw_host(rows, u)
        assert got == want, (pairs, u, got, want)
    return n * len(pairs)


def boundary_top_p(logits: Any) -> float:
    """A top-p equal to the kept mass of the first three ids of row (0, 1) (float32 sums in decreasing order)."""
    p = space_law(logits, SPACE, DROP, 0.7, None, None)[0, 1].float()
    return float(torch.cumsum(torch.sort(p, descending=True).values, dim=-1)[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_premise_the_cpu_cumsum_adds_left_to_right_in_double(dtype: torch.dtype) -> None:
    """What the bit-identity rests on (``LazyLaw.draw``): on the CPU, ``torch.cumsum`` of float32 and
    float64 rows is the left-to-right sum in double, each partial sum rounded to the dtype, on rows as
    long as a vocabulary and in a batch. A torch whose scan adds in blocks (as CUDA's does) fails here
    for float32 (the float32 sequential sum, also computed, differs from it on these rows)."""
    g = np.random.default_rng(2)
    nd = np.float32 if dtype == torch.float32 else np.float64
    x = (g.random((3, 262_144)) ** 8).astype(nd)
    x[:, g.random(262_144) < 0.9] = 0  # mostly exact zeros, as a law off its head
    got = torch.cumsum(torch.from_numpy(x), dim=-1).numpy()
    assert np.array_equal(got, np.cumsum(x.astype(np.float64), axis=-1).astype(nd))
    if dtype == torch.float32:
        assert not np.array_equal(got, np.cumsum(x, axis=-1))  # the check can tell the two sums apart


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_draw_from_the_kept_heads_is_the_dense_draw_bit_for_bit(dtype: torch.dtype) -> None:
    """``LazyLaw.draw`` on the heads ``space_head_law`` gives (four rows of one block, heads of 1 to
    hundreds of ids, EOS in two) against ``_draw_host`` on ``space_law``'s dense rows: the same ids and
    totals for every special uniform of every row; also for a subset of the rows out of order, and after
    the block was written out (``rows``: the dense law, bit for bit). Blocks whose boundary ties (rounded
    logits, bf16) have no head and are compared too; the heads must decide most blocks."""
    g = np.random.default_rng(3)
    head_blocks = dense_blocks = compared = 0
    for seed, tied in ((0, False), (1, True), (2, False)):
        logits = logits_block(seed, tied, dtype)
        for top_p in (0.3, 0.9, 0.995, boundary_top_p(logits)):
            for top_k in (None, 40):
                lz, dense = laws_of(logits, 0.7, top_k, top_p)
                every = [(b, j) for b in range(2) for j in range(2)]
                compared += assert_same_draws(lz.draw, dense, every, g)
                block = lz._blocks[0]
                if isinstance(block, HeadLaw):
                    head_blocks += 1
                    assert torch.equal(block.dense(), dense.view(4, -1))  # the same law, written out
                    kept = (block.vals > 0).sum(-1)
                    assert len(set(kept.tolist())) > 1, "the rows' heads must differ in size"
                    assert bool((block.cols[3] == SPACE.n - 1).any()), "EOS (the last column) is in row 3's head"
                else:
                    dense_blocks += 1
                # a subset of the block's rows, out of order (the head's rows selected), on a fresh law
                lz2, _ = laws_of(logits, 0.7, top_k, top_p)
                lz2._load(every)
                compared += assert_same_draws(lz2.draw, dense, [(1, 1), (0, 0)], g)
                # written out after the draws (a rejection test reads the rows): the dense law, and draws from it agree
                assert torch.equal(lz.rows(every), dense.view(4, -1))
                compared += assert_same_draws(lz.draw, dense, [(0, 1)], g)
    print(f"{dtype}: {head_blocks} blocks drawn on their heads, {dense_blocks} dense, {compared} draws compared")
    assert head_blocks >= (5 if dtype == torch.bfloat16 else 14), head_blocks  # bf16 logits tie more often
    assert compared > 1000


def test_ties_across_the_boundary_fall_back_to_the_dense_law() -> None:
    """A tie split by top-p's boundary (the head alone cannot say which tied ids are kept): no head,
    the dense law (and its draws) as before."""
    x = torch.full((1, 1, V), -20.0, dtype=torch.float64)
    x[0, 0, 10:14] = 3.0  # four equal ids, the boundary among them at top-p 0.6
    lz, dense = laws_of(x, 1.0, None, 0.6)
    assert not isinstance(space_head_law(x[0], SPACE, DROP, 1.0, None, 0.6), HeadLaw)
    assert_same_draws(lz.draw, dense, [(0, 0)], np.random.default_rng(0))
    assert not isinstance(lz._blocks[0], HeadLaw)


def test_the_comparison_rejects_a_head_out_of_column_order() -> None:
    """Teeth: the kept head in decreasing order of probability (the order top-p sorts it in) is the same
    law once written out, but its cumulative sums are another row's: the draw comparison fails for it."""
    logits = logits_block(0, False, torch.float32)
    right = space_head_law(logits[1:, 1], SPACE, DROP, 0.7, None, 0.995)  # row 3: EOS and hundreds of ids
    assert isinstance(right, HeadLaw)
    order = torch.argsort(right.vals, dim=-1, descending=True, stable=True)
    wrong = HeadLaw(right.cols.gather(-1, order), right.vals.gather(-1, order), right.n)
    assert torch.equal(wrong.dense(), right.dense())  # the law alone does not see it

    def wrong_draw(pairs: list[tuple[int, int]], u: list[float]) -> tuple[list[int], list[float]]:
        return _draw_host(wrong.vals, u, wrong.cols)

    with pytest.raises(AssertionError):
        assert_same_draws(wrong_draw, right.dense().view(1, 1, -1), [(0, 0)], np.random.default_rng(1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_match_verification_on_the_heads_is_the_dense_verification(dtype: torch.dtype) -> None:
    """``_exact_match_host`` over the lazy head laws against the same laws given dense: the same emitted
    ids, counts and ``bad`` for candidates that match the target's draws for a while (long runs) and
    random ones, uniforms on boundaries and random, with an EOS and budgets."""
    g = np.random.default_rng(5)
    gt = torch.Generator().manual_seed(7)
    b, k = 3, 4
    on_heads = 0
    for trial in range(12):
        x = torch.randn((b, k + 1, V), generator=gt, dtype=torch.float64) * float(2.0 + 4 * (trial % 3))
        x[:, :, EOS] += 4.0 * (trial % 2)
        logits = x.to(dtype)
        lz, dense = laws_of(logits, 0.7, None, 0.9)
        u = [[float(np.nextafter(1.0, 0.0)) if (trial + j) % 5 == 0 else float(g.random()) for j in range(k + 1)]
             for _ in range(b)]
        own = [_draw_host(dense[r].float() if dtype != torch.float64 else dense[r], u[r])[0] for r in range(b)]
        cand = [own[r][:k] if (trial + r) % 3 else g.integers(0, SPACE.n, size=k).tolist() for r in range(b)]
        n_cand = [k, int(g.integers(0, k + 1)), k]
        budget = None if trial % 2 else [k + 1, 2, k + 1]
        want = _exact_match_host(dense, cand, n_cand, u, eos_id=SPACE.n - 1, budget=budget)
        got = _exact_match_host(lz, cand, n_cand, u, eos_id=SPACE.n - 1, budget=budget)
        assert got == want, trial
        on_heads += sum(isinstance(blk, HeadLaw) for blk in lz._blocks)
    print(f"{dtype}: {on_heads} blocks drawn on their heads")
    assert on_heads >= 30


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [1, 3])
def test_rejection_verification_on_the_heads_is_the_dense_verification(dtype: torch.dtype, batch: int) -> None:
    """``_rejection_host`` (SD, TLI) over the lazy head laws against the same laws given dense: the same
    emitted ids, counts and ``bad``, with the ratio tests' ``p(x)`` read from the heads (drafts in and
    out of the head), the bonus drawn from the head and a rejection's correction from the residual on
    it (batch 1; at batch 3 the final tokens read the rows written out), ``q`` in the laws' dtype or in
    float64, scaled (``q_scale``) or not, uniforms random and next to 1; at batch 1 a round whose
    residuals are not empty never writes a law out."""
    g = np.random.default_rng(6)
    gt = torch.Generator().manual_seed(8)
    k = 3
    never_written = 0
    finals = {"correction": 0, "bonus": 0}
    for trial in range(24):
        x = torch.randn((batch, k + 1, V), generator=gt, dtype=torch.float64) * float(2 + 4 * (trial % 3))
        lz, dense = laws_of(x.to(dtype), 0.7, None, 0.9)
        spread = torch.softmax(torch.randn((batch, k, SPACE.n), generator=gt, dtype=torch.float64) * 2, dim=-1)
        jitter = torch.empty((batch, k, SPACE.n), dtype=torch.float64).uniform_(0.3, 1.7, generator=gt)
        near = dense[:, :k].double() * jitter
        q = 0.5 * spread + 0.5 * near / near.sum(-1, keepdim=True)
        own = [[_draw_host(dense[r, j:j + 1].double(), [float(g.random())])[0][0] for j in range(k)]
               for r in range(batch)]
        drafts = [own[r] if (trial + r) % 2 else [int(c) for c in torch.multinomial(q[r], 1, generator=gt).squeeze(-1)]
                  for r in range(batch)]
        ua = [[float(np.nextafter(1.0, 0.0)) if (trial + j) % 4 == 0 else float(g.random()) for j in range(k)]
              for _ in range(batch)]
        uf = [float(np.nextafter(1.0, 0.0)) if trial % 5 == 0 else float(g.random()) for _ in range(batch)]
        scale = (2.0 ** g.integers(-3, 4, size=(batch, k))).tolist() if trial % 2 else None
        qt = (q * (torch.tensor(scale, dtype=torch.float64).unsqueeze(-1) if scale else 1.0)).to(
            torch.float64 if trial % 4 == 1 else dense.dtype)
        want = _rejection_host(LazyLaw(dense), qt, drafts, [k] * batch, ua, uf, eos_id=None, budget=None, q_scale=scale)
        got = _rejection_host(lz, qt, drafts, [k] * batch, ua, uf, eos_id=None, budget=None, q_scale=scale)
        assert got == want, trial
        never_written += all(isinstance(blk, HeadLaw) for blk in lz._blocks)
        for n in got[1]:
            finals["bonus" if n == k else "correction"] += 1
    print(f"{dtype}, batch {batch}: {never_written} of 24 rounds never wrote a law out; {finals}")
    assert finals["correction"] >= 8 and finals["bonus"] >= 4, finals  # both final draws exercised
    if batch == 1:
        assert never_written >= (12 if dtype == torch.bfloat16 else 20)


@pytest.mark.parametrize("method", ["slem", "tli"])
def test_generate_reads_the_heads_with_the_dense_tokens(method: str, llama_uni: dict[str, Any],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """SLEM (two prompts) and TLI (one prompt: its final tokens read the heads at batch 1) with top-p on the
    tiny pair: the verification reads the target's laws from the kept heads (counted), and the tokens and
    acceptances are those of the same run with every law written out (the dense path)."""
    from hsd_torch import generate

    torch.set_num_threads(1)
    kw: dict[str, Any] = dict(target_tokenizer=llama_uni["tt"], drafter_tokenizer=llama_uni["dt"], method=method,
                              lookahead=4, max_new_tokens=12, do_sample=True, seed=9, top_p=0.9, temperature=0.8)
    real_head = kernels.LazyLaw.head
    on_heads = [0]

    def counted(self: LazyLaw, pairs: Any) -> Any:
        got = real_head(self, pairs)
        on_heads[0] += got is not None
        return got

    monkeypatch.setattr(kernels.LazyLaw, "head", counted)
    prompts = ["def foo(x):\n", "naïve café"] if method == "slem" else ["def foo(x):\n"]
    out = generate(llama_uni["target"], llama_uni["drafter"], prompts, **kw)
    assert on_heads[0] > 0
    monkeypatch.setattr(verification, "space_head_law", space_law)  # every law written out
    on_heads[0] = 0
    again = generate(llama_uni["target"], llama_uni["drafter"], prompts, **kw)
    assert on_heads[0] == 0
    assert again.sequences == out.sequences
    assert [s.accepted for s in again.stats] == [s.accepted for s in out.stats]
