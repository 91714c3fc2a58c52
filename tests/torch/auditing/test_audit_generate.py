"""``hsd_torch.auditing.first_tokens.audit_generate``: any ``sample_fn(prompt, seed)``
against the target's own law of its first new tokens.

Sizes (stated per test and asserted from the report): family-wise alpha 1e-3 (Holm over the joint,
positional and conditional tests); top-k 3 over a tiny Llama target (byte-level BPE, 384 ids), so
the first two tokens have at most 9 outcomes. N = 800 draws detect TV <= 0.2 with power 0.99; the
lossy samplers (temperature 2 instead of 1: TV about 0.3 here; the drafter sampled instead of the
target) are rejected at that size. The slow test runs the default N = 20,000 over the full
384-id vocabulary (no top-k), with the rare tail pooled.
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_torch import generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.auditing.first_tokens import ANY, RARE, audit_generate  # noqa: E402

torch.set_num_threads(1)

ALPHA = 1e-3
N = 800
TOP_K = 3
MAX_TV = 0.2  # detectable TV at N with power 0.99 (asserted)
PROMPT = "def foo(x):\n"


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any, Any, Any]:
    return tiny.tiny_pair()


def hsd_sampler(pair: tuple[Any, Any, Any, Any], prompt: str, seed: int, *, method: str = "tli",
                temperature: float = 1.0, top_k: int | None = TOP_K) -> list[int]:
    target, tt, drafter, dt = pair
    use_d = method != "ar"
    out = generate(target, drafter if use_d else None, prompt, target_tokenizer=tt,
                   drafter_tokenizer=dt if use_d else None, method=method, lookahead=2, max_new_tokens=2,
                   seed=seed, temperature=temperature, top_k=top_k)
    return out.sequences[0]


def test_hsd_torch_generate_is_lossless_consistent(pair: Any) -> None:
    target, tt, *_ = pair
    rep = audit_generate(functools.partial(hsd_sampler, pair), target, tt, PROMPT, n=N, top_k=TOP_K,
                         alpha=ALPHA, seed=1, mask_textless=True, max_detectable_tv=MAX_TV)
    assert rep.verdict == "lossless-consistent", rep.reason
    assert rep.detectable_tv is not None and rep.detectable_tv <= MAX_TV
    assert rep.tv_ci[0] <= rep.tv_corrected <= rep.tv_ci[1]
    md = rep.to_markdown()
    assert "lossless-consistent" in md and "Most over-represented" in md


def test_wrong_temperature_is_lossy(pair: Any) -> None:
    target, tt, *_ = pair
    rep = audit_generate(functools.partial(hsd_sampler, pair, method="ar", temperature=2.0), target, tt, PROMPT,
                         n=N, top_k=TOP_K, alpha=ALPHA, seed=2, mask_textless=True)
    assert rep.verdict == "lossy"
    assert rep.tv_estimate > rep.tv_null_q95
    assert rep.over and rep.under and all(isinstance(d.text, str) for d in rep.over)


def test_sampling_the_drafter_is_lossy(pair: Any) -> None:
    """A sampler that emits the drafter's tokens re-encoded for the target (no verification)."""
    target, tt, drafter, dt = pair

    def from_drafter(prompt: str, seed: int) -> list[int]:
        out = generate(drafter, None, prompt, target_tokenizer=dt, method="ar", max_new_tokens=2, seed=seed,
                       top_k=TOP_K)
        return list(tt(out.texts[0], add_special_tokens=False)["input_ids"])[:2]

    rep = audit_generate(from_drafter, target, tt, PROMPT, n=N, top_k=TOP_K, alpha=ALPHA, seed=3, mask_textless=True)
    assert rep.verdict == "lossy"


def test_greedy_is_token_identity(pair: Any) -> None:
    target, tt, *_ = pair
    good = functools.partial(hsd_sampler, pair, top_k=None)
    greedy = lambda p, s: generate(target, *pair[2:3], p, target_tokenizer=tt, drafter_tokenizer=pair[3],  # noqa: E731
                                   method="tli", max_new_tokens=2, do_sample=False).sequences[0]
    rep = audit_generate(greedy, target, tt, PROMPT, n=30, do_sample=False, seed=0, mask_textless=True,
                         max_detectable_tv=MAX_TV)  # 30 exact draws: TV 0.142 with power 0.99
    assert rep.verdict == "lossless-consistent" and rep.detectable_tv is not None
    bad = audit_generate(good, target, tt, PROMPT, n=30, do_sample=False, seed=0, mask_textless=True)
    assert bad.verdict == "lossy"


