"""The two-sample statistics of :mod:`hsd_core.twosample` on toy engines.

Engines over the hsd_core toy world (pseudo-random laws over one vocabulary, target and drafter):
"no speculation" is AR, "lossless speculation" is SD, and two lossy fakes built on the real SD code:
SD that accepts every draft (:class:`hsd_core.variants.AcceptEveryDraft`), and SD whose law differs
**only after a rejection** (:class:`StaleAfterRejection`: after the first rejected draft of a
sequence, the target reads every later context with the prompt's first id doubled, a stale cache
entry). Every sample size below is stated with the power it gives, and every margin was measured
(seeds 0-3) before it was asserted.
"""

from __future__ import annotations

import doctest
from typing import Any

import numpy as np
import pytest

import hsd_core as hc
import hsd_core.twosample as ts
from hsd_core.methods.base import RoundOutcome, State
from hsd_core.rand import Rand
from hsd_core.stats import InvalidTest, min_num_samples_for_tv, min_tv_detectable
from hsd_core.variants import AcceptEveryDraft

PROMPTS = ["ab", "ba"]
L = 8


def _world() -> tuple[Any, Any]:
    v = hc.Vocabulary(["a", "b", "c", "d", "ab", "ba", "cd"])
    tok = hc.LongestMatchTokenizer(v)
    return hc.toy.random_model(v, tok, seed=1, exact=False), hc.toy.random_model(v, tok, seed=2, exact=False)


class StaleAfterRejection(hc.methods.SD):
    """SD whose target, after the first rejected draft of a sequence, reads every later context with
    its first id doubled (the law up to and including the first rejection is SD's own)."""

    name = "stale_after_rejection"

    def __init__(self, lookahead: int = 3) -> None:
        super().__init__(lookahead)
        self.hit = False

    def step(self, target: Any, drafter: Any, state: State, rand: Rand) -> RoundOutcome:
        if not state.emitted:
            self.hit = False
        return super().step(target, drafter, state, rand)

    def verify(self, target: Any, ctx: tuple[int, ...], drafts: Any, qs: Any, rand: Rand, budget: int) -> RoundOutcome:
        out = super().verify(target, ctx[:1] + ctx if self.hit else ctx, drafts, qs, rand, budget)
        if out.accepted < out.proposed:
            self.hit = True
        return out


def _draws(method: Any, target: Any, drafter: Any, n: int, seed: int) -> tuple[list[list[int]], list[str]]:
    seqs, strata = [], []
    for i in range(n):
        p = PROMPTS[i % len(PROMPTS)]
        seqs.append(list(method.generate(target, drafter, p, L, rng=np.random.SeedSequence([seed, i]))))
        strata.append(p)
    return seqs, strata


def _loglik(model: Any, seqs: list[list[int]], strata: list[str]) -> np.ndarray:
    out = np.zeros(len(seqs))
    for i, (s, p) in enumerate(zip(seqs, strata)):
        ctx = tuple(model.tokenizer.encode(p))
        out[i] = sum(np.log(max(float(model.next_probs(ctx + tuple(s[:j]))[t]), 1e-300)) for j, t in enumerate(s))
    return out


def _audit(a: tuple[list[list[int]], list[str]], b: tuple[list[list[int]], list[str]], target: Any, drafter: Any,
           alpha: float = 1e-3) -> ts.TwoSampleReport:
    def scores(x: tuple[list[list[int]], list[str]]) -> tuple[np.ndarray, np.ndarray]:
        return _loglik(target, *x), _loglik(drafter, *x)

    (ta, da), (tb, db) = scores(a), scores(b)
    return ts.two_sample_sequences(a[0], a[1], b[0], b[1], alpha=alpha,
                                   scores={"target log-likelihood": (ta, tb), "drafter log-likelihood": (da, db),
                                           "drafter minus target": (da - ta, db - tb)})


N = 400  # per sample; the report states what it detects (asserted below)


@pytest.fixture(scope="module")
def world() -> dict[str, Any]:
    target, drafter = _world()
    return {"target": target, "drafter": drafter, "ar": _draws(hc.methods.AR(), target, None, N, 1)}


