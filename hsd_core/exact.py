"""The exact law engine: output laws of methods, the target's own law, and their comparison.

A method's round depends only on its :class:`~hsd_core.methods.base.State` (prompt, emitted
prefix, budget). The law of the first ``max_new_tokens`` target ids (or up to EOS) is therefore
built by dynamic programming over emitted prefixes, shortest first: each prefix's round is
enumerated once (:class:`~hsd_core.rand.Enumerator`) and its outcomes extend the prefix. With exact
models every probability is a ``Fraction``, and losslessness is an equality of rationals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from .laws import Prob, argmax
from .methods.base import Method, RoundOutcome, State, check_run_args
from .models import Model
from .rand import Enumerator, Rand

Sequence_ = tuple[int, ...]
OutputLaw = dict[Sequence_, Prob]


def round_law(method: Method, target: Model, drafter: Model | None, state: State) -> dict[RoundOutcome, Prob]:
    """Exact law of one round of ``method`` from ``state`` (outcomes already truncated)."""

    def run(rand: Rand) -> RoundOutcome:
        return method.run_round(target, drafter, state, rand)

    return Enumerator().law(run)


@dataclass
class Analysis:
    """Exact law of a generation together with what it cost.

    ``law`` maps emitted id tuples to probabilities; ``expected_tokens`` is E[#emitted ids];
    ``expected_target_calls`` is E[#rounds] (one target forward pass per round);
    ``first_round`` is the law of the first round's outcome.
    """

    law: OutputLaw
    expected_tokens: Prob
    expected_target_calls: Prob
    first_round: dict[RoundOutcome, Prob] = field(default_factory=dict)

    @property
    def tokens_per_call(self) -> Prob:
        """Expected emitted target ids per target call, E[tokens] / E[calls]."""
        return self.expected_tokens / self.expected_target_calls

    @property
    def first_acceptance(self) -> Prob:
        """Probability that the first round accepts at least its first proposal."""
        zero: Prob = Fraction(0)
        return sum((p for o, p in self.first_round.items() if o.accepted >= 1), zero)


def analyze(
    method: Method, target: Model, drafter: Model | None, prompt: str, max_new_tokens: int
) -> Analysis:
    """Exact law and expected cost of ``method.generate(target, drafter, prompt, max_new_tokens)``."""
    check_run_args(target, prompt, max_new_tokens)
    method.check_models(target, drafter)
    eos = target.vocab.eos_id
    one: Prob = Fraction(1)
    pending: dict[Sequence_, Prob] = {(): one}
    law: OutputLaw = {}
    calls: Prob = Fraction(0)
    first: dict[RoundOutcome, Prob] = {}
    while pending:
        shortest = min(len(s) for s in pending)
        level = [s for s in pending if len(s) == shortest]
        for prefix in level:
            prob = pending.pop(prefix)
            if len(prefix) >= max_new_tokens or (prefix and prefix[-1] == eos):
                law[prefix] = law.get(prefix, 0) + prob
                continue
            calls += prob
            rl = round_law(method, target, drafter, State(prompt, prefix, max_new_tokens))
            if not prefix:
                first = rl
            for outcome, w in rl.items():
                nxt = prefix + outcome.tokens
                pending[nxt] = pending.get(nxt, 0) + prob * w
    zero: Prob = Fraction(0)
    expected = sum((len(s) * p for s, p in law.items()), zero)
    return Analysis(law, expected, calls, first)


def output_law(
    method: Method, target: Model, drafter: Model | None, prompt: str, max_new_tokens: int
) -> OutputLaw:
    """Exact law of the tuple of target ids that ``method`` emits (up to ``max_new_tokens``,
    stopping after EOS). Keys are tuples of target ids; values Fractions for exact models."""
    return analyze(method, target, drafter, prompt, max_new_tokens).law


def target_law(target: Model, prompt: str, max_new_tokens: int, greedy: bool = False) -> OutputLaw:
    """The reference: law of autoregressive decoding from ``target`` alone.

    Computed directly from ``target.next_probs`` (independently of any method code); greedy gives
    the one sequence of argmax tokens (ties to the lowest id) with probability 1.
    """
    check_run_args(target, prompt, max_new_tokens)
    eos = target.vocab.eos_id
    base = tuple(target.tokenizer.encode(prompt))
    frontier: dict[Sequence_, Prob] = {(): Fraction(1)}
    law: OutputLaw = {}
    while frontier:
        nxt: dict[Sequence_, Prob] = {}
        for prefix, prob in frontier.items():
            if len(prefix) >= max_new_tokens or (prefix and prefix[-1] == eos):
                law[prefix] = prob
                continue
            p = target.next_probs(base + prefix)
            if greedy:
                nxt[prefix + (argmax(p),)] = prob
                continue
            for t, pt in enumerate(p):
                if pt > 0:
                    nxt[prefix + (t,)] = prob * pt
        frontier = nxt
    return law


def total_variation(a: Mapping[Sequence_, Prob], b: Mapping[Sequence_, Prob]) -> Prob:
    """Total variation distance ``1/2 sum |a - b|`` (exact for Fraction laws)."""
    zero: Prob = Fraction(0)
    keys = set(a) | set(b)
    total: Prob = zero
    for k in keys:
        d = a.get(k, zero) - b.get(k, zero)
        total += d if d >= 0 else -d
    return total / 2


def first_difference(a: Mapping[Sequence_, Prob], b: Mapping[Sequence_, Prob]) -> tuple[Sequence_, Prob, Prob] | None:
    """The shortest (then lexicographically first) sequence whose probabilities differ, or None."""
    zero: Prob = Fraction(0)
    diff = [k for k in set(a) | set(b) if a.get(k, zero) != b.get(k, zero)]
    if not diff:
        return None
    k = min(diff, key=lambda s: (len(s), s))
    return k, a.get(k, zero), b.get(k, zero)


class LossyError(AssertionError):
    """A method's exact law differs from the target's."""


def assert_laws_equal(law: Mapping[Sequence_, Prob], reference: Mapping[Sequence_, Prob], what: str = "method") -> None:
    """Raise :class:`LossyError` naming the first differing sequence and both probabilities."""
    d = first_difference(law, reference)
    if d is None:
        return
    seq, pa, pb = d
    raise LossyError(
        f"{what} is lossy: TV = {total_variation(law, reference)}; first differing sequence "
        f"{seq}: method gives {pa}, target gives {pb}"
    )


def assert_lossless(
    method: Method, target: Model, drafter: Model | None, prompt: str, max_new_tokens: int
) -> None:
    """Assert that ``method``'s exact output law equals the target's (greedy: same tokens)."""
    law = output_law(method, target, drafter, prompt, max_new_tokens)
    ref = target_law(target, prompt, max_new_tokens, greedy=method.greedy)
    assert_laws_equal(law, ref, what=f"{method!r} on prompt {prompt!r}")
