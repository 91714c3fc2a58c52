"""Sequence audits of any ``generate()`` against a Hugging Face target: :func:`audit_sequences`.

The statistics are :mod:`hsd_core.seqaudit`'s (:class:`~hsd_core.seqaudit.SequenceEvidence`): every
new token of ``n`` sampled sequences is tested against the target's own conditional law at its
position, obtained by **teacher forcing**: each chunk of ``batch_size`` sequences is run through the
target in one right-padded forward pass (prompt + new ids), and the logits before each new token
are processed as :func:`hsd_torch.generate.process_logits` does (float64; with
``mask_textless=True`` also hsd_torch's removal of ids without text, as :func:`audit_generate`).
With a drafter, its law at each position is read the same way: its context is its own encoding of
the prompt, then each new target id re-synced as TLI does (the drafter id with that text, else its
encoding of the text), so it depends on the history only; processed like the target's, restricted
to the shared strings, renormalized and pushed onto target ids (:class:`~hsd_torch.vocab.VocabBridge`).
For each named context bug (``context_bugs``, :mod:`hsd_core.context_bugs`), the sequences are
teacher-forced once more through the bug's context (by default the prompt with its last id twice),
and the laws read there give the test aimed at that bug.

Float rounding: teacher forcing runs without a cache, the audited sampler with one; in float32 the
two laws differ by ~1e-6, far below any detectable departure. In bfloat16 they differ by ~1e-2,
which the audit would see at large n: audit a bfloat16 sampler against a float32 (or float64) copy
of the target (``target`` here may be another copy of the model than the sampler's), and read the
result as "lossless up to the dtype's rounding" (``docs/auditing.md``).

A draw the target gives probability 0, an id outside its vocabulary, or a malformed sequence (more
than ``max_new_tokens`` ids, ids after an end id, fewer ids without an end id; the report says
when a draw starts with the prompt's ids: return only the new ones) makes the verdict "lossy".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hsd_core.context_bugs import DEFAULT_CONTEXT_BUGS, ContextBug, context_bugs as _context_bugs
from hsd_core.seqaudit import (
    DEFAULT_BINS, DEFAULT_POSITIONS, DEFAULT_POWER_STEPS, SequenceAuditReport, SequenceEvidence, check_sequence,
    pit_uniforms, sequence_seeds, truncate_at_end,
)

from ._args import as_int
from ._ids import _as_ids, _eos_ids, _width
from .laws import TextSpace, check_processing, process_logits
from .methods.tli import resync_ids
from .reference import LawProvider, ProvidedLaw
from .runner import check_model, refuse_meta, takes_logits_to_keep
from .text import TokenText
from .vocab import VocabBridge

__all__ = ["audit_sequences"]

SampleBatchFn = Callable[[list[str], list[int]], Sequence[Sequence[int]]]


def _prompts(prompts: Any) -> list[str]:
    plist = [prompts] if isinstance(prompts, str) else list(prompts) if prompts is not None else []
    if not plist:
        raise ValueError("prompts is empty: give a str or a list of str")
    for p in plist:
        if not isinstance(p, str):
            raise TypeError(f"each prompt must be a str, got {type(p).__name__}")
    return plist


@torch.inference_mode()
def _forced_logits(model: Any, rows: Sequence[Sequence[int]], at: Sequence[Sequence[int]]) -> torch.Tensor:
    """The logits (the model's dtype, ``[sum_i len(at[i]), V]``: row ``i``'s after its first ``at[i][j]`` ids,
    for each ``j``, rows in order; every ``at[i]`` non-empty): one right-padded forward pass over all
    rows, the head run only from the first position any row reads (``logits_to_keep``, where the
    model takes it: on a 262k-id head the prompt's positions would cost as much as the audited
    ones). ``model`` may be a :class:`~hsd_torch.reference.ProvidedLaw`: its provider's rows instead."""
    if isinstance(model, ProvidedLaw):
        return model.forced(rows, at)
    dev = next(model.parameters()).device
    width = max(len(r) for r in rows)
    x = torch.zeros((len(rows), width), dtype=torch.long, device=dev)
    am = torch.zeros((len(rows), width), dtype=torch.long, device=dev)
    for i, r in enumerate(rows):
        x[i, :len(r)] = torch.tensor(list(r), dtype=torch.long)
        am[i, :len(r)] = 1
    lo = min(min(a) for a in at) - 1  # the first position any row reads: the head runs from there on
    kw = {"logits_to_keep": width - lo} if takes_logits_to_keep(model) else {}
    logits = model(input_ids=x, attention_mask=am, **kw).logits
    off = width - logits.shape[1]  # 0 without logits_to_keep, else lo
    ri = torch.tensor([i for i, a in enumerate(at) for _ in a], dtype=torch.long, device=dev)
    ci = torch.tensor([j - 1 - off for a in at for j in a], dtype=torch.long, device=dev)
    out: torch.Tensor = logits[ri, ci]
    return out


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


