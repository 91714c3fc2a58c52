"""Bounded SLRS in hsd_torch (proofs/slrs_bounded.md) against hsd_core's bounded SLRS.

- The proposal map: the vectorized byte-trie walk (:func:`hsd_torch.slrs.walk_pairs`) gives
  ``hsd_core``'s ``LongestPrefixMap`` parse and settled test on every drafter token after many texts.
- psi: the backend's level-by-level psi (one batched drafter pass per level) equals
  ``SLRS(lookahead, min_path_prob, proposal_map="longest_prefix").psi(...)`` over
  :class:`hsd_torch.CoreModel` to 1e-12, with the same number of drafter contexts evaluated.
- Mirror: fed the uniforms the backend consumed, the reference emits the same tokens.
- Greedy: identical to the target's own ``model.generate``.
- Sampled (slow): the law of the first two tokens against 20,000 samples, and a lossy variant (a psi
  that ignores the paths pruned by min_path_prob) that the same sized test rejects.

Models: the tiny random-init peaked GPT-2/Llama of ``tests/torch/engine/test_generate.py`` over the
locally trained tokenizers (byte-level BPE 384, Unigram + byte fallback, LLaMA-style BPE + byte
fallback), float64. Their target vocabularies are small (short tokens), so the settled stop ends most
paths after one or two drafter tokens; min_path_prob 0.01 keeps enough paths for trees of depth 2-3
(up to 8 drafter contexts per round).
"""

from __future__ import annotations

import functools

import importlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.methods import SLRS, State  # noqa: E402
from hsd_core.methods.slrs import LongestPrefixMap  # noqa: E402
from hsd_core.rand import UniformRand  # noqa: E402
from hsd_core import variants  # noqa: E402
from hsd_core.stats import assert_law_matches, min_num_samples_for_tv, min_tv_detectable  # noqa: E402
from hsd_torch import CoreModel, generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch import slrs as tslrs  # noqa: E402
from hsd_torch.models.mirror import core_text, target_greedy, target_two_token_law  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402
generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only: the mirror's setting

torch.set_num_threads(1)

PROMPTS = [
    "def foo(x):\n", "Hello", "naïve café", "x", "import os\nimport sys\n", " leading space", "日本語",
    "return self.", "# comment\n", "class A:", "1 + 2 = ", "emoji 😀", "for i in range(10):\n    ", "\n\n",
    'print("hi")', "lambda", "aaaaa", "\t\tindent", "if __name__ == '__main__':", "    ",
]



# (target model, target tokenizer, drafter model, drafter tokenizer, drafter temperature)
PAIRS = {
    "bpe<-unigram": ("llama_bpe", "byte_bpe", "gpt2_uni_pad", "unigram", 1.0),
    "fallback<-bpe": ("gpt2_fb_pad", "bpe_fallback", "llama_bpe", "byte_bpe", 1.0),
    "unigram<-fallback": ("gpt2_uni_pad", "unigram", "gpt2_fb_pad", "bpe_fallback", 1.0),
    "bpe<-self": ("llama_bpe", "byte_bpe", "llama_bpe", "byte_bpe", 1.5),
}
FAST_PAIRS = ["bpe<-unigram", "fallback<-bpe"]
K, TAU = 3, 0.01
MULTI_FAST_TAU = 0.05  # multi-token proposals draft until several ids are settled: larger trees, a slower reference


def unpack(pair: str, toks: dict[str, Any], models: dict[str, Any]) -> tuple[Any, Any, Any, Any, float]:
    t, tt, d, dt, dtemp = PAIRS[pair]
    return models[t], toks[tt], models[d], toks[dt], dtemp


def width(model: Any) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


# ---------------------------------------------------------------------------------------------
# the proposal map


@pytest.mark.parametrize("tkind,dkind", [("byte_bpe", "unigram"), ("bpe_fallback", "byte_bpe"),
                                         ("unigram", "bpe_fallback")])
def test_trie_walk_is_the_core_longest_prefix_map(tkind: str, dkind: str, toks: dict[str, Any]) -> None:
    tt = TokenText(toks[tkind], len(toks[tkind]))
    dt = TokenText(toks[dkind], len(toks[dkind]))
    trie = tslrs.TargetTrie(tt)
    db = tslrs.DrafterBytes(dt)
    core = CoreModel(tiny.tiny_gpt2(toks[tkind], seed=0), toks[tkind])
    pmap = LongestPrefixMap(core.vocab)
    # texts: the empty one, and proper prefixes of target tokens (the only texts the tree expands)
    strings = sorted({b for b in tt.bytes_of if b is not None}, key=lambda b: (len(b), b))
    rng = np.random.default_rng(0)
    texts = [b""] + [s[:j] for s in (strings[i] for i in rng.choice(len(strings), 40, replace=False))
                     for j in range(1, len(s))][:60]
    for text in texts:
        # the text's trie state and longest prefix, by walking its bytes from the root
        state, best = 0, -1
        for c in text:
            hit = (trie.keys == state * 256 + c).nonzero()
            assert hit.numel() == 1
            state = int(trie.child[hit[0, 0]])
            best = int(trie.term[state]) if int(trie.term[state]) >= 0 else best
        n = db.ids.shape[0]
        prop, _, settled = tslrs.walk_pairs(trie, torch.full((n,), state), torch.full((n,), best),
                                            torch.arange(n), db)
        for c, d in enumerate(db.ids.tolist()):
            full = (text + (dt.bytes_of[d] or b"")).decode("latin-1")
            want = core.tokenizer.to_hf(pmap.parse(full, 1))[0]
            assert int(prop[c]) == want, (text, d)
            assert bool(settled[c]) == pmap.settled(full, 1), (text, d)


