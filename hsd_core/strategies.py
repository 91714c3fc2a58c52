"""Hypothesis strategies for toy worlds: vocabularies, tokenizers, models and whole worlds.

Everything is built constructively (no filtering): vocabularies always contain every character of
their alphabet, BPE merges always produce vocabulary tokens, and exact laws come from integer
weights. :func:`worlds` reaches the nasty cases the methods must survive: tokens that are prefixes
of others, duplicate strings, tiny or empty intersections, drafter mass mostly or entirely outside
the intersection, a drafter equal to the target over another vocabulary, one-hot laws, disjoint
supports, EOS likely at every position, prompts that end in the middle of a token.

Use with ``@given(world=worlds())``; see ``tests/exact`` for examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from hypothesis import strategies as st

from .models import CharSource, FunctionModel, Model, induced_model, random_model, relabeled
from .tokenizers import BPETokenizer, LongestMatchTokenizer, Tokenizer
from .vocab import Vocabulary

ALPHABET = "abc"


@st.composite
def alphabets(draw: st.DrawFn, min_size: int = 2, max_size: int = 3) -> str:
    """A string of distinct characters (a prefix of ``"abcd"``)."""
    n = draw(st.integers(min_size, max_size))
    return "abcd"[:n]


@st.composite
def vocabularies(draw: st.DrawFn, alphabet: str = ALPHABET, max_extra: int = 3, max_len: int = 3,
                 duplicates: bool = True) -> Vocabulary:
    """A vocabulary over ``alphabet``: every character plus up to ``max_extra`` multi-character
    tokens (ids in a drawn order; a drawn multi-character string may appear twice)."""
    extra = draw(st.lists(st.text(alphabet, min_size=2, max_size=max_len), max_size=max_extra, unique=True))
    toks = list(alphabet) + extra
    if duplicates and extra and draw(st.booleans()):
        toks.append(draw(st.sampled_from(extra)))
    order = draw(st.permutations(toks))
    return Vocabulary(list(order))


@st.composite
def bpe_tokenizers(draw: st.DrawFn, alphabet: str = ALPHABET, max_merges: int = 3, max_len: int = 3) -> BPETokenizer:
    """A BPE tokenizer whose vocabulary is the alphabet plus the results of its merges."""
    toks = list(alphabet)
    merges: list[tuple[str, str]] = []
    for _ in range(draw(st.integers(0, max_merges))):
        a = draw(st.sampled_from(toks))
        b = draw(st.sampled_from([t for t in toks if len(a) + len(t) <= max_len] or list(alphabet)))
        if len(a + b) > max_len:
            continue
        merges.append((a, b))
        if a + b not in toks:
            toks.append(a + b)
    return BPETokenizer(Vocabulary(toks), merges)


@st.composite
def tokenizers(draw: st.DrawFn, alphabet: str = ALPHABET, max_extra: int = 3) -> Tokenizer:
    """A longest-match tokenizer over a drawn vocabulary, or a BPE tokenizer."""
    if draw(st.booleans()):
        return LongestMatchTokenizer(draw(vocabularies(alphabet, max_extra)))
    return draw(bpe_tokenizers(alphabet, max_merges=max_extra))


@st.composite
def models(draw: st.DrawFn, tokenizer: Tokenizer, kind: str | None = None) -> Model:
    """An exact model over ``tokenizer``'s vocabulary: seeded random laws (possibly sparse or
    one-hot, with EOS weight drawn), or a point mass per context."""
    vocab = tokenizer.vocab
    kind = kind or draw(st.sampled_from(["random", "random", "sparse", "eos_heavy", "one_hot"]))
    seed = draw(st.integers(0, 2**16))
    if kind == "random":
        return random_model(vocab, tokenizer, seed, zero_prob=draw(st.sampled_from([0.0, 0.3])))
    if kind == "sparse":
        return random_model(vocab, tokenizer, seed, zero_prob=0.8)
    if kind == "eos_heavy":
        return random_model(vocab, tokenizer, seed, eos_weight=draw(st.integers(4, 12)))
    base = random_model(vocab, tokenizer, seed)
    n = len(vocab)

    def one_hot(ctx: tuple[int, ...]) -> list[Fraction]:
        w = base.weights(ctx)
        top = max(range(n), key=lambda i: (w[i], -i))
        return [Fraction(int(i == top)) for i in range(n)]

    return FunctionModel(vocab, tokenizer, one_hot)


@dataclass(frozen=True)
class World:
    """A target, a drafter (another vocabulary, or the same one) and a prompt."""

    target: Model
    drafter: Model
    prompt: str
    kind: str

    def __repr__(self) -> str:
        return (f"World(kind={self.kind!r}, target_vocab={list(self.target.vocab.tokens)}, "
                f"drafter_vocab={list(self.drafter.vocab.tokens)}, prompt={self.prompt!r}, "
                f"target={self.target!r}, drafter={self.drafter!r})")


def _outside_heavy(base: Model, target_vocab: Vocabulary, factor: int) -> Model:
    """``base`` reweighted so tokens outside ``target_vocab`` get ``factor`` times their weight
    (``factor=0`` with everything outside zeroed is impossible; factor large pushes mass out)."""
    vocab = base.vocab
    inside = [s in target_vocab for s in vocab.tokens] + [True]

    def law(ctx: tuple[int, ...]) -> list[Fraction]:
        p = base.next_probs(ctx)
        w = [Fraction(x) * (1 if inside[i] else factor) for i, x in enumerate(p)]
        t = sum(w)
        return [x / t for x in w]

    return FunctionModel(vocab, base.tokenizer, law)


DRAFTER_ALPHABETS = ("abd", "abcd", "ab", "bd", "d")
"""Drafter alphabets of :func:`worlds` with ``mixed_alphabets=True`` (the target's is ``"abc"``):
characters the target lacks (``d``: the drafter's text it cannot encode), characters the drafter
lacks (``c``: left out of the drafter's context), both, or nothing shared."""


@st.composite
def worlds(draw: st.DrawFn, alphabet: str = ALPHABET, max_extra: int = 3, kind: str | None = None,
           same_vocab: bool = False, mixed_alphabets: bool = False) -> World:
    """A (target, drafter, prompt) world. ``kind`` picks a family (default: drawn):

    ``independent`` (unrelated random laws), ``relabeled`` (drafter = target over the same strings
    in another order), ``induced`` (both induced from one character source), ``outside_heavy``
    (drafter mass mostly outside the intersection), ``disjoint`` (drafter has only characters in
    common with the target plus its own long tokens). ``same_vocab=True`` gives the drafter the
    target's vocabulary (for SD). ``mixed_alphabets=True``: the drafter's alphabet is one of
    :data:`DRAFTER_ALPHABETS` instead of the target's (``alphabet`` must be ``"abc"``; kinds
    ``independent`` and ``outside_heavy`` only), for the string-level methods, which run whatever
    the two alphabets.
    """
    kinds = ["independent", "independent", "relabeled", "induced", "outside_heavy", "disjoint"]
    if mixed_alphabets:
        if alphabet != ALPHABET or same_vocab:
            raise ValueError("mixed_alphabets=True draws drafter alphabets against the target's 'abc' (no same_vocab)")
        kinds = ["independent", "outside_heavy"]
        if kind is not None and kind not in kinds:
            raise ValueError(f"mixed_alphabets=True takes kind None or one of {kinds}, got {kind!r}")
    kind = kind or draw(st.sampled_from(kinds))
    t_tok = draw(tokenizers(alphabet, max_extra))
    target = draw(models(t_tok))
    d_tok: Tokenizer
    if mixed_alphabets:
        d_tok = draw(tokenizers(draw(st.sampled_from(DRAFTER_ALPHABETS)), max_extra))
        drafter = draw(models(d_tok))
        if kind == "outside_heavy":
            drafter = _outside_heavy(drafter, t_tok.vocab, draw(st.sampled_from([5, 100])))
    elif same_vocab:
        d_tok = LongestMatchTokenizer(t_tok.vocab)
        drafter = draw(models(d_tok))
    elif kind == "relabeled":
        strings = sorted(set(t_tok.vocab.tokens))
        vocab = Vocabulary(list(draw(st.permutations(strings))))
        d_tok = LongestMatchTokenizer(vocab)
        tv = t_tok.vocab
        if len(set(tv.tokens)) != len(tv.tokens):
            t_tok = LongestMatchTokenizer(Vocabulary(strings))
        target = draw(models(t_tok))
        drafter = relabeled(target, vocab, d_tok)
    elif kind == "induced":
        weights = {s: draw(st.lists(st.integers(0, 5), min_size=len(alphabet), max_size=len(alphabet)))
                   + [draw(st.integers(1, 3))] for s in ("", *alphabet)}
        src = CharSource(alphabet, weights)
        target = induced_model(t_tok.vocab, t_tok, src)
        d_tok = draw(tokenizers(alphabet, max_extra))
        drafter = induced_model(d_tok.vocab, d_tok, src)
    elif kind == "disjoint":
        extra = [s for s in ["".join(x) for x in _pairs(alphabet)] if s not in t_tok.vocab][:2]
        d_tok = LongestMatchTokenizer(Vocabulary(list(alphabet) + extra))
        drafter = _outside_heavy(draw(models(d_tok, "random")), t_tok.vocab, 50)
    else:
        d_tok = draw(tokenizers(alphabet, max_extra))
        drafter = draw(models(d_tok))
        if kind == "outside_heavy":
            drafter = _outside_heavy(drafter, t_tok.vocab, draw(st.sampled_from([5, 100])))
    prompt = draw(st.text(alphabet, max_size=3))
    return World(target, drafter, prompt, kind)


def _pairs(alphabet: str) -> list[tuple[str, str]]:
    return [(a, b) for a in alphabet for b in alphabet]
