"""The first-token audit's reference over cells (:func:`hsd_torch.auditing.first_tokens.audit_generate`;
the pooling rules are in that module's docstring): the coarse law :func:`reference_law` computes from
the target's processed laws, how an output maps to its cell (ids, or texts with ``text=True``), and
the draws that feed :func:`hsd_core.audit.audit_sampler` (one by one, or a batched sampler's, replayed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..engine.entry import process_logits
from ._ids import _as_ids
from .reference import ProvidedLaw

__all__ = ["ANY", "RARE", "Reference", "reference_law"]

ANY = -1
"""Cell marker: "any continuation" (after a prefix that was not expanded)."""

RARE = -2
"""Cell marker: "one of the tokens of expected count < 5 at this position" (pooled)."""

_MIN_EXPECTED = 5.0


@dataclass(frozen=True)
class Reference:
    """The coarse reference law and how to map an output to its cell."""

    law: dict[tuple[int, ...], float]
    positions: int
    eos_ids: frozenset[int]
    kept: dict[tuple[int, ...], frozenset[int]]   # expanded prefix -> its tokens with cells of their own
    zero: dict[tuple[int, ...], frozenset[int]]   # expanded prefix -> its tokens of probability 0
    frequent: tuple[tuple[int, ...], ...]         # prefixes whose next-token law is tested
    coarse_mass: float                            # mass of the RARE / ANY cells
    forward_passes: int
    greedy: bool = False

    def cell(self, ids: Sequence[int]) -> tuple[int, ...]:
        """The cell of an output (a list of new target ids)."""
        out: list[int] = []
        for t in ids[:self.positions]:
            out.append(int(t))
            if int(t) in self.eos_ids:
                break
        s = tuple(out)
        if self.greedy:
            return s
        pre: tuple[int, ...] = ()
        for j, t in enumerate(s):
            if pre not in self.kept:
                return pre + (ANY,) * (self.positions - j)
            if t in self.kept[pre]:
                pre = pre + (t,)
                continue
            if t in self.zero[pre]:
                return pre + (t,)  # probability 0: outside the law, rejected
            return pre + (RARE,) + (ANY,) * (self.positions - j - 1)
        return s


@torch.inference_mode()
def _laws(target: Any, contexts: Sequence[Sequence[int]], mask: torch.Tensor, process: Mapping[str, Any],
          batch: int = 32) -> list[np.ndarray]:
    """The processed next-token law (float64 numpy) after each context (all of one length);
    ``target`` may be a :class:`~hsd_torch.auditing.reference.ProvidedLaw` (the provider's laws)."""
    if isinstance(target, ProvidedLaw):
        return [row.numpy() for row in process_logits(target.next_laws(contexts), mask, **process)]
    dev = next(target.parameters()).device
    out: list[np.ndarray] = []
    for i in range(0, len(contexts), batch):
        x = torch.tensor([list(c) for c in contexts[i:i + batch]], dtype=torch.long, device=dev)
        logits = target(input_ids=x).logits[:, -1, :].double()
        probs = process_logits(logits, mask.to(dev), **process)
        out.extend(row.cpu().numpy() for row in probs)
    return out


def reference_law(target: Any, prompt_ids: Sequence[int], n: int, positions: int, eos_ids: frozenset[int],
                  mask: torch.Tensor, process: Mapping[str, Any], do_sample: bool = True,
                  max_prefixes: int = 512, max_conditional: int = 8) -> Reference:
    """The coarse reference law for ``n`` draws (the module docstring of
    :mod:`hsd_torch.auditing.first_tokens`)."""
    if not do_sample:
        seq: list[int] = []
        for _ in range(positions):
            p = _laws(target, [list(prompt_ids) + seq], mask, process)[0]
            t = int(np.argmax(p))
            seq.append(t)
            if t in eos_ids:
                break
        return Reference({tuple(seq): 1.0}, positions, eos_ids, {}, {}, (), 0.0, len(seq), greedy=True)
    law: dict[tuple[int, ...], float] = {}
    kept: dict[tuple[int, ...], frozenset[int]] = {}
    zero: dict[tuple[int, ...], frozenset[int]] = {}
    coarse = 0.0
    passes = 0
    budget = max_prefixes
    frontier: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    for depth in range(positions):
        frontier.sort(key=lambda x: -x[1])
        go = [(pre, mass) for pre, mass in frontier if depth == 0 or n * mass >= _MIN_EXPECTED][:budget]
        goset = {pre for pre, _ in go}
        for pre, mass in frontier:
            if pre not in goset:
                law[pre + (ANY,) * (positions - depth)] = mass
                coarse += mass
        if depth > 0:
            budget -= len(go)
        rows = _laws(target, [list(prompt_ids) + list(pre) for pre, _ in go], mask, process)
        passes += len(go)
        nxt: list[tuple[tuple[int, ...], float]] = []
        last = depth == positions - 1
        for (pre, mass), row in zip(go, rows):
            pr = mass * row
            keep = np.flatnonzero(n * pr >= _MIN_EXPECTED)
            kept[pre] = frozenset(int(t) for t in keep)
            zero[pre] = frozenset(int(t) for t in np.flatnonzero(row <= 0))
            rare = float(mass - pr[keep].sum())
            if rare > 1e-15 and bool((row > 0).sum() > len(keep)):
                law[pre + (RARE,) + (ANY,) * (positions - depth - 1)] = rare
                coarse += rare
            for t in keep.tolist():
                if t in eos_ids or last:
                    law[pre + (t,)] = float(pr[t])
                else:
                    nxt.append((pre + (t,), float(pr[t])))
        frontier = nxt
    total = sum(law.values())
    law = {k: v / total for k, v in law.items()}
    frequent = tuple(sorted((pre for pre in kept if pre and n * _prefix_mass(law, pre) >= 20 * _MIN_EXPECTED),
                            key=lambda pre: -_prefix_mass(law, pre))[:max_conditional])
    return Reference(law, positions, eos_ids, kept, zero, frequent, coarse, passes)


def _prefix_mass(law: Mapping[tuple[int, ...], float], pre: tuple[int, ...]) -> float:
    k = len(pre)
    return sum(p for s, p in law.items() if s[:k] == pre and len(s) > k)


class _IdCells:
    """Id mode: a sampler's output checked (:func:`_as_ids`) and mapped to its reference cell, and
    whether it starts with the prompt's ids (a sampler returning prompt + new ids)."""

    def __init__(self, ref: Reference, width: int, head: Sequence[int]) -> None:
        self.ref, self.width, self.head = ref, width, list(head)

    def cell(self, out: Any, what: str) -> tuple[tuple[int, ...], bool]:
        ids = _as_ids(out, what, self.width)
        return self.ref.cell(ids), _starts_with(ids, self.head)


class _Draw:
    """One audited draw: ``sample_fn(prompt, seed)`` with a 32-bit seed from the chunk's generator,
    its output checked and mapped to its cell by ``cells`` (:class:`_IdCells` or :class:`_TextCells`,
    naming the draw by its seed); ``with_prompt`` counts the outputs that start with the prompt. A
    class (not a closure) so process executors can pickle it."""

    def __init__(self, sample_fn: Callable[[str, int], Any], prompt: str, cells: _IdCells | _TextCells) -> None:
        self.sample_fn, self.prompt, self.cells, self.with_prompt = sample_fn, prompt, cells, 0

    def __call__(self, rng: np.random.Generator) -> tuple[int, ...]:
        seed = int(rng.integers(0, 2**32))
        cell, with_prompt = self.cells.cell(self.sample_fn(self.prompt, seed),
                                            f"sample_fn({self.prompt!r}, {seed}) (the draw with seed {seed}) returned")
        self.with_prompt += with_prompt
        return cell


class _TextCells:
    """Text mode: the law of the decoded text of the first ``positions`` tokens, cells numbered
    ``(i,)`` in order of the reference's cells (several token cells may decode to one text: their
    masses add); ``(len(texts),)`` is "a text no such token sequence decodes to", of probability 0.
    ``ValueError`` when the reference pooled cells (their texts are unknown, so the text law would
    not be exact)."""

    def __init__(self, ref: Reference, tokenizer: Any, prompt: str) -> None:
        if ref.coarse_mass > 0:
            raise ValueError(f"text=True needs every cell of the reference expanded, but {ref.coarse_mass:.4g} of the "
                             "mass is pooled in rare / unexpanded cells, whose texts are unknown: give a top_k (or "
                             "top_p) that keeps few tokens, fewer positions, or audit ids")
        self.prompt = prompt
        self.index: dict[str, int] = {}
        law: dict[tuple[int, ...], float] = {}
        for cell, p in ref.law.items():
            t = tokenizer.decode(list(cell), skip_special_tokens=True)
            i = self.index.setdefault(t, len(self.index))
            law[(i,)] = law.get((i,), 0.0) + p
        self.texts = list(self.index)
        self.law = law

    def cell(self, out: Any, what: str) -> tuple[tuple[int, ...], bool]:
        """The cell of a sampler's text (``TypeError`` for anything but a str), and whether the text
        starts with the prompt (a sampler returning prompt + new text)."""
        if not isinstance(out, str):
            raise TypeError(f"{what} a {type(out).__name__}, not the new text (a str; text=True)")
        with_prompt = bool(self.prompt) and len(out) > len(self.prompt) and out.startswith(self.prompt)
        return (self.index.get(out, len(self.texts)),), with_prompt

    def text_of(self, cell: tuple[int, ...]) -> str:
        return self.texts[cell[0]] if cell[0] < len(self.texts) else "<a text the target cannot write here>"


def _starts_with(ids: Sequence[int], head: Sequence[int]) -> bool:
    """Whether ``ids`` is ``head`` (non-empty) followed by more ids: a sampler returning prompt + new."""
    return bool(head) and len(ids) > len(head) and list(ids[:len(head)]) == list(head)


class _Replay:
    """A sample function that returns precomputed cells in order (the batched sampler's draws,
    fed to :func:`hsd_core.audit.audit_sampler` serially); ``with_prompt`` as :class:`_Draw`'s."""

    def __init__(self, cells: list[tuple[int, ...]], with_prompt: int) -> None:
        self.cells, self.at, self.with_prompt = cells, 0, with_prompt

    def __call__(self, rng: np.random.Generator) -> tuple[int, ...]:
        self.at += 1
        return self.cells[self.at - 1]


def _batched_cells(sample_batch_fn: Callable[[list[str], list[int]], Sequence[Any]], prompt: str,
                   cells_of: _IdCells | _TextCells, n: int, seed: int, chunk_size: int, batch_size: int) -> _Replay:
    """The cells of ``n`` draws of a batched sampler, each draw with the seed it would get from
    :class:`_Draw` (chunk ``j``'s generator, one 32-bit integer per draw, in order), to replay."""
    seeds: list[int] = []
    for j, start in enumerate(range(0, n, chunk_size)):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(j,)))
        seeds.extend(int(rng.integers(0, 2**32)) for _ in range(min(chunk_size, n - start)))
    cells: list[tuple[int, ...]] = []
    with_prompt = 0
    for b0 in range(0, n, batch_size):
        sb = seeds[b0:b0 + batch_size]
        outs = list(sample_batch_fn([prompt] * len(sb), sb))
        if len(outs) != len(sb):
            raise ValueError(f"sample_batch_fn returned {len(outs)} outputs for {len(sb)} prompts")
        for s, out in zip(sb, outs):
            cell, starts = cells_of.cell(out, f"sample_batch_fn (the draw with seed {s}) returned")
            cells.append(cell)
            with_prompt += starts
    return _Replay(cells, with_prompt)
