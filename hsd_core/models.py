"""Toy language models behind one protocol: ``next_probs(context_ids) -> law``.

A model's context is a tuple of ids of its *own* vocabulary: its encoding of the prompt followed by
what has been emitted (there is no BOS in the toy world). ``next_probs`` returns a validated law
with one entry per id, EOS included: Fractions for exact models, floats for float64 models.
Models are deterministic functions of the context, so laws are cached per context.

Families: :class:`FunctionModel` (any callable), :class:`TableModel` (explicit table),
:func:`random_model` (seeded pseudo-random rational laws per context), and :func:`induced_model`
(laws induced from a shared character-level :class:`CharSource`, so that models with different
vocabularies approximate one another), plus :func:`relabeled` (the same model over a vocabulary
with the same strings in another order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Protocol, runtime_checkable

import numpy as np

from .laws import InvalidLawError, Law, as_law
from .tokenizers import Tokenizer
from .vocab import Vocabulary, check_id

Context = tuple[int, ...]


@runtime_checkable
class Model(Protocol):
    """A next-token model over ``vocab`` whose contexts are ``tokenizer``'s ids."""

    @property
    def vocab(self) -> Vocabulary: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    def next_probs(self, context_ids: Sequence[int]) -> Law: ...


def _check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class BaseModel:
    """Validation and caching around a ``_law(ctx)`` that subclasses provide.

    ``next_probs`` rejects contexts with unknown ids or an EOS (nothing follows EOS), and laws that
    are not probability vectors (:class:`~hsd_core.laws.InvalidLawError`). ``evaluations`` counts
    the distinct contexts evaluated (cache misses), i.e. the forward passes a real model would need.
    """

    def __init__(self, vocab: Vocabulary, tokenizer: Tokenizer) -> None:
        if not isinstance(vocab, Vocabulary):
            raise TypeError("model needs a Vocabulary")
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"model needs a Tokenizer (with vocab, encode, decode), got {type(tokenizer).__name__}")
        if tokenizer.vocab != vocab:
            raise ValueError("the tokenizer's vocabulary is not the model's vocabulary")
        self._vocab = vocab
        self._tokenizer = tokenizer
        self._cache: dict[Context, Law] = {}
        self.evaluations = 0

    @property
    def vocab(self) -> Vocabulary:
        return self._vocab

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def _law(self, ctx: Context) -> Sequence[object]:
        raise NotImplementedError

    def next_probs(self, context_ids: Sequence[int]) -> Law:
        """The law of the next id given ``context_ids`` (a sequence of this model's ids)."""
        ctx = tuple(int(i) for i in context_ids)
        hit = self._cache.get(ctx)
        if hit is not None:
            return hit
        n = len(self._vocab)
        for i in ctx:
            if not 0 <= i < n:
                raise ValueError(f"context id {i} is not in the vocabulary (ids 0..{n - 1})")
            if i == self._vocab.eos_id:
                raise ValueError("context contains EOS; nothing follows the end of a sequence")
        law = as_law(self._law(ctx), n, where=f"{type(self).__name__}.next_probs{ctx}")
        self._cache[ctx] = law
        self.evaluations += 1
        return law


class FunctionModel(BaseModel):
    """A model given by any callable ``fn(ctx_tuple) -> law`` (validated at every call)."""

    def __init__(self, vocab: Vocabulary, tokenizer: Tokenizer, fn: Callable[[Context], Sequence[object]]) -> None:
        super().__init__(vocab, tokenizer)
        self._fn = fn

    def _law(self, ctx: Context) -> Sequence[object]:
        return self._fn(ctx)


