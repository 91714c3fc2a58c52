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

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from hsd_core.audit import AuditPlan, AuditReport, Deviation, Verdict, audit_plan, audit_sampler

from ..engine._args import as_int
from ..engine.entry import process_logits
from ..engine.laws import TextSpace, check_processing
from ..engine.prompts import target_context
from ..engine.runner import check_model, refuse_meta
from ..vocab.text import TokenText
from ._ids import _as_ids, _eos_ids, _width
from .reference import LawProvider, ProvidedLaw
from .sequences import audit_sequences

__all__ = ["ANY", "RARE", "GenerateAuditReport", "audit_generate", "audit_sequences", "plan_line", "reference_law"]

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
    """The coarse reference law for ``n`` draws (module docstring)."""
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


@dataclass(frozen=True)
class DecodedDeviation:
    """A cell with its tokens decoded (``*``: any continuation, ``<rare>``: a pooled rare token)."""

    output: tuple[int, ...]
    text: str
    observed: int
    expected: float


@dataclass(frozen=True)
class GenerateAuditReport:
    """Result of :func:`audit_generate`: ``verdict`` as :mod:`hsd_core.audit`; ``core`` the
    underlying :class:`~hsd_core.audit.AuditReport` on the coarse table; ``detectable_tv`` includes
    the mass hidden in the coarse cells (``coarse_mass``) and in ``core``'s pooled cell."""

    verdict: Verdict
    reason: str
    n: int
    alpha: float
    seed: int
    positions: int
    do_sample: bool
    processing: str
    detectable_tv: float | None
    tv_estimate: float
    tv_ci: tuple[float, float]
    tv_null_q95: float
    cells: int
    coarse_mass: float
    forward_passes: int
    conditional_prefixes: tuple[tuple[int, ...], ...]
    over: tuple[DecodedDeviation, ...]
    under: tuple[DecodedDeviation, ...]
    core: AuditReport = field(repr=False)
    prompt: str = ""
    name: str = "sampler"
    tv_corrected: float = float("nan")
    """The bias-corrected TV estimate (inside ``tv_ci`` by construction; ``tv_estimate`` is the
    plug-in, biased upward, which ``tv_null_q95`` is the null quantile of)."""
    position_detectable: tuple[float | None, ...] = ()
    """For each position ``j``, the TV of the ``j``-th token's law that its own test catches with
    probability ``power``: ``core.position_detectable[j]`` plus the mass the coarse cells hide at
    ``j`` (rare tokens and unexpanded prefixes, given that the output reaches ``j``; None: no power)."""

    def to_markdown(self, title: str | None = None) -> str:
        """The report as markdown: the verdict, the sizing, the TV estimate, the decoded largest
        deviations, then ``core``'s test table."""
        det = "n/a (no power)" if self.detectable_tv is None else f"{self.detectable_tv:.4g}"
        lines = [f"# {title or 'Audit of ' + self.name}", "",
                 f"**Verdict: {self.verdict}** ({self.reason})", "",
                 f"- prompt {self.prompt!r}; first {self.positions} new tokens; "
                 f"{'sampling' if self.do_sample else 'greedy'}; processing: {self.processing}",
                 f"- n = {self.n} draws, seed {self.seed}; family-wise alpha {self.alpha:.3g} (Holm over "
                 f"{self.core.m} tests)",
                 f"- detectable TV (power {self.core.power}): {det} (includes {self.coarse_mass:.4g} of mass in "
                 f"pooled rare / unexpanded cells and {self.core.pooled_mass:.4g} pooled by the tests)",
                 f"- estimated TV on the {self.cells}-cell table: {self.tv_corrected:.4g} (bias-corrected; 95% basic "
                 f"bootstrap interval {self.tv_ci[0]:.4g} to {self.tv_ci[1]:.4g}); plug-in TV {self.tv_estimate:.4g}, "
                 f"which a lossless sampler shows up to {self.tv_null_q95:.4g} (95th percentile)",
                 "- detectable TV of each position's own law (its rare / unexpanded cells' mass included): "
                 + ", ".join(f"position {j}: " + ("n/a" if d is None else f"{d:.4g}")
                             for j, d in enumerate(self.position_detectable)),
                 f"- reference: {self.forward_passes} target forward passes"
                 + (f"; next-token tests after {len(self.conditional_prefixes)} frequent prefixes"
                    if self.conditional_prefixes else "")]

        def table(name: str, rows: Sequence[DecodedDeviation]) -> list[str]:
            out = ["", f"{name} (observed vs expected count; only cells beyond chance: binomial p < 1% / "
                   f"{self.cells} cells):", "", "| cell (ids) | text | observed | expected |", "|---|---|---|---|"]
            out += [f"| `{d.output}` | `{d.text}` | {d.observed} | {d.expected:.1f} |" for d in rows]
            return out + (["| (none) | | | |"] if not rows else [])

        lines += table("Most over-represented", self.over)
        lines += table("Most under-represented", self.under)
        lines += ["", self.core.to_markdown(title="Tests (hsd_core.audit)").replace("## ", "## ", 1)]
        return "\n".join(lines) + "\n"

    def save_plot(self, path: str, max_bars: int = 40, log: bool = False, tokenizer: Any = None) -> bool:
        """The PNG of :meth:`hsd_core.audit.AuditReport.save_plot`; each cell labelled by its ids and,
        with ``tokenizer`` (the target's), its decoded text (``<any>``: any continuation, ``<rare>``:
        the pooled rare tokens)."""
        def label(cell: Any) -> str:
            ids = ",".join("*" if t == ANY else "rare" if t == RARE else str(t) for t in cell)
            return f"{_decode(tokenizer, tuple(cell))} [{ids}]" if tokenizer is not None else f"[{ids}]"
        return self.core.save_plot(path, max_bars=max_bars, log=log, label=label)


