"""The processed law against an independent definition.

Every other law check derives both of its sides from ``process_logits``, so a wrong temperature,
top-k or top-p could pass them all. Here the law is written a second time, plainly, from
``process_logits``' docstring (:func:`reference_law`: Python floats, one token at a time, top-p's
preceding masses summed exactly in ``fractions.Fraction``), and compared:

- **Exactly** on laws built from dyadic probabilities, where every tie and every top-p boundary
  is exact in floating point: the logits are ``T * ln(w / 4)`` with weights ``w`` in
  {1, 2, 4} (quarters), their total a power of two and ``T`` a power of two, so ``x / T`` and
  ``exp`` of it are exact (asserted: ``exp(-ln 2) = 1/2`` and ``exp(-ln 4) = 1/4`` on this
  platform, in float64 and float32), and every sum, boundary and renormalization is a dyadic
  rational. A top-p whose boundary falls exactly on a token's preceding mass, and ties across
  it (kept by lower id), are then decided exactly: the supports must be equal, and the laws bit
  for bit in float64 (a renormalized law such as 1/3 is rounded once on both sides; float32 to
  its rounding).
- **Within rounding** on Hypothesis-drawn logits (ties drawn on purpose, masked ids,
  temperatures, every top-k, top-p anywhere): the support must lie between the reference's
  supports at ``top_p -/+ 1e-9`` and the probabilities must agree to 1e-12.
- **Against transformers' own warpers** (``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
  ``TopPLogitsWarper``, in the order ``model.generate`` applies them), where they agree. They
  differ on two points, so the comparison is made only away from them: transformers' top-p sorts
  in *ascending* order and removes the tokens whose cumulative mass is ``<= 1 - top_p``, which is
  the same set in exact arithmetic but rounds differently at the boundary, and it breaks a tie
  across the boundary by its sort order (removing the *lower* ids first), where
  ``process_logits`` keeps the lower ids. Top-k keeps ties in both. (``min_tokens_to_keep=1``
  changes nothing: ``process_logits`` always keeps the most probable token.)
- **Through generate**: the law ``generate`` samples (the target's processed law on its text
  space, and the drafter's with ``drafter_temperature``) is the reference's. ``hsd_core``'s AR
  and SD over models whose ``next_probs`` is :func:`reference_law`, fed the uniforms the backend
  recorded, must emit the same tokens (as the mirror tests do with the backend's own law).

Mutants this file kills (each checked by hand on a copy): ``x * temperature`` for
``x / temperature``; top-k keeping k+1 or k-1 (``topk(x, top_k + 1)``, ``topk(x, top_k - 1)``);
top-p keeping an exact tie (``before <= top_p``); generate's no-top-p path ignoring temperature;
the drafter processed with the target's temperature instead of ``drafter_temperature``; top-p's
sorted-head path taken at a tied boundary (``>=`` for ``>``) or writing one head value too many
(``pos <= m``).
"""

from __future__ import annotations

import functools

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402

