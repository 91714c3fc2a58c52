"""Named small worlds: the built-in world of ``hsd audit`` and worlds built from compact specs.

A spec is plain data, so a counterexample that Hypothesis shrank can be written down and rebuilt
exactly: see :func:`from_spec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .models import CharSource, FunctionModel, Model, induced_model, random_model, relabeled
from .tokenizers import BPETokenizer, LongestMatchTokenizer, Tokenizer
from .vocab import Vocabulary


@dataclass(frozen=True)
class Worldlet:
    """A target, a drafter over another vocabulary, a same-vocabulary drafter, and a prompt."""

    target: Model
    drafter: Model
    same_vocab_drafter: Model
    prompt: str
    max_new_tokens: int


def builtin_world() -> Worldlet:
    """The world ``hsd audit`` runs on: both models induced from one character source, the target
    over ``[a b c ab bc abc]`` (longest match), the drafter over ``[a b c ca ab cab]`` (BPE)."""
    source = CharSource(["a", "b", "c"], {
        "": [4, 2, 1, 0], "a": [1, 5, 1, 1], "b": [1, 1, 4, 1], "c": [4, 1, 1, 1]})
    tv = Vocabulary(["a", "b", "c", "ab", "bc", "abc"])
    dv = Vocabulary(["a", "b", "c", "ca", "ab", "cab"])
    t_tok = LongestMatchTokenizer(tv)
    d_tok = BPETokenizer(dv, [("c", "a"), ("a", "b"), ("ca", "b")])
    target = induced_model(tv, t_tok, source)
    drafter = induced_model(dv, d_tok, source)
    same = induced_model(tv, LongestMatchTokenizer(tv), CharSource(["a", "b", "c"], {
        "": [3, 2, 1, 0], "a": [1, 4, 1, 1], "b": [1, 1, 3, 1], "c": [3, 1, 1, 1]}))
    return Worldlet(target, drafter, same, "a", 3)


def tokenizer_from_spec(spec: Mapping[str, Any]) -> Tokenizer:
    """``{"tokens": [...], "merges": [[a, b], ...]}`` (BPE) or ``{"tokens": [...]}`` (longest match)."""
    vocab = Vocabulary(list(spec["tokens"]))
    if "merges" in spec:
        return BPETokenizer(vocab, [(str(a), str(b)) for a, b in spec["merges"]])
    return LongestMatchTokenizer(vocab)


def model_from_spec(tok: Tokenizer, spec: Mapping[str, Any], other: Vocabulary | None = None) -> Model:
    """A model from ``{"random": seed, "zero_prob": z, "eos_weight": w}`` plus optional changes:
    ``"outside_factor": f`` (weights of tokens not in ``other`` times ``f``), ``"only_outside":
    True`` (all mass on tokens not in ``other``), ``"support": [strings]`` (mass only on those
    token strings; ``"<eos>"`` names EOS), ``"one_hot": True`` (all mass on the heaviest id)."""
    base = random_model(tok.vocab, tok, int(spec["random"]), zero_prob=float(spec.get("zero_prob", 0.0)),
                        eos_weight=spec.get("eos_weight"))
    vocab = tok.vocab
    n = len(vocab)
    factor = [Fraction(1)] * n
    if "outside_factor" in spec or spec.get("only_outside"):
        assert other is not None, "outside_factor/only_outside need the other vocabulary"
        f = Fraction(int(spec.get("outside_factor", 1)))
        for i, s in enumerate(vocab.tokens):
            if s in other:
                factor[i] = Fraction(0) if spec.get("only_outside") else Fraction(1)
            else:
                factor[i] = f
        if spec.get("only_outside"):
            factor[-1] = Fraction(0)
    if "support" in spec:
        keep = set(spec["support"])
        for i in range(n):
            name = vocab.eos if i == vocab.eos_id else vocab.tokens[i]
            if name not in keep:
                factor[i] = Fraction(0)
    one_hot = bool(spec.get("one_hot"))
    if all(f == 1 for f in factor) and not one_hot:
        return base

    def law(ctx: tuple[int, ...]) -> list[Fraction]:
        w = [Fraction(x) * f for x, f in zip(base.weights(ctx), factor)]
        if sum(w) == 0:  # nothing left: the lowest allowed id gets everything
            w = [Fraction(0)] * n
            w[next(i for i, f in enumerate(factor) if f > 0)] = Fraction(1)
        if one_hot:
            top = max(range(n), key=lambda i: (w[i], -i))
            w = [Fraction(int(i == top)) for i in range(n)]
        t = sum(w)
        return [x / t for x in w]

    return FunctionModel(vocab, tok, law)


def from_spec(spec: Mapping[str, Any]) -> tuple[Model, Model, str]:
    """Build ``(target, drafter, prompt)`` from ``{"target": {tok..., model...}, "drafter": {...},
    "prompt": str}``; a drafter spec without ``"tokens"`` shares the target's vocabulary, and
    ``"relabel_target": True`` makes the drafter the target itself over the drafter's vocabulary."""
    t_spec, d_spec = spec["target"], spec["drafter"]
    t_tok = tokenizer_from_spec(t_spec)
    d_tok = tokenizer_from_spec(d_spec) if "tokens" in d_spec else LongestMatchTokenizer(t_tok.vocab)
    target = model_from_spec(t_tok, t_spec, d_tok.vocab)
    if d_spec.get("relabel_target"):
        drafter: Model = relabeled(target, d_tok.vocab, d_tok)
    else:
        drafter = model_from_spec(d_tok, d_spec, t_tok.vocab)
    return target, drafter, str(spec.get("prompt", ""))


