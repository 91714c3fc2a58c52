"""Named small worlds: the built-in world of ``hsd audit`` and worlds built from compact specs.

A spec is plain data, so a counterexample that Hypothesis shrank can be written down and rebuilt
exactly: see :func:`from_spec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .models import CharSource, FunctionModel, Model, induced_model, random_model
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
    """``{"random": seed, "zero_prob": z, "eos_weight": w}``, optionally with
    ``"outside_factor": f`` (weights of tokens not in ``other`` multiplied by ``f``)."""
    base = random_model(tok.vocab, tok, int(spec["random"]), zero_prob=float(spec.get("zero_prob", 0.0)),
                        eos_weight=spec.get("eos_weight"))
    f = spec.get("outside_factor")
    if f is None:
        return base
    assert other is not None
    inside = [s in other for s in tok.vocab.tokens] + [True]

    def law(ctx: tuple[int, ...]) -> list[Fraction]:
        p = base.next_probs(ctx)
        w = [Fraction(x) * (1 if inside[i] else int(f)) for i, x in enumerate(p)]
        t = sum(w)
        return [x / t for x in w]

    return FunctionModel(tok.vocab, tok, law)


def from_spec(spec: Mapping[str, Any]) -> tuple[Model, Model, str]:
    """Build ``(target, drafter, prompt)`` from ``{"target": {tok..., model...}, "drafter": {...},
    "prompt": str}``; a drafter spec without ``"tokens"`` shares the target's vocabulary."""
    t_spec, d_spec = spec["target"], spec["drafter"]
    t_tok = tokenizer_from_spec(t_spec)
    target = model_from_spec(t_tok, t_spec)
    d_tok = tokenizer_from_spec(d_spec) if "tokens" in d_spec else LongestMatchTokenizer(t_tok.vocab)
    drafter = model_from_spec(d_tok, d_spec, t_tok.vocab)
    return target, drafter, str(spec.get("prompt", ""))


