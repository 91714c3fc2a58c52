"""Text one tokenizer cannot encode.

SmolLM2's byte-level BPE has no token for 21 single bytes (0xC0, 0xC1, 0xF5-0xFF and some control
characters), so a Gemma drafter id such as ``<0xC0>`` has no first SmolLM2 id: one-token SLRS
raised on every prompt of that pair. The rule now (``hsd_torch.vocab.text.Unencodable``):

- a drafter id whose text the target cannot encode proposes nothing (one-token SLRS: the map's
  ``-1``; the row's round is the target's own token) and psi is the law of the first target id
  *given* a proposal (divided by the mass of the ids that have one), which keeps the method exact;
- SLEM proposes no candidate for a drafted text the target cannot encode;
- a drafter's context leaves out what the drafter cannot encode (that context only shapes
  proposals).

Exactness of the renormalized psi is shown on the tiny pair with holes punched into the map (every
drafter id whose first target id is the target's most likely token proposes nothing; the holes
carry 0.36 of the drafter's mass): the exact law of one round, from the laws themselves, is the
target's (to 1e-12), and the variant that forgets to renormalize is off by TV 0.19 (computed here, asserted > EPS);
then sampled at N = 6,000 first tokens, where the test (chi-square, alpha = 1e-6) has power 0.99
at the TV ``EPS`` it states, which the lossy variant's exceeds: the lossless code passes, the
variant is caught.
"""

from __future__ import annotations

import functools

import importlib
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _torch_checks import holed_round_law  # noqa: E402
from hsd_core.stats import assert_law_matches, min_num_samples_for_tv, min_tv_detectable  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.engine._cache import IdentityCache  # noqa: E402
from hsd_torch.generate import process_logits  # noqa: E402
from hsd_torch.methods.slrs import SLRS, FirstTargetMap  # noqa: E402
from hsd_torch.vocab.text import TokenText, Unencodable  # noqa: E402
generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only: the mirror's setting

torch.set_num_threads(1)

SLRS_MODULE = importlib.import_module("hsd_torch.methods.slrs")
PROMPT = "def foo(x):\n"
TOP_K = 6
ALPHA, POWER = 1e-6, 0.99
N = 6_000
DRAFTER_TEMPERATURE = 1.5
EPS = 0.075  # the smallest TV the test below detects with power 0.99 on <= 7 cells (asserted)


