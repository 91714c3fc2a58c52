"""Token trees (``hsd_core.methods.tree``): exact law == target law, closed forms, shapes, variants.

Exact enumeration of a tree round grows fast with the tree and the vocabulary, so the fast tier
runs on small worlds (alphabet "ab", at most 2 extra tokens: 3-5 ids with EOS) with trees of at
most 3 nodes (6 in one test, on worlds of 3-4 ids) and ``max_new_tokens`` 2 or 3 (sampling) or 4
(greedy: one tree per round); each property runs 10-60 generated worlds, derandomized (about 70 s
in all on the 2-core machine). The slow tier runs the pinned nasty worlds of ``pinned.NASTY``
(alphabet "abc", up to 7 ids), generated abc worlds and larger trees.
Equality is of Fractions: no tolerance.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, find, given, settings

from hsd_core import variants
from hsd_core.acceptance import closed_form_acceptance, tree_expected
from hsd_core.audit import audit_sampler, min_num_samples_for_law
from hsd_core.exact import (LossyError, analyze, assert_laws_equal, first_difference, output_law, round_law,
                            target_law, total_variation)
from hsd_core.laws import Law
from hsd_core.methods import SD, SLEM, SLRS, TLI, Dynamic, Method, SDTree, SLEMTree, State, Static, TLITree
from hsd_core.methods.base import HeterogeneousMethod, RoundOutcome
from hsd_core.methods.tree import TokenTree, TreeVerifier, draft_tree, trie
from hsd_core.models import Model
from hsd_core.rand import NumpyRand, Rand, UniformRand
from hsd_core.strategies import World, worlds
from hsd_core.worlds import from_spec

from pinned import NASTY, world

SMALL = dict(alphabet="ab", max_extra=2)
"""Generated worlds small enough to enumerate tree rounds in the fast tier."""

SAMPLED: dict[str, Callable[[bool], Method]] = {
    "SLEM-tree": lambda g: SLEMTree(Static((2, 1)), greedy=g),
    "SLEM-tree-iid": lambda g: SLEMTree(Static((2, 1)), greedy=g, draws="iid"),
    "SLEM-tree-dynamic": lambda g: SLEMTree(Dynamic(budget=3, width=2, depth=2), greedy=g),
    "TLI-tree": lambda g: TLITree(Static((2, 1)), greedy=g),
    "TLI-tree-iid": lambda g: TLITree(Static((2, 1)), greedy=g, draws="iid"),
    "TLI-tree-wide": lambda g: TLITree(Static((3,)), greedy=g),
    "TLI-tree-wide-iid": lambda g: TLITree(Static((3,)), greedy=g, draws="iid"),
    "TLI-tree-match": lambda g: TLITree(Static((2, 1)), greedy=g, verification="match"),
    "TLI-tree-dynamic": lambda g: TLITree(Dynamic(budget=3, width=2, depth=2), greedy=g),
    "TLI-tree-dynamic-iid": lambda g: TLITree(Dynamic(budget=3, width=2, depth=2), greedy=g, draws="iid"),
}
"""The heterogeneous tree methods in every shape, draw and verification; ``SD_SAMPLED`` the SD-trees."""

SD_SAMPLED: dict[str, Callable[[bool], Method]] = {
    "SD-tree": lambda g: SDTree(Static((2, 1)), greedy=g),
    "SD-tree-iid": lambda g: SDTree(Static((2, 1)), greedy=g, draws="iid"),
    "SD-tree-match": lambda g: SDTree(Static((2, 1)), greedy=g, verification="match"),
    "SD-tree-dynamic": lambda g: SDTree(Dynamic(budget=3, width=2, depth=2), greedy=g),
}

GREEDY: dict[str, Callable[[], Method]] = {
    "SLEM-tree": lambda: SLEMTree(Static((3, 2, 1)), greedy=True),
    "SLEM-tree-dynamic": lambda: SLEMTree(Dynamic(budget=6, width=3, depth=3), greedy=True),
    "TLI-tree": lambda: TLITree(Static((3, 2, 1)), greedy=True),
    "TLI-tree-dynamic": lambda: TLITree(Dynamic(budget=6, width=3, depth=3), greedy=True),
}

CONFIDENT: dict[str, Callable[[bool], Method]] = {
    "SLEM": lambda g: SLEM(3, greedy=g, min_confidence=Fraction(2, 5)),
    "TLI": lambda g: TLI(3, greedy=g, min_confidence=Fraction(2, 5)),
}
"""The dynamic draft length of the single-path methods (stop before a draft of confidence < 2/5)."""


def with_nasty_examples(f: Callable[..., None]) -> Callable[..., None]:
    for name in NASTY:
        f = example(w=world(name))(f)
    return f


def check(method: Method, w: World, max_new_tokens: int) -> None:
    law = output_law(method, w.target, w.drafter, w.prompt, max_new_tokens)
    ref = target_law(w.target, w.prompt, max_new_tokens, greedy=method.greedy)
    assert all(isinstance(p, Fraction) for p in law.values())
    assert_laws_equal(law, ref, what=f"{method!r} on {w!r}")


# --- losslessness -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SAMPLED))
def test_tree_lossless(name: str) -> None:
    """Sampled tree methods: exact law == target law on 30 small worlds, max_new_tokens 2."""
    @settings(max_examples=30)
    @given(w=worlds(**SMALL))  # type: ignore[arg-type]
    def prop(w: World) -> None:
        check(SAMPLED[name](False), w, 2)

    prop()


@pytest.mark.parametrize("name", list(SD_SAMPLED))
def test_sd_tree_lossless(name: str) -> None:
    """SD-trees (one vocabulary): exact law == target law on 30 small worlds, max_new_tokens 2."""
    @settings(max_examples=30)
    @given(w=worlds(same_vocab=True, **SMALL))  # type: ignore[arg-type]
    def prop(w: World) -> None:
        check(SD_SAMPLED[name](False), w, 2)

    prop()


def test_tree_lossless_three_tokens() -> None:
    """Trees of depth 3 (a budget of 3): RRS with distinct and iid draws and SLEM-tree, on 15 small
    worlds, max_new_tokens 3."""
    @settings(max_examples=10)
    @given(w=worlds(alphabet="ab", max_extra=1))
    def prop(w: World) -> None:
        for m in (TLITree(Static((2, 1, 1))), TLITree(Static((2, 1, 1)), draws="iid"), SLEMTree(Static((1, 2, 1)))):
            check(m, w, 3)

    prop()


@pytest.mark.parametrize("name", list(GREEDY))
def test_greedy_tree_emits_the_targets_greedy_tokens(name: str) -> None:
    """Greedy trees of up to 6 nodes on 60 generated worlds (alphabet abc) and the nasty ones,
    max_new_tokens 4: the one sequence of the target's argmaxes."""
    @settings(max_examples=60)
    @given(w=worlds())
    @with_nasty_examples
    def prop(w: World) -> None:
        check(GREEDY[name](), w, 4)

    prop()


