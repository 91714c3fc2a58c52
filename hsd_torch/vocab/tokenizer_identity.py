"""What a tokenizer object is now, cheaply: its state, a per-call fingerprint, and the state cached on it.

Everything hsd_torch caches per tokenizer object (byte tables, bridges, :class:`hsd_torch.vocab.text.TokenText`)
is keyed on :func:`tokenizer_state`, so that a tokenizer changed in place is read again. That state
serializes the whole model (hundreds of milliseconds on Gemma-3's tokenizer), so ``generate`` reads it
through :func:`tokenizer_state_cached`, which reads it in full only when the cheap
:func:`tokenizer_fingerprint` (a few milliseconds) moves; :func:`forget_tokenizer` forces a full read.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

__all__ = ["forget_tokenizer", "model_digest", "tokenizer_fingerprint", "tokenizer_state", "tokenizer_state_cached"]

_CACHE_SIZE = 16
"""How many tokenizer objects (and byte tables, bridges) the caches of :mod:`hsd_torch.vocab` remember."""


def _backend(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` of a fast HF tokenizer, or ``tokenizer`` itself."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return backend
    raise TypeError(
        f"{type(tokenizer).__name__} is neither a tokenizers.Tokenizer nor a fast Hugging Face "
        "tokenizer (no backend_tokenizer); load it with use_fast=True")



_MODEL_OPTIONS = ("byte_fallback", "unk_token", "unk_id", "dropout", "fuse_unk", "ignore_merges",
                  "continuing_subword_prefix", "end_of_word_suffix", "max_input_chars_per_word")


def tokenizer_state(tokenizer: Any) -> tuple[Any, ...]:
    """A cheap fingerprint of what a tokenizer object's encodings, special prefix and byte strings
    depend on, so that what is cached per tokenizer object (byte tables and bridges here,
    :class:`hsd_torch.vocab.text.TokenText` and everything keyed on it) is rebuilt when the object is
    changed in place: the vocabulary sizes (with and without added tokens), every added token
    (id, content, flags), the JSON of the normalizer, pre-tokenizer, post-processor (the special
    prefix: a BOS template set in place) and decoder, the model's kind and options (byte fallback,
    unknown token, BPE dropout, ...), the backend's truncation and padding, and the wrapper's special
    ids, BOS and EOS; and a digest of the model's content (:func:`model_digest`: its vocabulary,
    merges or scores), so that a model swapped in place for another of the same kind and size is
    seen too.

    Cost, measured on the real tokenizers of ``.cache/real-tokenizers`` (2 busy cores): 0.1 ms
    (GPT-2, cl100k, LLaMA), 0.5 ms (o200k: its pre-tokenizer's regex), 0.9 ms (Qwen, 208 added
    tokens) without the digest; the added tokens are read in full, about 5 us each (30 ms with
    6,000 added tokens). The digest dominates on large vocabularies (:func:`model_digest`).
    ``generate`` reads it through :func:`tokenizer_state_cached`, which reads it in full only when
    the cheap :func:`tokenizer_fingerprint` moves (:meth:`hsd_torch.vocab.text.TokenText.get`; the
    bridge is then cached per pair of texts, so :class:`VocabBridge` does not read it again)."""
    b = _backend(tokenizer)
    model = b.model
    added = tuple(sorted((int(i), str(t.content), bool(t.special), bool(t.single_word), bool(t.lstrip),
                          bool(t.rstrip), bool(t.normalized)) for i, t in b.get_added_tokens_decoder().items()))
    parts = (b.normalizer, b.pre_tokenizer, b.post_processor, b.decoder)
    return (
        b.get_vocab_size(with_added_tokens=True), b.get_vocab_size(with_added_tokens=False), added,
        tuple(None if c is None else c.__getstate__() for c in parts),
        type(model).__name__, tuple(repr(getattr(model, k, None)) for k in _MODEL_OPTIONS),
        repr(b.truncation), repr(b.padding),
        tuple(getattr(tokenizer, "all_special_ids", None) or ()),
        getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None),
        model_digest(model),
    )


# A probe text whose encoding is part of the per-call fingerprint: ASCII letters, digits and
# punctuation alone and in common words of prose and code, whitespace runs, and a few scripts
# beyond Latin, so that a model swapped in place for one whose common pieces, merges or scores
# differ encodes it otherwise.
_PROBE = (
    "the quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG!\n"
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 `~!@#$%^&*()-_=+[]{}\\|;:'\",<.>/?\n"
    "def main(argv):\n    for i in range(10):\n\tif x == y and not z: return self.value[i] + 1\n"
    "import numpy as np; print('hello, world'); // comment /* block */ <div class=\"a\">&amp;</div>\n"
    "  two  spaces,   three,\r\nwindows, naïve café résumé, Ελληνικά, русский, 日本語, 中文, 한국어, 😀👍🏽\n"
)
_FIRST_IDS = 256  # the fingerprint reads the strings of the model's first ids (bytes, specials)
_SAMPLED_IDS = 512  # and of these many more, spread evenly
_SAMPLED_ADDED = 256  # added tokens whose content and flags it reads, spread evenly (plus their count)


def _added_entry(i: Any, t: Any) -> tuple[Any, ...]:
    return (int(i), str(t.content), bool(t.special), bool(t.single_word), bool(t.lstrip), bool(t.rstrip),
            bool(t.normalized))


def tokenizer_fingerprint(tokenizer: Any) -> tuple[Any, ...]:
    """A fingerprint of a tokenizer object cheap enough to read on every ``generate`` call: every
    part of :func:`tokenizer_state` but the two that cost with the vocabulary's size, which it
    samples instead of reading in full: of the added tokens, their number and the content and
    flags of 256 of them spread evenly (``tokenizer_state``: all of them); of the model's content,
    the strings of its first 256 ids and of 512 ids spread evenly over it, and the ids the
    backend encodes a fixed probe text of prose, code, whitespace runs and several scripts into
    (``tokenizer_state``: a digest of the whole model, :func:`model_digest`).

    So any change of the vocabulary's sizes, normalizer, pre-tokenizer, post-processor, decoder,
    model kind or options, truncation, padding, special ids, BOS or EOS moves it, as does a change
    of a sampled id's string, of the number of added tokens or of a sampled one, or of how the probe
    text is encoded. A change in place that keeps all of these (two rare ids trading strings, one
    added token's flags changed among thousands) does not: :func:`tokenizer_state_cached` then keeps
    the state it read before; :func:`forget_tokenizer` makes it read the state again.

    Cost, measured by ``bench/tokenizer_fingerprint.py`` (bench/RESULTS.md): a few milliseconds
    on Gemma-3's 262,144 ids with 6,384 added tokens, where :func:`tokenizer_state` costs hundreds."""
    b = _backend(tokenizer)
    model = b.model
    decoder = b.get_added_tokens_decoder()
    added = sorted(decoder)
    step = max(1, len(added) // _SAMPLED_ADDED)
    n_model = b.get_vocab_size(with_added_tokens=False)
    ids = sorted(set(range(min(_FIRST_IDS, n_model))) | set(range(0, n_model, max(1, n_model // _SAMPLED_IDS)))
                 | {n_model - 1} if n_model else set())
    parts = (b.normalizer, b.pre_tokenizer, b.post_processor, b.decoder)
    return (  # the size with added tokens follows from the model's and the added ids (not read: 0.3-0.7 ms)
        n_model, len(added), added[-1] if added else None,
        tuple(_added_entry(i, decoder[i]) for i in added[::step]),
        tuple(None if c is None else c.__getstate__() for c in parts),
        type(model).__name__, tuple(repr(getattr(model, k, None)) for k in _MODEL_OPTIONS),
        repr(b.truncation), repr(b.padding),
        tuple(getattr(tokenizer, "all_special_ids", None) or ()),
        getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None),
        tuple(model.id_to_token(i) for i in ids),
        _probe(b),
    )


def _probe(backend: Any) -> tuple[Any, ...]:
    """The ids ``backend`` encodes :data:`_PROBE` into, or the error it raises (a vocabulary that
    cannot encode every text: a WordLevel model without an unknown token)."""
    try:
        return tuple(backend.encode(_PROBE, add_special_tokens=False).ids)
    except Exception as e:  # tokenizers raises a bare Exception
        return ("error", str(e))


# per tokenizer object (by id, holding the object so that its id is not reused): the fingerprint
# last read and the full state read with it
_STATES: OrderedDict[int, tuple[Any, tuple[Any, ...], tuple[Any, ...]]] = OrderedDict()


def tokenizer_state_cached(tokenizer: Any) -> tuple[Any, ...]:
    """:func:`tokenizer_state` of ``tokenizer``, read in full only when its
    :func:`tokenizer_fingerprint` (a few milliseconds) differs from the one read with the state
    this function last returned for the same object: what ``generate`` keys its caches per
    tokenizer on, at the fingerprint's cost per call instead of the state's (which serializes the
    whole model). A change in place that the fingerprint does not see (its docstring) keeps the
    earlier state until :func:`forget_tokenizer`. Remembers the 16 tokenizer objects read last
    (and keeps them alive)."""
    fp = tokenizer_fingerprint(tokenizer)
    hit = _STATES.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer and hit[1] == fp:
        _STATES.move_to_end(id(tokenizer))
        return hit[2]
    state = tokenizer_state(tokenizer)
    _STATES[id(tokenizer)] = (tokenizer, fp, state)
    while len(_STATES) > _CACHE_SIZE:
        _STATES.popitem(last=False)
    return state


def forget_tokenizer(tokenizer: Any) -> None:
    """Make the next :func:`tokenizer_state_cached` of ``tokenizer`` read its whole state again
    (after a change in place that :func:`tokenizer_fingerprint` does not see)."""
    hit = _STATES.get(id(tokenizer))
    if hit is not None and hit[0] is tokenizer:
        del _STATES[id(tokenizer)]


def model_digest(model: Any) -> bytes:
    """A 16-byte BLAKE2b digest of a ``tokenizers`` model's serialized content (``__getstate__``:
    the JSON of its vocabulary, merges or scores and options): equal for models of equal
    content, different (up to a hash collision) otherwise. It serializes the whole model (one call
    into ``tokenizers``: megabytes of JSON for vocabularies of 100k ids and more), which dominates
    :func:`tokenizer_state` on large vocabularies."""
    return hashlib.blake2b(model.__getstate__(), digest_size=16).digest()
