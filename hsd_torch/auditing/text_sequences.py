"""The sequence audit's text mode: samplers that return text, audited without re-encoding guesses.

A text has many tokenizations, and the target's law of a whole text is a sum over them; re-encoding
a sampled text gives one canonical tokenization, which a lossless target does not always write, so
a per-token test of re-encoded text would call lossless samplers lossy (``docs/auditing.md``). The
text mode therefore compares **two samples of texts**: the sampler's, and as many drawn here from
the target itself (hsd's autoregressive decoding, :func:`hsd_torch.generate` with ``method="ar"``:
the target's own processed law, checked exactly against ``hsd_core`` by the mirror tests), each
decoded by the same rule, ``target_tokenizer.decode(new_ids, skip_special_tokens=True)`` (the rule of
``audit_generate(text=True)``). Both texts then go through one fixed map (the target tokenizer's
encoding, :meth:`hsd_torch.vocab.text.TokenText.encode`) and the two samples of id sequences are compared
by :func:`hsd_core.twosample.two_sample_sequences`: within each prompt, the first one and two ids'
homogeneity and stratified rank tests of the log-likelihood under the target (and, with a drafter,
under the drafter and their difference) of those ids. A fixed function applied to both samples
keeps every test valid: equal laws of texts give equal laws of whatever is computed from them, so a
lossless sampler fails with probability at most ``alpha`` whatever the tokenizer's quirks; power
comes from how well the statistics separate the laws, and the report states what they detect.

Greedy (``do_sample=False``): every text must equal the decoded greedy continuation of the target.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from hsd_core.seqaudit import SequenceAuditReport, sequence_seeds
from hsd_core.twosample import TwoSampleReport, two_sample_sequences

from ..engine.entry import generate
from ..vocab.text import TokenText
from ._ids import _width
from .forcing import _changed, model_fingerprint, sequence_scores

__all__ = ["as_sequence_report", "audit_text_sequences", "reference_seeds"]

TextBatchFn = Callable[[list[str], list[int]], Sequence[Any]]


def reference_seeds(seed: int, n: int) -> list[int]:
    """The 32-bit seed of each of the ``n`` reference sequences drawn from the target
    (``SeedSequence([seed, i, 2])``): independent of the sampler's stream
    (:func:`hsd_core.seqaudit.sequence_seeds`, ``[seed, i, 0]``)."""
    return [int(np.random.SeedSequence([seed, i, 2]).generate_state(1)[0]) for i in range(n)]


def _as_text(out: Any, what: str) -> str:
    if not isinstance(out, str):
        raise TypeError(f"{what} {type(out).__name__}, not the new text: with text=True the sampler must return the "
                        "text of its new tokens (a str: tokenizer.decode(new_ids, skip_special_tokens=True))")
    return out


def _reference_texts(target: Any, tt: Any, plist: Sequence[str], contexts: Sequence[Sequence[int]] | None, n: int,
                     max_new_tokens: int, do_sample: bool, process: dict[str, Any], mask_textless: bool,
                     seeds: Sequence[int], batch_size: int) -> list[str]:
    """``n`` texts drawn from the target's own law (hsd's AR decoding), sequence ``i`` after prompt
    ``i % len(plist)`` (or context ``contexts[i % len]``), with ``seeds[i]`` (a batch's rows are
    independent streams from its first seed)."""
    kw: dict[str, Any] = dict(target_tokenizer=tt, method="ar", max_new_tokens=max_new_tokens, do_sample=do_sample,
                              mask_textless=mask_textless, **process)
    out: list[str] = []
    if contexts is None:
        for c0 in range(0, n, batch_size):
            idx = range(c0, min(n, c0 + batch_size))
            got = generate(target, None, [plist[i % len(plist)] for i in idx], seed=seeds[c0], **kw).sequences
            out += [str(tt.decode(list(s), skip_special_tokens=True)) for s in got]
        return out
    dev = next(target.parameters()).device
    for i in range(n):
        ctx = torch.tensor([list(contexts[i % len(contexts)])], dtype=torch.long, device=dev)
        got = generate(target, None, input_ids=ctx, seed=seeds[i], **kw).sequences
        out.append(str(tt.decode(list(got[0]), skip_special_tokens=True)))
    return out


def audit_text_sequences(
    sample_fn: Callable[[str, int], str] | None,
    target: Any,
    target_tokenizer: Any,
    plist: Sequence[str],
    contexts: Sequence[Sequence[int]] | None,
    *,
    n: int,
    max_new_tokens: int,
    do_sample: bool,
    process: dict[str, Any],
    alpha: float,
    power: float,
    seed: int,
    drafter: Any = None,
    drafter_tokenizer: Any = None,
    sample_batch_fn: TextBatchFn | None = None,
    mask_textless: bool = False,
    batch_size: int = 16,
    progress: Callable[[str], None] | None = None,
    name: str | None = None,
    max_detectable_tv: float | None = 0.1,
    processing: str = "",
) -> SequenceAuditReport:
    """``audit_sequences(..., text=True)`` (module docstring): ``n`` texts from the sampler
    (``sample_fn(prompt, seed) -> str``, or ``sample_batch_fn(prompts, seeds) -> list of str``; the
    seeds of :func:`hsd_core.seqaudit.sequence_seeds`) against ``n`` texts drawn from the target with
    ``process`` (checked processing settings) and the seeds of :func:`reference_seeds`, each
    sequence after prompt ``plist[i % len(plist)]`` (``contexts``: the target's context ids
    instead, one per prompt). Returns a :class:`~hsd_core.seqaudit.SequenceAuditReport` whose tests
    are the two-sample family of the sampler (sample A) against the target (sample B), strata the
    prompts (:func:`as_sequence_report`)."""
    width = _width(target)
    t_text = TokenText.get(target_tokenizer, width)
    ctxs = [list(contexts[i % len(contexts)]) for i in range(n)] if contexts is not None else \
        [t_text.prompt_ids(plist[i % len(plist)]) for i in range(n)]
    seeds = sequence_seeds(int(seed), n)
    label = name or str(getattr(sample_fn or sample_batch_fn, "__qualname__", "") or "sampler")
    before = model_fingerprint(drafter) if drafter is not None else None
    t0 = time.perf_counter()
    texts: list[str] = []
    for c0 in range(0, n, batch_size):
        idx = list(range(c0, min(n, c0 + batch_size)))
        if sample_batch_fn is not None:
            outs = list(sample_batch_fn([plist[i % len(plist)] for i in idx], [seeds[i] for i in idx]))
            if len(outs) != len(idx):
                raise ValueError(f"sample_batch_fn returned {len(outs)} texts for {len(idx)} prompts")
        else:
            assert sample_fn is not None
            outs = [sample_fn(plist[i % len(plist)], seeds[i]) for i in idx]
        texts += [_as_text(o, f"the sampler (sequence {i}, seed {seeds[i]}) returned a") for i, o in zip(idx, outs)]
        if progress is not None:
            progress(f"sampled {len(texts)}/{n} texts in {time.perf_counter() - t0:.1f} s")
    if before is not None and (after := model_fingerprint(drafter)) != before:
        raise ValueError(f"the sampler changed the drafter the audit reads ({_changed(before, after)}): give the sampler "
                         "its own copy (copy.deepcopy(drafter) before the audit) and the audit the untouched drafter")
    t1 = time.perf_counter()
    ref = _reference_texts(target, target_tokenizer, plist, contexts, n, max_new_tokens, do_sample, process,
                           mask_textless, reference_seeds(int(seed), n), batch_size)
    if progress is not None:
        progress(f"drew {n} reference texts from the target in {time.perf_counter() - t1:.1f} s")
    strata = [i % len(contexts if contexts is not None else plist) for i in range(n)]
    if do_sample:  # one fixed map for both samples: the target tokenizer's encoding of the text
        seq_a = [t_text.encode(t.encode("utf-8", "surrogateescape"), free=True) for t in texts]
        seq_b = [t_text.encode(t.encode("utf-8", "surrogateescape"), free=True) for t in ref]
    else:  # greedy: the texts themselves (as code points) must be equal
        seq_a, seq_b = [[ord(c) for c in t] for t in texts], [[ord(c) for c in t] for t in ref]
    scores = None
    if do_sample:
        prompts = [plist[i % len(plist)] for i in range(n)]
        sa = sequence_scores(target, target_tokenizer, drafter, drafter_tokenizer, ctxs, prompts, seq_a)
        sb = sequence_scores(target, target_tokenizer, drafter, drafter_tokenizer, ctxs, prompts, seq_b)
        scores = {k.replace("reference", "target"): (sa[k], sb[k]) for k in sa}
    ts = two_sample_sequences(seq_a, strata, seq_b, strata, scores=scores, alpha=alpha, power=power,
                              do_sample=do_sample, name_a=label, name_b="the target's own texts (hsd AR)",
                              max_detectable_tv=max_detectable_tv)
    cost = {"sampling": t1 - t0, "reference and tests": time.perf_counter() - t1}
    return as_sequence_report(ts, label, seed, max_new_tokens, sum(map(len, seq_a)), processing, max_detectable_tv,
                              cost)


def as_sequence_report(ts: TwoSampleReport, name: str, seed: int, max_new_tokens: int, tokens: int, processing: str,
                       max_detectable_tv: float | None, cost: dict[str, float]) -> SequenceAuditReport:
    """The two-sample result of the text mode as the sequence audit's report, with its verdict
    (:func:`hsd_core.twosample.two_sample_sequences`' own, given ``max_detectable_tv``: a
    "lossless-consistent" needs the first-token homogeneity test to detect that TV);
    ``detectable_tv`` is that test's TV (on the re-encoded first token's law per prompt, not a mean
    per-token TV: ``detectable_by`` says so and lists every test's promise). ``max_detectable_tv``
    must be the one ``ts`` was judged with (``ts.max_detectable_tv``; ``ValueError`` otherwise):
    the report restates that verdict and does not judge again."""
    if ts.do_sample and ts.max_detectable_tv != max_detectable_tv:
        raise ValueError(f"the two-sample report was judged with max_detectable_tv {ts.max_detectable_tv}, not "
                         f"{max_detectable_tv}: pass max_detectable_tv to two_sample_sequences")
    first = next((q.detectable for q in ts.powers if q.test == "first-token homogeneity"), None)
    said = "; ".join(f"{q.test}: {q.unit} {q.detectable:.3g}" for q in ts.powers if q.detectable is not None)
    by = ("text mode, two-sample tests against the target's own texts (re-encoded): TV of the first token's law in "
          "every prompt" + (f"; {said}" if said else ""))
    verdict, reason = ts.verdict, f"text mode (two samples of texts): {ts.reason}"
    return SequenceAuditReport(
        verdict=verdict, reason=reason, n=ts.n_a, tokens=tokens, max_new_tokens=max_new_tokens, alpha=ts.alpha,
        power=ts.power, seed=seed, m=ts.m, tests=ts.tests, holm_rejected=ts.holm_rejected, skipped=ts.skipped,
        families=(), detectable_tv=first if ts.do_sample else None,
        detectable_by=by if ts.do_sample else "text mode, greedy: every text compared with the target's greedy text",
        impossible=(), malformed=ts.greedy_mismatch, do_sample=ts.do_sample, processing=processing, name=name,
        cost=cost)