def test_threads_give_the_serial_result(pair: Any) -> None:
    target, tt, *_ = pair
    f = functools.partial(hsd_sampler, pair, method="ar")
    kw: dict[str, Any] = dict(n=200, top_k=TOP_K, alpha=ALPHA, seed=5, mask_textless=True, chunk_size=50)
    serial = audit_generate(f, target, tt, PROMPT, **kw)
    with ThreadPoolExecutor(2) as ex:
        par = audit_generate(f, target, tt, PROMPT, executor=ex, **kw)
    assert dict(serial.core.observed) == dict(par.core.observed)
    assert serial.tv_estimate == par.tv_estimate


def test_cells_pool_the_tail() -> None:
    from hsd_torch.auditing.first_tokens import Reference
    ref = Reference({(1, 2): 0.5, (1, RARE): 0.2, (RARE, ANY): 0.2, (3, ANY): 0.1}, 2, frozenset({9}),
                    kept={(): frozenset({1, 3}), (1,): frozenset({2})}, zero={(): frozenset({7}), (1,): frozenset()},
                    frequent=(), coarse_mass=0.5, forward_passes=2)
    assert ref.cell([1, 2, 5]) == (1, 2)
    assert ref.cell([1, 4]) == (1, RARE)
    assert ref.cell([5, 4]) == (RARE, ANY)
    assert ref.cell([3, 4]) == (3, ANY)
    assert ref.cell([7, 4]) == (7,)      # probability 0: outside the law
    assert ref.cell([9, 4]) == (RARE, ANY)  # EOS ends the output
    assert ref.cell([1]) == (1,)         # stopped early: outside the law


@pytest.mark.slow
def test_default_size_full_vocabulary(pair: Any) -> None:
    """N = 20,000 (the default), no top-k: 384 ids per position, the rare tail pooled."""
    target, tt, *_ = pair
    rep = audit_generate(functools.partial(hsd_sampler, pair, top_k=None), target, tt, PROMPT, alpha=ALPHA, seed=4,
                         mask_textless=True)
    assert rep.verdict == "lossless-consistent", rep.reason
    bad = audit_generate(functools.partial(hsd_sampler, pair, method="ar", top_k=None, temperature=1.3), target, tt,
                         PROMPT, alpha=ALPHA, seed=4, mask_textless=True)
    assert bad.verdict == "lossy"


def test_the_tv_estimate_lies_inside_its_interval() -> None:
    """The report once printed "0.07856 ... interval 0.04204 to 0.06321" (the plug-in TV is biased
    upward, the basic bootstrap interval corrects for it). The reported estimate is now the
    bias-corrected one, inside the interval on every table; the plug-in is kept for the null
    comparison. Tables: near-lossless and lossy counts on 3 to 60 cells, several sizes and seeds,
    including ones where the plug-in falls outside its interval (counted, so the test can fail)."""
    import numpy as np

    from hsd_torch.auditing.first_tokens import _tv_stats

    rng = np.random.default_rng(0)
    outside = 0
    for trial in range(200):
        k = int(rng.integers(3, 60))
        p = rng.dirichlet(np.ones(k))
        q = p if trial % 2 else rng.dirichlet(np.ones(k))
        n = int(rng.choice([50, 500, 5000]))
        counts = rng.multinomial(n, q)
        law = {(i,): float(p[i]) for i in range(k)}
        obs = {(i,): int(c) for i, c in enumerate(counts) if c}
        est, (lo, hi), _, corrected = _tv_stats(law, obs, n, seed=trial)
        assert lo <= corrected <= hi, (trial, est, lo, hi, corrected)
        outside += not lo <= est <= hi
    assert outside > 0  # the plug-in alone does leave its interval on some of these tables


def test_a_batched_sampler_gives_the_per_draw_report(pair: Any) -> None:
    """sample_batch_fn gets the seeds the draws would get one by one, so a batched sampler that
    returns sample_fn(prompt, seed) for each row gives the very same report."""
    target, tt, *_ = pair
    f = functools.partial(hsd_sampler, pair, method="ar")
    kw: dict[str, Any] = {"n": 200, "top_k": TOP_K, "seed": 5, "max_detectable_tv": None, "chunk_size": 64}
    one = audit_generate(f, target, tt, PROMPT, **kw)
    calls: list[int] = []

    def batch(prompts: list[str], seeds: list[int]) -> list[list[int]]:
        calls.append(len(prompts))
        return [f(p, s) for p, s in zip(prompts, seeds)]
    many = audit_generate(None, target, tt, PROMPT, sample_batch_fn=batch, batch_size=50, **kw)
    assert calls == [50, 50, 50, 50]
    assert many.core.observed == one.core.observed and many.verdict == one.verdict
    with pytest.raises(TypeError, match="exactly one"):
        audit_generate(f, target, tt, PROMPT, sample_batch_fn=batch, n=10)


