"""A zoo of real-world speculative-decoding bugs, as deliberately lossy variants of
:func:`hsd_torch.generate` (docs/auditing.md, "A zoo of real-world bugs").

Each variant is a one-line departure from the correct code, modelled on a bug class seen in public
SD implementations, applied for the duration of a ``with variant.patch():`` block (it replaces one
function or hook of the real code path by a wrapper that changes one thing; the rest runs as is).
:func:`generate_with` runs ``generate`` under one. One variant is lossless on purpose (the drafter's
context is free, ``proofs/sd.md``): an audit must not flag it.

``docs/auditing.md`` ("A zoo of real-world bugs") tabulates, for each variant on the tiny pair, the
verdict of :func:`hsd_torch.auditing.first_tokens.audit_generate` (first two tokens) and of
:func:`hsd_torch.auditing.sequences.audit_sequences` (200 sequences x 32 tokens), from ``bench/zoo.py``;
``tests/torch/auditing/test_variants_zoo.py`` asserts the sequence audit's verdicts.

What a variant may replace is declared where it is defined: each module that offers a seam lists
it in a module-level ``ZOO_SEAMS`` tuple (:mod:`hsd_torch.engine.kernels`, :mod:`hsd_torch.engine.verification`,
:mod:`hsd_torch.engine.runner`, :mod:`hsd_torch.engine.tree_cache`, :mod:`hsd_torch.methods.tli`), and every patch goes through
:func:`patch_seam`, which refuses any other name (:class:`NotASeam`).

Not thread-safe: a patch changes module attributes for every caller while it is active.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from ..engine import kernels, verification
from ..engine.runner import Runner
from ..engine.tree_cache import TreeCache
from ..methods.tli import TLI

__all__ = ["TREE_VARIANTS", "VARIANTS", "NotASeam", "Variant", "active_patches", "generate_with", "patch_seam",
           "seam_name"]


class NotASeam(LookupError):
    """A patch of a name that its module does not declare in its ``ZOO_SEAMS``."""


def seam_name(owner: Any, name: str) -> tuple[ModuleType, str]:
    """The module that defines ``owner`` (a module, or a class of one) and the seam's name there:
    ``name`` for a module, ``"Class.name"`` for a class."""
    if isinstance(owner, ModuleType):
        return owner, name
    return sys.modules[owner.__module__], f"{owner.__qualname__}.{name}"


@contextmanager
def patch_seam(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """Replace ``owner.name`` by ``make(original)`` inside the block (restored after it, also on
    an error). ``owner`` is a module or a class; the name must be one its module declares as a seam
    (its ``ZOO_SEAMS`` tuple: ``name``, or ``"Class.name"`` for a class's attribute), else
    :class:`NotASeam` before anything is changed. Every patch of the zoo goes through here."""
    module, seam = seam_name(owner, name)
    declared: tuple[str, ...] = getattr(module, "ZOO_SEAMS", ())
    if seam not in declared:
        raise NotASeam(f"{module.__name__}.{seam} is not a seam of the bug zoo (the module declares "
                       f"{declared or 'none'} in its ZOO_SEAMS): declare it there, where it is defined")
    orig = getattr(owner, name)
    setattr(owner, name, make(orig))
    where = f"{module.__name__}.{seam}"
    _ACTIVE.append(where)
    try:
        yield
    finally:
        setattr(owner, name, orig)
        _ACTIVE.remove(where)


_ACTIVE: list[str] = []


def active_patches() -> tuple[str, ...]:
    """The seams (``module.seam``) that :func:`patch_seam` has replaced in this process right now,
    in the order they were patched: what another process (a conformance worker) would not see."""
    return tuple(_ACTIVE)


@dataclass(frozen=True)
class Variant:
    """One bug: ``name``, what it does (``bug``), the bug class it models (``seen_in``), whether it
    is lossless (only the lossless-on-purpose one), the ``generate`` settings it needs to show
    (``needs``: e.g. a top-p, or ``batch`` for a bug in the batched path), and ``patch()``, the
    context manager that applies it."""

    name: str
    bug: str
    seen_in: str
    patch: Callable[[], Any]
    lossless: bool = False
    needs: dict[str, Any] = field(default_factory=dict)
    methods: tuple[str, ...] = ("tli",)


def _q_permuted() -> Any:
    # the proposal laws of the ratio test and the residual read one column off (a head pruned in one
    # order and scattered back in another)
    def make(orig: Any) -> Any:
        def host(p: Any, q: Any, drafts: Any, n_drafts: Any, u_accept: Any, u_final: Any, **kw: Any) -> Any:
            return orig(p, None if q is None else q.roll(1, dims=-1), drafts, n_drafts, u_accept, u_final, **kw)
        return host
    return patch_seam(kernels, "_rejection_host", make)


def _prompt_token_twice() -> Any:
    # the target's cache holds the prompt's last id twice, for the whole run (the prompt prefilled, then
    # its last id fed again as the first decoding step): every target context is seen with that id doubled
    prompt_len: dict[tuple[int, int], int] = {}

    def make(orig: Any) -> Any:
        def sync(self: Runner, i: int, context: Any) -> list[int]:
            if self.name != "target":
                return list(orig(self, i, context))
            if not self.ids[i]:  # the row's first sync: its context is the prompt
                prompt_len[id(self), i] = len(context)
            n = prompt_len[id(self), i]
            return list(orig(self, i, [*context[:n], context[n - 1], *context[n:]]))
        return sync
    return patch_seam(Runner, "sync", make)


def _first_draft_accepted() -> Any:
    # the first draft's ratio test always passes (its uniform is 0: accepted wherever p > 0)
    def make(orig: Any) -> Any:
        def host(p: Any, q: Any, drafts: Any, n_drafts: Any, u_accept: Any, u_final: Any, **kw: Any) -> Any:
            if u_accept is not None:
                u_accept = [[0.0] + r[1:] if r else r for r in u_accept]
            return orig(p, q, drafts, n_drafts, u_accept, u_final, **kw)
        return host
    return patch_seam(kernels, "_rejection_host", make)


def _residual_minus_qx() -> Any:
    # the residual after a rejection is (p - q(x) e_x)+ (q subtracted at the draft's column only)
    def make(orig: Any) -> Any:
        def host(p: Any, q: Any, drafts: Any, n_drafts: Any, u_accept: Any, u_final: Any, **kw: Any) -> Any:
            if q is not None and q.shape[1]:
                idx = torch.tensor([r[:q.shape[1]] for r in drafts], dtype=torch.long, device=q.device).unsqueeze(-1)
                q = torch.zeros_like(q).scatter_(-1, idx, q.gather(-1, idx))
            return orig(p, q, drafts, n_drafts, u_accept, u_final, **kw)
        return host
    return patch_seam(kernels, "_rejection_host", make)


def _unprocessed_verification() -> Any:
    # the target's law in verification ignores top-k / top-p while the drafts use them
    def make(orig: Any) -> Any:
        def space_head_law(logits: Any, space: Any, drop: Any, temperature: float, top_k: Any, top_p: Any) -> Any:
            return orig(logits, space, drop, temperature, None, None)
        return space_head_law
    return patch_seam(verification, "space_head_law", make)


def _cache_cropped_short() -> Any:
    # after a rejection the target's KV cache keeps the first forgotten column (cropped one short)
    def make(orig: Any) -> Any:
        def forget(self: Runner, i: int, m: int) -> list[int]:
            cols: list[int] = orig(self, i, m)
            return cols[1:] if self.name == "target" else cols
        return forget
    return patch_seam(Runner, "_forget", make)


def _positions_not_reset() -> Any:
    # after a rejection the target's position ids go on from the most ids the row ever held
    def make(orig: Any) -> Any:
        def first(self: Runner, i: int) -> int:
            return self.high[i] if self.name == "target" else int(orig(self, i))
        return first
    return patch_seam(Runner, "_first_position", make)


def _resync_drops_token() -> Any:
    # TLI's drafter re-sync drops each round's last emitted token (lossless: the drafter's context is free)
    def make(orig: Any) -> Any:
        def resync(self: TLI, gen: Any, i: int, out: list[int]) -> Any:
            return orig(self, gen, i, out[:-1])
        return resync
    return patch_seam(TLI, "resync", make)


VARIANTS: dict[str, Variant] = {v.name: v for v in [
    Variant("q_columns_permuted", "the proposal law q read one column off in the ratio test and the residual",
            "a drafter head pruned to the shared ids in one order and scattered back in another", _q_permuted,
            methods=("tli", "sd")),
    Variant("prompt_token_twice", "the target's cache holds the prompt's last id twice (prefilled, then fed "
            "again as the first decoding step)",
            "an off-by-one between the prompt's prefill and the first decoding step", _prompt_token_twice),
    Variant("first_draft_accepted", "the first draft of each round is accepted whenever the target gives it mass",
            "a ratio test skipped for the first position", _first_draft_accepted),
    Variant("residual_minus_qx", "the residual after a rejection is (p - q(x) e_x)+ instead of (p - q)+",
            "the residual written with the draft's probability only", _residual_minus_qx),
    Variant("unprocessed_verification", "verification against the target's law without top-k / top-p "
            "while the drafts use them", "processing applied to the drafter only",
            _unprocessed_verification, needs={"top_p": 0.8}),
    Variant("cache_cropped_short", "after a rejection the target's KV cache keeps one rejected column",
            "a cache crop off by one after a rollback", _cache_cropped_short),
    Variant("positions_not_reset", "after a rejection the target's position ids go on from the rejected drafts",
            "position ids not rolled back with the cache (batched rows)", _positions_not_reset,
            needs={"batch": True}),
    Variant("resync_drops_token", "TLI's drafter re-sync drops each round's last emitted token",
            "a drafter re-sync that loses a token (lossless: the drafter's context is free)", _resync_drops_token,
            lossless=True),
]}
"""Name -> :class:`Variant`."""


def _siblings_see_each_other() -> Any:
    # the tree mask lets a node see the siblings drafted before it (a causal mask over the tree's
    # columns, ancestors added, the other branches not removed)
    def make(orig: Any) -> Any:
        def visible(self: TreeCache, i: int, v: int, parent: int) -> list[int]:
            seen: list[int] = orig(self, i, v, parent)
            sibs = [self.col[i][u] for u in self.col[i] if 0 < u < v and self._parent[i].get(u) == parent]
            return sorted(set(seen) | set(sibs))
        return visible
    return patch_seam(TreeCache, "_visible", make)


def _tree_position_off_by_one() -> Any:
    # a node's position id is context length + depth (the root's position counted as the context's length)
    def make(orig: Any) -> Any:
        def position(self: TreeCache, i: int, parent: int) -> int:
            return int(orig(self, i, parent)) + (1 if parent == 0 else 0)
        return position
    return patch_seam(TreeCache, "_node_position", make)


def _tree_cache_not_compacted() -> Any:
    # the accepted path is recorded as the row's ids, but its keys and values are left where the tree put
    # them: the columns after the context hold the first nodes in drafting order, not the path
    def make(orig: Any) -> Any:
        def move(self: TreeCache, slot: int, src: Any, dst: Any) -> None:
            if self.runner.name != "target":
                orig(self, slot, src, dst)
        return move
    return patch_seam(TreeCache, "_move", make)


TREE_VARIANTS: dict[str, Variant] = {v.name: v for v in [
    Variant("tree_siblings_see_each_other", "the tree mask lets a node attend to the siblings drafted before it",
            "a tree mask built as causal over the tree's columns with the other branches not removed",
            _siblings_see_each_other, methods=("sd",)),
    Variant("tree_position_off_by_one", "a tree node's position id is context length + depth (one too many)",
            "tree position ids counted from the context's length instead of its last position",
            _tree_position_off_by_one, methods=("sd",)),
    Variant("tree_cache_not_compacted", "after a tree round the target's cache keeps the nodes where the tree put "
            "them (the accepted path recorded, its keys and values not moved)",
            "a KV cache cropped to the accepted length instead of compacted to the accepted path",
            _tree_cache_not_compacted, methods=("sd",)),
]}
"""Name -> :class:`Variant`: the token-tree bugs (issue 50), for ``generate(..., tree=...)``; kept
apart from :data:`VARIANTS`, whose runs draft single paths on a pair of different tokenizers."""


def generate_with(variant: str | Variant, *args: Any, **kw: Any) -> Any:
    """``hsd_torch.generate(*args, **kw)`` with ``variant`` (a name of :data:`VARIANTS` or
    :data:`TREE_VARIANTS`, or a :class:`Variant`) applied."""
    from ..engine.entry import generate

    v = (VARIANTS.get(variant) or TREE_VARIANTS[variant]) if isinstance(variant, str) else variant
    with v.patch():
        return generate(*args, **kw)
