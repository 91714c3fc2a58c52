"""Sequence audits of any ``generate()`` against a Hugging Face target: :func:`audit_sequences`.

The statistics are :mod:`hsd_core.seqaudit`'s (:class:`~hsd_core.seqaudit.SequenceEvidence`): every
new token of ``n`` sampled sequences is tested against the target's own conditional law at its
position, obtained by **teacher forcing**: each chunk of ``batch_size`` sequences is run through the
target in one right-padded forward pass (prompt + new ids), and the logits before each new token
are processed as :func:`hsd_torch.engine.entry.process_logits` does (float64; with
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

A draw the target gives probability 0 or an id outside its vocabulary makes the verdict "lossy". A
length mismatch (more than ``max_new_tokens`` ids, ids after an end id, fewer ids without an end
id) is a ``ValueError`` naming it by default, or with ``length_mismatch="prefix"`` each sequence is
audited up to its first end id and the budget and the report says how many were cut
(:class:`hsd_core.seqaudit.LengthCheck`); either way a sequence that starts with the prompt's ids
gets the hint "return only the new ids".

The target's context for a prompt is what :func:`hsd_torch.generate` feeds
(:func:`hsd_torch.engine.prompts.target_context`), or ``prompt_ids`` as given. The drafter the
directional test reads must be the drafter the sampler drafts with, unchanged: the audit takes
its fingerprint (its modules' classes, its parameters' shapes, storage and in-place version
counters) before sampling and checks it after every chunk, and refuses (``ValueError``) a sampler
that changed it (transformers' sampled assisted generation prunes and re-indexes its assistant in
place): give the sampler its own copy (``copy.deepcopy(drafter)``).

A lossy report also says which of a few processings (the claimed one, temperature 1 and the
claimed temperature without top-k / top-p, the claimed processing at 0.8, 0.9, 1.1 and 1.25 times
the temperature) the tokens fit best, by log-likelihood on a seeded subsample of at most
:data:`FIT_POSITIONS` positions, when that is not the claimed one.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hsd_core.context_bugs import DEFAULT_CONTEXT_BUGS, ContextBug, context_bugs as _context_bugs
from hsd_core.seqaudit import (
    DEFAULT_BINS, DEFAULT_POSITIONS, DEFAULT_POWER_STEPS, LengthCheck, SequenceAuditReport, SequenceEvidence,
    pit_uniforms, sequence_seeds,
)

from ..engine._args import as_int
from ..engine._head import HeadTap
from ..engine.laws import check_processing
from ..engine.prompts import target_context
from ..engine.runner import check_model, refuse_meta
from ..methods.tli import resync_ids
from ..vocab import VocabBridge
from ..vocab.text import TokenText
from ._ids import _as_ids, _eos_ids, _law_columns, _width
from .forced_laws import FIT_POSITIONS, _drafter_block, _Fit, _law_block, _one_more
from .forcing import _changed, _forced_logits, _prompt_ids, _prompts, _shared_logits, model_fingerprint
from .reference import LawProvider, ProvidedLaw
from .text_sequences import audit_text_sequences

__all__ = ["FIT_POSITIONS", "audit_sequences", "model_fingerprint"]

SampleBatchFn = Callable[[list[str], list[int]], Sequence[Sequence[int]]]


def audit_sequences(
    sample_fn: Callable[[str, int], Sequence[int]] | None, target: Any, target_tokenizer: Any,
    prompts: str | Sequence[str], n: int = 200, max_new_tokens: int = 32, do_sample: bool = True,
    temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, alpha: float = 1e-3,
    seed: int = 0, drafter: Any = None, drafter_tokenizer: Any = None, *, sample_batch_fn: SampleBatchFn | None = None,
    mask_textless: bool = False, power: float = 0.99, bins: int = DEFAULT_BINS, positions: int = DEFAULT_POSITIONS,
    max_detectable_tv: float | None = 0.1, power_steps: int = DEFAULT_POWER_STEPS, batch_size: int = 16,
    progress: Callable[[str], None] | None = None, name: str | None = None,
    context_bugs: Sequence[str] | None = DEFAULT_CONTEXT_BUGS,
    prompt_ids: Sequence[int] | Sequence[Sequence[int]] | None = None, length_mismatch: str = "error",
    reference: LawProvider | ProvidedLaw | None = None, text: bool = False, on_chunk: Callable[[int], None] | None = None,
) -> SequenceAuditReport:
    """Audit ``sample_fn(prompt, seed) -> list[int]`` (new target ids) against ``target``'s
    conditional law at every position of ``n`` sequences (module docstring; the tests, the power
    statement and the verdicts are :mod:`hsd_core.seqaudit`'s).

    ``prompts``: a str or a list (sequence ``i`` uses ``prompts[i % len(prompts)]``); the target's
    context is the prompt's ids as :func:`hsd_torch.generate` feeds them
    (:func:`hsd_torch.engine.prompts.target_context`). ``prompt_ids`` (as :func:`audit_generate`'s: one
    list of ids, or one per prompt) overrides them as the target's context; ``prompts`` may then be
    None, and the sampler gets each context's decoded text. ``length_mismatch``: ``"error"`` (a
    sequence of the wrong length raises ``ValueError`` naming it, before any statistics),
    ``"prefix"`` (each sequence audited up to its first end id and ``max_new_tokens``, and the
    report says so) or ``"lossy"`` (a malformed sequence: the verdict is "lossy"; the engine
    audits' rule for recorded draws). Sequence ``i`` gets the seed
    :func:`hsd_core.seqaudit.sequence_seeds` ``(seed, n)[i]``. Instead of ``sample_fn``, a batched
    sampler ``sample_batch_fn(prompts, seeds) -> list of id lists`` (called with ``batch_size``
    sequences at a time; its rows must be independent draws). ``temperature``, ``top_k``,
    ``top_p``: the processing the sampler claims (ignored when greedy); ``drafter`` and
    ``drafter_tokenizer``: add the directional test and the mixture family (the sampler must not
    change this drafter: ``ValueError`` after the chunk that did; module docstring).
    ``progress(line)`` gets, after the first chunk, the estimated cost of the whole audit and the
    departure it should then catch, and after every chunk the time so far and the time left; ``on_chunk(k)``
    after each chunk, ``k`` its sequences (a progress bar's ``update``). ``context_bugs``:
    names of :data:`hsd_core.context_bugs.CONTEXT_BUGS` to aim a test at (sampling only; each costs
    one more teacher-forced pass of the target; None or empty: none). Returns a
    :class:`~hsd_core.seqaudit.SequenceAuditReport` whose ``cost`` gives the seconds spent sampling
    and teacher forcing.

    A recorded engine's own context goes in ``prompt_ids`` (one id list per entry of ``prompts``).
    ``reference``: a law provider
    ``(prompt_ids, ids) -> [len(ids), V]`` raw log-probabilities (:mod:`hsd_torch.auditing.reference`), teacher
    forced in place of ``target``'s forward passes (``target`` still gives the logit width and the end
    ids).

    ``text=True``: the sampler returns the new **text** of its ``max_new_tokens`` tokens
    (``target_tokenizer.decode(new_ids, skip_special_tokens=True)``, as ``audit_generate(text=True)``),
    and the audit compares it with as many texts drawn from the target itself by two-sample tests
    (:mod:`hsd_torch.auditing.text_sequences`: a text has many tokenizations, so no per-token law of it exists
    to test against); the report's tests are that family. Not with ``reference`` (a law provider
    cannot be sampled here) nor a ``length_mismatch`` other than "error" (texts have no token count);
    no aimed tests (``context_bugs`` is not used).
    """
    if (sample_fn is None) == (sample_batch_fn is None):
        raise TypeError("give exactly one of sample_fn (prompt, seed) -> ids and sample_batch_fn (prompts, seeds) "
                        "-> list of id lists")
    fn: Any = sample_fn if sample_fn is not None else sample_batch_fn
    if not callable(fn):
        raise TypeError(f"the sampler must be callable, got {type(fn).__name__}")
    width = _width(target)
    plist, given = _prompt_lists(prompts, prompt_ids, width, target_tokenizer)
    n = as_int("n", n, 1)
    max_new_tokens = as_int("max_new_tokens", max_new_tokens, 1)
    batch_size = as_int("batch_size", batch_size, 1)
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be True or False, got {do_sample!r}")
    process = dict(check_processing(temperature, top_k, top_p))
    refuse_meta(check_model(target, "target"), "target")
    if (drafter is None) != (drafter_tokenizer is None):
        raise TypeError("give both drafter and drafter_tokenizer, or neither")
    if text:
        return _text_mode(locals())
    run = _SequenceAudit(
        target, target_tokenizer, plist, given, width, n, max_new_tokens, do_sample, process, top_k, top_p,
        mask_textless=mask_textless, drafter=drafter, drafter_tokenizer=drafter_tokenizer, context_bugs=context_bugs,
        length_mismatch=length_mismatch, reference=reference, seed=int(seed),
        evidence=dict(alpha=alpha, power=power, bins=bins, positions=positions, power_steps=power_steps))
    for c0 in range(0, n, batch_size):
        run.chunk(list(range(c0, min(n, c0 + batch_size))), sample_fn, sample_batch_fn, progress, on_chunk)
    return run.report(name or str(getattr(fn, "__qualname__", "") or type(fn).__name__), max_detectable_tv)


def _prompt_lists(prompts: str | Sequence[str] | None, prompt_ids: Sequence[int] | Sequence[Sequence[int]] | None,
                  width: int, tokenizer: Any) -> tuple[list[str], list[list[int]] | None]:
    """The prompts (:func:`~hsd_torch.auditing.forcing._prompts`; without them, the decoded text
    of each ``prompt_ids`` row) and the checked ``prompt_ids`` rows, one per prompt (``ValueError``
    otherwise; None when not given)."""
    given = None
    if prompt_ids is not None:
        given = _prompt_ids(prompt_ids, width)
        if prompts is None:
            prompts = [tokenizer.decode(r) for r in given]
    plist = _prompts(prompts)
    if given is not None and len(given) != len(plist):
        raise ValueError(f"prompt_ids has {len(given)} rows for {len(plist)} prompts: give one per prompt")
    return plist, given


def _drafter_side(drafter: Any, drafter_tokenizer: Any, target_tokenizer: Any, width: int, plist: list[str]
                  ) -> tuple[VocabBridge | None, Any, Any, torch.Tensor | None, list[list[int]]]:
    """What :class:`_Forcer` needs of a drafter (all None and no contexts without one): the bridge
    onto target ids, both text spaces, the drafter's columns and its own encoding of each prompt
    (``ValueError`` for a prompt it encodes to no ids)."""
    if drafter is None:
        return None, None, None, None, []
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
    return bridge, tt, dt, d_mask, d_contexts


class _SequenceAudit:
    """One audit of the ids mode, its arguments checked: the evidence, the teacher forcing, the
    chunks of sampled sequences (:meth:`chunk`) and the timings, then :meth:`report`."""

    def __init__(self, target: Any, target_tokenizer: Any, plist: list[str], given: list[list[int]] | None,
                 width: int, n: int, max_new_tokens: int, do_sample: bool, process: dict[str, Any],
                 top_k: int | None, top_p: float | None, *, mask_textless: bool, drafter: Any, drafter_tokenizer: Any,
                 context_bugs: Sequence[str] | None, length_mismatch: str, reference: LawProvider | ProvidedLaw | None,
                 seed: int, evidence: dict[str, Any]) -> None:
        self.plist, self.width, self.n, self.max_new_tokens, self.drafter = plist, width, n, max_new_tokens, drafter
        eos = _eos_ids(target, target_tokenizer)
        self.lengths = LengthCheck(length_mismatch, max_new_tokens, eos)
        mask = _law_columns(target_tokenizer, width, eos, mask_textless)
        self.processing = ("argmax" if not do_sample else
                           f"temperature {process['temperature']}, top_k {top_k}, top_p {top_p}")
        if mask_textless:
            self.processing += ", ids without text removed (mask_textless)"
        if given is not None:
            self.contexts = given
        else:
            t_text = TokenText.get(target_tokenizer, width)
            self.contexts = [target_context(t_text, p) for p in plist]
        d_side = _drafter_side(drafter, drafter_tokenizer, target_tokenizer, width, plist)
        top_extra = do_sample and (top_k is not None or (top_p is not None and top_p < 1.0))
        bugs = _context_bugs(context_bugs) if do_sample else ()
        self.ev = SequenceEvidence(seed=seed, drafter=drafter is not None, extra=top_extra, do_sample=do_sample,
                                   expected_steps=n * max_new_tokens, aimed=[b.what for b in bugs], **evidence)
        self.seeds = sequence_seeds(seed, n)
        self.t_sample = self.t_force = 0.0
        forced: Any = target if reference is None else \
            reference if isinstance(reference, ProvidedLaw) else ProvidedLaw(reference, width)
        self.forcer = _Forcer(forced, mask, process, do_sample, top_extra, bugs, plist, self.contexts, drafter, *d_side,
                              seed)
        self.forcer.fit = _Fit(process, do_sample, seed, n * max_new_tokens)
        self.provider = forced if isinstance(forced, ProvidedLaw) else None
        self.provider_start = (forced.calls, forced.positions) if isinstance(forced, ProvidedLaw) else (0, 0)
        self.drafter_print = model_fingerprint(drafter) if drafter is not None else None

    def _sample(self, idx: list[int], sample_fn: Callable[[str, int], Sequence[int]] | None,
                sample_batch_fn: SampleBatchFn | None) -> list[Any]:
        """The sampler's outputs for sequences ``idx`` (``ValueError`` when a batched sampler returns
        another number of rows)."""
        plist, seeds = self.plist, self.seeds
        if sample_batch_fn is not None:
            outs = list(sample_batch_fn([plist[i % len(plist)] for i in idx], [seeds[i] for i in idx]))
            if len(outs) != len(idx):
                raise ValueError(f"sample_batch_fn returned {len(outs)} sequences for {len(idx)} prompts")
        else:
            assert sample_fn is not None
            outs = [sample_fn(plist[i % len(plist)], seeds[i]) for i in idx]
        return outs

    def _check_drafter(self, idx: list[int]) -> None:
        """``ValueError`` when sampling the sequences ``idx`` changed the drafter the audit reads."""
        if self.drafter_print is not None and (print_ := model_fingerprint(self.drafter)) != self.drafter_print:
            raise ValueError(
                f"the sampler changed the drafter the audit reads ({_changed(self.drafter_print, print_)}) while "
                f"sampling sequences {idx[0]}-{idx[-1]}: transformers' sampled assisted generation prunes and "
                "re-indexes its assistant in place. Give the sampler its own copy (copy.deepcopy(drafter) before the "
                "audit) and the audit the untouched drafter")

    def _force(self, idx: list[int], outs: list[Any]) -> None:
        """Add the evidence of the sampled sequences ``idx`` (their outputs ``outs``): an id outside
        the target's is a malformed draw, the lengths are checked, the rest teacher-forced."""
        plist, seeds, width = self.plist, self.seeds, self.width
        rows, seqs = [], []
        for i, out in zip(idx, outs):
            what = f"the sampler (sequence {i}, prompt {plist[i % len(plist)]!r}, seed {seeds[i]}) returned"
            ids = _as_ids(out, what, None)  # an id outside the target's is evidence, reported below
            bad = [t for t in ids if not 0 <= t < width]
            if bad:
                self.ev.add_malformed(f"sequence {i}: id {bad[0]} outside the target's {width} ids")
                continue
            ctx = self.contexts[i % len(plist)]
            ids = self.lengths.take(self.ev, i, ids, ctx,
                                    f"the sampler (prompt {plist[i % len(plist)]!r}, seed {seeds[i]})")
            if ids:
                rows.append(ctx + ids)
                seqs.append((i, ids))
        if rows:
            self.forcer.run(self.ev, rows, seqs)

    def chunk(self, idx: list[int], sample_fn: Callable[[str, int], Sequence[int]] | None,
              sample_batch_fn: SampleBatchFn | None, progress: Callable[[str], None] | None,
              on_chunk: Callable[[int], None] | None = None) -> None:
        """Sample the sequences ``idx`` and add their evidence; ``progress`` gets the estimated cost
        after the first chunk and the time so far and left after every chunk."""
        t0 = time.perf_counter()
        outs = self._sample(idx, sample_fn, sample_batch_fn)
        self.t_sample += time.perf_counter() - t0
        self._check_drafter(idx)
        t0 = time.perf_counter()
        self._force(idx, outs)
        self.t_force += time.perf_counter() - t0
        if progress is not None:
            n, done = self.n, idx[-1] + 1
            spent = self.t_sample + self.t_force
            if idx[0] == 0 and done < n:
                progress(_estimate(self.ev, done, n, self.t_sample, self.t_force, self.max_new_tokens))
            progress(f"{done}/{n} sequences, {spent:.1f} s (sampling {self.t_sample:.1f} s, teacher forcing "
                     f"{self.t_force:.1f} s), about {spent / done * (n - done):.0f} s left")
        if on_chunk is not None:
            on_chunk(len(idx))

    def report(self, label: str, max_detectable_tv: float | None) -> SequenceAuditReport:
        """The evidence's report (:mod:`hsd_core.seqaudit`), with the processing the tokens fit best
        when lossy and the seconds spent sampling, teacher forcing and on the statistics."""
        t0 = time.perf_counter()
        rep = self.ev.report(n=self.n, max_new_tokens=self.max_new_tokens, max_detectable_tv=max_detectable_tv,
                             name=label, processing=self.processing, cost={})
        reason = rep.reason
        if rep.verdict == "lossy" and (fit := self.forcer.fit.best()) is not None:
            reason += f"; of a few processings, the tokens fit best {fit}"
        cost = {"sampling": self.t_sample, "teacher forcing": self.t_force, "statistics": time.perf_counter() - t0}
        calls = {k: v for k, v in self.forcer.passes.items() if v}
        if self.provider is not None:  # the target's passes were the provider's calls: one per sequence (and bug)
            calls.pop("target passes", None)
            calls.pop("context-bug passes", None)
            calls["provider calls"] = self.provider.calls - self.provider_start[0]
            calls["provider positions"] = self.provider.positions - self.provider_start[1]
        return dataclasses.replace(rep, reason=reason, cost=cost, calls=calls)


