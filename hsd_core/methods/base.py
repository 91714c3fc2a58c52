"""What every decoding method shares: the round contract, generation, and rejection verification.

A method is a stateless object whose :meth:`Method.step` runs **one round** (one target forward
pass) from a :class:`State` (the prompt and the target ids emitted so far) and returns a
:class:`RoundOutcome`. All randomness goes through a :class:`~hsd_core.rand.Rand`, so the same
``step`` is sampled by :meth:`Method.generate` and enumerated exactly by :mod:`hsd_core.exact`.
A round may depend only on its state: anything derived across rounds (the drafter's context) is
recomputed from the emitted prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..laws import Law, Prob, argmax, residual
from ..models import Model, checked
from ..rand import NumpyRand, Rand, RngLike, as_generator


@dataclass(frozen=True)
class State:
    """Where a round starts: the prompt text, the target ids emitted so far, the token budget."""

    prompt: str
    emitted: tuple[int, ...]
    max_new_tokens: int

    @property
    def budget(self) -> int:
        """How many more target ids may be emitted (>= 1 at the start of a round)."""
        return self.max_new_tokens - len(self.emitted)

    def target_context(self, target: Model) -> tuple[int, ...]:
        """The target's context: its encoding of the prompt, then exactly the emitted ids."""
        return tuple(target.tokenizer.encode(self.prompt)) + self.emitted

    def text(self, target: Model) -> str:
        """Prompt plus the decoded emitted ids."""
        return self.prompt + target.tokenizer.decode(self.emitted)


@dataclass(frozen=True)
class RoundOutcome:
    """What one round did: the target ids it emitted, and how many proposals it made and accepted.

    ``proposed`` counts proposed target tokens (drafts mapped to target ids, SLEM's candidates,
    SLRS's proposals); ``accepted`` those kept as they were. The emitted ids are the accepted ones
    followed by at most one token of the target's own (correction or bonus).
    """

    tokens: tuple[int, ...]
    proposed: int = 0
    accepted: int = 0


def truncate(tokens: Sequence[int], budget: int, eos_id: int) -> tuple[int, ...]:
    """``tokens`` cut after the first EOS and to at most ``budget`` ids."""
    out: list[int] = []
    for t in tokens[:budget]:
        out.append(int(t))
        if t == eos_id:
            break
    return tuple(out)


def check_lookahead(lookahead: int) -> int:
    """``lookahead`` as an int >= 1, else ``ValueError``."""
    if isinstance(lookahead, bool) or not isinstance(lookahead, (int, np.integer)) or lookahead < 1:
        raise ValueError(f"lookahead must be an integer >= 1, got {lookahead!r}")
    return int(lookahead)


class _Unset:
    """The type of :data:`_UNSET`, the default of ``generate``'s ``rng`` (not given)."""

    def __repr__(self) -> str:
        return "<rng not given>"


_UNSET = _Unset()


def check_greedy(greedy: object) -> bool:
    """``greedy`` as a bool; ``TypeError`` for anything but a bool (``"no"`` is not False)."""
    if not isinstance(greedy, (bool, np.bool_)):
        raise TypeError(f"greedy must be True or False, got {greedy!r}")
    return bool(greedy)


def check_method(method: object) -> Method:
    """``method`` if it is a :class:`Method` instance, else ``TypeError`` (a class is named)."""
    if isinstance(method, type) and issubclass(method, Method):
        raise TypeError(f"pass a method instance such as {method.__name__}(), not the class {method.__name__}")
    if not isinstance(method, Method):
        raise TypeError(f"{method!r} is not a decoding method (hsd_core.methods.AR(), SD(), SLEM(), TLI(), SLRS())")
    return method


