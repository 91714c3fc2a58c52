"""The exact-law tests of bench/engines/llamacpp_conformance.py have teeth: 4,000 draws sampled from the
exact law of a case pass (Holm at family-wise alpha 1e-3), and draws from a law that differs the way an
engine bug would (llama.cpp's top-p applied after temperature, as vLLM orders them; penalties dropped; the
first id from the plain law but the rest right) are found lossy; a greedy draw off the one sequence is
lossy; the greedy-draft expected acceptance is a probability, the one-draft formula on 3-id cases and a
simulation's mean on pos_plain; pos_plain's tests (against target_pos) find a previous-token head that
misses. Numpy only, fixed seeds, about ten seconds."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hsd_core import conformance as kc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import suite_helpers  # noqa: E402


@pytest.fixture(scope="module")
def lc() -> Any:
    return suite_helpers.bench_script("engines/llamacpp_conformance.py")


def _draws(lc: Any, prompt: list[int], s: Any, n: int, seed: int) -> list[tuple[tuple[int, ...], str]]:
    law = kc.sequence_law(lc.M, prompt, s)
    keys = list(law)
    p = np.array([law[k][0] for k in keys])
    idx = np.random.default_rng(seed).choice(len(keys), size=n, p=p / p.sum())
    return [(keys[i], law[keys[i]][1]) for i in idx]


@pytest.mark.parametrize("name", ["plain", "temperature 0.6 + top-p 0.8", "penalties", "logit bias"])
def test_draws_of_the_law_pass(lc: Any, name: str) -> None:
    prompt, s = lc.CASES[name]
    out = lc.exact_tests(_draws(lc, prompt, s, 4000, 1), prompt, s, 1e-3)
    assert out["verdict"] == "lossless", out
    assert all(t["detectable_tv"] < 0.08 for t in out["tests"].values())


@pytest.mark.parametrize("name, wrong", [
    ("temperature 0.6 + top-p 0.8", {"order": "vllm"}),
    ("penalties", {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}),
    ("top-p 0.8 inside", {"top_p": None}),
])
def test_draws_of_another_law_are_lossy(lc: Any, name: str, wrong: dict[str, Any]) -> None:
    prompt, s = lc.CASES[name]
    out = lc.exact_tests(_draws(lc, prompt, replace(s, **wrong), 4000, 2), prompt, s, 1e-3)
    assert out["verdict"] == "lossy", out


def test_greedy_and_acceptance(lc: Any) -> None:
    prompt, s = lc.CASES["greedy"]
    (only,) = kc.sequence_law(lc.M, prompt, s)
    assert lc.exact_tests([(only, "length")] * 5, prompt, s, 1e-3)["verdict"] == "lossless"
    assert lc.exact_tests([(only, "length")] * 4 + [(only[:-1] + (kc.EOS,), "stop")], prompt, s, 1e-3)["verdict"] \
        == "lossy"
    lo, hi = lc.greedy_draft_acceptance(*lc.CASES["plain"])
    assert 0.0 < lo <= hi < 1.0
    assert lc.greedy_draft_acceptance(*lc.CASES["greedy"]) is None


def test_the_acceptance_walk_is_the_one_draft_formula_on_3_id_cases(lc: Any) -> None:
    """With a budget of 3 ids the server drafts once, after the first id: the walk's rate is
    ``sum_t1 P(t1) p(d(t1) | t1) / P(t1 is no end id)``, its range over the drafter's tied argmaxes the
    formula's lowest and highest choice per first id (each first id is its own context)."""
    for name in ("plain", "top-p 0.8 inside", "penalties"):
        prompt, s = lc.CASES[name]
        first = kc.next_law(lc.M, prompt, (), s)
        lo = hi = mass = 0.0
        for t1 in np.flatnonzero(first > 0):
            if int(t1) == kc.EOS:
                continue
            p2 = kc.next_law(lc.M, prompt, (int(t1),), s)
            tied = [p2[d] for d in lc.drafter_argmax(int(t1))]
            lo, hi, mass = lo + first[t1] * min(tied), hi + first[t1] * max(tied), mass + first[t1]
        got = lc.greedy_draft_acceptance(prompt, s)
        assert abs(got[0] - lo / mass) < 1e-12 and abs(got[1] - hi / mass) < 1e-12, (name, got, lo / mass, hi / mass)


