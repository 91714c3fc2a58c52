"""A target that lacks bytes its drafter writes (bytes one tokenizer cannot encode),
tied to ``hsd_core``'s references, which now run whatever the two alphabets (``proofs/slrs.md``
section 5, checked exactly on toy worlds whose alphabets differ).

The pair: a tiny Llama over ``tiny_tokenizer("ascii_bpe")`` (tokens for ASCII text only: the other
bytes are :class:`~hsd_torch.vocab.text.Unencodable`) as the target, and a tiny GPT-2 over the byte-level
``byte_bpe`` (all 256 bytes) as the drafter: many of the drafter's tokens start with a byte that no
target token starts, so their drafts propose nothing (bounded SLRS's parse is dead at once) and psi
is the law given a proposal. The reverse pair (byte-level target, ASCII drafter) has a drafter that
cannot encode part of the target's text: its context leaves it out.

- Bounded SLRS's psi (one token, and the conditionals of multi-token proposals) equals the
  reference's ``SLRS(..., proposal_map="longest_prefix").psi`` over :class:`hsd_torch.CoreModel`
  to 1e-12, on prompts where drafts propose nothing with probability 0.1-0.8; the psi left
  undivided by the mass that proposes (the hook's lossy variant) is off by more than 0.2 there.
- The mirror: fed the uniforms the backend consumed, the references (SLEM, one-token SLRS, bounded
  SLRS one- and multi-token) emit the same tokens, both directions.
- The one-round law: with the reference's psi and the target's law, the emitted first token has
  exactly the target's law when psi is divided, and is off by the TV printed in the test when not
  (computed from the laws, rationals-free float64).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _torch_checks import holed_round_law  # noqa: E402
from hsd_core.methods import SLEM, SLRS, State  # noqa: E402
from hsd_core.rand import UniformRand  # noqa: E402
from hsd_torch import CoreModel, generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch import slrs as tslrs  # noqa: E402
from hsd_torch.models.mirror import core_text, target_greedy  # noqa: E402
from hsd_torch.engine.runner import logit_width  # noqa: E402

generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only: the mirror's setting

torch.set_num_threads(1)
F64 = torch.float64
PROMPTS = ["def foo(x):\n", "Hello", "x = 1", "print(", "# note\n"]  # text the ASCII target can encode
WIDE_PROMPTS = PROMPTS[:3] + ["naïve café", "emoji 😀"]  # for the byte-level target: its ASCII drafter leaves out the rest
K, TAU, MULTI_TAU = 2, 0.02, 0.05


@pytest.fixture(scope="module")
def pair() -> dict[str, Any]:
    ta, tb = tiny.tiny_tokenizer("ascii_bpe"), tiny.tiny_tokenizer("byte_bpe")
    return {"ta": ta, "tb": tb, "t_ascii": tiny.tiny_llama(ta, seed=0, dtype=F64),
            "d_byte": tiny.tiny_gpt2(tb, seed=3, dtype=F64), "t_byte": tiny.tiny_llama(tb, seed=4, dtype=F64),
            "d_ascii": tiny.tiny_gpt2(ta, seed=5, dtype=F64)}


def _core(pair: dict[str, Any], prompt: str) -> tuple[CoreModel, CoreModel]:
    return CoreModel(pair["t_ascii"], pair["ta"], prompt=prompt), CoreModel(pair["d_byte"], pair["tb"], prompt=prompt)


def test_the_pair_has_holes(pair: dict[str, Any]) -> None:
    """Bounded SLRS knows that some drafts propose nothing here, and not on the byte-level target."""
    from hsd_torch.vocab.text import TokenText

    dev = torch.device("cpu")
    holed = tslrs.BoundedSLRS(TokenText.get(pair["ta"], logit_width(pair["t_ascii"])),
                              TokenText.get(pair["tb"], logit_width(pair["d_byte"])), K, TAU, False, dev)
    full = tslrs.BoundedSLRS(TokenText.get(pair["tb"], logit_width(pair["t_byte"])),
                             TokenText.get(pair["ta"], logit_width(pair["d_ascii"])), K, TAU, False, dev)
    assert holed.holes and not full.holes


class Undivided(tslrs.BoundedSLRS):
    """Deliberately lossy: one-token psi left as the mass of each proposal (not the law given one)."""

    def _given_a_proposal(self, psi: Any) -> Any:
        return psi


@pytest.mark.parametrize("cls", [tslrs.BoundedSLRS, Undivided], ids=["psi", "undivided"])
def test_psi_with_holes_equals_the_reference(pair: dict[str, Any], cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend's one-token psi == the reference's psi given a proposal (to 1e-12), with the same
    drafter evaluations; the drafts that propose nothing carry 0.1-0.8 of the mass (the reference's
    empty proposal). The undivided variant is off by more than 0.2 in max abs on every prompt."""
    monkeypatch.setattr(importlib.import_module("hsd_torch.methods.slrs.psi"), "BoundedSLRS", cls)
    res = tslrs.first_round(pair["ta"], logit_width(pair["t_ascii"]), pair["d_byte"], pair["tb"], PROMPTS, lookahead=K,
                            min_path_prob=TAU)
    for r, prompt in enumerate(PROMPTS):
        ct, cd = _core(pair, prompt)
        ps = SLRS(lookahead=K, min_path_prob=TAU, proposal_map="longest_prefix").psi(
            ct, cd, State(core_text(prompt), (), 4))
        hole = float(ps.law.get((), 0.0))
        assert 0.1 < hole < 0.8, (prompt, hole)
        want = np.asarray(ps.first(len(ct.vocab)), dtype=np.float64)
        got = res.psi[r, torch.tensor(ct.tokenizer.hf_ids)].numpy()
        gap = float(np.abs(got - want).max())
        if cls is Undivided:
            assert gap > 0.2 * want.max(), (prompt, gap)
        else:
            assert gap < 1e-12, (prompt, gap)
            assert res.evaluations[r] == ps.evaluations, prompt


