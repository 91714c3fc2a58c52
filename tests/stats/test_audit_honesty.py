"""The audit never over-promises.

Each test states its family-wise false-fail rate ``alpha``, its sample size ``N`` and the smallest
TV it detects with power 0.99 (or says why no such promise is made). Seeds are fixed.
"""

from __future__ import annotations

import math
import pathlib
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from hsd_core.audit import AuditReport, audit_sampler, min_num_samples_for_law
from hsd_core.stats import InvalidTest, min_num_samples_for_tv, min_tv_detectable

ALPHA = 1e-6
POWER = 0.99


# --- the pooled-tail shape: 8 cells with 0.91 of the mass, 900 cells of 1e-4 -----------------

def _tail_law() -> dict[tuple[int, ...], Fraction]:
    law: dict[tuple[int, ...], Fraction] = {(i,): Fraction(91, 800) for i in range(8)}
    law.update({(8 + j,): Fraction(1, 10_000) for j in range(900)})
    assert sum(law.values()) == 1
    return law


def _tail_sampler(tv: float, seed: int, size: int) -> Any:
    """A sampler at TV ``tv`` from :func:`_tail_law` (0 < tv <= 0.09): it moves ``tv`` of the
    tail's mass onto tail cell (8,) (so the pooled total is unchanged). Draws are pre-computed."""
    law = _tail_law()
    keys = list(law)
    p = np.array([float(law[k]) for k in keys])
    tail = np.arange(8, 908)
    # take tv from the other tail cells in proportion, give it to cell (8,)
    p[tail[1:]] *= 1.0 - tv / float(sum(p[tail[1:]]))
    p[8] += tv
    p /= p.sum()
    draws = np.random.default_rng(seed).choice(len(keys), size=size, p=p)
    it = iter(draws.tolist())
    return lambda: keys[next(it)]


def test_pooled_mass_is_part_of_the_promise() -> None:
    """At the size the old sizing chose for eps 0.05 (a few thousand samples per cell group), the
    900 tail cells are pooled: the promise now includes their 0.09 of mass, so the report never
    says TV 0.05 is caught. No sampling: sizing only (alpha 1e-6 over m = 4 tests)."""
    law = _tail_law()
    m = 4  # joint chi2, G, TV + 1 position
    n_old = min_num_samples_for_tv(908, 0.05, ALPHA / m, POWER)
    sampler = _tail_sampler(0.05, 1, n_old)
    r = audit_sampler(sampler, law, n=n_old, alpha=ALPHA)
    assert r.pooled_mass == pytest.approx(0.09)
    assert r.detectable_tv is None or r.detectable_tv >= 0.09
    assert r.verdict != "lossless-consistent" or "TV >= 0.0" not in r.reason
    assert "pooled" in r.to_markdown()
    # the audit's own sizing for eps 0.05 keeps the tail cells (n * 1e-4 >= 5)
    n = min_num_samples_for_law(law, 0.05, ALPHA / m, POWER)
    assert n >= 50_000 and n * 1e-4 >= 5


@pytest.mark.parametrize("tv", [0.05, 0.08])
def test_pooled_tail_discrepancy_is_caught_at_the_audits_own_size(tv: float) -> None:
    """The suite with teeth on the pooled-tail shape: a sampler at TV 0.05 (then 0.08) inside the
    tail. audit_sampler(eps=tv) sizes N itself (alpha 1e-6 family-wise over m = 4 tests, power
    0.99): N = min_num_samples_for_law(law, tv, 2.5e-7), about 50 000 (every cell kept), and the
    report promises detectable TV <= tv; the sampler is rejected."""
    law = _tail_law()
    n = min_num_samples_for_law(law, tv, ALPHA / 4, POWER)
    r = audit_sampler(_tail_sampler(tv, 2, n), law, eps=tv, alpha=ALPHA)
    assert r.n == n
    assert r.detectable_tv is not None and r.detectable_tv <= tv
    assert r.verdict == "lossy", r.to_markdown()


