"""hsd_core.processing: each stage against a brute-force float64 formula on hand-made logits, each
engine's order against its stages composed by hand, the orders differing where the engines do, ties
that leave the law undetermined refused, and stop strings."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from hsd_core import processing as P
from hsd_core.samples import Sampling

X = np.array([2.0, 1.0, 0.5, 0.5, -1.0, -3.0])  # ids 0..5; 2 and 3 tie
S0 = Sampling(True, 1.0, None, None, 8)


def _probs(x: list[float]) -> list[float]:
    m = max(x)
    e = [math.exp(v - m) if v != -math.inf else 0.0 for v in x]
    return [v / sum(e) for v in e]


def _brute_top_p(x: list[float], p: float) -> list[float]:
    """Id i kept iff the mass of the ids ranked before it (more probable, or as probable with a lower id) is < p."""
    pr = _probs(x)
    out = []
    for i, v in enumerate(x):
        before = sum(pr[j] for j in range(len(x)) if pr[j] > pr[i] or (pr[j] == pr[i] and j < i))
        out.append(v if before < p or all(pr[j] <= pr[i] for j in range(len(x))) else -math.inf)
    return out


def _brute_top_k(x: list[float], k: int) -> list[float]:
    return [v if sum(1 for u in x if u > v) < k else -math.inf for v in x]


def _brute_min_p(x: list[float], m: float) -> list[float]:
    pr = _probs(x)
    return [v if pr[i] >= m * max(pr) else -math.inf for i, v in enumerate(x)]


@pytest.mark.parametrize("p", [0.3, 0.6, 0.62, 0.9, 0.999])
def test_top_p_against_brute_force(p: float) -> None:
    x = [3.0, 1.0, 0.25, -0.5, -2.0]
    assert P.keep_top_p(np.array(x), p).tolist() == _brute_top_p(x, p)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
def test_top_k_keeps_ties_against_brute_force(k: int) -> None:
    assert P.keep_top_k(X, k).tolist() == _brute_top_k(X.tolist(), k)


@pytest.mark.parametrize("m", [0.01, 0.1, 0.3, 0.5, 1.0])
def test_min_p_against_brute_force(m: float) -> None:
    assert P.keep_min_p(X, m).tolist() == _brute_min_p(X.tolist(), m)


def test_ambiguous_ties_are_refused() -> None:
    with pytest.raises(P.AmbiguousLawError, match="top-k 3"):
        P.keep_top_k(X, 3, ties="exact")  # ids 2 and 3 tie at the 3rd logit: llama.cpp keeps one of them
    assert np.isfinite(P.keep_top_k(X, 4, ties="exact")).sum() == 4
    with pytest.raises(P.AmbiguousLawError, match="top-p"):
        P.keep_top_p(np.zeros(4), 0.5)  # four ids of 1/4: two are kept, which two is the sort's choice


def test_penalties_against_brute_force() -> None:
    x = X.copy()
    got = P.penalize(x, {0, 4}, {0: 2, 1: 1}, 1.5, 0.25, 0.5)
    want = x.tolist()
    want[0] = 2.0 / 1.5 - (0.5 * 2 + 0.25)
    want[4] = -1.0 * 1.5
    want[1] = 1.0 - (0.5 * 1 + 0.25)
    assert got.tolist() == pytest.approx(want, abs=1e-15)


def test_bad_words_match_the_end_of_the_history() -> None:
    got = P.ban_bad_words(X, [[1], [2, 3], [4, 2, 5]], [0, 2])
    assert got.tolist() == [2.0, -math.inf, 0.5, -math.inf, -1.0, -3.0]  # [4, 2, 5] needs 4, 2 at the end


def _vllm_by_hand(s: Sampling, prompt: list[int], out: list[int], ends: set[int]) -> np.ndarray:
    x = X.tolist()
    if s.allowed_token_ids is not None:
        x = [v if i in s.allowed_token_ids else -math.inf for i, v in enumerate(x)]
    for w in s.bad_words_ids:
        if list(w[:-1]) == out[len(out) - len(w) + 1:] or len(w) == 1:
            x[w[-1]] = -math.inf
    if len(out) < s.min_tokens:
        for e in ends:
            x[e] = -math.inf
    for i, b in s.logit_bias:
        x[i] += b
    for i in set(prompt) | set(out):
        x[i] = x[i] / s.repetition_penalty if x[i] > 0 else x[i] * s.repetition_penalty
    for i in set(out):
        x[i] -= s.frequency_penalty * out.count(i) + s.presence_penalty
    x = [v / s.temperature for v in x]
    x = _brute_min_p(x, s.min_p or 0.0)
    x = _brute_top_k(x, s.top_k or len(x))
    x = _brute_top_p(x, s.top_p or 1.0)
    return np.array(_probs(x))


FULL = replace(S0, temperature=0.8, top_k=4, top_p=0.9, min_p=0.05, repetition_penalty=1.3, presence_penalty=0.2,
               frequency_penalty=0.1, logit_bias=((5, 2.0),), bad_words_ids=((2, 1),), allowed_token_ids=(0, 1, 2, 4, 5),
               min_tokens=3, order="vllm")


@pytest.mark.parametrize("out", [[], [2], [0, 2], [4, 4, 2]])
def test_vllm_order_against_its_stages_by_hand(out: list[int]) -> None:
    got = P.next_law(X, FULL, [0, 5], out, {4})
    assert got == pytest.approx(_vllm_by_hand(FULL, [0, 5], out, {4}), abs=1e-15)
    assert got.sum() == pytest.approx(1.0, abs=1e-12)


def test_orders_differ_where_the_engines_do() -> None:
    # llama.cpp truncates before temperature: top-p 0.7 on the untempered law keeps ids 0 and 1 only;
    # vLLM tempers first (T = 3 flattens it), and its top-p keeps more
    s = replace(S0, temperature=3.0, top_p=0.7)
    v = P.next_law(X, replace(s, order="vllm"), [], [], ())
    c = P.next_law(X, replace(s, order="llama.cpp"), [], [], ())
    assert (c > 0).sum() == 2 and (v > 0).sum() > 2
    # min-p before top-p (vLLM) or after (transformers): the same set here, other laws with top-k in between
    s2 = replace(S0, top_k=3, min_p=0.2, order="vllm")
    with pytest.raises(P.AmbiguousLawError):
        P.next_law(X, replace(s2, order="llama.cpp"), [], [], ())  # exactly 3 of ids 0, 1 and the tied 2, 3
    # presence / frequency act on the output only in vLLM, on prompt and output in llama.cpp
    s3 = replace(S0, presence_penalty=1.0, order="vllm")
    assert P.next_law(X, s3, [0], [], ()).tolist() == P.next_law(X, S0, [0], [], ()).tolist()
    assert P.next_law(X, replace(s3, order="llama.cpp"), [0], [], ())[0] < P.next_law(X, S0, [0], [], ())[0]
    # bad words see the prompt in transformers, not in vLLM
    s4 = replace(S0, bad_words_ids=((0, 1),), order="vllm")
    assert P.next_law(X, s4, [0], [], ())[1] > 0
    assert P.next_law(X, replace(s4, order="transformers"), [0], [], ())[1] == 0


def test_min_tokens_holds_back_the_end_ids_then_releases_them() -> None:
    s = replace(S0, min_tokens=2, order="vllm")
    assert P.next_law(X, s, [0], [1], {0})[0] == 0
    assert P.next_law(X, s, [0], [1, 1], {0})[0] > 0


def test_greedy_is_the_argmax_after_the_processing_before_temperature() -> None:
    s = Sampling(False, 1.0, None, None, 8, logit_bias=((1, 1.5),), order="vllm")
    assert P.next_law(X, s, [], [], ()).tolist() == [0, 1, 0, 0, 0, 0]


def test_settings_an_engine_lacks_are_refused_for_its_order() -> None:
    with pytest.raises(ValueError, match="min_tokens is not a llama.cpp"):
        P.next_law(X, replace(S0, min_tokens=1, order="llama.cpp"), [], [], ())
    with pytest.raises(ValueError, match="presence_penalty is not a transformers"):
        P.next_law(X, replace(S0, presence_penalty=1.0, order="transformers"), [], [], ())


def test_stop_strings_over_text_with_overhangs() -> None:
    st = P.StopStrings([b"ab"], [b"xa"])
    assert st.first_stop(0, [b"b", b"c"]) == 0  # the prompt's "a" and the first token's "b"
    st = P.StopStrings([b"ab"], [P.stop_text_prefix("vllm", b"xa")])
    assert st.first_stop(0, [b"b", b"cab", b"d"]) == 1  # vLLM reads the output text only