def test_a_weak_promise_is_inconclusive(pair: Any) -> None:
    target, tt, *_ = pair
    rep = audit_generate(functools.partial(hsd_sampler, pair, method="ar"), target, tt, PROMPT, n=100, top_k=TOP_K,
                         seed=2)
    assert rep.verdict == "inconclusive", rep.reason
    assert "above max_detectable_tv 0.1" in rep.reason
    assert "draws would reach it" in rep.reason or "more draws expand more of them" in rep.reason
    with pytest.raises(ValueError, match="max_detectable_tv"):
        audit_generate(functools.partial(hsd_sampler, pair), target, tt, PROMPT, n=10, max_detectable_tv=0)


def test_prompt_plus_new_ids_is_named(pair: Any) -> None:
    target, tt, *_ = pair
    ids = tt(PROMPT)["input_ids"]
    rep = audit_generate(lambda p, s: ids + hsd_sampler(pair, p, s, method="ar"), target, tt, PROMPT, n=100,
                         top_k=TOP_K, seed=2)
    assert rep.verdict == "lossy" and "start with the prompt's own ids" in rep.reason


def test_only_significant_cells_are_listed_and_ambiguous_text_is_named(pair: Any) -> None:
    """A lossless sampler's table lists no cell as over- or under-represented (each cell's deviation
    is within chance at 1% / cells); a cell decoding to U+FFFD shows its token form."""
    from hsd_torch.auditing.first_tokens import _decode

    target, tt, drafter, dt = pair

    def batch(prompts: list[str], seeds: list[int]) -> list[list[int]]:
        return generate(target, drafter, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method="tli",
                        lookahead=2, max_new_tokens=2, seed=seeds[0], top_k=TOP_K).sequences
    rep = audit_generate(None, target, tt, PROMPT, n=N, top_k=TOP_K, seed=1, mask_textless=True,
                         max_detectable_tv=MAX_TV, sample_batch_fn=batch, batch_size=200)
    assert rep.verdict == "lossless-consistent" and rep.over == () and rep.under == ()
    byte_id = next(i for i in range(len(tt)) if "\ufffd" in tt.decode([i]))
    assert "token" in _decode(tt, (byte_id, ANY)) and "<any>" in _decode(tt, (byte_id, ANY))


def test_plot_labels_cells_by_text_and_ids(pair: Any, tmp_path: Any) -> None:
    target, tt, *_ = pair
    rep = audit_generate(functools.partial(hsd_sampler, pair), target, tt, PROMPT, n=100, top_k=TOP_K, seed=1,
                         mask_textless=True, max_detectable_tv=None)
    path = tmp_path / "cells.png"
    assert rep.save_plot(str(path), tokenizer=tt) == path.exists()


def test_each_position_states_its_own_promise(pair: Any) -> None:
    """The report gives each position's detectable TV (its test's, plus the mass of the coarse cells
    there); the first position, with fewer cells than the joint table, promises no more than the
    whole table does and is printed."""
    target, tt, *_ = pair
    rep = audit_generate(functools.partial(hsd_sampler, pair), target, tt, PROMPT, n=N, top_k=TOP_K, seed=1,
                         mask_textless=True, max_detectable_tv=MAX_TV)
    assert len(rep.position_detectable) == 2 and len(rep.core.position_detectable) == 2
    d0 = rep.position_detectable[0]
    assert d0 is not None and rep.detectable_tv is not None and d0 <= rep.detectable_tv
    assert "position 0: " in rep.to_markdown()


def test_a_lossy_sampler_is_told_what_it_fits(pair: Any) -> None:
    """A sampler that ignores the claimed top-k (it samples the whole law at temperature 1): the
    reason says that the draws fit temperature 1 without truncation better than the claim."""
    target, tt, *_ = pair
    rep = audit_generate(functools.partial(hsd_sampler, pair, method="ar", top_k=None), target, tt, PROMPT, n=300,
                         top_k=TOP_K, seed=3)
    assert rep.verdict == "lossy" and "fit best temperature 1" in rep.reason and "without top-k" in rep.reason, \
        rep.reason