# ---------------------------------------------------------------------------------------------
# psi


def core_psi(pair: str, toks: dict[str, Any], models: dict[str, Any], prompt: str, k: int,
             tau: float) -> tuple[Any, int, CoreModel]:
    target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
    ct, cd = CoreModel(target, tt, prompt=prompt), CoreModel(drafter, dt, temperature=dtemp, prompt=prompt)
    ps = SLRS(lookahead=k, min_path_prob=tau, proposal_map="longest_prefix").psi(ct, cd, State(core_text(prompt), (), 4))
    return ps.first(len(ct.vocab)), ps.evaluations, ct


@pytest.mark.parametrize("pair", FAST_PAIRS)
def test_psi_equals_the_reference_psi(pair: str, toks: dict[str, Any], models: dict[str, Any]) -> None:
    target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
    prompts = PROMPTS[:6]
    res = tslrs.first_round(tt, width(target), drafter, dt, prompts, lookahead=K, min_path_prob=TAU,
                            temperature=dtemp)
    assert max(res.evaluations) > 2, "the test needs trees deeper than one level"
    assert res.levels <= K
    for r, prompt in enumerate(prompts):
        want, evals, ct = core_psi(pair, toks, models, prompt, K, TAU)
        got = res.psi[r, torch.tensor(ct.tokenizer.hf_ids)].numpy()
        assert float(res.psi[r].sum()) == pytest.approx(1.0, abs=1e-12)
        assert np.abs(got - np.asarray(want, dtype=np.float64)).max() < 1e-12, prompt
        assert res.evaluations[r] == evals, prompt
        assert evals <= tslrs.psi_bound(K, TAU)


# ---------------------------------------------------------------------------------------------
# mirror


def check_mirror(pair: str, prompts: list[str], toks: dict[str, Any], models: dict[str, Any], k: int, tau: float,
                 max_new: int, max_tokens: int | None = 1) -> tuple[int, int]:
    """Generate with recorded uniforms, replay them into hsd_core: the same tokens, every uniform
    read. Returns the drafter passes past the root and the proposals past one per round."""
    target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
    out = generate(target, drafter, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method="slrs", lookahead=k,
                   min_path_prob=tau, proposal_map="longest_prefix", max_new_tokens=max_new, seed=11,
                   record_uniforms=True, drafter_temperature=dtemp, max_tokens=max_tokens)
    assert out.uniforms is not None
    ct, cd = CoreModel(target, tt), CoreModel(drafter, dt, temperature=dtemp)
    ref_method = SLRS(lookahead=k, min_path_prob=tau, proposal_map="longest_prefix", max_tokens=max_tokens)
    deeper = extra = 0
    for i, prompt in enumerate(prompts):
        rand = UniformRand(out.uniforms[i])
        ref = ref_method.generate(ct, cd, core_text(prompt), max_new, rng=rand)
        assert ct.tokenizer.to_hf(ref) == out.sequences[i], (pair, prompt)
        assert rand.used == len(out.uniforms[i]), "the backend recorded a uniform the reference did not read"
        deeper += out.stats[i].drafter_calls - out.stats[i].target_calls
        extra += out.stats[i].proposed - out.stats[i].target_calls
    return deeper, extra


@pytest.mark.parametrize("pair", FAST_PAIRS)
def test_mirror_reference_emits_the_same_tokens(pair: str, toks: dict[str, Any], models: dict[str, Any]) -> None:
    deeper, _ = check_mirror(pair, PROMPTS[:4], toks, models, K, TAU, 6)
    assert deeper > 0, "no round went past the first level"


@pytest.mark.parametrize("pair", FAST_PAIRS)
def test_mirror_multi_token_proposals(pair: str, toks: dict[str, Any], models: dict[str, Any]) -> None:
    """``max_tokens=None`` (up to the budget): the reference ``SLRS(..., max_tokens=None)`` emits the
    same tokens on the recorded uniforms."""
    deeper, extra = check_mirror(pair, PROMPTS[:4], toks, models, K, MULTI_FAST_TAU, 6, max_tokens=None)
    assert deeper > 0 and extra > 0, "no round proposed more than one token"