def audit_sequences(
    sample_fn: Callable[[str, int], Sequence[int]] | None,
    target: Any,
    target_tokenizer: Any,
    prompts: str | Sequence[str],
    n: int = 200,
    max_new_tokens: int = 32,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    alpha: float = 1e-3,
    seed: int = 0,
    drafter: Any = None,
    drafter_tokenizer: Any = None,
    *,
    sample_batch_fn: SampleBatchFn | None = None,
    mask_textless: bool = False,
    power: float = 0.99,
    bins: int = DEFAULT_BINS,
    positions: int = DEFAULT_POSITIONS,
    max_detectable_tv: float | None = 0.1,
    power_steps: int = DEFAULT_POWER_STEPS,
    batch_size: int = 16,
    progress: Callable[[str], None] | None = None,
    name: str | None = None,
    context_bugs: Sequence[str] | None = DEFAULT_CONTEXT_BUGS,
    prompt_ids: Sequence[Sequence[int]] | None = None,
    reference: LawProvider | ProvidedLaw | None = None,
) -> SequenceAuditReport:
    """Audit ``sample_fn(prompt, seed) -> list[int]`` (new target ids) against ``target``'s
    conditional law at every position of ``n`` sequences (module docstring; the tests, the power
    statement and the verdicts are :mod:`hsd_core.seqaudit`'s).

    ``prompts``: a str or a list (sequence ``i`` uses ``prompts[i % len(prompts)]``); the target's
    context is ``target_tokenizer(prompt)["input_ids"]``. Sequence ``i`` gets the seed
    :func:`hsd_core.seqaudit.sequence_seeds` ``(seed, n)[i]``. Instead of ``sample_fn``, a batched
    sampler ``sample_batch_fn(prompts, seeds) -> list of id lists`` (called with ``batch_size``
    sequences at a time; its rows must be independent draws). ``temperature``, ``top_k``,
    ``top_p``: the processing the sampler claims (ignored when greedy); ``drafter`` and
    ``drafter_tokenizer``: add the directional test and the mixture family. ``progress(line)``
    gets a line per chunk with the time so far and an estimate of the time left. ``context_bugs``:
    names of :data:`hsd_core.context_bugs.CONTEXT_BUGS` to aim a test at (sampling only; each costs
    one more teacher-forced pass of the target; None or empty: none). Returns a
    :class:`~hsd_core.seqaudit.SequenceAuditReport` whose ``cost`` gives the seconds spent sampling
    and teacher forcing.

    ``prompt_ids``: the target's context of each prompt (one id list per entry of ``prompts``), in
    place of its tokenizer's encoding (a recorded engine's own context). ``reference``: a law provider
    ``(prompt_ids, ids) -> [len(ids), V]`` raw log-probabilities (:mod:`hsd_torch.reference`), teacher
    forced in place of ``target``'s forward passes (``target`` still gives the logit width and the end
    ids).
    """
    if (sample_fn is None) == (sample_batch_fn is None):
        raise TypeError("give exactly one of sample_fn (prompt, seed) -> ids and sample_batch_fn (prompts, seeds) "
                        "-> list of id lists")
    fn: Any = sample_fn if sample_fn is not None else sample_batch_fn
    if not callable(fn):
        raise TypeError(f"the sampler must be callable, got {type(fn).__name__}")
    plist = _prompts(prompts)
    n = as_int("n", n, 1)
    max_new_tokens = as_int("max_new_tokens", max_new_tokens, 1)
    batch_size = as_int("batch_size", batch_size, 1)
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be True or False, got {do_sample!r}")
    process = dict(check_processing(temperature, top_k, top_p))
    refuse_meta(check_model(target, "target"), "target")
    if (drafter is None) != (drafter_tokenizer is None):
        raise TypeError("give both drafter and drafter_tokenizer, or neither")
    width = _width(target)
    eos = _eos_ids(target, target_tokenizer)
    if mask_textless:
        space = TextSpace.law(TokenText.get(target_tokenizer, width), torch.device("cpu"), keep_all=False, ends=eos)
        mask = ~space.drop_mask()
    else:
        mask = torch.ones(width, dtype=torch.bool)
    processing = ("argmax" if not do_sample else f"temperature {process['temperature']}, top_k {top_k}, top_p {top_p}")
    if mask_textless:
        processing += ", ids without text removed (mask_textless)"
    contexts = []
    if prompt_ids is not None and len(prompt_ids) != len(plist):
        raise ValueError(f"prompt_ids has {len(prompt_ids)} id lists for {len(plist)} prompts: give one per prompt")
    for k, p in enumerate(plist):
        ids = ([int(i) for i in target_tokenizer(p)["input_ids"]] if prompt_ids is None
               else _as_ids(prompt_ids[k], f"prompt_ids[{k}] has", width))
        if not ids:
            raise ValueError(f"prompt {p!r} encodes to no target ids: the target has nothing to condition on")
        contexts.append(ids)
    bridge = d_mask = None
    d_contexts: list[list[int]] = []
    tt = dt = None
    if drafter is not None:
        refuse_meta(check_model(drafter, "drafter"), "drafter")
        d_width = _width(drafter)
        bridge = VocabBridge(target_tokenizer, drafter_tokenizer, target_vocab_size=width, drafter_vocab_size=d_width,
                             device=next(drafter.parameters()).device)
        tt, dt = TokenText.get(target_tokenizer, width), TokenText.get(drafter_tokenizer, d_width)
        d_mask = torch.ones(d_width, dtype=torch.bool)
        d_contexts = [[int(i) for i in drafter_tokenizer(p)["input_ids"]] for p in plist]
        for p, d in zip(plist, d_contexts):
            if not d:
                raise ValueError(f"prompt {p!r} encodes to no drafter ids: the drafter has no law before the first "
                                 "token (give a longer prompt, or no drafter)")
    top_extra = do_sample and (top_k is not None or (top_p is not None and top_p < 1.0))
    bugs = _context_bugs(context_bugs) if do_sample else ()
    ev = SequenceEvidence(alpha=alpha, power=power, bins=bins, positions=positions, seed=int(seed),
                          drafter=drafter is not None, extra=top_extra, do_sample=do_sample, power_steps=power_steps,
                          expected_steps=n * max_new_tokens, aimed=[b.what for b in bugs])
    seeds = sequence_seeds(int(seed), n)
    t_sample = t_force = 0.0
    forced: Any = target if reference is None else \
        reference if isinstance(reference, ProvidedLaw) else ProvidedLaw(reference, width)
    forcer = _Forcer(forced, mask, process, do_sample, top_extra, bugs, plist, contexts, drafter, bridge, tt, dt,
                     d_mask, d_contexts, int(seed))
    for c0 in range(0, n, batch_size):
        idx = list(range(c0, min(n, c0 + batch_size)))
        t0 = time.perf_counter()
        if sample_batch_fn is not None:
            outs = list(sample_batch_fn([plist[i % len(plist)] for i in idx], [seeds[i] for i in idx]))
            if len(outs) != len(idx):
                raise ValueError(f"sample_batch_fn returned {len(outs)} sequences for {len(idx)} prompts")
        else:
            assert sample_fn is not None
            outs = [sample_fn(plist[i % len(plist)], seeds[i]) for i in idx]
        t_sample += time.perf_counter() - t0
        t0 = time.perf_counter()
        rows, seqs = [], []
        for i, out in zip(idx, outs):
            what = f"the sampler (sequence {i}, prompt {plist[i % len(plist)]!r}, seed {seeds[i]}) returned"
            ids = _as_ids(out, what, None)  # an id outside the target's is evidence, reported below
            bad = [t for t in ids if not 0 <= t < width]
            if bad:
                ev.add_malformed(f"sequence {i}: id {bad[0]} outside the target's {width} ids")
                continue
            ctx = contexts[i % len(plist)]
            wrong = check_sequence(ids, max_new_tokens, eos)
            if wrong is not None:
                hint = ("; it starts with the prompt's ids: return only the new ids"
                        if len(ids) >= len(ctx) and ids[:len(ctx)] == ctx else "")
                ev.add_malformed(f"sequence {i}: {wrong}{hint}")
                ids = truncate_at_end(ids, max_new_tokens, eos)
            if ids:
                rows.append(ctx + ids)
                seqs.append((i, ids))
        if rows:
            forcer.run(ev, rows, seqs)
        t_force += time.perf_counter() - t0
        if progress is not None:
            done = idx[-1] + 1
            spent = t_sample + t_force
            progress(f"{done}/{n} sequences, {spent:.1f} s (sampling {t_sample:.1f} s, teacher forcing "
                     f"{t_force:.1f} s), about {spent / done * (n - done):.0f} s left")
    label = name or str(getattr(fn, "__qualname__", "") or type(fn).__name__)
    t0 = time.perf_counter()
    rep = ev.report(n=n, max_new_tokens=max_new_tokens, max_detectable_tv=max_detectable_tv, name=label,
                    processing=processing, cost={})
    cost = {"sampling": t_sample, "teacher forcing": t_force, "statistics": time.perf_counter() - t0}
    object.__setattr__(rep, "cost", cost)
    return rep


