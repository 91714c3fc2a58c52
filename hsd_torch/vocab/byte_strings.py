"""Exact byte strings of token ids (the first half of :mod:`hsd_torch.vocab`; the bridge is
:mod:`hsd_torch.vocab.bridge`).

Byte strings (:func:`token_bytes`)
    The byte string of an id is what that token adds to the decoded text **in the middle of a
    sequence**. It is computed from the tokenizer's own decoder (its JSON: ``decoder``, checked
    against ``pre_tokenizer`` and the model's ``byte_fallback``), never from names, by running each
    decoder step on every token string:

    - ``ByteLevel``: each character of the GPT-2 byte alphabet (``Ġ`` = space, ``Ċ`` = newline,
      ...) becomes its byte; a token with a character outside the alphabet is kept as its UTF-8
      (what ``tokenizers`` does);
    - ``Metaspace`` / ``Replace("▁", " ")``: ``▁`` becomes a space (SentencePiece);
    - ``ByteFallback``: a token ``<0xNN>`` becomes the single byte ``NN``;
    - ``Replace`` with a plain string, ``Strip`` (before ``Fuse``), ``Fuse``, ``BPEDecoder``
      (suffix to a space), ``WordPiece`` without cleanup (``##x`` is ``x``, any other token gets a
      leading space);
    - anything else (``CTC``, a regex ``Replace``, ``WordPiece`` cleanup, ``Metaspace`` after
      ``Fuse``, no decoder at all, i.e. tokens joined by spaces) raises
      :class:`UnsupportedTokenizer`: the byte string would be a guess.

    Conventions at the start of a sequence (SentencePiece drops the space of the first token:
    ``Metaspace``'s first-token rule or ``Strip(" ", 1, 0)`` after ``Fuse``) are not part of a
    token's bytes; :attr:`TokenBytes.leading_strip` records them. Special added tokens, the
    model's unknown token and the wrapper's special ids have no byte string (``None``): they are
    out of band. A non-special added token is text (Gemma's newline and tab runs, ids 107-137 and
    more, which its tokenizer encodes every newline into): its content's UTF-8 bytes, when it is
    matched exactly (no ``lstrip``, ``rstrip`` or ``single_word``) and round-trips (encoding its
    content gives its id alone, decoding its id gives its content: :func:`_added_text`); else it is
    out of band too. So are ids that the tokenizer does not use (holes, as in cl100k) and ids of a
    model embedding padded wider than the tokenizer.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple, overload

import numpy as np
import numpy.typing as npt
import torch

from .tokenizer_identity import _CACHE_SIZE, _backend, forget_tokenizer, model_digest, tokenizer_fingerprint, \
    tokenizer_state, tokenizer_state_cached

__all__ = [
    "TokenBytes",
    "UnsupportedTokenizer",
    "byte_level_alphabet",
    "model_digest",
    "token_bytes",
    "forget_tokenizer",
    "tokenizer_fingerprint",
    "tokenizer_state",
    "tokenizer_state_cached",
]


class UnsupportedTokenizer(ValueError):
    """The byte strings of this tokenizer's ids cannot be determined exactly."""