from hypothesis import assume, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from transformers.generation.logits_process import (  # noqa: E402
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hsd_core.methods import AR, SD  # noqa: E402
from hsd_core.rand import UniformRand  # noqa: E402
from hsd_core.vocab import Vocabulary  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.engine import laws  # noqa: E402
from hsd_torch.generate import process_logits  # noqa: E402
from hsd_torch.models.mirror import CoreTokenizer, core_text  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402
generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only: the mirror's setting

torch.set_num_threads(1)

INF = math.inf
SLACK = 1e-9  # top-p boundaries closer than this to top_p are left to rounding (Hypothesis cases)


# ---------------------------------------------------------------------------------------------
# the reference


def reference_law(logits: Sequence[float], mask: Sequence[bool], temperature: float = 1.0,
                  top_k: int | None = None, top_p: float | None = None, slack: float = 0.0) -> list[float]:
    """``process_logits``' docstring, written out: ids where ``mask`` is False get probability 0;
    the logits are divided by ``temperature``; top-k keeps the ids whose logit is at least the
    k-th largest (ties kept); top-p keeps, in order of decreasing probability (ties by lower id),
    the ids whose preceding mass (summed exactly) is below ``top_p + slack``, renormalized."""
    v = len(logits)
    x = [lg / temperature if ok else -INF for lg, ok in zip(logits, mask)]
    if top_k is not None:
        kth = sorted(x, reverse=True)[min(top_k, v) - 1]
        x = [xi if xi >= kth else -INF for xi in x]
    top = max(x)
    w = [math.exp(xi - top) if xi > -INF else 0.0 for xi in x]
    total = math.fsum(w)
    probs = [wi / total for wi in w]
    if top_p is None:
        return probs
    keep = [False] * v
    before = Fraction(0)
    for i in sorted(range(v), key=lambda i: (-probs[i], i)):
        keep[i] = before < Fraction(top_p) + Fraction(slack) if slack else before < Fraction(top_p)
        before += Fraction(probs[i])
    kept = math.fsum(p for p, k in zip(probs, keep) if k)
    return [p / kept if k else 0.0 for p, k in zip(probs, keep)]


def support(law: Sequence[float]) -> set[int]:
    return {i for i, p in enumerate(law) if p > 0}


def assert_law(got: Sequence[float], want: Sequence[float], dtype: torch.dtype = torch.float64) -> None:
    """The same support exactly, and the same probabilities: bit for bit in float64 (each is a
    quotient of exact dyadic sums, rounded once, on both sides), to float32's rounding in float32."""
    assert support(got) == support(want), (sorted(support(got)), sorted(support(want)))
    assert list(got) == pytest.approx(list(want), rel=0 if dtype == torch.float64 else 2**-23, abs=0)


@pytest.fixture(autouse=True, scope="module", params=["full sort", "partial sort"])
def top_p_head(request: pytest.FixtureRequest) -> Any:
    """Every test here runs twice: with top-p sorting the whole law (the first head is wider than
    these laws), and with the first head one id wide (``laws.TOP_P_FIRST_K = 1``), so that its
    growth and its tie rule are checked against the reference too."""
    saved = laws.TOP_P_FIRST_K
    laws.TOP_P_FIRST_K = 10**9 if request.param == "full sort" else 1
    yield request.param
    laws.TOP_P_FIRST_K = saved


def processed(logits: Sequence[float], mask: Sequence[bool], dtype: torch.dtype = torch.float64,
              **proc: Any) -> list[float]:
    out: list[float] = process_logits(torch.tensor(list(logits), dtype=dtype), torch.tensor(list(mask)),
                                      **proc).tolist()
    return out


# ---------------------------------------------------------------------------------------------
# exact: dyadic laws, exact ties and boundaries

# weights in quarters (0: a removed id: text mask False, or a logit of -inf); the kept weights
# sum to 16, a power of two, so every probability, preceding mass and renormalization is exact
W = [1, 4, 0, 2, 1, 0, 4, 2, 1, 1]
MASK = [True, True, False, True, True, True, True, True, True, True]  # id 2: no text; id 5: logit -inf
# in decreasing probability, ties by lower id: 1, 6 (1/4 each), 3, 7 (1/8), 0, 4, 8, 9 (1/16)
ORDER = [1, 6, 3, 7, 0, 4, 8, 9]


def dyadic_logits(temperature: float) -> list[float]:
    return [temperature * math.log(w / 4) if w else (-INF if i == 5 else 3.0) for i, w in enumerate(W)]


def exact_law(keep: set[int]) -> list[float]:
    """The weights ``W`` on ``keep``, renormalized (exact rationals, each rounded once)."""
    total = sum(W[i] for i in keep)
    return [float(Fraction(W[i], total)) if i in keep else 0.0 for i in range(len(W))]


def test_the_exact_cases_are_exact_here() -> None:
    """The precondition of the exact tests: exp(-ln 2) and exp(-ln 4) are exactly 1/2 and 1/4 in
    torch (float64 and float32) and in math, so the dyadic laws below are computed exactly."""
    for dt in (torch.float64, torch.float32):
        got = torch.exp(torch.tensor([0.0, math.log(0.5), math.log(0.25)], dtype=dt)).tolist()
        assert got == [1.0, 0.5, 0.25], (dt, got)
    assert [math.exp(math.log(w)) for w in (1.0, 0.5, 0.25)] == [1.0, 0.5, 0.25]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5, 4.0])
