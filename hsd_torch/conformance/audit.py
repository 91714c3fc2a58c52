"""The statistics of a conformance case: an engine's draws against the kit's exact law, and its
acceptance against the method's exact expected acceptance (docs/conformance.md, "The statistics").

NumPy only (no torch). For one case (a prompt, a processing, ``max_new_tokens``), the exact law of a
whole draw is :func:`hsd_core.conformance.sequence_law`; the outcome space is small, so the draws are
tested where engines keep state per position, each test a G-test with low-count cells pooled
(:func:`hsd_core.stats.gof_test`; a point-mass law, greedy, is checked exactly):

* ``whole draws``: the law of the whole sequence of new ids;
* ``length``: the law of the number of new ids (where EOS, or a stop string, comes);
* ``position j`` (``j = 0`` is the **first token**): the law of the id at position ``j`` alone, the
  draw having ended before it an outcome of its own.

A draw's ``finish_reason``, where the engine gives one, must be the law's (``"stop"`` or
``"length"``): an exact check. The tests share one family-wise ``alpha`` by Holm
(:class:`hsd_core.stats.TestFamily`): each runs at ``alpha / m`` and states its sample size, its
alpha and the smallest TV it detects with power 0.99 (:func:`hsd_core.stats.min_tv_detectable`).

**Acceptance.** Where the engine reports its rounds (per draw: ``new_tokens`` and ``target_calls``
in the draw's line), the measured tokens per target call (a ratio estimator, with a delta-method
interval) is compared with the exact expectation (:func:`hsd_core.conformance.expected_acceptance`):
an engine whose draws conform but whose upper bound lies below the expectation is a **performance
defect** (lossless, but it accepts less than the method promises), never "lossy".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from scipy import stats as _sps  # type: ignore[import-untyped]

from hsd_core.conformance import length_law, position_laws
from hsd_core.samples import Draw
from hsd_core.stats import InvalidTest, TestFamily, TestResult, decide, gof_test, min_tv_detectable

__all__ = ["Acceptance", "TestLine", "VERDICTS", "acceptance", "audit_draws"]

POWER = 0.99
"""The power every detectable TV is stated at."""

VERDICTS = ("conforms", "lossy", "performance defect", "inconclusive", "not determinable", "refused", "crashed")
"""A case's outcome: the first four are verdicts of an audit; ``not determinable`` (the law is
ambiguous: :class:`hsd_core.processing.AmbiguousLawError`), ``refused`` (the engine does not run
the case) and ``crashed`` (the engine raised) are recorded with their message, never verdicts."""


@dataclass(frozen=True)
class TestLine:
    """One test of a case: its ``name``, sample size ``n``, per-test ``alpha``, statistic, p-value,
    whether Holm rejects it, the smallest TV it detects with power 0.99 (None: no power at this n)
    and a detail line."""

    name: str
    n: int
    alpha: float
    statistic: float
    p_value: float
    rejected: bool
    detectable_tv: float | None
    detail: str


@dataclass(frozen=True)
class Acceptance:
    """Tokens per target call: the exact ``expected``, the ``measured`` ratio over ``n`` draws and its
    two-sided interval ``[low, high]`` at ``alpha``; ``defect``: ``high < expected``."""

    expected: float
    measured: float
    low: float
    high: float
    n: int
    alpha: float
    defect: bool

    def describe(self) -> str:
        return (f"tokens per target call {self.measured:.4f} [{self.low:.4f}, {self.high:.4f}] over {self.n} draws "
                f"vs exactly {self.expected:.4f} expected")


@dataclass
class Audit:
    """What :func:`audit_draws` found: ``verdict`` (``conforms``, ``lossy``, ``inconclusive``),
    its ``reason``, the tests and the number of draws."""

    verdict: str
    reason: str
    n: int
    tests: list[TestLine] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reason": self.reason, "n": self.n, "tests": [asdict(t) for t in self.tests]}


def _support(law: Mapping[Any, float]) -> int:
    return max(2, sum(1 for p in law.values() if p > 0))


def _detectable(law: Mapping[Any, float], n: int, alpha: float) -> float | None:
    if sum(1 for p in law.values() if p > 0) < 2:
        return None  # a point mass: the exact check catches any other outcome at once
    try:
        return float(min_tv_detectable(_support(law), n, alpha, POWER, "g"))
    except InvalidTest:
        return None


def audit_draws(draws: Sequence[Draw], law: Mapping[tuple[int, ...], tuple[float, str]], alpha: float = 1e-3
                ) -> Audit:
    """The draws of one case against ``law`` (:func:`hsd_core.conformance.sequence_law`) at family-wise
    ``alpha`` (module docstring). Needs at least one draw (``ValueError`` otherwise)."""
    if not draws:
        raise ValueError("no draws to audit")
    n = len(draws)
    seqs = [tuple(d.ids) for d in draws]
    whole = {s: p for s, (p, _) in law.items()}
    failures = []
    bad_reason = [d for d in draws if d.finish_reason is not None and tuple(d.ids) in law
                  and d.finish_reason != law[tuple(d.ids)][1]]
    if bad_reason:
        d = bad_reason[0]
        failures.append(f"{len(bad_reason)} draw(s) with a finish reason the law does not give, first {list(d.ids)}: "
                        f"{d.finish_reason!r}, the law's {law[tuple(d.ids)][1]!r}")
    lengths = length_law(law)
    positions = position_laws(law)
    plan: list[tuple[str, Mapping[Any, float], list[Any]]] = [("whole draws", whole, list(seqs)),
                                                             ("length", lengths, [len(s) for s in seqs])]
    for j, pl in enumerate(positions):
        name = "position 0 (first token)" if j == 0 else f"position {j}"
        plan.append((name, pl, [s[j] if j < len(s) else -1 for s in seqs]))
    fam = TestFamily(alpha, len(plan))
    a = fam.per_test_alpha
    ran: list[tuple[str, Mapping[Any, float], Any]] = []
    for name, lw, obs in plan:
        def test(lw: Mapping[Any, float] = lw, obs: list[Any] = obs, name: str = name) -> TestResult:
            return replace(gof_test(dict(lw), obs, a, "g"), name=name)

        r = fam.run(name, test)
        if r is not None:
            ran.append((name, lw, r))
    rejected = fam.verdicts()
    tests = [TestLine(name, r.n, a, float(r.statistic), float(r.p_value), bool(rej), _detectable(lw, n, a), r.detail)
             for (name, lw, r), rej in zip(ran, rejected)]
    tv = {t.name: t.detectable_tv for t in tests}

    def promise() -> str:
        shown = ", ".join(f"{k} {v:.3g}" for k, v in tv.items() if v is not None and k in ("whole draws", "length",
                                                                                              "position 0 (first token)"))
        return (f"no test rejects at family-wise alpha {alpha:.3g} ({n} draws, Holm over {len(plan)} tests); "
                f"detectable TV at power {POWER}: {shown or 'exact checks only (point masses)'}")

    verdict, reason = decide(fam, failures=failures, promise=promise)
    return Audit("conforms" if verdict == "lossless-consistent" else verdict, reason, n, tests)


def acceptance(draws: Sequence[Draw], expected: float, alpha: float = 1e-3) -> Acceptance | None:
    """The measured tokens per target call of ``draws`` (each draw's ``extra`` holding ``new_tokens``
    and ``target_calls``) against ``expected``, with a delta-method interval of the ratio estimator
    ``sum(new_tokens) / sum(target_calls)`` at two-sided ``alpha``; None when the draws carry no
    counts."""
    pairs = [(float(d.extra["new_tokens"]), float(d.extra["target_calls"])) for d in draws
             if "new_tokens" in d.extra and "target_calls" in d.extra]
    if len(pairs) < 2:
        return None
    n = len(pairs)
    t = [x for x, _ in pairs]
    c = [y for _, y in pairs]
    cbar = sum(c) / n
    if cbar <= 0:
        return None
    r = sum(t) / sum(c)
    resid = [ti - r * ci for ti, ci in zip(t, c)]
    var = sum(e * e for e in resid) / (n - 1) / (n * cbar * cbar)
    z = float(_sps.norm.isf(alpha / 2))
    half = z * math.sqrt(var)
    return Acceptance(float(expected), r, r - half, r + half, n, alpha, r + half < expected)
