"""How the verdicts of audits made of several audits combine into one: the same rule everywhere.

Two shapes occur, each one function here, each reaching its verdict by
:func:`~hsd_core.stats.decide` (exact failures, then doubts, then the promise):

* :func:`combine_parts`: audits of one sample that share one false-fail budget, each run at its
  Bonferroni share of ``alpha`` (the audit of a samples file: its sequence audit and its
  first-token audits). By the union bound the family-wise false-fail rate is at most ``alpha``, so
  any part's "lossy" makes the whole "lossy"; otherwise the first part (the headline audit, whose
  promise the report states) gives the verdict.
* :func:`combine_with_control`: an engine's audit with speculation against a reference law, its
  null control (the same engine without speculation against the same reference) and the
  two-sample test between the two (which needs no reference). A failing null control means the
  reference does not match the engine's numerics: the audit against it then says nothing about
  speculation, and the two-sample test decides alone. Without a null control the audit against the
  reference is the verdict, and the reason says what it cannot tell apart.

The false-fail budget: with a null control, each of the two audits against the reference and the
two-sample test run at ``alpha / 2``; a "lossy" needs the two-sample test to reject, or the audited
file to be rejected while the null control is not, so the verdict's false-fail rate is at most
``alpha``.
"""

from __future__ import annotations

from collections.abc import Sequence

from .family import Verdict, decide

__all__ = ["combine_parts", "combine_with_control"]

Judged = tuple[str, Verdict, str]
"""One part of an audit: its name, its verdict and the reason."""


def combine_parts(parts: Sequence[Judged]) -> tuple[Verdict, str]:
    """The verdict of an audit made of ``parts`` (each ``(name, verdict, reason)``, at its
    Bonferroni share of one ``alpha``; the first is the headline audit): "lossy" when any part is,
    the reason naming each lossy part ("<name>: <reason>", joined by "; "); else the first part's
    verdict and reason. ``ValueError`` for no parts.

    >>> combine_parts([("sequence audit", "inconclusive", "too few"), ("first tokens", "lossy", "Holm rejects t")])
    ('lossy', 'first tokens: Holm rejects t')
    >>> combine_parts([("sequence audit", "lossless-consistent", "fine"), ("first tokens", "inconclusive", "weak")])
    ('lossless-consistent', 'fine')
    """
    if not parts:
        raise ValueError("no part to combine")
    _, head, why = parts[0]
    return decide(None, failures=[f"{name}: {reason}" for name, v, reason in parts if v == "lossy"],
                  doubts=[lambda: why if head == "inconclusive" else None], promise=lambda: why)


def combine_with_control(audited: Verdict, control: Verdict | None, two_sample: tuple[Verdict, str] | None, *,
                         speculative: bool = True) -> tuple[Verdict, str]:
    """The verdict of an engine audit (module docstring) from ``audited`` (the audited file against
    the reference), ``control`` (the null control's, None without a baseline) and ``two_sample``
    (the two-sample test's verdict and reason; given exactly when ``control`` is):

    * ``two_sample`` "lossy": "lossy", speculation changes the engine's law;
    * else ``control`` "lossy": the two-sample verdict, the reason blaming the reference (it does
      not match the engine's numerics), not speculation;
    * else ``audited`` "lossy": "lossy" (rejected against the reference while the null control passes);
    * else "lossless-consistent" when ``audited`` or the two-sample test is, else "inconclusive".

    Without a null control the verdict is ``audited``'s; ``speculative=False`` says the audited file
    has no speculation (it is then the null control of the reference itself).

    >>> combine_with_control("lossy", "lossy", ("lossless-consistent", "no test rejects"))[0]
    'lossless-consistent'
    >>> combine_with_control("lossy", "inconclusive", ("inconclusive", "weak"))[0]
    'lossy'
    """
    if (control is None) != (two_sample is None):
        raise ValueError("give the null control's verdict and the two-sample test's together, or neither")
    if control is None or two_sample is None:
        if not speculative:
            why = (f"{audited} against the reference; this file has no speculation, so it is the null control of the "
                   "reference itself" + (": the reference does not match the engine's numerics (or the engine's "
                                         "sampler is wrong)" if audited == "lossy" else ""))
        else:
            why = (f"{audited} against the reference; no null control (give the same engine's samples without "
                   "speculation as the baseline): a 'lossy' here may come from the engine's numerics, not from "
                   "speculation")
        return decide(None, failures=[why] if audited == "lossy" else [],
                      doubts=[lambda: why if audited == "inconclusive" else None], promise=lambda: why)
    ts, ts_why = two_sample
    failures = []
    if ts == "lossy":
        failures.append(f"speculation changes the engine's law: {ts_why}")
    elif audited == "lossy" and control != "lossy":
        failures.append("rejected against the reference while the null control (the same engine without "
                        f"speculation) passes ({control}); two-sample: {ts}")
    if control == "lossy":
        why = ("the null control fails: the engine without speculation is rejected against the reference, so the "
               "reference does not match the engine's numerics and the audit against it says nothing about "
               f"speculation; the two-sample test, which needs no reference, says {ts}: {ts_why}")
        conclusive = ts == "lossless-consistent"
    else:
        why = f"against the reference {audited} (null control {control}); two-sample {ts}: {ts_why}"
        conclusive = "lossless-consistent" in (audited, ts)
    return decide(None, failures=failures, doubts=[lambda: None if conclusive else why], promise=lambda: why)