@settings(max_examples=60)
@given(w=worlds(same_vocab=True))
def test_greedy_sd_tree_emits_the_targets_greedy_tokens(w: World) -> None:
    for m in (SDTree(Static((3, 2, 1)), greedy=True), SDTree(Dynamic(6, 3, 3), greedy=True)):
        check(m, w, 4)


@pytest.mark.parametrize("name", list(SAMPLED))
def test_greedy_flag_on_every_sampled_configuration(name: str) -> None:
    """The same configurations as test_tree_lossless with greedy=True (30 worlds, max_new_tokens 3)."""
    @settings(max_examples=30)
    @given(w=worlds(**SMALL))  # type: ignore[arg-type]
    def prop(w: World) -> None:
        check(SAMPLED[name](True), w, 3)

    prop()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SAMPLED))
def test_tree_lossless_slow(name: str) -> None:
    """The nasty worlds (alphabet abc, up to 7 ids) and 50 generated abc worlds of at most one extra
    token, max_new_tokens 2 (a few minutes per configuration)."""
    @settings(max_examples=50)
    @given(w=worlds(max_extra=1))
    @with_nasty_examples
    def prop(w: World) -> None:
        check(SAMPLED[name](False), w, 2)

    prop()


@pytest.mark.slow
def test_tree_lossless_larger_trees_slow() -> None:
    """Trees of 4-6 nodes, max_new_tokens 3, 12 worlds of 3-4 ids (alphabet ab, one extra token at most:
    one such world takes up to 20 s for the five methods on the 2-core machine)."""
    @settings(max_examples=12)
    @given(w=worlds(alphabet="ab", max_extra=1))
    def prop(w: World) -> None:
        for m in (TLITree(Static((2, 2, 1))), TLITree(Static((3, 1, 1)), draws="iid"),
                  TLITree(Dynamic(5, 2, 3)), SLEMTree(Static((2, 1, 1))), SLEMTree(Dynamic(4, 2, 3))):
            check(m, w, 3)

    prop()


