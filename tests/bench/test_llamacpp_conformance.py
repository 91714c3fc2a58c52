"""The exact-law tests of bench/engines/llamacpp_conformance.py have teeth: 4,000 draws sampled from the
exact law of a case pass (Holm at family-wise alpha 1e-3), and draws from a law that differs the way an
engine bug would (llama.cpp's top-p applied after temperature, as vLLM orders them; penalties dropped; the
first id from the plain law but the rest right) are found lossy; a greedy draw off the one sequence is
lossy; the greedy-draft expected acceptance is a probability. Numpy only, fixed seeds, about a second."""

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
