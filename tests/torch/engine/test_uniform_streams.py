"""Every uniform a row of ``hsd_torch.generate`` consumes is a fresh draw of its own stream.

The mirror tests replay whatever the backend recorded, so a backend that reads one uniform twice
(the correction token drawn with the first acceptance uniform instead of its own) replays
faithfully and passes them. Two tests see it:

- **Streams, exactly.** Row ``i`` of a batch of ``n`` draws from
  ``numpy.random.default_rng(SeedSequence(seed).spawn(n)[i])``; the uniforms it consumed
  (``record_uniforms=True``, in ``hsd_core``'s order) must be a subsequence of that stream at
  strictly increasing positions: each one a value the row itself drew, in the order drawn, none
  read twice. For every method (AR, SD, TLI, SLEM, one-token SLRS, bounded SLRS with
  ``max_tokens=None``), batch 1 and 3, sampled. Exact and deterministic (fixed seed); the one
  way it could miss a value read twice is two equal doubles among the 4,096 drawn from a stream
  (53-bit values: probability about 1e-9).
- **The law after a rejection, sampled.** SD with lookahead 1 and one new token, at a state whose
  residual ``max(0, p - q)`` spreads over many tokens (the target drafting for itself at
  drafter temperature 0.5: the residual's largest token carries 12 % of its mass), N = 2,000
  independent rows: the first token's law must be the target's processed law (Pearson
  chi-square, ``hsd_core.stats.chi_square_gof``, alpha 1e-3, cells pooled below an expected
  count of 5). The law of the reused-uniform mutant (the correction drawn with the rejected
  draft's uniform ``u >= p(x)/q(x)``, so from the top of the residual's CDF) is computed exactly
  here, and the test asserts its power against it is >= 0.99 at that N (noncentral chi-square
  over the 40 pooled cells: noncentrality 558, power 1 - 8e-61; the mutant's law is at TV 0.21);
  against any alternative the smallest TV detected with power 0.99 at N is 0.096 (asserted
  < 0.1, ``min_tv_detectable``). On the clean backend the statistic's p-value is 0.72 at this
  seed (a false fail has probability 1e-3).
"""

from __future__ import annotations

import functools

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402

from scipy import stats as sps  # type: ignore[import-untyped]  # noqa: E402

from hsd_core.stats import OTHER, chi_square_gof, min_tv_detectable, pool_cells  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.generate import process_logits  # noqa: E402
from hsd_torch.models.mirror import CoreTokenizer  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402
generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only: the mirror's setting

torch.set_num_threads(1)

PROMPTS = ["def foo(x):\n", "Hello", "naïve café"]
SEED = 5
STREAM = 4096  # far more uniforms than any row here draws (asserted)

# method -> (target, target tokenizer, drafter, drafter tokenizer, options)
CASES: dict[str, tuple[str, str, str | None, str | None, dict[str, Any]]] = {
    "ar": ("llama_bpe", "byte_bpe", None, None, {}),
    "sd": ("llama_bpe", "byte_bpe", "gpt2_bpe", "byte_bpe", {"lookahead": 3, "drafter_temperature": 1.5}),
    "tli": ("llama_bpe", "byte_bpe", "gpt2_uni_pad", "unigram", {"lookahead": 3}),
    "slem": ("llama_bpe", "byte_bpe", "gpt2_uni_pad", "unigram", {"lookahead": 3}),
    "slrs": ("llama_bpe", "byte_bpe", "gpt2_uni_pad", "unigram", {"lookahead": 1}),
    "slrs_bounded": ("llama_bpe", "byte_bpe", "gpt2_uni_pad", "unigram",
                     {"lookahead": 3, "proposal_map": "longest_prefix", "min_path_prob": 0.05, "max_tokens": None}),
}


def stream_positions(recorded: Sequence[float], stream: Sequence[float]) -> list[int]:
    """The positions in ``stream`` of ``recorded`` as a subsequence, each after the one before
    (the earliest match: if any strictly increasing match exists, this one does); AssertionError
    naming the first uniform that is not a later draw of the stream."""
    pos: list[int] = []
    at = 0
    for j, u in enumerate(recorded):
        while at < len(stream) and stream[at] != u:
            at += 1
        if at == len(stream):
            earlier = [k for k, s in enumerate(stream) if s == u]
            raise AssertionError(f"uniform {j} ({u!r}) is not a draw of the row's stream after position "
                                 f"{pos[-1] if pos else -1}" + (f": it was drawn at {earlier} and is read again"
                                                                 if earlier else ": the row never drew it"))
        pos.append(at)
        at += 1
    return pos


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("method", list(CASES))
def test_every_uniform_is_a_fresh_draw_of_the_rows_stream(method: str, batch: int, toks: dict[str, Any],
                                                          models: dict[str, Any]) -> None:
    t, tt, d, dt, opts = CASES[method]
    name = "slrs" if method.startswith("slrs") else method
    out = generate(models[t], models[d] if d else None, PROMPTS[:batch], target_tokenizer=toks[tt],
                   drafter_tokenizer=toks[dt] if dt else None, method=name, max_new_tokens=12, seed=SEED,
                   record_uniforms=True, **opts)
    assert out.uniforms is not None and len(out.uniforms) == batch
    children = np.random.SeedSequence(SEED).spawn(batch)
    for i in range(batch):
        stream = np.random.default_rng(children[i]).random(STREAM).tolist()
        recorded = out.uniforms[i]
        assert len(recorded) >= len(out.sequences[i]) > 0, "every sampled token reads a uniform"
        pos = stream_positions(recorded, stream)
        assert all(a < b for a, b in zip(pos, pos[1:]))
        assert pos[-1] < STREAM // 2, "the stream drawn here is too short to tell"


