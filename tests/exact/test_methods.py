"""SLEM, TLI, SLRS and multi-token SLRS (and the SD/AR baselines): exact law == target law.

Each property runs on 200 generated worlds in the fast tier (derandomized, so the same 200 every
run) plus the pinned nasty worlds of ``pinned.NASTY``; the slow tier runs 300 more with a
longer lookahead (3). Equality is of Fractions: no tolerance.
"""

from collections.abc import Callable
from fractions import Fraction

import pytest
from hypothesis import example, given, settings

import hsd_core as hc
from hsd_core.acceptance import closed_form_acceptance, union_acceptance
from hsd_core.exact import analyze, assert_laws_equal, output_law, target_law
from hsd_core.methods import AR, SD, SLEM, SLRS, TLI, Method, State
from hsd_core.strategies import World, worlds

from pinned import NASTY, world

TAU = Fraction(1, 6)

METHODS: dict[str, Callable[[bool], Method]] = {
    "SLEM": lambda g: SLEM(lookahead=2, greedy=g),
    "TLI": lambda g: TLI(lookahead=2, greedy=g),
    "SLRS": lambda g: SLRS(lookahead=2, greedy=g),
    "SLRS-multi": lambda g: SLRS(lookahead=2, max_tokens=None, greedy=g),
    # the bounded procedures (proofs/slrs_bounded.md): lookahead 3 so that both stops bind
    "SLRS-bounded": lambda g: SLRS(lookahead=3, min_path_prob=TAU, proposal_map="longest_prefix", greedy=g),
    "SLRS-bounded-multi": lambda g: SLRS(lookahead=3, min_path_prob=TAU, max_tokens=None,
                                         proposal_map="longest_prefix", greedy=g),
}

SLOW_ONLY: dict[str, Callable[[bool], Method]] = {
    "SLRS-tau-retokenize": lambda g: SLRS(lookahead=3, min_path_prob=TAU, greedy=g),
}


def with_nasty_examples(f: Callable[..., None]) -> Callable[..., None]:
    for name in NASTY:
        f = example(w=world(name))(f)
    return f


def check(method: Method, w: World, max_new_tokens: int) -> None:
    law = output_law(method, w.target, w.drafter, w.prompt, max_new_tokens)
    ref = target_law(w.target, w.prompt, max_new_tokens, greedy=method.greedy)
    assert all(isinstance(p, Fraction) for p in law.values())
    assert_laws_equal(law, ref, what=f"{method!r} on {w!r}")


@pytest.mark.parametrize("name", list(METHODS))
def test_lossless(name: str) -> None:
    @settings(max_examples=200)
    @given(w=worlds())
    @with_nasty_examples
    def prop(w: World) -> None:
        check(METHODS[name](False), w, 3)

    prop()


@pytest.mark.parametrize("name", list(METHODS))
def test_greedy_emits_the_targets_greedy_tokens(name: str) -> None:
    @settings(max_examples=200)
    @given(w=worlds())
    @with_nasty_examples
    def prop(w: World) -> None:
        check(METHODS[name](True), w, 4)

    prop()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(METHODS) + list(SLOW_ONLY))
def test_lossless_slow(name: str) -> None:
    @settings(max_examples=300)
    @given(w=worlds())
    @with_nasty_examples
    def prop(w: World) -> None:
        m = {"SLEM": SLEM(3), "TLI": TLI(3), "SLRS": SLRS(3), "SLRS-multi": SLRS(3, max_tokens=None),
             "SLRS-bounded": SLRS(4, min_path_prob=Fraction(1, 10), proposal_map="longest_prefix"),
             "SLRS-bounded-multi": SLRS(4, max_tokens=None, min_path_prob=Fraction(1, 10),
                                        proposal_map="longest_prefix"),
             "SLRS-tau-retokenize": SLRS(3, min_path_prob=TAU)}[name]
        check(m, w, 3)

    prop()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLOW_ONLY))
def test_slow_only_settings_greedy(name: str) -> None:
    @settings(max_examples=200)
    @given(w=worlds())
    @with_nasty_examples
    def prop(w: World) -> None:
        check(SLOW_ONLY[name](True), w, 4)
        check(SLOW_ONLY[name](False), w, 3)

    prop()


