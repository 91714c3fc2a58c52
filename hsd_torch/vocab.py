"""The vocabulary bridge: exact byte strings of token ids, and the drafter/target intersection.

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

The bridge (:class:`VocabBridge`)
    The intersection of two vocabularies by byte string, as index tensors, with the two EOS ids
    corresponding; the pushforward of a drafter law to target ids (masses of drafter ids that
    share a string are **added**, in ascending drafter id, as ``hsd_core.methods.tli`` does); the
    restriction of a drafter law to the intersection. Everything is built once per tokenizer pair
    (cached) and its invariants are checked at build time.

Cost: building the bridge of two 150k-token vocabularies takes 0.5-1.0 s on this project's 2 busy
CPU cores after the tokenizers are loaded (``docs/vocab.md``); a cached pair takes milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple, overload

import numpy as np
import numpy.typing as npt
import torch

__all__ = [
    "Restricted",
    "TokenBytes",
    "UnsupportedTokenizer",
    "VocabBridge",
    "byte_level_alphabet",
    "clear_cache",
    "model_digest",
    "token_bytes",
    "tokenizer_state",
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
    decoding removes at the very start of a sequence (``b" "`` for SentencePiece, else ``b""``).
    """

    by_id: tuple[bytes | None, ...]
    kind: str
    special: Mapping[int, str] = field(default_factory=dict)
    leading_strip: bytes = b""

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
    return TokenBytes(tuple(out), kind, dict(sorted(special.items())), leading)


_CACHE_SIZE = 16
_BYTES_CACHE: OrderedDict[tuple[int, int | None], tuple[Any, Any, TokenBytes]] = OrderedDict()


_MODEL_OPTIONS = ("byte_fallback", "unk_token", "unk_id", "dropout", "fuse_unk", "ignore_merges",
                  "continuing_subword_prefix", "end_of_word_suffix", "max_input_chars_per_word")