@pytest.mark.slow
@settings(max_examples=60)
@given(w=worlds(same_vocab=True, max_extra=1))
def test_sd_tree_lossless_slow(w: World) -> None:
    """The SD-trees on 60 abc worlds of at most one extra token (max_new_tokens 2; the dynamic one 3)."""
    for name in SD_SAMPLED:
        check(SD_SAMPLED[name](False), w, 3 if name == "SD-tree-dynamic" else 2)


@pytest.mark.parametrize("name", list(CONFIDENT))
def test_dynamic_draft_length_lossless(name: str) -> None:
    """The single-path methods with a confidence stop: exact law == target law (sampling, max_new_tokens
    3; greedy, 4) on 60 generated worlds and the nasty ones."""
    @settings(max_examples=60)
    @given(w=worlds())
    @with_nasty_examples
    def prop(w: World) -> None:
        check(CONFIDENT[name](False), w, 3)
        check(CONFIDENT[name](True), w, 4)

    prop()


@settings(max_examples=60)
@given(w=worlds(same_vocab=True))
def test_dynamic_draft_length_sd_lossless(w: World) -> None:
    check(SD(3, min_confidence=Fraction(2, 5)), w, 3)
    check(SD(3, greedy=True, min_confidence=Fraction(2, 5)), w, 4)


def test_dynamic_draft_length_stops_drafting() -> None:
    """The confidence stop binds: at confidence 1 no round of a world without one-hot laws proposes
    more than its first draft (TLI; SLEM's one draft may still give several candidates), while
    without it the same rounds propose up to the lookahead; the expected proposals per round fall."""
    w = world("prefix_tokens")
    state = State(w.prompt, (), 3)
    for m_cls in (TLI, SLEM):
        capped = round_law(m_cls(3, min_confidence=1), w.target, w.drafter, state)  # type: ignore[operator]
        free = round_law(m_cls(3), w.target, w.drafter, state)  # type: ignore[operator]
        assert max(o.proposed for o in free) >= 2
        if m_cls is TLI:
            assert max(o.proposed for o in capped) == 1
        mean = [sum(o.proposed * p for o, p in law.items()) for law in (capped, free)]
        assert mean[0] < mean[1]


def test_dynamic_draft_length_closed_form() -> None:
    """SLEM's first-candidate closed form follows its confidence stop (acceptance.first_candidate_law)."""
    @settings(max_examples=40)
    @given(w=worlds())
    def prop(w: World) -> None:
        m = SLEM(3, min_confidence=Fraction(2, 5))
        a = analyze(m, w.target, w.drafter, w.prompt, 2)
        assert a.first_acceptance == closed_form_acceptance(m, w.target, w.drafter, State(w.prompt, (), 2))

    prop()


# --- what a tree is, and its shapes -------------------------------------------------------------

def _enumerated_trees(method: Method, w: World, budget: int) -> dict[TokenTree, object]:
    from hsd_core.rand import Enumerator

    return Enumerator().law(lambda rand: method.draft(w.target, w.drafter, State(w.prompt, (), budget), rand))  # type: ignore[attr-defined]