def test_lossless_speculation_passes(world: dict[str, Any]) -> None:
    sd = _draws(hc.methods.SD(lookahead=3), world["target"], world["drafter"], N, 2)
    rep = _audit(sd, world["ar"], world["target"], world["drafter"])
    assert rep.verdict == "lossless-consistent", rep.reason
    assert rep.m == 5 and len(rep.tests) == 5
    # the promise is stated for every test: TV for the prefix tests, a shift of P(A > B) for the scores
    dets = {p.test: p.detectable for p in rep.powers}
    assert all(d is not None for d in dets.values())
    assert dets["first-token homogeneity"] == pytest.approx(
        min_tv_detectable(rep.tests[0].dof + 1, N // 2, 1e-3 / 5), rel=1e-9)  # two prompts: N_h = 2 * 300 * 300 / 600
    assert "caught with probability >= 0.99" in rep.reason


@pytest.mark.parametrize("lossy", ["stale_after_rejection", "accept_every_draft"])
def test_lossy_speculation_is_caught(world: dict[str, Any], lossy: str) -> None:
    method = StaleAfterRejection(3) if lossy == "stale_after_rejection" else AcceptEveryDraft(lookahead=3)
    bad = _draws(method, world["target"], world["drafter"], N, 3)
    rep = _audit(bad, world["ar"], world["target"], world["drafter"])
    assert rep.verdict == "lossy", rep.reason
    # margins measured over seeds 0-3: the best p-value is below 1e-30 for both fakes, against alpha / m = 2e-4
    assert min(r.p_value for r in rep.tests) < 1e-20


def test_stale_fake_differs_only_after_a_rejection(world: dict[str, Any]) -> None:
    """The fake's first round is SD's own: its first-token law is the target's (the first-token test
    does not reject), so only the later positions give it away."""
    bad = _draws(StaleAfterRejection(3), world["target"], world["drafter"], N, 3)
    rep = ts.two_sample_sequences(bad[0], bad[1], world["ar"][0], world["ar"][1], prefix_lengths=(1,), alpha=1e-3)
    assert not rep.tests[0].rejected and rep.verdict == "lossless-consistent"
    # and the fake is not a fake that does nothing: with the same randomness, outputs differ from SD's
    sd = _draws(hc.methods.SD(lookahead=3), world["target"], world["drafter"], 50, 3)
    assert sum(x != y for x, y in zip(sd[0], bad[0][:50])) > 10


def _chain_samples(rng: np.random.Generator, n: int, trans: np.ndarray, start: np.ndarray) -> np.ndarray:
    """``n`` sequences of a first-order chain over 6 ids (id 5: EOS, then padded with -1), length 6."""
    out = np.full((n, 6), -1)
    cur = (start.cumsum() < rng.random(n)[:, None]).sum(1).clip(0, 5)
    alive = np.ones(n, dtype=bool)
    for j in range(6):
        out[alive, j] = cur[alive]
        alive &= cur != 5
        u = rng.random(n)
        cur = (trans[cur].cumsum(1) < u[:, None]).sum(1).clip(0, 5)
    return out


def _null_rejections(runs: int) -> int:
    """How many of ``runs`` null runs (both samples from one law: a first-order chain over 6 ids with
    EOS, two strata, 100 per stratum and sample, two scores) the family rejects at alpha 0.05."""
    rng = np.random.default_rng(0)
    trans = rng.dirichlet(np.ones(6) * 0.7, size=6)
    starts = [rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))]
    other = rng.dirichlet(np.ones(6), size=6)
    first = np.full(6, 1 / 6)

    def loglik(s: np.ndarray, law: np.ndarray) -> np.ndarray:
        lp = np.log(first[s[:, 0]])
        for j in range(1, 6):
            ok = s[:, j] >= 0
            lp[ok] += np.log(law[s[ok, j - 1], s[ok, j]])
        return lp

    rejected = 0
    for _ in range(runs):
        (sa, ka), (sb, kb) = [(np.concatenate([_chain_samples(rng, 100, trans, st) for st in starts]),
                               [0] * 100 + [1] * 100) for _side in range(2)]
        rep = ts.two_sample_sequences(
            [list(r[r >= 0]) for r in sa], ka, [list(r[r >= 0]) for r in sb], kb, alpha=0.05,
            scores={"ll": (loglik(sa, trans), loglik(sb, trans)), "other": (loglik(sa, other), loglik(sb, other))})
        rejected += rep.verdict == "lossy"
    return rejected


def test_family_holds_its_level_on_null_data() -> None:
    """60 null runs at family-wise alpha 0.05: at most 9 rejections (for an exact level 0.05,
    P(>= 10 of 60) is 7e-4; measured: 3 with this seed)."""
    assert _null_rejections(60) <= 9


