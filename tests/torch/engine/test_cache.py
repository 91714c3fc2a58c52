"""hsd_torch.engine._cache.IdentityCache: one build per (owners by identity, key)."""

from __future__ import annotations

from hsd_torch.engine._cache import IdentityCache


def test_builds_once_per_owner_and_key() -> None:
    cache: IdentityCache[list[int]] = IdentityCache(size=3)
    builds: list[int] = []

    def build(v: int) -> list[int]:
        builds.append(v)
        return [v]

    a, b = object(), object()
    first = cache.get((a,), 1, lambda: build(1))
    assert cache.get((a,), 1, lambda: build(99)) is first  # hit: no build
    assert cache.get((b,), 1, lambda: build(2)) == [2]  # another owner, equal key: its own entry
    assert cache.get((a,), 2, lambda: build(3)) == [3]  # same owner, another key
    assert cache.get((a, b), 1, lambda: build(4)) == [4]  # a pair of owners: size reached, cleared
    assert cache.get((a,), 1, lambda: build(5)) == [5]  # rebuilt after the clear
    assert builds == [1, 2, 3, 4, 5]
    assert cache.get((b, a), 1, lambda: build(6)) == [6]  # owners are ordered