def test_temperature_divides_the_logits(dtype: torch.dtype, temperature: float) -> None:
    """Logits ``T * ln(w/4)`` at temperature T are ``ln(w/4)``: the law is w / 16 exactly (and the
    reference's). ``x * T`` gives ``T^2 ln(w/4)``, another law for every T != 1 here."""
    want = exact_law(set(ORDER))  # dyadic: exact in float32 too
    assert reference_law(dyadic_logits(temperature), MASK, temperature) == want
    assert_law(processed(dyadic_logits(temperature), MASK, dtype, temperature=temperature), want, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("top_k", range(1, len(W) + 2))
def test_top_k_keeps_the_ids_at_least_the_kth_largest(dtype: torch.dtype, top_k: int) -> None:
    """Every k from 1 to V+1 over logits with ties at every level: the kept ids are those whose
    logit is at least the k-th largest (the removed ids' -inf counted), ties kept."""
    x = dyadic_logits(2.0)
    ranked = sorted((xi if ok else -INF for xi, ok in zip(x, MASK)), reverse=True)
    kth = ranked[min(top_k, len(x)) - 1]
    keep = {i for i in ORDER if x[i] >= kth}  # id 2 has the largest logit but no text: never counted
    assert support(reference_law(x, MASK, 2.0, top_k=top_k)) == keep
    want = exact_law(keep)  # 1/16 .. 1/4 scaled by 16 / (the kept weights' total): rounded once
    assert reference_law(x, MASK, 2.0, top_k=top_k) == want
    assert_law(processed(x, MASK, dtype, temperature=2.0, top_k=top_k), want, dtype)


# (top_p, the kept ids): each top_p is exactly some token's preceding mass or just off it
TOP_P_CASES = [
    (0.25, {1}),  # id 6's preceding mass is exactly 1/4: not below, dropped (a tie with id 1, by id)
    (0.25 + 2**-20, {1, 6}),
    (0.5, {1, 6}),  # id 3's preceding mass is exactly 1/2
    (0.625, {1, 6, 3}),  # id 7 ties with id 3 and its preceding mass is exactly 5/8
    (0.75, {1, 6, 3, 7}),
    (0.8125, {1, 6, 3, 7, 0}),  # four ties at 1/16: the lowest id (0) first
    (0.875, {1, 6, 3, 7, 0, 4}),
    (0.9375, {1, 6, 3, 7, 0, 4, 8}),
    (0.9375 - 2**-20, {1, 6, 3, 7, 0, 4, 8}),
    (0.999, set(ORDER)),
    (1.0, set(ORDER)),
    (2**-30, {1}),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("top_p,keep", TOP_P_CASES)
def test_top_p_at_exact_boundaries_and_ties(dtype: torch.dtype, top_p: float, keep: set[int]) -> None:
    """Top-p keeps the ids whose preceding mass is strictly below top_p, ties in decreasing
    probability broken by the lower id; a preceding mass exactly equal to top_p is dropped."""
    x = dyadic_logits(2.0)
    want = exact_law(keep)
    assert reference_law(x, MASK, 2.0, top_p=top_p) == want
    assert_law(processed(x, MASK, dtype, temperature=2.0, top_p=top_p), want, dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_top_p_on_uniform_laws(dtype: torch.dtype, m: int) -> None:
    """Uniform over m = 2^j ids (constant logits, exact everywhere: exp(0) = 1): top_p = j/m keeps
    exactly the j lowest ids; a hair above j/m keeps j + 1. Removed ids interleaved."""
    v = 2 * m + 1
    mask = [i % 2 == 1 or i == v - 1 for i in range(v)]  # odd ids and the last
    allowed = [i for i in range(v) if mask[i]][:m]
    logits = [1.5 if i in allowed else (-INF if i % 4 == 0 else 7.0) for i in range(v)]
    mask = [i in allowed or logits[i] == -INF for i in range(v)]
    for j in range(1, m + 1):
        for top_p, n_keep in ((j / m, j), (j / m + 2**-20, min(j + 1, m))):
            if top_p > 1:
                continue
            keep = set(allowed[:n_keep])
            want = [1.0 / n_keep if i in keep else 0.0 for i in range(v)]
            assert reference_law(logits, mask, top_p=top_p) == want
            assert_law(processed(logits, mask, dtype, top_p=top_p), want, dtype)


def test_processing_in_order_exact() -> None:
    """All three, in order: temperature 2, top-k 3 (ids 1, 6, 3 and 7: the tie at the 3rd largest
    kept), then top-p 0.75 of that law (1/3, 1/3, 1/6, 1/6: id 3's preceding mass 2/3 is below
    0.75, id 7's 5/6 is not), renormalized: 2/5, 2/5, 1/5 (not dyadic: to rounding)."""
    x = dyadic_logits(2.0)
    got = processed(x, MASK, temperature=2.0, top_k=3, top_p=0.75)
    want = reference_law(x, MASK, 2.0, top_k=3, top_p=0.75)
    assert support(want) == {1, 6, 3}
    assert got == pytest.approx(want, rel=1e-15, abs=0)
    assert want[1] == want[6] == pytest.approx(0.4) and want[3] == pytest.approx(0.2)


# ---------------------------------------------------------------------------------------------
# Hypothesis: drawn logits, ties on purpose

# logits from a grid 1/2 apart (ties likely, distinct values far apart at any drawn temperature,
# so no two distinct logits give probabilities within rounding of each other), or -inf
LOGIT = st.one_of(st.sampled_from([-INF]), st.integers(-12, 12).map(lambda i: i / 2))


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[float], list[bool], dict[str, Any]]:
    v = draw(st.integers(1, 12))
    logits = draw(st.lists(LOGIT, min_size=v, max_size=v))
    mask = draw(st.lists(st.booleans(), min_size=v, max_size=v))
    keep = draw(st.integers(0, v - 1))  # at least one id with text and a finite logit
    mask[keep] = True
    if logits[keep] == -INF:
        logits[keep] = 0.0
    temperature = draw(st.sampled_from([0.25, 0.5, 0.7, 1.0, 1.3, 2.0, 4.0]))
    top_k = draw(st.one_of(st.none(), st.integers(1, v + 1)))
    top_p = draw(st.one_of(st.none(), st.sampled_from([0.25, 0.5, 0.75, 0.9, 1.0]),
                           st.floats(0.001, 1.0, allow_nan=False)))
    return logits, mask, {"temperature": temperature, "top_k": top_k, "top_p": top_p}


@given(cases())
@example(([0.0, 0.0, 0.0, 0.0], [True] * 4, {"temperature": 1.0, "top_k": None, "top_p": 0.5}))
@example(([1.0, 3.0, 3.0, 2.0, 2.0], [True] * 5, {"temperature": 0.5, "top_k": 2, "top_p": None}))
@example(([1.0, 3.0, 2.0, 2.0, 0.5], [True] * 5, {"temperature": 0.7, "top_k": 3, "top_p": None}))
@example(([2.0, 1.0, 1.0, 0.0], [True, False, True, True], {"temperature": 4.0, "top_k": 3, "top_p": 0.6}))
@settings(max_examples=400, deadline=None, derandomize=True)
def test_process_logits_is_the_reference(case: tuple[list[float], list[bool], dict[str, Any]]) -> None:
    """Drawn logits (float64): the support lies between the reference's at top_p - 1e-9 and at
    top_p + 1e-9 (equal to it unless a preceding mass lies within 1e-9 of top_p), and the
    probabilities are the reference's renormalized on it, to 1e-12."""
    logits, mask, proc = case
    got = processed(logits, mask, **proc)
    sup = support(got)
    if proc["top_p"] is None:
        want = reference_law(logits, mask, **proc)
        assert sup == support(want), (sup, support(want))
    else:
        lo = support(reference_law(logits, mask, **proc, slack=-SLACK))
        hi = support(reference_law(logits, mask, **proc, slack=SLACK))
        assert lo <= sup <= hi, (lo, sup, hi)
        base = reference_law(logits, mask, **dict(proc, top_p=None))
        kept = math.fsum(base[i] for i in sup)
        want = [base[i] / kept if i in sup else 0.0 for i in range(len(base))]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-300)


def warpers(logits: Sequence[float], mask: Sequence[bool], temperature: float, top_k: int | None,
            top_p: float | None) -> list[float]:
    """transformers' warpers in ``model.generate``'s order (temperature, top-k, top-p), the
    removed ids suppressed first (-inf, as ``suppress_tokens`` does), then softmax."""
    scores = torch.tensor([[lg if ok else -INF for lg, ok in zip(logits, mask)]], dtype=torch.float64)
    ids = torch.zeros((1, 1), dtype=torch.long)
    scores = TemperatureLogitsWarper(temperature)(ids, scores)
    if top_k is not None:
        scores = TopKLogitsWarper(top_k)(ids, scores)
    if top_p is not None:
        scores = TopPLogitsWarper(top_p)(ids, scores)
    out: list[float] = torch.softmax(scores, dim=-1)[0].tolist()
    return out


@given(st.integers(2, 40).flatmap(lambda v: st.tuples(
    st.lists(st.floats(-8, 8, allow_nan=False), min_size=v, max_size=v),
    st.lists(st.booleans(), min_size=v, max_size=v),
    st.floats(0.1, 5.0), st.one_of(st.none(), st.integers(1, v + 2)),
    st.one_of(st.none(), st.floats(0.01, 1.0)))))
@settings(max_examples=300, deadline=None, derandomize=True)
def test_process_logits_is_transformers_warpers(case: tuple[list[float], list[bool], float, int | None,
                                                            float | None]) -> None:
    """Where transformers agrees (no preceding mass within 1e-9 of top_p and no probability tie
    between the last kept and the first dropped id: see the module docstring), its warpers give
    the same law, to 1e-12, with the same support (and so does the reference)."""
    logits, mask, temperature, top_k, top_p = case
    mask[0] = True
    base = reference_law(logits, mask, temperature, top_k)
    if top_p is not None:
        order = sorted((i for i in range(len(base)) if base[i] > 0), key=lambda i: (-base[i], i))
        before = Fraction(0)
        for a, b in zip(order, order[1:] + [None]):
            before += Fraction(base[a])
            assume(abs(before - Fraction(top_p)) > SLACK)  # no boundary within rounding
            if b is not None and before >= Fraction(top_p) > before - Fraction(base[a]):
                assume(base[a] != base[b])  # no tie across the boundary
    want = reference_law(logits, mask, temperature, top_k, top_p)
    theirs = warpers(logits, mask, temperature, top_k, top_p)
    ours = processed(logits, mask, temperature=temperature, top_k=top_k, top_p=top_p)
    assert support(ours) == support(theirs) == support(want)
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-300)
    assert ours == pytest.approx(want, rel=1e-12, abs=1e-300)


