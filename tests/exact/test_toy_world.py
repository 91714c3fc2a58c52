"""The toy world: vocabularies, tokenizers, models and their input validation."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hsd_core as hc
from hsd_core.methods.tli import Intersection
from hsd_core.strategies import bpe_tokenizers, tokenizers, vocabularies

T = hc.Vocabulary(["a", "b", "c", "ab", "bc", "abc"], eos="<eos>")
TOK = hc.LongestMatchTokenizer(T)


def test_contract_snippet() -> None:
    """The public API snippet of the foundation issue, verbatim."""
    assert len(T) == 7 and T.eos_id == 6
    assert TOK.encode("abc") == [5] and TOK.decode([3, 2]) == "abc"
    target = hc.toy.random_model(T, TOK, seed=1)
    drafter = hc.toy.random_model(T, TOK, seed=2)
    table = hc.toy.FunctionModel(T, TOK, lambda ctx: [Fraction(1, 7)] * 7)
    assert table.next_probs((0,)) == (Fraction(1, 7),) * 7
    law = hc.exact.output_law(hc.methods.SD(lookahead=3), target, drafter, prompt="ab", max_new_tokens=4)
    assert law == hc.exact.target_law(target, prompt="ab", max_new_tokens=4)
    assert all(isinstance(p, Fraction) for p in law.values())
    assert all(isinstance(k, tuple) for k in law)
    ids = hc.methods.SD(lookahead=3).generate(target, drafter, prompt="ab", max_new_tokens=4,
                                              rng=np.random.default_rng(0))
    assert isinstance(ids, list) and 1 <= len(ids) <= 4 and all(0 <= i < 7 for i in ids)


def test_vocabulary_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        hc.Vocabulary([])
    with pytest.raises(ValueError, match="empty string"):
        hc.Vocabulary(["a", ""])
    with pytest.raises(ValueError, match="not single-character tokens"):
        hc.Vocabulary(["a", "ab"])
    with pytest.raises(ValueError, match="out of band"):
        hc.Vocabulary(["a"], eos="a")
    with pytest.raises(ValueError, match="unknown token id"):
        T.string(99)


def test_vocabulary_duplicates_and_lookup() -> None:
    v = hc.Vocabulary(["a", "b", "ab", "ab"])
    assert v.ids_of("ab") == (2, 3) and v.id_of("ab") == 2 and v.eos_id == 4
    assert hc.LongestMatchTokenizer(v).encode("abab") == [2, 2]
    assert v.string(v.eos_id) == ""
    with pytest.raises(KeyError):
        v.id_of("ba")


def test_vocabulary_written_ids() -> None:
    """A string several ids share is written as the vocabulary's ``written`` id (as a SentencePiece tokenizer
    writes its piece ``b``, not the lower byte fallback ``<0x62>``): ``id_of``, the tokenizers and TLI's
    intersection (its re-sync) all follow it, and TLI stays lossless."""
    v = hc.Vocabulary(["a", "b", "ab", "a"], written={"a": 3})
    assert v.id_of("a") == 3 and v.ids_of("a") == (0, 3) and v.id_of("b") == 1
    assert hc.LongestMatchTokenizer(v).encode("aba") == [2, 3]
    assert v != hc.Vocabulary(["a", "b", "ab", "a"])
    same = hc.Vocabulary(["a", "b", "ab", "a"], written={"a": 3, "b": 1})  # naming the lowest id is the default
    assert v == same and hash(v) == hash(same) and "written={'a': 3}" in repr(v)
    inter = Intersection.of(hc.Vocabulary(["a", "b"]), v)
    assert inter.to_drafter == (3, 1, 4) and inter.to_target == (0, 1, None, 0, 2)
    with pytest.raises(ValueError, match="not an id with that string"):
        hc.Vocabulary(["a", "b"], written={"a": 1})
    target_v = hc.Vocabulary(["a", "b", "ab"])
    target = hc.toy.random_model(target_v, hc.LongestMatchTokenizer(target_v), seed=3)
    drafter = hc.toy.random_model(v, hc.LongestMatchTokenizer(v), seed=4)
    law = hc.exact.output_law(hc.methods.TLI(lookahead=2), target, drafter, prompt="a", max_new_tokens=3)
    assert law == hc.exact.target_law(target, prompt="a", max_new_tokens=3)


def test_unknown_characters_raise() -> None:
    with pytest.raises(ValueError, match="not in the vocabulary"):
        TOK.encode("abd")
    bpe = hc.BPETokenizer(hc.Vocabulary(["a", "b", "ab"]), [("a", "b")])
    with pytest.raises(ValueError, match="not in the vocabulary"):
        bpe.encode("x")
    with pytest.raises(ValueError, match="not a token"):
        hc.BPETokenizer(hc.Vocabulary(["a", "b"]), [("a", "b")])


def test_longest_match_and_bpe_differ_on_purpose() -> None:
    v = hc.Vocabulary(["a", "b", "c", "ab", "bc"])
    assert hc.LongestMatchTokenizer(v).encode("abc") == [3, 2]
    bpe = hc.BPETokenizer(v, [("b", "c"), ("a", "b")])
    assert bpe.encode("abc") == [0, 4]  # merge rank decides, not length
    assert bpe.decode(bpe.encode("abcab")) == "abcab"


@settings(max_examples=200)
@given(tok=tokenizers(), text=st.text("abc", max_size=12))
def test_tokenizers_round_trip(tok: hc.Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.encode(tok.decode(ids)) == ids  # canonical ids are a fixed point
    assert all(0 <= i < tok.vocab.eos_id for i in ids)


@settings(max_examples=100)
@given(tok=bpe_tokenizers(), text=st.text("abc", min_size=1, max_size=8))
def test_encode_is_not_injective_inverse(tok: hc.Tokenizer, text: str) -> None:
    """decode∘encode is the identity; encode∘decode maps the all-characters split to canonical."""
    chars = [tok.vocab.id_of(c) for c in text]
    assert tok.encode(tok.decode(chars)) == tok.encode(text)


@settings(max_examples=50)
@given(v=vocabularies())
def test_vocabularies_strategy_invariants(v: hc.Vocabulary) -> None:
    assert all(c in v for c in "abc") and len(v) == len(v.tokens) + 1


@pytest.mark.parametrize(
    "law, match",
    [
        ([Fraction(1, 2), Fraction(1, 2)], "expected 7"),
        ([Fraction(-1, 7)] + [Fraction(8, 42)] * 6, "negative"),
        ([float("nan")] + [1 / 6] * 6, "NaN"),
        ([Fraction(1, 8)] * 7, "not exactly 1"),
        ([0.2] * 7, "not 1"),
        (["x"] * 7, "not a number"),
    ],
)
def test_bad_laws_raise(law: list[object], match: str) -> None:
    m = hc.toy.FunctionModel(T, TOK, lambda ctx: law)
    with pytest.raises(hc.InvalidLawError, match=match):
        m.next_probs(())


def test_model_context_validation() -> None:
    m = hc.toy.random_model(T, TOK, seed=0)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        m.next_probs((42,))
    with pytest.raises(ValueError, match="contains EOS"):
        m.next_probs((T.eos_id,))
    with pytest.raises(ValueError, match="tokenizer's vocabulary"):
        hc.toy.random_model(T, hc.LongestMatchTokenizer(hc.Vocabulary(["a"])), seed=0)
    with pytest.raises(KeyError):
        hc.toy.TableModel(T, TOK, {(): [Fraction(1, 7)] * 7}).next_probs((0,))


def test_lookahead_and_budget_errors() -> None:
    for bad in (0, -1, 1.5, True):
        for cls in (hc.methods.SD, hc.methods.SLEM, hc.methods.TLI, hc.methods.SLRS):
            with pytest.raises(ValueError, match="lookahead"):
                cls(lookahead=bad)
    m = hc.toy.random_model(T, TOK, seed=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        hc.exact.output_law(hc.methods.AR(), m, None, "a", 0)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        hc.exact.target_law(m, "xyz", 2)
    with pytest.raises(ValueError, match="share one vocabulary"):
        other = hc.Vocabulary(["a", "b", "c"])
        hc.methods.SD().generate(m, hc.toy.random_model(other, hc.LongestMatchTokenizer(other), 0), "a", 2,
                                 np.random.default_rng(0))
    with pytest.raises(ValueError, match="needs rng"):
        hc.methods.SD().generate(m, m, "a", 2)


def test_random_models_are_reproducible_and_context_dependent() -> None:
    a = hc.toy.random_model(T, TOK, seed=3)
    b = hc.toy.random_model(T, TOK, seed=3)
    assert a.next_probs((0, 1)) == b.next_probs((0, 1))
    assert len({a.next_probs((i,)) for i in range(6)}) > 1
    f = hc.toy.random_model(T, TOK, seed=3, exact=False)
    assert [float(x) for x in a.next_probs((2,))] == pytest.approx(list(f.next_probs((2,))), abs=1e-15)
    assert hc.toy.random_model(T, TOK, seed=3, eos_weight=0).next_probs(())[T.eos_id] == 0


def test_induced_models_approximate_each_other() -> None:
    """Two vocabularies, one character source: high acceptance between the two."""
    from hsd_core.worlds import builtin_world

    w = builtin_world()
    a = hc.exact.analyze(hc.methods.TLI(lookahead=2), w.target, w.drafter, w.prompt, 3)
    assert a.tokens_per_call > Fraction(3, 2)


def test_relabeled_model_is_the_same_law_on_strings() -> None:
    D = hc.Vocabulary(["abc", "bc", "ab", "c", "b", "a"])
    base = hc.toy.random_model(T, TOK, seed=5)
    r = hc.toy.relabeled(base, D, hc.LongestMatchTokenizer(D))
    p, q = base.next_probs((3,)), r.next_probs((2,))
    assert all(q[D.id_of(s)] == p[T.id_of(s)] for s in T.tokens) and q[D.eos_id] == p[T.eos_id]
