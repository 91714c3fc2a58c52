"""One verdict rule for every audit: each audit's verdict is :func:`hsd_core.stats.decide`'s.

Each audit is run with ``decide`` replaced by a recording fake that returns a verdict no real run
would give here ("inconclusive" with a sentinel reason, for samplers that are lossless and well
powered): the audit must call it exactly once and return its answer. The rules that combine the
verdicts of audits made of audits (:mod:`hsd_core.stats.combine`) are checked on their whole truth
tables.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pytest

import hsd_core.audit as core_audit
import hsd_core.stats.combine as combine
import hsd_core.stats.seqtests as seqtests
import hsd_core.twosample as twosample
from hsd_core.audit import audit_sampler
from hsd_core.methods import AR
from hsd_core.seqaudit import audit_sequences
from hsd_core.stats import TestFamily, Verdict, combine_parts, combine_with_control, decide
from hsd_core.worlds import builtin_world

SENTINEL: tuple[Verdict, str] = ("inconclusive", "the recorded verdict")
VERDICTS: tuple[Verdict, ...] = ("lossless-consistent", "lossy", "inconclusive")


class Recorder:
    """A stand-in for :func:`decide` that records each call (family, failures, doubts, promise) and
    returns ``answer``."""

    def __init__(self, answer: tuple[Verdict, str] = SENTINEL) -> None:
        self.answer = answer
        self.calls: list[tuple[TestFamily | None, list[str], list[Callable[[], str | None]], Callable[[], str]]] = []

    def __call__(self, family: TestFamily | None, *, failures: Sequence[str] = (),
                 doubts: Iterable[Callable[[], str | None]] = (), promise: Callable[[], str]) -> tuple[Verdict, str]:
        self.calls.append((family, list(failures), list(doubts), promise))
        return self.answer


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """``decide`` replaced by a :class:`Recorder` wherever an audit looks it up."""
    rec = Recorder()
    for mod in (core_audit, seqtests, twosample, combine):
        monkeypatch.setattr(mod, "decide", rec)
    return rec


LAW = {(0,): 0.5, (1,): 0.3, (2,): 0.2}


def _law_sampler(rng: np.random.Generator) -> list[int]:
    return [int(rng.choice(3, p=[0.5, 0.3, 0.2]))]


def test_the_sampler_audit_returns_decides_answer(recorder: Recorder) -> None:
    rep = audit_sampler(_law_sampler, LAW, n=3000, seed=0)
    assert (rep.verdict, rep.reason) == SENTINEL and len(recorder.calls) == 1
    family, failures, doubts, _ = recorder.calls[0]
    assert family is not None and family.results == rep.tests and failures == [] and len(doubts) == 3


def test_the_sampler_audit_asks_the_callers_doubts_after_its_own() -> None:
    """A caller's doubt makes a well-powered lossless audit inconclusive, its promise replaces the
    reason; a rejection needs no power, so a lossy sampler stays lossy whatever the caller doubts."""
    ok = audit_sampler(_law_sampler, LAW, n=3000, seed=0)
    assert ok.verdict == "lossless-consistent", ok.reason
    doubted = audit_sampler(_law_sampler, LAW, n=3000, seed=0, doubts=[lambda: None, lambda: "the caller doubts"])
    assert (doubted.verdict, doubted.reason) == ("inconclusive", "the caller doubts")
    promised = audit_sampler(_law_sampler, LAW, n=3000, seed=0, doubts=[lambda: None], promise=lambda: "as promised")
    assert (promised.verdict, promised.reason) == ("lossless-consistent", "as promised")
    weak = audit_sampler(_law_sampler, LAW, n=3, seed=0, doubts=[lambda: "never asked"])
    assert weak.verdict == "inconclusive" and "never asked" not in weak.reason, weak.reason  # its own doubt first

    def skewed(rng: np.random.Generator) -> list[int]:
        return [int(rng.choice(3, p=[0.8, 0.1, 0.1]))]
    bad = audit_sampler(skewed, LAW, n=3000, seed=0, doubts=[lambda: "the caller doubts"])
    assert bad.verdict == "lossy" and bad.reason.startswith("Holm rejects"), bad.reason


def test_the_sequence_audit_returns_decides_answer(recorder: Recorder) -> None:
    w = builtin_world()
    for do_sample in (True, False):
        recorder.calls.clear()
        rep = audit_sequences(lambda p, s: AR(greedy=not do_sample).generate(w.target, None, p, 6, rng=s), w.target,
                              w.prompt, n=30, max_new_tokens=6, do_sample=do_sample)
        assert (rep.verdict, rep.reason) == SENTINEL and len(recorder.calls) == 1, do_sample


def test_the_two_sample_audit_returns_decides_answer(recorder: Recorder) -> None:
    rng = np.random.default_rng(0)
    a = [[int(x)] for x in rng.integers(0, 3, 400)]
    b = [[int(x)] for x in rng.integers(0, 3, 400)]
    for kw in ({}, {"do_sample": False}, {"max_detectable_tv": 0.01}):
        recorder.calls.clear()
        rep = twosample.two_sample_sequences(a, [0] * 400, b, [0] * 400, **kw)
        assert (rep.verdict, rep.reason) == SENTINEL and len(recorder.calls) == 1, kw
    recorder.calls.clear()
    apart = twosample.two_sample_sequences(a, [0] * 400, b, [1] * 400)  # no prompt in both samples
    assert (apart.verdict, apart.reason) == SENTINEL and len(recorder.calls) == 1


def test_the_two_sample_audit_holds_a_weak_first_token_test_inconclusive() -> None:
    rng = np.random.default_rng(0)
    a = [[int(x)] for x in rng.integers(0, 3, 400)]
    b = [[int(x)] for x in rng.integers(0, 3, 400)]
    free = twosample.two_sample_sequences(a, [0] * 400, b, [0] * 400)
    assert free.verdict == "lossless-consistent", free.reason
    first = next(q.detectable for q in free.powers if q.test == "first-token homogeneity")
    assert first is not None
    held = twosample.two_sample_sequences(a, [0] * 400, b, [0] * 400, max_detectable_tv=first / 2)
    assert held.verdict == "inconclusive" and held.max_detectable_tv == first / 2
    assert f"detects only TV {first:.3g}, above max_detectable_tv {first / 2:.3g}" in held.reason, held.reason
    assert twosample.two_sample_sequences(a, [0] * 400, b, [0] * 400, max_detectable_tv=first).verdict == \
        "lossless-consistent"


# --- combining audits' verdicts -------------------------------------------------------------------

def test_combining_parts_truth_table() -> None:
    for head, other in itertools.product(VERDICTS, VERDICTS):
        v, why = combine_parts([("sequence audit", head, "h"), ("first tokens", other, "o")])
        if "lossy" in (head, other):
            assert v == "lossy"
            assert why == "; ".join(f"{n}: {r}" for n, x, r in [("sequence audit", head, "h"),
                                                                  ("first tokens", other, "o")] if x == "lossy")
        else:
            assert (v, why) == (head, "h"), (head, other)
    assert combine_parts([("alone", "inconclusive", "weak")]) == ("inconclusive", "weak")
    with pytest.raises(ValueError, match="no part"):
        combine_parts([])


def test_combining_with_the_null_control_truth_table() -> None:
    """Every combination of the audited file's, the null control's and the two-sample test's verdicts."""
    for audited, control, ts in itertools.product(VERDICTS, VERDICTS, VERDICTS):
        v, why = combine_with_control(audited, control, (ts, "ts says so"))
        case = (audited, control, ts)
        if ts == "lossy":  # the two-sample test needs no reference: speculation changes the law
            assert v == "lossy" and why.startswith("speculation changes the engine's law: ts says so"), case
        elif control == "lossy":  # the reference is to blame, not speculation: the two-sample test decides
            assert v == ts, case
            assert "the reference does not match the engine's numerics" in why, case
            assert "says nothing about speculation" in why and f"says {ts}: ts says so" in why, case
        elif audited == "lossy":
            assert v == "lossy" and why.startswith("rejected against the reference while the null control"), case
            assert f"passes ({control})" in why, case
        else:
            assert v == ("lossless-consistent" if "lossless-consistent" in (audited, ts) else "inconclusive"), case
            assert why == f"against the reference {audited} (null control {control}); two-sample {ts}: ts says so"