class Method:
    """Base of all decoding methods. Subclasses implement :meth:`step`."""

    name = "method"
    greedy: bool = False

    def step(self, target: Model, drafter: Model | None, state: State, rand: Rand) -> RoundOutcome:
        """Run one round from ``state``; emitted ids are target ids (at most ``state.budget``)."""
        raise NotImplementedError

    def check_models(self, target: Model, drafter: Model | None) -> None:
        """Raise ``ValueError`` when this method cannot run on these models."""
        if drafter is None:
            raise ValueError(f"{self.name} needs a drafter model")

    def run_round(self, target: Model, drafter: Model | None, state: State, rand: Rand) -> RoundOutcome:
        """:meth:`step`, with its tokens cut after EOS and to the budget."""
        out = self.step(target, drafter, state, rand)
        if not out.tokens:
            raise RuntimeError(f"{self.name}: a round emitted no token")
        toks = truncate(out.tokens, state.budget, target.vocab.eos_id)
        return RoundOutcome(toks, out.proposed, out.accepted)

    def generate(
        self,
        target: Model,
        drafter: Model | None,
        prompt: str,
        max_new_tokens: int,
        rng: RngLike | Rand | _Unset = _UNSET,
    ) -> list[int]:
        """Sample up to ``max_new_tokens`` target ids (stopping after EOS) with this method.

        ``rng`` follows SPEC 7: an int seed, a ``numpy.random.Generator``, a ``SeedSequence``, or
        ``None`` (fresh OS entropy); or any :class:`Rand` (``UniformRand`` to replay uniforms).
        Legacy ``RandomState``/``random.Random`` raise ``TypeError``. Leaving ``rng`` out is
        allowed for greedy methods only (a sampling method raises ``ValueError``, so an unseeded
        run is never an accident). Every law the models return is validated, whatever their
        class (:func:`~hsd_core.models.checked`). Returns the list of emitted target ids.
        """
        target = checked(target, "target")
        drafter = None if drafter is None else checked(drafter, "drafter")
        check_run_args(target, prompt, max_new_tokens)
        self.check_models(target, drafter)
        if isinstance(rng, _Unset):
            if not self.greedy:
                raise ValueError("a sampling method needs rng (e.g. rng=0 or np.random.default_rng(0); "
                                 "rng=None for fresh OS entropy)")
            rng = 0
        rand: Rand
        if isinstance(rng, np.random.Generator):
            rand = NumpyRand(rng)
        elif callable(getattr(rng, "categorical", None)) and callable(getattr(rng, "bernoulli", None)):
            rand = rng  # type: ignore[assignment]
        else:
            rand = NumpyRand(as_generator(rng))
        emitted: tuple[int, ...] = ()
        eos = target.vocab.eos_id
        while len(emitted) < max_new_tokens and not (emitted and emitted[-1] == eos):
            emitted += self.run_round(target, drafter, State(prompt, emitted, max_new_tokens), rand).tokens
        return list(emitted)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class HeterogeneousMethod(Method):
    """A method for a drafter with its own vocabulary (SLEM, TLI, SLRS). The two alphabets may
    differ (SLEM, SLRS): a drafted text the target cannot encode proposes nothing
    (:class:`~hsd_core.tokenizers.Unencodable`), and the drafter's context leaves out the characters
    it lacks (:func:`~hsd_core.tokenizers.encode_free`). TLI asks more (:meth:`TLI.check_models`)."""


def check_lookbehind(lookbehind: int) -> int:
    """``lookbehind`` as an int >= 0, else ``ValueError``."""
    if isinstance(lookbehind, bool) or not isinstance(lookbehind, (int, np.integer)) or lookbehind < 0:
        raise ValueError(f"lookbehind must be an integer >= 0, got {lookbehind!r}")
    return int(lookbehind)


def check_run_args(target: Model, prompt: str, max_new_tokens: int) -> None:
    """Validate a prompt (text the target can encode) and a token budget (integer >= 1)."""
    if not isinstance(target, Model):
        raise TypeError(f"the target is a {type(target).__name__}, not a model (.vocab, .tokenizer, .next_probs)")
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    target.tokenizer.encode(prompt)  # raises on characters outside the alphabet
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def check_alphabet_covers(target: Model, drafter: Model) -> None:
    """Raise ``ValueError`` unless every character of the target's alphabet is a drafter token, so
    that any text the target writes can be re-tokenized by the drafter (TLI's re-sync: TLI never
    re-tokenizes drafter text for the target, so the drafter may have more characters)."""
    a, b = set(target.vocab.alphabet), set(drafter.vocab.alphabet)
    if not a <= b:
        raise ValueError(f"the drafter's alphabet lacks target characters {sorted(a - b)}: TLI re-syncs the "
                         "target's text into the drafter, so every target character must be a drafter token")


def sample(law: Sequence[Prob], rand: Rand, greedy: bool) -> int:
    """A draw from ``law``: its argmax (ties to the lowest id) when greedy, else ``rand.categorical``."""
    return argmax(law) if greedy else rand.categorical(law)


