"""hsd_torch.generate against the reference and against the target itself.

- Mirror: the backend records the uniforms each row consumed; ``hsd_core``'s method over the same
  models (``hsd_torch.CoreModel``, float64), fed them through ``UniformRand``, emits the same ids.
- Greedy: every method equals the target's own ``model.generate(do_sample=False)`` (with the
  ids without text suppressed, as the backend's processed law does), batched and unbatched.
- Sampled: the law of the first two new tokens from the target's own forward passes against
  20,000 samples (``hsd_core.stats``, alpha and detectable TV stated), and a lossy backend
  variant that the same test rejects.
- The models are never modified.

Models: random-init tiny GPT-2 and Llama with peaked heads (``hsd_torch.models.tiny``), float64 on the
CPU, over three locally trained tokenizers (byte-level BPE 384 ids, Unigram + byte fallback
about 520, LLaMA-style BPE + byte fallback about 448), one drafter and one target with an
embedding wider than their tokenizer.
"""

from __future__ import annotations

import functools

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.methods import AR, SD, SLEM, SLRS, TLI  # noqa: E402
from hsd_core.methods import Resync  # noqa: E402
from hsd_core.methods.base import Method  # noqa: E402
from hsd_core.rand import UniformRand  # noqa: E402
from hsd_core.stats import assert_law_matches, min_num_samples_for_tv, min_tv_detectable  # noqa: E402
from _torch_checks import fingerprint  # noqa: E402
from hsd_torch import CoreModel, generate  # noqa: E402
from hsd_torch.engine import kernels  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.models.mirror import core_text, target_greedy, target_two_token_law  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402
generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only: the mirror's setting

torch.set_num_threads(1)

PROMPTS = [
    "def foo(x):\n", "Hello", "import os\nimport sys\n", "x", " leading space", "naïve café",
    "日本語", "\t\tindent", "return self.", "# comment\n", "class A:", "    ", "1 + 2 = ", "emoji 😀",
    "if __name__ == '__main__':", "aaaaa", "for i in range(10):\n    ", 'print("hi")', "lambda", "\n\n",
]
FAST = 8  # prompts per mirror case in the fast tier
ALL_PROMPTS = PROMPTS + [f"value_{i} = {i * 7 % 13}" for i in range(40)]  # 60, for the slow tier



# (name, target model, target tokenizer, drafter model, drafter tokenizer, drafter temperature)
PAIRS = {
    "bpe<-unigram": ("llama_bpe", "byte_bpe", "gpt2_uni_pad", "unigram", None),
    "fallback<-bpe": ("gpt2_fb_pad", "bpe_fallback", "llama_bpe", "byte_bpe", None),
    "unigram<-fallback": ("gpt2_uni_pad", "unigram", "gpt2_fb_pad", "bpe_fallback", None),
    "bpe<-self": ("llama_bpe", "byte_bpe", "llama_bpe", "byte_bpe", 1.5),  # high acceptance, q != p
    "bpe<-gpt2": ("llama_bpe", "byte_bpe", "gpt2_bpe", "byte_bpe", None),
}
HETERO = ["bpe<-unigram", "fallback<-bpe", "unigram<-fallback", "bpe<-self"]
SAME = ["bpe<-self", "bpe<-gpt2"]
CASES = ([("ar", "bpe<-unigram"), ("ar", "fallback<-bpe")] + [("sd", p) for p in SAME]
         + [(m, p) for m in ("tli", "slem") for p in HETERO])
# SLRS (lookahead 1): its reference computes psi in pure Python over the drafter's whole vocabulary
# for every state, so the fast tier mirrors one pair and the slow tier all of them.
SLRS_CASES = [("slrs", p) for p in HETERO]
FAST_CASES = CASES + SLRS_CASES[:1]
GREEDY_CASES = CASES + SLRS_CASES


def core_method(method: str, lookahead: int, greedy: bool = False, resync: Resync | None = None) -> Method:
    if method == "ar":
        return AR(greedy=greedy)
    if method == "slrs":
        return SLRS(lookahead=1, lookbehind=0, greedy=greedy, resync=resync)
    if method == "slem":
        return SLEM(lookahead=lookahead, greedy=greedy, resync=resync)
    cls = {"sd": SD, "tli": TLI}[method]
    return cls(lookahead=lookahead, greedy=greedy)  # type: ignore[no-any-return]


