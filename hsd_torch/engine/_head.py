"""A causal LM's output head run only where its logits are read (:class:`HeadTap`).

A Hugging Face causal LM applies its head (``get_output_embeddings()``, an ``nn.Linear`` of ``V``
rows) to every position it keeps (all of them, or the columns ``logits_to_keep`` names, the same
for every row), then whatever the model does after it (Gemma's final soft-capping: elementwise).
``generate`` reads fewer logits than that:

* **positions**: row ``b`` reads its own columns of the fed block (a prompt's last position, a
  round's proposals); with ragged blocks the rows' columns differ, and keeping their union for
  every row grows as rows x distinct columns x ``V`` (at batch 32 of mixed-length prompts on a
  262,144-id head, 32 x 32 positions: 1 GiB of float32 logits, where 32 suffice);
* **vocabulary rows**: TLI reads the drafter's law on the ids it shares with the target only,
  and the renormalized restriction of ``softmax(logits / T)`` to a set of ids is
  ``softmax(logits[ids] / T)`` over them (the other ids' logits cancel from it).

The tap runs the model's own forward and steers its head call: a forward pre-hook gathers the
head's input at each row's read columns (``[R, W, H]``), and, with ``rows`` given, hands the head an
empty input and replaces its output with ``hidden @ W[rows].T (+ bias[rows])``, so that what the
model applies after its head applies to those logits alone. Both hooks exist only during the one
forward call and act only in the thread that made it (a concurrent call of the same model in
another thread sees the model unchanged); the model is never modified. The rows' weights
``W[rows]`` are copied once per (head weight, rows) and refreshed if the weight changes in place.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

__all__ = ["HeadTap"]


class HeadTap:
    """The output head of ``model``, steered for one forward call at a time (:meth:`steer`).
    ``usable``: the head is an ``nn.Linear`` (every Hugging Face causal LM's); else the caller
    reads the model's own logits."""

    def __init__(self, model: Any) -> None:
        head = model.get_output_embeddings()
        self.head: torch.nn.Linear | None = head if isinstance(head, torch.nn.Linear) else None
        self._rows: tuple[Tensor, int, int, Tensor, Tensor | None] | None = None  # rows, ptr, version, W, b

    @property
    def usable(self) -> bool:
        return self.head is not None

    def _weights(self, rows: Tensor) -> tuple[Tensor, Tensor | None]:
        """``(W[rows], bias[rows] or None)``, copied once per rows tensor and head weight state."""
        head = self.head
        assert head is not None
        w = head.weight
        c = self._rows
        if c is None or c[0] is not rows or c[1] != w.data_ptr() or c[2] != w._version:
            with torch.no_grad():
                sub = w.detach().index_select(0, rows)
                bias = None if head.bias is None else head.bias.detach().index_select(0, rows)
            c = self._rows = (rows, w.data_ptr(), w._version, sub, bias)
        return c[3], c[4]

    @contextmanager
    def steer(self, read: Tensor | None, rows: Tensor | None) -> Iterator[list[bool]]:
        """During the block, the model's head (in this thread) runs at ``read [R, W]`` (int64: row
        ``r``'s ``W`` columns of the head's input ``[R, C, H]``; None: every column) and on the
        vocabulary ``rows [N]`` (int64 ids; None: all ``V``): the model's logits are ``[R, W, N]``,
        ``logits[r, j, n]`` the model's logit of id ``rows[n]`` at column ``read[r, j]``. Yields a
        one-element list that holds True once the head ran steered (a model that never called its
        head module leaves it False: the caller must not read its logits as steered)."""
        head = self.head
        assert head is not None
        owner = threading.get_ident()
        fired = [False]
        saved: list[Tensor] = []
        weights = None if rows is None else self._weights(rows)

        def pre(_m: Any, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
            if threading.get_ident() != owner or not args or not isinstance(args[0], Tensor) or args[0].dim() != 3:
                return None
            h = args[0]
            if read is not None:
                h = h.gather(1, read.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
            fired[0] = True
            if weights is None:
                return (h,) + tuple(args[1:])
            saved.append(h)
            return (h[:, :0],) + tuple(args[1:])  # the full head on no position: its output is replaced below

        def post(_m: Any, _args: tuple[Any, ...], out: Any) -> Any:
            if threading.get_ident() != owner or not saved or weights is None:
                return None
            return torch.nn.functional.linear(saved.pop(), weights[0], weights[1])

        handles = [head.register_forward_pre_hook(pre)]
        if weights is not None:
            handles.append(head.register_forward_hook(post))
        try:
            yield fired
        finally:
            for h in handles:
                h.remove()