def test_tiny_n_without_power_is_inconclusive() -> None:
    """N = 10 on two cells (alpha 1e-6, m = 4): no TV below 1 is detectable with power 0.99, so a
    sampler at TV 0.5 that is not rejected gets "inconclusive", never a pass."""
    law = {(0,): Fraction(1, 2), (1,): Fraction(1, 2)}
    r = audit_sampler(lambda: (0,), law, n=10)
    assert r.detectable_tv is None
    assert r.verdict == "inconclusive"


@pytest.mark.parametrize("bad", [
    {(0,): 0.5, (1,): 0.4},                       # sums to 0.9
    {(0,): Fraction(3, 5), (1,): Fraction(1, 2)},  # sums to 1.1
    {(0,): 1.5, (1,): -0.5},                      # negative
    {(0,): float("nan"), (1,): 1.0},              # NaN
    {(0,): 0, (1,): 0},                           # all zeros
])
def test_malformed_law_is_refused_before_the_first_draw(bad: dict[tuple[int, ...], Any]) -> None:
    """A malformed law raises InvalidTest before sample_fn is ever called (no sampling)."""
    calls = []

    def sample() -> tuple[int, ...]:
        calls.append(1)
        return (0,)

    with pytest.raises(InvalidTest):
        audit_sampler(sample, bad, n=100)
    assert calls == []


def _ninety_law(exact: bool) -> dict[tuple[int, ...], Any]:
    """Two cells with exactly 0.9 of the mass (0.45 each) and 100 cells of 0.001."""
    one = Fraction(1) if exact else 1.0
    law: dict[tuple[int, ...], Any] = {(0,): one * 45 / 100, (1,): one * 45 / 100}
    law.update({(2 + j,): one / 1000 for j in range(100)})
    return law


@pytest.mark.parametrize("exact", [True, False])
def test_exact_ninety_percent_kept_mass_runs(exact: bool) -> None:
    """Exactly 90% kept mass is enough, for a Fraction law as for the float one: at N = 100 the
    joint chi-square runs (alpha 1e-6, m = 4; detectable TV: that of 3 cells at N = 100 plus the
    pooled 0.1, about 0.55). With n=None and eps=0.6 the sizing picks an n at which it runs."""
    law = _ninety_law(exact)
    rng = np.random.default_rng(3)
    keys = list(law)
    p = np.array([float(v) for v in law.values()])

    def sample() -> tuple[int, ...]:
        return keys[int(rng.choice(len(keys), p=p))]

    r = audit_sampler(sample, law, n=100)
    assert not any(s.startswith("joint chi2") for s in r.skipped), r.skipped
    r2 = audit_sampler(sample, law, eps=0.6)
    assert not any(s.startswith("joint chi2") for s in r2.skipped), r2.skipped
    assert r2.verdict == "lossless-consistent", r2.to_markdown()


def test_sizing_above_max_n_is_refused_before_sampling() -> None:
    """eps = 1e-4 would need over a billion samples: refused (InvalidTest naming n and max_n)
    before the first draw; the cap can be raised (max_n) and the check is only for the audit's own
    sizing (no sampling happens in this test)."""
    law = {(0,): Fraction(1, 2), (1,): Fraction(1, 2)}

    def never() -> tuple[int, ...]:
        raise AssertionError("sampled")

    with pytest.raises(InvalidTest, match="max_n"):
        audit_sampler(never, law, eps=1e-4)
    with pytest.raises(InvalidTest, match="max_n"):
        audit_sampler(never, law, eps=0.01, max_n=1000)


@pytest.mark.parametrize("out", [(1.7,), {(0,): 1}, "0", None, 0, (True,), [0.0]])
def test_sampler_outputs_must_be_tuples_of_ints(out: Any) -> None:
    """A sampler output that is not a tuple/list of ints raises TypeError (no coercion)."""
    law = {(0,): Fraction(1, 2), (1,): Fraction(1, 2)}
    with pytest.raises(TypeError, match="token ids"):
        audit_sampler(lambda: out, law, n=20)


@pytest.mark.parametrize("law", [
    {(1.2,): 0.5, (1.7,): 0.5},   # float keys (used to merge into (1,))
    {0: 0.5, 1: 0.5},             # int keys
    {"a": 0.5, "b": 0.5},         # str keys
])
def test_law_keys_must_be_tuples_of_ints(law: dict[Any, float]) -> None:
    with pytest.raises(TypeError, match="int token ids"):
        audit_sampler(lambda: (0,), law, n=20)