def unpack(pair: str, toks: dict[str, Any], models: dict[str, Any]) -> tuple[Any, Any, Any, Any, float | None]:
    t, tt, d, dt, dtemp = PAIRS[pair]
    return models[t], toks[tt], models[d], toks[dt], dtemp


# ---------------------------------------------------------------------------------------------
# mirror


def check_mirror(method: str, pair: str, prompts: list[str], toks: dict[str, Any], models: dict[str, Any],
                 resync: Resync | None = None, **process: Any) -> None:
    """hsd_torch's output equals the reference's fed the same uniforms (``resync``: the drafter's
    re-sync rule, on both sides)."""
    target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
    lookahead, max_new = (1 if method == "slrs" else 3), 10
    use_drafter = method != "ar"
    extra = {} if resync is None else {"resync": resync}
    out = generate(target, drafter if use_drafter else None, prompts, target_tokenizer=tt,
                   drafter_tokenizer=dt if use_drafter else None, method=method, lookahead=lookahead,
                   max_new_tokens=max_new, seed=11, record_uniforms=True, drafter_temperature=dtemp, **extra, **process)
    assert out.uniforms is not None
    ct = CoreModel(target, tt, **process)
    dprocess = dict(process, temperature=dtemp if dtemp is not None else process.get("temperature", 1.0))
    cd = CoreModel(drafter, dt, **dprocess) if use_drafter else None
    ref_method = core_method(method, lookahead, resync=resync)
    for i, prompt in enumerate(prompts):
        rand = UniformRand(out.uniforms[i])
        ref = ref_method.generate(ct, cd, core_text(prompt), max_new, rng=rand)
        assert ct.tokenizer.to_hf(ref) == out.sequences[i], (method, pair, prompt)
        assert rand.used == len(out.uniforms[i]), "the backend recorded a uniform the reference did not read"