@settings(max_examples=200)
@given(w=worlds(same_vocab=True))
def test_sd_and_ar_lossless(w: World) -> None:
    for m in (SD(lookahead=2), SD(lookahead=3), SD(lookahead=2, greedy=True), AR(), AR(greedy=True)):
        check(m, w, 3)


@settings(max_examples=150)
@given(w=worlds())
@with_nasty_examples
def test_enumerated_acceptance_equals_closed_forms(w: World) -> None:
    """First-position acceptance from the enumerated round == the paper's closed form, and the
    orderings TLI >= union, SLRS >= SLEM (same proposal psi) hold on every world."""
    state = State(w.prompt, (), 2)
    got = {}
    for m in (SLEM(2), TLI(2), SLRS(2)):
        a = analyze(m, w.target, w.drafter, w.prompt, 2)
        cf = closed_form_acceptance(m, w.target, w.drafter, state)
        assert a.first_acceptance == cf, m
        got[m.name] = cf
    assert got["TLI"] >= union_acceptance(w.target, w.drafter, state)
    assert got["SLRS"] >= got["SLEM"]


@settings(max_examples=50)
@given(w=worlds(mixed_alphabets=True))
def test_closed_forms_when_the_alphabets_differ(w: World) -> None:
    """SLEM's and SLRS's closed forms where some drafted texts propose nothing: SLEM's first-candidate
    law is then a sub-probability, and SLRS's acceptance is the probability of a proposal times
    sum_t min(p, psi) with psi the law given one."""
    state = State(w.prompt, (), 2)
    for m in (SLEM(2), SLRS(2), SLRS(3, min_path_prob=TAU, proposal_map="longest_prefix")):
        a = analyze(m, w.target, w.drafter, w.prompt, 2)
        assert a.first_acceptance == closed_form_acceptance(m, w.target, w.drafter, state), m


@settings(max_examples=100)
@given(w=worlds(same_vocab=True))
def test_sd_acceptance_closed_form(w: World) -> None:
    a = analyze(SD(2), w.target, w.drafter, w.prompt, 2)
    assert a.first_acceptance == closed_form_acceptance(SD(2), w.target, w.drafter, State(w.prompt, (), 2))


def test_drafter_equal_to_target_accepts_everything_for_tli_and_slrs() -> None:
    """Relabeled drafter: TLI and SLRS accept the first proposal with probability 1; SLEM does not."""
    w = world("drafter_is_target")
    st = State(w.prompt, (), 2)
    assert closed_form_acceptance(TLI(2), w.target, w.drafter, st) == 1
    assert analyze(TLI(2), w.target, w.drafter, w.prompt, 2).first_acceptance == 1
    assert analyze(SLEM(2), w.target, w.drafter, w.prompt, 2).first_acceptance < 1


def test_tli_with_no_mass_on_intersection_is_plain_decoding() -> None:
    w = world("mass_outside")
    a = analyze(TLI(3), w.target, w.drafter, w.prompt, 3)
    assert a.tokens_per_call == 1 and a.law == target_law(w.target, w.prompt, 3)


def test_slrs_psi_counts_shared_prefixes() -> None:
    w = world("prefix_tokens")
    pl = SLRS(3).psi(w.target, w.drafter, State(w.prompt, (), 3))
    assert sum(pl.law.values()) == 1
    assert 1 <= pl.evaluations < pl.naive_evaluations


def test_tli_needs_the_targets_alphabet_in_the_drafter() -> None:
    """TLI re-syncs the target's text into the drafter, so every target character must be a drafter
    token; SLEM and SLRS run whatever the two alphabets (below)."""
    T = hc.Vocabulary(["a", "b", "c"])
    D = hc.Vocabulary(["a", "b"])
    t = hc.toy.random_model(T, hc.LongestMatchTokenizer(T), 0)
    d = hc.toy.random_model(D, hc.LongestMatchTokenizer(D), 0)
    with pytest.raises(ValueError, match="lacks target characters"):
        output_law(TLI(), t, d, "a", 2)
    for a, b in ((t, d), (d, t)):  # the drafter lacks "c"; the target lacks "c"
        for m in (SLEM(), SLRS(), SLRS(2, proposal_map="longest_prefix", min_path_prob=TAU)):
            assert_laws_equal(output_law(m, a, b, "a", 2), target_law(a, "a", 2), what=repr(m))


