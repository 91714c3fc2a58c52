"""The conformance kit's exact references (hsd_core.conformance): the designed features are really in
the laws, the whole-draw law equals hsd_core's exact engine's target law over the kit as explicit
models (plain and processed), and the expected acceptance equals the exact engine's and the closed
form sum min(p, q) computed here directly."""

from __future__ import annotations

from dataclasses import replace

import sys
from pathlib import Path

import numpy as np
import pytest

from hsd_core import conformance as kc
from hsd_core.exact import target_law
from hsd_core.processing import AmbiguousLawError
from hsd_core.samples import Sampling

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import suite_helpers  # noqa: E402

T = kc.kit_model("target")
D = kc.kit_model("drafter")
I = T.id_of_text
PLAIN = Sampling(True, 1.0, None, None, 3)


def _law(ctx: list[str], s: Sampling = PLAIN) -> np.ndarray:
    ids = [kc.BOS] + [I[t] for t in ctx]
    return kc.next_law(T, ids[:1], ids[1:], s)


def test_designed_features_are_in_the_target_law() -> None:
    tie = _law([" the", " cat", " sat"])
    live = tie[[I[" on"], I["."], I["\n"], I[" the"]]]
    assert live[0] == live[1] == live[2] == live[3] and abs(live[0] - .25) < 1e-3  # an exact four-way tie
    near = _law([" the", " cat", " on"])
    assert 0 < near[I["a"]] - near[I[" the"]] < 1e-3  # a near tie
    assert _law(["a"])[kc.EOS] > 0.3  # EOS mass early
    inside, outside = _law([" cat"]), _law([" dog"])
    assert inside[I[" sat"]] + inside[I[" on"]] < kc.TOP_P - 5e-4  # "." just inside the boundary ...
    assert outside[I[" sat"]] + outside[I[" on"]] > kc.TOP_P + 5e-4  # ... and just outside
    s = replace(PLAIN, top_p=kc.TOP_P, order="vllm")
    assert _law([" cat"], s)[I["."]] > 0 and _law([" dog"], s)[I["."]] == 0
    q = kc.next_law(D, [kc.BOS, I[" the"]])
    assert 0.5 * np.abs(q - _law([" the"])).sum() > 0.3  # the drafter disagrees with the target


def test_eos_mass_rises_with_position() -> None:
    eos = [_law([" the"] * k + ["."])[kc.EOS] for k in (1, 2, 4, 8)]
    assert all(a < b for a, b in zip(eos, eos[1:])) and eos[-1] - eos[0] > 0.05


def test_dead_ids_have_exactly_zero_mass() -> None:
    p = _law([" the"])
    outside = np.ones(len(p), bool)
    outside[list(T.live_ids)] = False
    assert p[outside].sum() == 0.0 and p.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("prompt", [[" the"], [" dog"], ["a"], [" sat"]])
@pytest.mark.parametrize("s", [PLAIN, replace(PLAIN, temperature=0.7, top_p=kc.TOP_P, order="vllm"),
                               replace(PLAIN, min_tokens=2, logit_bias=((I["."], 1.0),), order="vllm"),
                               replace(PLAIN, repetition_penalty=1.3, presence_penalty=0.5, order="llama.cpp")])
def test_sequence_law_equals_the_exact_engines_target_law(prompt: list[str], s: Sampling) -> None:
    suite_helpers.assert_kit_law_is_exact([kc.BOS] + [I[t] for t in prompt], s)


def test_length_and_position_laws_and_stop_strings() -> None:
    ids = [kc.BOS, I[" the"]]
    s = replace(PLAIN, max_new_tokens=4, stop=(" on",), order="vllm")
    law = kc.sequence_law(T, ids, s)
    assert any(why == "stop" and seq[-1] == I[" on"] for seq, (_, why) in law.items())
    lengths = kc.length_law(law)
    assert sum(lengths.values()) == pytest.approx(1.0, abs=1e-12) and lengths[2] > 0
    pos = kc.position_laws(law)
    assert len(pos) == 4 and all(sum(d.values()) == pytest.approx(1.0, abs=1e-12) for d in pos)
    assert pos[0] == pytest.approx({int(t): float(p) for t, p in enumerate(_law([" the"])) if p > 0})


def test_an_undetermined_law_is_refused() -> None:
    with pytest.raises(AmbiguousLawError):
        kc.sequence_law(T, [kc.BOS, I[" cat"], I[" sat"]], replace(PLAIN, top_p=0.5, order="vllm"))


def test_expected_acceptance_is_the_exact_engines_and_the_closed_form() -> None:
    ids = [kc.BOS, I[" the"]]
    sd = kc.expected_acceptance(ids, "sd", lookahead=2, max_new_tokens=3)
    p, q = kc.next_law(T, ids), kc.next_law(D, ids)
    assert sd["first_acceptance"] == pytest.approx(float(np.minimum(p, q).sum()), abs=1e-12)
    assert sd["closed_form"] == pytest.approx(sd["first_acceptance"], abs=1e-12)
    assert 1.0 < sd["tokens_per_call"] < 3.0
    tli = kc.expected_acceptance(ids, "tli", lookahead=2, max_new_tokens=3)
    assert tli["closed_form"] == pytest.approx(tli["first_acceptance"], abs=1e-12)
    assert tli["first_acceptance"] < sd["first_acceptance"]  # " cat" is outside the intersection


def test_target_pos_copies_the_id_two_back_and_is_the_exact_engines() -> None:
    """target_pos (a previous-token head): after ``x y`` the id ``x`` has about 0.57 (its row gives it
    0.15), BOS gives no bonus, and its whole-draw law equals the exact engine's over it as an explicit
    model (toy_models(target="target_pos")), as the acceptance equals the closed form."""
    P = kc.kit_model("target_pos")
    ids = [kc.BOS, I[" the"], I[" cat"]]
    law = kc.next_law(P, ids)
    assert 0.5 < law[I[" the"]] < 0.65 and abs(law[I[" dog"]] - law[I[" sat"]]) < 1e-12
    first = kc.next_law(P, ids[:2])
    assert abs(first[I[" cat"]] - first[I[" dog"]]) < 1e-9  # BOS two back: no bonus
    s = replace(PLAIN, max_new_tokens=2)
    ref = kc.sequence_law(P, ids, s)
    toy, _, _, text = kc.toy_models(ids, s, target="target_pos")
    to_kit = {j: i for j, i in enumerate(kc.toy_ids(P))} | {len(toy.vocab) - 1: kc.EOS}
    exact = {tuple(to_kit[j] for j in seq): float(p) for seq, p in target_law(toy, text, 2).items()}
    assert set(exact) == set(ref) and all(exact[q] == pytest.approx(p, rel=1e-12) for q, (p, _) in ref.items())
    sd = kc.expected_acceptance(ids, "sd", lookahead=2, max_new_tokens=2, target="target_pos")
    assert sd["closed_form"] == pytest.approx(sd["first_acceptance"], abs=1e-12)
    assert sd["first_acceptance"] == pytest.approx(float(np.minimum(law, kc.next_law(D, ids)).sum()), abs=1e-12)


@pytest.mark.parametrize("role", kc.ROLES)
def test_kit_is_a_fixed_design(role: str) -> None:
    a, b = kc.kit_model(role).weights, kc.kit_model.__wrapped__(role).weights  # a fresh build
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert kc.HIDDEN >= max(kc.kit_model(r).vocab_size for r in kc.ROLES) + 1 and kc.HEAD_DIM == 64
