"""Teacher forcing and what the sequence audits share about their inputs: the prompts, the
drafter's fingerprint, the logits of given rows at given positions, and per-sequence scores
(log-likelihoods) for the two-sample tests.

Used by :mod:`hsd_torch.auditing.sequences` (the sequence audit),
:mod:`hsd_torch.auditing.text_sequences` (its text mode) and :mod:`hsd_torch.auditing.samples`
(recorded engines).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..engine._head import HeadTap
from ..engine.runner import takes_logits_to_keep
from ..vocab.text import TokenText
from ._ids import _as_ids, _width
from .reference import ProvidedLaw

__all__ = ["loglik", "model_fingerprint", "sequence_scores"]


def _prompts(prompts: Any) -> list[str]:
    plist = [prompts] if isinstance(prompts, str) else list(prompts) if prompts is not None else []
    if not plist:
        raise ValueError("prompts is empty: give a str or a list of str")
    for p in plist:
        if not isinstance(p, str):
            raise TypeError(f"each prompt must be a str, got {type(p).__name__}")
    return plist


def _prompt_ids(prompt_ids: Any, width: int) -> list[list[int]]:
    """``prompt_ids`` (one list of ints, or a list of them: one per prompt) as lists of ids."""
    rows = list(prompt_ids)
    if rows and all(not isinstance(r, (int, np.integer)) for r in rows):
        out = [_as_ids(r, f"prompt_ids[{k}] has", width) for k, r in enumerate(rows)]
    else:
        out = [_as_ids(rows, "prompt_ids has", width)]
    for k, r in enumerate(out):
        if not r:
            raise ValueError(f"prompt_ids {'' if len(out) == 1 else f'[{k}] '}is empty: the target needs at least one "
                             "id to condition on")
    return out


def model_fingerprint(model: Any) -> tuple[Any, ...]:
    """What identifies a model's computation cheaply: each module's name and class, each
    parameter's and buffer's name, shape, dtype, storage and in-place version counter. A sampler
    that replaces a head (transformers' sampled assisted generation wraps the assistant's input
    embedding and prunes its head in place) or writes into a weight changes it."""
    mods = tuple((n, type(m).__name__) for n, m in model.named_modules())
    tensors = tuple((n, tuple(t.shape), str(t.dtype), t.data_ptr(), getattr(t, "_version", 0))
                    for n, t in (*model.named_parameters(), *model.named_buffers()))
    return mods, tensors


def _changed(before: tuple[Any, ...], after: tuple[Any, ...]) -> str:
    """The first difference between two :func:`model_fingerprint` results, in words."""
    for (n, c), (n2, c2) in zip(before[0], after[0]):
        if (n, c) != (n2, c2):
            return f"module {n or '(root)'} was a {c}, is now {n2 or '(root)'}: {c2}"
    if len(before[0]) != len(after[0]):
        return f"{len(before[0])} modules before, {len(after[0])} after"
    for b, a in zip(before[1], after[1]):
        if b != a:
            what = ("written in place" if b[:4] == a[:4] else f"shape {b[1]} -> {a[1]}" if b[1] != a[1]
                    else "replaced")
            return f"tensor {b[0]} {what}"
    return "its parameters changed"


def _right_padded(rows: Sequence[Sequence[int]], dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` as one right-padded batch: input ids and attention mask, ``[len(rows), longest]``."""
    width = max(len(r) for r in rows)
    x = torch.zeros((len(rows), width), dtype=torch.long, device=dev)
    am = torch.zeros((len(rows), width), dtype=torch.long, device=dev)
    for i, r in enumerate(rows):
        x[i, :len(r)] = torch.tensor(list(r), dtype=torch.long)
        am[i, :len(r)] = 1
    return x, am


@torch.inference_mode()
def _forced_logits(model: Any, rows: Sequence[Sequence[int]], at: Sequence[Sequence[int]]) -> torch.Tensor:
    """The logits (the model's dtype, ``[sum_i len(at[i]), V]``: row ``i``'s after its first ``at[i][j]`` ids,
    for each ``j``, rows in order; every ``at[i]`` non-empty): one right-padded forward pass over all
    rows, the head run only from the first position any row reads (``logits_to_keep``, where the
    model takes it: on a 262k-id head the prompt's positions would cost as much as the audited
    ones). ``model`` may be a :class:`~hsd_torch.auditing.reference.ProvidedLaw`: its provider's rows instead."""
    if isinstance(model, ProvidedLaw):
        return model.forced(rows, at)
    dev = next(model.parameters()).device
    x, am = _right_padded(rows, dev)
    width = x.shape[1]
    lo = min(min(a) for a in at) - 1  # the first position any row reads: the head runs from there on
    kw = {"logits_to_keep": width - lo} if takes_logits_to_keep(model) else {}
    logits = model(input_ids=x, attention_mask=am, **kw).logits
    off = width - logits.shape[1]  # 0 without logits_to_keep, else lo
    ri = torch.tensor([i for i, a in enumerate(at) for _ in a], dtype=torch.long, device=dev)
    ci = torch.tensor([j - 1 - off for a in at for j in a], dtype=torch.long, device=dev)
    out: torch.Tensor = logits[ri, ci]
    return out


