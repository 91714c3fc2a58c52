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
from .laws import is_exact
from .methods.base import Method, RoundOutcome, State, check_method, check_run_args
from .models import Model, checked
from .rand import CostLimitError, Enumerator, Rand

Sequence_ = tuple[int, ...]
OutputLaw = dict[Sequence_, Prob]


DEFAULT_MAX_CALLS = 1_000_000
"""Default limit on the round executions one exact analysis may make (``max_calls``): about a
minute of enumeration. Above it (or when the growth measured so far projects past it) the engine
raises :class:`~hsd_core.rand.CostLimitError` instead of running for hours."""


def _models(method: object, target: object, drafter: object) -> tuple[Method, Model, Model | None]:
    m = check_method(method)
    return m, checked(target, "target"), None if drafter is None else checked(drafter, "drafter")


def round_law(method: Method, target: Model, drafter: Model | None, state: State,
              max_calls: int | None = None) -> dict[RoundOutcome, Prob]:
    """Exact law of one round of ``method`` from ``state`` (outcomes already truncated).

    With ``max_calls``, :class:`~hsd_core.rand.CostLimitError` past that many executions."""
    method, target, drafter = _models(method, target, drafter)

    def run(rand: Rand) -> RoundOutcome:
        return method.run_round(target, drafter, state, rand)

    return Enumerator().law(run, max_calls)


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


def _check_max_calls(max_calls: int) -> int:
    if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1:
        raise ValueError(f"max_calls must be an integer >= 1, got {max_calls!r}")
    return max_calls


def _too_costly(what: str, used: int, projected: float, max_calls: int, growth: float, done: int,
                max_new_tokens: int) -> CostLimitError:
    est = "" if projected <= used else (f"; at x{growth:.1f} per extra token it projects to about "
                                       f"{projected:.3g} in all")
    return CostLimitError(
        f"{what}: {used} round executions for the first {done} of {max_new_tokens} tokens{est}, over "
        f"max_calls={max_calls}. The cost grows geometrically with max_new_tokens (and with the "
        f"lookahead): lower max_new_tokens (now {max_new_tokens}) or the method's lookahead, or pass "
        f"a larger max_calls if you mean to wait")


def analyze(
    method: Method, target: Model, drafter: Model | None, prompt: str, max_new_tokens: int,
    max_calls: int = DEFAULT_MAX_CALLS,
) -> Analysis:
    """Exact law and expected cost of ``method.generate(target, drafter, prompt, max_new_tokens)``.

    The cost is bounded: past ``max_calls`` round executions, or as soon as the growth per
    emitted token measured so far projects past it, :class:`~hsd_core.rand.CostLimitError` says
    what to lower. Models of any class are validated (:func:`~hsd_core.models.checked`)."""
    method, target, drafter = _models(method, target, drafter)
    check_run_args(target, prompt, max_new_tokens)
    method.check_models(target, drafter)
    max_calls = _check_max_calls(max_calls)
    used = 0
    level_calls: list[int] = []
    eos = target.vocab.eos_id
    one: Prob = Fraction(1)
    pending: dict[Sequence_, Prob] = {(): one}
    law: OutputLaw = {}
    calls: Prob = Fraction(0)
    first: dict[RoundOutcome, Prob] = {}
    what = f"exact analysis of {method!r}"
    while pending:
        shortest = min(len(s) for s in pending)
        level = [s for s in pending if len(s) == shortest]
        here = 0
        for prefix in level:
            prob = pending.pop(prefix)
            if len(prefix) >= max_new_tokens or (prefix and prefix[-1] == eos):
                law[prefix] = law.get(prefix, 0) + prob
                continue
            calls += prob
            enum = Enumerator()
            state = State(prompt, prefix, max_new_tokens)

            def run(rand: Rand, state: State = state) -> RoundOutcome:
                return method.run_round(target, drafter, state, rand)

            try:
                rl = enum.law(run, max_calls - used)
            except CostLimitError:
                raise _too_costly(what, max_calls, 0, max_calls, 0.0, shortest, max_new_tokens) from None
            used += enum.calls
            here += enum.calls
            if not prefix:
                first = rl
            for outcome, w in rl.items():
                nxt = prefix + outcome.tokens
                pending[nxt] = pending.get(nxt, 0) + prob * w
        if here:
            level_calls.append(here)
        if len(level_calls) >= 2 and pending:
            growth = max(1.0, level_calls[-1] / level_calls[-2])
            left = max_new_tokens - shortest - 1
            projected = used + sum(level_calls[-1] * growth ** j for j in range(1, left + 1))
            if projected > max_calls:
                raise _too_costly(what, used, projected, max_calls, growth, shortest + 1, max_new_tokens)
    zero: Prob = Fraction(0)
    expected = sum((len(s) * p for s, p in law.items()), zero)
    return Analysis(law, expected, calls, first)


def output_law(
    method: Method, target: Model, drafter: Model | None, prompt: str, max_new_tokens: int,
    max_calls: int = DEFAULT_MAX_CALLS,
) -> OutputLaw:
    """Exact law of the tuple of target ids that ``method`` emits (up to ``max_new_tokens``,
    stopping after EOS). Keys are tuples of target ids; values Fractions for exact models.
    ``max_calls`` bounds the cost (:func:`analyze`)."""
    return analyze(method, target, drafter, prompt, max_new_tokens, max_calls).law


