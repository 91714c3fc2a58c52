"""No silent wrong result, no hang, and errors a user can act on."""

from __future__ import annotations

import random
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

import hsd_core as hc
from hsd_core.laws import InvalidLawError
from hsd_core.rand import CostLimitError
from hsd_core.worlds import builtin_world

V = hc.Vocabulary(["a", "b"])
TOK = hc.LongestMatchTokenizer(V)


class ProtocolModel:
    """A Model by the protocol only (not a BaseModel), returning whatever ``fn`` returns."""

    def __init__(self, vocab: hc.Vocabulary, fn: Any) -> None:
        self._vocab, self._tok, self._fn = vocab, hc.LongestMatchTokenizer(vocab), fn

    @property
    def vocab(self) -> hc.Vocabulary:
        return self._vocab

    @property
    def tokenizer(self) -> hc.Tokenizer:
        return self._tok

    def next_probs(self, context_ids: Sequence[int]) -> Any:
        return self._fn(tuple(context_ids))


# --- section 2 -------------------------------------------------------------------------------

def test_protocol_model_laws_are_validated_by_methods_and_engine() -> None:
    """4 entries for a 3-id vocabulary used to make AR emit id 3, which does not exist."""
    bad = ProtocolModel(V, lambda ctx: [0.25, 0.25, 0.25, 0.25])
    with pytest.raises(InvalidLawError, match="4 entries, expected 3"):
        hc.methods.AR().generate(bad, None, "a", 3, rng=0)
    with pytest.raises(InvalidLawError):
        hc.exact.output_law(hc.methods.AR(), bad, None, "a", 2)
    with pytest.raises(InvalidLawError):
        hc.exact.target_law(bad, "a", 2)
    drafter = ProtocolModel(V, lambda ctx: [Fraction(1, 2), Fraction(1, 2)])  # 2 entries, 3 ids
    good = hc.toy.random_model(V, TOK, seed=1)
    with pytest.raises(InvalidLawError):
        hc.methods.SD(lookahead=2).generate(good, drafter, "a", 3, rng=0)
    with pytest.raises(InvalidLawError):
        hc.methods.SLRS(lookahead=2).psi(good, drafter, hc.methods.State("a", (), 2))


def test_valid_protocol_model_runs_and_is_exact() -> None:
    ok = ProtocolModel(V, lambda ctx: [Fraction(1, 2), Fraction(1, 4), Fraction(1, 4)])
    hc.exact.assert_lossless(hc.methods.SD(lookahead=2), ok, ok, "a", 3)
    assert len(hc.methods.TLI(lookahead=2).generate(ok, ok, "a", 3, rng=1)) <= 3
    fast = ProtocolModel(V, lambda ctx: np.array([0.5, 0.25, 0.25], dtype=np.float32))  # a real model's output
    assert hc.methods.AR().generate(fast, None, "a", 2, rng=0)


def _readme_world(exact: bool) -> tuple[hc.toy.RandomModel, hc.toy.RandomModel]:
    T = hc.Vocabulary(["a", "b", "c", "ab", "bc", "abc"])
    D = hc.Vocabulary(["a", "b", "c", "ca", "cab"])
    return (hc.toy.random_model(T, hc.LongestMatchTokenizer(T), seed=1, exact=exact),
            hc.toy.random_model(D, hc.LongestMatchTokenizer(D), seed=2, exact=exact))


def test_assert_lossless_on_float_models_uses_a_stated_tolerance() -> None:
    """Float models: a correct TLI differs from the target by rounding only (TV ~1e-16); it passes
    within FLOAT_TV_TOL, and a lossy variant still fails with a message that says floats were
    compared within a tolerance."""
    target, drafter = _readme_world(exact=False)
    for m in (hc.methods.TLI(lookahead=2), hc.methods.SLEM(lookahead=2), hc.methods.SLRS(lookahead=2)):
        hc.exact.assert_lossless(m, target, drafter, "ab", 3)
    with pytest.raises(hc.exact.LossyError, match="float laws, compared within TV"):
        hc.exact.assert_lossless(hc.variants.TLIRawQ(lookahead=2), target, drafter, "ab", 3)
    etarget, edrafter = _readme_world(exact=True)
    with pytest.raises(hc.exact.LossyError):
        hc.exact.assert_lossless(hc.variants.TLIRawQ(lookahead=2), etarget, edrafter, "ab", 3, tol=0.0)