@torch.inference_mode()
def _shared_logits(model: Any, tap: HeadTap, rows: Sequence[Sequence[int]], at: Sequence[Sequence[int]],
                   ids: torch.Tensor) -> torch.Tensor | None:
    """:func:`_forced_logits` restricted to the columns ``ids``: one right-padded forward pass whose
    head runs at the read positions only and on the rows ``ids`` only (:class:`hsd_torch.engine._head.HeadTap`,
    so whatever the model does after its head, Gemma's soft-capping, still applies). None when the
    model's head is not a linear layer the tap can steer."""
    if not tap.usable:
        return None
    dev = ids.device
    x, am = _right_padded(rows, dev)
    w = max(len(a) for a in at)
    read = torch.tensor([[j - 1 for j in a] + [a[-1] - 1] * (w - len(a)) for a in at], dtype=torch.long, device=dev)
    with tap.steer(read, ids) as fired:
        logits = model(input_ids=x, attention_mask=am).logits
    if not fired[0]:
        return None
    keep = torch.tensor([k < len(a) for a in at for k in range(w)], dtype=torch.bool, device=dev)
    out: torch.Tensor = logits.reshape(len(at) * w, -1)[keep]
    return out



def loglik(model: Any, ctxs: Sequence[Sequence[int]], seqs: Sequence[Sequence[int]], chunk: int = 8) -> np.ndarray:
    """The raw (temperature 1) log-likelihood of each ``seqs[i]`` after ``ctxs[i]`` under ``model``
    (an HF model or a :class:`ProvidedLaw`: its own log-probabilities of the draws it already forced,
    else a call per draw), teacher forced ``chunk`` rows at a time; 0 for an empty sequence."""
    out = np.zeros(len(seqs))
    live = [i for i, s in enumerate(seqs) if len(s)]
    if isinstance(model, ProvidedLaw):  # the draws the sequence audit forced cost no call
        lps = model.token_logprobs([list(ctxs[i]) + list(seqs[i]) for i in live],
                                   [range(len(ctxs[i]), len(ctxs[i]) + len(seqs[i])) for i in live])
        for i, one in zip(live, lps):
            out[i] = float(one.sum())
        return out
    for c0 in range(0, len(live), chunk):
        idx = live[c0:c0 + chunk]
        rows = [list(ctxs[i]) + list(seqs[i]) for i in idx]
        lg = _forced_logits(model, rows, [range(len(ctxs[i]), len(ctxs[i]) + len(seqs[i])) for i in idx])
        lp = torch.log_softmax(lg.double(), dim=-1)
        x = torch.tensor([t for i in idx for t in seqs[i]], dtype=torch.long, device=lp.device)
        got = lp[torch.arange(x.numel(), device=lp.device), x].cpu().numpy()
        ends = np.cumsum([0] + [len(seqs[i]) for i in idx])
        for k, i in enumerate(idx):
            out[i] = float(got[ends[k]:ends[k + 1]].sum())
    return out


def sequence_scores(law: Any, tt: Any, drafter: Any, dt: Any, ctxs: Sequence[Sequence[int]], texts: Sequence[str],
            seqs: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
    """Per-sequence scores for the two-sample test: the log-likelihood under the reference and, with a
    drafter, under the drafter (its own encoding of the prompt's text and of the generated text)
    and the difference."""
    out = {"log-likelihood under the reference": loglik(law, ctxs, seqs)}
    if drafter is not None:
        dtt = TokenText.get(dt, _width(drafter))
        dctx = [dtt.prompt_ids(t) for t in texts]
        dseq = [dtt.encode_prompt(tt.decode(list(s))) if len(s) else [] for s in seqs]
        out["log-likelihood under the drafter"] = loglik(drafter, dctx, dseq)
        out["drafter minus reference log-likelihood"] = out["log-likelihood under the drafter"] - out[
            "log-likelihood under the reference"]
    return out