def _decode(tokenizer: Any, cell: tuple[int, ...]) -> str:
    """A cell's tokens as text: each id's decoded text (repr) with its token form where that text
    is ambiguous (a byte token decodes to U+FFFD alone, a token may decode to ``*``), ``<any>``
    for "any continuation" and ``<rare>`` for the pooled rare tokens (the cell's ids are printed
    beside it)."""
    parts = []
    for t in cell:
        if t == ANY:
            parts.append("<any>")
        elif t == RARE:
            parts.append("<rare>")
        else:
            try:
                text = tokenizer.decode([t])
            except Exception:  # an id outside the tokenizer (padded embedding)
                parts.append(f"<id {t}>")
                continue
            shown = repr(text)[1:-1]
            if "\ufffd" in text or text.strip() in ("", "*", "<any>", "<rare>"):
                try:
                    shown += f" (token {tokenizer.convert_ids_to_tokens(t)!r})"
                except Exception:
                    pass
            parts.append(shown)
    return " | ".join(parts)


def _significant(rows: Sequence[Deviation], n: int, cells: int) -> tuple[Deviation, ...]:
    """The rows whose count departs from its expectation beyond chance: a two-sided binomial
    p-value below 0.01 / ``cells`` (Bonferroni over the table at 1%)."""
    from scipy import stats as sps  # type: ignore[import-untyped]

    out = []
    for d in rows:
        p = min(1.0, d.expected / n) if n else 0.0
        pv = 0.0 if p <= 0 else float(sps.binomtest(d.observed, n, p).pvalue)
        if pv < 0.01 / max(1, cells):
            out.append(d)
    return tuple(out)


