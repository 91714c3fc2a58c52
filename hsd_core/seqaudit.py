"""Sequence-level audits: every generated token is tested against its own conditional law.

:func:`audit_sequences` draws ``n`` whole sequences (up to ``max_new_tokens`` new target ids,
ending at the target's EOS) from a black-box sampler, runs each back through the target by
teacher forcing, and tests every token ``x_t`` against the target's conditional law ``p_t =
p(. | prompt, x_<t)``. The statistics live in :class:`SequenceEvidence`, which the PyTorch backend
(:func:`hsd_torch.auditing.sequences.audit_sequences`) feeds with its own teacher-forced laws, so both audits
share one implementation of the tests and of the power statement.

**Why every token is evidence.** Order the target ids by decreasing ``p_t`` (ties by lower id) and
let ``F_t`` be the cumulative law in that order. The randomized probability integral transform
(PIT) ``U_t = F_t(x_t-) + V_t p_t(x_t)``, with ``V_t`` uniform on [0, 1] from a seeded stream
independent of the sampler, is uniform on [0, 1] given the whole history when ``x_t ~ p_t``
(Rosenblatt). So under losslessness the PITs of a sequence are i.i.d. uniform up to its stopping
time (EOS or the budget), whatever the prompt, position or history; a sampler that is exact for
the first tokens and wrong after a rejection or a cache rollback moves the PITs of the later
tokens.

**The family** (Holm at ``alpha`` over the ``m`` planned tests; a test that cannot run is listed
as skipped and counts as not rejected):

* ``PIT KS (pooled)``: Kolmogorov-Smirnov of all PITs against U(0, 1);
* ``PIT chi-square (pooled)``: the PITs in ``bins`` equal bins, Pearson chi-square, ``bins - 1``
  degrees of freedom;
* ``log-likelihood martingale``: ``S = sum_t (log p_t(x_t) + H(p_t))`` has conditional mean 0 and
  conditional variance ``Var_{p_t}(log p_t)`` at every step; ``S / sqrt(sum of those)`` is
  referred to N(0, 1), two-sided (catches a temperature that is off, in either direction);
* ``PIT KS (position j)`` for the first ``positions`` positions: the PITs of the sequences that
  reach position j (exactly i.i.d. uniform given that they reach it), exact KS;
* ``first token after prompt g (chi-square)``, for the (at most 4) prompts with the most sequences
  (at least 20): every sequence after one prompt draws its first token from the same law, so its
  first tokens are tested cell by cell (chi-square, cells of expected count < 5 pooled), which sees
  a wrong first context (a prompt fed wrong) that the PIT tests barely see;
* with a drafter, ``directional (toward the drafter)``: with ``q_t`` the drafter's law mapped to
  target ids and ``w_t = q_t / (p_t + q_t)`` (bounded in [0, 1]), ``D = sum_t (w_t(x_t) -
  E_{p_t} w_t)`` over ``sqrt(sum_t Var_{p_t} w_t)``, one-sided: the usual failure of a lossy
  speculative decoder is an output pulled toward its drafter, which raises ``D``;
* for each named context bug (``context_bugs``, :mod:`hsd_core.context_bugs`; by default the
  prompt's last id fed twice), ``directional (toward <the bug>)``: the same statistic with ``q_t``
  replaced by the target's law under the bug's context (one more teacher-forced pass), which sees a
  bug that moves each law in its own direction, where the pooled tests average it out.

The pooled tests and the martingale tests sum over a random number of tokens (sequences stop at
EOS); their normal / chi-square / KS reference laws are asymptotic (martingale central limit
theorem). ``tests/stats/test_audit_sequences.py`` checks by simulation that the false-fail rate
stays within ``alpha``. Besides the family, two exact checks make the verdict "lossy" at once: a
token the target gives probability 0 at its position, and an id outside the target's vocabulary.

**Length mismatches** (a sequence longer than the budget, shorter without ending at an end id, or
going on after an end id) say nothing about the law by themselves: a lossless sampler that returns
a few tokens more than asked, or pads after its EOS, writes them. By default
(``length_mismatch="error"``) the first one is a ``ValueError`` naming it, before any statistics
(with the hint "it starts with the prompt's ids" when it does); ``length_mismatch="prefix"`` audits
each sequence up to its first end id and the budget, and the report says how many were cut.

**The promise.** For the laws actually met (the teacher-forced ``p_t``, and ``q_t`` with a
drafter), the report states, per named family of departures, the smallest one caught with
probability >= ``power`` by at least one test of the family run at ``alpha / m`` (so Holm catches
it too): the mixture toward the drafter ``(1 - lambda) p_t + lambda q_t``; a temperature off by a
factor ``f`` (``p_t^(1/f)`` and ``p_t^f``, renormalized on ``p_t``'s support); one token fewer
(the least likely token of each ``p_t``'s support removed, as a top-k or top-p off by one); and,
where the caller gives the raw law's next token (the PyTorch audit with top-k / top-p), one token
more. Each is also given as the mean per-token TV it amounts to. Each named context bug is a fixed
departure: the report gives the probability that its aimed test catches it (exactly at every met
position, no subsample). The power of the pooled
chi-square is the non-central chi-square's, of the martingale tests the normal approximation's, of
a draw of probability 0 exact, all evaluated at the met positions (so it is an approximation: the
departing sampler would meet other prefixes); the KS and per-position tests are not counted, so
the promise is conservative in that respect. ``tests/stats/test_audit_sequences.py`` checks by
simulation that a mixture at the stated lambda is caught with the stated power. To keep the cost
bounded on large vocabularies the power is computed on a seeded subsample of at most
``power_steps`` positions (an unbiased estimate of the per-token averages).

**Where the code is.** The evidence, token by token: :mod:`hsd_core.stats.evidence`; the
departures and the power statement: :mod:`hsd_core.stats.alternatives`,
:mod:`hsd_core.stats.seqpower`; the family and the verdict: :mod:`hsd_core.stats.seqtests`, which
combines the tests and decides as every audit does (:mod:`hsd_core.stats.family`); the report:
:mod:`hsd_core.stats.seqreport`. This module runs the audit over ``hsd_core`` models and re-exports
those names.

**Verdicts.** "lossy" on an exact-check failure or a Holm rejection; otherwise "inconclusive" when
no test could run or the headline promise (the mixture toward the drafter's mean per-token TV when
a drafter is given, else the temperature family's) is missing or above ``max_detectable_tv`` (the
reason says how many sequences would reach it); otherwise "lossless-consistent". Greedy audits
(``do_sample=False``) compare every token with the argmax exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .context_bugs import DEFAULT_CONTEXT_BUGS, ContextBug
from .context_bugs import context_bugs as _context_bugs
from .stats.alternatives import LAMBDAS as LAMBDAS
from .stats.alternatives import TEMPERATURE_FACTORS as TEMPERATURE_FACTORS
from .stats.evidence import DEFAULT_POSITIONS, F64, SequenceEvidence
from .stats.evidence import DEFAULT_POWER_STEPS as DEFAULT_POWER_STEPS
from .stats.family import Verdict as Verdict
from .stats.seqreport import DEFAULT_BINS, FamilyPower, SequenceAuditReport

__all__ = ["DEFAULT_BINS", "DEFAULT_POSITIONS", "LENGTH_MISMATCH", "FamilyPower", "LengthCheck", "SequenceAuditReport",
           "SequenceEvidence", "as_ids", "audit_sequences", "check_sequence", "pit_uniforms", "sequence_seeds",
           "truncate_at_end"]


def sequence_seeds(seed: int, n: int) -> list[int]:
    """The 32-bit sampler seed of each of the ``n`` sequences of an audit run with ``seed``
    (``SeedSequence([seed, i, 0])``): a function of ``(seed, i)`` only."""
    return [int(np.random.SeedSequence([seed, i, 0]).generate_state(1)[0]) for i in range(n)]


def pit_uniforms(seed: int, i: int, length: int) -> F64:
    """The uniforms ``V_t`` of sequence ``i``'s randomized PITs (``length`` of them), from
    ``SeedSequence([seed, i, 1])``: independent of the sampler's seed stream."""
    return np.random.default_rng(np.random.SeedSequence([seed, i, 1])).random(length)

