"""``audit_sequences(..., text=True)``: samplers that return text, audited soundly.

A text has many tokenizations; re-encoding a sampled text gives the canonical one, which the tiny
random-init target often does not write, so a per-token audit of re-encoded texts calls a lossless
sampler lossy (shown below). The text mode compares the sampler's texts with as many texts drawn
from the target itself (two-sample tests through one fixed map, :mod:`hsd_torch.auditing.text_sequences`).

Sizes: n = 400 sequences of 8 tokens per sample, two prompts (strata), family-wise alpha 1e-3
(Holm over 5 tests); the report states what that size detects (first-token homogeneity: TV about
0.36 per prompt; the rank tests: a shift of about 0.175 in P(A > B)), asserted below. Lossy samplers
used as teeth sit far beyond that: temperature 2 (p about 1e-20 here) and the drafter's own law
(p about 1e-74). The family's false-fail rate is checked by simulation in
tests/stats/test_twosample.py; these tests are runs at fixed seeds (the same answer on every
machine), not claims about rates.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_torch import generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.auditing.sequences import audit_sequences  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402

torch.set_num_threads(1)

PROMPTS = ["def foo(x):\n", "The cat"]
N, LEN, ALPHA = 400, 8, 1e-3


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any, Any, Any]:
    return tiny.tiny_pair()


def texts_of(pair: Any, method: str = "tli", temperature: float = 1.0, drafter_only: bool = False,
             do_sample: bool = True) -> Any:
    """A batched text sampler: hsd's ``method`` (or the drafter's own AR) decoded as the text mode asks."""
    target, tt, drafter, dt = pair

    def fn(prompts: list[str], seeds: list[int]) -> list[str]:
        model, tok = (drafter, dt) if drafter_only else (target, tt)
        uses_d = method != "ar"
        out = generate(model, drafter if uses_d else None, prompts, target_tokenizer=tok,
                       drafter_tokenizer=dt if uses_d else None, method=method, max_new_tokens=LEN, seed=seeds[0],
                       temperature=temperature, do_sample=do_sample)
        return [str(tok.decode(s, skip_special_tokens=True)) for s in out.sequences]
    return fn


def audit(pair: Any, fn: Any, **kw: Any) -> Any:
    target, tt, drafter, dt = pair
    kw.setdefault("max_detectable_tv", None)
    return audit_sequences(None, target, tt, PROMPTS, n=N, max_new_tokens=LEN, sample_batch_fn=fn, text=True,
                           drafter=drafter, drafter_tokenizer=dt, alpha=ALPHA, batch_size=64, **kw)


def test_a_lossless_text_sampler_passes_where_a_reencoding_audit_fails(pair: Any) -> None:
    """TLI's texts: lossless-consistent in text mode, with the stated power; the same texts
    re-encoded and audited token by token against the target's law: "lossy" (the unsound
    shortcut the text mode replaces)."""
    target, tt, *_ = pair
    rep = audit(pair, texts_of(pair))
    assert rep.verdict == "lossless-consistent", rep.reason
    assert rep.m == 5 and len(rep.tests) == 5 and rep.n == N
    assert rep.detectable_tv is not None and rep.detectable_tv < 0.4, rep.detectable_by
    assert "text mode" in rep.reason and "text mode" in rep.detectable_by
    enc = TokenText.get(tt, 384)
    fn = texts_of(pair)

    def reencoded(prompts: list[str], seeds: list[int]) -> list[list[int]]:
        return [enc.encode(t.encode(), free=True)[:LEN] for t in fn(prompts, seeds)]
    naive = audit_sequences(None, target, tt, PROMPTS, n=N, max_new_tokens=LEN, sample_batch_fn=reencoded,
                            alpha=ALPHA, batch_size=64, length_mismatch="prefix")
    assert naive.verdict == "lossy", naive.reason


@pytest.mark.parametrize("how", ["temperature 2", "the drafter's own law"])
def test_lossy_text_samplers_are_caught(pair: Any, how: str) -> None:
    fn = texts_of(pair, temperature=2.0) if how == "temperature 2" else texts_of(pair, "ar", drafter_only=True)
    rep = audit(pair, fn)
    assert rep.verdict == "lossy", rep.reason
    assert any(rej for rej in rep.holm_rejected)


def test_a_weak_promise_is_inconclusive(pair: Any) -> None:
    """With the default max_detectable_tv 0.1, 400 sequences (first-token TV about 0.36) are too few."""
    rep = audit(pair, texts_of(pair, "slem"), max_detectable_tv=0.1)
    assert rep.verdict == "inconclusive" and "above max_detectable_tv 0.1" in rep.reason, rep.reason


def test_greedy_texts_are_compared_exactly(pair: Any) -> None:
    ok = audit(pair, texts_of(pair, do_sample=False), do_sample=False)
    assert ok.verdict == "lossless-consistent", ok.reason
    good = texts_of(pair, do_sample=False)

    def one_off(prompts: list[str], seeds: list[int]) -> list[str]:
        return [t + ("!" if k == 3 else "") for k, t in enumerate(good(prompts, seeds))]
    bad = audit(pair, one_off, do_sample=False)
    assert bad.verdict == "lossy" and bad.malformed, bad.reason


def test_prompt_ids_and_refusals(pair: Any) -> None:
    target, tt, drafter, dt = pair
    ctx = [TokenText.get(tt, 384).prompt_ids(p) for p in PROMPTS]
    rep = audit_sequences(None, target, tt, None, n=N, max_new_tokens=LEN, sample_batch_fn=texts_of(pair, "ar"),
                          text=True, prompt_ids=ctx, alpha=ALPHA, batch_size=64, max_detectable_tv=None)
    assert rep.verdict == "lossless-consistent", rep.reason
    with pytest.raises(TypeError, match="not the new text"):
        audit_sequences(lambda p, s: [1, 2], target, tt, PROMPTS, n=2, max_new_tokens=2, text=True)
    with pytest.raises(ValueError, match="a law provider"):
        audit_sequences(lambda p, s: "x", target, tt, PROMPTS, n=2, max_new_tokens=2, text=True,
                        reference=lambda ids, new: torch.zeros(len(new), 384))
    with pytest.raises(ValueError, match="with text=True the sampler's texts"):
        audit_sequences(lambda p, s: "x", target, tt, PROMPTS, n=2, max_new_tokens=2, text=True,
                        length_mismatch="prefix")


def test_the_verdict_is_the_two_sample_audits_decision(pair: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The text mode gives no verdict of its own: the two-sample audit's ``decide`` is called once,
    max_detectable_tv among its doubts, and the report restates its answer."""
    import hsd_core.twosample as twosample

    calls: list[list[Any]] = []

    def fake(family: Any, *, failures: Any = (), doubts: Any = (), promise: Any) -> tuple[str, str]:
        calls.append(list(doubts))
        return "inconclusive", "the recorded verdict"
    monkeypatch.setattr(twosample, "decide", fake)
    rep = audit(pair, texts_of(pair, "ar"), max_detectable_tv=0.1)
    assert rep.verdict == "inconclusive" and rep.reason == "text mode (two samples of texts): the recorded verdict"
    assert len(calls) == 1 and any("above max_detectable_tv 0.1" in (d() or "") for d in calls[0])