def _count_calls(model: Any, limit: int) -> list[int]:
    """Count ``model.next_probs`` calls (an instance attribute over the method, so the model keeps
    its class and its own validation); returns the one-element counter. Past ``limit`` calls it
    fails the test (so a guard that stops working fails here instead of hanging)."""
    real, n = model.next_probs, [0]

    def next_probs(context_ids: Sequence[int]) -> Any:
        n[0] += 1
        if n[0] > limit:
            pytest.fail(f"more than {limit} next_probs calls: the cost guard did not stop the work")
        return real(context_ids)

    model.next_probs = next_probs
    return n


def test_slrs_psi_cost_is_bounded() -> None:
    """SLRS(lookahead=50) used to hang; it now refuses after max_psi_calls drafter calls (the
    default, 200,000: a few seconds), saying to lower the lookahead. Counted, not timed: the
    drafter is called at most max_psi_calls times in psi plus one draft of <= lookahead tokens.
    The budget (60) exceeds the lookahead: a round drafts at most min(lookahead, budget) tokens."""
    from hsd_core.methods.slrs import DEFAULT_MAX_PSI_CALLS

    w = builtin_world()
    target_calls = _count_calls(w.target, 50)
    drafter_calls = _count_calls(w.drafter, DEFAULT_MAX_PSI_CALLS + 50)
    with pytest.raises(CostLimitError, match="Lower the lookahead"):
        hc.methods.SLRS(lookahead=50).generate(w.target, w.drafter, w.prompt, 60, rng=0)
    assert DEFAULT_MAX_PSI_CALLS <= drafter_calls[0] <= DEFAULT_MAX_PSI_CALLS + 50, drafter_calls
    assert target_calls[0] <= 50, target_calls
    with pytest.raises(CostLimitError, match="max_psi_calls=10"):
        hc.methods.SLRS(lookahead=3, max_psi_calls=10).psi(w.target, w.drafter, hc.methods.State(w.prompt, (), 3))
    with pytest.raises(ValueError, match="max_psi_calls"):
        hc.methods.SLRS(max_psi_calls=0)


def test_exact_engine_cost_is_estimated_and_bounded() -> None:
    """30 tokens would take ~1e25 round executions: refused after two levels, with the estimate and
    what to lower; an explicit max_calls bounds the work exactly. Counted, not timed: the refusal
    comes from the projection, after fewer than 5% of the default max_calls in model calls."""
    w = builtin_world()
    budget = hc.exact.DEFAULT_MAX_CALLS // 20
    target_calls, drafter_calls = _count_calls(w.target, budget), _count_calls(w.drafter, budget)
    with pytest.raises(CostLimitError, match="lower max_new_tokens") as info:
        hc.exact.output_law(hc.methods.SLEM(lookahead=2), w.target, w.drafter, w.prompt, 30)
    assert "for the first 2 of 30 tokens" in str(info.value)
    assert target_calls[0] + drafter_calls[0] < budget, (target_calls, drafter_calls)
    before = target_calls[0]
    with pytest.raises(CostLimitError, match="lower max_new_tokens"):
        hc.exact.target_law(w.target, w.prompt, 30)
    assert target_calls[0] - before <= 10, target_calls
    with pytest.raises(CostLimitError, match="max_calls=5"):
        hc.exact.output_law(hc.methods.SLEM(lookahead=2), w.target, w.drafter, w.prompt, 3, max_calls=5)
    with pytest.raises(CostLimitError, match="max_calls=3"):
        hc.exact.target_law(w.target, w.prompt, 3, max_calls=3)
    law = hc.exact.output_law(hc.methods.SLEM(lookahead=2), w.target, w.drafter, w.prompt, 2)
    assert sum(law.values()) == 1