def width(model: Any) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def _pair(toks: dict[str, Any], models: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """The target drafting for itself (at DRAFTER_TEMPERATURE): the drafts' first target ids share
    the target's support, so how psi is normalized changes what is accepted."""
    return models["llama_bpe"], toks["byte_bpe"], models["llama_bpe"], toks["byte_bpe"]


def _laws(toks: dict[str, Any], models: dict[str, Any]) -> tuple[Any, Any, TokenText, TokenText]:
    """The target's processed law p [Vt] and the drafter's q [Vd] at PROMPT (top-k 6, float64)."""
    target, tt, drafter, dt = _pair(toks, models)
    ttext, dtext = TokenText.get(tt, width(target)), TokenText.get(dt, width(drafter))
    with torch.inference_mode():
        p = process_logits(target(torch.tensor([ttext.prompt_ids(PROMPT)])).logits[0, -1], ttext.text_mask,
                           top_k=TOP_K)
        q = process_logits(drafter(torch.tensor([dtext.prompt_ids(PROMPT)])).logits[0, -1], dtext.text_mask,
                           temperature=DRAFTER_TEMPERATURE, top_k=TOP_K)
    return p.double(), q.double(), ttext, dtext


def _holes(toks: dict[str, Any], models: dict[str, Any]) -> tuple[list[int], list[int]]:
    """The real first-target map and the drafter ids punched out of it: those whose first target id
    is the target's most likely token at PROMPT."""
    p, _, tt, dt = _laws(toks, models)
    first = FirstTargetMap(tt, dt).first
    top = int(p.argmax())
    return first, [d for d, f in enumerate(first) if f == top]


@pytest.fixture()
def holed_map(toks: dict[str, Any], models: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """``generate``'s one-token SLRS with the holes of :func:`_holes` (fresh caches, restored after)."""
    _, holes = _holes(toks, models)

    class Holed(FirstTargetMap):
        _cache: IdentityCache[FirstTargetMap] = IdentityCache()

        def __init__(self, tt: TokenText, dt: TokenText) -> None:
            super().__init__(tt, dt)
            for d in holes:
                self.first[d] = -1
            self.unmappable = sorted(set(self.unmappable) | set(holes))

    monkeypatch.setattr(SLRS_MODULE, "FirstTargetMap", Holed)
    monkeypatch.setattr(SLRS_MODULE, "_COLUMNS", IdentityCache(16))
    yield holes


@pytest.fixture()
def unnormalized(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deliberately lossy: psi is the pushforward without dividing by the mass that proposes."""
    setup = SLRS.setup

    def lossy_setup(self: SLRS, gen: Any) -> None:
        setup(self, gen)
        self.partial = False

    monkeypatch.setattr(SLRS, "setup", lossy_setup)


def _round_law(p: Any, q: Any, first: list[int], holes: set[int], normalized: bool) -> Any:
    """The exact law of the token one round of one-token SLRS emits: a draft ``d ~ q``; with no
    target id (a hole) the target's own token; else its first target id verified against psi (the
    pushforward, divided by the mass that proposes when ``normalized``)."""
    psi = torch.zeros_like(p)
    for d in torch.nonzero(q).flatten().tolist():
        if first[d] >= 0 and d not in holes:
            psi[first[d]] += q[d]
    m = float(psi.sum())
    return holed_round_law(p, psi / m, m, normalized)  # psi / m: the law of the proposal given that there is one


def test_the_sampled_test_is_sized() -> None:
    assert min_num_samples_for_tv(TOP_K + 1, EPS, ALPHA, POWER) <= N
    assert min_tv_detectable(TOP_K + 1, N, ALPHA, POWER) <= EPS


def test_renormalized_psi_is_exact_and_the_variant_is_not(toks: dict[str, Any], models: dict[str, Any]) -> None:
    p, q, *_ = _laws(toks, models)
    first, holes = _holes(toks, models)
    hole_mass = float(q[holes].sum())
    assert 0.2 < hole_mass < 0.8, hole_mass  # the holes matter, and some drafts still propose
    lossless = _round_law(p, q, first, set(holes), normalized=True)
    lossy = _round_law(p, q, first, set(holes), normalized=False)
    assert float(0.5 * (lossless - p).abs().sum()) < 1e-12
    assert float(0.5 * (lossy - p).abs().sum()) > EPS


def _sampled(toks: dict[str, Any], models: dict[str, Any], seed: int) -> list[tuple[int, ...]]:
    target, tt, drafter, dt = _pair(toks, models)
    out = generate(target, drafter, [PROMPT] * N, target_tokenizer=tt, drafter_tokenizer=dt, method="slrs",
                   lookahead=1, max_new_tokens=1, top_k=TOP_K, seed=seed, drafter_temperature=DRAFTER_TEMPERATURE)
    return [tuple(s) for s in out.sequences]


def _law(toks: dict[str, Any], models: dict[str, Any]) -> dict[tuple[int, ...], float]:
    p = _laws(toks, models)[0]
    return {(int(i),): float(p[i]) for i in torch.nonzero(p).flatten()}


def test_holes_keep_one_token_slrs_exact(toks: dict[str, Any], models: dict[str, Any], holed_map: list[int]) -> None:
    assert_law_matches(_law(toks, models), _sampled(toks, models, seed=1), alpha=ALPHA, eps=EPS, power=POWER)


def test_holes_without_renormalizing_are_caught(toks: dict[str, Any], models: dict[str, Any], holed_map: list[int],
                                                unnormalized: None) -> None:
    with pytest.raises(AssertionError, match="rejected"):
        assert_law_matches(_law(toks, models), _sampled(toks, models, seed=2), alpha=ALPHA, eps=EPS, power=POWER)


def test_holes_in_greedy_are_the_targets_own_tokens(toks: dict[str, Any], models: dict[str, Any],
                                                    holed_map: list[int]) -> None:
    """Greedy with holes: a hole drafted proposes nothing, and the output is the target's argmax."""
    target, tt, drafter, dt = _pair(toks, models)
    enc = tt(PROMPT, return_tensors="pt", add_special_tokens=True)
    want = target.generate(**enc, max_new_tokens=6, do_sample=False)[0, enc.input_ids.shape[1]:].tolist()
    out = generate(target, drafter, PROMPT, target_tokenizer=tt, drafter_tokenizer=dt, method="slrs", lookahead=1,
                   max_new_tokens=6, do_sample=False)
    assert out.sequences[0] == want
    assert out.stats[0].proposed < out.stats[0].target_calls  # the first draft, the argmax, was a hole


def test_encode_raises_unencodable_or_leaves_out(toks: dict[str, Any]) -> None:
    """A byte with no token: ``Unencodable`` (a ValueError), or left out with ``free=True``. (A
    private TokenText whose byte 0xC0 is taken away, as SmolLM2 lacks it.)"""
    text = TokenText(toks["byte_bpe"], len(toks["byte_bpe"]))
    assert text.decode(text.encode(b"ab\xc0cd")) == b"ab\xc0cd"
    del text.byte_id[0xC0]
    with pytest.raises(Unencodable, match="0xc0"):
        text.encode(b"ab\xc0cd")
    assert issubclass(Unencodable, ValueError)
    assert text.decode(text.encode(b"ab\xc0cd", free=True)) == b"abcd"


def test_slem_proposes_nothing_for_text_the_target_cannot_encode(toks: dict[str, Any], models: dict[str, Any],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Every re-tokenization fails (as for a drafted text with a byte the target lacks): SLEM
    proposes no candidate, each round is the target's own token, and greedy is still the target's."""
    target, tt, drafter, dt = models["llama_bpe"], toks["byte_bpe"], models["gpt2_uni_pad"], toks["unigram"]
    slem = importlib.import_module("hsd_torch.methods.slem")

    def unencodable(*args: Any) -> list[int]:
        raise Unencodable("the tokenizer has no token for the byte 0xc0")

    monkeypatch.setattr(slem, "retokenize", unencodable)
    enc = tt(PROMPT, return_tensors="pt")
    want = target.generate(**enc, max_new_tokens=5, do_sample=False)[0, enc.input_ids.shape[1]:].tolist()
    out = generate(target, drafter, PROMPT, target_tokenizer=tt, drafter_tokenizer=dt, method="slem", lookahead=3,
                   max_new_tokens=5, do_sample=False)
    assert out.sequences[0] == want
    assert out.stats[0].proposed == 0 and out.stats[0].target_calls == len(want)
