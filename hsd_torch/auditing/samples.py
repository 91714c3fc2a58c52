"""Audits of engines that run outside hsd's process: recorded samples files and their null control.

:func:`audit_samples` audits a samples file (:mod:`hsd_core.samples`: one JSON line per draw, from
any engine in any language, or from :mod:`hsd_core.endpoint`) with the audits hsd already has,
replaying the recorded draws instead of sampling:

* the **sequence audit** (:func:`hsd_torch.auditing.sequences.audit_sequences`: every token against the
  reference's teacher-forced conditional law), the draws fed through a replay ``sample_batch_fn``
  with each draw's own prompt ids (``prompt_ids`` of the file; a draw with text only gets
  :meth:`hsd_torch.vocab.text.TokenText.prompt_ids`, hsd's one prompt-to-ids rule, and the report says so);
* the **first-token audit** (:func:`hsd_torch.auditing.first_tokens.audit_generate`, the first two tokens) of each of
  the (at most 4) prompts with the most draws (at least 50);
* a greedy file (``do_sample`` false) is audited for greedy identity by both.

**The reference law** is named in every report: transformers' float32 teacher-forced law of the
target (the default), or a law provider (:mod:`hsd_torch.auditing.reference`: the engine's own raw
log-probabilities, e.g. vLLM's full-vocabulary ``prompt_logprobs``) passed as ``reference=``.

**The null control and the two-sample test.** With ``baseline=`` (the same engine's samples
without speculation, independent draws: no seed shared with the audited file), the baseline is
audited against the same reference beside the audited file, and the two files are compared by
:func:`hsd_core.twosample.two_sample_sequences`, which needs no reference: first-token and first-2
prefix homogeneity within each prompt, and stratified rank tests of per-sequence scores (the
log-likelihood under the reference, under the drafter, and their difference: any fixed function
of a sequence is a valid two-sample statistic, so these give power even when the reference is
not the engine's law). Verdict: "lossy" when the two-sample test rejects, or when the audited
file is rejected against the reference while the null control passes; when the null control
itself is rejected, the report says that the reference does not match the engine's numerics and
the verdict rests on the two-sample test alone. That rule, and the one that combines a file's
sequence and first-token audits, are :mod:`hsd_core.stats.combine`'s (every engine audit: vLLM, an
endpoint, a samples file).

**Alpha.** With a baseline, ``alpha / 2`` for the two-sample family and ``alpha / 2`` for each
file's audit against the reference (a "lossy" needs one of the first two: the family-wise
false-fail rate of the verdict is at most ``alpha``); within a file's audit, half for the sequence
audit and half split evenly over the first-token audits (Bonferroni).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hsd_core.context_bugs import DEFAULT_CONTEXT_BUGS
from hsd_core.samples import Draw, SamplesFile, read_samples
from hsd_core.seqaudit import SequenceAuditReport
from hsd_core.stats.combine import combine_parts, combine_with_control
from hsd_core.stats.family import Verdict as Verdict
from hsd_core.twosample import TwoSampleReport, two_sample_sequences

from ..vocab.text import TokenText
from ._ids import _width
from .first_tokens import GenerateAuditReport, audit_generate
from .forcing import sequence_scores
from .reference import LawProvider, ProvidedLaw
from .sequences import audit_sequences

__all__ = ["EngineAuditReport", "FileAudit", "audit_samples", "check_applicable", "draw_contexts"]

FIRST_TOKEN_MIN_DRAWS = 50
"""A prompt needs this many draws for a first-token audit of its own."""

FIRST_TOKEN_PROMPTS = 4
"""At most this many prompts (those with the most draws) get a first-token audit."""


@dataclass(frozen=True)
class FileAudit:
    """One samples file against the reference: its one-line description, the verdict of its
    sequence audit and first-token audits together ("lossy" if any is, "lossless-consistent" if the
    sequence audit is and none is lossy), and the reports."""

    describe: str
    verdict: Verdict
    sequence: SequenceAuditReport
    first_token: tuple[GenerateAuditReport, ...]
    notes: tuple[str, ...] = ()

    def to_markdown(self, title: str) -> str:
        lines = [f"## {title}", "", f"{self.describe}", "", f"**Verdict against the reference: {self.verdict}**", ""]
        lines += [f"- {n}" for n in self.notes]
        out = "\n".join(lines) + "\n\n" + self.sequence.to_markdown(title=f"{title}: sequence audit")
        for r in self.first_token:
            out += "\n" + r.to_markdown()
        return out


@dataclass(frozen=True)
class EngineAuditReport:
    """Result of :func:`audit_samples`: the verdict and why, the reference used and why
    (``reference``), the audited file's audit, the null control's (``null_control``, the baseline
    file's audit; None without a baseline), the two-sample comparison (None without a baseline), and
    notes (prompt ids derived from text, seeds missing, the file's target name)."""

    verdict: Verdict
    reason: str
    reference: str
    audited: FileAudit
    null_control: FileAudit | None = None
    two_sample: TwoSampleReport | None = None
    notes: tuple[str, ...] = ()
    cost: dict[str, float] = field(default_factory=dict)

    def to_markdown(self) -> str:
        lines = ["# Engine audit", "", f"**Verdict: {self.verdict}** ({self.reason})", "",
                 f"- reference law: {self.reference}"]
        lines += [f"- {n}" for n in self.notes]
        out = "\n".join(lines) + "\n\n" + self.audited.to_markdown("Audited file against the reference")
        if self.null_control is not None:
            out += "\n" + self.null_control.to_markdown("Null control: the engine without speculation against "
                                                        "the same reference")
        if self.two_sample is not None:
            out += "\n" + self.two_sample.to_markdown()
        return out


def draw_contexts(samples: SamplesFile, tokenizer: Any, width: int) -> tuple[list[list[int]], list[str], bool]:
    """Each draw's target context (its ``prompt_ids``, else :meth:`TokenText.prompt_ids` of its
    text), its prompt text (its ``prompt``, else the decoded ids), and whether any context was
    derived from text."""
    tt = None
    ctxs, texts, derived = [], [], False
    for d in samples.draws:
        if d.prompt_ids is not None:
            ctxs.append(list(d.prompt_ids))
            texts.append(d.prompt if d.prompt is not None else tokenizer.decode(list(d.prompt_ids)))
        else:
            assert d.prompt is not None
            tt = tt or TokenText.get(tokenizer, width)
            ctxs.append(tt.prompt_ids(d.prompt))
            texts.append(d.prompt)
            derived = True
    return ctxs, texts, derived


class _Replay:
    """A ``sample_batch_fn`` that returns recorded draws in order (the audits call it chunk by
    chunk, in order, for exactly the draws they were given)."""

    def __init__(self, draws: Sequence[Sequence[int]]) -> None:
        self.draws, self.at = [list(d) for d in draws], 0

    def __call__(self, prompts: list[str], seeds: list[int]) -> list[list[int]]:
        out = self.draws[self.at:self.at + len(prompts)]
        self.at += len(prompts)
        if len(out) != len(prompts):
            raise RuntimeError(f"the replay ran out of recorded draws ({len(self.draws)})")
        return out


def _order(ctxs: list[list[int]]) -> tuple[list[int], list[int], list[int]]:
    """The draws in the order the sequence audit reads them and which prompt each uses: when every
    prompt has the same number of draws, round-robin over the distinct prompts (so that the audit's
    per-prompt first-token tests group them); otherwise one prompt entry per draw. Returns the draw
    order, the prompt entries (indices of draws whose context stands for the entry) and the
    groups' sizes."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, c in enumerate(ctxs):
        groups.setdefault(tuple(c), []).append(i)
    sizes = [len(g) for g in groups.values()]
    if len(set(sizes)) == 1:
        gl = list(groups.values())
        order = [gl[k % len(gl)][k // len(gl)] for k in range(len(ctxs))]
        return order, [g[0] for g in gl], sizes
    return list(range(len(ctxs))), list(range(len(ctxs))), sizes


def _audit_file(s: SamplesFile, target: Any, tt: Any, law: Any, alpha: float, *, drafter: Any, dt: Any, seed: int,
                power: float, max_detectable_tv: float | None, context_bugs: Sequence[str] | None, batch_size: int,
                progress: Callable[[str], None] | None) -> tuple[FileAudit, list[list[int]], list[str]]:
    width = _width(target)
    provided = law if isinstance(law, ProvidedLaw) else None
    ctxs, texts, derived = draw_contexts(s, tt, width)
    sm = s.sampling
    order, entries, _ = _order(ctxs)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, c in enumerate(ctxs):
        groups.setdefault(tuple(c), []).append(i)
    big = sorted((g for g in groups.values() if len(g) >= FIRST_TOKEN_MIN_DRAWS), key=len, reverse=True)
    big = big[:FIRST_TOKEN_PROMPTS]
    a_seq = alpha / 2 if big else alpha
    seq = audit_sequences(None, target, tt, [texts[i] for i in entries], n=len(order), max_new_tokens=sm.max_new_tokens,
                          alpha=a_seq, seed=seed, drafter=drafter, drafter_tokenizer=dt if drafter is not None else None,
                          sample_batch_fn=_Replay([s.draws[i].ids for i in order]), power=power,
                          max_detectable_tv=max_detectable_tv, batch_size=batch_size, progress=progress,
                          name=os.path.basename(s.path), context_bugs=context_bugs,
                          prompt_ids=[ctxs[i] for i in entries], reference=provided, do_sample=sm.do_sample,
                          length_mismatch="lossy",  # a recorded draw of the wrong length is evidence
                          temperature=sm.temperature, top_k=sm.top_k, top_p=sm.top_p)
    firsts: list[GenerateAuditReport] = []
    notes: list[str] = []
    if derived:
        notes.append("some draws give only the prompt's text: their target context is hsd's encoding of it "
                     "(TokenText.prompt_ids); give prompt_ids to audit exactly what the engine conditioned on")
    for g in big:
        try:
            firsts.append(audit_generate(
                None, target, tt, texts[g[0]], n=len(g), positions=min(2, sm.max_new_tokens), alpha=alpha / 2 / len(big),
                seed=seed, prompt_ids=ctxs[g[0]], sample_batch_fn=_Replay([s.draws[i].ids for i in g]),
                max_detectable_tv=max_detectable_tv, power=power, reference=provided,
                name=f"{os.path.basename(s.path)} first tokens", do_sample=sm.do_sample, temperature=sm.temperature,
                top_k=sm.top_k, top_p=sm.top_p))
        except ValueError as e:  # InvalidTest: too few draws for a sized test
            notes.append(f"first-token audit of prompt {texts[g[0]]!r} not run: {' '.join(str(e).split())}")
    v, _ = combine_parts([("sequence audit", seq.verdict, seq.reason)]
                         + [(f"first-token audit of prompt {r.prompt!r}", r.verdict, r.reason) for r in firsts])
    if not big:
        notes.append(f"no prompt has {FIRST_TOKEN_MIN_DRAWS} draws: no first-token audit (the sequence audit tests "
                     "the first tokens too)")
    return FileAudit(s.describe(), v, seq, tuple(firsts), tuple(notes)), ctxs, texts


def check_applicable(s: SamplesFile) -> None:
    """Refuse (``NotImplementedError``, one line naming the keys) a file whose ``sampling`` sets
    processing this audit's reference law does not apply: the audit's law is temperature, then top-k,
    then top-p (vLLM's and transformers' order). :mod:`hsd_core.processing` computes the law of the
    other settings (the conformance kit's references); the teacher-forced audit of real models does
    not take them yet, and auditing against the law without them would be auditing the wrong law."""
    extra = s.sampling.processing()
    order = extra.pop("order", None)
    if order == "llama.cpp" and s.sampling.do_sample and (s.sampling.top_k is not None or s.sampling.top_p is not None):
        extra["order"] = order  # llama.cpp's top-k / top-p act before its temperature: another law
    if extra:
        raise NotImplementedError(
            f"{s.path}: sampling sets {', '.join(f'{k} {v!r}' for k, v in extra.items())}: the samples audit applies "
            "temperature, top-k and top-p (in vLLM's order) only, so its reference law would not be the engine's; "
            "audit such draws against hsd_core.processing's exact laws on the conformance kit (docs/conformance.md)")


def _engine_difference(engine: dict[str, object], baseline: dict[str, object]) -> str:
    """The keys in which two files' ``engine`` objects differ, each with both values (``patch 'cpu-expand'
    here, absent in the baseline``), in key order."""
    parts = []
    for k in sorted(set(engine) | set(baseline)):
        if engine.get(k, _ABSENT) != baseline.get(k, _ABSENT):
            here = repr(engine[k]) if k in engine else "absent"
            there = repr(baseline[k]) if k in baseline else "absent"
            parts.append(f"{k!r} ({here} here, {there} in the baseline)")
    return ", ".join(parts)


_ABSENT = object()


def _check_pair(s: SamplesFile, b: SamplesFile) -> None:
    where = f"the baseline {b.path}"
    if b.is_speculative:
        raise ValueError(f"{where} has speculative settings {dict(b.speculative or {})}: the baseline is the same engine "
                         "without speculation (\"speculative\": null)")
    if not s.is_speculative:
        raise ValueError(f"{s.path} has no speculation (\"speculative\": null): audit it alone (it is the null control), or "
                         "give the file with speculation and this one as the baseline")
    if dict(s.engine) != dict(b.engine):
        raise ValueError(f"{where} comes from {b.engine_label()}, {s.path} from {s.engine_label()}, and their engines "
                         f"differ in {_engine_difference(dict(s.engine), dict(b.engine))}: the baseline must be the same engine")
    if s.sampling != b.sampling:
        raise ValueError(f"{where} samples with {b.sampling}, {s.path} with {s.sampling}: the baseline needs the same "
                         "sampling settings")
    if s.target is not None and b.target is not None and s.target != b.target:
        raise ValueError(f"{where} serves target {b.target!r}, {s.path} {s.target!r}: the baseline needs the same target")
    shared = s.seeds() & b.seeds()
    if shared:
        raise ValueError(f"{where} shares {len(shared)} seeds with {s.path} (e.g. {min(shared)}): draws with one seed may "
                         "be coupled; draw the baseline with other seeds (independent draws)")


@torch.inference_mode()
def reference_description(target: Any) -> str:
    """What the default reference law is, in words, with what the target's dtype does to it: in
    float32, transformers' law; in a reduced precision (``--dtype bfloat16``), the law from logits that
    the forward rounded (the laws are computed in float32 from them), stated as such."""
    dtype = next((p.dtype for p in target.parameters()), None) if hasattr(target, "parameters") else None
    name = str(dtype).replace("torch.", "") if dtype is not None else "float32"
    base = (f"transformers' {name} teacher-forced law of the target (the default: no law provider of the "
            "engine was given; an engine whose numerics differ may fail against it, which the null control shows)")
    if name in ("float32", "float64"):
        return base
    return base + (f"; its forward passes ran in {name} and the laws are computed in float32 from their logits: "
                   f"{name} keeps {8 if name == 'bfloat16' else 11} significant bits of every activation, so the "
                   "reference departs from the float32 law by a small per-token TV and can break exact or near ties "
                   "the other way; an engine that is lossless against the float32 law can fail against it at a large "
                   "enough N, and its null control (the same engine without speculation) then fails too: read a "
                   "'lossy' verdict against a reduced-precision reference only with a null control that passes")


def audit_samples(
    samples: SamplesFile | str | os.PathLike[str],
    target: Any,
    target_tokenizer: Any,
    *,
    reference: LawProvider | ProvidedLaw | None = None,
    reference_name: str | None = None,
    baseline: SamplesFile | str | os.PathLike[str] | None = None,
    drafter: Any = None,
    drafter_tokenizer: Any = None,
    alpha: float = 1e-3,
    power: float = 0.99,
    seed: int = 0,
    max_detectable_tv: float | None = 0.1,
    context_bugs: Sequence[str] | None = DEFAULT_CONTEXT_BUGS,
    batch_size: int = 16,
    progress: Callable[[str], None] | None = None,
) -> EngineAuditReport:
    """Audit the recorded draws of ``samples`` (a :class:`~hsd_core.samples.SamplesFile` or its path)
    against ``target``'s teacher-forced law, or ``reference``'s (a law provider: the engine's own
    raw log-probabilities; ``target`` then gives the logit width and end ids), and with
    ``baseline`` (the same engine without speculation) run the null control and the two-sample test
    (module docstring). ``drafter`` / ``drafter_tokenizer``: the directional test of the sequence
    audit and the drafter scores of the two-sample test. Refuses (``NotImplementedError``, one line:
    :func:`check_applicable`) a file whose sampling sets processing beyond temperature, top-k and
    top-p, and (``ValueError``, one line) a baseline that is not the same engine and sampling without speculation, or that shares seeds.
    Returns an :class:`EngineAuditReport`."""
    s = samples if isinstance(samples, SamplesFile) else read_samples(samples)
    b = baseline if isinstance(baseline, SamplesFile) or baseline is None else read_samples(baseline)
    for f in (s,) if b is None else (s, b):
        check_applicable(f)
    if b is not None:
        _check_pair(s, b)
    if (drafter is None) != (drafter_tokenizer is None):
        raise TypeError("give both drafter and drafter_tokenizer, or neither")
    width = _width(target)
    if reference is None:
        law: Any = target
        ref = reference_description(target)
    else:
        law = reference if isinstance(reference, ProvidedLaw) else ProvidedLaw(reference, width, reference_name)
        ref = (f"the engine's own law from the provider {law.name} (given: the engine's numerics, not "
               "transformers', are the law its sampler must match)")
    kw: dict[str, Any] = dict(drafter=drafter, dt=drafter_tokenizer, seed=seed, power=power,
                              max_detectable_tv=max_detectable_tv, context_bugs=context_bugs, batch_size=batch_size,
                              progress=progress)
    notes = []
    if any(d.seed is None for d in s.draws + (b.draws if b is not None else ())):
        notes.append("some draws have no seed (the engine could not seed them): their independence is the engine's word")
    if s.target is not None:
        notes.append(f"the file says the engine served {s.target!r}")
    start = (law.calls, law.positions) if isinstance(law, ProvidedLaw) else (0, 0)
    t0 = time.perf_counter()
    if b is None:
        fa = _audit_file(s, target, target_tokenizer, law, alpha, **kw)[0]
        cost = {"audit": time.perf_counter() - t0}
        verdict, why = combine_with_control(fa.verdict, None, None, speculative=s.is_speculative)
        notes += _provider_note(law, start, fa)
        return EngineAuditReport(verdict, _headline(verdict, why, fa), ref, fa, notes=tuple(notes), cost=cost)
    fa, ctx_a, txt_a = _audit_file(s, target, target_tokenizer, law, alpha / 2, **kw)
    fb, ctx_b, txt_b = _audit_file(b, target, target_tokenizer, law, alpha / 2, **kw)
    t1 = time.perf_counter()
    seq_a, seq_b = [list(d.ids) for d in s.draws], [list(d.ids) for d in b.draws]
    scores: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
    if s.sampling.do_sample:
        sa = sequence_scores(law, target_tokenizer, drafter, drafter_tokenizer, ctx_a, txt_a, seq_a)
        sb = sequence_scores(law, target_tokenizer, drafter, drafter_tokenizer, ctx_b, txt_b, seq_b)
        scores = {k: (sa[k], sb[k]) for k in sa}
    ts = two_sample_sequences(seq_a, [tuple(c) for c in ctx_a], seq_b, [tuple(c) for c in ctx_b], scores=scores,
                              alpha=alpha / 2, power=power, do_sample=s.sampling.do_sample,
                              name_a=os.path.basename(s.path), name_b=os.path.basename(b.path))
    cost = {"reference audits": t1 - t0, "two-sample": time.perf_counter() - t1}
    notes += _provider_note(law, start, fa, fb)
    verdict, reason = combine_with_control(fa.verdict, fb.verdict, (ts.verdict, ts.reason))
    return EngineAuditReport(verdict, _headline(verdict, reason, fa, fb), ref, fa, fb, ts, tuple(notes), cost)


def _provider_note(law: Any, start: tuple[int, int], *files: FileAudit) -> list[str]:
    """The line that says how often a law provider was called since ``start`` (its calls and
    positions then), and for what; none for a target."""
    if not isinstance(law, ProvidedLaw):
        return []
    calls, positions = law.calls - start[0], law.positions - start[1]
    seq = sum(f.sequence.calls.get("provider calls", 0) for f in files)
    first = sum(r.provider_calls or 0 for f in files for r in f.first_token)
    return [f"the law provider {law.name} was called {calls} times ({positions} positions): {seq} for the sequence "
            f"audits (one per draw for all its positions, and one more per draw for each context bug), {first} for "
            f"the first-token audits (one per expanded prefix), {calls - seq - first} for the two-sample scores "
            "(none for a draw a sequence audit forced)"]


def _headline(verdict: Verdict, reason: str, *files: FileAudit) -> str:
    """The headline's reason. A "lossy" one starts with the first draw that is no draw of the
    target at all (an id outside its vocabulary, more ids than ``max_new_tokens``: an engine error,
    named with its file); an "inconclusive" one says the number of draws per file that would give
    the promised power (the sequence audits' estimate, the largest of the files') when known."""
    if verdict == "lossy":
        bad = [f"engine error in {f.describe.split(':')[0]}: {f.sequence.malformed[0]}" + (
            f" (and {len(f.sequence.malformed) - 1} more)" if len(f.sequence.malformed) > 1 else "")
               for f in files if f.sequence.malformed]
        return "; ".join(bad + [reason])
    need = [f.sequence.n_needed for f in files if f.sequence.n_needed is not None]
    if verdict != "inconclusive" or not need:
        return reason
    return f"{reason}; about {max(need)} draws per file would reach max_detectable_tv"