def test_tree_invariants() -> None:
    """Every enumerated tree is a flat list with parents before children, depths = parent's + 1, at
    most the budget deep, sizes within the shape (static: at most the product of the widths per
    depth; dynamic: at most the budget), no children under EOS, each law a law; distinct draws never
    repeat a sibling's token, and their recorded law is zero on the earlier siblings."""
    @settings(max_examples=25)
    @given(w=worlds(**SMALL))  # type: ignore[arg-type]
    def prop(w: World) -> None:
        eos = w.target.vocab.eos_id
        for m, cap in ((TLITree(Static((2, 2))), 6), (TLITree(Static((2, 2)), draws="iid"), 6),
                       (TLITree(Dynamic(3, 2, 3)), 3), (TLITree(Static((2, 2)), greedy=True), 6)):
            for budget in (1, 2):
                for tree in _enumerated_trees(m, w, budget):
                    assert tree.tokens[0] == tree.parents[0] == -1 and tree.depths[0] == 0
                    assert tree.size <= (cap if budget == 2 else 2)
                    for c in range(1, len(tree.tokens)):
                        par = tree.parents[c]
                        assert 0 <= par < c and tree.depths[c] == tree.depths[par] + 1 <= budget
                        assert par == 0 or tree.tokens[par] != eos
                        q = tree.laws[c]
                        assert q is not None and sum(q) == 1 and q[tree.tokens[c]] > 0
                    for v in range(len(tree.tokens)):
                        kids = tree.children(v)
                        toks = [tree.tokens[c] for c in kids]
                        if m.draws == "distinct" or m.greedy:
                            assert len(set(toks)) == len(toks)
                            for i, c in enumerate(kids):
                                assert all(tree.laws[c][t] == 0 for t in toks[:i])  # type: ignore[index]

    prop()


def test_static_width_one_is_the_single_path() -> None:
    """SD-tree of widths (1, 1) with RRS is SD with lookahead 2, round for round: the same law of
    round outcomes (emitted ids, proposed, accepted) on 40 worlds; greedy too."""
    @settings(max_examples=40)
    @given(w=worlds(same_vocab=True))
    def prop(w: World) -> None:
        for budget in (1, 2, 3):
            st = State(w.prompt, (), budget)
            for g in (False, True):
                tree_law = round_law(SDTree(Static((1, 1)), greedy=g), w.target, w.drafter, st)
                path_law = round_law(SD(2, greedy=g), w.target, w.drafter, st)
                assert tree_law == path_law

    prop()


def test_dynamic_expands_the_most_likely_node() -> None:
    """A dynamic greedy tree on a hand-made law: the root gets the two most likely tokens, then the
    node of highest path probability is expanded first, until the budget."""
    laws: dict[tuple[int, ...], Law] = {
        (): (Fraction(6, 10), Fraction(3, 10), Fraction(1, 10)),
        (0,): (Fraction(1, 10), Fraction(1, 10), Fraction(8, 10)),
        (1,): (Fraction(9, 10), Fraction(1, 10), Fraction(0)),
        (0, 2): (Fraction(1, 2), Fraction(1, 2), Fraction(0)),
    }
    tree = draft_tree(lambda path: laws.get(path, laws[()]), Dynamic(budget=5, width=2, depth=3),
                      NumpyRand(0), True, "distinct", eos_id=99, max_depth=3)
    # root -> 0 (.6), 1 (.3); expand 0 -> 2 (.48), 0 (.06); expand (0,2) [.48] -> 0 (.24): budget 5
    assert tree.tokens == (-1, 0, 1, 2, 0, 0)
    assert tree.parents == (-1, 0, 0, 1, 1, 3)
    assert tree.depths == (0, 1, 1, 2, 2, 3)
    static = draft_tree(lambda path: laws.get(path, laws[()]), Static((2, 1)), NumpyRand(0), True, "distinct",
                        eos_id=99, max_depth=3)
    assert static.tokens == (-1, 0, 1, 2, 0) and static.parents == (-1, 0, 0, 1, 2)


