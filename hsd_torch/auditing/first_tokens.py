"""Audit any ``generate()`` against a Hugging Face target's own law: :func:`audit_generate`.

``sample_fn(prompt, seed) -> list[int]`` is any sampler of new target ids (``transformers``'
``model.generate`` with an assistant, :func:`hsd_torch.generate`, third-party code). The reference
is the law of the first ``positions`` new tokens, computed exactly (float64) from the target's own
forward passes, processed by :func:`hsd_torch.engine.entry.process_logits` (temperature, top-k, top-p;
with ``mask_textless=True`` also the removal of ids without text other than EOS and the end ids,
as ``hsd_torch.generate(mask_textless=True)`` does), so the
processed law is defined in one place. The statistics and the verdict are
:func:`hsd_core.audit.audit_sampler`'s: the mass the coarse cells hide and ``max_detectable_tv``
enter its verdict as doubts (:func:`hsd_core.stats.decide`, one verdict rule for every audit).

Large vocabularies (up to ~150k ids) are handled by expanding only the prefixes that matter.
With ``n`` draws, a cell of expected count below 5 cannot be tested on its own, so:

* the root (the prompt) is expanded: its tokens of expected count ``n p >= 5`` are cells of their
  own, the others are pooled into one cell ``(RARE, ANY, ...)``;
* each kept, non-EOS prefix of expected count ``>= 5`` is expanded the same way (one batched
  forward pass per depth), the most probable first, at most ``max_prefixes`` of them; a prefix
  that is not expanded becomes the cell ``(prefix, ANY, ...)`` ("this prefix, then anything");
* a token the reference gives probability 0 keeps its own id, so a single draw of it is "lossy".

Every sampled output is truncated at its first EOS and at ``positions`` tokens and mapped to its
cell; the coarse law is a function of the exact law, so every test on it is valid. What the
coarsening hides (the mass inside the ``RARE``/``ANY`` cells, and what ``audit_sampler`` pools) is
added to ``detectable_tv``.

The family (Holm at ``alpha``): the joint law (chi-square, G-test, TV test), each position's law,
and the law of the next token after each of the ``max_conditional`` most frequent expanded
prefixes. Greedy (``do_sample=False``): the reference is the target's greedy output (argmax of the
processed law, ties to the lowest id) and every draw must equal it (the exact point-mass check).

The report adds the TV on the coarse table: a bias-corrected estimate (``tv_corrected``) inside its
95% basic (reflected) bootstrap interval (200 multinomial resamples), the plug-in TV and the 95th
percentile of the plug-in for a lossless sampler (``tv_null_q95``: the plug-in TV is biased
upward), and the most over- and under-represented cells decoded by the target tokenizer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, cast

import numpy as np
import torch

from hsd_core.audit import AuditPlan, AuditReport, Deviation, audit_plan, audit_sampler

from ..engine._args import as_int
from ..engine.laws import check_processing
from ..engine.prompts import target_context
from ..engine.runner import check_model, refuse_meta
from ..vocab.text import TokenText
from ._ids import _as_ids, _eos_ids, _law_columns, _width
from .cells import ANY, RARE, Reference, _batched_cells, _Draw, _IdCells, _laws, _Replay, _TextCells, reference_law
from .cells import _MIN_EXPECTED as _MIN_EXPECTED, _prefix_mass as _prefix_mass, _starts_with as _starts_with
from .generate_report import DecodedDeviation, GenerateAuditReport, _decode, _significant, _tv_stats
from .reference import LawProvider, ProvidedLaw
from .sequences import audit_sequences

__all__ = ["ANY", "RARE", "GenerateAuditReport", "audit_generate", "audit_sequences", "plan_line", "reference_law"]


_MAX_FIT_PASSES = 64


def _cell_law(target: Any, ids: Sequence[int], ref: Reference, mask: torch.Tensor,
              process: Mapping[str, Any], cells: Sequence[tuple[int, ...]] = ()) -> dict[tuple[int, ...], float]:
    """The probability of each of ``ref``'s cells under another processing of the target's logits
    (one forward pass per expanded prefix), and of the other ``cells`` given (observed ones outside
    the reference, such as a token of probability 0): the product, along the cell, of each token's
    probability, the mass outside the kept tokens for ``RARE``, 1 for ``ANY``."""
    rows: dict[tuple[int, ...], np.ndarray] = {}
    for depth in sorted({len(pre) for pre in ref.kept}):  # _laws takes contexts of one length
        pres = [pre for pre in ref.kept if len(pre) == depth]
        rows.update(zip(pres, _laws(target, [list(ids) + list(pre) for pre in pres], mask, process)))
    out: dict[tuple[int, ...], float] = {}
    for cell in list(ref.law) + [c for c in cells if c not in ref.law]:
        prob, pre = 1.0, cast(tuple[int, ...], ())
        for t in cell:
            if t == ANY:
                break
            row = rows.get(pre)
            if row is None:
                break
            prob *= float(1.0 - row[sorted(ref.kept[pre])].sum()) if t == RARE else float(row[t])
            if t == RARE:
                break
            pre = pre + (t,)
        out[cell] = prob
    return out


def _best_fit(target: Any, ids: Sequence[int], ref: Reference, mask: torch.Tensor, claimed: Mapping[str, Any],
              observed: Mapping[Any, int]) -> str | None:
    """Which of a few processings (the claimed one, temperature 1 with no truncation, the claimed
    temperature with no truncation) the observed cells fit best, by log-likelihood; None when the
    claimed one fits best (nothing to say) or when none gives every observed cell mass."""
    cands = {"the claimed processing": dict(claimed),
             "temperature 1 without top-k / top-p": {"temperature": 1.0, "top_k": None, "top_p": None},
             f"temperature {claimed['temperature']} without top-k / top-p":
                 {"temperature": claimed["temperature"], "top_k": None, "top_p": None}}
    scores: dict[str, float] = {}
    for name, proc in cands.items():
        if name != "the claimed processing" and proc == dict(claimed):
            continue
        law = _cell_law(target, ids, ref, mask, proc, [tuple(c) for c in observed])
        ll = 0.0
        for cell, c in observed.items():
            pr = law.get(tuple(cell), 0.0)
            ll += c * math.log(pr) if pr > 0 else -math.inf
        scores[name] = ll
    best = max(scores, key=lambda k: scores[k])
    if best == "the claimed processing" or scores[best] == -math.inf:
        return None
    return f"{best} (log-likelihood {scores[best]:.1f} against {scores['the claimed processing']:.1f} for the claimed one)"

def plan_line(plan: AuditPlan, hidden: float, positions: int) -> str:
    """One line, before any draw: what an audit of ``plan.n`` draws of the first ``positions`` tokens
    will catch (``plan``'s detectable TV plus ``hidden``, the mass of the reference's coarse cells,
    exactly the number the report will give as ``detectable_tv``)."""
    head = (f"plan: {plan.n} draws of the first {positions} token(s), {plan.tests} tests at family-wise alpha "
            f"{plan.alpha:.3g}; ")
    d = None if plan.detectable_tv is None else plan.detectable_tv + hidden
    if d is None or d >= 1.0:
        return head + f"no TV below 1 can be promised at this size ({plan.by}): more draws are needed"
    return (head + f"any law at TV >= {d:.4g} from the target's would be caught with probability >= {plan.power} "
            f"({plan.by}" + (f" + mass {hidden:.4g} of the rare / unexpanded cells" if hidden > 0 else "") + ")")


def _coarse_doubts(planned: AuditPlan, hidden: float, n: int, max_detectable_tv: float | None
                   ) -> tuple[float | None, list[Callable[[], str | None]], Callable[[], str] | None]:
    """What :func:`audit_generate` promises (``planned``'s TV plus ``hidden``, the mass of the coarse
    cells, which no test sees inside; None: no TV below 1) and its doubts and promise for
    :func:`hsd_core.audit.audit_sampler`'s verdict: "inconclusive" when that promise is missing or above
    ``max_detectable_tv`` (the reason says about how many draws would reach it); the promise names
    the coarse cells' mass when there is any (None: the core audit's own promise)."""
    d = planned.detectable_tv
    detectable = None if d is None or d + hidden >= 1.0 else d + hidden

    def coarse_no_power() -> str | None:
        return None if detectable is not None else (
            f"no test rejects, but with the coarse cells' mass {hidden:.4g} no TV below 1 is promised; increase n")

    def too_weak() -> str | None:
        if max_detectable_tv is None or detectable is None or detectable <= max_detectable_tv:
            return None
        room = max_detectable_tv - hidden
        more = (f"; about n = {math.ceil(n * ((detectable - hidden) / room) ** 2)} draws would reach it "
                "(the tests' part of it shrinks as 1 / sqrt(n))" if room > 0 else
                f"; the rare / unexpanded cells alone hold {hidden:.4g}: more draws expand more of them")
        return (f"no test rejects, but the detectable TV {detectable:.4g} is above max_detectable_tv "
                f"{max_detectable_tv:.4g}{more}")

    def promise() -> str:
        return (f"no test rejects at family-wise alpha {planned.alpha:.3g}; any law at TV >= {detectable:.4g} would be "
                f"caught with probability >= {planned.power} ({planned.by} + mass {hidden:.4g} of the rare / "
                "unexpanded cells)")
    return detectable, [coarse_no_power, too_weak], (promise if hidden > 0 else None)


def audit_generate(
    sample_fn: Callable[[str, int], Sequence[int]] | None, target: Any, target_tokenizer: Any,
    prompt: str | None = None, n: int = 20000, positions: int = 2, do_sample: bool = True, temperature: float = 1.0,
    top_k: int | None = None, top_p: float | None = None, alpha: float = 1e-3, seed: int = 0,
    executor: Executor | None = None, *, mask_textless: bool = False, prompt_ids: Sequence[int] | None = None,
    max_prefixes: int = 512, max_conditional: int = 8, chunk_size: int = 1000, power: float = 0.99,
    name: str | None = None, sample_batch_fn: Callable[[list[str], list[int]], Sequence[Any]] | None = None,
    batch_size: int = 64, max_detectable_tv: float | None = 0.1, text: bool = False,
    reference: LawProvider | ProvidedLaw | None = None, progress: Callable[[str], None] | None = None,
) -> GenerateAuditReport:
    """Audit ``sample_fn(prompt, seed) -> list[int]`` (new target ids) against ``target``'s own
    law of the first ``positions`` new tokens (module docstring).

    ``temperature``, ``top_k``, ``top_p``: the processing the sampler claims
    (:func:`hsd_torch.engine.entry.process_logits`; ignored when greedy); ``mask_textless=True`` adds
    hsd_torch's removal of ids without text (other than EOS), the law :func:`hsd_torch.generate`
    samples; the target's context is the prompt's ids as :func:`hsd_torch.generate` feeds them
    (:func:`hsd_torch.engine.prompts.target_context`: one BOS, also when the text starts with the BOS's
    text, as a chat template's does); ``prompt_ids`` overrides them as the target's
    context (``prompt`` may then be left out: the sampler gets the ids' decoded text). ``seed``: the draws are made in chunks of ``chunk_size`` with
    ``SeedSequence(seed).spawn`` children, each draw gets a 32-bit seed from its chunk's generator
    (a repeated seed among 20,000 draws has probability about 5% and repeats one draw), so a run is
    reproducible and identical on any ``executor`` (which needs a picklable ``sample_fn``).
    ``max_prefixes``: forward-pass budget for expanding prefixes; ``max_conditional``: how many
    frequent prefixes get a next-token test. ``sample_batch_fn(prompts, seeds) -> list of id lists``
    (with ``sample_fn=None``): a batched sampler, called with ``batch_size`` draws at a time (the
    seeds are those the draws would get one by one; its rows must be independent draws; not with
    ``executor``). ``max_detectable_tv``: a verdict that would be "lossless-consistent" with a
    detectable TV above it is "inconclusive", and the reason says about how many draws would reach
    it (None: no threshold). ``text=True``: the sampler returns the new **text** of exactly
    ``positions`` tokens (ask it for ``max_new_tokens=positions``), and the cells are texts: the
    reference is the law of ``target_tokenizer.decode(ids, skip_special_tokens=True)`` of the first
    ``positions`` tokens, which is exact only when no cell was pooled (``ValueError`` otherwise: give
    a top-k or top-p that keeps few tokens, or fewer positions); a text no such token sequence
    decodes to is a draw of probability 0. ``reference``: a law provider ``(prompt_ids, ids) -> [len(ids),
    V]`` raw log-probabilities (:mod:`hsd_torch.auditing.reference`), whose laws replace ``target``'s forward
    passes (``target`` still gives the logit width and the end ids). ``progress``: called once with a
    ``"plan: ..."`` line before the first draw, stating what the ``n`` draws will be able to detect
    (:func:`plan_line`; the report's ``detectable_tv`` is the same number). Returns a
    :class:`GenerateAuditReport`.
    """
    fn = _checked_sampler(sample_fn, sample_batch_fn, executor, max_detectable_tv)
    prompt = _prompt_text(prompt, prompt_ids, target, target_tokenizer)
    positions = as_int("positions", positions, 1)
    n = as_int("n", n, 1)
    checked = check_processing(temperature, top_k, top_p)  # the same checks as generate's
    refuse_meta(check_model(target, "target"), "target")
    width = _width(target)
    eos = _eos_ids(target, target_tokenizer)
    mask = _law_columns(target_tokenizer, width, eos, mask_textless)
    process, processing = _processing(checked, do_sample, mask_textless, temperature, top_k, top_p)
    ids = _target_ids(prompt_ids, target_tokenizer, prompt, width)
    law_of: Any = target if reference is None else \
        reference if isinstance(reference, ProvidedLaw) else ProvidedLaw(reference, width)
    calls0 = law_of.calls if isinstance(law_of, ProvidedLaw) else None
    ref = reference_law(law_of, ids, int(n), positions, eos, mask, process, do_sample, max_prefixes, max_conditional)
    label = name or str(getattr(fn, "__qualname__", "") or type(fn).__name__)
    texts = _TextCells(ref, target_tokenizer, prompt) if text else None
    law = texts.law if texts is not None else ref.law
    cells_of = texts if texts is not None else _IdCells(ref, width, ids)
    # what the draws can detect depends on the law and n only (the report's detectable_tv): known before drawing
    planned = audit_plan(law, int(n), alpha, power, prefixes=0 if text else len(ref.frequent))
    if progress is not None:
        progress(plan_line(planned, ref.coarse_mass, positions))
    detectable, doubts, promise = _coarse_doubts(planned, ref.coarse_mass, int(n), max_detectable_tv)
    draw = _draws(sample_fn, sample_batch_fn, prompt, cells_of, int(n), seed, chunk_size, batch_size)
    core = audit_sampler(draw, law, n=int(n), alpha=alpha, power=power,
                         positions=True, seed=seed, executor=executor, chunk_size=chunk_size,
                         prefixes=[] if text else list(ref.frequent), name=label,
                         rng_note=f"audit_generate seed {seed}, chunks of {chunk_size}",
                         doubts=doubts, promise=promise)
    reason = core.reason  # hsd_core.stats.decide's, with this audit's doubts
    if core.verdict == "lossy" and do_sample and not text and ref.forward_passes <= _MAX_FIT_PASSES:
        fit = _best_fit(law_of, ids, ref, mask, process, core.observed)
        if fit is not None:
            reason += f"; of a few processings, the draws fit best {fit}"
    reason += _prompt_hint(core, draw.with_prompt, text)
    rep = _report(core, ref, law, texts, target_tokenizer, reason=reason, detectable=detectable, alpha=alpha,
                  seed=seed, positions=positions, do_sample=do_sample, processing=processing, prompt=prompt, name=label)
    return rep if calls0 is None else dataclasses.replace(rep, provider_calls=law_of.calls - calls0)


def _draws(sample_fn: Callable[[str, int], Any] | None,
           sample_batch_fn: Callable[[list[str], list[int]], Sequence[Any]] | None, prompt: str,
           cells_of: _IdCells | _TextCells, n: int, seed: int, chunk_size: int, batch_size: int) -> _Draw | _Replay:
    """What :func:`hsd_core.audit.audit_sampler` draws from: ``sample_fn``'s draws one by one, or
    the ``n`` draws of ``sample_batch_fn`` (``batch_size`` at a time, checked to be an int >= 1),
    made now with the seeds the draws would get one by one and replayed."""
    if sample_batch_fn is not None:
        return _batched_cells(sample_batch_fn, prompt, cells_of, n, seed, chunk_size, as_int("batch_size", batch_size, 1))
    assert sample_fn is not None
    return _Draw(sample_fn, prompt, cells_of)


def _checked_sampler(sample_fn: Callable[[str, int], Sequence[int]] | None,
                     sample_batch_fn: Callable[[list[str], list[int]], Sequence[Any]] | None,
                     executor: Executor | None, max_detectable_tv: float | None) -> Any:
    """The sampler :func:`audit_generate` was given (``TypeError`` unless exactly one of
    ``sample_fn`` and ``sample_batch_fn``, a callable, and a batched one without ``executor``),
    once ``max_detectable_tv`` is checked to be in (0, 1] or None (``ValueError``)."""
    if (sample_fn is None) == (sample_batch_fn is None):
        raise TypeError("give exactly one of sample_fn (prompt, seed) -> ids and sample_batch_fn (prompts, seeds) "
                        "-> list of id lists")
    if sample_batch_fn is not None and executor is not None:
        raise TypeError("sample_batch_fn runs in this process: not with an executor")
    fn: Any = sample_fn if sample_fn is not None else sample_batch_fn
    if not callable(fn):
        raise TypeError(f"sample_fn must be a callable (prompt, seed) -> list of ids, got {type(fn).__name__}")
    if max_detectable_tv is not None and not (isinstance(max_detectable_tv, (int, float)) and 0 < max_detectable_tv <= 1):
        raise ValueError(f"max_detectable_tv must be in (0, 1] or None, got {max_detectable_tv!r}")
    return fn


def _prompt_text(prompt: str | None, prompt_ids: Sequence[int] | None, target: Any, target_tokenizer: Any) -> str:
    """The prompt the sampler gets: ``prompt``, or without one the decoded text of ``prompt_ids``
    (``TypeError`` when neither is given or the prompt is not a str)."""
    if prompt is None:
        if prompt_ids is None:
            raise TypeError("give a prompt (a str), or prompt_ids (the target's context)")
        prompt = target_tokenizer.decode(_as_ids(prompt_ids, "prompt_ids has", _width(target)))
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    return prompt


def _processing(checked: Mapping[str, Any], do_sample: bool, mask_textless: bool, temperature: float,
                top_k: int | None, top_p: float | None) -> tuple[dict[str, Any], str]:
    """The processing of the reference's laws (``checked``, the claimed one, or none when greedy)
    and its description in the report (the claimed arguments as given)."""
    if not do_sample:
        return ({"temperature": 1.0, "top_k": None, "top_p": None},
                "argmax" + (" over ids with text (mask_textless)" if mask_textless else ""))
    return dict(checked), (f"temperature {temperature}, top_k {top_k}, top_p {top_p}"
                           + (", ids without text removed (mask_textless)" if mask_textless else ""))


def _target_ids(prompt_ids: Sequence[int] | None, target_tokenizer: Any, prompt: str, width: int) -> list[int]:
    """The target's context: ``prompt_ids`` checked (``ValueError`` when empty or outside the
    target's ids), else the prompt as generate feeds it (one BOS, even when the text starts with
    the BOS's own text)."""
    if prompt_ids is not None:
        ids = _as_ids(prompt_ids, "prompt_ids has", width)
        if not ids:
            raise ValueError("prompt_ids is empty: the target needs at least one id to condition on")
        return ids
    return target_context(TokenText.get(target_tokenizer, width), prompt)


def _prompt_hint(core: AuditReport, with_prompt: int, text: bool) -> str:
    """The hint a lossy report ends with when most draws start with the prompt's own ids (or text):
    the sampler likely returns prompt + new ones (``with_prompt`` is counted in this process, not on
    an executor's workers)."""
    if core.verdict != "lossy" or with_prompt <= core.n / 2:
        return ""
    what = "text" if text else "ids"
    return (f"; {with_prompt} of {core.n} draws start with the prompt's own {what}: does the sampler return "
            f"prompt + new {what}? return only the new ones")


def _report(core: AuditReport, ref: Reference, law: Mapping[tuple[int, ...], float], texts: _TextCells | None,
            tokenizer: Any, *, reason: str, detectable: float | None, alpha: float, seed: int, positions: int,
            do_sample: bool, processing: str, prompt: str, name: str) -> GenerateAuditReport:
    """:func:`audit_generate`'s report from ``core`` (the audit on the coarse ``law``): the TV
    statistics, each position's detectable TV with its coarse cells' mass, the decoded deviations."""
    text = texts is not None
    est, ci, null, corrected = _tv_stats(law, core.observed, core.n, seed)
    pos_det: list[float | None] = []
    for j, d in enumerate(() if text else core.position_detectable):
        reach = sum(p for c, p in ref.law.items() if len(c) > j)
        hid = sum(p for c, p in ref.law.items() if len(c) > j and c[j] in (ANY, RARE)) / reach if reach else 0.0
        pos_det.append(None if d is None or d + hid >= 1.0 else d + hid)

    def dec(rows: Sequence[Deviation]) -> tuple[DecodedDeviation, ...]:
        if texts is not None:
            return tuple(DecodedDeviation(tuple(d.output), repr(texts.text_of(tuple(d.output)))[1:-1],  # type: ignore[arg-type]
                                          d.observed, d.expected) for d in rows)
        return tuple(DecodedDeviation(tuple(d.output), _decode(tokenizer, tuple(d.output)),  # type: ignore[arg-type]
                                      d.observed, d.expected) for d in rows)

    return GenerateAuditReport(
        verdict=core.verdict, reason=reason, n=core.n, alpha=alpha, seed=seed, positions=positions,
        do_sample=do_sample, processing=processing, detectable_tv=detectable, tv_estimate=est, tv_ci=ci,
        tv_null_q95=null, cells=len(law), coarse_mass=ref.coarse_mass, forward_passes=ref.forward_passes,
        conditional_prefixes=() if text else ref.frequent, over=dec(_significant(core.over, core.n, len(law))),
        under=dec(_significant(core.under, core.n, len(law))), core=core,
        prompt=prompt, name=name, tv_corrected=corrected, position_detectable=tuple(pos_det))