def check_sequence(ids: Sequence[int], max_new_tokens: int, end_ids: frozenset[int]) -> str | None:
    """What is malformed in a sequence of new target ids (None if nothing): longer than the
    budget, an end id before the last token, or shorter than the budget without an end id."""
    if len(ids) > max_new_tokens:
        return f"{len(ids)} tokens, more than max_new_tokens {max_new_tokens}"
    for j, t in enumerate(ids[:-1]):
        if t in end_ids:
            return f"end id {t} at position {j}, then {len(ids) - j - 1} more tokens"
    if len(ids) < max_new_tokens and (not ids or ids[-1] not in end_ids):
        return f"{len(ids)} tokens without an end id (the budget is {max_new_tokens})"
    return None


def truncate_at_end(ids: Sequence[int], max_new_tokens: int, end_ids: frozenset[int]) -> list[int]:
    """``ids`` cut after its first end id and to ``max_new_tokens``: the part a target's own
    decoding could have produced, which a malformed sequence is still audited on."""
    out: list[int] = []
    for t in ids[:max_new_tokens]:
        out.append(int(t))
        if t in end_ids:
            break
    return out


LENGTH_MISMATCH = ("error", "prefix", "lossy")
"""What a sequence audit does with a length mismatch (module docstring): raise (the default),
audit each sequence's prefix up to its first end id and the budget, or count it as a malformed
sequence, which makes the verdict "lossy" (the engine audits' rule: a recorded engine's draws are
what it claims to have sampled, and no option can fix them after the fact)."""