def test_the_stream_check_sees_a_reused_uniform() -> None:
    """The check itself: a value read twice, a value of another stream, or two values swapped fail."""
    s = np.random.default_rng(0).random(20).tolist()
    assert stream_positions([s[1], s[3], s[4], s[9]], s) == [1, 3, 4, 9]
    for bad in ([s[1], s[3], s[1]], [s[1], s[3], s[3]], [s[4], s[3]], [0.5]):
        with pytest.raises(AssertionError):
            stream_positions(bad, s)


# ---------------------------------------------------------------------------------------------
# the law of the token after a rejection, sampled

N = 2000
ALPHA = 1e-3
POWER = 0.99
PROMPT = "Hello"
D_TEMP = 0.5


def text_space_law(model: Any, text: TokenText, cols: list[int], **process: Any) -> npt.NDArray[np.float64]:
    """The processed law after the prompt, over the text space's columns (ids with text
    increasing, EOS last: the order every draw of generate reads)."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([text.prompt_ids(PROMPT)])).logits[0, -1]
    law: npt.NDArray[np.float64] = process_logits(logits, text.text_mask, **process).double().numpy()[cols]
    return law


def reused_uniform_law(p: npt.NDArray[np.float64], q: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The law of the token emitted by one-draft SD when the correction is drawn, by the inverse
    CDF over the residual in column order, with the rejected draft's own uniform u (given the
    rejection of draft x, u is uniform on [r, 1), r = min(1, p(x)/q(x))): P(t) = min(p, q)(t) +
    sum over x of q(x) * |[C(t-1), C(t)) intersected with [r_x, 1)|, C the residual's CDF."""
    res = np.maximum(p - q, 0.0)
    cdf = np.concatenate([[0.0], np.cumsum(res / res.sum())])
    out = np.minimum(p, q)
    for x in np.flatnonzero(q > 0):
        r = min(1.0, p[x] / q[x])
        out = out + q[x] * np.clip(cdf[1:] - np.maximum(cdf[:-1], r), 0.0, None)
    return out


def test_token_after_rejection_has_the_targets_law(toks: dict[str, Any], models: dict[str, Any]) -> None:
    target, tok = models["llama_bpe"], toks["byte_bpe"]
    text = TokenText(tok, int(target.get_output_embeddings().weight.shape[0]))
    cols = CoreTokenizer(text).hf_ids
    p = text_space_law(target, text, cols)
    q = text_space_law(target, text, cols, temperature=D_TEMP)
    res = np.maximum(p - q, 0.0)
    res /= res.sum()
    # the state: a rejection is likely, and its residual is spread over many tokens
    assert 1.0 - np.minimum(p, q).sum() > 0.3
    assert (res > 0.01).sum() >= 10 and res.max() < 0.2
    law = {int(c): float(v) for c, v in enumerate(p)}
    labels, expected, _ = pool_cells(law, {}, N, absorb_small_other=True)
    # sizing: the exact power of the pooled Pearson test against the reused-uniform law
    mutant = reused_uniform_law(p, q)
    assert abs(mutant.sum() - 1.0) < 1e-12
    named = [int(c) for c in labels if c != OTHER]
    m = np.array([mutant[c] for c in named] + ([mutant.sum() - mutant[named].sum()] if OTHER in labels else []))
    lam = float(N * (((m - expected / N) ** 2) / (expected / N)).sum())
    dof = len(labels) - 1
    power = float(sps.ncx2.sf(sps.chi2.isf(ALPHA, dof), dof, lam))
    assert power >= POWER, f"N = {N} detects the reused uniform with power {power} only"
    assert 0.5 * np.abs(mutant - p).sum() > 0.2
    assert min_tv_detectable(len(labels), N, ALPHA, POWER) < 0.1  # any law at TV >= 0.1 too
    out = generate(target, target, [PROMPT] * N, target_tokenizer=tok, drafter_tokenizer=tok, method="sd",
                   lookahead=1, max_new_tokens=1, seed=2024, drafter_temperature=D_TEMP)
    assert all(len(s) == 1 for s in out.sequences)
    col = {h: c for c, h in enumerate(cols)}
    samples = [col[s[0]] for s in out.sequences]
    rejected = sum(1 for st in out.stats if st.accepted == 0)
    assert rejected > 0.3 * N  # the corrections are a large part of the sample
    result = chi_square_gof(law, samples, ALPHA)
    assert not result.rejected, result.detail