class TableModel(BaseModel):
    """Laws from an explicit table ``{ctx_tuple: law}``, with ``default`` for other contexts.

    All table entries are validated at construction. A context missing from the table with no
    default raises ``KeyError``.
    """

    def __init__(
        self,
        vocab: Vocabulary,
        tokenizer: Tokenizer,
        table: Mapping[Sequence[int], Sequence[object]],
        default: Sequence[object] | None = None,
    ) -> None:
        super().__init__(vocab, tokenizer)
        n = len(vocab)
        if not isinstance(table, Mapping):
            raise TypeError(f"table must be a dict {{context tuple: law}}, got {type(table).__name__}")
        self._table: dict[Context, Law] = {}
        for k, v in table.items():
            if isinstance(k, (str, bytes)) or not isinstance(k, Sequence):
                raise TypeError(f"table key {k!r} is not a context: use a tuple of ids, e.g. {{(): law, (0,): law}}")
            ctx = tuple(check_id(i) for i in k)
            self._table[ctx] = as_law(v, n, where=f"table[{ctx}]")
        self._default = None if default is None else as_law(default, n, where="default law")

    def _law(self, ctx: Context) -> Sequence[object]:
        if ctx in self._table:
            return self._table[ctx]
        if self._default is None:
            raise KeyError(f"no law for context {ctx} and no default")
        return self._default


class RandomModel(BaseModel):
    """Seeded pseudo-random laws, one per context, from integer weights (see :func:`random_model`)."""

    def __init__(
        self,
        vocab: Vocabulary,
        tokenizer: Tokenizer,
        seed: int,
        exact: bool = True,
        max_weight: int = 6,
        zero_prob: float = 0.3,
        eos_weight: int | None = None,
    ) -> None:
        super().__init__(vocab, tokenizer)
        seed = _check_int(seed, "seed", 0)
        max_weight = _check_int(max_weight, "max_weight", 1)
        if eos_weight is not None:
            eos_weight = _check_int(eos_weight, "eos_weight", 0)
        if isinstance(zero_prob, bool) or not isinstance(zero_prob, (int, float, np.integer, np.floating)) \
                or not 0.0 <= zero_prob < 1.0:
            raise ValueError(f"zero_prob must be a number in [0, 1), got {zero_prob!r}")
        if not isinstance(exact, (bool, np.bool_)):
            raise TypeError(f"exact must be a bool, got {exact!r}")
        exact = bool(exact)
        self.seed, self.exact, self.max_weight, self.zero_prob, self.eos_weight = (
            seed, exact, max_weight, zero_prob, eos_weight)

    def weights(self, ctx: Context) -> list[int]:
        """The integer weights behind the law at ``ctx`` (at least one positive)."""
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, len(ctx), *ctx]))
        n = len(self._vocab)
        w = [int(x) for x in rng.integers(1, self.max_weight + 1, size=n)]
        zeros = rng.random(n) < self.zero_prob
        w = [0 if z else x for x, z in zip(w, zeros)]
        if self.eos_weight is not None:
            w[-1] = self.eos_weight
        if sum(w) == 0:
            w[int(rng.integers(0, n))] = 1
        return w

    def _law(self, ctx: Context) -> Sequence[object]:
        w = self.weights(ctx)
        total = sum(w)
        if self.exact:
            return [Fraction(x, total) for x in w]
        return [x / total for x in w]


def random_model(
    vocab: Vocabulary,
    tokenizer: Tokenizer,
    seed: int,
    exact: bool = True,
    max_weight: int = 6,
    zero_prob: float = 0.3,
    eos_weight: int | None = None,
) -> RandomModel:
    """A context-dependent model with pseudo-random laws, reproducible from ``seed``.

    At each context, every id gets an integer weight in ``1..max_weight``, is zeroed with
    probability ``zero_prob``, and the weights are normalized (Fractions if ``exact``, else floats).
    ``eos_weight`` fixes EOS's weight (0 means EOS never occurs). The law depends on the seed and
    on the whole context. ``seed``, ``max_weight`` and ``eos_weight`` must be integers (``seed``
    and ``eos_weight`` >= 0, ``max_weight`` >= 1), else ``ValueError``.
    """
    return RandomModel(vocab, tokenizer, seed, exact, max_weight, zero_prob, eos_weight)