def test_where_transformers_top_p_differs() -> None:
    """The documented difference: a tie across the top-p boundary. Uniform over 4 ids at top_p
    0.5: process_logits keeps the two lowest ids; transformers keeps two ids of the tie by its
    sort order. Both keep two, with the same probabilities."""
    logits, mask = [0.0] * 4, [True] * 4
    ours = processed(logits, mask, top_p=0.5)
    assert ours == reference_law(logits, mask, top_p=0.5) == [0.5, 0.5, 0.0, 0.0]
    theirs = warpers(logits, mask, 1.0, None, 0.5)
    assert sorted(theirs) == sorted(ours)


# ---------------------------------------------------------------------------------------------
# through generate: the law it samples, target and drafter


class ReferenceModel:
    """An ``hsd_core`` model over a Hugging Face model whose ``next_probs`` is
    :func:`reference_law` of its logits (float64), over the mirror's core ids (ids with text
    increasing, EOS last: :class:`hsd_torch.models.mirror.CoreTokenizer`), every context after the
    prompt's special start as ``generate`` builds it."""

    def __init__(self, model: Any, tokenizer: Any, prompt: str, **process: Any) -> None:
        self.model = model
        self.text = TokenText(tokenizer, int(model.get_output_embeddings().weight.shape[0]))
        self.core = CoreTokenizer(self.text)
        self.start = self.text.start(prompt)
        self.mask = self.text.text_mask.tolist()
        self.process = process
        self.cache: dict[tuple[int, ...], tuple[float, ...]] = {}

    @property
    def vocab(self) -> Vocabulary:
        return self.core.vocab

    @property
    def tokenizer(self) -> CoreTokenizer:
        return self.core

    def next_probs(self, context_ids: Sequence[int]) -> tuple[float, ...]:
        ctx = tuple(int(i) for i in context_ids)
        if ctx not in self.cache:
            ids = self.start + self.core.to_hf(ctx)
            with torch.inference_mode():
                logits = self.model(input_ids=torch.tensor([ids])).logits[0, -1].double().tolist()
            law = reference_law(logits, self.mask, **self.process)
            self.cache[ctx] = tuple(law[i] for i in self.core.hf_ids)
        return self.cache[ctx]


