"""Toy vocabularies: token strings with an out-of-band end-of-sequence token.

A :class:`Vocabulary` holds ``n`` token strings (ids ``0 .. n-1``) and an EOS token with id ``n``,
so ``len(vocab) == n + 1`` and every law over the vocabulary has ``n + 1`` entries. Several ids may
share one string (real tokenizers have such duplicates); every character that occurs in any token
must itself be a single-character token, so that any text over the alphabet can be expressed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

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
    on the hash seed, raises ``TypeError``). Raises ``ValueError`` for an empty token list, an empty token string, a
    character that is not itself a token, or an EOS name that is also a token string.
    """

    def __init__(self, tokens: Sequence[str], eos: str = "<eos>") -> None:
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
        )

    def __hash__(self) -> int:
        return hash((self._tokens, self.eos))

    def __repr__(self) -> str:
        return f"Vocabulary({list(self._tokens)!r}, eos={self.eos!r})"

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
        """The canonical (lowest) id of string ``s``. Raises ``KeyError`` if ``s`` is not a token."""
        ids = self._ids.get(s)
        if not ids:
            raise KeyError(f"{s!r} is not a token of this vocabulary")
        return ids[0]