END = ""  # the CharSource's end-of-text symbol


class CharSource:
    """A character-level process: ``next_char_probs(text)`` is a law over ``alphabet`` + END.

    The law is given by integer weights ``weights[(previous char or "")] -> [w per char..., w_end]``
    (an order-1 Markov chain; ``""`` is the start state), exact Fractions.
    """

    def __init__(self, alphabet: Sequence[str], weights: Mapping[str, Sequence[int]]) -> None:
        self.alphabet = tuple(alphabet)
        if not self.alphabet or any(len(c) != 1 for c in self.alphabet):
            raise ValueError("alphabet must be a non-empty sequence of single characters")
        self._laws: dict[str, tuple[Fraction, ...]] = {}
        for state in ("", *self.alphabet):
            if state not in weights:
                raise ValueError(f"CharSource: no weights for state {state!r}")
            w = [int(x) for x in weights[state]]
            if len(w) != len(self.alphabet) + 1 or any(x < 0 for x in w) or sum(w) == 0:
                raise ValueError(f"CharSource: bad weights for state {state!r}: {w}")
            t = sum(w)
            self._laws[state] = tuple(Fraction(x, t) for x in w)

    @classmethod
    def random(cls, alphabet: Sequence[str], seed: int, max_weight: int = 6, end_weight: int = 1) -> CharSource:
        """A seeded random order-1 source; END has weight ``end_weight`` in every state."""
        rng = np.random.default_rng(seed)
        weights = {s: [int(x) for x in rng.integers(0, max_weight + 1, size=len(alphabet))] + [end_weight]
                   for s in ("", *alphabet)}
        for w in weights.values():
            if sum(w) == 0:
                w[0] = 1
        return cls(alphabet, weights)

    def next_char_probs(self, text: str) -> tuple[Fraction, ...]:
        """Law of the next character (last entry: END) after ``text``."""
        return self._laws[text[-1] if text else ""]

    def prob_continues(self, text: str, s: str) -> Fraction:
        """Probability that the source, having produced ``text``, produces ``s`` next."""
        prob = Fraction(1)
        for c in s:
            if c not in self.alphabet:
                return Fraction(0)
            prob *= self.next_char_probs(text)[self.alphabet.index(c)]
            text += c
        return prob


class InducedModel(BaseModel):
    """Token laws induced from a :class:`CharSource` (see :func:`induced_model`)."""

    def __init__(self, vocab: Vocabulary, tokenizer: Tokenizer, source: CharSource, exact: bool = True) -> None:
        super().__init__(vocab, tokenizer)
        missing = [c for c in vocab.alphabet if c not in source.alphabet]
        if missing:
            raise ValueError(f"the source does not produce characters {missing!r}")
        self.source = source
        self.exact = exact

    def _law(self, ctx: Context) -> Sequence[object]:
        text = self._tokenizer.decode(ctx)
        w = [self.source.prob_continues(text, s) for s in self._vocab.tokens]
        w.append(self.source.next_char_probs(text)[-1])
        total = sum(w)
        if total == 0:
            raise InvalidLawError(f"source gives no token any mass after {text!r}")
        law = [x / total for x in w]
        return law if self.exact else [float(x) for x in law]


def induced_model(vocab: Vocabulary, tokenizer: Tokenizer, source: CharSource, exact: bool = True) -> InducedModel:
    """A model whose law at a context is proportional to the source's probability of each token.

    With text ``s = decode(ctx)``, token ``t`` gets weight ``P_source(next chars = t | s)`` and EOS
    gets ``P_source(END | s)``, normalized. Two models induced from one source over different
    vocabularies put similar mass on similar text, so one drafts well for the other.
    """
    return InducedModel(vocab, tokenizer, source, exact)