def test_trie_of_candidates() -> None:
    t = trie([(1, 2, 3), (1, 2, 4), (5,), (1, 2)], max_depth=2)
    assert t.tokens == (-1, 1, 2, 5) and t.parents == (-1, 0, 1, 0)
    assert t.leaves() == [2, 3] and t.path(2) == (1, 2)


def test_shape_and_option_errors() -> None:
    with pytest.raises(ValueError, match="widths"):
        Static(())
    with pytest.raises(ValueError, match="every width"):
        Static((2, 0))
    with pytest.raises(ValueError, match="budget"):
        Dynamic(0, 2, 2)
    with pytest.raises(TypeError, match="shape must be"):
        TLITree((2, 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="draws"):
        SLEMTree(draws="with")
    with pytest.raises(ValueError, match="verification"):
        SDTree(verification="exact")
    with pytest.raises(ValueError, match="min_confidence"):
        TLI(min_confidence=0)
    with pytest.raises(TypeError, match="min_confidence"):
        SLEM(min_confidence="0.5")  # type: ignore[arg-type]
    w = world("prefix_tokens")
    with pytest.raises(ValueError, match="share one vocabulary"):
        SDTree().generate(w.target, w.drafter, w.prompt, 3, rng=0)


# --- expected tokens per round: closed form against the enumerated rounds -----------------------

def _enumerated_means(method: Method, w: World, state: State) -> tuple[object, object]:
    law = round_law(method, w.target, w.drafter, state)
    return (sum(o.accepted * p for o, p in law.items()), sum(len(o.tokens) * p for o, p in law.items()))


@pytest.mark.parametrize("name", list(SAMPLED))
def test_tree_expected_tokens_closed_form(name: str) -> None:
    """E[accepted] and E[tokens] of the first round, from the enumerated round law, equal the closed
    form (sum over nodes of path acceptance probabilities, averaged over the exact tree law), budgets
    1 and 2, on 25 small worlds, sampling and greedy."""
    @settings(max_examples=25)
    @given(w=worlds(**SMALL))  # type: ignore[arg-type]
    def prop(w: World) -> None:
        for g in (False, True):
            m = SAMPLED[name](g)
            for budget in (1, 2):
                st = State(w.prompt, (), budget)
                assert _enumerated_means(m, w, st) == tree_expected(m, w.target, w.drafter, st)  # type: ignore[arg-type]

    prop()


def test_sd_tree_expected_tokens_closed_form() -> None:
    @settings(max_examples=25)
    @given(w=worlds(same_vocab=True, **SMALL))  # type: ignore[arg-type]
    def prop(w: World) -> None:
        for name, mk in SD_SAMPLED.items():
            m = mk(False)
            st = State(w.prompt, (), 2)
            assert _enumerated_means(m, w, st) == tree_expected(m, w.target, w.drafter, st)  # type: ignore[arg-type]

    prop()


def test_greedy_static_tree_is_a_sum_over_nodes() -> None:
    """A greedy static tree is one tree: E[accepted] is the number of nodes on the target's greedy
    path that the tree holds, an integer, equal to the enumerated one."""
    @settings(max_examples=40)
    @given(w=worlds())
    def prop(w: World) -> None:
        m = TLITree(Static((3, 2, 1)), greedy=True)
        st = State(w.prompt, (), 3)
        acc, tok = tree_expected(m, w.target, w.drafter, st)
        assert acc == int(acc) and (acc, tok) == _enumerated_means(m, w, st)

    prop()


def test_wider_tree_accepts_at_least_as_much() -> None:
    """Adding a second branch under the root (widths (1, 1) -> (2, 1)) never lowers the expected
    accepted length, for RRS and for exact match: the first branch has the same law in both trees and
    keeps its reach probabilities (RRS tries it first; exact match descends into the first child with
    the drawn token), and the new nodes add non-negative reach. Checked exactly on 25 small worlds."""
    @settings(max_examples=25)
    @given(w=worlds(**SMALL))  # type: ignore[arg-type]
    def prop(w: World) -> None:
        st = State(w.prompt, (), 2)
        for verification in ("rrs", "match"):
            wide = tree_expected(TLITree(Static((2, 1)), verification=verification), w.target, w.drafter, st)[0]
            narrow = tree_expected(TLITree(Static((1, 1)), verification=verification), w.target, w.drafter, st)[0]
            assert wide >= narrow

    prop()


# --- randomness: the sampled code is the enumerated code ---------------------------------------

def test_uniform_replay_equals_numpy_sampling() -> None:
    """Every tree method consumes uniforms only through Rand: NumpyRand(seed) and UniformRand fed the
    same generator's uniforms emit the same ids, 20 seeds each."""
    w = world("prefix_tokens")
    same = from_spec({"target": {"tokens": ["a", "b", "c"], "random": 0}, "drafter": {"random": 1}})
    for mk in list(SAMPLED.values()) + list(SD_SAMPLED.values()):
        m = mk(False)
        t, d, prompt = (same if isinstance(m, SDTree) else (w.target, w.drafter, w.prompt))
        for seed in range(20):
            g = np.random.default_rng(seed)
            replay = UniformRand(float(g.random()) for _ in range(10_000))
            assert m.generate(t, d, prompt, 6, rng=seed) == m.generate(t, d, prompt, 6, rng=replay)


def test_sampled_tree_methods_pass_a_sized_audit() -> None:
    """The samplers (``generate``) of three tree methods against the target law on a pinned world
    (max_new_tokens 2): alpha 1e-6 family-wise, power 0.99, N sized by the audit to detect TV 0.08
    (min_num_samples_for_law), fixed seeds. A lossless sampler passes with probability >= 1 - 1e-6."""
    spec = variants.TREE_PINNED["tli_tree_stale_residual"]
    target, drafter, prompt = from_spec(spec)
    ref = target_law(target, prompt, 2)
    n = min_num_samples_for_law(ref, 0.08, 1e-6 / 5, 0.99)
    assert n <= 6000
    for m in (TLITree(Static((2, 1))), TLITree(Dynamic(3, 2, 2), draws="iid"), SLEMTree(Static((2, 1)))):
        rng = np.random.default_rng(zlib.crc32(repr(m).encode()))
        rep = audit_sampler(lambda: m.generate(target, drafter, prompt, 2, rng), ref, n=n, alpha=1e-6, eps=0.08)
        assert rep.verdict == "lossless-consistent", rep.to_markdown()


# --- lossy tree variants ------------------------------------------------------------------------

F = Fraction

RECORDED_TREE_TV = {
    "tli_tree_stale_residual": F(183, 1280),
    "tli_tree_distinct_iid_residual": F(12, 35),
    "sd_tree_match_any_node_at_depth": F(9875, 121121),
    "tli_tree_peeks_at_target": F(7, 15),
}


def _pinned(name: str) -> tuple[Model, Model, str, int]:
    spec = variants.TREE_PINNED[name]
    t, d, prompt = from_spec(spec)
    return t, d, prompt, int(spec["max_new_tokens"])


def test_every_tree_variant_is_pinned() -> None:
    assert set(variants.TREE_VARIANTS) == set(variants.TREE_PINNED) == set(RECORDED_TREE_TV)
    assert not set(variants.TREE_VARIANTS) & set(variants.VARIANTS)


@pytest.mark.parametrize("name", sorted(variants.TREE_VARIANTS))
def test_tree_variant_is_lossy_on_its_pinned_world(name: str) -> None:
    """Each lossy tree variant: the exact engine finds it lossy on its pinned world, by the recorded
    TV; the correct method of the same configuration is exact there."""
    t, d, prompt, n = _pinned(name)
    bad = variants.TREE_VARIANTS[name]()
    law = output_law(bad, t, d, prompt, n)
    ref = target_law(t, prompt, n)
    tv = total_variation(law, ref)
    assert tv > 0 and first_difference(law, ref) is not None
    with pytest.raises(LossyError, match="first differing sequence"):
        assert_laws_equal(law, ref, what=name)
    assert tv == RECORDED_TREE_TV[name], f"{name}: TV {tv} = {float(tv):.5f}"
    honest = type(bad).__mro__[1]()  # the correct class the variant derives from, same shape below
    honest.__dict__.update(bad.__dict__)
    assert output_law(honest, t, d, prompt, n) == ref


@pytest.mark.parametrize("name", sorted(variants.TREE_VARIANTS))
def test_tree_variant_rejected_by_audit(name: str) -> None:
    """Each lossy tree variant, sampled with its own ``generate`` on its pinned world, is rejected
    against the target law: alpha 1e-6 (family-wise), power 0.99, N = min_num_samples_for_law(ref,
    TV, 1e-6 / m) with TV its exact distance (m = 3 joint tests + one per position); TVs 0.08-0.47,
    N <= 20,000."""
    t, d, prompt, n_tok = _pinned(name)
    ref = target_law(t, prompt, n_tok)
    bad = variants.TREE_VARIANTS[name]()
    tv = float(total_variation(output_law(bad, t, d, prompt, n_tok), ref))
    n = min_num_samples_for_law(ref, tv, 1e-6 / (3 + n_tok), 0.99)
    assert tv > 0.05 and n <= 20_000
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    rep = audit_sampler(lambda: bad.generate(t, d, prompt, n_tok, rng), ref, n=n, alpha=1e-6, eps=tv)
    assert rep.detectable_tv is not None and rep.detectable_tv <= tv + 1e-12
    assert rep.verdict == "lossy", rep.to_markdown()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(variants.TREE_VARIANTS))