@pytest.mark.slow
@pytest.mark.parametrize("pair", list(PAIRS))
@pytest.mark.parametrize("k,tau", [(2, 0.2), (4, 0.05)])
@pytest.mark.parametrize("max_tokens", [1, 2, None])
def test_mirror_many_prompts(pair: str, k: int, tau: float, max_tokens: int | None, toks: dict[str, Any],
                             models: dict[str, Any]) -> None:
    check_mirror(pair, PROMPTS, toks, models, k, tau, 10, max_tokens)


@pytest.mark.parametrize("max_tokens", [1, None])
def test_mirror_with_a_sliding_drafter_window(max_tokens: int | None, toks: dict[str, Any],
                                              models: dict[str, Any]) -> None:
    """A drafter with 12 positions: tree nodes that would outgrow them are run without the cache on
    the backend's window of the full context (the mirror's ``CoreModel(window=True)``)."""
    target, tt = models["llama_bpe"], toks["byte_bpe"]
    dt = toks["unigram"]
    tau = TAU if max_tokens == 1 else MULTI_FAST_TAU
    drafter = tiny.tiny_gpt2(dt, seed=1, n_positions=12, dtype=torch.float64)
    prompts = ["def foo(x):\n    return x + 1\n", "import os\nimport sys\n"]
    assert max(len(TokenText(dt, len(dt)).prompt_ids(p)) for p in prompts) > 12
    out = generate(target, drafter, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method="slrs", lookahead=K,
                   min_path_prob=tau, proposal_map="longest_prefix", max_new_tokens=8, seed=5, record_uniforms=True,
                   max_tokens=max_tokens)
    assert out.uniforms is not None
    ct = CoreModel(target, tt)
    ref_method = SLRS(lookahead=K, min_path_prob=tau, proposal_map="longest_prefix", max_tokens=max_tokens)
    for i, prompt in enumerate(prompts):
        cd = CoreModel(drafter, dt, prompt=prompt, window=True)
        rand = UniformRand(out.uniforms[i])
        assert ct.tokenizer.to_hf(ref_method.generate(ct, cd, core_text(prompt), 8, rng=rand)) == out.sequences[i]
        assert rand.used == len(out.uniforms[i])
    assert sum(st.drafter_calls - st.target_calls for st in out.stats) > 0, "no tree level ran"


# ---------------------------------------------------------------------------------------------
# greedy


@pytest.mark.parametrize("pair", FAST_PAIRS)
def test_greedy_equals_the_targets_own_generate(pair: str, toks: dict[str, Any], models: dict[str, Any]) -> None:
    target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
    prompts = PROMPTS[:10]
    for tau, mt in ((TAU, 1), (None, 1), (TAU, None), (None, 3)):  # greedy needs no probability stop (one path)
        out = generate(target, drafter, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method="slrs",
                       lookahead=4, min_path_prob=tau, proposal_map="longest_prefix", max_new_tokens=10,
                       do_sample=False, drafter_temperature=dtemp, max_tokens=mt)
        for i, prompt in enumerate(prompts):
            assert out.sequences[i] == target_greedy(target, tt, prompt, 10), (tau, mt, prompt)


# ---------------------------------------------------------------------------------------------
# refusals


def test_refusals(toks: dict[str, Any], models: dict[str, Any]) -> None:
    target, tt, drafter, dt, _ = unpack("bpe<-unigram", toks, models)
    kw: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=dt, method="slrs")
    with pytest.raises(NotImplementedError, match="lookahead=1 only.*bounded procedure \\(docs/slrs.md\\)"):
        generate(target, drafter, "x", lookahead=2, **kw)
    with pytest.raises(NotImplementedError, match="lookahead=1 only.*bounded procedure \\(docs/slrs.md\\)"):
        generate(target, drafter, "x", lookahead=2, min_path_prob=0.1, proposal_map="retokenize", **kw)
    with pytest.raises(NotImplementedError, match="no min_path_prob.*docs/slrs.md"):
        generate(target, drafter, "x", lookahead=3, proposal_map="longest_prefix", **kw)
    with pytest.raises(NotImplementedError, match="more than 4096"):
        generate(target, drafter, "x", lookahead=8, min_path_prob=1e-3, proposal_map="longest_prefix", **kw)
    with pytest.raises(ValueError, match="min_path_prob must be"):
        generate(target, drafter, "x", lookahead=2, min_path_prob=0.0, proposal_map="longest_prefix", **kw)
    with pytest.raises(ValueError, match="proposal_map must be"):
        generate(target, drafter, "x", lookahead=2, min_path_prob=0.1, proposal_map="bytes", **kw)
    with pytest.raises(NotImplementedError, match="max_tokens=2 needs the bounded procedure"):
        generate(target, drafter, "x", lookahead=1, max_tokens=2, **kw)
    with pytest.raises(ValueError, match="max_tokens must be"):
        generate(target, drafter, "x", lookahead=2, min_path_prob=0.1, proposal_map="longest_prefix", max_tokens=0,
                 **kw)
    with pytest.raises(ValueError, match="max_tokens is an option of method 'slrs'"):
        generate(target, drafter, "x", target_tokenizer=tt, drafter_tokenizer=dt, method="tli", max_tokens=None)