class _Forcer:
    """Teacher forcing and the evidence it gives, for a batch of sampled sequences (module
    docstring): the target's laws, the drafter's (pushed onto target ids), the one-more-token
    probabilities under top-k / top-p, the laws under each named context bug."""

    def __init__(self, target: Any, mask: torch.Tensor, process: dict[str, Any], do_sample: bool, top_extra: bool,
                 bugs: Sequence[ContextBug], plist: list[str], contexts: list[list[int]], drafter: Any,
                 bridge: VocabBridge | None, tt: Any, dt: Any, d_mask: torch.Tensor | None,
                 d_contexts: list[list[int]], seed: int) -> None:
        self.target, self.mask, self.process, self.do_sample, self.top_extra = target, mask, process, do_sample, top_extra
        self.bugs, self.plist, self.contexts = bugs, plist, contexts
        self.drafter, self.bridge, self.tt, self.dt, self.d_mask, self.d_contexts = (drafter, bridge, tt, dt, d_mask,
                                                                                    d_contexts)
        self.seed = seed
        self.memo: dict[int, list[int]] = {}

    def run(self, ev: SequenceEvidence, rows: list[list[int]], seqs: list[tuple[int, list[int]]]) -> None:
        """Add the evidence of ``seqs`` (sequence index, new ids; ``rows``: prompt ids + new ids) to
        ``ev``: one teacher-forced pass per model (and per named bug), then the laws and the
        statistics block by block of positions (:func:`_block_rows`: no float64 array over a whole
        vocabulary at every position, which would cost more in fresh memory than in arithmetic)."""
        plist, process, greedy = self.plist, self.process, not self.do_sample
        t_logits = _forced_logits(self.target, rows, [range(len(r) - len(s[1]), len(r)) for r, s in zip(rows, seqs)])
        d_logits = None
        if self.bridge is not None:
            assert self.tt is not None and self.dt is not None
            drows, dstarts = [], []
            for i, ids in seqs:
                d = list(self.d_contexts[i % len(plist)])
                ends = []
                for t in ids:
                    ends.append(len(d))
                    d.extend(resync_ids(t, self.bridge.to_drafter_list, self.tt, self.dt, self.memo))
                drows.append(d)
                dstarts.append(ends)
            d_logits = _forced_logits(self.drafter, drows, dstarts)
        aimed = [_aimed_logits(self.target, b, [self.contexts[i % len(plist)] for i, _ in seqs], [s for _, s in seqs])
                 for b in self.bugs]
        cat = np.concatenate
        x = cat([ids for _, ids in seqs])
        pos = cat([np.arange(len(ids)) for _, ids in seqs])
        v = cat([pit_uniforms(self.seed, i, len(ids)) for i, ids in seqs])
        sq = cat([np.full(len(ids), i) for i, ids in seqs])
        pr = cat([np.full(len(ids), i % len(plist)) for i, ids in seqs])
        step = _block_rows(t_logits.shape[1], 0 if d_logits is None else d_logits.shape[1])
        for a in range(0, x.size, step):
            sl = slice(a, a + step)
            law = _law_block(t_logits[sl], self.mask, process, greedy).cpu().numpy()
            q = None
            if d_logits is not None:
                assert self.bridge is not None and self.d_mask is not None
                q = _drafter_block(self.bridge, d_logits[sl], self.d_mask, process, greedy, law)
            e = None
            if self.top_extra:
                e = _one_more(_law_block(t_logits[sl], self.mask, dict(process, top_k=None, top_p=None),
                                         False).cpu().numpy(), law)
            rs = []
            for lg, src in aimed:  # rows the bug leaves without context: the target's own law (no evidence)
                r = law.copy()
                at = np.flatnonzero(src[sl] >= 0)
                if at.size:
                    r[at] = _law_block(lg[src[sl][at]], self.mask, process, False).cpu().numpy()
                rs.append(r)
            ev.add_steps(law, x[sl], pos[sl], v[sl], sq[sl], q=q, extra=e, prompt=pr[sl], aimed=rs)


