"""Every deliberately lossy variant is found lossy by the exact engine, and by how much.

The pinned worlds (``hsd_core.variants.PINNED``) are the shrunk counterexamples Hypothesis found;
the TV figures below are what the exact engine computes on them (recorded so that a change in a
variant's or the engine's behaviour shows up here). The slow tier re-discovers a counterexample
for each variant from scratch with Hypothesis.
"""

from fractions import Fraction

import pytest
from hypothesis import find, settings

from hsd_core import variants
from hsd_core.exact import LossyError, assert_laws_equal, first_difference, output_law, target_law, total_variation
from hsd_core.strategies import worlds
from hsd_core.worlds import from_spec

F = Fraction
N = variants.PINNED_MAX_NEW_TOKENS

RECORDED_TV = {
    "accept_every_draft": F(45, 56),
    "residual_from_p": F(767, 3136),
    "bonus_off_by_one": F(2873, 20160),
    "tli_raw_q": F(239, 2520),
    "tli_outside_intersection": F(315719, 2993760),
    "tli_scatter_assign": F(110545, 880308),
    "slem_retokenized_context": F(8441, 112651),
    "slrs_concat_psi": F(5, 72),
    "slrs_unconditioned": F(3168423353887, 53429274001152),
    "slrs_coin_stop": F(909, 11396),
}


def test_every_variant_is_pinned() -> None:
    assert set(variants.VARIANTS) == set(variants.PINNED) == set(RECORDED_TV)


@pytest.mark.parametrize("name", sorted(variants.VARIANTS))
def test_variant_is_lossy_on_its_pinned_world(name: str) -> None:
    target, drafter, prompt = from_spec(variants.PINNED[name])
    law = output_law(variants.VARIANTS[name](), target, drafter, prompt, N)
    ref = target_law(target, prompt, N)
    tv = total_variation(law, ref)
    assert tv > 0, f"{name} is not caught on its pinned world"
    assert first_difference(law, ref) is not None
    with pytest.raises(LossyError, match="first differing sequence"):
        assert_laws_equal(law, ref, what=name)
    assert tv == RECORDED_TV[name], f"{name}: TV {tv} = {float(tv):.5f}, recorded {RECORDED_TV[name]}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(variants.VARIANTS))
def test_hypothesis_rediscovers_each_variant(name: str) -> None:
    same = name in variants.NEEDS_SAME_VOCAB

    def lossy(w: object) -> bool:
        assert hasattr(w, "target")
        m = variants.VARIANTS[name]()
        return output_law(m, w.target, w.drafter, w.prompt, N) != target_law(w.target, w.prompt, N)  # type: ignore[attr-defined]

    w = find(worlds(same_vocab=same), lossy, settings=settings(max_examples=2000, database=None))
    assert lossy(w)