PROMPTS = ["def foo(x):\n", "Hello", "naïve café"]


@pytest.mark.parametrize("method,process,dtemp", [
    ("ar", {"temperature": 0.7, "top_k": 12, "top_p": None}, None),  # the no-top-p path: temperature, top-k
    ("ar", {"temperature": 1.6, "top_k": None, "top_p": 0.8}, None),
    ("sd", {"temperature": 1.3, "top_k": 30, "top_p": None}, 0.6),  # the drafter at its own temperature
    ("sd", {"temperature": 0.8, "top_k": None, "top_p": 0.9}, 2.0),
])
def test_generate_samples_the_reference_law(method: str, process: dict[str, Any], dtemp: float | None,
                                            toks: dict[str, Any], models: dict[str, Any]) -> None:
    """generate's tokens, replayed: ``hsd_core``'s AR / SD over :class:`ReferenceModel` target and
    drafter (the drafter at ``drafter_temperature``), fed the uniforms each row consumed, emits
    the same tokens, and reads every one of them. A law ``generate`` samples that is not the
    reference's (off by more than rounding) moves some inverse-CDF draw or ratio test."""
    target, drafter, tok = models["llama_bpe"], models["gpt2_bpe"], toks["byte_bpe"]
    use_d = method == "sd"
    max_new = 10
    out = generate(target, drafter if use_d else None, PROMPTS, target_tokenizer=tok,
                   drafter_tokenizer=tok if use_d else None, method=method, lookahead=3, max_new_tokens=max_new,
                   seed=7, record_uniforms=True, drafter_temperature=dtemp, **process)
    assert out.uniforms is not None
    d_process = dict(process, temperature=process["temperature"] if dtemp is None else dtemp)
    ref = AR() if method == "ar" else SD(lookahead=3)
    for i, prompt in enumerate(PROMPTS):
        ct = ReferenceModel(target, tok, prompt, **process)
        cd = ReferenceModel(drafter, tok, prompt, **d_process) if use_d else None
        rand = UniformRand(out.uniforms[i])
        got = ct.core.to_hf(ref.generate(ct, cd, core_text(prompt), max_new, rng=rand))
        assert got == out.sequences[i], (method, process, prompt)
        assert rand.used == len(out.uniforms[i])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("first_k", [1, 3, 64])