# ---------------------------------------------------------------------------------------------
# sampled: the law of the first two tokens (slow)

ALPHA = 1e-6
POWER = 0.99
EPS = 0.04  # detectable TV with power 0.99 at alpha 1e-6 on <= 36 cells with 20,000 samples
N = 20_000
CHUNK = 2_500
TOP_K = 6
AUDIT_PAIR = "bpe<-self"  # the target drafting for itself at temperature 1.5: acceptance about 0.83
AUDIT_PROMPT = "def foo(x):\n"
AUDIT_TAU = 0.3  # prunes real mass at depth 2: the lossy variant's first-token TV is 0.110 here (exact, from psi)


def test_the_sampled_test_is_sized() -> None:
    assert min_num_samples_for_tv(TOP_K * TOP_K, EPS, ALPHA, POWER) <= N
    assert min_tv_detectable(TOP_K * TOP_K, N, ALPHA, POWER) <= EPS


def exact_two_token_law(model: Any, tok: Any, prompt: str) -> dict[tuple[int, ...], float]:
    """P(first two new tokens) under the processed law (top-k 6), exact: an EOS first token ends
    the sequence (outcome ``(eos,)``)."""
    return target_two_token_law(model, tok, prompt, top_k=TOP_K)


def sampled_two_tokens(pair: str, toks: dict[str, Any], models: dict[str, Any], prompt: str,
                       seed: int) -> list[tuple[int, ...]]:
    target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
    out: list[tuple[int, ...]] = []
    for c in range(N // CHUNK):
        res = generate(target, drafter, [prompt] * CHUNK, target_tokenizer=tt, drafter_tokenizer=dt, method="slrs",
                       lookahead=K, min_path_prob=AUDIT_TAU, proposal_map="longest_prefix", max_new_tokens=2,
                       top_k=TOP_K, seed=seed * 1000 + c, drafter_temperature=dtemp)
        out.extend(tuple(s) for s in res.sequences)
    return out


class PrunedPathsIgnored(tslrs.BoundedSLRS):
    """Deliberately lossy: drafting stops where the path probability falls below min_path_prob, but
    psi leaves out those pruned paths (it counts only settled, EOS and last-level stops)."""

    def _psi_counts(self, stop: Any, settled: Any, w: Any, depth: int) -> Any:
        return stop & (settled | (w >= self.tau)) if depth < self.k else stop


@pytest.fixture()
def pruned_psi(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    method = importlib.import_module("hsd_torch.methods.slrs")  # where generate's bounded SLRS builds its psi
    monkeypatch.setattr(method, "BoundedSLRS", PrunedPathsIgnored)
    yield


def test_the_lossy_variant_is_lossy_at_the_audited_state(toks: dict[str, Any], models: dict[str, Any]) -> None:
    """Exact first-token law of one verified round with the lossy psi, from psi itself: TV >= 0.1."""
    from hsd_torch.generate import process_logits

    target, tt, drafter, dt, dtemp = unpack(AUDIT_PAIR, toks, models)
    text = TokenText(tt, width(target))
    with torch.inference_mode():
        p = process_logits(target(torch.tensor([text.prompt_ids(AUDIT_PROMPT)])).logits[0, -1], text.text_mask,
                           top_k=TOP_K).double()
    kw: dict[str, Any] = dict(lookahead=K, min_path_prob=AUDIT_TAU, temperature=dtemp, top_k=TOP_K)
    psi = tslrs.first_round(tt, width(target), drafter, dt, [AUDIT_PROMPT], **kw).psi[0]
    psi_module = importlib.import_module("hsd_torch.methods.slrs.psi")  # where first_round builds its psi
    real = psi_module.BoundedSLRS
    psi_module.BoundedSLRS = PrunedPathsIgnored
    try:
        lossy = tslrs.first_round(tt, width(target), drafter, dt, [AUDIT_PROMPT], **kw).psi[0]
    finally:
        psi_module.BoundedSLRS = real

    def emitted(q: Any) -> Any:  # proposals from psi, verified against q
        acc = psi * torch.where(q > 0, torch.clamp(p / q, max=1.0), torch.ones_like(p))
        res = torch.clamp(p - q, min=0)
        return acc + (1 - acc.sum()) * res / res.sum()

    assert float(0.5 * (emitted(psi) - p).abs().sum()) < 1e-12
    assert float(0.5 * (emitted(lossy) - p).abs().sum()) > 0.1


@pytest.mark.slow
def test_sampled_law_of_first_two_tokens(toks: dict[str, Any], models: dict[str, Any]) -> None:
    target, tt, *_ = unpack(AUDIT_PAIR, toks, models)
    law = exact_two_token_law(target, tt, AUDIT_PROMPT)
    assert len(law) <= TOP_K * TOP_K
    assert_law_matches(law, sampled_two_tokens(AUDIT_PAIR, toks, models, AUDIT_PROMPT, seed=3), alpha=ALPHA, eps=EPS,
                       power=POWER)


@pytest.mark.slow
def test_sampled_lossy_variant_is_rejected(toks: dict[str, Any], models: dict[str, Any], pruned_psi: None) -> None:
    target, tt, *_ = unpack(AUDIT_PAIR, toks, models)
    law = exact_two_token_law(target, tt, AUDIT_PROMPT)
    with pytest.raises(AssertionError, match="rejected"):
        assert_law_matches(law, sampled_two_tokens(AUDIT_PAIR, toks, models, AUDIT_PROMPT, seed=4), alpha=ALPHA,
                           eps=EPS, power=POWER)


# ---------------------------------------------------------------------------------------------
# real tokenizers (slow): GPT-2 (byte-level BPE, 50k) <- LLaMA (SentencePiece, byte fallback, 32k)


@pytest.fixture(scope="module")
def real_pair() -> tuple[Any, Any]:
    from hsd_torch.models import real_tokenizers

    why = real_tokenizers.available()
    if why.get("gpt2") or why.get("llama"):
        pytest.skip(f"real tokenizers unavailable: {why}")
    return real_tokenizers.load("gpt2"), real_tokenizers.load("llama")


@pytest.mark.slow
def test_real_tokenizers_trie_walk_and_psi(real_pair: tuple[Any, Any]) -> None:
    """On GPT-2 <- LLaMA: the trie walk equals the core map on 2,000 random drafter ids after 20
    texts, and psi (drafter top-k 200, so that the core's enumeration is affordable; the backend
    still walks every id) equals the core's psi with the same evaluations."""
    tg, tl = real_pair
    target = tiny.tiny_gpt2(tg, seed=0, dtype=torch.float64, head_std=6.0)
    drafter = tiny.tiny_llama(tl, seed=1, dtype=torch.float64, head_std=6.0)
    tt, dt = TokenText.get(tg, width(target)), TokenText.get(tl, width(drafter))
    trie, db = tslrs.TargetTrie(tt), tslrs.DrafterBytes(dt)
    prompts = ["def foo(x):\n", "Hello world", " naïve café"]
    cores = [(CoreModel(target, tg, prompt=p), CoreModel(drafter, tl, prompt=p, top_k=200)) for p in prompts]
    pmap = LongestPrefixMap(cores[0][0].vocab)
    rng = np.random.default_rng(1)
    cols = torch.tensor(rng.choice(db.ids.shape[0], 2000, replace=False))
    strings = [b for b in tt.bytes_of if b is not None and len(b) > 2]
    for s in [b""] + [strings[i][:j] for i in rng.choice(len(strings), 19, replace=False) for j in (1, 2)][:19]:
        state, best = 0, -1
        for c in s:
            state = int(trie.child[(trie.keys == state * 256 + c).nonzero()[0, 0]])
            best = int(trie.term[state]) if int(trie.term[state]) >= 0 else best
        n = cols.shape[0]
        prop, _, settled = tslrs.walk_pairs(trie, torch.full((n,), state), torch.full((n,), best), cols, db)
        for i, d in enumerate(db.ids.index_select(0, cols).tolist()):
            full = (s + (dt.bytes_of[d] or b"")).decode("latin-1")
            assert int(prop[i]) == cores[0][0].tokenizer.to_hf(pmap.parse(full, 1))[0], (s, d)
            assert bool(settled[i]) == pmap.settled(full, 1), (s, d)
    res = tslrs.first_round(tg, width(target), drafter, tl, prompts, lookahead=3, min_path_prob=0.02, top_k=200)
    assert max(res.evaluations) > 1
    for r, (prompt, (ct, cd)) in enumerate(zip(prompts, cores)):
        ps = SLRS(lookahead=3, min_path_prob=0.02, proposal_map="longest_prefix").psi(ct, cd,
                                                                                      State(core_text(prompt), (), 4))
        want = np.asarray(ps.first(len(ct.vocab)), dtype=np.float64)
        got = res.psi[r, torch.tensor(ct.tokenizer.hf_ids)].numpy()
        assert np.abs(got - want).max() < 1e-12, prompt
        assert res.evaluations[r] == ps.evaluations, prompt


# ---------------------------------------------------------------------------------------------
# multi-token proposals: the parse, the conditional psi, a lossy variant


@pytest.mark.parametrize("tkind,dkind", [("byte_bpe", "unigram"), ("bpe_fallback", "byte_bpe")])
def test_parse_pairs_is_the_core_parse(tkind: str, dkind: str, toks: dict[str, Any]) -> None:
    """:func:`hsd_torch.slrs.parse_pairs` (head text + a drafter token) gives ``LongestPrefixMap.parse``
    and, through ``f``, its ``settled`` test, for limits 1-4 and unlimited."""
    tt = TokenText(toks[tkind], len(toks[tkind]))
    dt = TokenText(toks[dkind], len(toks[dkind]))
    trie, db = tslrs.TargetTrie(tt), tslrs.DrafterBytes(dt)
    core = CoreModel(tiny.tiny_gpt2(toks[tkind], seed=0), toks[tkind])
    pmap = LongestPrefixMap(core.vocab)
    rng = np.random.default_rng(2)
    strings = [b for b in tt.bytes_of if b is not None]
    heads = [b""] + [b"".join(strings[i] for i in rng.choice(len(strings), int(rng.integers(1, 4))))[:int(j)]
                     for j in rng.integers(1, 12, 15)]
    hm, hl = tslrs.pad_bytes(heads, torch.device("cpu"))
    n_d = db.ids.shape[0]
    cols = torch.tensor(rng.choice(n_d, 60, replace=False))
    node = torch.arange(len(heads)).repeat_interleave(61)
    col = torch.cat([cols, torch.tensor([-1])]).repeat(len(heads))  # -1: the head alone
    for limit in (1, 2, 4, 1 << 20):
        ids, n, f, fpos = tslrs.parse_pairs(trie, hm, hl, node, col, db, torch.full_like(node, limit))
        for i, (h, c) in enumerate(zip(node.tolist(), col.tolist())):
            text = heads[h] + ((dt.bytes_of[int(db.ids[c])] or b"") if c >= 0 else b"")
            full = text.decode("latin-1")
            want = core.tokenizer.to_hf(pmap.parse(full, limit))
            assert ids[i, :int(n[i])].tolist() == list(want), (text, limit)
            for m in range(1, min(limit, 5) + 1):
                assert (int(f[i]) >= m) == pmap.settled(full, m), (text, m)
            if int(f[i]) < limit:  # the rest after the settled ids: the text past fpos
                assert core.tokenizer.to_hf(pmap.parse(full, int(f[i]))) == ids[i, :int(f[i])].tolist()
                assert pmap.parse(full[int(fpos[i]):]) == pmap.parse(full)[int(f[i]):]


def test_suffix_parses_are_each_suffix_parsed_alone(toks: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The table :func:`parse_pairs` reads once a token starts inside the drafter bytes: row
    ``start[c] + o`` is the parse of drafter column ``c``'s bytes from offset ``o`` (the core's
    ``LongestPrefixMap.parse``), and building it in chunks (here of 7 suffixes, across columns)
    gives the same table as in one piece."""
    from hsd_torch.methods.slrs import trie as trie_mod

    tt = TokenText(toks["bpe_fallback"], len(toks["bpe_fallback"]))
    dt = TokenText(toks["byte_bpe"], len(toks["byte_bpe"]))
    trie, db = tslrs.TargetTrie(tt), tslrs.DrafterBytes(dt)
    whole = trie_mod.SuffixParses(trie, db)
    monkeypatch.setattr(trie_mod, "SUFFIX_CHUNK", 7)
    chunked = trie_mod.SuffixParses(trie, db)
    for name in ("flat", "n", "f", "fpos", "at", "start"):
        assert torch.equal(getattr(whole, name), getattr(chunked, name)), name
    core = CoreModel(tiny.tiny_gpt2(toks["bpe_fallback"], seed=0), toks["bpe_fallback"])
    pmap = LongestPrefixMap(core.vocab)
    rng = np.random.default_rng(4)
    for c in rng.choice(db.ids.shape[0], 40, replace=False).tolist():
        text = dt.bytes_of[int(db.ids[c])] or b""
        for o in range(len(text)):
            s_ = int(whole.start[c]) + o
            n = int(whole.n[s_])
            got = whole.flat[int(whole.at[s_]):int(whole.at[s_]) + n].tolist()
            assert got == list(core.tokenizer.to_hf(pmap.parse(text[o:].decode("latin-1")))), (text, o)


def core_conditionals(pair: str, toks: dict[str, Any], models: dict[str, Any], prompt: str, proposal: list[int],
                      max_tokens: int | None, budget: int) -> tuple[list[Any], int]:
    target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
    ct, cd = CoreModel(target, tt, prompt=prompt), CoreModel(drafter, dt, temperature=dtemp, prompt=prompt)
    ps = SLRS(lookahead=K, min_path_prob=MULTI_FAST_TAU, proposal_map="longest_prefix", max_tokens=max_tokens).psi(
        ct, cd, State(core_text(prompt), (), budget))
    mine = [s for s in ps.law if list(ct.tokenizer.to_hf(s)) == proposal]
    assert len(mine) == 1, "the backend's proposal is in the support of the reference psi"
    hf = torch.tensor(ct.tokenizer.hf_ids)
    out = []
    for j in range(len(proposal)):
        want = np.zeros(width(target))
        want[hf.numpy()] = np.asarray(ps.conditional(mine[0][:j], len(ct.vocab)), dtype=np.float64)
        out.append(want)
    return out, ps.evaluations


@pytest.mark.parametrize("pair", FAST_PAIRS)
def test_multi_conditional_psi_equals_the_reference(pair: str, toks: dict[str, Any], models: dict[str, Any]) -> None:
    """The backend's conditional psi along its drawn proposals equals ``PsiLaw.conditional`` of
    ``SLRS(..., max_tokens)`` over ``CoreModel`` to 1e-12, with the same drafter evaluations."""
    target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
    prompts = PROMPTS[:4]
    rng = np.random.default_rng(0)
    longest = 0
    for max_tokens, budget in ((None, 4), (2, 4)):
        for _ in range(2):
            us = [list(rng.random(K)) for _ in prompts]
            res = tslrs.first_round_multi(tt, width(target), drafter, dt, prompts, lookahead=K,
                                          min_path_prob=MULTI_FAST_TAU, max_tokens=max_tokens, budget=budget,
                                          uniforms=us, temperature=dtemp)
            for r, prompt in enumerate(prompts):
                want, evals = core_conditionals(pair, toks, models, prompt, res.proposals[r], max_tokens, budget)
                for j, w in enumerate(want):
                    assert np.abs(res.conditionals[r, j].numpy() - w).max() < 1e-12, (prompt, j)
                assert res.evaluations[r] == evals, prompt
                assert evals <= tslrs.psi_bound(K, MULTI_FAST_TAU)
                longest = max(longest, len(res.proposals[r]))
    assert longest >= 3, "the test needs proposals of several tokens"


def test_multi_round_at_one_token_is_the_one_token_round(toks: dict[str, Any], models: dict[str, Any]) -> None:
    """``round_multi`` with m = 1 gives :meth:`BoundedSLRS.round`'s psi, proposals and cost."""
    target, tt, drafter, dt, dtemp = unpack("bpe<-unigram", toks, models)
    us = [list(np.random.default_rng(i).random(K)) for i in range(6)]
    one = tslrs.first_round(tt, width(target), drafter, dt, PROMPTS[:6], lookahead=K, min_path_prob=TAU,
                            uniforms=us, temperature=dtemp)
    multi = tslrs.first_round_multi(tt, width(target), drafter, dt, PROMPTS[:6], lookahead=K, min_path_prob=TAU,
                                    max_tokens=1, budget=4, uniforms=us, temperature=dtemp)
    assert [[p] for p in one.proposal] == multi.proposals
    assert float((one.psi - multi.conditionals[:, 0]).abs().max()) < 1e-12
    assert one.evaluations == multi.evaluations and one.used == multi.used


class Unconditioned(tslrs.BoundedSLRS):
    """Deliberately lossy: position j verified against the marginal of the j-th proposed id, not
    its law given the proposal's first j ids (``hsd_core.variants.SLRSUnconditioned``)."""

    def _given_prefix(self, same: Any, j: int) -> Any:
        return torch.ones_like(same, dtype=torch.bool)


class CoreUnconditioned(SLRS):
    """``hsd_core``'s unconditioned variant, with the bounded procedure's options."""

    def __init__(self, lookahead: int, min_path_prob: float) -> None:
        super().__init__(lookahead=lookahead, max_tokens=None, min_path_prob=min_path_prob,
                         proposal_map="longest_prefix")
        self.name = "slrs_unconditioned"

    proposal_laws = variants.SLRSUnconditioned.proposal_laws


@pytest.fixture()
def unconditioned(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    method = importlib.import_module("hsd_torch.methods.slrs")  # where generate's bounded SLRS builds its psi
    monkeypatch.setattr(method, "BoundedSLRS", Unconditioned)
    yield


MULTI_PROMPT = "import os\nimport sys\n"
MULTI_TAU = 0.1  # the unconditioned variant's exact TV on the first two tokens here: 0.134 (> EPS)


def test_the_unconditioned_variant_is_lossy_at_the_audited_state(toks: dict[str, Any], models: dict[str, Any],
                                                                  unconditioned: None) -> None:
    """hsd_core's exact engine: honest multi-token bounded SLRS has TV 0 on the first two tokens at the
    multi-token audit's state, the unconditioned variant 0.134; and the backend's lossy variant
    mirrors the reference variant on recorded uniforms (so the sampled test audits that law)."""
    from hsd_core.exact import output_law, target_law, total_variation

    target, tt, drafter, dt, dtemp = unpack(AUDIT_PAIR, toks, models)
    ct = CoreModel(target, tt, prompt=MULTI_PROMPT, top_k=TOP_K)
    cd = CoreModel(drafter, dt, prompt=MULTI_PROMPT, top_k=TOP_K, temperature=dtemp)
    ref = target_law(ct, core_text(MULTI_PROMPT), 2)
    honest = SLRS(lookahead=K, min_path_prob=MULTI_TAU, proposal_map="longest_prefix", max_tokens=None)
    assert float(total_variation(output_law(honest, ct, cd, core_text(MULTI_PROMPT), 2), ref)) < 1e-12
    lossy = CoreUnconditioned(K, MULTI_TAU)
    assert float(total_variation(output_law(lossy, ct, cd, core_text(MULTI_PROMPT), 2), ref)) > 0.13
    out = generate(target, drafter, [MULTI_PROMPT] * 30, target_tokenizer=tt, drafter_tokenizer=dt, method="slrs",
                   lookahead=K, min_path_prob=MULTI_TAU, proposal_map="longest_prefix", max_tokens=None,
                   max_new_tokens=2, top_k=TOP_K, seed=1, record_uniforms=True, drafter_temperature=dtemp)
    assert out.uniforms is not None
    for i in range(30):
        rand = UniformRand(out.uniforms[i])
        assert ct.tokenizer.to_hf(lossy.generate(ct, cd, core_text(MULTI_PROMPT), 2, rng=rand)) == out.sequences[i]


def sampled_multi(toks: dict[str, Any], models: dict[str, Any], seed: int) -> list[tuple[int, ...]]:
    target, tt, drafter, dt, dtemp = unpack(AUDIT_PAIR, toks, models)
    out: list[tuple[int, ...]] = []
    for c in range(N // CHUNK):
        res = generate(target, drafter, [MULTI_PROMPT] * CHUNK, target_tokenizer=tt, drafter_tokenizer=dt,
                       method="slrs", lookahead=K, min_path_prob=MULTI_TAU, proposal_map="longest_prefix",
                       max_tokens=None, max_new_tokens=2, top_k=TOP_K, seed=seed * 1000 + c, drafter_temperature=dtemp)
        out.extend(tuple(s) for s in res.sequences)
    return out


@pytest.mark.slow
def test_sampled_multi_token_law_of_first_two_tokens(toks: dict[str, Any], models: dict[str, Any]) -> None:
    """Multi-token proposals (up to 2 here, the second verified against the conditional psi): the
    first two tokens against the target's exact law, N = 20,000, alpha 1e-6, TV 0.04 detected with
    power 0.99."""
    target, tt, *_ = unpack(AUDIT_PAIR, toks, models)
    law = exact_two_token_law(target, tt, MULTI_PROMPT)
    assert_law_matches(law, sampled_multi(toks, models, seed=5), alpha=ALPHA, eps=EPS, power=POWER)


@pytest.mark.slow
def test_sampled_unconditioned_variant_is_rejected(toks: dict[str, Any], models: dict[str, Any],
                                                   unconditioned: None) -> None:
    target, tt, *_ = unpack(AUDIT_PAIR, toks, models)
    law = exact_two_token_law(target, tt, MULTI_PROMPT)
    with pytest.raises(AssertionError, match="rejected"):
        assert_law_matches(law, sampled_multi(toks, models, seed=6), alpha=ALPHA, eps=EPS, power=POWER)


@pytest.mark.parametrize("pair", FAST_PAIRS)
def test_multi_round_parses_only_the_children_that_matter(pair: str, toks: dict[str, Any], models: dict[str, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the root level, ``MultiTokenRound`` parses only the children whose proposal can share
    the row's first id or that may grow (``needs_parse``): the same proposals, conditionals (bit
    for bit) and evaluations as parsing every child, with fewer pairs parsed."""
    from hsd_torch.methods.slrs import psi_multi

    target, tt, drafter, dt, dtemp = unpack(pair, toks, models)
    prompts = PROMPTS[:6]
    us = [list(np.random.default_rng(i).random(K + 1)) for i in range(len(prompts))]
    parsed: list[int] = []
    real_parse = psi_multi.parse_pairs

    def counting(*a: Any) -> Any:
        parsed.append(int(a[3].shape[0]))
        return real_parse(*a)

    monkeypatch.setattr(psi_multi, "parse_pairs", counting)

    def run() -> tuple[Any, int]:
        parsed.clear()
        res = tslrs.first_round_multi(tt, width(target), drafter, dt, prompts, lookahead=K + 1,
                                      min_path_prob=MULTI_FAST_TAU, max_tokens=None, budget=6, uniforms=us,
                                      temperature=dtemp)
        return res, sum(parsed)

    pruned, n_pruned = run()
    monkeypatch.setattr(psi_multi.MultiTokenRound, "needs_parse", lambda self, *a: None)
    full, n_full = run()
    assert pruned.proposals == full.proposals and pruned.evaluations == full.evaluations
    assert torch.equal(pruned.conditionals, full.conditionals)
    assert max(len(x) for x in full.proposals) >= 2
    assert n_pruned < n_full / 2, (n_pruned, n_full)