def _text_mode(a: dict[str, Any]) -> SequenceAuditReport:
    """``audit_sequences(text=True)`` with its checked arguments ``a`` (its locals)."""
    if a["reference"] is not None:
        raise ValueError("text=True draws its reference texts from the target itself: a law provider (reference=) "
                         "cannot be sampled; audit the engine's ids against it instead")
    if a["length_mismatch"] != "error":
        raise ValueError(f"length_mismatch={a['length_mismatch']!r} is about ids; with text=True the sampler's texts "
                         "are compared as they come")
    p = a["process"]
    processing = ("argmax" if not a["do_sample"] else f"temperature {p['temperature']}, top_k {p['top_k']}, top_p "
                  f"{p['top_p']}") + (", ids without text removed (mask_textless)" if a["mask_textless"] else "")
    return audit_text_sequences(
        a["sample_fn"], a["target"], a["target_tokenizer"], a["plist"], a["given"] if a["prompt_ids"] is not None
        else None, n=a["n"], max_new_tokens=a["max_new_tokens"], do_sample=a["do_sample"], process=p,
        alpha=a["alpha"], power=a["power"], seed=int(a["seed"]), drafter=a["drafter"],
        drafter_tokenizer=a["drafter_tokenizer"], sample_batch_fn=a["sample_batch_fn"],
        mask_textless=a["mask_textless"], batch_size=a["batch_size"], progress=a["progress"], name=a["name"],
        max_detectable_tv=a["max_detectable_tv"], processing=processing)