def test_multi_token_conditionals_with_holes_equal_the_reference(pair: dict[str, Any]) -> None:
    """Multi-token proposals (up to the budget) on the holed pair: every drawn proposal (some empty)
    is in the reference's support and each position's conditional psi equals ``PsiLaw.conditional``
    to 1e-12."""
    rng = np.random.default_rng(0)
    empty = longest = 0
    for _ in range(3):
        us = [list(rng.random(K)) for _ in PROMPTS]
        res = tslrs.first_round_multi(pair["ta"], logit_width(pair["t_ascii"]), pair["d_byte"], pair["tb"], PROMPTS,
                                      lookahead=K, min_path_prob=MULTI_TAU, max_tokens=None, budget=4, uniforms=us)
        for r, prompt in enumerate(PROMPTS):
            ct, cd = _core(pair, prompt)
            ps = SLRS(lookahead=K, min_path_prob=MULTI_TAU, proposal_map="longest_prefix", max_tokens=None).psi(
                ct, cd, State(core_text(prompt), (), 4))
            prop = res.proposals[r]
            mine = [s for s in ps.law if list(ct.tokenizer.to_hf(s)) == prop]
            assert len(mine) == 1, (prompt, prop)
            hf = torch.tensor(ct.tokenizer.hf_ids)
            for j in range(len(prop)):
                got = res.conditionals[r, j, hf].numpy()
                want = np.asarray(ps.conditional(mine[0][:j], len(ct.vocab)), dtype=np.float64)
                assert float(np.abs(got - want).max()) < 1e-12, (prompt, j)
            empty += not prop
            longest = max(longest, len(prop))
    assert empty > 0 and longest >= 2, (empty, longest)


