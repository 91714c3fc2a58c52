"""The laws the sequence audit reads from teacher-forced logits (:mod:`hsd_torch.auditing.sequences`):
a block of positions' processed law (greedy: the argmax), the drafter's law pushed onto target ids,
the probability a law with one token more gives each token (the top-k / top-p test), and which of a
few processings the audited tokens fit best (:class:`_Fit`, on at most :data:`FIT_POSITIONS` positions).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..engine.laws import process_logits
from ..vocab import VocabBridge

__all__ = ["FIT_POSITIONS"]

FIT_POSITIONS = 256
"""Positions (at most; a seeded subsample) on which a lossy report's processing fit is computed."""


def _law_block(blk: torch.Tensor, mask: torch.Tensor, process: dict[str, Any], greedy: bool) -> torch.Tensor:
    """The processed law (float64) of the logits ``blk [b, V]`` (greedy: the one-hot argmax over
    ``mask``, ties to the lowest id)."""
    blk = blk.double()
    m = mask.to(blk.device)
    if not greedy:
        return process_logits(blk, m, **process)
    blk = blk.masked_fill(~m, float("-inf"))
    law = torch.zeros_like(blk)
    law[torch.arange(blk.shape[0]), blk.argmax(-1)] = 1.0
    return law


class _Fit:
    """Which of a few processings the audited tokens fit best (the module docstring of
    :mod:`hsd_torch.auditing.sequences`): the log-likelihood of each on a seeded subsample of at most
    :data:`FIT_POSITIONS` positions."""

    def __init__(self, claimed: dict[str, Any], do_sample: bool, seed: int, expected_steps: int) -> None:
        t = claimed["temperature"]
        free = {"top_k": None, "top_p": None}
        cands = {"the claimed processing": dict(claimed),
                 "temperature 1 without top-k / top-p": {"temperature": 1.0, **free},
                 f"temperature {t} without top-k / top-p": {"temperature": t, **free}}
        for f in (0.8, 0.9, 1.1, 1.25):
            cands[f"the claimed processing at temperature {t * f:.4g}"] = dict(claimed, temperature=t * f)
        self.cands = {k: v for i, (k, v) in enumerate(cands.items()) if i == 0 or v != dict(claimed)}
        self.on = do_sample
        self.rate = min(1.0, FIT_POSITIONS / max(1, expected_steps))
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 3]))
        self.ll = dict.fromkeys(self.cands, 0.0)
        self.m = 0

    def add(self, logits: torch.Tensor, mask: torch.Tensor, x: np.ndarray, law: np.ndarray) -> None:
        """Add the positions of a block picked for the subsample: ``logits [b, V]`` and the
        claimed ``law [b, V]`` of the sampled ids ``x [b]``."""
        if not self.on:
            return
        pick = np.flatnonzero(self.rng.random(len(x)) < self.rate)
        if not pick.size:
            return
        self.m += pick.size
        xs = torch.as_tensor(x[pick])
        with np.errstate(divide="ignore"):
            for name, proc in self.cands.items():
                pr = (law[pick, x[pick]] if name == "the claimed processing" else
                      _law_block(logits[torch.as_tensor(pick)], mask, proc, False)
                      .gather(1, xs[:, None].to(logits.device))[:, 0].cpu().numpy())
                self.ll[name] += float(np.log(pr).sum())

    def best(self) -> str | None:
        """The best-fitting processing, in words, when it is not the claimed one (None otherwise,
        or when none gives every picked token mass)."""
        if not self.m or len(self.cands) < 2:
            return None
        top = max(self.ll, key=lambda k: self.ll[k])
        if top == "the claimed processing" or self.ll[top] == -math.inf:
            return None
        return (f"{top} (log-likelihood {self.ll[top]:.1f} against the claimed {self.ll['the claimed processing']:.1f}, "
                f"on {self.m} positions)")


def _drafter_block(bridge: VocabBridge, lg: torch.Tensor, d_mask: torch.Tensor, process: dict[str, Any],
                   greedy: bool, p_law: np.ndarray) -> np.ndarray:
    """The drafter's law before each new target id of a block (``[b, V]`` over target ids, rows as
    ``p_law``'s) from its logits ``lg``: processed, restricted to the shared strings, renormalized,
    pushed; where it has no mass there, the target's own law (no evidence either way)."""
    restricted = bridge.restrict(_law_block(lg, d_mask, process, greedy).to(bridge.device))
    pushed: np.ndarray = bridge.push(restricted.law).cpu().numpy()
    none = (restricted.mass <= 0).cpu().numpy()
    pushed[none] = p_law[none]
    return pushed


def _one_more(raw: np.ndarray, p: np.ndarray) -> np.ndarray:
    """At each position, the probability that a law with one token more than the processed ``p``
    (top-k plus one, or top-p keeping the next token) gives that token: the tempered, untruncated
    law ``raw`` restricted to ``p``'s support plus the most likely id outside it, renormalized."""
    outside = np.where(p > 0, -1.0, raw)
    j = outside.argmax(1)
    extra = np.clip(outside[np.arange(len(j)), j], 0.0, None)
    kept = np.where(p > 0, raw, 0.0).sum(1)
    out: np.ndarray = np.where(extra > 0, extra / (kept + extra), 0.0)
    return out