def target_law(target: Model, prompt: str, max_new_tokens: int, greedy: bool = False,
               max_calls: int = DEFAULT_MAX_CALLS) -> OutputLaw:
    """The reference: law of autoregressive decoding from ``target`` alone.

    Computed directly from ``target.next_probs`` (independently of any method code); greedy gives
    the one sequence of argmax tokens (ties to the lowest id) with probability 1. Past
    ``max_calls`` target evaluations, :class:`~hsd_core.rand.CostLimitError`.
    """
    target = checked(target, "target")
    check_run_args(target, prompt, max_new_tokens)
    max_calls = _check_max_calls(max_calls)
    if not isinstance(greedy, bool):
        raise TypeError(f"greedy must be True or False, got {greedy!r}")
    evaluations = 0
    eos = target.vocab.eos_id
    base = tuple(target.tokenizer.encode(prompt))
    frontier: dict[Sequence_, Prob] = {(): Fraction(1)}
    law: OutputLaw = {}
    previous = 0
    depth = 0
    while frontier:
        nxt: dict[Sequence_, Prob] = {}
        live = sum(1 for s in frontier if not (len(s) >= max_new_tokens or (s and s[-1] == eos)))
        growth = max(1.0, live / previous) if previous else 1.0
        projected = evaluations + sum(live * growth ** j for j in range(max_new_tokens - depth))
        if evaluations + live > max_calls or projected > max_calls:
            raise CostLimitError(
                f"target_law: {evaluations + live} target evaluations for the first {depth + 1} of "
                f"{max_new_tokens} tokens" + (f", projected about {projected:.3g} at x{growth:.1f} per token"
                                              if projected > evaluations + live else "")
                + f", over max_calls={max_calls} (the number of sequences grows geometrically with "
                "max_new_tokens): lower max_new_tokens or pass a larger max_calls")
        previous = live
        depth += 1
        for prefix, prob in frontier.items():
            if len(prefix) >= max_new_tokens or (prefix and prefix[-1] == eos):
                law[prefix] = prob
                continue
            evaluations += 1
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
    """Total variation distance ``1/2 sum |a - b|`` (exact for Fraction laws) between two output
    laws (``Mapping``s from sequences to probabilities, as :func:`output_law` returns);
    ``TypeError`` for anything else."""
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, Mapping):
            raise TypeError(f"total_variation takes two output laws (dicts {{sequence: probability}}); "
                            f"{name} is a {type(x).__name__}")
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


FLOAT_TV_TOL = 1e-9
"""Float laws (models with ``exact=False``) are equal when their TV is at most this (rounding of
float64 arithmetic over short sequences is far below it); exact laws must be equal."""


def _all_exact(law: Mapping[Sequence_, Prob]) -> bool:
    return is_exact(tuple(law.values()))


def assert_laws_equal(law: Mapping[Sequence_, Prob], reference: Mapping[Sequence_, Prob], what: str = "method",
                      tol: float | None = None) -> None:
    """Raise :class:`LossyError` naming the first differing sequence and both probabilities
    ("method gives <law's>, target gives <reference's>").

    Exact laws (all ``Fraction``) must be equal. When either law holds floats, rounding makes
    equality meaningless: they are compared by TV within ``tol`` (default :data:`FLOAT_TV_TOL`),
    and the message says so; use exact models for a proof."""
    if tol is not None and (isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 <= tol < 1):
        raise ValueError(f"tol must be a TV distance in [0, 1), got {tol!r}")
    exact = _all_exact(law) and _all_exact(reference) and tol is None
    tv = total_variation(law, reference)
    if exact:
        d = first_difference(law, reference)
        if d is None:
            return
    else:
        limit = FLOAT_TV_TOL if tol is None else float(tol)
        if float(tv) <= limit:
            return
        d = first_difference(law, reference)
        assert d is not None
    seq, pa, pb = d
    how = "" if exact else (f" (float laws, compared within TV {FLOAT_TV_TOL if tol is None else tol:g}; "
                            "exact models give an exact verdict)")
    raise LossyError(
        f"{what} is lossy: TV = {tv}{how}; first differing sequence "
        f"{seq}: method gives {pa}, target gives {pb}"
    )


def assert_lossless(
    method: Method, target: Model, drafter: Model | None, prompt: str, max_new_tokens: int,
    tol: float | None = None, max_calls: int = DEFAULT_MAX_CALLS,
) -> None:
    """Assert that ``method``'s exact output law equals the target's (greedy: same tokens).

    Exact models: equality of rationals. Float models (``random_model(..., exact=False)``): the
    two float laws within TV ``tol`` (default :data:`FLOAT_TV_TOL`); see :func:`assert_laws_equal`.
    """
    method = check_method(method)
    law = output_law(method, target, drafter, prompt, max_new_tokens, max_calls)
    ref = target_law(target, prompt, max_new_tokens, greedy=method.greedy, max_calls=max_calls)
    assert_laws_equal(law, ref, what=f"{method!r} on prompt {prompt!r}", tol=tol)