def test_hypothesis_rediscovers_each_tree_variant(name: str) -> None:
    same = isinstance(variants.TREE_VARIANTS[name](), SDTree)
    n = int(variants.TREE_PINNED[name]["max_new_tokens"])

    def lossy(w: World) -> bool:
        m = variants.TREE_VARIANTS[name]()
        return output_law(m, w.target, w.drafter, w.prompt, n) != target_law(w.target, w.prompt, n)

    w = find(worlds(same_vocab=same, **SMALL), lossy, settings=settings(max_examples=1000, database=None))  # type: ignore[arg-type]
    assert lossy(w)


# --- what SLRS can take of it -------------------------------------------------------------------

class SLRSSiblings(TreeVerifier, HeterogeneousMethod):
    """``k`` independent runs of SLRS's drafting procedure; each run's proposal (a path of target ids)
    hangs under the root as its own branch, its first id with law psi_1 and each later id with
    psi conditioned on the run's proposed prefix (``SLRS.proposal_laws``); verified by RRS. Repeated
    first ids stay separate siblings (iid draws). A run that proposes nothing adds no branch."""

    name = "SLRS-siblings"

    def __init__(self, k: int, slrs: SLRS) -> None:
        self.k, self.slrs = k, slrs

    def step(self, target: Model, drafter: Model | None, state: State, rand: Rand) -> RoundOutcome:
        assert drafter is not None
        tokens, parents, depths, laws = [-1], [-1], [0], [None]
        for _ in range(self.k):
            prop = self.slrs.propose(target, drafter, state, rand)
            qs = self.slrs.proposal_laws(target, drafter, state, prop) if prop else []
            v = 0
            for t, q in zip(prop, qs):
                tokens.append(t)
                parents.append(v)
                depths.append(depths[v] + 1)
                laws.append(q)  # type: ignore[arg-type]
                v = len(tokens) - 1
        tree = TokenTree(tuple(tokens), tuple(parents), tuple(depths), tuple(laws))  # type: ignore[arg-type]
        return self.verify_rrs(target, state.target_context(target), tree, rand, state.budget)


def test_slrs_takes_iid_sibling_proposals() -> None:
    """What SLRS can take of recursive rejection sampling: k = 2 i.i.d. runs of its procedure (one
    token per run, and multi-token runs whose later ids are verified against psi given the run's
    prefix), RRS with psi as each sibling's law: exact law == target law on 15 small worlds."""
    @settings(max_examples=15)
    @given(w=worlds(**SMALL))  # type: ignore[arg-type]
    def prop(w: World) -> None:
        check(SLRSSiblings(2, SLRS(2)), w, 2)
        check(SLRSSiblings(2, SLRS(2, max_tokens=None)), w, 2)

    prop()