def test_partial_top_p_is_the_full_sort_bit_for_bit(dtype: torch.dtype, first_k: int) -> None:
    """On large laws (V = 50,000, rows of different sharpness, rounded logits so that many ids tie,
    ties across the boundary among them), the kept set from a partial sort is the full sort's,
    and the processed laws are equal bit for bit, at several top-p values."""
    g = torch.Generator().manual_seed(0)
    v = 50_000
    x = torch.randn((4, v), generator=g, dtype=torch.float64) * torch.tensor([[1.0], [4.0], [8.0], [16.0]],
                                                                            dtype=torch.float64)
    x = (x * 2).round() / 2  # many equal logits: ties everywhere, the boundary among them
    x[0, :5] = x[0].max()  # a row whose top five tie
    probs = torch.softmax(x.to(dtype), dim=-1)
    drop = torch.zeros(v, dtype=torch.bool)
    n_partial_ties = 0
    for top_p in (1e-9, 0.1, 0.5, 0.9, 0.99):
        full = laws.top_p_keep(probs, top_p, first_k=v)
        got = laws.top_p_keep(probs, top_p, first_k=first_k)
        assert torch.equal(got, full), top_p
        last = torch.where(full, probs, torch.full_like(probs, 2.0)).min(-1, keepdim=True).values
        n_partial_ties += int(((probs == last) & ~full).any(-1).sum())  # a tie split by the boundary
        saved = laws.TOP_P_FIRST_K
        try:
            laws.TOP_P_FIRST_K = v
            want = laws.process_with_drop(x.to(dtype), drop, 1.0, None, top_p)
            laws.TOP_P_FIRST_K = first_k
            assert torch.equal(laws.process_with_drop(x.to(dtype), drop, 1.0, None, top_p), want)
        finally:
            laws.TOP_P_FIRST_K = saved
    assert n_partial_ties > 0, "no case split a tie at the boundary: the tie rule went untested"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_top_p_law_is_the_kept_probabilities_over_their_sorted_sum(dtype: torch.dtype) -> None:
    """``top_p_law`` (both of its paths: written from the sorted head where every row's boundary is
    strict, through the kept mask where a tie crosses it) equals, bit for bit, the law built
    independently: the full stable sort's kept set, each kept probability divided by the kept values'
    sum taken in decreasing order, +0 elsewhere."""
    g = torch.Generator().manual_seed(1)
    v = 20_000
    x = torch.randn((4, v), generator=g, dtype=torch.float64) * torch.tensor([[1.0], [4.0], [8.0], [16.0]],
                                                                            dtype=torch.float64)
    strict_rows = x.clone()  # continuous logits: no ties anywhere (the sorted-head path)
    tied_rows = (x * 2).round() / 2  # many equal values: the boundary falls among ties for some top-p
    paths = set()
    for rows in (strict_rows, tied_rows):
        probs = torch.softmax(rows.to(dtype), dim=-1)
        for top_p in (1e-9, 0.3, 0.9, 0.99):
            srt = torch.sort(probs, dim=-1, descending=True, stable=True)
            csum = torch.cumsum(srt.values, dim=-1)
            keep_sorted = (csum - srt.values) < top_p
            keep_sorted[..., :1] = True
            m = keep_sorted.sum(-1, keepdim=True)
            keep = torch.zeros_like(probs, dtype=torch.bool).scatter_(-1, srt.indices, keep_sorted)
            want = torch.where(keep, probs / csum.gather(-1, m - 1), torch.zeros((), dtype=dtype))
            strict = bool((srt.values.gather(-1, m - 1) > srt.values.gather(-1, torch.clamp(m, max=v - 1))).all())
            paths.add(strict)
            got = laws.top_p_law(probs.clone(), top_p)
            assert torch.equal(got, want), (top_p, strict)
            assert torch.equal(got != 0, keep)
            assert torch.equal(laws.process_with_drop(rows.to(dtype), torch.zeros(v, dtype=torch.bool), 1.0, None,
                                                      top_p), want)
    assert paths == {True, False}, "both paths of top_p_law must be exercised"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_top_p_law_at_a_space_is_the_dense_law_selected(dtype: torch.dtype) -> None:
    """``space_law`` with top-p writes the law at the space's columns directly on the sorted-head
    path: bit for bit the dense law of ``process_with_drop`` taken at those columns, for a space
    that is not one run of ids (EOS last) with removed ids, on strict and on tied boundaries."""
    g = torch.Generator().manual_seed(2)
    v = 5_000
    ids = [i for i in range(v) if i % 7 != 3 and i != 5] + [5]  # ids with text, then EOS (5); 1/7 removed
    space = laws.TextSpace(ids, v, torch.device("cpu"))
    drop = space.drop_mask()
    x = torch.randn((3, 4, v), generator=g, dtype=torch.float64) * 6
    for logits in (x, (x * 2).round() / 2):
        for top_p in (0.2, 0.9, 0.995):
            for top_k in (None, 50):
                dense = laws.process_with_drop(logits.to(dtype), drop, 0.7, top_k, top_p)
                got = laws.space_law(logits.to(dtype), space, drop, 0.7, top_k, top_p)
                assert got.shape == (3, 4, len(ids))
                assert torch.equal(got, space.select(dense)), (top_p, top_k)
                assert float(dense[..., drop].abs().sum()) == 0.0