def test_numpy_numbers_are_valid_arguments() -> None:
    """np.int64 as n, np.float32 as alpha, numpy ints in outputs and keys are fine (alpha 1e-3,
    N = 2000 on two cells, m = 4: detectable TV about 0.06)."""
    law = {(np.int64(0),): Fraction(1, 2), (np.int64(1),): Fraction(1, 2)}
    rng = np.random.default_rng(4)
    r = audit_sampler(lambda: (np.int64(rng.integers(0, 2)),), law, n=np.int64(2000), alpha=np.float32(1e-3),
                      eps=np.float64(0.2))
    assert r.n == 2000 and r.verdict == "lossless-consistent", r.to_markdown()
    arr = audit_sampler(lambda: np.array([rng.integers(0, 2)]), law, n=200, alpha=1e-3)
    assert arr.n == 200


def test_point_mass_report_quotes_the_exact_check() -> None:
    """Greedy (point-mass) laws are checked exactly: a law at TV e from the point mass is missed
    by N draws with probability (1-e)^N, so N = 500 detects TV 1 - 0.01^(1/500) = 0.0092 with power
    0.99, whatever alpha (false-fail rate 0). The report says so, not a chi-square figure."""
    law = {(2, 3): Fraction(1)}
    r = audit_sampler(lambda: (2, 3), law, n=500)
    assert r.verdict == "lossless-consistent"
    assert r.detectable_tv == pytest.approx(1 - 0.01 ** (1 / 500))
    assert "point-mass" in r.detectable_by and "point-mass" in r.to_markdown()
    assert "chi-square" not in r.detectable_by
    sized = audit_sampler(lambda: (2, 3), law, eps=0.01)
    assert sized.n == math.ceil(math.log(0.01) / math.log(0.99))
    bad = audit_sampler(lambda: (2, 4), law, n=5)
    assert bad.verdict == "lossy"


def test_plot_names_the_sampler_bands_cuts_and_log(tmp_path: pathlib.Path) -> None:
    """plot_data/save_plot: the sampler's name in the title, a 99% sampling band around every
    expected count, the number of outputs cut, and a log scale (alpha 1e-6, N = 2000, 30 cells,
    m = 4: detectable TV about 0.2; the plot shows 10 of the 30 outputs)."""
    law = {(i,): Fraction(1, 30) for i in range(30)}
    rng = np.random.default_rng(5)

    def my_sampler() -> tuple[int, ...]:
        return (int(rng.integers(0, 30)),)

    r: AuditReport = audit_sampler(my_sampler, law, n=2000)
    assert r.name == "test_plot_names_the_sampler_bands_cuts_and_log.<locals>.my_sampler"
    d = r.plot_data(max_bars=10)
    assert r.name in d["title"] and "20 more outputs not shown" in d["title"]
    assert d["n_cut"] == 20 and len(d["keys"]) == 10
    assert all(lo <= e <= hi for lo, e, hi in zip(d["band_low"], d["expected"], d["band_high"]))
    assert all(hi - lo > 10 for lo, hi in zip(d["band_low"], d["band_high"]))
    named = audit_sampler(my_sampler, law, n=100, name="TLI/k=2")
    assert named.plot_data()["title"].startswith("TLI/k=2:")
    for log in (False, True):
        path = tmp_path / f"p{log}.png"
        assert r.save_plot(str(path), max_bars=10, log=log) and path.stat().st_size > 0


def test_position_promises_are_reported() -> None:
    """audit_sampler states each position's detectable TV, from the position's law at the expected
    number of outputs reaching it (a law whose second token is reached half the time promises less
    there)."""
    from fractions import Fraction as F

    from hsd_core.audit import audit_sampler

    law = {(0,): F(1, 2), (1, 0): F(1, 4), (1, 1): F(1, 4)}
    keys = list(law)
    rep = audit_sampler(lambda rng: keys[rng.choice(3, p=[.5, .25, .25])], law, n=4000, alpha=1e-3, seed=0)
    d0, d1 = rep.position_detectable
    assert d0 is not None and d1 is not None and d0 < d1