def test_combining_without_a_null_control() -> None:
    for audited in VERDICTS:
        v, why = combine_with_control(audited, None, None)
        assert v == audited and why.startswith(f"{audited} against the reference; no null control")
        v, why = combine_with_control(audited, None, None, speculative=False)
        assert v == audited and "it is the null control of the reference itself" in why
        assert ("the reference does not match the engine's numerics" in why) == (audited == "lossy")
    with pytest.raises(ValueError, match="together, or neither"):
        combine_with_control("lossy", "lossy", None)
    with pytest.raises(ValueError, match="together, or neither"):
        combine_with_control("lossy", None, ("lossy", "x"))


def test_combining_goes_through_decide(recorder: Recorder) -> None:
    assert combine_with_control("lossy", "lossless-consistent", ("lossy", "x")) == SENTINEL
    assert combine_with_control("lossless-consistent", None, None) == SENTINEL
    assert combine_parts([("a", "lossless-consistent", "fine")]) == SENTINEL
    assert len(recorder.calls) == 3 and all(fam is None for fam, *_ in recorder.calls)


def test_decide_is_the_real_rule_outside_the_fakes() -> None:
    """The fixture patches module attributes only: the rule itself is untouched."""
    assert decide(None, failures=["x"], promise=lambda: "p") == ("lossy", "x")
    assert all(vars(mod)["decide"] is decide for mod in (core_audit, seqtests, twosample, combine))