def _simulate_server(lc: Any, prompt: list[int], s: Any, model: Any, n: int, seed: int,
                     n_max: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Drafted and accepted ids per draw of a forward simulation of llama-server's greedy draft-simple
    loop (written apart from the walk: the server's steps in order, one draw at a time), every tie
    broken to the lowest id."""
    rng = np.random.default_rng(seed)
    cdfs: dict[tuple[int, ...], np.ndarray] = {}

    def sample(out: list[int]) -> int:
        key = tuple(out)
        if key not in cdfs:
            cdfs[key] = np.cumsum(kc.next_law(model, prompt, out, s))
        c = cdfs[key]
        return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(c) - 1))

    drafted, accepted = np.zeros(n), np.zeros(n)
    for j in range(n):
        out = [sample([])]
        while out[-1] != kc.EOS and len(out) < s.max_new_tokens:
            k = min(n_max, s.max_new_tokens - len(out) - 1)
            if k <= 0:
                out.append(sample(out))
                continue
            ds = [lc.drafter_argmax(out[-1])[0]]
            while len(ds) < k:
                ds.append(lc.drafter_argmax(ds[-1])[0])
            drafted[j] += k
            kept = 0
            while True:
                t = sample(out)
                out.append(t)
                if kept == k or t != ds[kept]:
                    break
                if t == kc.EOS:  # a matched end id: counted only as the draft's last
                    kept += kept + 1 == k
                    break
                kept += 1
            accepted[j] += kept
    return drafted, accepted


def test_the_acceptance_walk_equals_a_simulation_on_pos_plain(lc: Any) -> None:
    """pos_plain (4 ids on target_pos: two drafts, and one more after a rejection of the first; every
    tie broken to the lowest id, so the drafter drafts EOS after '.' and '\\n'): the walk's expected
    drafted and accepted ids per draw equal the means of 10,000 simulated draws; a z-test per mean at
    alpha 1e-6 (|z| < 4.89) detects a shift of 7.2 standard errors at power 0.99: 0.041 drafted or
    0.026 accepted ids a draw (standard deviations per draw 0.57 and 0.37)."""
    prompt, s = lc.CASES["pos_plain"]
    model = lc.target_of("pos_plain")
    assert model.role == "target_pos"
    dn, da = lc.greedy_draft_expectation(prompt, s, model)
    drafted, accepted = _simulate_server(lc, prompt, s, model, 10_000, 7)
    for want, got in ((dn, drafted), (da, accepted)):
        se = got.std(ddof=1) / np.sqrt(len(got))
        assert abs(got.mean() - want) < 4.89 * se, (want, got.mean(), se)
    lo, hi = lc.greedy_draft_acceptance(prompt, s, model)
    assert lo <= da / dn <= hi and 0.0 < lo < hi < 1.0


def test_pos_plain_tests_see_a_head_that_misses(lc: Any) -> None:
    """pos_plain's exact tests against target_pos's law: 4,000 draws of that law pass; 4,000 draws whose
    first id is right but whose later ids come from target_pos with its previous-token head blind (q
    zero: it attends to every position alike, as a head whose rotary layout is wrong misses the previous
    id) are lossy (Holm at family-wise alpha 1e-3; each position's test detects a TV of about 0.057)."""
    prompt, s = lc.CASES["pos_plain"]
    model = lc.target_of("pos_plain")
    law = kc.sequence_law(model, prompt, s)
    keys = list(law)
    p = np.array([law[k][0] for k in keys])
    idx = np.random.default_rng(3).choice(len(keys), size=4000, p=p / p.sum())
    assert lc.exact_tests([(keys[i], law[keys[i]][1]) for i in idx], prompt, s, 1e-3, model)["verdict"] == "lossless"
    blind = dict(model.weights64)
    blind["model.layers.0.self_attn.q_proj.weight"] = np.zeros_like(blind["model.layers.0.self_attn.q_proj.weight"])
    rng = np.random.default_rng(4)
    laws: dict[tuple[int, ...], np.ndarray] = {(): np.cumsum(kc.next_law(model, prompt, (), s))}
    draws = []
    for _ in range(4000):
        out: list[int] = []
        while not out or (out[-1] != kc.EOS and len(out) < s.max_new_tokens):
            if tuple(out) not in laws:
                lg = kc.forward64(blind, prompt + out)[-1]
                laws[tuple(out)] = np.cumsum(np.exp(lg - lg.max()))
            c = laws[tuple(out)]
            out.append(int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(c) - 1)))
        draws.append((tuple(out), "stop" if out[-1] == kc.EOS else "length"))
    assert lc.exact_tests(draws, prompt, s, 1e-3, model)["verdict"] == "lossy"
