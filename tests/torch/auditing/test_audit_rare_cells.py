"""``hsd_torch.auditing.first_tokens.reference_law``'s pooling of rare cells, in the fast tier.

Without top-k most of a tiny model's vocabulary has an expected count below 5 at a small N, so
the coarse law has ``RARE`` cells: one after the prompt, ``(RARE, ANY)``, and one after each
expanded first token ``t``, ``(t, RARE)``. Here the whole coarse law of the first two tokens is
computed a second time, independently, from the target's plain softmax over its ids with text
(temperature 1, no top-k or top-p: the processed law by definition), and compared cell by
cell: the same cells, each ``RARE`` cell carrying exactly the mass of the tokens not kept there
(joint masses: ``p(t) * sum of p(s | t)`` over the rare ``s``), each kept cell its own mass, a
prefix left unexpanded by the forward-pass budget its whole mass as ``(t, ANY)``, and the cells
summing to 1. The kept and probability-0 token sets and the mapping of outputs to cells are
checked too. Exact up to float rounding (1e-12); no sampling.

Target: the tiny GPT-2 over the Unigram tokenizer with 32 padded ids (so ids without text, of
probability 0, exist), float64. N = 300 draws: a cell needs probability >= 1/60.

Mutants this file kills (each checked by hand on a copy): the ``RARE`` cell dropped; its mass
taken from the conditional law instead of the joint one; the kept set chosen by the conditional
law; the ``RARE`` mass left out of ``coarse_mass``.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402

from hsd_torch.auditing.first_tokens import ANY, RARE, reference_law  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402

torch.set_num_threads(1)

N = 300
MIN_EXPECTED = 5.0  # the audit's rule: a cell of its own needs an expected count >= 5
PROMPT = "def foo(x):\n"
PLAIN = {"temperature": 1.0, "top_k": None, "top_p": None}


def softmax_after(model: Any, ctx: list[int], mask: torch.Tensor) -> list[float]:
    """The target's law after ``ctx``: softmax of its logits over the ids with text (float64)."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ctx])).logits[0, -1].double()
    out: list[float] = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1).tolist()
    return out


def expected_coarse_law(model: Any, prompt_ids: list[int], mask: torch.Tensor, eos: int,
                        max_prefixes: int) -> tuple[dict[tuple[int, ...], float], dict[tuple[int, ...], set[int]]]:
    """The coarse law of the first two tokens at N draws, from the audit's rules (module docstring
    of :mod:`hsd_torch.auditing.first_tokens`) written out: the root's tokens of expected count >= 5 are kept,
    the rest pooled into (RARE, ANY); the ``max_prefixes`` most probable kept non-EOS first
    tokens are expanded (their rare continuations pooled into (t, RARE)), the others are (t, ANY).
    Returns the law and the kept sets."""
    p1 = softmax_after(model, prompt_ids, mask)
    kept1 = {t for t, p in enumerate(p1) if N * p >= MIN_EXPECTED}
    law: dict[tuple[int, ...], float] = {(RARE, ANY): sum(p for t, p in enumerate(p1) if t not in kept1)}
    kept: dict[tuple[int, ...], set[int]] = {(): kept1}
    firsts = sorted((t for t in kept1 if t != eos), key=lambda t: -p1[t])
    if eos in kept1:
        law[(eos,)] = p1[eos]
    for rank, t in enumerate(firsts):
        if rank >= max_prefixes:
            law[(t, ANY)] = p1[t]
            continue
        p2 = softmax_after(model, prompt_ids + [t], mask)
        kept[(t,)] = {s for s, p in enumerate(p2) if N * p1[t] * p >= MIN_EXPECTED}
        law[(t, RARE)] = p1[t] * sum(p for s, p in enumerate(p2) if s not in kept[(t,)])
        for s in kept[(t,)]:
            law[(t, s)] = p1[t] * p2[s]
    return law, kept


@pytest.mark.parametrize("max_prefixes", [512, 3])
def test_rare_cells_carry_the_mass_of_the_tokens_not_kept(max_prefixes: int, toks: dict[str, Any],
                                                          models: dict[str, Any]) -> None:
    target, tok = models["gpt2_uni_pad"], toks["unigram"]
    text = TokenText(tok, int(target.get_output_embeddings().weight.shape[0]))
    mask = text.text_mask
    assert not bool(mask.all()), "the padded ids have no text: probability-0 cells exist"
    ids = text.prompt_ids(PROMPT)
    eos = text.eos_id
    ref = reference_law(target, ids, N, 2, frozenset({eos}), mask, PLAIN, max_prefixes=max_prefixes)
    want, kept = expected_coarse_law(target, ids, mask, eos, max_prefixes)

    rare_cells = [c for c in want if RARE in c]
    assert len(rare_cells) >= 3 and all(want[c] > 1e-3 for c in rare_cells), "the case has no RARE cells to test"
    assert abs(sum(want.values()) - 1.0) < 1e-12
    assert set(ref.law) == set(want), (sorted(set(ref.law) ^ set(want)))
    for cell, mass in want.items():
        assert ref.law[cell] == pytest.approx(mass, rel=1e-12, abs=1e-15), cell
    assert sum(ref.law.values()) == pytest.approx(1.0, abs=1e-12)
    hidden = sum(m for c, m in want.items() if RARE in c or ANY in c[1:])
    assert ref.coarse_mass == pytest.approx(hidden, rel=1e-12)
    assert {k: set(v) for k, v in ref.kept.items()} == kept

    # the probability-0 ids (no text) are outside the law, each its own cell; the rest map to theirs
    p1 = softmax_after(target, ids, mask)
    zero = {t for t, p in enumerate(p1) if p == 0.0}
    assert zero == {t for t, ok in enumerate(mask.tolist()) if not ok} and ref.zero[()] == frozenset(zero)
    z = min(zero)
    rare1 = min(t for t, p in enumerate(p1) if p > 0 and t not in kept[()])
    top = max(kept[()] - {eos}, key=lambda t: p1[t])
    assert ref.cell([z, top]) == (z,)
    assert ref.cell([rare1, top]) == (RARE, ANY)
    rare2 = min(s for s in range(len(p1)) if s not in kept[(top,)] and mask[s] and s != eos)
    assert ref.cell([top, rare2]) == (top, RARE)
    assert ref.cell([top, min(kept[(top,)])]) == (top, min(kept[(top,)]))


def test_one_position_rare_cell(toks: dict[str, Any], models: dict[str, Any]) -> None:
    """One position: the kept tokens' cells and (RARE,) with the rest of the mass, summing to 1."""
    target, tok = models["gpt2_uni_pad"], toks["unigram"]
    text = TokenText(tok, int(target.get_output_embeddings().weight.shape[0]))
    ids = text.prompt_ids(PROMPT)
    ref = reference_law(target, ids, N, 1, frozenset({text.eos_id}), text.text_mask, PLAIN)
    p1 = softmax_after(target, ids, text.text_mask)
    kept = {t for t, p in enumerate(p1) if N * p >= MIN_EXPECTED}
    want = {(t,): p1[t] for t in kept}
    want[(RARE,)] = sum(p for t, p in enumerate(p1) if t not in kept)
    assert want[(RARE,)] > 0.05
    assert set(ref.law) == set(want)
    for cell, mass in want.items():
        assert ref.law[cell] == pytest.approx(mass, rel=1e-12, abs=1e-15), cell
    assert sum(ref.law.values()) == pytest.approx(1.0, abs=1e-12)
    assert ref.coarse_mass == pytest.approx(want[(RARE,)], rel=1e-12)