class LengthCheck:
    """One audit's rule for sequences whose length does not fit (module docstring, "Length
    mismatches"): :meth:`take` returns the ids to audit, raises ``ValueError`` on a mismatch under
    ``"error"``, and cuts it (recorded in the evidence) under ``"prefix"``."""

    def __init__(self, length_mismatch: str, max_new_tokens: int, end_ids: frozenset[int]) -> None:
        if length_mismatch not in LENGTH_MISMATCH:
            raise ValueError(f"length_mismatch must be 'error', 'prefix' or 'lossy', got {length_mismatch!r}")
        self.policy, self.max_new_tokens, self.end_ids = length_mismatch, int(max_new_tokens), end_ids

    def take(self, ev: SequenceEvidence, i: int, ids: list[int], prompt_ids: Sequence[int], what: str) -> list[int]:
        """``ids`` (sequence ``i``'s new target ids; ``what`` names the draw: "sample_fn('x', 7)"),
        as audited; counts in ``ev`` the sequences that start with ``prompt_ids``."""
        head = list(prompt_ids)
        starts = bool(head) and len(ids) > len(head) and ids[:len(head)] == head
        ev.with_prompt += starts
        wrong = check_sequence(ids, self.max_new_tokens, self.end_ids)
        if wrong is None:
            return ids
        hint = "; it starts with the prompt's ids: return only the new ids" if starts else ""
        if self.policy == "error":
            raise ValueError(
                f"{what} (sequence {i}) returned {wrong}: a length mismatch, so no statistics were run{hint}. Return "
                f"the new ids only, up to the first end id and at most max_new_tokens={self.max_new_tokens}, or pass "
                "length_mismatch='prefix' to audit each sequence up to its first end id and max_new_tokens (the "
                "report then says how many were cut)")
        (ev.prefix_cut if self.policy == "prefix" else ev.malformed).append(f"sequence {i}: {wrong}{hint}")
        return truncate_at_end(ids, self.max_new_tokens, self.end_ids)

def audit_sequences(
    sample_fn: Callable[[str, int], Sequence[int]],
    target: Any,
    prompts: str | Sequence[str],
    n: int = 200,
    max_new_tokens: int = 32,
    do_sample: bool = True,
    alpha: float = 1e-3,
    seed: int = 0,
    drafter: Any = None,
    *,
    power: float = 0.99,
    bins: int = DEFAULT_BINS,
    positions: int = DEFAULT_POSITIONS,
    max_detectable_tv: float | None = 0.1,
    power_steps: int = DEFAULT_POWER_STEPS,
    name: str | None = None,
    context_bugs: Sequence[str] | None = DEFAULT_CONTEXT_BUGS,
    length_mismatch: str = "error",
) -> SequenceAuditReport:
    """Audit ``sample_fn(prompt, seed) -> list[int]`` (new target ids) over ``hsd_core`` models:
    ``n`` sequences (the prompts taken in turn), every token tested against ``target``'s exact
    conditional law ``next_probs`` (module docstring). With ``drafter`` (an ``hsd_core`` model whose
    alphabet contains the target's), the directional test uses the drafter's law pushed onto the
    shared strings (TLI's intersection, renormalized) with TLI's drafter context. Sequence ``i``'s
    seed is :func:`sequence_seeds` ``(seed, n)[i]``. ``do_sample=False``: every token must be the
    argmax (ties to the lowest id). ``context_bugs``: names of :data:`hsd_core.context_bugs.CONTEXT_BUGS`
    to aim a test at (None or empty: none; sampling only). ``length_mismatch``: ``"error"`` (a
    sequence longer than ``max_new_tokens``, going on after an end id or stopping short without one
    raises ``ValueError`` naming it) or ``"prefix"`` (each sequence audited up to its first end id
    and ``max_new_tokens``; the report says how many were cut) or ``"lossy"`` (a malformed sequence:
    the verdict is "lossy"; its prefix is audited too). Returns a :class:`SequenceAuditReport`."""
    from .methods.base import check_run_args
    from .methods.tli import intersection
    from .models import checked

    if not callable(sample_fn):
        raise TypeError(f"sample_fn must be a callable (prompt, seed) -> list of ids, got {type(sample_fn).__name__}")
    plist = [prompts] if isinstance(prompts, str) else list(prompts)
    if not plist:
        raise ValueError("prompts is empty")
    target = checked(target, "target")
    for pr in plist:
        check_run_args(target, pr, max_new_tokens)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be True or False, got {do_sample!r}")
    inter = None
    if drafter is not None:
        drafter = checked(drafter, "drafter")
        if not set(target.vocab.alphabet) <= set(drafter.vocab.alphabet):
            raise ValueError("the drafter's alphabet must contain the target's (its context is the target's text)")
        inter = intersection(target.vocab, drafter.vocab)
    size = len(target.vocab)
    eos = target.vocab.eos_id
    lengths = LengthCheck(length_mismatch, int(max_new_tokens), frozenset([eos]))
    bugs = _context_bugs(context_bugs) if do_sample else ()
    ev = SequenceEvidence(alpha=alpha, power=power, bins=bins, positions=positions, seed=seed,
                          drafter=drafter is not None, do_sample=do_sample, power_steps=power_steps,
                          expected_steps=int(n) * int(max_new_tokens), aimed=[b.what for b in bugs])
    for i, sd in enumerate(sequence_seeds(int(seed), int(n))):
        prompt = plist[i % len(plist)]
        out = sample_fn(prompt, sd)
        ids = as_ids(out, f"sample_fn({prompt!r}, {sd}) (sequence {i}) returned")
        bad = [t for t in ids if not 0 <= t < size]
        if bad:
            ev.add_malformed(f"sequence {i}: id {bad[0]} outside the target's {size} ids")
            continue
        base = tuple(target.tokenizer.encode(prompt))
        ids = lengths.take(ev, i, ids, base, f"sample_fn({prompt!r}, {sd})")
        if not ids:
            continue
        rows, qrows, aimed = _teacher_forced(target, drafter, inter, bugs, prompt, base, ids, int(max_new_tokens),
                                             do_sample)
        ev.add_steps(np.array(rows), np.array(ids), np.arange(len(ids)), pit_uniforms(int(seed), i, len(ids)),
                     np.full(len(ids), i), q=np.array(qrows) if inter is not None else None, prompt=i % len(plist),
                     aimed=[np.array(r) for r in aimed])
    label = name or str(getattr(sample_fn, "__qualname__", "") or type(sample_fn).__name__)
    return ev.report(n=int(n), max_new_tokens=int(max_new_tokens), max_detectable_tv=max_detectable_tv, name=label)