def byte_level_alphabet() -> dict[str, int]:
    """The GPT-2 byte alphabet: the printable character standing for each byte 0..255."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    out: dict[str, int] = {chr(b): b for b in printable}
    n = 0
    for b in range(256):
        if b not in printable:
            out[chr(256 + n)] = b
            n += 1
    return out


_ALPHABET = byte_level_alphabet()
_BYTE_TABLE = {ord(c): b for c, b in _ALPHABET.items()}  # str.translate: alphabet char -> latin-1 char
_NOT_ALPHABET = re.compile("[^" + "".join(re.escape(c) for c in _ALPHABET) + "]")
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass(frozen=True)
class TokenBytes(Sequence[bytes | None]):
    """The byte string of every id ``0 .. len(self) - 1`` of a tokenizer (``None``: out of band).

    ``by_id[i]`` is id ``i``'s bytes. ``kind`` names the decoding scheme found (``"byte_level"``, ``"sentencepiece"``,
    ``"wordpiece"``, ``"bpe_suffix"`` or ``"plain"``); ``special`` maps every out-of-band id that
    the tokenizer knows to its content (``<s>``, ``<|endoftext|>``, ...); ``leading_strip`` is what
    decoding removes at the very start of a sequence (``b" "`` for SentencePiece, else ``b""``);
    ``added_text`` holds the ids of non-special added tokens that are text (they are matched before
    the model, so the tokenizer writes their string as them), ``byte_fallback`` the ids of byte-fallback
    tokens ``<0xNN>`` (the model writes a byte as one only where no piece holds it).
    """

    by_id: tuple[bytes | None, ...]
    kind: str
    special: Mapping[int, str] = field(default_factory=dict)
    leading_strip: bytes = b""
    added_text: frozenset[int] = frozenset()
    byte_fallback: frozenset[int] = frozenset()

    def written_ids(self, out_of_band: Collection[int] = ()) -> dict[bytes, int]:
        """Byte string -> the id this tokenizer writes it as, for every byte string some id has (ids in
        ``out_of_band`` left out): an added text token before a model piece before a byte fallback
        ``<0xNN>``, the lowest id among equals. So a SentencePiece vocabulary's ``b`` is its piece, not
        ``<0x62>``, which sits lower; where a string has one id (almost every one) that id."""
        skip = set(out_of_band)
        ranked = skip | self.added_text | self.byte_fallback
        bs = self.by_id
        out: dict[bytes, int] = _lowest_ids([None if i in ranked else b for i, b in enumerate(bs)]) \
            if ranked else _lowest_ids(bs)
        for i in sorted(self.byte_fallback - skip):
            b = bs[i]
            if b is not None:
                out.setdefault(b, i)
        for i in sorted(self.added_text - skip, reverse=True):
            b = bs[i]
            if b is not None:
                out[b] = i
        return out

    def __len__(self) -> int:
        return len(self.by_id)

    @overload
    def __getitem__(self, i: int) -> bytes | None: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[bytes | None]: ...
    def __getitem__(self, i: int | slice) -> bytes | None | Sequence[bytes | None]:
        return self.by_id[i]

    def __iter__(self) -> Iterator[bytes | None]:
        return iter(self.by_id)

    def join(self, ids: Sequence[int]) -> bytes:
        """The concatenated byte strings of ``ids`` (out-of-band ids contribute nothing)."""
        return b"".join(b for b in (self.by_id[i] for i in ids) if b is not None)


# --------------------------------------------------------------------------------------------
# token_bytes


def _state(component: Any) -> Any:
    """The JSON of a tokenizers component (decoder, normalizer, ...), ``None`` if absent."""
    if component is None:
        return None
    return json.loads(component.__getstate__())


def _id_strings(backend: Any) -> list[str | None]:
    """The model's token string of every id ``0 .. max id`` (``None`` for an unused id), read id
    by id with ``id_to_token`` (twice as fast as ``get_vocab`` for 150k ids, and free of the
    order in which ``get_vocab`` lists tokens). Ids of added tokens not in the model are ``None``."""
    model_count = backend.get_vocab_size(with_added_tokens=False)
    n = backend.get_vocab_size(with_added_tokens=True)
    id_to_token = backend.model.id_to_token
    out: list[str | None] = [id_to_token(i) for i in range(n)]
    found = len(out) - out.count(None)
    # ids past the count exist when the vocabulary has holes (tiktoken-style): scan on
    misses = 0
    while found < model_count:
        s = id_to_token(len(out))
        out.append(s)
        if s is None:
            misses += 1
            if misses > 1_000_000:
                raise UnsupportedTokenizer("cannot find all of the model's ids (holes too large)")
        else:
            found += 1
    while out and out[-1] is None:
        out.pop()
    return out


def _flatten(state: Any, key: str) -> list[dict[str, Any]]:
    if state is None:
        return []
    if state.get("type") == "Sequence":
        out: list[dict[str, Any]] = []
        for sub in state.get(key, []):
            out.extend(_flatten(sub, key))
        return out
    return [state]


Piece = str | bytes


def _on_text(v: Piece, f: Any) -> Piece:
    """Apply a string step to a piece; a byte piece (from ``ByteFallback``) takes part only when
    it is valid UTF-8 on its own, as ``tokenizers`` turns it into text before the next step."""
    if isinstance(v, str):
        out: Piece = f(v)
        return out
    try:
        s = v.decode("utf-8")
    except UnicodeDecodeError:
        return v
    res: str = f(s)
    return res.encode("utf-8") if res != s else v


def _strip(s: str, content: str, start: int, stop: int) -> str:
    i = 0
    while i < start and i < len(s) and s[i] == content:
        i += 1
    j = len(s)
    while len(s) - j < stop and j > i and s[j - 1] == content:
        j -= 1
    return s[i:j]


def _byte_level(v: Piece) -> Piece:
    if isinstance(v, bytes) or _NOT_ALPHABET.search(v):
        return v  # tokenizers keeps such a token as its UTF-8
    return v.translate(_BYTE_TABLE).encode("latin-1")


def _byte_level_all(pieces: list[Piece]) -> list[Piece]:
    """:func:`_byte_level` of every piece; one ``translate`` of the joined text when every piece
    is alphabet-only text (then each character is one byte, so the offsets carry over)."""
    try:
        joined = "".join(pieces)  # type: ignore[arg-type]
    except TypeError:  # byte pieces from an earlier ByteFallback
        return [_byte_level(v) for v in pieces]
    if _NOT_ALPHABET.search(joined):
        return [_byte_level(v) for v in pieces]
    data = joined.translate(_BYTE_TABLE).encode("latin-1")
    ends = np.cumsum([len(v) for v in pieces]).tolist()
    return [data[a:b] for a, b in zip([0, *ends[:-1]], ends)]


def _decode_steps(steps: list[dict[str, Any]], pieces: list[Piece]) -> tuple[list[Piece], str, bytes]:
    """Run the decoder steps on every piece; returns (pieces, kind, leading_strip)."""
    kind = "plain"
    leading = b""
    fused = False
    for st in steps:
        t = st.get("type")
        if t == "ByteLevel":
            pieces = _byte_level_all(pieces)
            kind = "byte_level"
        elif t == "ByteFallback":
            out: list[Piece] = []
            for v in pieces:
                m = _BYTE_TOKEN.fullmatch(v) if isinstance(v, str) else None
                out.append(bytes([int(m.group(1), 16)]) if m else v)
            pieces = out
        elif t == "Fuse":
            fused = True
        elif t == "Replace":
            pat = st.get("pattern", {})
            if "String" not in pat:
                raise UnsupportedTokenizer(f"decoder step Replace with a regex pattern: {st}")
            old, new = pat["String"], st.get("content", "")
            pieces = [_on_text(v, lambda s: s.replace(old, new)) for v in pieces]
            if old == "▁" and new == " ":
                kind = "sentencepiece"
        elif t == "Metaspace":
            if fused:
                raise UnsupportedTokenizer(
                    "decoder Metaspace after Fuse drops every '▁' of the fused text (tokenizers "
                    "treats it as the first token); byte strings are not per token")
            rep = st.get("replacement", "▁")
            pieces = [_on_text(v, lambda s: s.replace(rep, " ")) for v in pieces]
            if st.get("prepend_scheme", "always") != "never" or st.get("add_prefix_space", False):
                leading = b" "
            kind = "sentencepiece"
        elif t == "Strip":
            content, start, stop = st.get("content", " "), int(st.get("start", 0)), int(st.get("stop", 0))
            if fused:  # acts on the whole text: a convention at the sequence's ends
                if start:
                    leading = (content * start).encode("utf-8")
            else:
                pieces = [_on_text(v, lambda s: _strip(s, content, start, stop)) for v in pieces]
        elif t == "WordPiece":
            if st.get("cleanup", True):
                raise UnsupportedTokenizer(
                    "decoder WordPiece with cleanup rewrites spaces around punctuation across "
                    "tokens; byte strings are not per token")
            prefix = st.get("prefix", "##")
            pieces = [_on_text(v, lambda s: s[len(prefix):] if s.startswith(prefix) else " " + s)
                      for v in pieces]
            leading = b" "
            kind = "wordpiece"
        elif t == "BPEDecoder":
            suffix = st.get("suffix", "</w>")
            pieces = [_on_text(v, lambda s: s.replace(suffix, " ")) for v in pieces]
            kind = "bpe_suffix"
        else:
            raise UnsupportedTokenizer(f"decoder step {t!r} is not supported: {st}")
    return pieces, kind, leading


def _added_text(backend: Any, i: int, token: Any) -> bytes | None:
    """The byte string of added token ``i`` (``token``: its ``tokenizers.AddedToken``), or None
    when it is out of band: special, matched with ``lstrip`` / ``rstrip`` / ``single_word``
    (encoding then eats the text around it), empty, or not round-tripping (encoding its content
    without special tokens must give ``[i]`` and decoding ``[i]`` its content)."""
    if token.special or token.lstrip or token.rstrip or token.single_word or not token.content:
        return None
    content = str(token.content)
    if list(backend.encode(content, add_special_tokens=False).ids) != [i]:
        return None
    if backend.decode([i], skip_special_tokens=False) != content:
        return None
    return content.encode("utf-8")


def _compute_token_bytes(tokenizer: Any, vocab_size: int | None) -> TokenBytes:
    backend = _backend(tokenizer)
    decoder = _state(backend.decoder)
    if decoder is None:
        raise UnsupportedTokenizer(
            "the tokenizer has no decoder, so decoding joins tokens with spaces; the byte string "
            "of a token is not determined")
    steps = _flatten(decoder, "decoders")
    types = {s.get("type") for s in steps}
    pre = _flatten(_state(backend.pre_tokenizer), "pretokenizers")
    if any(p.get("type") == "ByteLevel" for p in pre) and "ByteLevel" not in types:
        raise UnsupportedTokenizer("ByteLevel pre-tokenizer without a ByteLevel decoder")
    model = backend.model
    if getattr(model, "byte_fallback", False) and "ByteFallback" not in types:
        raise UnsupportedTokenizer("model has byte_fallback but the decoder has no ByteFallback step")

    strings = _id_strings(backend)
    added = backend.get_added_tokens_decoder()
    special: dict[int, str] = {}
    added_text: dict[int, bytes] = {}
    for i, t in added.items():
        text = _added_text(backend, int(i), t)
        if text is None:
            special[int(i)] = str(t.content)
        else:
            added_text[int(i)] = text
    unk = getattr(model, "unk_token", None)
    unk_id = backend.token_to_id(unk) if isinstance(unk, str) else None
    if unk_id is not None:
        special[int(unk_id)] = str(unk)
    for i in getattr(tokenizer, "all_special_ids", None) or []:
        if i is not None and int(i) not in special:
            special[int(i)] = str(backend.id_to_token(int(i)))
    n = max(len(strings), max(special, default=-1) + 1, max(added_text, default=-1) + 1)
    size = n if vocab_size is None else int(vocab_size)
    if size < n:
        raise ValueError(f"vocab_size {size} is smaller than the tokenizer's {n} ids")

    ids = [i for i, s in enumerate(strings) if s is not None and i not in special and i not in added_text]
    pieces, kind, leading = _decode_steps(steps, [strings[i] for i in ids])  # type: ignore[misc]
    out: list[bytes | None] = [None] * size
    for i, v in zip(ids, pieces):
        out[i] = v.encode("utf-8") if isinstance(v, str) else v
    for i, b in added_text.items():
        if i not in special:  # the wrapper's special ids and the unknown token stay out of band
            out[i] = b
    fallback = frozenset(i for i in ids if "ByteFallback" in types and _BYTE_TOKEN.fullmatch(strings[i] or ""))
    text_ids = frozenset(i for i in added_text if i not in special)
    return TokenBytes(tuple(out), kind, dict(sorted(special.items())), leading, text_ids, fallback)


def _lowest_ids(bs: Sequence[bytes | None]) -> dict[bytes, int]:
    """byte string -> lowest id with it (later ids overwritten by earlier ones)."""
    first: dict[bytes | None, int] = dict(zip(reversed(bs), range(len(bs) - 1, -1, -1)))
    first.pop(None, None)
    return first  # type: ignore[return-value]


_BYTES_CACHE: OrderedDict[tuple[int, int | None], tuple[Any, Any, TokenBytes]] = OrderedDict()


def token_bytes(tokenizer: Any, vocab_size: int | None = None, *, state: Any = None) -> TokenBytes:
    """The exact byte string of every id of a Hugging Face tokenizer (module docstring: rules).

    ``tokenizer`` is a ``PreTrainedTokenizerFast`` / ``TokenizersBackend`` or a
    ``tokenizers.Tokenizer``. The result has ``vocab_size`` entries (default: the tokenizer's
    largest id + 1; a larger value pads with ``None`` for a model whose embedding is wider).
    Raises :class:`UnsupportedTokenizer` when the byte strings cannot be determined exactly,
    ``ValueError`` when ``vocab_size`` is smaller than the tokenizer, ``TypeError`` for a slow
    tokenizer. Cached per tokenizer object and :func:`tokenizer_state` (kept alive by the cache; see
    :func:`clear_cache`); ``state``: that state when the caller has just read it (it reads the
    whole model), None to read it here.
    """
    key = (id(tokenizer), vocab_size)
    fp = tokenizer_state_cached(tokenizer) if state is None else state
    hit = _BYTES_CACHE.get(key)
    if hit is not None and hit[0] is tokenizer and hit[1] == fp:
        _BYTES_CACHE.move_to_end(key)
        return hit[2]
    tb = _compute_token_bytes(tokenizer, vocab_size)
    _BYTES_CACHE[key] = (tokenizer, fp, tb)
    while len(_BYTES_CACHE) > _CACHE_SIZE:
        _BYTES_CACHE.popitem(last=False)
    return tb


# --------------------------------------------------------------------------------------------
# the bridge