@pytest.mark.slow
def test_family_holds_its_level_on_null_data_300_runs() -> None:
    """300 null runs: at most 25 rejections (P(>= 26 of 300) is about 1e-3 at an exact level 0.05;
    measured: 14)."""
    assert _null_rejections(300) <= 25


def test_sizing_pairs_invert_each_other() -> None:
    for k, eps, alpha in ((8, 0.05, 1e-3), (20, 0.1, 1e-4)):
        n = ts.min_num_samples_two_sample(k, eps, alpha)
        assert n == 2 * min_num_samples_for_tv(k, eps, alpha)
        assert ts.min_tv_detectable_two_sample(k, n, n, alpha) <= eps * (1 + 1e-6)
        assert ts.min_tv_detectable_two_sample(k, n // 2, n // 2, alpha) > eps
    for delta in (0.02, 0.1, 0.3):
        n = ts.min_num_samples_rank(delta, 1e-3)
        assert ts.min_shift_detectable_rank([(n, n)], 1e-3) <= delta
        assert ts.min_shift_detectable_rank([(n - 1, n - 1)], 1e-3) > delta
    with pytest.raises(InvalidTest, match="cannot detect even the largest shift"):
        ts.min_shift_detectable_rank([(3, 3)], 1e-3)
    with pytest.raises(InvalidTest, match="no stratum"):
        ts.min_shift_detectable_rank([(3, 0)], 1e-3)


def test_rank_power_statement_by_simulation() -> None:
    """A shift of the probability of superiority at the stated detectable delta is caught with about the
    stated power: normal scores shifted by d have P(A > B) = Phi(d / sqrt 2); 200 runs at n = 400 per
    sample, alpha 1e-2, power 0.9: at least 160 catches (the stated 0.9 gives 180 on average; measured 183)."""
    from scipy import stats as sps

    n, alpha = 400, 1e-2
    delta = ts.min_shift_detectable_rank([(n, n)], alpha, power=0.9)
    d = float(np.sqrt(2) * sps.norm.ppf(0.5 + delta))
    rng = np.random.default_rng(1)
    caught = sum(ts.stratified_rank_test([rng.normal(d, 1, n)], [rng.normal(0, 1, n)], alpha).rejected
                 for _ in range(200))
    assert caught >= 160, caught


def test_greedy_comparison_is_exact() -> None:
    a = [[1, 2, 3]] * 4 + [[1, 2, 4]] * 4
    k = [0] * 4 + [1] * 4
    same = ts.two_sample_sequences(a, k, a, k, do_sample=False)
    assert same.verdict == "lossless-consistent"
    other = ts.two_sample_sequences([[1, 2, 3]] * 3 + [[1, 9, 3]] + [[1, 2, 4]] * 4, k, a, k, do_sample=False)
    assert other.verdict == "lossy" and "first at position 1" in other.greedy_mismatch[0]
    wobbly = ts.two_sample_sequences(a, k, [[1, 2, 3]] * 3 + [[7]] + [[1, 2, 4]] * 4, k, do_sample=False)
    assert wobbly.verdict == "inconclusive" and "not deterministic" in wobbly.reason


def test_refusals_and_edges() -> None:
    with pytest.raises(ValueError, match="one stratum"):
        ts.two_sample_sequences([[1]], [0, 1], [[1]], [0])
    with pytest.raises(ValueError, match="one score per sequence"):
        ts.two_sample_sequences([[1]], [0], [[1]], [0], scores={"s": ([1.0, 2.0], [1.0])})
    with pytest.raises(ValueError, match="NaN"):
        ts.stratified_rank_test([[np.nan, 1.0]], [[1.0]], 0.01)
    assert ts.two_sample_sequences([[1]], ["x"], [[1]], ["y"]).verdict == "inconclusive"
    rep = ts.two_sample_sequences([[1]] * 3, [0] * 3, [[1]] * 3, [0] * 3, scores={"s": ([1.0] * 3, [1.0] * 3)})
    assert rep.verdict == "inconclusive" and len(rep.skipped) == 3
    assert "| test |" in ts.two_sample_sequences([[1], [2]] * 40, [0] * 80, [[1], [2]] * 40, [0] * 80).to_markdown()


def test_doctests() -> None:
    assert doctest.testmod(ts).failed == 0