class RejectionVerifier:
    """Standard speculative verification (Leviathan et al. 2023; Chen et al. 2023).

    Given draft target ids ``x_1..x_n`` where ``x_j`` was sampled from ``q_j`` (the law it was
    *actually* drawn from, over target ids), it accepts ``x_j`` with probability
    ``min(1, p_j(x_j) / q_j(x_j))``; at the first rejection it emits a correction token from
    ``norm(max(p_j - q_j, 0))``; if all are accepted (and none is EOS) it emits a bonus token from
    ``p_{n+1}``. Greedy: accept while ``x_j`` is the target's argmax, then emit the argmax. The three
    hooks are overridden only by the deliberately lossy variants in :mod:`hsd_core.variants`.
    """

    greedy: bool = False

    def _accept_prob(self, p: Law, q: Law, x: int) -> Prob:
        return min(p[x] / q[x], p[x] - p[x] + 1)

    def _correction_law(self, p: Law, q: Law) -> Law:
        return residual(p, q)

    def _bonus_law(self, p_next: Law, p_last: Law | None) -> Law:
        return p_next

    def verify(
        self,
        target: Model,
        ctx: tuple[int, ...],
        drafts: Sequence[int],
        qs: Sequence[Law],
        rand: Rand,
        budget: int,
    ) -> RoundOutcome:
        """Verify ``drafts`` (target ids, at most ``budget`` of them) after target context ``ctx``."""
        eos = target.vocab.eos_id
        out: list[int] = []
        p: Law | None = None
        for j, (x, q) in enumerate(zip(drafts, qs)):
            p = target.next_probs(ctx + tuple(out))
            if self.greedy:
                ok = argmax(p) == x
            else:
                ok = rand.bernoulli(self._accept_prob(p, q, x))
            if not ok:
                fix = argmax(p) if self.greedy else rand.categorical(self._correction_law(p, q))
                return RoundOutcome(tuple(out) + (fix,), len(drafts), j)
            out.append(x)
            if x == eos or len(out) >= budget:
                return RoundOutcome(tuple(out), len(drafts), j + 1)
        p_next = target.next_probs(ctx + tuple(out))
        bonus = sample(self._bonus_law(p_next, p), rand, self.greedy)
        return RoundOutcome(tuple(out) + (bonus,), len(drafts), len(drafts))


def check_confidence(min_confidence: object) -> Prob | None:
    """``min_confidence`` as ``None`` (no dynamic draft length) or a probability in (0, 1] (an int,
    ``Fraction`` or float), else ``ValueError``/``TypeError``."""
    if min_confidence is None:
        return None
    if isinstance(min_confidence, (bool, np.bool_)) or not isinstance(min_confidence, (int, float, Fraction, np.number)):
        raise TypeError(f"min_confidence must be None or a probability in (0, 1], got {min_confidence!r}")
    value: Prob
    if isinstance(min_confidence, (Fraction, float)):
        value = min_confidence
    elif isinstance(min_confidence, (int, np.integer)):
        value = Fraction(int(min_confidence))
    else:
        value = float(min_confidence)
    if not 0 < value <= 1:
        raise ValueError(f"min_confidence must be None or a probability in (0, 1], got {min_confidence!r}")
    return value


def draft_autoregressive(
    model: Model,
    ctx: tuple[int, ...],
    k: int,
    rand: Rand,
    greedy: bool,
    transform: Callable[[Law], Law | None] | None = None,
    min_confidence: Prob | None = None,
) -> tuple[list[int], list[Law]]:
    """Draft up to ``k`` ids from ``model`` after ``ctx``; returns the ids and the laws drawn from.

    ``transform`` maps the model's law to the law actually sampled (e.g. TLI's renormalization
    onto the intersection); when it returns ``None`` (no mass left) drafting stops early. Drafting
    also stops after the model's EOS. The dynamic draft length: with ``min_confidence``, drafting
    stops before the second and every later draft whose law's largest probability (the drafter's
    confidence in its next token) is below ``min_confidence``; the first draft is always made. The
    stop reads only the drafter's laws, which are functions of the drafts so far.
    """
    drafts: list[int] = []
    laws: list[Law] = []
    eos = model.vocab.eos_id
    for _ in range(k):
        q = model.next_probs(ctx + tuple(drafts))
        qq = q if transform is None else transform(q)
        if qq is None:
            break
        if drafts and min_confidence is not None and max(qq) < min_confidence:
            break
        d = sample(qq, rand, greedy)
        drafts.append(d)
        laws.append(qq)
        if d == eos:
            break
    return drafts, laws