class RelabeledModel(BaseModel):
    """``base``'s law moved onto another vocabulary that holds the same distinct strings."""

    def __init__(self, base: Model, vocab: Vocabulary, tokenizer: Tokenizer) -> None:
        super().__init__(vocab, tokenizer)
        bv = base.vocab
        if len(set(bv.tokens)) != len(bv.tokens) or len(set(vocab.tokens)) != len(vocab.tokens):
            raise ValueError("relabeling needs vocabularies without duplicate strings")
        if set(bv.tokens) != set(vocab.tokens):
            raise ValueError("relabeling needs vocabularies with the same token strings")
        self.base = base
        self._to_base = [bv.id_of(s) for s in vocab.tokens] + [bv.eos_id]

    def _law(self, ctx: Context) -> Sequence[object]:
        p = self.base.next_probs(tuple(self._to_base[i] for i in ctx))
        return [p[j] for j in self._to_base]


def relabeled(base: Model, vocab: Vocabulary, tokenizer: Tokenizer) -> RelabeledModel:
    """The same model as ``base`` over ``vocab`` (same strings, other ids): a drafter equal to the
    target with another vocabulary."""
    return RelabeledModel(base, vocab, tokenizer)


class CheckedModel:
    """A :class:`Model` that is not a :class:`BaseModel`, with every law it returns validated.

    ``next_probs`` passes the context through and checks the result with
    :func:`~hsd_core.laws.as_law` (length ``len(vocab)``, numbers, non-negative, sum 1), so that a
    model of any class that returns a malformed law raises
    :class:`~hsd_core.laws.InvalidLawError` instead of producing ids that do not exist. The methods
    and the exact engine wrap the models they are given with :func:`checked`.
    """

    def __init__(self, model: Model) -> None:
        self.model = model
        self._n = len(model.vocab)

    @property
    def vocab(self) -> Vocabulary:
        return self.model.vocab

    @property
    def tokenizer(self) -> Tokenizer:
        return self.model.tokenizer

    def next_probs(self, context_ids: Sequence[int]) -> Law:
        ctx = tuple(context_ids)
        return as_law(self.model.next_probs(ctx), self._n, where=f"{type(self.model).__name__}.next_probs{ctx}")

    def __getattr__(self, name: str) -> object:  # anything else the model offers (counters, ...)
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)

    def __repr__(self) -> str:
        return f"checked({self.model!r})"


_CHECKED: dict[int, CheckedModel] = {}


def checked(model: object, role: str = "model") -> Model:
    """``model`` itself when it validates its own laws (a :class:`BaseModel`), else a (cached)
    :class:`CheckedModel` around it. Raises ``TypeError`` when ``model`` is not a model at all
    (``role`` names it in the message: "target", "drafter")."""
    if isinstance(model, (BaseModel, CheckedModel)):
        return model
    if not isinstance(model, Model):
        raise TypeError(
            f"the {role} is a {type(model).__name__}, not a model: a model has .vocab (a Vocabulary), "
            ".tokenizer and .next_probs(context_ids) (see hsd_core.models.Model, or build one with "
            "hsd_core.toy.FunctionModel)")
    if not isinstance(model.vocab, Vocabulary):
        raise TypeError(f"the {role}'s .vocab is a {type(model.vocab).__name__}, not a hsd_core Vocabulary")
    hit = _CHECKED.get(id(model))
    if hit is not None and hit.model is model:
        return hit
    if len(_CHECKED) > 1024:
        _CHECKED.clear()
    _CHECKED[id(model)] = wrapper = CheckedModel(model)
    return wrapper


def uniform_law(n: int) -> Law:
    """The exact uniform law on ``n`` ids."""
    return tuple(Fraction(1, n) for _ in range(n))


def point_law(n: int, i: int) -> Law:
    """The exact one-hot law on id ``i`` of ``n``."""
    return tuple(Fraction(int(j == i)) for j in range(n))


