"""Canonical toy tokenizers: longest-match (maximal munch) and merge-based BPE.

Both are *non-injective* on purpose: ``decode(encode(text)) == text`` always holds, but
``encode(decode(ids)) == ids`` only for canonical id sequences (``[a, b]`` decodes to ``"ab"``,
which encodes back to ``[ab]``). Where several ids share a string, ``encode`` uses the one the vocabulary writes it as
(``Vocabulary.id_of``: the lowest unless it names another).
EOS decodes to the empty string and is never produced by ``encode``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from .vocab import Vocabulary, check_id

__all__ = ["BPETokenizer", "LongestMatchTokenizer", "Tokenizer", "Unencodable", "encode_free"]


class Unencodable(ValueError):
    """A text a tokenizer cannot encode (here: a character outside its vocabulary's alphabet).
    Where a proposal would need such a text, the string-level methods propose nothing instead
    (SLEM: no candidate; SLRS: no proposal that round; ``proofs/slrs.md``, section 5); where it
    only feeds a drafter's context, :func:`encode_free` leaves the characters out."""


@runtime_checkable
class Tokenizer(Protocol):
    """What the methods need of a tokenizer: its vocabulary, ``encode`` and ``decode``."""

    @property
    def vocab(self) -> Vocabulary: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...


class _Base:
    def __init__(self, vocab: Vocabulary) -> None:
        if not isinstance(vocab, Vocabulary):
            raise TypeError("a tokenizer needs a Vocabulary")
        self._vocab = vocab
        self._memo: dict[str, tuple[int, ...]] = {}

    @property
    def vocab(self) -> Vocabulary:
        return self._vocab

    def decode(self, ids: Iterable[int]) -> str:
        """Concatenated text of ``ids`` (EOS contributes nothing). Unknown ids raise ``ValueError``,
        ids that are not integers (``0.9``) ``TypeError``."""
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"decode takes a sequence of token ids, got {type(ids).__name__}")
        return "".join(self._vocab.string(check_id(i)) for i in ids)

    def encode(self, text: str) -> list[int]:
        """Canonical ids of ``text``; raises :class:`Unencodable` (a ``ValueError``) on characters
        outside the alphabet."""
        hit = self._memo.get(text)
        if hit is None:
            self._check_text(text)
            hit = tuple(self._encode(text))
            if len(self._memo) > 65536:
                self._memo.clear()
            self._memo[text] = hit
        return list(hit)

    def _encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def _check_text(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        bad = sorted({c for c in text if c not in self._vocab})
        if bad:
            raise Unencodable(
                f"text has characters {bad!r} that are not in the vocabulary "
                f"(alphabet {list(self._vocab.alphabet)!r})"
            )


class LongestMatchTokenizer(_Base):
    """Maximal munch: left to right, always take the longest token that is a prefix of the rest."""

    def _encode(self, text: str) -> list[int]:
        out: list[int] = []
        i, n, L = 0, len(text), self._vocab.max_token_len
        while i < n:
            for j in range(min(n, i + L), i, -1):
                if text[i:j] in self._vocab:
                    out.append(self._vocab.id_of(text[i:j]))
                    i = j
                    break
        return out

    def __repr__(self) -> str:
        return f"LongestMatchTokenizer({self._vocab!r})"


class BPETokenizer(_Base):
    """Merge-based BPE: split into characters, then apply merges in rank order.

    ``merges`` is an ordered list of string pairs ``(left, right)``; each merged string
    ``left + right`` must be a token of ``vocab`` (ValueError otherwise, and for a merge that is
    not a pair of strings: ``"ab"`` or ``("a", "b", "c")``). Encoding repeatedly
    applies the lowest-ranked merge present anywhere in the current sequence (all its
    non-overlapping occurrences, left to right), as GPT-2-style BPE does. Vocabulary tokens that no
    merge produces are never emitted by ``encode`` but are valid ids for ``decode``.
    """

    def __init__(self, vocab: Vocabulary, merges: Sequence[tuple[str, str]]) -> None:
        super().__init__(vocab)
        if isinstance(merges, (str, bytes, Mapping)) or not isinstance(merges, Iterable):
            raise TypeError(f"merges must be a list of (left, right) string pairs, got {type(merges).__name__}")
        pairs: list[tuple[str, str]] = []
        for r, m in enumerate(merges):
            if (isinstance(m, (str, bytes)) or not isinstance(m, Sequence) or len(m) != 2
                    or not all(isinstance(x, str) for x in m)):
                raise ValueError(
                    f"merge {r} is {m!r}; each merge is a pair of strings (left, right), e.g. ('a', 'b') "
                    "for the token 'ab'")
            pairs.append((m[0], m[1]))
        self.merges: tuple[tuple[str, str], ...] = tuple(pairs)
        self._rank: dict[tuple[str, str], int] = {}
        for r, (a, b) in enumerate(self.merges):
            if a + b not in vocab:
                raise ValueError(f"merge {a!r}+{b!r} gives {a + b!r}, which is not a token")
            if a not in vocab or b not in vocab:
                raise ValueError(f"merge ({a!r}, {b!r}) uses a string that is not a token")
            self._rank.setdefault((a, b), r)

    def _encode(self, text: str) -> list[int]:
        parts = list(text)
        while len(parts) > 1:
            best: int | None = None
            for pair in zip(parts, parts[1:]):
                r = self._rank.get(pair)
                if r is not None and (best is None or r < best):
                    best = r
            if best is None:
                break
            a, b = self.merges[best]
            merged: list[str] = []
            i = 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == a and parts[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return [self._vocab.id_of(p) for p in parts]

    def __repr__(self) -> str:
        return f"BPETokenizer({self._vocab!r}, merges={list(self.merges)!r})"


def encode_free(tokenizer: Tokenizer, text: str) -> list[int]:
    """The ids of ``text`` with what ``tokenizer`` cannot encode left out: a drafter's context
    (it only shapes proposals, so any rule is lossless; ``proofs/sd.md``). The tokenizer's own
    ``encode_free`` where it has one (the mirror's tokenizer over a Hugging Face one, whose rule
    is the backend's), else ``encode`` of ``text`` without the characters outside the
    vocabulary's alphabet."""
    own = getattr(tokenizer, "encode_free", None)
    if callable(own):
        out: list[int] = own(text)
        return out
    vocab = tokenizer.vocab
    return tokenizer.encode("".join(c for c in text if c in vocab))