MIXED = {name: f for name, f in METHODS.items() if name != "TLI"}
"""The string-level methods, which run whatever the two alphabets: a drafted text the target cannot
encode proposes nothing, and the drafter's context leaves out what it cannot encode."""


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MIXED))
def test_lossless_when_the_alphabets_differ_slow(name: str) -> None:
    """Exact law == target law on 300 worlds whose drafter alphabet differs from the target's, per
    method (the fast tier's check is tests/proofs/test_lemmas.py::test_string_methods_lossless_when_alphabets_differ)."""
    @settings(max_examples=300)
    @given(w=worlds(mixed_alphabets=True))
    def prop(w: World) -> None:
        check(MIXED[name](False), w, 3)
        check(MIXED[name](True), w, 4)

    prop()


def test_slrs_settings_are_part_of_the_psi_cache() -> None:
    w = world("prefix_tokens")
    s = SLRS(lookahead=2)
    check(s, w, 2)
    s.lookahead = 1
    check(s, w, 2)


@settings(max_examples=100)
@given(w=worlds())
@with_nasty_examples
def test_bounded_slrs_acceptance_closed_form(w: World) -> None:
    """Bounded SLRS (proofs/slrs_bounded.md): first-position acceptance of the enumerated round ==
    sum_t min(p(t), psi(t)) with psi the first-token law of the bounded procedure, for both maps."""
    state = State(w.prompt, (), 2)
    for m in (SLRS(3, min_path_prob=TAU, proposal_map="longest_prefix"), SLRS(3, min_path_prob=TAU),
              SLRS(2, proposal_map="longest_prefix")):
        a = analyze(m, w.target, w.drafter, w.prompt, 2)
        assert a.first_acceptance == closed_form_acceptance(m, w.target, w.drafter, state), m


@settings(max_examples=100)
@given(w=worlds())
@with_nasty_examples
def test_bounded_slrs_psi_cost_bound(w: World) -> None:
    """psi of the bounded procedure evaluates at most 1 + (k - 1) / tau <= k / tau drafter
    contexts, each of path probability >= tau, for both maps, one- and multi-token."""
    state = State(w.prompt, (), 3)
    for k, tau in ((3, Fraction(1, 4)), (5, Fraction(1, 3)), (4, Fraction(1, 8))):
        for kw in ({"proposal_map": "longest_prefix"}, {"proposal_map": "longest_prefix", "max_tokens": None}, {}):
            pl = SLRS(k, min_path_prob=tau, **kw).psi(w.target, w.drafter, state)  # type: ignore[arg-type]
            assert sum(pl.law.values()) == 1
            assert pl.evaluations <= 1 + (k - 1) / tau <= k / tau


def test_bounded_slrs_cost_on_the_builtin_world() -> None:
    """On the built-in world the bound holds as the lookahead grows, while the unbounded
    procedure's count grows about 7x per step (docs/slrs.md, bench/slrs_cost.py)."""
    from hsd_core.worlds import builtin_world

    w = builtin_world()
    state = State(w.prompt, (), 3)
    tau = Fraction(1, 20)
    for k in (2, 4, 8, 12):
        for m in (SLRS(k, min_path_prob=tau, proposal_map="longest_prefix"), SLRS(k, min_path_prob=tau),
                  SLRS(k, min_path_prob=tau, max_tokens=None, proposal_map="longest_prefix")):
            assert m.psi(w.target, w.drafter, state).evaluations <= 1 + (k - 1) / tau
    assert SLRS(3).psi(w.target, w.drafter, state).evaluations == 43


def test_bounded_slrs_arguments() -> None:
    assert not SLRS(2).bounded and not SLRS(2, min_path_prob=0).bounded
    assert SLRS(2, min_path_prob=0).min_path_prob is None
    assert SLRS(2, min_path_prob=0.5).bounded and SLRS(2, proposal_map="longest_prefix").bounded
    for bad in (-0.1, 1.5, True, "0.1"):
        with pytest.raises(ValueError, match="min_path_prob"):
            SLRS(2, min_path_prob=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="proposal_map"):
        SLRS(2, proposal_map="bpe")
