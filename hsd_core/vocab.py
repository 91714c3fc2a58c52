"""Toy vocabularies: token strings with an out-of-band end-of-sequence token.

A :class:`Vocabulary` holds ``n`` token strings (ids ``0 .. n-1``) and an EOS token with id ``n``,
so ``len(vocab) == n + 1`` and every law over the vocabulary has ``n + 1`` entries. Several ids may
share one string (real tokenizers have such duplicates: a SentencePiece piece ``b`` and its byte
fallback ``<0x62>``); the id a tokenizer *writes* such a string as is :meth:`Vocabulary.id_of` (the lowest
unless the vocabulary says otherwise, ``written=``). Every character that occurs in any token must itself
be a single-character token, so that any text over the alphabet can be expressed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np


def check_id(token_id: object) -> int:
    """``token_id`` as an int; ``TypeError`` unless it is a Python or numpy integer (not a bool)."""
    if isinstance(token_id, (bool, np.bool_)) or not isinstance(token_id, (int, np.integer)):
        raise TypeError(f"token id {token_id!r} is a {type(token_id).__name__}, not an integer")
    return int(token_id)


class Vocabulary:
    """An ordered set of token strings plus an EOS id placed right after them.

    ``Vocabulary(["a", "b", "ab"], eos="<eos>")`` has ids 0, 1, 2 for the strings and
    ``eos_id == 3``. ``tokens`` must be a sequence (a list or a tuple; a set, whose order depends
    on the hash seed, raises ``TypeError``). ``written``: for strings that several ids share, the id the
    tokenizer writes the string as when not the lowest (a real SentencePiece tokenizer writes ``b`` as its
    piece, above the byte fallback ``<0x62>``); it must hold that string (``ValueError``). Raises
    ``ValueError`` for an empty token list, an empty token string, a character that is not itself a token,
    or an EOS name that is also a token string.
    """

    def __init__(self, tokens: Sequence[str], eos: str = "<eos>", written: Mapping[str, int] | None = None) -> None:
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
            raise TypeError(
                f"Vocabulary takes a sequence of token strings (a list or a tuple: the order gives the "
                f"ids), got {type(tokens).__name__}"
                + ("; a set has no fixed order (it depends on PYTHONHASHSEED): pass sorted(...)"
                   if isinstance(tokens, (set, frozenset)) else "")
                + ("; a str is not a list of tokens: pass list(...)" if isinstance(tokens, str) else ""))
        toks = list(tokens)
        if not toks:
            raise ValueError("Vocabulary needs at least one token string")
        for i, t in enumerate(toks):
            if not isinstance(t, str):
                raise TypeError(f"token {i} is {t!r}, not a str")
            if t == "":
                raise ValueError(f"token {i} is the empty string; every token must carry text")
        if not isinstance(eos, str) or eos == "":
            raise ValueError("eos must be a non-empty name")
        tokset = set(toks)  # membership in a set: a 150k-token vocabulary builds in well under a second
        if eos in tokset:
            raise ValueError(f"eos name {eos!r} is also a token string; EOS is out of band")
        alphabet = sorted({c for t in toks for c in t})
        missing = [c for c in alphabet if c not in tokset]
        if missing:
            raise ValueError(
                f"characters {missing!r} occur in tokens but are not single-character tokens; "
                "every character must be a token so that any text is expressible"
            )
        self._tokens: tuple[str, ...] = tuple(toks)
        self.eos: str = eos
        self.eos_id: int = len(toks)
        self.alphabet: tuple[str, ...] = tuple(alphabet)
        ids: dict[str, list[int]] = {}
        for i, t in enumerate(toks):
            ids.setdefault(t, []).append(i)
        self._ids: dict[str, tuple[int, ...]] = {s: tuple(v) for s, v in ids.items()}
        self.max_token_len: int = max(len(t) for t in toks)
        self._written: dict[str, int] = {}
        for s, i in sorted((written or {}).items(), key=lambda kv: kv[1]):
            if check_id(i) not in self._ids.get(s, ()):
                raise ValueError(f"written id {i} of {s!r} is not an id with that string")
            if i != self._ids[s][0]:
                self._written[s] = int(i)

    def __len__(self) -> int:
        """Number of ids, EOS included."""
        return len(self._tokens) + 1

    def __iter__(self) -> Iterator[str]:
        return iter(self._tokens)

    def __contains__(self, s: object) -> bool:
        return s in self._ids

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Vocabulary)
            and self._tokens == other._tokens
            and self.eos == other.eos
            and self._written == other._written
        )

    def __hash__(self) -> int:
        return hash((self._tokens, self.eos, tuple(self._written.items())))

    def __repr__(self) -> str:
        written = f", written={self._written!r}" if self._written else ""
        return f"Vocabulary({list(self._tokens)!r}, eos={self.eos!r}{written})"

    @property
    def tokens(self) -> tuple[str, ...]:
        """The token strings, indexed by id (EOS excluded)."""
        return self._tokens

    def string(self, token_id: int) -> str:
        """Text of a token id; EOS has no text and gives ``""``. Raises ``ValueError`` if unknown and
        ``TypeError`` if ``token_id`` is not an integer (a Python or numpy int, not a bool)."""
        token_id = check_id(token_id)
        if token_id == self.eos_id:
            return ""
        if not 0 <= token_id < len(self._tokens):
            raise ValueError(f"unknown token id {token_id} (vocabulary has ids 0..{self.eos_id})")
        return self._tokens[token_id]

    def ids_of(self, s: str) -> tuple[int, ...]:
        """All ids whose string is ``s`` (ascending); empty when ``s`` is not a token."""
        return self._ids.get(s, ())

    def id_of(self, s: str) -> int:
        """The id the tokenizer writes string ``s`` as: its ``written`` id, else the lowest. Raises
        ``KeyError`` if ``s`` is not a token."""
        ids = self._ids.get(s)
        if not ids:
            raise KeyError(f"{s!r} is not a token of this vocabulary")
        return self._written.get(s, ids[0])