def _estimate(ev: SequenceEvidence, done: int, n: int, t_sample: float, t_force: float, max_new_tokens: int) -> str:
    """The line printed after the first chunk: the whole audit's estimated cost, and the headline
    departure it should catch (the first chunk's, shrunk as 1 / sqrt(sequences))."""
    scale = n / done
    first = ev.report(n=done, max_new_tokens=max_new_tokens, max_detectable_tv=None)
    catch = ("" if first.detectable_tv is None else
             f"; it should catch a {first.detectable_by} at mean per-token TV about "
             f"{first.detectable_tv / math.sqrt(scale):.2g} (this chunk alone: {first.detectable_tv:.2g})")
    return (f"estimate from the first {done} of {n} sequences: about {(t_sample + t_force) * scale:.0f} s in all "
            f"(sampling {t_sample * scale:.0f} s, teacher forcing {t_force * scale:.0f} s){catch}")


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
        self.fit = _Fit(process, do_sample, seed, 1)
        # untruncated sampling: the drafter's law restricted to the shared ids is the softmax of their logits
        # alone, so its head need only run on their rows (checked against the full head on first use)
        top_p = process.get("top_p")
        self.shared_head: bool | None = (None if do_sample and bridge is not None and process.get("top_k") is None
                                         and (top_p is None or top_p >= 1.0) else False)
        self.tap = HeadTap(drafter) if self.shared_head is None else None
        self.passes = {"target passes": 0, "drafter passes": 0, "context-bug passes": 0}
        """Teacher-forced passes (one batch of sequences each) per model; a provider's are its calls."""

    def _drafter_logits(self, rows: list[list[int]], at: list[list[int]]) -> torch.Tensor:
        """The drafter's logits before each new target id (:func:`_forced_logits`' layout). Where
        only the shared ids' law is read (untruncated sampling), the head runs on the shared ids'
        rows only (:func:`_shared_logits`; Gemma's 262,144-id head is most of a drafter pass) and the
        other columns are -inf, which gives the same restricted, renormalized law; the first call
        checks that against the full head and keeps the full head if they differ."""
        assert self.bridge is not None
        if self.shared_head is False:
            self.passes["drafter passes"] += 1
            return _forced_logits(self.drafter, rows, at)
        ids = self.bridge.drafter_ids.to(next(self.drafter.parameters()).device)
        assert self.tap is not None
        sub = _shared_logits(self.drafter, self.tap, rows, at, ids)
        self.passes["drafter passes"] += bool(self.tap.usable)  # a pass ran, its head steered or not
        if sub is not None and self.shared_head is None:
            full = _forced_logits(self.drafter, rows[:1], at[:1])
            self.passes["drafter passes"] += 1
            self.shared_head = bool(torch.allclose(sub[:full.shape[0]], full[:, ids], rtol=1e-4, atol=1e-4))
        if sub is None or not self.shared_head:
            self.shared_head = False
            self.passes["drafter passes"] += 1
            return _forced_logits(self.drafter, rows, at)
        out = torch.full((sub.shape[0], _width(self.drafter)), float("-inf"), dtype=sub.dtype, device=sub.device)
        out[:, ids] = sub
        return out

    def run(self, ev: SequenceEvidence, rows: list[list[int]], seqs: list[tuple[int, list[int]]]) -> None:
        """Add the evidence of ``seqs`` (sequence index, new ids; ``rows``: prompt ids + new ids) to
        ``ev``: one teacher-forced pass per model (and per named bug), then the laws and the
        statistics block by block of positions (:func:`_block_rows`: no float64 array over a whole
        vocabulary at every position, which would cost more in fresh memory than in arithmetic)."""
        plist, process, greedy = self.plist, self.process, not self.do_sample
        t_logits = _forced_logits(self.target, rows, [range(len(r) - len(s[1]), len(r)) for r, s in zip(rows, seqs)])
        self.passes["target passes"] += 1
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
            d_logits = self._drafter_logits(drows, dstarts)
        aimed = [_aimed_logits(self.target, b, [self.contexts[i % len(plist)] for i, _ in seqs], [s for _, s in seqs])
                 for b in self.bugs]
        self.passes["context-bug passes"] += sum(1 for _, src in aimed if (src >= 0).any())
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
            self.fit.add(t_logits[sl], self.mask, x[sl], law)


_BLOCK = 1 << 21  # entries of a [positions, V] float64 block (16 MB: glibc's heap reuses it; a larger one is mmap'ed afresh)


def _block_rows(*widths: int) -> int:
    """How many positions one block holds: :data:`_BLOCK` entries of the widest vocabulary."""
    return max(1, _BLOCK // max(1, *widths))


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