_BLOCK = 1 << 21  # entries of a [positions, V] float64 block (16 MB: glibc's heap reuses it; a larger one is mmap'ed afresh)


def _block_rows(*widths: int) -> int:
    """How many positions one block holds: :data:`_BLOCK` entries of the widest vocabulary."""
    return max(1, _BLOCK // max(1, *widths))


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


def _aimed_logits(target: Any, bug: ContextBug, contexts: list[list[int]], seqs: list[list[int]]
                  ) -> tuple[torch.Tensor, np.ndarray]:
    """The target's logits before each new id under ``bug``'s context (row ``k``: prompt ids
    ``contexts[k]``, new ids ``seqs[k]``; one teacher-forced pass over the rows the bug leaves a
    context), and for each position of the concatenated rows its row in those logits (-1: none)."""
    wrong = [bug.context(c) for c in contexts]
    live = [k for k, c in enumerate(wrong) if c]
    src = np.full(sum(len(s) for s in seqs), -1)
    ends = np.cumsum([0] + [len(s) for s in seqs])
    if not live:
        return torch.zeros((0, 0)), src
    at = np.concatenate([np.arange(ends[k], ends[k + 1]) for k in live])
    src[at] = np.arange(at.size)
    lg = _forced_logits(target, [wrong[k] + seqs[k] for k in live],
                        [range(len(wrong[k]), len(wrong[k]) + len(seqs[k])) for k in live])
    return lg, src


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
