"""``hsd_core.audit.audit_plan``: the promise of ``audit_sampler`` stated before any draw.

The plan must give exactly the report's ``detectable_tv`` and family size: both depend on the law,
``n``, alpha and power only. Checked on a point mass, a two-token uniform law, and a skewed law
whose rare tail is pooled, with and without positional tests, a text test and prefixes; a plan
that miscounted the tests (so used another per-test level) or the pooled mass would differ.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from hsd_core.audit import audit_plan, audit_sampler
from hsd_core.stats import InvalidTest

POINT = {(1, 2): Fraction(1)}
UNIFORM = {(a, b): Fraction(1, 9) for a in range(3) for b in range(3)}
SKEWED = {(0, 0): 0.5, (0, 1): 0.2, (1, 0): 0.15, (1, 1): 0.1, **{(2, k): 0.05 / 50 for k in range(50)}}


def sampler(law: dict[Any, Any]) -> Any:
    keys = list(law)
    p = np.array([float(law[k]) for k in keys])

    def draw(rng: np.random.Generator) -> tuple[int, ...]:
        return keys[int(rng.choice(len(keys), p=p / p.sum()))]
    return draw


@pytest.mark.parametrize("law", [POINT, UNIFORM, SKEWED], ids=["point", "uniform", "skewed"])
@pytest.mark.parametrize("n", [20, 400, 3000])
@pytest.mark.parametrize("extra", [{}, {"positions": False}, {"text": True}, {"prefixes": 2}])
def test_the_plan_is_the_reports_promise(law: dict[Any, Any], n: int, extra: dict[str, Any]) -> None:
    alpha, power = 1e-3, 0.99
    kw: dict[str, Any] = {"positions": extra.get("positions", True)}
    if extra.get("text"):
        kw["text"] = lambda s: "".join(map(str, s))
    if extra.get("prefixes"):
        kw["prefixes"] = [(0,), (1,)]
    rep = audit_sampler(sampler(law), law, n=n, alpha=alpha, power=power, seed=3, **kw)
    plan = audit_plan(law, n, alpha, power, positions=kw["positions"], text="text" in kw,
                      prefixes=len(kw.get("prefixes", ())))
    assert plan.detectable_tv == rep.detectable_tv
    assert plan.by == rep.detectable_by
    assert plan.tests * rep.per_test_alpha == pytest.approx(alpha)


def test_more_draws_promise_less() -> None:
    small, big = audit_plan(SKEWED, 400, 1e-3), audit_plan(SKEWED, 40000, 1e-3)
    assert small.detectable_tv is not None and big.detectable_tv is not None
    assert big.detectable_tv < small.detectable_tv


def test_a_bad_plan_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        audit_plan({}, 10)
    with pytest.raises(InvalidTest):
        audit_plan(UNIFORM, 0)
    with pytest.raises(InvalidTest):
        audit_plan(UNIFORM, 10, alpha=2.0)
    with pytest.raises(InvalidTest):
        audit_plan({(1,): 0.5}, 10)  # not a probability law