def test_vocabulary_takes_sequences_only() -> None:
    with pytest.raises(TypeError, match="PYTHONHASHSEED"):
        hc.Vocabulary({"a", "b", "c"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence"):
        hc.Vocabulary(frozenset({"a"}))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence"):
        hc.Vocabulary(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence"):
        hc.Vocabulary("abc")
    assert hc.Vocabulary(("a", "b")).tokens == ("a", "b")


def test_ids_must_be_integers() -> None:
    with pytest.raises(TypeError, match="not an integer"):
        TOK.decode([0.9, 1.2])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="not an integer"):
        V.string(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not an integer"):
        V.string(True)
    assert TOK.decode([np.int64(0), 1]) == "ab" and V.string(np.int32(1)) == "b"


@pytest.mark.parametrize("cls", [hc.methods.AR, hc.methods.SD, hc.methods.SLEM, hc.methods.TLI, hc.methods.SLRS])
def test_greedy_must_be_a_bool(cls: Any) -> None:
    with pytest.raises(TypeError, match="greedy"):
        cls(greedy="no")
    assert cls(greedy=np.bool_(True)).greedy is True and cls(greedy=False).greedy is False


@pytest.mark.parametrize("law", [["0.5", "0.5", "0"], [True, False, False], {0: 1, 1: 0, 2: 0}, "abc", 0.5])
def test_laws_must_be_sequences_of_numbers(law: Any) -> None:
    m = hc.toy.FunctionModel(V, TOK, lambda ctx: law)
    with pytest.raises(InvalidLawError):
        m.next_probs(())


def test_bpe_merges_must_be_pairs_of_strings() -> None:
    v = hc.Vocabulary(["a", "b", "ab"])
    with pytest.raises(ValueError, match="pair of strings"):
        hc.BPETokenizer(v, ["ab"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="pair of strings"):
        hc.BPETokenizer(v, [("a", "b", "c")])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="merges"):
        hc.BPETokenizer(v, "ab")  # type: ignore[arg-type]
    assert hc.BPETokenizer(v, [["a", "b"]]).encode("ab") == [2]  # type: ignore[list-item]


# --- section 3 -------------------------------------------------------------------------------

def test_rng_follows_spec_7() -> None:
    """An int seed, a Generator, a SeedSequence, None: all accepted; the seed is default_rng's."""
    w = builtin_world()
    m = hc.methods.TLI(lookahead=2)

    def run(rng: Any) -> list[int]:
        return m.generate(w.target, w.drafter, w.prompt, 3, rng=rng)

    ref = run(np.random.default_rng(7))
    assert run(7) == ref and run(np.int64(7)) == ref
    assert run(np.random.SeedSequence(7)) == run(np.random.default_rng(np.random.SeedSequence(7)))
    assert 1 <= len(run(None)) <= 3
    assert hc.rand.NumpyRand(7).categorical([0.5, 0.5]) == hc.rand.NumpyRand(np.random.default_rng(7)).categorical(
        [0.5, 0.5])
    for legacy in (np.random.RandomState(0), random.Random(0)):
        with pytest.raises(TypeError, match="SPEC 7"):
            run(legacy)
    with pytest.raises(TypeError, match="int seed"):
        run("seed")
    with pytest.raises(ValueError, match=">= 0"):
        run(-1)


@pytest.mark.parametrize("kwargs,match", [
    ({"seed": None}, "seed"), ({"seed": 1.5}, "seed"), ({"seed": 0, "eos_weight": 1.5}, "eos_weight"),
    ({"seed": 0, "eos_weight": -1}, "eos_weight"), ({"seed": 0, "max_weight": 0}, "max_weight"),
])
def test_random_model_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        hc.toy.random_model(V, TOK, **kwargs)


def test_clear_errors_instead_of_deep_frames() -> None:
    w = builtin_world()
    with pytest.raises(TypeError, match="not a model"):
        hc.methods.AR().generate("not a model", None, "a", 2, rng=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a model"):
        hc.exact.target_law(object(), "a", 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a model"):
        hc.methods.TLI().generate(w.target, 3, w.prompt, 2, rng=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"instance such as TLI\(\)"):
        hc.exact.output_law(hc.methods.TLI, w.target, w.drafter, w.prompt, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="context"):
        hc.toy.TableModel(V, TOK, {0: [Fraction(1), 0, 0]})  # type: ignore[dict-item]
    with pytest.raises(InvalidLawError, match="dict"):
        hc.toy.FunctionModel(V, TOK, lambda ctx: {0: 0.5, 1: 0.5, 2: 0.0}).next_probs(())  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="output laws"):
        hc.exact.total_variation([1], [1])  # type: ignore[arg-type]