def _teacher_forced(target: Any, drafter: Any, inter: Any, bugs: Sequence[ContextBug], prompt: str,
                    base: tuple[int, ...], ids: list[int], max_new_tokens: int, do_sample: bool
                    ) -> tuple[list[F64], list[F64], list[list[F64]]]:
    """The laws met along one sequence ``ids`` after ``prompt`` (its ids ``base``): the target's (the
    argmax as a point mass when greedy), the drafter's pushed onto the shared strings (with ``inter``;
    the target's where no drafter id is shared) and the target's under each bug's context."""
    from .laws import argmax
    from .methods.base import State
    from .methods.tli import drafter_context

    size = len(target.vocab)
    rows = []
    qrows = []
    bases = [tuple(b.context(base)) for b in bugs]
    aimed: list[list[F64]] = [[] for _ in bugs]
    for j in range(len(ids)):
        law = target.next_probs(base + tuple(ids[:j]))
        if do_sample:
            rows.append(np.array([float(v) for v in law]))
        else:
            row = np.zeros(len(law))
            row[argmax(law)] = 1.0
            rows.append(row)
        if inter is not None:
            dctx = drafter_context(target, drafter, State(prompt, tuple(ids[:j]), max_new_tokens), inter)
            capped = inter.restrict(drafter.next_probs(dctx))
            qrows.append(np.array([float(v) for v in inter.push(capped, size)]) if capped is not None
                         else rows[-1].copy())
        for k, b in enumerate(bases):  # an empty context: no law to aim at, no evidence (r = p)
            aimed[k].append(np.array([float(v) for v in target.next_probs(b + tuple(ids[:j]))]) if b
                            else rows[-1].copy())
    return rows, qrows, aimed


def as_ids(out: Any, what: str) -> list[int]:
    """``out`` (a list, tuple or numpy array) as a list of Python ints; ``TypeError`` for anything that
    is not a sequence of int ids (None, a str, a float id, which ``int()`` would truncate in silence).
    ``what`` starts the message ("sample_fn('x', 7) returned")."""
    if out is None or isinstance(out, (str, bytes)):
        got = "None" if out is None else f"a {type(out).__name__} {repr(out)[:40]}"
        raise TypeError(f"{what} {got}, not a list of int target ids")
    if isinstance(out, np.ndarray):
        out = out.ravel().tolist()
    try:
        items = list(out)
    except TypeError:
        raise TypeError(f"{what} a {type(out).__name__}, not a list of int target ids") from None
    for t in items:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"{what} {t!r} ({type(t).__name__}) among its ids, not an integer id")
    return [int(t) for t in items]