def test_text_mode(pair: Any) -> None:
    """text=True: the sampler returns the new text of its first two tokens; cells are texts (several
    token pairs decoding alike add up). N = 800 draws at top-k 3 (at most 9 token pairs, no pooled
    cell): lossless-consistent; at temperature 2 (TV about 0.3 on the ids): lossy; a text the target
    cannot write there: lossy; no top-k (pooled cells): refused; a non-str output: TypeError."""
    target, tt, *_ = pair

    def as_text(temperature: float = 1.0) -> Any:
        def fn(prompt: str, seed: int) -> str:
            ids = hsd_sampler(pair, prompt, seed, temperature=temperature)
            return str(tt.decode(ids, skip_special_tokens=True))
        return fn
    ok = audit_generate(as_text(), target, tt, PROMPT, n=N, top_k=TOP_K, seed=1, text=True, max_detectable_tv=MAX_TV)
    assert ok.verdict == "lossless-consistent", ok.reason
    assert ok.cells <= TOP_K ** 2 and all(isinstance(d.text, str) for d in ok.over + ok.under)
    hot = audit_generate(as_text(2.0), target, tt, PROMPT, n=N, top_k=TOP_K, seed=2, text=True)
    assert hot.verdict == "lossy", hot.reason
    odd = audit_generate(lambda p, s: "\u2603 not a likely text", target, tt, PROMPT, n=N, top_k=TOP_K, text=True)
    assert odd.verdict == "lossy"
    with pytest.raises(ValueError, match="text=True needs every cell"):
        audit_generate(as_text(), target, tt, PROMPT, n=50, text=True)
    with pytest.raises(TypeError, match="not the new text"):
        audit_generate(lambda p, s: [1, 2], target, tt, PROMPT, n=N, top_k=TOP_K, text=True)


PLAN_N = 200


def test_the_plan_is_stated_before_the_first_draw(pair: Any) -> None:
    """``progress`` gets one ``plan:`` line before the sampler is first called, and the TV it promises
    is exactly the report's ``detectable_tv`` (ids mode with its conditional tests, and text mode).
    N = 200 at top-k 3, alpha 1e-3 (the plan is what is checked here, not the verdict)."""
    target, tt, *_ = pair
    calls: list[int] = []
    lines: list[tuple[str, int]] = []

    def counted(prompt: str, seed: int) -> list[int]:
        calls.append(seed)
        return hsd_sampler(pair, prompt, seed)

    rep = audit_generate(counted, target, tt, PROMPT, n=PLAN_N, top_k=TOP_K, alpha=ALPHA, seed=1, mask_textless=True,
                         progress=lambda line: lines.append((line, len(calls))))
    assert len(lines) == 1 and lines[0][1] == 0, lines  # said before any draw
    assert rep.detectable_tv is not None
    assert lines[0][0].startswith(f"plan: {PLAN_N} draws of the first 2 token(s)")
    assert f"TV >= {rep.detectable_tv:.4g} from the target's" in lines[0][0], (lines, rep.detectable_tv)

    said: list[str] = []

    def as_text(prompt: str, seed: int) -> str:
        return str(tt.decode(hsd_sampler(pair, prompt, seed), skip_special_tokens=True))

    txt = audit_generate(as_text, target, tt, PROMPT, n=PLAN_N, top_k=TOP_K, alpha=ALPHA, seed=1, text=True,
                         progress=said.append)
    assert txt.detectable_tv is not None and f"TV >= {txt.detectable_tv:.4g} " in said[0], (said, txt.detectable_tv)


def test_a_plan_without_power_says_so(pair: Any) -> None:
    """5 draws over the full vocabulary promise nothing: the plan line says more draws are needed
    (and the report, as before, is inconclusive)."""
    target, tt, *_ = pair
    said: list[str] = []
    rep = audit_generate(functools.partial(hsd_sampler, pair, top_k=None), target, tt, PROMPT, n=5, seed=0,
                         progress=said.append)
    assert said and "no TV below 1 can be promised at this size" in said[0], said
    assert rep.detectable_tv is None and rep.verdict == "inconclusive"


def test_the_verdict_is_decides_answer_with_this_audits_doubts(pair: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """audit_generate gives no verdict of its own: hsd_core's ``decide`` is called once (by
    ``audit_sampler``) and its answer is the report's; the coarse cells' mass and max_detectable_tv
    are among the doubts it was handed (at n = 100 the promise is above 0.1, as in
    test_a_weak_promise_is_inconclusive), and the report's detectable TV is the core's plus that mass."""
    import hsd_core.audit as core_audit

    target, tt, *_ = pair
    calls: list[list[Any]] = []

    def fake(family: Any, *, failures: Any = (), doubts: Any = (), promise: Any) -> tuple[str, str]:
        calls.append(list(doubts))
        return "inconclusive", "the recorded verdict"
    monkeypatch.setattr(core_audit, "decide", fake)
    rep = audit_generate(functools.partial(hsd_sampler, pair, method="ar"), target, tt, PROMPT, n=100, top_k=TOP_K,
                         seed=2)
    assert (rep.verdict, rep.reason) == ("inconclusive", "the recorded verdict") and len(calls) == 1
    said = [d() for d in calls[0]]
    assert any(r is not None and "above max_detectable_tv 0.1" in r for r in said), said
    assert rep.core.detectable_tv is not None and rep.detectable_tv == rep.core.detectable_tv + rep.coarse_mass