def tokenizer_state(tokenizer: Any) -> tuple[Any, ...]:
    """A cheap fingerprint of what a tokenizer object's encodings, special prefix and byte strings
    depend on, so that what is cached per tokenizer object (byte tables and bridges here,
    :class:`hsd_torch.text.TokenText` and everything keyed on it) is rebuilt when the object is
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
    ``generate`` reads it once per tokenizer per call (:meth:`hsd_torch.text.TokenText.get`; the
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


def model_digest(model: Any) -> bytes:
    """A 16-byte BLAKE2b digest of a ``tokenizers`` model's serialized content (``__getstate__``:
    the JSON of its vocabulary, merges or scores and options): equal for models of equal
    content, different (up to a hash collision) otherwise. It serializes the whole model (one call
    into ``tokenizers``: megabytes of JSON for vocabularies of 100k ids and more), which dominates
    :func:`tokenizer_state` on large vocabularies."""
    return hashlib.blake2b(model.__getstate__(), digest_size=16).digest()


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
    fp = tokenizer_state(tokenizer) if state is None else state
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


class Restricted(NamedTuple):
    """A drafter law restricted to the intersection: ``law [..., Vd]`` (renormalized, all zeros
    where ``mass`` is 0) and ``mass [...]`` (the law's mass on the intersection before)."""

    law: torch.Tensor
    mass: torch.Tensor


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise AssertionError(f"VocabBridge invariant violated: {msg}")


def _lowest_ids(bs: Sequence[bytes | None]) -> dict[bytes, int]:
    """byte string -> lowest id with it (later ids overwritten by earlier ones)."""
    first: dict[bytes | None, int] = dict(zip(reversed(bs), range(len(bs) - 1, -1, -1)))
    first.pop(None, None)
    return first  # type: ignore[return-value]


def _resolve_eos(tokenizer: Any, given: int | None, size: int, who: str) -> int:
    eos = given if given is not None else getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError(
            f"the {who} tokenizer has no eos_token_id; pass {who}_eos_id= to VocabBridge")
    eos = int(eos)
    if not 0 <= eos < size:
        raise ValueError(f"{who} EOS id {eos} is outside the vocabulary of {size} ids")
    return eos


class _Push:
    """The pushforward of laws along a map of columns ``dst[c]`` (many to one allowed; ``-1``:
    column ``c`` is dropped) into ``n_out`` columns: ``x [..., len(dst)]`` -> ``[..., n_out]``, same
    dtype and device, the masses of the columns with one destination added in ascending source
    column (``hsd_core``'s order), destinations nothing maps to 0.

    On the CPU one ``index_add_`` does that (it adds the source columns one after another, in index
    order). On other devices ``index_add_`` adds duplicate destinations atomically, in any order,
    so there it runs once per multiplicity level (level ``r`` holds the ``r``-th source column of
    every destination: distinct destinations in each level), and the result is the same,
    deterministically. ``split``: force one way (False) or the other (True); None: by the device.
    """

    def __init__(self, dst: Sequence[int] | npt.NDArray[np.int64], n_out: int, device: torch.device,
                 split: bool | None = None) -> None:
        d = np.asarray(dst, dtype=np.int64).reshape(-1)
        bad = np.flatnonzero((d < -1) | (d >= n_out))
        if len(bad):
            c = int(bad[0])
            raise ValueError(f"column {c} maps to {int(d[c])}, outside [0, {n_out}) (and not -1, dropped)")
        self.n_in, self.n_out = len(d), n_out
        src = np.flatnonzero(d >= 0)
        tgt = d[src]
        order = np.argsort(tgt, kind="stable")  # by destination, ascending source column within one
        ts, cs = tgt[order], src[order]
        starts = np.r_[0, np.flatnonzero(np.diff(ts)) + 1] if len(ts) else np.zeros(0, dtype=np.int64)
        rank = np.arange(len(ts)) - np.repeat(starts, np.diff(np.r_[starts, len(ts)]))
        depth = int(rank.max()) + 1 if len(rank) else 0

        def put(a: npt.NDArray[np.int64]) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(device)

        self.levels: list[tuple[torch.Tensor | None, torch.Tensor]] = []
        if not (device.type != "cpu" if split is None else split) or depth <= 1:
            self.levels.append((None if len(src) == len(d) else put(src), put(tgt)))
            return
        for r in range(depth):
            at = rank == r
            by_src = np.argsort(cs[at], kind="stable")
            self.levels.append((put(cs[at][by_src]), put(ts[at][by_src])))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(lead.numel(), self.n_in)
        out = x2.new_zeros((x2.shape[0], self.n_out))
        for src, dst in self.levels:
            out.index_add_(1, dst, x2 if src is None else x2.index_select(1, src))
        return out.view(*lead, self.n_out)


@dataclass(frozen=True)
class _Core:
    """Everything a bridge holds, on the CPU, built once per tokenizer pair."""

    target_bytes: TokenBytes
    drafter_bytes: TokenBytes
    target_eos_id: int
    drafter_eos_id: int
    to_target: torch.Tensor
    to_drafter: torch.Tensor
    drafter_ids: torch.Tensor
    target_ids: torch.Tensor
    shared: int
    same_tokenizer: bool
    build_seconds: float
    to_target_list: tuple[int, ...]  # the two maps as host tuples, for per-token lookups without a tensor op
    to_drafter_list: tuple[int, ...]
    pushes: dict[str, _Push] = field(default_factory=dict, compare=False)  # per device, built on first use


def _build_core(target: Any, drafter: Any, t_size: int | None, d_size: int | None,
                t_eos: int | None, d_eos: int | None, states: tuple[Any, Any] | None = None) -> _Core:
    t0 = time.perf_counter()
    tb = token_bytes(target, t_size, state=None if states is None else states[0])
    db = token_bytes(drafter, d_size, state=None if states is None else states[1])
    vt, vd = len(tb), len(db)
    te = _resolve_eos(target, t_eos, vt, "target")
    de = _resolve_eos(drafter, d_eos, vd, "drafter")
    tbl = list(tb.by_id)
    dbl = list(db.by_id)
    tbl[te] = None  # EOS is out of band whatever its text
    dbl[de] = None
    first_t = _lowest_ids(tbl)
    first_d = _lowest_ids(dbl)
    to_t: npt.NDArray[np.int64] = np.fromiter(map(first_t.get, dbl, repeat(-1)), dtype=np.int64, count=vd)  # type: ignore[arg-type]
    to_d: npt.NDArray[np.int64] = np.fromiter(map(first_d.get, tbl, repeat(-1)), dtype=np.int64, count=vt)  # type: ignore[arg-type]
    to_t[de] = te
    to_d[te] = de
    d_ids = np.flatnonzero(to_t >= 0)
    t_ids = to_t[d_ids]
    shared = len(first_t.keys() & first_d.keys())

    # Invariants (checked, not assumed): EOS <-> EOS only; every mapped pair has equal bytes, in
    # both maps; the maps are mutually consistent (a round trip never lands on a higher id, so
    # both pick the lowest id of a string); they cover exactly the shared strings.
    _check(to_t[de] == te and to_d[te] == de, "EOS must map to EOS")
    pair_bytes = [dbl[d] for d in d_ids.tolist()]
    _check(pair_bytes == [tbl[t] if t != te else None for t in t_ids.tolist()],
           "a mapped drafter/target pair differs in bytes")
    _check(pair_bytes.count(None) == 1, "only EOS may map without a byte string")
    mapped_t = np.flatnonzero(to_d >= 0)
    _check([tbl[t] for t in mapped_t.tolist()] == [dbl[d] if d != de else None for d in to_d[mapped_t].tolist()],
           "a target id and its drafter id differ in bytes")
    _check(bool((to_t[to_d[mapped_t]] <= mapped_t).all()),
           "target -> drafter -> target gives a higher target id")
    _check(bool((to_d[t_ids] <= d_ids).all()), "a drafter id maps back to a higher drafter id")
    _check(len(mapped_t) == sum(map(first_d.__contains__, filter(None, tbl))) + 1,
           "target-to-drafter map misses or invents shared strings")
    _check(len(d_ids) == sum(map(first_t.__contains__, filter(None, dbl))) + 1,
           "drafter-to-target map misses or invents shared strings")

    n = max(vt, vd)
    pad_t = tb.by_id + (None,) * (n - vt)
    pad_d = db.by_id + (None,) * (n - vd)
    same = pad_t == pad_d and dict(tb.special) == dict(db.special) and te == de
    return _Core(tb, db, te, de, torch.from_numpy(to_t), torch.from_numpy(to_d),
                 torch.from_numpy(d_ids.astype(np.int64)), torch.from_numpy(t_ids.copy()),
                 shared, same, time.perf_counter() - t0, tuple(to_t.tolist()), tuple(to_d.tolist()))


_CORE_CACHE: OrderedDict[tuple[Any, ...], tuple[Any, Any, _Core]] = OrderedDict()


def clear_cache() -> None:
    """Forget every cached byte table and bridge (and the tokenizers they keep alive)."""
    _BYTES_CACHE.clear()
    _CORE_CACHE.clear()


class VocabBridge:
    """The intersection of a target and a drafter vocabulary by exact byte string.

    Attributes (index tensors are ``torch.long`` on :attr:`device`):

    - ``target_bytes``, ``drafter_bytes``: :class:`TokenBytes` of ``Vt`` / ``Vd`` ids, where
      ``Vt = target_vocab_size`` (default: the tokenizer's largest id + 1) and likewise ``Vd``;
    - ``target_eos_id``, ``drafter_eos_id``: the EOS ids (default the tokenizers'
      ``eos_token_id``); EOS maps to EOS and has no byte string;
    - ``to_target [Vd]``: the lowest target id with drafter id ``d``'s byte string, ``-1`` if none;
    - ``to_drafter [Vt]``: the lowest drafter id with target id ``t``'s byte string, ``-1`` if
      none (the map that re-syncs the drafter's context from emitted target ids);
    - ``drafter_ids [M]``, ``target_ids [M]``: the mapped pairs, drafter ids ascending (EOS
      included), ``target_ids == to_target[drafter_ids]``;
    - ``shared``: the number of distinct byte strings in both vocabularies (EOS not counted);
    - ``same_tokenizer``: every id has the same byte string in both (ids past the shorter
      vocabulary count as ``None``), the same special ids and the same EOS; never decided by
      vocabulary size.

    Building is cached per (tokenizer objects, sizes, EOS ids); ``device`` places the index
    tensors (``.to(device)`` gives a copy elsewhere).
    """

    def __init__(self, target_tokenizer: Any, drafter_tokenizer: Any, *,
                 target_vocab_size: int | None = None, drafter_vocab_size: int | None = None,
                 target_eos_id: int | None = None, drafter_eos_id: int | None = None,
                 device: torch.device | str | None = None) -> None:
        key = (id(target_tokenizer), id(drafter_tokenizer), target_vocab_size, drafter_vocab_size,
               target_eos_id, drafter_eos_id)
        fps = (tokenizer_state(target_tokenizer), tokenizer_state(drafter_tokenizer))
        hit = _CORE_CACHE.get(key)
        if (hit is not None and hit[0][0] is target_tokenizer and hit[0][1] is drafter_tokenizer
                and hit[1] == fps):
            _CORE_CACHE.move_to_end(key)
            core = hit[2]
        else:
            core = _build_core(target_tokenizer, drafter_tokenizer, target_vocab_size,
                               drafter_vocab_size, target_eos_id, drafter_eos_id, fps)
            _CORE_CACHE[key] = ((target_tokenizer, drafter_tokenizer), fps, core)
            while len(_CORE_CACHE) > _CACHE_SIZE:
                _CORE_CACHE.popitem(last=False)
        self._core = core
        self._place(torch.device("cpu") if device is None else torch.device(device))

    def _place(self, device: torch.device) -> None:
        c = self._core
        self.to_target: torch.Tensor = c.to_target.to(device)
        self.device: torch.device = self.to_target.device  # e.g. cuda:0 for "cuda"
        self.to_drafter: torch.Tensor = c.to_drafter.to(device)
        self.drafter_ids: torch.Tensor = c.drafter_ids.to(device)
        self.target_ids: torch.Tensor = c.target_ids.to(device)
        self._mask: torch.Tensor = self.to_target >= 0
        self._outside: torch.Tensor = ~self._mask

    def to(self, device: torch.device | str) -> VocabBridge:
        """The same bridge with its index tensors on ``device`` (self if already there)."""
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev == self.device:
            return self
        out = object.__new__(VocabBridge)
        out._core = self._core
        out._place(dev)
        return out

    # plain attributes of the core
    @property
    def target_bytes(self) -> TokenBytes:
        return self._core.target_bytes

    @property
    def drafter_bytes(self) -> TokenBytes:
        return self._core.drafter_bytes

    @property
    def target_eos_id(self) -> int:
        return self._core.target_eos_id

    @property
    def drafter_eos_id(self) -> int:
        return self._core.drafter_eos_id

    @property
    def target_vocab_size(self) -> int:
        """``Vt``: the number of target ids (the width of target laws)."""
        return len(self._core.target_bytes)

    @property
    def drafter_vocab_size(self) -> int:
        """``Vd``: the number of drafter ids (the width of drafter laws)."""
        return len(self._core.drafter_bytes)

    @property
    def shared(self) -> int:
        return self._core.shared

    @property
    def same_tokenizer(self) -> bool:
        return self._core.same_tokenizer

    @property
    def build_seconds(self) -> float:
        """Wall time the (first, uncached) build of this pair took, tokenizer loading excluded."""
        return self._core.build_seconds

    def __repr__(self) -> str:
        return (f"VocabBridge(Vt={self.target_vocab_size}, Vd={self.drafter_vocab_size}, "
                f"shared={self.shared}, mapped_drafter_ids={len(self.drafter_ids)}, "
                f"same_tokenizer={self.same_tokenizer}, device={self.device})")

    def _check_law(self, q: torch.Tensor) -> None:
        if q.dim() < 1 or q.shape[-1] != self.drafter_vocab_size:
            raise ValueError(f"expected a drafter law [..., {self.drafter_vocab_size}], got {tuple(q.shape)}")
        if q.device != self.device:
            raise ValueError(f"law on {q.device} but the bridge's indices are on {self.device}; use .to()")

    def push(self, q_drafter: torch.Tensor) -> torch.Tensor:
        """The law over target ids of ``to_target[d]`` for ``d ~ q_drafter``.

        ``q_drafter [..., Vd]`` -> ``[..., Vt]``, same dtype and device. The masses of drafter ids
        sharing one byte string are added in ascending drafter id (:class:`_Push`: deterministic on
        every device); mass on unmapped ids is dropped.
        """
        self._check_law(q_drafter)
        key = str(self.device)
        push = self._core.pushes.get(key)
        if push is None:
            push = self._core.pushes[key] = _Push(self._core.to_target.numpy(), self.target_vocab_size, self.device)
        return push(q_drafter)

    @property
    def to_target_list(self) -> tuple[int, ...]:
        """``to_target`` as a host tuple (drafter id -> target id or -1)."""
        return self._core.to_target_list

    @property
    def to_drafter_list(self) -> tuple[int, ...]:
        """``to_drafter`` as a host tuple (target id -> drafter id or -1)."""
        return self._core.to_drafter_list

    def restrict(self, q: torch.Tensor) -> Restricted:
        """``q [..., Vd]`` zeroed outside the intersection (drafter ids with ``to_target >= 0``,
        EOS included) and renormalized, with the mass it had there.

        Returns ``Restricted(law [..., Vd], mass [...])`` in ``q``'s dtype and device (bfloat16 and
        float16 are summed in float32). A row with no mass on the intersection gets an all-zero law
        and mass 0, never NaN.
        """
        self._check_law(q)
        law, mass, _ = self._restricted(q)
        mass = mass.squeeze(-1)
        return Restricted(law if law.dtype == q.dtype else law.to(q.dtype),
                          mass if mass.dtype == q.dtype else mass.to(q.dtype))

    def _restricted(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`restrict` without the checks, in float32 or float64, for ``generate``'s drafting
        loop: ``(law [..., Vd], mass [..., 1], has [..., 1])`` with ``has = mass > 0`` (False for NaN)."""
        work = q if q.dtype in (torch.float32, torch.float64) else q.to(torch.float32)
        kept = work.masked_fill(self._outside, 0.0)
        mass = kept.sum(-1, keepdim=True)
        has = mass > 0  # no mass (or NaN): an all-zero law, never 0 / 0
        law = torch.where(has, kept.div_(torch.where(has, mass, 1.0)), 0.0)
        return law, mass, has
