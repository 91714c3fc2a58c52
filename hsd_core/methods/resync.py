"""The drafter's context of the string-level methods (SLEM, SLRS): its encoding of the text so far,
re-synced every round, computed incrementally.

The rule (:func:`drafter_context_ids`) is a function of the text alone, so a round still depends only
on its state (``base`` module docstring) and the exact engine enumerates it unchanged. With
``Resync(stride=None)`` it is the drafter's encoding of the whole text. With a stride ``S`` and a
look-behind ``w`` the text is cut at the fixed offsets ``S, 2S, ...`` (characters for ``hsd_core``
strings, bytes for ``hsd_torch``'s byte texts), and block by block:

1. encode the pending text (initially empty) followed by the next block;
2. commit all of that encoding but its last ``w`` ids, provided the encoding spells exactly what
   was encoded: the text of the last ``w`` ids becomes the pending text of the next block.
   Otherwise nothing is committed and the whole encoded text stays pending (a tokenizer that
   prepends a space to every encoding, or one that drops a byte it has no token for: the rule
   then re-encodes from there on, as the whole-text rule does);
3. after the last whole block: the context is the committed ids followed by the encoding of the
   pending text and the rest of the text.

Each round then encodes at most the new blocks and one tail of at most ``S`` characters plus the
text of ``w`` ids, instead of the whole text (a memo, :class:`ResyncMemo`, keeps the committed
ids of a text that only grows). The result equals the whole text's encoding whenever the
tokenizer's choices never reach back more than ``w`` ids across a cut (true of pre-tokenized BPE
for ``w >= 1`` in practice); where they do, the drafter sees a slightly different segmentation of
the same text. Either way losslessness is untouched: the drafter's context only shapes proposals
(``proofs/sd.md``, "The drafter's context is free").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

__all__ = ["Resync", "ResyncMemo", "drafter_context_ids"]

Text = TypeVar("Text", str, bytes)

DEFAULT_STRIDE = 256
DEFAULT_LOOKBEHIND = 4


@dataclass(frozen=True)
class Resync:
    """How the drafter's context is re-synced from the text: cuts every ``stride`` characters (or
    bytes), each keeping its last ``lookbehind`` ids pending (module docstring). ``stride=None``
    re-encodes the whole text every round. Defaults: ``stride=256``, ``lookbehind=4``."""

    stride: int | None = DEFAULT_STRIDE
    lookbehind: int = DEFAULT_LOOKBEHIND

    def __post_init__(self) -> None:
        s, w = self.stride, self.lookbehind
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1):
            raise ValueError(f"Resync stride must be None or an integer >= 1, got {s!r}")
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 0:
            raise ValueError(f"Resync lookbehind must be an integer >= 0, got {w!r}")


def as_resync(resync: Resync | None) -> Resync:
    """``resync`` checked (``None``: the default :class:`Resync`), else ``TypeError``."""
    if resync is None:
        return Resync()
    if not isinstance(resync, Resync):
        raise TypeError(f"resync must be a hsd_core.methods.Resync or None, got {type(resync).__name__}")
    return resync


@dataclass
class ResyncMemo(Generic[Text]):
    """What :func:`drafter_context_ids` computed for the whole blocks of an earlier text: valid for
    any later text that starts with ``prefix`` (checked on every use)."""

    prefix: Text
    blocks: int = 0
    committed: list[int] = field(default_factory=list)
    pending_start: int = 0


def drafter_context_ids(text: Text, encode: Callable[[Text], Sequence[int]], decode: Callable[[Sequence[int]], Text],
                        resync: Resync, memo: ResyncMemo[Text] | None = None) -> list[int]:
    """The drafter's context for ``text`` under ``resync`` (the rule of the module docstring): a
    function of ``text``, ``encode``, ``decode`` and ``resync`` only. ``memo`` (updated in place)
    saves re-encoding the blocks of an earlier text that ``text`` extends; one whose prefix
    ``text`` does not start with is started afresh."""
    stride, w = resync.stride, resync.lookbehind
    if stride is None:
        return list(encode(text))
    if memo is None or not text.startswith(memo.prefix):
        memo = _reset(memo, text)
    committed, start = memo.committed, memo.pending_start
    blocks = len(text) // stride
    for j in range(memo.blocks + 1, blocks + 1):
        end = j * stride
        seg = text[start:end]
        ids = list(encode(seg))
        keep = len(ids) - w
        if keep > 0 and decode(ids) == seg:
            committed.extend(ids[:keep])
            start = end - len(decode(ids[keep:]))
        memo.blocks, memo.pending_start, memo.prefix = j, start, text[:end]
    return committed + list(encode(text[start:]))


def _reset(memo: ResyncMemo[Text] | None, text: Text) -> ResyncMemo[Text]:
    empty = text[:0]
    if memo is None:
        return ResyncMemo(empty)
    memo.prefix, memo.blocks, memo.committed, memo.pending_start = empty, 0, [], 0
    return memo