def _tv_stats(law: Mapping[tuple[int, ...], float], observed: Mapping[Any, int], n: int,
              seed: int) -> tuple[float, tuple[float, float], float, float]:
    """The plug-in TV, its 95% basic bootstrap interval, a lossless sampler's 95th percentile of the
    plug-in TV, and the bias-corrected estimate ``2 * plug-in - median(bootstrap)`` (clipped to
    [0, 1]), which lies inside the interval by construction (the plug-in may not: it is biased up)."""
    keys = list(dict.fromkeys(list(law) + list(observed)))
    p = np.array([law.get(k, 0.0) for k in keys])
    p = p / p.sum()
    c = np.array([observed.get(k, 0) for k in keys], dtype=np.float64)
    phat = c / max(1, c.sum())
    est = 0.5 * float(np.abs(phat - p).sum())
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2**31,)))
    boot = rng.multinomial(n, phat, size=200) / n
    tvb = 0.5 * np.abs(boot - p).sum(axis=1)
    null = 0.5 * np.abs(rng.multinomial(n, p, size=200) / n - p).sum(axis=1)
    # basic (reflected) bootstrap interval: the plug-in TV is biased upward, and so is its bootstrap
    lo = min(1.0, max(0.0, 2 * est - float(np.quantile(tvb, 0.975))))
    hi = min(1.0, max(0.0, 2 * est - float(np.quantile(tvb, 0.025))))
    corrected = min(hi, max(lo, 2 * est - float(np.median(tvb))))
    return est, (lo, hi), float(np.quantile(null, 0.95)), corrected


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
    sample_fn: Callable[[str, int], Sequence[int]] | None,
    target: Any,
    target_tokenizer: Any,
    prompt: str | None = None,
    n: int = 20000,
    positions: int = 2,
    do_sample: bool = True,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    alpha: float = 1e-3,
    seed: int = 0,
    executor: Executor | None = None,
    *,
    mask_textless: bool = False,
    prompt_ids: Sequence[int] | None = None,
    max_prefixes: int = 512,
    max_conditional: int = 8,
    chunk_size: int = 1000,
    power: float = 0.99,
    name: str | None = None,
    sample_batch_fn: Callable[[list[str], list[int]], Sequence[Any]] | None = None,
    batch_size: int = 64,
    max_detectable_tv: float | None = 0.1,
    text: bool = False,
    reference: LawProvider | ProvidedLaw | None = None,
    progress: Callable[[str], None] | None = None,
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
    if prompt is None:
        if prompt_ids is None:
            raise TypeError("give a prompt (a str), or prompt_ids (the target's context)")
        prompt = target_tokenizer.decode(_as_ids(prompt_ids, "prompt_ids has", _width(target)))
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
    positions = as_int("positions", positions, 1)
    n = as_int("n", n, 1)
    checked = check_processing(temperature, top_k, top_p)  # the same checks as generate's
    refuse_meta(check_model(target, "target"), "target")
    width = _width(target)
    eos = _eos_ids(target, target_tokenizer)
    if mask_textless:  # the columns of hsd_torch.generate(mask_textless=True)'s law: ids with text, EOS, end ids
        space = TextSpace.law(TokenText.get(target_tokenizer, width), torch.device("cpu"), keep_all=False, ends=eos)
        mask = ~space.drop_mask()
    else:
        mask = torch.ones(width, dtype=torch.bool)
    process = dict(checked)
    processing = (f"temperature {temperature}, top_k {top_k}, top_p {top_p}"
                  + (", ids without text removed (mask_textless)" if mask_textless else ""))
    if not do_sample:
        process = {"temperature": 1.0, "top_k": None, "top_p": None}
        processing = "argmax" + (" over ids with text (mask_textless)" if mask_textless else "")
    if prompt_ids is not None:
        ids = _as_ids(prompt_ids, "prompt_ids has", width)
        if not ids:
            raise ValueError("prompt_ids is empty: the target needs at least one id to condition on")
    else:  # as generate feeds it (one BOS, even when the text starts with the BOS's own text)
        ids = target_context(TokenText.get(target_tokenizer, width), prompt)
    law_of: Any = target if reference is None else \
        reference if isinstance(reference, ProvidedLaw) else ProvidedLaw(reference, width)
    ref = reference_law(law_of, ids, int(n), positions, eos, mask, process, do_sample, max_prefixes, max_conditional)
    label = name or str(getattr(fn, "__qualname__", "") or type(fn).__name__)
    draw: Any
    law: dict[tuple[int, ...], float] = ref.law
    texts: _TextCells | None = None
    if text:
        texts = _TextCells(ref, target_tokenizer, prompt)
        law = texts.law
    cells_of = texts if texts is not None else _IdCells(ref, width, ids)
    hidden = ref.coarse_mass
    # what the draws can detect depends on the law and n only (the report's detectable_tv): known before drawing
    planned = audit_plan(law, int(n), alpha, power, prefixes=0 if text else len(ref.frequent))
    if progress is not None:
        progress(plan_line(planned, hidden, positions))
    detectable, doubts, promise = _coarse_doubts(planned, hidden, int(n), max_detectable_tv)
    if sample_batch_fn is not None:
        draw = _batched_cells(sample_batch_fn, prompt, cells_of, int(n), seed, chunk_size,
                              as_int("batch_size", batch_size, 1))
    else:
        assert sample_fn is not None
        draw = _Draw(sample_fn, prompt, cells_of)
    core = audit_sampler(draw, law, n=int(n), alpha=alpha, power=power,
                         positions=True, seed=seed, executor=executor, chunk_size=chunk_size,
                         prefixes=[] if text else list(ref.frequent), name=label,
                         rng_note=f"audit_generate seed {seed}, chunks of {chunk_size}",
                         doubts=doubts, promise=promise)
    verdict, reason = core.verdict, core.reason  # hsd_core.stats.decide's, with this audit's doubts
    if verdict == "lossy" and do_sample and not text and ref.forward_passes <= _MAX_FIT_PASSES:
        fit = _best_fit(law_of, ids, ref, mask, process, core.observed)
        if fit is not None:
            reason += f"; of a few processings, the draws fit best {fit}"
    with_prompt = getattr(draw, "with_prompt", 0)  # counted in this process (not on an executor's workers)
    if verdict == "lossy" and with_prompt > core.n / 2:
        what = "text" if text else "ids"
        reason += (f"; {with_prompt} of {core.n} draws start with the prompt's own {what}: does the sampler return "
                   f"prompt + new {what}? return only the new ones")
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
        return tuple(DecodedDeviation(tuple(d.output), _decode(target_tokenizer, tuple(d.output)),  # type: ignore[arg-type]
                                      d.observed, d.expected) for d in rows)

    return GenerateAuditReport(
        verdict=verdict, reason=reason, n=core.n, alpha=alpha, seed=seed, positions=positions, do_sample=do_sample,
        processing=processing, detectable_tv=detectable, tv_estimate=est, tv_ci=ci, tv_null_q95=null,
        cells=len(law), coarse_mass=hidden, forward_passes=ref.forward_passes,
        conditional_prefixes=() if text else ref.frequent, over=dec(_significant(core.over, core.n, len(law))),
        under=dec(_significant(core.under, core.n, len(law))), core=core,
        prompt=prompt, name=label, tv_corrected=corrected, position_detectable=tuple(pos_det))