def test_one_round_with_holes_emits_the_targets_law(pair: dict[str, Any]) -> None:
    """From the reference's psi and the target's law at each prompt: the round's first token has the
    target's law (TV < 1e-12) when psi is the law given a proposal; the undivided variant's TV is
    above 0.01 on some prompt (what a sampled audit would have to find)."""
    worst = 0.0
    for prompt in PROMPTS:
        ct, cd = _core(pair, prompt)
        ps = SLRS(lookahead=K, min_path_prob=TAU, proposal_map="longest_prefix").psi(
            ct, cd, State(core_text(prompt), (), 4))
        mass = 1.0 - float(ps.law.get((), 0.0))
        psi = torch.tensor([float(x) for x in ps.first(len(ct.vocab))], dtype=F64)
        p = torch.as_tensor(ct.next_probs(ct.tokenizer.encode(core_text(prompt))), dtype=F64)
        assert 0.5 * float((holed_round_law(p, psi, mass, True) - p).abs().sum()) < 1e-12, prompt
        worst = max(worst, 0.5 * float((holed_round_law(p, psi, mass, False) - p).abs().sum()))
    assert worst > 0.01, worst


def _mirror(pair: dict[str, Any], target: str, t_tok: str, drafter: str, d_tok: str, method: str,
            kw: dict[str, Any], ref: Any, prompts: list[str]) -> None:
    t, tt, d, dt = pair[target], pair[t_tok], pair[drafter], pair[d_tok]
    out = generate(t, d, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method=method, max_new_tokens=6,
                   seed=11, record_uniforms=True, **kw)
    assert out.uniforms is not None
    ct, cd = CoreModel(t, tt), CoreModel(d, dt)
    for i, prompt in enumerate(prompts):
        rand = UniformRand(out.uniforms[i])
        got = ref.generate(ct, cd, core_text(prompt), 6, rng=rand)
        assert ct.tokenizer.to_hf(got) == out.sequences[i], (method, kw, prompt)
        assert rand.used == len(out.uniforms[i]), "the backend recorded a uniform the reference did not read"


MIRRORED = [
    ("slem", {"lookahead": 3}, lambda: SLEM(lookahead=3)),
    ("slrs", {"lookahead": 1}, lambda: SLRS(lookahead=1, lookbehind=0)),
    ("slrs", {"lookahead": K, "proposal_map": "longest_prefix", "min_path_prob": TAU},
     lambda: SLRS(lookahead=K, min_path_prob=TAU, proposal_map="longest_prefix")),
    ("slrs", {"lookahead": K, "proposal_map": "longest_prefix", "min_path_prob": MULTI_TAU, "max_tokens": None},
     lambda: SLRS(lookahead=K, min_path_prob=MULTI_TAU, proposal_map="longest_prefix", max_tokens=None)),
]


@pytest.mark.parametrize("direction", ["ascii-target", "ascii-drafter"])
@pytest.mark.parametrize("method,kw,ref", MIRRORED, ids=["slem", "slrs1", "bounded", "bounded-multi"])
def test_mirror_with_alphabets_that_differ(pair: dict[str, Any], direction: str, method: str, kw: dict[str, Any],
                                          ref: Any) -> None:
    """The references, fed the backend's uniforms, emit its tokens: the ASCII target (drafts it cannot
    encode propose nothing) and the ASCII drafter (its context leaves out the target's other bytes)."""
    if direction == "ascii-target":
        _mirror(pair, "t_ascii", "ta", "d_byte", "tb", method, kw, ref(), PROMPTS)
    else:
        _mirror(pair, "t_byte", "tb", "d_ascii", "ta", method, kw, ref(), WIDE_PROMPTS)


@pytest.mark.parametrize("method,kw,ref", MIRRORED, ids=["slem", "slrs1", "bounded", "bounded-multi"])
def test_greedy_with_holes_is_the_targets_own(pair: dict[str, Any], method: str, kw: dict[str, Any], ref: Any) -> None:
    t, tt, d, dt = pair["t_ascii"], pair["ta"], pair["d_byte"], pair["tb"]
    got = generate(t, d, PROMPTS, target_tokenizer=tt, drafter_tokenizer=dt, method=method, max_new_tokens=8,
                   do_sample=False, **kw)
    assert got.sequences == [target_greedy(t, tt, p, 8) for p in PROMPTS]
