"""A small cache of objects built from other objects (tokenizers, their texts), by identity.

Building a vocabulary's tables reads every id (milliseconds at 4k ids, more at 150k): each is
built once per owner object and reused by later calls of ``generate``. Entries are keyed by the
owners' ``id()`` and a key, and hold the owners themselves, so an id is never reused for another
object while its entry lives; the cache is cleared when it holds ``size`` entries.

Identity alone is not enough for an owner that can change in place: a tokenizer whose
post-processor, added tokens or model are changed after a call is the same object with another encoding.
Its key then holds a fingerprint of its state (:meth:`hsd_torch.vocab.text.TokenText.get` passes
:func:`hsd_torch.vocab.tokenizer_state`), and the caches keyed on a ``TokenText`` (text spaces,
column maps, bridges, tries) follow, since a new state builds a new ``TokenText``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")

__all__ = ["IdentityCache"]


class IdentityCache(Generic[V]):
    """``get(owners, key, build)``: ``build()`` once per (owners by identity, ``key``)."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._entries: dict[tuple[tuple[int, ...], Hashable], tuple[tuple[object, ...], V]] = {}

    @staticmethod
    def _key(owners: tuple[object, ...], key: Hashable) -> tuple[tuple[int, ...], Hashable]:
        return tuple(id(o) for o in owners), key

    def _found(self, k: tuple[tuple[int, ...], Hashable], owners: tuple[object, ...]
               ) -> tuple[tuple[object, ...], V] | None:
        """The entry at ``k`` if it was built for these very ``owners`` (ids are not reused while it lives)."""
        hit = self._entries.get(k)
        return hit if hit is not None and all(a is b for a, b in zip(hit[0], owners)) else None

    def peek(self, owners: tuple[object, ...], key: Hashable) -> V | None:
        """The value built for (``owners`` by identity, ``key``), or None if there is none."""
        hit = self._found(self._key(owners, key), owners)
        return None if hit is None else hit[1]

    def get(self, owners: tuple[object, ...], key: Hashable, build: Callable[[], V]) -> V:
        k = self._key(owners, key)
        hit = self._found(k, owners)
        if hit is not None:
            return hit[1]
        value = build()
        if len(self._entries) >= self.size:
            self._entries.clear()
        self._entries[k] = (owners, value)
        return value
