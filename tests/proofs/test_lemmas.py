"""Executable checks of the lemmas in ``proofs/*.md``, exactly in Fractions (no tolerances).

Each test is named by a ``Check:`` line of a proof; ``python -m proofs`` runs exactly those.
Worlds come from :func:`hsd_core.strategies.worlds` (small: ``max_new_tokens <= 2``,
``lookahead <= 2``); laws and round laws come from the exact engine (:mod:`hsd_core.exact`,
:class:`hsd_core.rand.Enumerator`), so every equality below is an equality of rationals.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hsd_core import exact, variants, worlds
from hsd_core.laws import Law, Prob, argmax, residual
from hsd_core.methods import AR, SD, SLEM, SLRS, TLI, Method, RoundOutcome, State
from hsd_core.methods.base import RejectionVerifier, draft_autoregressive, sample
from hsd_core.acceptance import closed_form_acceptance
from hsd_core.methods.resync import Resync, ResyncMemo, drafter_context_ids
from hsd_core.methods.slem import draft_candidates, retokenize
from hsd_core.methods.slrs import LongestPrefixMap
from hsd_core.methods.tli import drafter_context, intersection
from hsd_core.models import FunctionModel, Model, TableModel, random_model
from hsd_core.rand import Enumerator, Rand
from hsd_core.strategies import World, tokenizers
from hsd_core.strategies import worlds as world_strategy
from hsd_core.tokenizers import LongestMatchTokenizer, Tokenizer
from hsd_core.vocab import Vocabulary

F = Fraction
ZERO = F(0)
FEW = settings(max_examples=30, deadline=None)
SOME = settings(max_examples=80, deadline=None)
MANY = settings(max_examples=200, deadline=None)


# --------------------------------------------------------------------------------------------
# helpers


@st.composite
def laws(draw: st.DrawFn, n: int) -> Law:
    """An exact law on ``n`` ids from integer weights (zeros allowed, never all zero)."""
    w = draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))
    w[draw(st.integers(0, n - 1))] += 1
    t = sum(w)
    return tuple(F(x, t) for x in w)


@st.composite
def law_pairs(draw: st.DrawFn) -> tuple[Law, Law]:
    n = draw(st.integers(2, 5))
    return draw(laws(n)), draw(laws(n))


@st.composite
def states(draw: st.DrawFn, world: World, max_prefix: int = 1, max_budget: int = 2) -> State:
    """A round's start: the world's prompt, a short emitted prefix of target ids (no EOS), a budget."""
    n_ids = len(world.target.vocab) - 1
    emitted = tuple(draw(st.lists(st.integers(0, n_ids - 1), max_size=max_prefix)))
    return State(world.prompt, emitted, len(emitted) + draw(st.integers(1, max_budget)))


def vec(d: Mapping[int, object], n: int) -> Law:
    return tuple(d.get(i, ZERO) for i in range(n))  # type: ignore[misc]


def sum_min(a: Sequence[Prob], b: Sequence[Prob]) -> Prob:
    return sum((min(x, y) for x, y in zip(a, b)), ZERO)


def one_hot(n: int, i: int) -> Law:
    return tuple(F(int(j == i)) for j in range(n))


def chain_defects(rl: Mapping[RoundOutcome, Prob], target: Model, ctx: tuple[int, ...], greedy: bool) -> list[str]:
    """Where a round law fails to be "the target's chain with a stopping rule".

    For every prefix ``y`` of emitted tokens that the round extends, the law of the next token
    given (the round emits ``y`` and goes on) must be ``p(. | ctx + y)`` (greedy: its argmax).
    """
    n = len(target.vocab)
    reach: dict[tuple[int, ...], Prob] = {}
    nxt: dict[tuple[int, ...], list[Prob]] = {}
    for o, w in rl.items():
        for j in range(len(o.tokens)):
            y = o.tokens[:j]
            reach[y] = reach.get(y, ZERO) + w
            nxt.setdefault(y, [ZERO] * n)[o.tokens[j]] += w
    bad = []
    for y, r in reach.items():
        p = target.next_probs(ctx + y)
        want = one_hot(n, argmax(p)) if greedy else p
        got = tuple(x / r for x in nxt[y])
        if got != want:
            bad.append(f"after {y}: round gives {got}, target {want}")
    return bad


def round_shape_defects(rl: Mapping[RoundOutcome, Prob], state: State, eos: int) -> list[str]:
    bad = []
    for o in rl:
        if not 1 <= len(o.tokens) <= state.budget:
            bad.append(f"{o.tokens} has length outside 1..{state.budget}")
        if eos in o.tokens[:-1]:
            bad.append(f"{o.tokens} goes on after EOS")
    if sum(rl.values()) != 1:
        bad.append("round law does not sum to 1")
    return bad


def acceptance(rl: Mapping[RoundOutcome, Prob]) -> Prob:
    """P(the round's first proposal is accepted)."""
    return sum((w for o, w in rl.items() if o.accepted >= 1), ZERO)


def assert_lossless(method: Method, w: World, max_new_tokens: int) -> None:
    law = exact.output_law(method, w.target, w.drafter, w.prompt, max_new_tokens)
    ref = exact.target_law(w.target, w.prompt, max_new_tokens, greedy=method.greedy)
    assert law == ref, exact.first_difference(law, ref)


def const_model(vocab: Vocabulary, law: Sequence[object]) -> FunctionModel:
    return FunctionModel(vocab, LongestMatchTokenizer(vocab), lambda ctx: list(law))


def seeded_weights(key: str, n: int, zero_prob: float = 0.4) -> list[int]:
    r = random.Random(key)
    w = [0 if r.random() < zero_prob else r.randint(1, 4) for _ in range(n)]
    if not any(w):
        w[r.randrange(n)] = 1
    return w


def seeded_categorical(rand: Rand, key: str, n: int, zero_prob: float = 0.4) -> int:
    w = seeded_weights(key, n, zero_prob)
    t = sum(w)
    return rand.categorical([F(x, t) for x in w])


def pinned(name: str) -> tuple[Model, Model, str, Method]:
    t, d, prompt = worlds.from_spec(variants.PINNED[name])
    return t, d, prompt, variants.VARIANTS[name]()


def target_of(p: Law) -> TableModel:
    """A target over ``len(p) - 1`` one-character tokens (plus EOS) whose law is ``p`` everywhere."""
    vocab = Vocabulary(list("abcdefgh"[: len(p) - 1]))
    return TableModel(vocab, LongestMatchTokenizer(vocab), {}, default=list(p))


# --------------------------------------------------------------------------------------------
# proofs/sd.md


@MANY
@given(law_pairs())
def test_rejection_identity(pq: tuple[Law, Law]) -> None:
    """min(p, q) + (1 - sum min(p, q)) * norm(max(p - q, 0)) == p, entry by entry."""
    p, q = pq
    alpha = sum_min(p, q)
    r = residual(p, q)
    if alpha == 1:
        assert p == q
    for t in range(len(p)):
        assert min(p[t], q[t]) + (1 - alpha) * r[t] == p[t]


@MANY
@given(law_pairs())
def test_residual_mass(pq: tuple[Law, Law]) -> None:
    """sum (p - q)^+ == sum (q - p)^+ == 1 - sum min(p, q) == TV(p, q); the residual is a law on {p > q}."""
    p, q = pq
    pos = sum((max(a - b, ZERO) for a, b in zip(p, q)), ZERO)
    neg = sum((max(b - a, ZERO) for a, b in zip(p, q)), ZERO)
    assert pos == neg == 1 - sum_min(p, q)
    r = residual(p, q)
    assert sum(r) == 1 and all(x >= 0 for x in r)
    if pos > 0:
        assert all(r[t] == 0 for t in range(len(p)) if p[t] <= q[t])


@MANY
@given(law_pairs(), st.booleans())
def test_verifier_one_position(pq: tuple[Law, Law], greedy: bool) -> None:
    """The real RejectionVerifier on one draft x ~ q: the emitted token has law p (greedy: argmax),
    and x is accepted with probability sum min(p, q)."""
    p, q = pq
    target = target_of(p)
    v = RejectionVerifier()
    v.greedy = greedy

    def run(rand: Rand) -> RoundOutcome:
        x = rand.categorical(q)
        return v.verify(target, (), [x], [q], rand, budget=1)

    rl = Enumerator().law(run)
    n = len(p)
    law: list[Prob] = [ZERO] * n
    for o, w in rl.items():
        law[o.tokens[0]] += w
    out = tuple(law)
    assert out == (one_hot(n, argmax(p)) if greedy else p)
    if not greedy:
        assert acceptance(rl) == sum_min(p, q)


@st.composite
def hidden_state_proposals(draw: st.DrawFn) -> tuple[Law, list[dict[tuple[int, ...], F]], int]:
    """A proposal law with a hidden drafter state z: z ~ zlaw, then a tuple of target ids of
    length 0..2 from a law that depends on z (any joint law, lengths random)."""
    n = draw(st.integers(2, 4))
    zlaw = draw(laws(2))
    per_z = []
    for _ in range(2):
        tuples: list[tuple[int, ...]] = [()] + [(a,) for a in range(n)] + [(a, b) for a in range(n) for b in range(n)]
        w = draw(st.lists(st.integers(0, 3), min_size=len(tuples), max_size=len(tuples)))
        w[draw(st.integers(0, len(tuples) - 1))] += 1
        t = sum(w)
        per_z.append({s: F(x, t) for s, x in zip(tuples, w) if x})
    return zlaw, per_z, n


def conditional(law: Mapping[tuple[int, ...], Prob], prefix: tuple[int, ...], n: int) -> Law:
    j = len(prefix)
    w: list[Prob] = [ZERO] * n
    for s, pr in law.items():
        if len(s) > j and s[:j] == prefix:
            w[s[j]] += pr
    t = sum(w)
    return tuple(x / t for x in w)


@SOME
@given(hidden_state_proposals(), st.integers(0, 2**16), st.sampled_from(["full_state", "prefix_only"]))
def test_general_proposal_lemma(prop: tuple[Law, list[dict[tuple[int, ...], F]], int], seed: int,
                                info: str) -> None:
    """Any joint proposal law is fine when x_j is verified against its conditional law given
    information that contains the proposed prefix: here the drafter's full state (z, x_<j), or
    the prefix x_<j alone. The round is the target's chain (with bonus and random length)."""
    zlaw, per_z, n = prop
    vocab = Vocabulary(list("abcd"[: n - 1]))
    target = random_model(vocab, LongestMatchTokenizer(vocab), seed, zero_prob=0.3)
    mixed: dict[tuple[int, ...], Prob] = {}
    for z in range(2):
        for s, pr in per_z[z].items():
            mixed[s] = mixed.get(s, ZERO) + zlaw[z] * pr
    tuples = sorted(set(per_z[0]) | set(per_z[1]))

    def run(rand: Rand) -> RoundOutcome:
        z = rand.categorical(zlaw)
        joint = per_z[z]
        s = tuples[rand.categorical([joint.get(x, ZERO) for x in tuples])]
        basis = joint if info == "full_state" else mixed
        qs = [conditional(basis, s[:j], n) for j in range(len(s))]
        return RejectionVerifier().verify(target, (), list(s), qs, rand, budget=3)

    rl = Enumerator().law(run)
    assert chain_defects(rl, target, (), greedy=False) == []


@SOME
@given(st.data(), st.integers(1, 2), st.booleans())
def test_sd_round_is_target_chain(data: st.DataObject, k: int, greedy: bool) -> None:
    """One SD round, from any state: each emitted token has the target's law given the round's
    emitted prefix (first token, accepted drafts, correction, bonus alike)."""
    w = data.draw(world_strategy(same_vocab=True))
    state = data.draw(states(w))
    rl = exact.round_law(SD(lookahead=k, greedy=greedy), w.target, w.drafter, state)
    assert chain_defects(rl, w.target, state.target_context(w.target), greedy) == []


@SOME
@given(world_strategy(same_vocab=True), st.integers(1, 2), st.integers(1, 3))
def test_sd_bonus_when_drafter_is_target(w: World, k: int, budget: int) -> None:
    """Drafter == target: every draft is accepted, and the round emits the k drafts plus the bonus
    (fewer only at EOS or at the budget)."""
    state = State(w.prompt, (), budget)
    drafter = FunctionModel(w.target.vocab, w.target.tokenizer, w.target.next_probs)
    rl = exact.round_law(SD(lookahead=k), w.target, drafter, state)
    eos = w.target.vocab.eos_id
    for o in rl:
        assert o.accepted == o.proposed
        full = min(k + 1, budget)
        assert len(o.tokens) == full or (o.tokens[-1] == eos and len(o.tokens) <= full)
    assert chain_defects(rl, w.target, state.target_context(w.target), False) == []


def all_methods(k: int) -> list[Method]:
    return [AR(), SLEM(lookahead=k), TLI(lookahead=k), SLRS(lookahead=k), SLRS(lookahead=k, max_tokens=None),
            SLEM(lookahead=k, greedy=True), TLI(lookahead=k, greedy=True)]


@FEW
@given(st.data(), st.integers(1, 2))
def test_rounds_respect_eos_and_budget(data: st.DataObject, k: int) -> None:
    """Every round of every method emits 1..budget target ids and nothing after EOS."""
    w = data.draw(world_strategy())
    state = data.draw(states(w))
    for m in all_methods(k):
        rl = exact.round_law(m, w.target, w.drafter, state)
        assert round_shape_defects(rl, state, w.target.vocab.eos_id) == [], m
    ws = data.draw(world_strategy(same_vocab=True))
    state = data.draw(states(ws))
    rl = exact.round_law(SD(lookahead=k), ws.target, ws.drafter, state)
    assert round_shape_defects(rl, state, ws.target.vocab.eos_id) == []


class ChainMethod(Method):
    """Rounds that are target chains with an arbitrary adapted stopping rule: draw tokens from the
    target one by one and, after each, stop with a probability that depends on the state and on
    the tokens drawn so far (seeded, so the round is a function of its state)."""

    name = "chain"

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def check_models(self, target: Model, drafter: Model | None) -> None:
        pass

    def step(self, target: Model, drafter: Model | None, state: State, rand: Rand) -> RoundOutcome:
        ctx = state.target_context(target)
        out: list[int] = []
        while True:
            out.append(sample(target.next_probs(ctx + tuple(out)), rand, False))
            if out[-1] == target.vocab.eos_id or len(out) >= state.budget:
                break
            stop = seeded_weights(f"{self.seed}:{state.emitted}:{out}", 2, zero_prob=0.3)
            if rand.bernoulli(F(stop[0], sum(stop))):
                break
        return RoundOutcome(tuple(out))


@SOME
@given(world_strategy(), st.integers(0, 2**16), st.integers(1, 3))
def test_composition_any_stopping_rule(w: World, seed: int, n: int) -> None:
    """Rounds that are target chains (any stopping rule), composed by the engine over emitted
    prefixes and truncated at EOS / max_new_tokens, give exactly target_law."""
    assert_lossless(ChainMethod(seed), w, n)


@SOME
@given(world_strategy(same_vocab=True), st.integers(1, 2), st.integers(1, 2), st.booleans())
def test_sd_full_law(w: World, k: int, n: int, greedy: bool) -> None:
    """SD's exact output law equals target_law (greedy: the target's greedy sequence)."""
    assert_lossless(SD(lookahead=k, greedy=greedy), w, n)


@pytest.mark.parametrize("name, diff", [
    ("accept_every_draft", ((3,), F(1, 3), F(1, 8))),
    ("residual_from_p", ((3,), F(13, 64), F(1, 8))),
    ("bonus_off_by_one", ((0, 0), F(9, 64), F(3, 40))),
])
def test_sd_variants_counterexamples(name: str, diff: tuple[tuple[int, ...], F, F]) -> None:
    """Each SD hook broken alone is lossy on its pinned world; SD itself is exact there."""
    t, d, prompt, m = pinned(name)
    law = exact.output_law(m, t, d, prompt, variants.PINNED_MAX_NEW_TOKENS)
    ref = exact.target_law(t, prompt, variants.PINNED_MAX_NEW_TOKENS)
    assert exact.first_difference(law, ref) == diff
    assert exact.output_law(SD(lookahead=2), t, d, prompt, variants.PINNED_MAX_NEW_TOKENS) == ref


# --------------------------------------------------------------------------------------------
# proofs/slem.md


@SOME
@given(st.data(), st.integers(1, 2), st.booleans())
def test_slem_round_is_target_chain(data: st.DataObject, k: int, greedy: bool) -> None:
    """One SLEM round: every emitted token is the target's own draw (greedy: argmax) given its own
    emitted ids."""
    w = data.draw(world_strategy())
    state = data.draw(states(w))
    rl = exact.round_law(SLEM(lookahead=k, greedy=greedy), w.target, w.drafter, state)
    assert chain_defects(rl, w.target, state.target_context(w.target), greedy) == []


class AnyProposalSLEM(SLEM):
    """SLEM whose candidates come from an arbitrary law (length 0..2, any target ids, EOS included),
    depending on the state and on hidden randomness: SLEM's verification is unchanged."""

    def __init__(self, seed: int, greedy: bool) -> None:
        super().__init__(lookahead=1, greedy=greedy)
        self.seed = seed

    def candidates(self, target: Model, drafter: Model, state: State, rand: Rand) -> tuple[int, ...]:
        n = len(target.vocab)
        key = f"{self.seed}:{state.emitted}"
        z = seeded_categorical(rand, key + ":z", 2, zero_prob=0.0)
        length = seeded_categorical(rand, f"{key}:{z}:len", 3, zero_prob=0.3)
        out: tuple[int, ...] = ()
        for _ in range(length):
            out += (seeded_categorical(rand, f"{key}:{z}:{out}", n, zero_prob=0.5),)
        return out


@SOME
@given(world_strategy(), st.integers(0, 2**16), st.integers(1, 2), st.booleans())
def test_slem_any_proposal_is_lossless(w: World, seed: int, n: int, greedy: bool) -> None:
    """SLEM's verification is lossless for ANY proposal law: round chain and full law."""
    m = AnyProposalSLEM(seed, greedy)
    state = State(w.prompt, (), n)
    rl = exact.round_law(m, w.target, w.drafter, state)
    assert chain_defects(rl, w.target, state.target_context(w.target), greedy) == []
    assert_lossless(m, w, n)


def first_candidate_psi(target: Model, drafter: Model, state: State, k: int, lookbehind: int) -> Law:
    """psi: law of the first candidate of SLEM's drafting procedure (``min(k, budget)`` drafter
    tokens, proofs/slem.md step 2), enumerated from ``draft_candidates`` under the exact Enumerator."""

    def first(rand: Rand) -> int:
        return draft_candidates(target, drafter, state, rand, min(k, state.budget), False, lookbehind)[0]

    return vec(Enumerator().law(first), len(target.vocab))


@SOME
@given(st.data(), st.integers(1, 2))
def test_slem_acceptance_is_sum_p_psi(data: st.DataObject, k: int) -> None:
    """SLEM's first-position acceptance equals sum_t p(t) psi(t), psi = law of the first candidate."""
    w = data.draw(world_strategy())
    state = data.draw(states(w))
    m = SLEM(lookahead=k)
    psi = first_candidate_psi(w.target, w.drafter, state, k, m.lookbehind)
    p = w.target.next_probs(state.target_context(w.target))
    rl = exact.round_law(m, w.target, w.drafter, state)
    assert acceptance(rl) == sum((a * b for a, b in zip(p, psi)), ZERO)


@SOME
@given(world_strategy(), st.integers(1, 2), st.integers(1, 2), st.booleans())
def test_slem_full_law(w: World, k: int, n: int, greedy: bool) -> None:
    """SLEM's exact output law equals target_law (greedy: identical tokens)."""
    assert_lossless(SLEM(lookahead=k, greedy=greedy), w, n)


@st.composite
def resyncs(draw: st.DrawFn) -> Resync:
    """A re-sync rule that cuts often on toy texts (strides 1-3), or the whole-text encoding."""
    return Resync(draw(st.one_of(st.none(), st.integers(1, 3))), draw(st.integers(0, 2)))


@MANY
@given(tokenizers(), st.text("abc", max_size=12), resyncs(), st.lists(st.integers(0, 12), max_size=4))
def test_resync_context_spells_the_text(tok: Tokenizer, text: str, rs: Resync, cuts: list[int]) -> None:
    """The incremental re-sync (proofs/slem.md step 1) is a function of the text alone: it spells
    the text, equals the whole text's encoding when no block is complete (or ``stride=None``),
    and a memo carried over any growing sequence of prefixes (or a text that does not extend the
    memo's) gives the same ids as a fresh computation."""
    ids = drafter_context_ids(text, tok.encode, tok.decode, rs)
    assert tok.decode(ids) == text
    if rs.stride is None or len(text) < rs.stride:
        assert ids == tok.encode(text)
    memo: ResyncMemo[str] = ResyncMemo("")
    for c in sorted(cuts) + [len(text)]:
        assert drafter_context_ids(text[:c], tok.encode, tok.decode, rs, memo) == \
            drafter_context_ids(text[:c], tok.encode, tok.decode, rs)
    other = text[::-1] + "a"
    assert drafter_context_ids(other, tok.encode, tok.decode, rs, memo) == \
        drafter_context_ids(other, tok.encode, tok.decode, rs)


def test_resync_lookbehind_repairs_a_cut() -> None:
    """Pinned: with merges ``a+b``, the text ``ab`` cut after ``a`` is ``[a, b]`` without look-behind
    and the whole text's ``[ab]`` with look-behind 1 (the cut's last id stays pending)."""
    from hsd_core.tokenizers import BPETokenizer
    tok = BPETokenizer(Vocabulary(["a", "b", "ab"]), [("a", "b")])
    assert tok.encode("ab") == [2]
    assert drafter_context_ids("ab", tok.encode, tok.decode, Resync(1, 0)) == [0, 1]
    assert drafter_context_ids("ab", tok.encode, tok.decode, Resync(1, 1)) == [2]
    assert drafter_context_ids("abab", tok.encode, tok.decode, Resync(2, 0)) == [2, 2]


def test_resync_refusals() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="stride"):
            Resync(bad)  # type: ignore[arg-type]
    for bad in (-1, 0.5, False):
        with pytest.raises(ValueError, match="lookbehind"):
            Resync(4, bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Resync"):
        SLEM(resync=4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Resync"):
        SLRS(resync=(4, 1))  # type: ignore[arg-type]


@SOME
@given(world_strategy(), st.integers(1, 2), st.integers(1, 3), st.booleans(), resyncs())
def test_slem_incremental_resync_is_lossless(w: World, k: int, n: int, greedy: bool, rs: Resync) -> None:
    """SLEM with the drafter re-synced in blocks of 1-3 characters (a cut after almost every
    character, so the drafter often sees another segmentation of the text) is lossless."""
    assert_lossless(SLEM(lookahead=k, greedy=greedy, resync=rs), w, n)


@FEW
@given(world_strategy(), st.integers(1, 2), st.integers(1, 2), resyncs(), st.sampled_from([1, None]))
def test_slrs_incremental_resync_is_lossless(w: World, k: int, n: int, rs: Resync, max_tokens: int | None) -> None:
    """SLRS (one token and multi-token) with the incremental re-sync is lossless: psi is computed
    by the same procedure under the same rule."""
    assert_lossless(SLRS(lookahead=k, max_tokens=max_tokens, resync=rs), w, n)


def test_resync_changes_proposals_on_a_pinned_world() -> None:
    """The cut is not a no-op: on a pinned world the first-candidate law under ``Resync(1, 0)``
    differs from the whole-text encoding's, and both methods stay lossless there."""
    from hsd_core.tokenizers import BPETokenizer
    vocab = Vocabulary(["a", "b", "ab"])
    tok = BPETokenizer(vocab, [("a", "b")])
    target = const_model(vocab, [F(1, 3), F(1, 3), F(1, 3), ZERO])
    drafter = FunctionModel(vocab, tok, lambda ctx: [F(1, 2), F(1, 2), ZERO, ZERO] if len(ctx) == 1
                            else [F(1, 6), F(1, 6), F(1, 2), F(1, 6)])
    state = State("ab", (), 2)
    whole = first_candidate_psi(target, drafter, state, 1, 4)
    cut = vec(Enumerator().law(lambda rand: draft_candidates(target, drafter, state, rand, 1, False, 4,
                                                             resync=Resync(1, 0))[0]), len(vocab))
    assert whole != cut
    w = World(target, drafter, "ab", "pinned")
    for m in (SLEM(lookahead=2, resync=Resync(1, 0)), SLRS(lookahead=2, resync=Resync(1, 0))):
        assert_lossless(m, w, 2)


def test_slem_retokenized_context_counterexample() -> None:
    """Re-tokenizing the text into the target's context is lossy (pinned world, engine numbers)."""
    t, d, prompt, m = pinned("slem_retokenized_context")
    law = exact.output_law(m, t, d, prompt, variants.PINNED_MAX_NEW_TOKENS)
    ref = exact.target_law(t, prompt, variants.PINNED_MAX_NEW_TOKENS)
    assert exact.first_difference(law, ref) == ((0, 0), F(773, 29645), F(6, 77))
    assert exact.total_variation(law, ref) == F(8441, 112651)
    assert exact.output_law(SLEM(lookahead=2), t, d, prompt, 2) == ref


# --------------------------------------------------------------------------------------------
# proofs/tli.md


@st.composite
def dup_worlds(draw: st.DrawFn) -> World:
    """A world whose drafter vocabulary repeats strings (so q_cap must add duplicates)."""
    t_tok = draw(tokenizers())
    target = random_model(t_tok.vocab, t_tok, draw(st.integers(0, 2**16)), zero_prob=0.0)
    shared = [s for s in t_tok.vocab.tokens]
    dup = draw(st.lists(st.sampled_from(shared), min_size=1, max_size=3))
    toks = list(draw(st.permutations(list("abc") + ["cc" if "cc" not in t_tok.vocab else "ccc"] + dup)))
    dv = Vocabulary(toks)
    drafter = random_model(dv, LongestMatchTokenizer(dv), draw(st.integers(0, 2**16)),
                           zero_prob=draw(st.sampled_from([0.0, 0.3])))
    return World(target, drafter, draw(st.text("abc", max_size=2)), "duplicates")


@MANY
@given(st.one_of(dup_worlds(), world_strategy()), st.data())
def test_tli_pushforward_sums_duplicates(w: World, data: st.DataObject) -> None:
    """q_cap over target ids is the pushforward of the renormalized drafter law: drafter ids with
    one string add up; and it is exactly the law of TLI's mapped first draft."""
    state = data.draw(states(w))
    inter = intersection(w.target.vocab, w.drafter.vocab)
    d_ctx = drafter_context(w.target, w.drafter, state, inter)
    q = w.drafter.next_probs(d_ctx)
    n = len(w.target.vocab)
    dv, tv = w.drafter.vocab, w.target.vocab
    shared = [d for d in range(len(dv)) if d == dv.eos_id or dv.string(d) in tv]
    z = sum((q[d] for d in shared), ZERO)
    cap = inter.restrict(q)
    if z == 0:
        assert cap is None
        return
    assert cap is not None
    pushed = inter.push(cap, n)
    for t in range(n):
        if t == tv.eos_id:
            want = q[dv.eos_id] / z
        elif tv.id_of(tv.string(t)) != t:
            want = ZERO  # a duplicate target id is never proposed (drafts map to the written id)
        else:
            want = sum((q[d] for d in shared if d != dv.eos_id and dv.string(d) == tv.string(t)), ZERO) / z
        assert pushed[t] == want
    assert sum(pushed) == 1

    def first_mapped(rand: Rand) -> int:
        drafts, _ = draft_autoregressive(w.drafter, d_ctx, 1, rand, False, inter.restrict)
        t = inter.to_target[drafts[0]]
        assert t is not None
        return t

    assert vec(Enumerator().law(first_mapped), n) == pushed


def test_tli_scatter_assign_counterexample() -> None:
    """Keeping one drafter id per string instead of adding them is lossy (pinned world)."""
    t, d, prompt, m = pinned("tli_scatter_assign")
    law = exact.output_law(m, t, d, prompt, 2)
    ref = exact.target_law(t, prompt, 2)
    assert exact.first_difference(law, ref) == ((4,), F(2, 19), F(1, 9))
    assert exact.output_law(TLI(lookahead=2), t, d, prompt, 2) == ref


def test_tli_raw_q_counterexample() -> None:
    """Sampling from q_cap but verifying against the raw q is lossy (pinned world)."""
    t, d, prompt, m = pinned("tli_raw_q")
    law = exact.output_law(m, t, d, prompt, 2)
    ref = exact.target_law(t, prompt, 2)
    assert exact.first_difference(law, ref) == ((3,), F(1, 15), F(1, 8))
    assert exact.output_law(TLI(lookahead=2), t, d, prompt, 2) == ref


@pytest.mark.parametrize("seed", range(12))
def test_tli_drafter_with_a_larger_alphabet_is_lossless(seed: int) -> None:
    """TLI needs only the target's alphabet inside the drafter's (the re-sync encodes target text
    for the drafter; nothing re-encodes drafter text for the target): a drafter with extra characters
    (a byte-fallback drafter of a target that lacks some bytes, as Gemma-3 drafting for SmolLM2) is
    lossless, its tokens with other characters simply outside the intersection. Exact output law on
    12 random worlds (lookahead 1-3, N 1-3), sampling and greedy; the reverse (a target character
    the drafter lacks) stays refused."""
    rng = random.Random(seed)
    tv = Vocabulary(["a", "b"] + rng.sample(["ab", "ba", "aa", "bb", "aba"], 2))
    dv = Vocabulary(["a", "b", "c"] + rng.sample(["ab", "ca", "bc", "cc", "ba", "abc"], 3))
    t = random_model(tv, LongestMatchTokenizer(tv), seed, zero_prob=0.2)
    d = random_model(dv, LongestMatchTokenizer(dv), seed + 100, zero_prob=0.2)
    k, n = 1 + seed % 3, 1 + (seed // 3) % 3
    assert exact.output_law(TLI(lookahead=k), t, d, "a", n) == exact.target_law(t, "a", n)
    assert exact.output_law(TLI(lookahead=k, greedy=True), t, d, "a", n) == exact.target_law(t, "a", n, greedy=True)
    with pytest.raises(ValueError, match="lacks target characters"):
        exact.output_law(TLI(lookahead=k), d, t, "a", n)


def outside_only(drafter: Model, target_vocab: Vocabulary, everywhere: bool) -> FunctionModel:
    """``drafter`` with zero mass on the intersection (EOS included): at every context, or only at
    contexts of odd length (so drafting stops part-way)."""
    dv = drafter.vocab
    outside = [i < dv.eos_id and dv.string(i) not in target_vocab for i in range(len(dv))]

    def law(ctx: tuple[int, ...]) -> list[Prob]:
        p = drafter.next_probs(ctx)
        if not everywhere and len(ctx) % 2 == 0:
            return list(p)
        wts = [x if o else ZERO for x, o in zip(p, outside)]
        if sum(wts) == 0:
            wts = [F(int(o)) for o in outside]
        t = sum(wts)
        return [x / t for x in wts]

    return FunctionModel(dv, drafter.tokenizer, law)


@SOME
@given(world_strategy(), st.booleans(), st.integers(1, 2), st.integers(1, 2))
def test_tli_zero_mass_is_plain_decoding(w: World, everywhere: bool, k: int, n: int) -> None:
    """No drafter mass on the intersection: the round makes no draft and emits one token from p
    (plain target decoding); zero mass part-way stops drafting. Lossless either way."""
    dv = Vocabulary(list("abc") + ["cccc", "bbbb"])
    base = random_model(dv, LongestMatchTokenizer(dv), 7, zero_prob=0.3)
    drafter = outside_only(base, w.target.vocab, everywhere)
    w2 = World(w.target, drafter, w.prompt, "zero-mass")
    state = State(w.prompt, (), n)
    rl = exact.round_law(TLI(lookahead=k), w.target, drafter, state)
    ctx = state.target_context(w.target)
    if everywhere or len(drafter.tokenizer.encode(w.prompt)) % 2 == 1:
        assert all(o.proposed == 0 and len(o.tokens) == 1 for o in rl)
        assert vec({o.tokens[0]: p for o, p in rl.items()}, len(w.target.vocab)) == w.target.next_probs(ctx)
    assert chain_defects(rl, w.target, ctx, False) == []
    assert_lossless(TLI(lookahead=k), w2, n)


@SOME
@given(st.data())
def test_tli_drafter_context_resyncs(data: st.DataObject) -> None:
    """TLI's drafter context is a function of (prompt, emitted ids) only, and it spells exactly
    the text emitted so far."""
    w = data.draw(world_strategy())
    state = data.draw(states(w, max_prefix=3))
    inter = intersection(w.target.vocab, w.drafter.vocab)
    ctx = drafter_context(w.target, w.drafter, state, inter)
    again = drafter_context(w.target, w.drafter, State(state.prompt, tuple(state.emitted), 99), inter)
    assert ctx == again
    assert w.drafter.tokenizer.decode(ctx) == state.text(w.target)


@SOME
@given(st.data(), st.integers(1, 2), st.booleans())
def test_tli_round_is_target_chain(data: st.DataObject, k: int, greedy: bool) -> None:
    """One TLI round is the target's chain (drafts verified against the pushed q_cap they were
    drawn from, given the drafter's ids so far)."""
    w = data.draw(st.one_of(world_strategy(), dup_worlds()))
    state = data.draw(states(w))
    rl = exact.round_law(TLI(lookahead=k, greedy=greedy), w.target, w.drafter, state)
    assert chain_defects(rl, w.target, state.target_context(w.target), greedy) == []


@MANY
@given(st.data(), st.integers(1, 2))
def test_tli_acceptance_beats_union(data: st.DataObject, k: int) -> None:
    """TLI's first acceptance is sum_{T∩D} min(p, q_cap) >= the union baseline sum_{T∩D} min(p, q)."""
    w = data.draw(st.one_of(world_strategy(), dup_worlds()))
    state = data.draw(states(w))
    inter = intersection(w.target.vocab, w.drafter.vocab)
    q = w.drafter.next_probs(drafter_context(w.target, w.drafter, state, inter))
    n = len(w.target.vocab)
    p = w.target.next_probs(state.target_context(w.target))
    union = sum_min(p, inter.push(q, n))
    cap = inter.restrict(q)
    tli = ZERO if cap is None else sum_min(p, inter.push(cap, n))
    assert tli >= union
    assert acceptance(exact.round_law(TLI(lookahead=k), w.target, w.drafter, state)) == tli


@SOME
@given(st.one_of(world_strategy(), dup_worlds()), st.integers(1, 2), st.integers(1, 2), st.booleans())
def test_tli_full_law(w: World, k: int, n: int, greedy: bool) -> None:
    """TLI's exact output law equals target_law (greedy: identical tokens)."""
    assert_lossless(TLI(lookahead=k, greedy=greedy), w, n)


# --------------------------------------------------------------------------------------------
# proofs/slrs.md


@SOME
@given(st.data(), st.integers(1, 2), st.sampled_from([1, None]))
def test_slrs_psi_is_first_candidate_law(data: st.DataObject, k: int, max_tokens: int | None) -> None:
    """SLRS().psi(...) is the law of the proposal SLEM's drafting procedure makes: its first-token
    law equals the first candidate of draft_candidates enumerated under Enumerator, and its tuple
    law equals the enumerated law of the candidates cut to max_tokens and to the budget."""
    w = data.draw(world_strategy())
    state = data.draw(states(w))
    m = SLRS(lookahead=k, max_tokens=max_tokens)
    psi = m.psi(w.target, w.drafter, state)
    n = len(w.target.vocab)
    assert psi.first(n) == first_candidate_psi(w.target, w.drafter, state, k, m.lookbehind)
    cut = state.budget if max_tokens is None else min(max_tokens, state.budget)

    def proposal(rand: Rand) -> tuple[int, ...]:
        return draft_candidates(w.target, w.drafter, state, rand, min(k, state.budget), False, m.lookbehind)[:cut]

    assert psi.law == Enumerator().law(proposal)
    assert sum(psi.law.values()) == 1


@MANY
@given(st.integers(2, 5).flatmap(lambda n: st.tuples(laws(n), laws(n))), st.integers(0, 10))
def test_verification_needs_the_true_law(pair: tuple[Law, Law], pick: int) -> None:
    """Only if: drafts drawn from psi but verified against psi' != psi (psi' > 0 on supp psi) give
    a token law != p for the target p that puts p(t) = psi'(t)/2 on a t where they differ."""
    psi, other = pair
    n = len(psi)
    psi2 = tuple((a + F(1, 10)) / (1 + F(n, 10)) for a in other)  # positive everywhere
    diff = [t for t in range(n) if psi2[t] != psi[t]]
    if not diff:
        return
    t0 = diff[pick % len(diff)]
    rest = (1 - psi2[t0] / 2) / (n - 1)
    p = tuple(psi2[t0] / 2 if t == t0 else rest for t in range(n))
    target = target_of(p)

    def run(rand: Rand) -> int:
        x = rand.categorical(psi)
        return RejectionVerifier().verify(target, (), [x], [psi2], rand, budget=1).tokens[0]

    out = vec(Enumerator().law(run), n)
    assert out[t0] == psi[t0] * p[t0] / psi2[t0] != p[t0]

    def run_true(rand: Rand) -> int:
        x = rand.categorical(psi)
        return RejectionVerifier().verify(target, (), [x], [psi], rand, budget=1).tokens[0]

    assert vec(Enumerator().law(run_true), n) == p


@MANY
@given(st.integers(2, 4).flatmap(lambda n: st.tuples(laws(n), st.integers(2, 6).flatmap(
    lambda m: st.tuples(laws(m), st.lists(st.integers(-1, n - 1), min_size=m, max_size=m))))))
def test_slrs_map_with_holes_is_lossless(case: tuple[Law, tuple[Law, list[int]]]) -> None:
    """Lemma 9 of proofs/slrs.md: a draft ``d ~ q`` whose map ``f[d]`` is -1 (text the target cannot
    encode) proposes nothing and the target draws its own token; else ``f[d]`` is verified against
    psi given a proposal (the pushforward divided by its total). The emitted law is exactly ``p``."""
    p, (q, f) = case
    n = len(p)
    psi = [ZERO] * n
    for d, t in enumerate(f):
        if t >= 0:
            psi[t] += q[d]
    total = sum(psi, ZERO)
    if total == 0:
        return  # every draft with mass is a hole: the round is the target's own token
    cond = tuple(x / total for x in psi)
    target = target_of(p)

    def run(rand: Rand) -> int:
        d = rand.categorical(q)
        if f[d] < 0:
            return rand.categorical(p)
        return RejectionVerifier().verify(target, (), [f[d]], [cond], rand, budget=1).tokens[0]

    assert vec(Enumerator().law(run), n) == p


@SOME
@given(st.data(), st.integers(1, 2), st.booleans())
def test_slrs_round_is_target_chain(data: st.DataObject, k: int, greedy: bool) -> None:
    """One SLRS round (max_tokens=1): the verified proposal, correction and bonus follow the target."""
    w = data.draw(world_strategy())
    state = data.draw(states(w))
    rl = exact.round_law(SLRS(lookahead=k, greedy=greedy), w.target, w.drafter, state)
    assert chain_defects(rl, w.target, state.target_context(w.target), greedy) == []


@MANY
@given(law_pairs())
def test_min_dominates_product(pq: tuple[Law, Law]) -> None:
    """min(a, b) >= a * b for a, b in [0, 1], hence sum min(p, psi) >= sum p * psi."""
    p, q = pq
    assert all(min(a, b) >= a * b for a, b in zip(p, q))
    assert sum_min(p, q) >= sum((a * b for a, b in zip(p, q)), ZERO)


@SOME
@given(st.data(), st.integers(1, 2))
def test_slrs_acceptance_dominates_slem(data: st.DataObject, k: int) -> None:
    """Same drafting procedure, same psi: SLRS accepts its first proposal with probability
    sum min(p, psi), SLEM with sum p * psi, and the first is >= the second."""
    w = data.draw(world_strategy())
    state = data.draw(states(w))
    psi = first_candidate_psi(w.target, w.drafter, state, k, 4)
    p = w.target.next_probs(state.target_context(w.target))
    a_slrs = acceptance(exact.round_law(SLRS(lookahead=k), w.target, w.drafter, state))
    a_slem = acceptance(exact.round_law(SLEM(lookahead=k), w.target, w.drafter, state))
    assert a_slrs == sum_min(p, psi)
    assert a_slem == sum((a * b for a, b in zip(p, psi)), ZERO)
    assert a_slrs >= a_slem


@SOME
@given(world_strategy(), st.integers(1, 2), st.integers(1, 2), st.booleans())
def test_slrs_full_law(w: World, k: int, n: int, greedy: bool) -> None:
    """SLRS's exact output law equals target_law (greedy: identical tokens)."""
    assert_lossless(SLRS(lookahead=k, greedy=greedy), w, n)


@st.composite
def prefix_worlds(draw: st.DrawFn) -> World:
    """A target with at least one multi-character token (so a shorter target token is a prefix of
    it) and a character-level drafter with full support."""
    extra = draw(st.lists(st.text("abc", min_size=2, max_size=3), min_size=1, max_size=3, unique=True))
    tv = Vocabulary(list("abc") + extra)
    target = random_model(tv, LongestMatchTokenizer(tv), draw(st.integers(0, 2**16)), zero_prob=0.3)
    dv = Vocabulary(list(draw(st.permutations(list("abc")))))
    drafter = random_model(dv, LongestMatchTokenizer(dv), draw(st.integers(0, 2**16)), zero_prob=0.0)
    return World(target, drafter, draw(st.text("abc", max_size=2)), "prefix")


@SOME
@given(prefix_worlds(), st.integers(1, 2))
def test_concat_psi_is_not_a_law(w: World, k: int) -> None:
    """The published psi ("segmentations that concatenate exactly to t") sums to more than 1 when
    target tokens are prefixes of others, while the true psi is a law."""
    state = State(w.prompt, (), 1)
    d_ctx = tuple(w.drafter.tokenizer.encode(state.text(w.target)))
    n = len(w.target.vocab)
    concat = [variants.concat_psi(w.target, w.drafter, d_ctx, t) for t in range(n)]
    assert sum(concat) > 1
    assert sum(SLRS(lookahead=k).psi(w.target, w.drafter, state).first(n)) == 1


def concat_world() -> tuple[Model, Model]:
    """T = [a, b, ab] (longest match), p uniform on {a, b, ab, EOS}; D = [a, b], q = (1/2, 1/4, 1/4)."""
    tv, dv = Vocabulary(["a", "b", "ab"]), Vocabulary(["a", "b"])
    return const_model(tv, [F(1, 4)] * 4), const_model(dv, [F(1, 2), F(1, 4), F(1, 4)])


def test_concat_psi_counterexample() -> None:
    """The hand-sized world of proofs/slrs.md: engine numbers for true psi, concat psi, and the
    first sequence whose probability SLRSConcatPsi gets wrong. With one token left a round drafts
    one drafter token (min(k, budget)), psi is q on (a, b, EOS), and the variant happens to be
    exact; with two or more the first round drafts two, and it is lossy."""
    target, drafter = concat_world()
    assert SLRS(lookahead=2).psi(target, drafter, State("", (), 2)).first(4) == (F(3, 8), F(1, 4), F(1, 8), F(1, 4))
    assert SLRS(lookahead=2).psi(target, drafter, State("", (), 1)).first(4) == (F(1, 2), F(1, 4), F(0), F(1, 4))
    assert [variants.concat_psi(target, drafter, (), t) for t in range(4)] == [F(1, 2), F(1, 4), F(1, 8), F(1, 4)]
    assert exact.output_law(variants.SLRSConcatPsi(lookahead=2), target, drafter, "", 1) == \
        exact.target_law(target, "", 1)
    for n, diff in ((2, ((0, 0), F(3, 64), F(1, 16))), (3, ((0, 3), F(3, 64), F(1, 16)))):
        law = exact.output_law(variants.SLRSConcatPsi(lookahead=2), target, drafter, "", n)
        ref = exact.target_law(target, "", n)
        assert exact.first_difference(law, ref) == diff
        assert exact.total_variation(law, ref) == F(1, 16)
        assert exact.output_law(SLRS(lookahead=2), target, drafter, "", n) == ref
    law2 = exact.output_law(variants.SLRSConcatPsi(lookahead=2), target, drafter, "", 2)
    first: dict[int, F] = {}
    for seq, pr in law2.items():
        first[seq[0]] = first.get(seq[0], F(0)) + pr
    assert first == {0: F(3, 16), 1: F(1, 4), 2: F(5, 16), 3: F(1, 4)}


def test_concat_psi_pinned_counterexample() -> None:
    """The Hypothesis-shrunk pinned world (no target token is a prefix of another; the drafter has
    'aa'): concat psi sums to 8/9 and SLRSConcatPsi is lossy at (EOS,)."""
    t, d, prompt, m = pinned("slrs_concat_psi")
    n = len(t.vocab)
    concat = [variants.concat_psi(t, d, (), x) for x in range(n)]
    assert concat == [F(1, 3), F(2, 9), F(2, 9), F(1, 9)] and sum(concat) == F(8, 9)
    assert SLRS(lookahead=2).psi(t, d, State(prompt, (), 2)).first(n) == (F(4, 9), F(2, 9), F(2, 9), F(1, 9))
    law = exact.output_law(m, t, d, prompt, 2)
    ref = exact.target_law(t, prompt, 2)
    assert exact.first_difference(law, ref) == ((3,), F(1, 9), F(1, 8))
    assert exact.total_variation(law, ref) == F(5, 72)


# --------------------------------------------------------------------------------------------
# proofs/slrs_multi.md


@SOME
@given(st.data(), st.integers(1, 2))
def test_slrs_multi_conditionals(data: st.DataObject, k: int) -> None:
    """The laws multi-token SLRS verifies against are the conditionals of the proposal law:
    psi_j(. | s_<j) = P(s_j = . | proposal starts with s_<j and has a j-th token)."""
    w = data.draw(world_strategy())
    state = data.draw(states(w))
    m = SLRS(lookahead=k, max_tokens=None)
    psi = m.psi(w.target, w.drafter, state)
    n = len(w.target.vocab)
    for s in psi.law:
        qs = m.proposal_laws(w.target, w.drafter, state, s)
        for j, q in enumerate(qs):
            goes_on = {x: pr for x, pr in psi.law.items() if len(x) > j and x[:j] == s[:j]}
            mass = sum(goes_on.values(), ZERO)
            want: list[Prob] = [ZERO] * n
            for x, pr in goes_on.items():
                want[x[j]] += pr / mass
            assert q == tuple(want) and q[s[j]] > 0


@SOME
@given(st.data(), st.integers(1, 2), st.booleans())
def test_slrs_multi_round_is_target_chain(data: st.DataObject, k: int, greedy: bool) -> None:
    """One multi-token SLRS round is the target's chain."""
    w = data.draw(world_strategy())
    state = data.draw(states(w))
    rl = exact.round_law(SLRS(lookahead=k, max_tokens=None, greedy=greedy), w.target, w.drafter, state)
    assert chain_defects(rl, w.target, state.target_context(w.target), greedy) == []


@SOME
@given(world_strategy(), st.integers(1, 2), st.integers(1, 2), st.booleans())
def test_slrs_multi_full_law(w: World, k: int, n: int, greedy: bool) -> None:
    """Multi-token SLRS's exact output law equals target_law."""
    assert_lossless(SLRS(lookahead=k, max_tokens=None, greedy=greedy), w, n)


def sticky_world() -> tuple[Model, Model]:
    """T = D = [a, b]; p = (1/2, 1/2, 0) everywhere; the drafter's first token is a or b (1/2
    each) and it then repeats it (q(a | ..a) = q(b | ..b) = 1)."""
    v = Vocabulary(["a", "b"])

    def q(ctx: tuple[int, ...]) -> list[F]:
        if not ctx:
            return [F(1, 2), F(1, 2), ZERO]
        return [F(1), ZERO, ZERO] if ctx[-1] == 0 else [ZERO, F(1), ZERO]

    return const_model(v, [F(1, 2), F(1, 2), ZERO]), FunctionModel(v, LongestMatchTokenizer(v), q)


def test_slrs_unconditioned_counterexample() -> None:
    """Verifying t_2 against its unconditional marginal is lossy: hand-sized world, engine numbers."""
    target, drafter = sticky_world()
    ref = exact.target_law(target, "", 2)
    assert ref == {(0, 0): F(1, 4), (0, 1): F(1, 4), (1, 0): F(1, 4), (1, 1): F(1, 4)}
    bad = exact.output_law(variants.SLRSUnconditioned(lookahead=2), target, drafter, "", 2)
    assert bad == {(0, 0): F(1, 2), (1, 1): F(1, 2)}
    assert exact.first_difference(bad, ref) == ((0, 0), F(1, 2), F(1, 4))
    assert exact.total_variation(bad, ref) == F(1, 2)
    assert exact.output_law(SLRS(lookahead=2, max_tokens=None), target, drafter, "", 2) == ref


def test_slrs_unconditioned_pinned_counterexample() -> None:
    """The pinned world of hsd_core.variants for SLRSUnconditioned (engine numbers)."""
    t, d, prompt, m = pinned("slrs_unconditioned")
    law = exact.output_law(m, t, d, prompt, 2)
    ref = exact.target_law(t, prompt, 2)
    assert exact.first_difference(law, ref) == ((0, 0), F(1323, 21760), F(3, 40))
    assert exact.total_variation(law, ref) == F(3168423353887, 53429274001152)
    assert exact.output_law(SLRS(lookahead=2, max_tokens=None), t, d, prompt, 2) == ref


# --------------------------------------------------------------------------------------------
# proofs/slrs_bounded.md


def spec_longest_parse(vocab: Vocabulary, text: str) -> tuple[int, ...]:
    """Greedy longest match written independently of LongestPrefixMap: at each position the
    longest token string that starts there (its lowest id); where none does (a character the
    vocabulary lacks), the parse ends."""
    out: list[int] = []
    i = 0
    while i < len(text):
        starts = [(len(t), -j) for j, t in enumerate(vocab.tokens) if text.startswith(t, i)]
        if not starts:
            break
        best = max(starts)
        out.append(-best[1])
        i += best[0]
    return tuple(out)


@st.composite
def prefix_map_cases(draw: st.DrawFn) -> tuple[Vocabulary, str, str, int]:
    """A vocabulary over "abc" and a text and continuation over "abcd": "d" is a character the
    vocabulary lacks (a drafter's text the target cannot encode), where the parse ends."""
    extra = draw(st.lists(st.text("abc", min_size=2, max_size=4), max_size=5))
    vocab = Vocabulary(list("abc") + extra)
    return vocab, draw(st.text("abcd", max_size=6)), draw(st.text("abcd", max_size=5)), draw(st.integers(1, 3))


@MANY
@given(prefix_map_cases())
def test_longest_prefix_settled_iff_final(case: tuple[Vocabulary, str, str, int]) -> None:
    """LongestPrefixMap.parse is the greedy longest match (ending where no token starts the rest);
    settled(text, m) holds iff no continuation changes the first m ids: if settled, text + rest
    keeps them (for the drawn rest and for every rest of length <= the longest token, over an
    alphabet with a character the vocabulary lacks); if not, an explicit continuation changes them."""
    vocab, text, rest, m = case
    pm = LongestPrefixMap(vocab)
    assert pm.parse(text) == spec_longest_parse(vocab, text)
    assert pm.parse(text, m) == pm.parse(text)[:m]
    head = pm.parse(text)[:m]
    if pm.settled(text, m):
        assert spec_longest_parse(vocab, text + rest)[:m] == head
        for n in range(1, vocab.max_token_len + 1):
            for tail in itertools.product("abcd", repeat=n):
                assert spec_longest_parse(vocab, text + "".join(tail))[:m] == head
    else:
        i = 0
        for _ in range(m):  # the first unsettled position, and a continuation that completes a longer token
            r = text[i:]
            if not r:
                witness = "a"
                break
            if r in pm.proper_prefixes:
                longer = min(t for t in vocab.tokens if t.startswith(r) and len(t) > len(r))
                witness = longer[len(r):]
                break
            i += len(vocab.string(spec_longest_parse(vocab, r)[0]))
        assert spec_longest_parse(vocab, text + witness)[:m] != head


def spec_bounded_proposal(target: Model, drafter: Model, state: State, k: int, tau: Prob | None, proposal_map: str,
                          max_tokens: int | None, greedy: bool = False):  # type: ignore[no-untyped-def]
    """The bounded procedure as proofs/slrs_bounded.md §1 states it, written independently of
    SLRS and WITHOUT the settled stop: draft until drafter EOS, min(k, budget) tokens or a path
    probability < tau; read the proposal off the text (longest match, or SLEM's re-tokenization)."""
    m = state.budget if max_tokens is None else min(max_tokens, state.budget)

    def run(rand: Rand) -> tuple[int, ...]:
        text_so_far = state.text(target)
        d_ctx = tuple(drafter.tokenizer.encode("".join(c for c in text_so_far if c in drafter.vocab)))
        drafts: list[int] = []
        pr: Prob = F(1)
        for _ in range(min(k, state.budget)):
            q = drafter.next_probs(d_ctx + tuple(drafts))
            d = sample(q, rand, greedy)
            drafts.append(d)
            pr *= q[d]
            if d == drafter.vocab.eos_id or (tau is not None and pr < tau):
                break
        text = drafter.tokenizer.decode(drafts)
        if proposal_map == "longest_prefix":
            ids = spec_longest_parse(target.vocab, text)
        elif any(c not in target.vocab for c in text):
            return ()  # a text the target cannot encode proposes nothing
        else:
            ids = retokenize(target, state.target_context(target), text, 4)
        ended = drafts[-1] == drafter.vocab.eos_id
        return (ids + ((target.vocab.eos_id,) if ended else ()))[:m]

    return run


BOUNDED = st.tuples(st.integers(1, 3), st.sampled_from([None, F(1, 2), F(1, 5), F(1, 12)]),
                    st.sampled_from(["retokenize", "longest_prefix"]), st.sampled_from([1, 2, None]))


@SOME
@given(st.data(), BOUNDED)
def test_slrs_bounded_psi_is_procedure_law(data: st.DataObject, setting: tuple[int, F | None, str, int | None]) -> None:
    """SLRS(lookahead=k, min_path_prob=tau, proposal_map=..., max_tokens=...).psi(...).law is the
    enumerated law of the procedure written independently WITHOUT the settled stop (so stopping
    once the proposal is settled never changes the law), and it sums to 1 (the empty proposal
    included: half the worlds have a drafter alphabet that differs from the target's)."""
    k, tau, pmap, mt = setting
    w = data.draw(world_strategy(mixed_alphabets=data.draw(st.booleans())))
    state = data.draw(states(w))
    m = SLRS(lookahead=k, min_path_prob=tau, proposal_map=pmap, max_tokens=mt)
    psi = m.psi(w.target, w.drafter, state)
    assert psi.law == Enumerator().law(spec_bounded_proposal(w.target, w.drafter, state, k, tau, pmap, mt))
    assert sum(psi.law.values()) == 1
    if tau is None and pmap == "retokenize":
        assert psi.law == SLRS(lookahead=k, max_tokens=mt).psi(w.target, w.drafter, state).law


class PathRecorder:
    """A drafter proxy that records, for each context it is asked about, the drafter probability of
    the path that leads there from the round's drafter context."""

    def __init__(self, model: Model, root: tuple[int, ...]) -> None:
        self.model, self.root = model, root
        self.vocab, self.tokenizer = model.vocab, model.tokenizer
        self.seen: dict[tuple[int, ...], Prob] = {}

    def next_probs(self, ctx: Sequence[int]) -> Law:
        ctx = tuple(ctx)
        assert ctx[: len(self.root)] == self.root
        pr: Prob = F(1)
        for i in range(len(self.root), len(ctx)):
            pr *= self.model.next_probs(ctx[:i])[ctx[i]]
        self.seen[ctx] = pr
        return self.model.next_probs(ctx)


@SOME
@given(st.data(), st.integers(1, 5), st.sampled_from([F(1, 2), F(1, 3), F(1, 7), F(1, 20)]),
       st.sampled_from(["retokenize", "longest_prefix"]), st.sampled_from([1, None]))
def test_slrs_bounded_cost_bound(data: st.DataObject, k: int, tau: F, pmap: str, mt: int | None) -> None:
    """Every drafter context psi evaluates has path probability >= tau, and psi evaluates at most
    1 + (k - 1) / tau <= k / tau contexts (PsiLaw.evaluations counts them)."""
    w = data.draw(world_strategy())
    state = data.draw(states(w))
    root = tuple(w.drafter.tokenizer.encode(state.text(w.target)))
    rec = PathRecorder(w.drafter, root)
    m = SLRS(lookahead=k, min_path_prob=tau, proposal_map=pmap, max_tokens=mt)
    law = Enumerator().law(lambda rand: m.propose(w.target, rec, state, rand))  # type: ignore[arg-type]
    assert all(pr >= tau for pr in rec.seen.values())
    assert all(len(c) - len(root) < k for c in rec.seen)
    assert len(rec.seen) <= 1 + (k - 1) / tau <= k / tau
    psi = SLRS(lookahead=k, min_path_prob=tau, proposal_map=pmap, max_tokens=mt).psi(w.target, w.drafter, state)
    assert psi.law == law and psi.evaluations == len(rec.seen)


@SOME
@given(st.data(), BOUNDED, st.booleans())
def test_slrs_bounded_round_is_target_chain(data: st.DataObject, setting: tuple[int, F | None, str, int | None],
                                            greedy: bool) -> None:
    """One round of bounded SLRS (either map, one or several tokens) is the target's chain."""
    k, tau, pmap, mt = setting
    w = data.draw(world_strategy())
    state = data.draw(states(w))
    m = SLRS(lookahead=k, min_path_prob=tau, proposal_map=pmap, max_tokens=mt, greedy=greedy)
    rl = exact.round_law(m, w.target, w.drafter, state)
    assert chain_defects(rl, w.target, state.target_context(w.target), greedy) == []
    assert round_shape_defects(rl, state, w.target.vocab.eos_id) == []


@SOME
@given(world_strategy(), BOUNDED, st.integers(1, 2), st.booleans())
def test_slrs_bounded_full_law(w: World, setting: tuple[int, F | None, str, int | None], n: int, greedy: bool) -> None:
    """Bounded SLRS's exact output law equals target_law (greedy: identical tokens)."""
    k, tau, pmap, mt = setting
    assert_lossless(SLRS(lookahead=k, min_path_prob=tau, proposal_map=pmap, max_tokens=mt, greedy=greedy), w, n)


MIXED_METHODS = st.sampled_from(["SLEM", "SLRS", "SLRS-multi", "bounded"])


@SOME
@given(world_strategy(mixed_alphabets=True), MIXED_METHODS, BOUNDED, st.integers(1, 3), st.booleans())
def test_string_methods_lossless_when_alphabets_differ(w: World, name: str,
                                                       setting: tuple[int, F | None, str, int | None], n: int,
                                                       greedy: bool) -> None:
    """slem.md, slrs.md section 5: on worlds whose drafter alphabet differs from the target's (it
    adds characters the target cannot encode, lacks some of the target's, both, or shares none),
    SLEM, SLRS (one and several tokens) and bounded SLRS (both maps, any tau, one or several
    tokens) have exactly the target's output law (greedy: its tokens)."""
    k, tau, pmap, mt = setting
    m = {"SLEM": lambda: SLEM(lookahead=k, greedy=greedy), "SLRS": lambda: SLRS(lookahead=k, greedy=greedy),
         "SLRS-multi": lambda: SLRS(lookahead=k, max_tokens=None, greedy=greedy),
         "bounded": lambda: SLRS(lookahead=k, min_path_prob=tau, proposal_map=pmap, max_tokens=mt, greedy=greedy)}
    assert_lossless(m[name](), w, n)


@SOME
@given(st.data(), BOUNDED)
def test_slrs_bounded_acceptance(data: st.DataObject, setting: tuple[int, F | None, str, int | None]) -> None:
    """The first proposal of bounded SLRS is accepted with probability sum_t min(p(t), psi(t)),
    psi the first-token law of the bounded procedure (hsd_core.acceptance.closed_form_acceptance)."""
    k, tau, pmap, _ = setting
    w = data.draw(world_strategy())
    state = data.draw(states(w))
    m = SLRS(lookahead=k, min_path_prob=tau, proposal_map=pmap)
    p = w.target.next_probs(state.target_context(w.target))
    psi = vec(Enumerator().law(lambda r: spec_bounded_proposal(w.target, w.drafter, state, k, tau, pmap, 1)(r)[0]),
              len(w.target.vocab))
    a = acceptance(exact.round_law(m, w.target, w.drafter, state))
    assert a == sum_min(p, psi) == closed_form_acceptance(m, w.target, w.drafter, state)


def test_slrs_coin_stop_counterexample() -> None:
    """The pinned world of SLRSCoinStop: the coin changes the proposal law from psi to another law,
    and the engine finds the output lossy (numbers of proofs/slrs_bounded.md §4)."""
    t, d, prompt, m = pinned("slrs_coin_stop")
    state = State(prompt, (), 2)
    honest = SLRS(lookahead=2, min_path_prob=F(1, 16), proposal_map="longest_prefix")
    assert honest.psi(t, d, state).first(5) == (F(15, 44), F(2, 11), F(1, 11), F(9, 44), F(2, 11))
    drawn = Enumerator().law(lambda rand: m.propose(t, d, state, rand))
    assert drawn == {(0,): F(39, 88), (1,): F(2, 11), (2,): F(1, 11), (3,): F(9, 88), (4,): F(2, 11)}
    law = exact.output_law(m, t, d, prompt, 2)
    ref = exact.target_law(t, prompt, 2)
    assert exact.first_difference(law, ref) == ((4,), F(2347, 11396), F(3, 14))
    assert exact.total_variation(law, ref) == F(909, 11396)
    assert exact.output_law(honest, t, d, prompt, 2) == ref


# --------------------------------------------------------------------------------------------
# proofs/ar.md and the assumptions


@SOME
@given(world_strategy(), st.integers(1, 3), st.booleans())
def test_target_law_is_product_chain(w: World, n: int, greedy: bool) -> None:
    """target_law is a law on sequences that end at EOS or at length max_new_tokens, each with
    probability prod_i p(y_i | encode(prompt) + y_<i) (greedy: the argmax chain, probability 1)."""
    law = exact.target_law(w.target, w.prompt, n, greedy=greedy)
    base = tuple(w.target.tokenizer.encode(w.prompt))
    eos = w.target.vocab.eos_id
    assert sum(law.values()) == 1
    for y, pr in law.items():
        assert 1 <= len(y) <= n and eos not in y[:-1] and (len(y) == n or y[-1] == eos)
        prod: Prob = F(1)
        for i, t in enumerate(y):
            p = w.target.next_probs(base + y[:i])
            prod *= F(int(t == argmax(p))) if greedy else p[t]
        assert pr == prod and pr > 0


@SOME
@given(world_strategy(), st.integers(1, 3), st.booleans())
def test_ar_full_law(w: World, n: int, greedy: bool) -> None:
    """AR's exact output law equals target_law."""
    assert_lossless(AR(greedy=greedy), w, n)


@MANY
@given(tokenizers(), st.text("abc", max_size=8))
def test_tokenizer_contract(tok: Tokenizer, text: str) -> None:
    """The toy tokenizers satisfy the assumptions the proofs use: encode is a function (canonical,
    deterministic), decode(encode(s)) == s, every character is a token."""
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode(text) == tok.encode(text)
    assert all(c in tok.vocab for c in "abc")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))