@pytest.mark.parametrize("method,pair", FAST_CASES)
def test_mirror_reference_emits_the_same_tokens(method: str, pair: str, toks: dict[str, Any],
                                                models: dict[str, Any]) -> None:
    check_mirror(method, pair, PROMPTS[:FAST // 2 if method == "slrs" else FAST], toks, models)


@pytest.mark.parametrize("method,pair,resync", [("slem", "fallback<-bpe", Resync(3, 1)), ("slem", "bpe<-unigram", Resync(2, 0)),
                                               ("slrs", "unigram<-fallback", Resync(2, 0))])
def test_mirror_incremental_resync(method: str, pair: str, resync: Resync, toks: dict[str, Any],
                                   models: dict[str, Any]) -> None:
    """The drafter's incremental re-sync is hsd_core's rule over bytes: at strides of 2-3 bytes (a
    cut every few bytes) the reference under the same rule emits the same tokens (the contexts
    themselves are compared in test_resync_torch.py)."""
    check_mirror(method, pair, PROMPTS[:FAST], toks, models, resync=resync)


@pytest.mark.parametrize("method,pair", [("tli", "bpe<-unigram"), ("slem", "fallback<-bpe"), ("sd", "bpe<-self")])
def test_mirror_with_processing(method: str, pair: str, toks: dict[str, Any], models: dict[str, Any]) -> None:
    check_mirror(method, pair, PROMPTS[:FAST], toks, models, temperature=0.8, top_k=40, top_p=0.9)


@pytest.mark.slow
@pytest.mark.parametrize("method,pair", SLRS_CASES[1:])
def test_mirror_slrs_other_pairs(method: str, pair: str, toks: dict[str, Any], models: dict[str, Any]) -> None:
    check_mirror(method, pair, PROMPTS[:FAST], toks, models)


@pytest.mark.slow
@pytest.mark.parametrize("method,pair", CASES + SLRS_CASES)
def test_mirror_many_prompts(method: str, pair: str, toks: dict[str, Any], models: dict[str, Any]) -> None:
    check_mirror(method, pair, ALL_PROMPTS, toks, models)


# ---------------------------------------------------------------------------------------------
# greedy


@pytest.mark.parametrize("method,pair", GREEDY_CASES)
def test_greedy_equals_the_targets_own_generate(method: str, pair: str, toks: dict[str, Any],
                                                models: dict[str, Any]) -> None:
    target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
    use_drafter = method != "ar"
    prompts = PROMPTS
    kw: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=dt if use_drafter else None, method=method,
                              lookahead=1 if method == "slrs" else 3, max_new_tokens=12, do_sample=False, drafter_temperature=dtemp)
    batched = generate(target, drafter if use_drafter else None, prompts, **kw)
    for i, prompt in enumerate(prompts):
        want = target_greedy(target, tt, prompt, 12)
        assert batched.sequences[i] == want, (i, prompt)
        if i < 3:
            alone = generate(target, drafter if use_drafter else None, [prompt], **kw)
            assert alone.sequences[0] == want


# ---------------------------------------------------------------------------------------------
# sampled: the law of the first two tokens

ALPHA = 1e-6
POWER = 0.99
EPS = 0.04  # detectable TV with power 0.99 at alpha 1e-6 on <= 36 cells with 20,000 samples
N = 20_000
CHUNK = 2_500
TOP_K = 6


def exact_two_token_law(model: Any, tok: Any, prompt: str) -> dict[tuple[int, ...], float]:
    """P(first two new tokens) under the processed law (top-k 6), exact: an EOS first token ends
    the sequence (outcome ``(eos,)``)."""
    return target_two_token_law(model, tok, prompt, top_k=TOP_K)


def sampled_two_tokens(method: str, pair: str, toks: dict[str, Any], models: dict[str, Any], prompt: str,
                       seed: int) -> list[tuple[int, ...]]:
    target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
    use_drafter = method != "ar"
    out: list[tuple[int, ...]] = []
    for c in range(N // CHUNK):
        res = generate(target, drafter if use_drafter else None, [prompt] * CHUNK, target_tokenizer=tt,
                       drafter_tokenizer=dt if use_drafter else None, method=method,
                       lookahead=1 if method == "slrs" else 2, max_new_tokens=2,
                       top_k=TOP_K, seed=seed * 1000 + c, drafter_temperature=dtemp)
        out.extend(tuple(s) for s in res.sequences)
    return out


def test_the_sampled_test_is_sized() -> None:
    k = TOP_K * TOP_K
    assert min_num_samples_for_tv(k, EPS, ALPHA, POWER) <= N
    assert min_tv_detectable(k, N, ALPHA, POWER) <= EPS


@pytest.fixture()
def lossy_accept(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A deliberately lossy backend: the ratio test reads ``u / 4`` (accepts drafts too often), in
    the verification ``generate`` runs (``kernels._rejection_host``, the host-list form of
    ``rejection_verify``)."""
    real = kernels._rejection_host

    def lossy(p: Any, q: Any, drafts: Any, n: Any, ua: Any, uf: Any, **kw: Any) -> Any:
        return real(p, q, drafts, n, None if ua is None else [[x * 0.25 for x in row] for row in ua], uf, **kw)

    monkeypatch.setattr(kernels, "_rejection_host", lossy)
    yield


def test_sampled_tli_law_of_first_two_tokens(toks: dict[str, Any], models: dict[str, Any]) -> None:
    """TLI with the target as its own drafter at drafter temperature 1.5 (same support, q != p, so
    that acceptance is high and a wrong ratio test shows)."""
    target, tt, *_ = unpack("bpe<-self", toks, models)
    prompt = "def foo(x):\n"
    law = exact_two_token_law(target, tt, prompt)
    assert len(law) <= TOP_K * TOP_K
    assert_law_matches(law, sampled_two_tokens("tli", "bpe<-self", toks, models, prompt, seed=1), alpha=ALPHA,
                       eps=EPS, power=POWER)


def test_sampled_lossy_variant_is_rejected(toks: dict[str, Any], models: dict[str, Any],
                                           lossy_accept: None) -> None:
    target, tt, *_ = unpack("bpe<-self", toks, models)
    prompt = "def foo(x):\n"
    law = exact_two_token_law(target, tt, prompt)
    with pytest.raises(AssertionError, match="rejected"):
        assert_law_matches(law, sampled_two_tokens("tli", "bpe<-self", toks, models, prompt, seed=2), alpha=ALPHA,
                           eps=EPS, power=POWER)


@pytest.mark.slow
@pytest.mark.parametrize("method,pair", [("ar", "bpe<-unigram"), ("sd", "bpe<-self"), ("tli", "bpe<-unigram"),
                                         ("slem", "bpe<-unigram"), ("slem", "bpe<-self"),
                                         ("tli", "fallback<-bpe"), ("slrs", "bpe<-unigram"), ("slrs", "bpe<-self")])
def test_sampled_law_of_first_two_tokens(method: str, pair: str, toks: dict[str, Any],
                                         models: dict[str, Any]) -> None:
    target, tt, *_ = unpack(pair, toks, models)
    prompt = "import os\n"
    law = exact_two_token_law(target, tt, prompt)
    assert_law_matches(law, sampled_two_tokens(method, pair, toks, models, prompt, seed=3), alpha=ALPHA, eps=EPS,
                       power=POWER)


# ---------------------------------------------------------------------------------------------
# the models are never modified; batching; refusals


def test_models_are_not_modified(toks: dict[str, Any], models: dict[str, Any]) -> None:
    before = {k: fingerprint(m) for k, m in models.items()}
    for method, pair in CASES + SLRS_CASES[:1]:
        target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
        d = drafter if method != "ar" else None
        for sample in (True, False):
            generate(target, d, PROMPTS[:3], target_tokenizer=tt, drafter_tokenizer=dt if d is not None else None,
                     method=method, lookahead=1 if method == "slrs" else 2, max_new_tokens=5, do_sample=sample, top_p=0.95,
                     drafter_temperature=dtemp)
    assert {k: fingerprint(m) for k, m in models.items()} == before


@pytest.mark.parametrize("method", ["tli", "slem", "slrs"])
def test_a_rows_output_depends_only_on_seed_and_row(method: str, toks: dict[str, Any], models: dict[str, Any]) -> None:
    """Also ties the two ways a cache is kept: a batch of one row (no mask: a re-sync crops) and a
    batch of several (mask, holes, padding) give the same row."""
    target, tt, drafter, dt, _ = unpack("bpe<-unigram", toks, models)

    def run(prompts: list[str]) -> list[list[int]]:
        return generate(target, drafter, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method=method,
                        lookahead=1 if method == "slrs" else 3, max_new_tokens=8, seed=5).sequences

    alone = run(["Hello"])
    with_others = run(["Hello", "def foo(x):\n", "x"])
    assert with_others[0] == alone[0]
    assert run(["x", "x"])[1] == run(["def", "x"])[1]
    same = run(["Hello"] * 6)
    assert len({tuple(s) for s in same}) > 1, "identical prompts in one batch must be independent samples"


def test_refusals(toks: dict[str, Any], models: dict[str, Any]) -> None:
    target, tt, drafter, dt, _ = unpack("bpe<-unigram", toks, models)
    kw: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=dt)
    with pytest.raises(NotImplementedError, match="lookahead=1 only.*bounded procedure \\(docs/slrs.md\\)"):
        generate(target, drafter, "x", method="slrs", lookahead=2, **kw)
    with pytest.raises(ValueError, match="same tokenizer|target's tokenizer"):
        generate(target, drafter, "x", method="sd", **kw)
    with pytest.raises(ValueError, match="method must be one of"):
        generate(target, drafter, "x", method="medusa", **kw)
    with pytest.raises(ValueError, match="needs a drafter"):
        generate(target, None, "x", method="tli", target_tokenizer=tt)
    for bad in (-1, 1.5, True):  # -1 used to end in an internal AssertionError inside retokenize
        with pytest.raises(ValueError, match="lookbehind must be an int >= 0"):
            generate(target, drafter, "x", method="slem", lookbehind=bad, **kw)


def test_training_mode_is_refused_without_changing_it(toks: dict[str, Any]) -> None:
    tt = toks["byte_bpe"]
    m = tiny.tiny_gpt2(tt, seed=9)
    m.train()
    with pytest.raises(ValueError, match="training mode"):
        generate(m, None, "x", target_tokenizer=tt, method="ar")
    assert m.training


def test_tokens_of_a_text_and_stats(toks: dict[str, Any], models: dict[str, Any]) -> None:
    target, tt, drafter, dt, dtemp = unpack("bpe<-self", toks, models)
    out = generate(target, drafter, ["Hello", "x"], target_tokenizer=tt, drafter_tokenizer=dt, method="tli",
                   lookahead=4, max_new_tokens=16, seed=1, drafter_temperature=dtemp)
    text = TokenText(tt, target.get_output_embeddings().weight.shape[0])
    for seq, txt, st in zip(out.sequences, out.texts, out.stats):
        assert 1 <= len(seq) <= 16
        assert txt == text.decode(seq).decode("utf-8", errors="replace")
        assert st.new_tokens == len(seq)
        assert st.accepted <= st.proposed
        assert st.target_calls >= 1 and st.tokens_per_target_call == len(seq) / st.target_calls
        assert st.accepted > 0  # the self-drafter is accepted often
