"""hsd_torch.engine.kernels mirrors hsd_core: same decisions on the same uniforms, sane numerics, teeth.

* Coupled tests (Hypothesis): every kernel and the hsd_core code it mirrors are fed the same laws
  and the same uniforms (the ones the row read, in the documented order); outputs are identical
  row by row in float64, and the reference consumes exactly the uniforms the kernel says it read.
* float32: agreement except at rounding boundaries; the measured rate is bounded here and
  recorded in docs/kernels.md (``python bench/kernel_speed.py --agreement``).
* Numerics: underflowed q, empty residuals, bfloat16, padded vocabularies, invalid inputs.
* A sampled check with teeth (hsd_core.stats): the first emitted token's law is p, and the same
  test rejects a kernel fed the wrong q.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hsd_core import LongestMatchTokenizer, Vocabulary  # noqa: E402
from hsd_core.methods.base import RejectionVerifier, RoundOutcome, State  # noqa: E402
from hsd_core.methods.slem import SLEM  # noqa: E402
from hsd_core.models import FunctionModel, Model  # noqa: E402
from hsd_core.rand import Rand, UniformRand, inverse_cdf  # noqa: E402
from hsd_core.stats import assert_law_matches, min_num_samples_for_tv, min_tv_detectable  # noqa: E402
from hsd_torch.engine.kernels import (Verified, _draw_host, _ratio_test, _rejection_host, compute_dtype,  # noqa: E402
                               exact_match_verify,
                               rejection_verify, sample)

NO_BUDGET = 10**9


# ---------------------------------------------------------------------------------------------
# Reference side: hsd_core models whose laws are given rows of a tensor
# ---------------------------------------------------------------------------------------------

def row_model(laws: np.ndarray) -> Model:
    """An hsd_core model over a vocabulary of ``V`` ids (the last is EOS) whose law after a context
    of length j is ``laws[j]`` (float64 rows)."""
    v = laws.shape[-1]
    vocab = Vocabulary([chr(0x100 + i) for i in range(v - 1)])
    rows = [tuple(float(x) for x in r) for r in laws]
    return FunctionModel(vocab, LongestMatchTokenizer(vocab), lambda ctx: rows[len(ctx)])


def ref_rejection(p: np.ndarray, q: np.ndarray, drafts: Sequence[int], n: int, uniforms: list[float],
                  greedy: bool, budget: int) -> tuple[RoundOutcome, int]:
    """RejectionVerifier.verify on one row; returns the outcome and the uniforms it read."""
    model = row_model(p)
    qs = [tuple(float(x) for x in q[j]) for j in range(n)]
    ver = RejectionVerifier()
    ver.greedy = greedy
    rand = UniformRand(uniforms)
    out = ver.verify(model, (), [int(d) for d in drafts[:n]], qs, rand, budget)
    return out, rand.used


class _FixedCandidates(SLEM):
    """SLEM whose candidates are given (the verification loop under test is SLEM.step's own)."""

    def __init__(self, cands: tuple[int, ...], greedy: bool) -> None:
        super().__init__(lookahead=1, greedy=greedy)
        self._cands = cands

    def candidates(self, target: Model, drafter: Model, state: State, rand: Rand) -> tuple[int, ...]:
        return self._cands


def ref_exact_match(p: np.ndarray, cands: Sequence[int], n: int, uniforms: list[float], greedy: bool,
                    budget: int) -> tuple[RoundOutcome, int]:
    model = row_model(p)
    rand = UniformRand(uniforms)
    out = _FixedCandidates(tuple(int(c) for c in cands[:n]), greedy).step(
        model, model, State("", (), budget), rand)
    return out, rand.used


def read_rejection(v: Verified, b: int, u_accept: np.ndarray, u_final: np.ndarray, n: int) -> list[float]:
    """The uniforms row ``b`` read, in the documented order."""
    acc, emitted = int(v.n_accepted[b]), int(v.n_emitted[b])
    tested = acc + 1 if (emitted > acc and acc < n) else acc
    return [float(x) for x in u_accept[b, :tested]] + ([float(u_final[b])] if emitted > acc else [])


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

@st.composite
def law_rows(draw: st.DrawFn, count: int, v: int) -> np.ndarray:
    """``count`` float64 laws over ``v`` ids: random, sparse, one-hot, uniform or repeated."""
    rows = []
    for _ in range(count):
        kind = draw(st.sampled_from(["dense", "sparse", "onehot", "uniform", "repeat"]))
        if kind == "repeat" and rows:
            rows.append(rows[-1].copy())
            continue
        if kind == "onehot":
            r = np.zeros(v)
            r[draw(st.integers(0, v - 1))] = 1.0
        elif kind == "uniform":
            r = np.full(v, 1.0 / v)
        else:
            w = np.array(draw(st.lists(st.integers(0 if kind == "sparse" else 1, 50), min_size=v, max_size=v)),
                         dtype=np.float64)
            if w.sum() == 0:
                w[draw(st.integers(0, v - 1))] = 1.0
            r = w / w.sum()
        rows.append(r)
    return np.stack(rows)


@st.composite
def verify_batches(draw: st.DrawFn) -> dict[str, object]:
    """A ragged batch for the verifiers: p [B, K+1, V], q [B, K, V], drafts drawn from q's support
    (EOS possible), uniforms, budgets."""
    b = draw(st.integers(1, 5))
    k = draw(st.integers(0, 4))
    v = draw(st.integers(2, 9))
    relation = draw(st.sampled_from(["independent", "equal", "disjoint"]))
    p = np.stack([draw(law_rows(k + 1, v)) for _ in range(b)])
    if relation == "equal":
        q = p[:, :k].copy()
    elif relation == "disjoint" and v >= 4:
        q = np.zeros((b, k, v))
        half = v // 2
        for i in range(b):
            for j in range(k):
                q[i, j, :half] = draw(law_rows(1, half))[0] if p[i, j, :half].sum() == 0 else 0
                if q[i, j].sum() == 0:  # p has mass on the low half: put q on the high half
                    q[i, j, half:] = draw(law_rows(1, v - half))[0]
    else:
        q = np.stack([draw(law_rows(k, v)) for _ in range(b)]) if k else np.zeros((b, 0, v))
    drafts = np.zeros((b, k), dtype=np.int64)
    n = np.array([draw(st.integers(0, k)) for _ in range(b)], dtype=np.int64)
    for i in range(b):
        for j in range(k):
            drafts[i, j] = draw(st.sampled_from([int(x) for x in np.nonzero(q[i, j])[0]]))
    if draw(st.booleans()):  # as drafted (nothing past an EOS); otherwise an EOS may sit mid-row
        for i in range(b):
            eos_at = [j for j in range(int(n[i])) if drafts[i, j] == v - 1]
            if eos_at:
                n[i] = eos_at[0] + 1
    budget = np.array([draw(st.integers(int(max(n[i], 1)), int(max(n[i], 1)) + 2)) for i in range(b)])
    use_budget = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    g = np.random.default_rng(seed)
    return dict(p=p, q=q, drafts=drafts, n=n, budget=budget if use_budget else None,
                u_accept=g.random((b, k)), u_final=g.random(b), u=g.random((b, k + 1)),
                greedy=draw(st.booleans()), check=draw(st.booleans()))


def assert_host_matches_tensors(out: Verified) -> None:
    """The kernels decide on the host and return both forms: the lists must equal the tensors."""
    plain = Verified(out.tokens, out.n_accepted, out.n_emitted)  # no host copy: reads the tensors
    assert out.rows() == plain.rows() and out.accepted() == plain.accepted() == out.n_accepted.tolist()
    assert out.tokens.shape[0] == out.n_accepted.shape[0] == out.n_emitted.shape[0]


def t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


# ---------------------------------------------------------------------------------------------
# Coupled tests: float64, identical outputs
# ---------------------------------------------------------------------------------------------

@settings(max_examples=300)
@given(verify_batches())
def test_rejection_verify_mirrors_reference(case: dict[str, object]) -> None:
    p, q, drafts, n = case["p"], case["q"], case["drafts"], case["n"]
    budget, greedy = case["budget"], bool(case["greedy"])
    ua, uf = case["u_accept"], case["u_final"]
    assert isinstance(p, np.ndarray) and isinstance(q, np.ndarray) and isinstance(n, np.ndarray)
    assert isinstance(drafts, np.ndarray) and isinstance(ua, np.ndarray) and isinstance(uf, np.ndarray)
    v = p.shape[-1]
    out = rejection_verify(t(p), t(q), t(drafts), t(n), t(ua), t(uf), greedy=greedy, eos_id=v - 1,
                           budget=None if budget is None else t(np.asarray(budget)), check=bool(case["check"]))
    rows = out.rows()
    assert_host_matches_tensors(out)
    for b in range(p.shape[0]):
        read = [] if greedy else read_rejection(out, b, ua, uf, int(n[b]))
        bud = NO_BUDGET if budget is None else int(np.asarray(budget)[b])
        ref, used = ref_rejection(p[b], q[b], drafts[b], int(n[b]), read, greedy, bud)
        assert rows[b] == list(ref.tokens), (b, rows[b], ref)
        assert int(out.n_accepted[b]) == ref.accepted
        assert used == len(read), "the reference read other uniforms than the kernel says it used"
        assert all(p[b, j, tok] > 0 for j, tok in enumerate(rows[b])), "emitted a token of probability 0"


@settings(max_examples=300)
@given(verify_batches())
def test_exact_match_verify_mirrors_reference(case: dict[str, object]) -> None:
    p, cands, n, u = case["p"], case["drafts"], case["n"], case["u"]
    budget, greedy = case["budget"], bool(case["greedy"])
    assert isinstance(p, np.ndarray) and isinstance(cands, np.ndarray) and isinstance(n, np.ndarray)
    assert isinstance(u, np.ndarray)
    v = p.shape[-1]
    out = exact_match_verify(t(p), t(cands), t(n), t(u), greedy=greedy, eos_id=v - 1,
                             budget=None if budget is None else t(np.asarray(budget)), check=bool(case["check"]))
    rows = out.rows()
    assert_host_matches_tensors(out)
    for b in range(p.shape[0]):
        read = [] if greedy else [float(x) for x in u[b, : int(out.n_emitted[b])]]
        bud = NO_BUDGET if budget is None else int(np.asarray(budget)[b])
        ref, used = ref_exact_match(p[b], cands[b], int(n[b]), read, greedy, bud)
        assert rows[b] == list(ref.tokens), (b, rows[b], ref)
        assert int(out.n_accepted[b]) == ref.accepted
        assert used == len(read)


@settings(max_examples=200)
@given(st.integers(1, 40).flatmap(lambda v: st.tuples(
    st.lists(st.sampled_from([0.0, 0.0, 1e-300, 1e-17, 0.1, 0.25, 0.5, 1.0, 3.0, 7.5]), min_size=v, max_size=v)
    .filter(lambda xs: sum(xs) > 0),
    st.one_of(st.floats(0.0, 1.0, exclude_max=True), st.just(float(np.nextafter(1.0, 0.0)))))))
def test_sample_mirrors_inverse_cdf(args: tuple[list[float], float]) -> None:
    probs, u = args
    got = int(sample(torch.tensor([probs], dtype=torch.float64), torch.tensor([u], dtype=torch.float64))[0])
    assert got == inverse_cdf(probs, u)
    assert probs[got] > 0


@pytest.mark.parametrize("probs, u, expected", [
    ([0.0, 0.0, 0.5, 0.5], 0.0, 2),  # u = 0 never picks a leading zero-probability id
    ([0.5, 0.5], 0.5, 1),  # u * total exactly on a partial sum belongs to the next cell
    ([0.25, 0.0, 0.25, 0.5], 0.25, 2),
    ([0.25, 0.0, 0.0, 0.75], 0.25, 3),
])
def test_sample_boundaries(probs: list[float], u: float, expected: int) -> None:
    got = int(sample(torch.tensor([probs], dtype=torch.float64), torch.tensor([u], dtype=torch.float64))[0])
    assert got == inverse_cdf(probs, u) == expected


def test_sample_rounding_past_the_last_partial_sum() -> None:
    """In float32, a uniform just below 1 rounds to 1.0, so ``u * total`` reaches the last partial
    sum: the draw is the last index of positive probability (never a trailing zero-probability id),
    as in the reference."""
    u = 1.0 - 1e-9
    assert float(torch.tensor(u, dtype=torch.float32)) == 1.0
    probs = [0.2, 0.3, 0.0, 0.5, 0.0, 0.0]
    got = int(sample(torch.tensor([probs], dtype=torch.float32), torch.tensor([u], dtype=torch.float64))[0])
    assert got == inverse_cdf(probs, u) == 3
    bf = torch.tensor([probs], dtype=torch.bfloat16)
    assert int(sample(bf, torch.tensor([u], dtype=torch.float64))[0]) == 3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_host_list_draw_equals_sample(dtype: torch.dtype) -> None:
    """generate draws with kernels._draw_host (the ids and each row's total read back, the rounding
    case found on the host, rows not normalized): the same ids as ``sample``, rows past the last
    partial sum included, and the totals are the rows' left-to-right sums."""
    g = np.random.default_rng(5)
    probs = g.dirichlet(np.full(30, 0.3), size=200) * g.uniform(0.1, 3.0, size=(200, 1))  # unnormalized rows
    probs[::7, 20:] = 0.0  # trailing zeros: the rounding case must not land on them
    u = g.random(200)
    u[::7] = 1.0 - 1e-9  # rounds to 1.0 in float32
    pt, ut = t(probs).to(dtype), t(u)
    for uu in (ut, u.tolist()):
        ids, totals = _draw_host(pt, uu)
        assert ids == sample(pt, ut).tolist()
        assert totals == torch.cumsum(pt, dim=-1)[:, -1].tolist()
    bad = pt.clone()
    bad[3] = float("nan")
    bad[4] = 0.0
    _, totals = _draw_host(bad, ut)
    assert not totals[3] == totals[3] and totals[4] == 0.0  # NaN and empty rows show in their totals


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_host_ratio_test_equals_the_tensor_expression(dtype: torch.dtype) -> None:
    """The verifiers' accept test runs on the host (kernels._ratio_test): it must decide exactly as
    ``(p / q >= 1) | (u.to(dtype) < p / q)`` over tensors, including q = 0 (p > 0: accept; p = 0:
    NaN, reject), NaN entries, ratios at and next to 1, and uniforms equal to the ratio."""
    g = np.random.default_rng(11)
    n = 20_000
    px = g.dirichlet(np.full(50, 0.2), size=n)[:, 0]
    qx = px * g.choice([0.5, 0.999999, 1.0, 1.000001, 2.0, 1e-30], size=n) + g.choice([0.0, 1e-9], size=n)
    qx[::97] = 0.0
    px[::89] = 0.0
    px[::193] = float("nan")
    u = g.random(n)
    pt, qt = torch.tensor(px).to(dtype), torch.tensor(qx).to(dtype)
    ratio = torch.clamp(pt / qt, max=1.0)
    u[::5] = ratio[::5].double().clamp(max=0.999).numpy()  # uniforms on (or at the rounding of) the ratio
    expected = ((ratio >= 1) | (torch.tensor(u).to(dtype) < ratio)).tolist()
    assert _ratio_test(u.tolist(), pt.tolist(), qt.tolist(), dtype) == expected
    assert any(expected) and not all(expected)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_ratio_at_least_one_accepts_a_uniform_that_rounds_to_one(dtype: torch.dtype) -> None:
    """A draft with ``p(x) >= q(x)`` is accepted with probability 1, as the reference's
    ``u < min(1, p/q)`` accepts every uniform in [0, 1): also a float64 uniform just below 1 that
    rounds to 1.0 in float32 (about 3 uniforms in 1e8), whose rounded comparison ``1.0 < 1.0``
    would reject it. Ratios equal to 1 and above it, through the public kernel."""
    u = 1.0 - 1e-9
    assert float(torch.tensor(u, dtype=torch.float32)) == 1.0
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], [[0.6, 0.4, 0.0], [0.2, 0.3, 0.5]]], dtype=dtype)
    q = torch.tensor([[[0.5, 0.5, 0.0]], [[0.1, 0.9, 0.0]]], dtype=dtype)  # ratio 1, and 6
    drafts = torch.tensor([[0], [0]])
    v = rejection_verify(p, q, drafts, torch.tensor([1, 1]), torch.tensor([[u], [u]], dtype=torch.float64),
                         torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert v.accepted() == [1, 1]
    assert _ratio_test([u, u], [0.5, 0.6], [0.5, 0.1], compute_dtype(p)) == [True, True]


# ---------------------------------------------------------------------------------------------
# float32 / bfloat16
# ---------------------------------------------------------------------------------------------

def random_batch(g: np.random.Generator, b: int, k: int, v: int, conc: float = 0.3) -> dict[str, np.ndarray]:
    p = g.dirichlet(np.full(v, conc), size=(b, k + 1))
    q = g.dirichlet(np.full(v, conc), size=(b, k))
    drafts = np.zeros((b, k), dtype=np.int64)
    cs = np.cumsum(q, axis=-1)
    drafts = np.minimum((cs < g.random((b, k, 1)) * cs[..., -1:]).sum(-1), v - 1)
    return dict(p=p, q=q, drafts=drafts, n=np.full(b, k), ua=g.random((b, k)), uf=g.random(b),
                u=g.random((b, k + 1)))


def float32_disagreement(rows: int = 4000, k: int = 4, v: int = 500, seed: int = 0) -> tuple[float, float]:
    """Fraction of rows whose float32 output differs from the float64 output (rejection, exact match)."""
    c = random_batch(np.random.default_rng(seed), rows, k, v)
    args64 = (t(c["p"]), t(c["q"]), t(c["drafts"]), t(c["n"]), t(c["ua"]), t(c["uf"]))
    r64 = rejection_verify(*args64).tokens
    r32 = rejection_verify(args64[0].float(), args64[1].float(), *args64[2:]).tokens
    e64 = exact_match_verify(t(c["p"]), t(c["drafts"]), t(c["n"]), t(c["u"])).tokens
    e32 = exact_match_verify(t(c["p"]).float(), t(c["drafts"]), t(c["n"]), t(c["u"])).tokens
    return float((r64 != r32).any(1).double().mean()), float((e64 != e32).any(1).double().mean())


def test_float32_agrees_except_at_rounding_boundaries() -> None:
    """4,000 rows, K=4, V=500: float32 inputs give the float64 decisions on all but a rounding
    fraction of rows (measured ~0 here; bounded at 0.5 %, a real bug changes a large fraction)."""
    rej, em = float32_disagreement()
    assert rej <= 0.005 and em <= 0.005, (rej, em)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_never_nan_never_zero_probability(dtype: torch.dtype) -> None:
    c = random_batch(np.random.default_rng(1), 2000, 4, 300, conc=0.05)  # peaked: many underflows
    p, q = t(c["p"]).to(dtype), t(c["q"]).to(dtype)
    out = rejection_verify(p, q, t(c["drafts"]), t(c["n"]), t(c["ua"]), t(c["uf"]))
    em = exact_match_verify(p, t(c["drafts"]), t(c["n"]), t(c["u"]))
    for res in (out, em):
        toks = res.tokens
        assert bool(((toks >= 0).sum(1) == res.n_emitted).all())
        pos = torch.arange(toks.shape[1]).expand_as(toks)
        mask = toks >= 0
        pv = p.float()[torch.arange(toks.shape[0]).unsqueeze(1).expand_as(toks)[mask], pos[mask], toks[mask]]
        assert bool((pv > 0).all()), "a token the target (as given) assigns probability 0 was emitted"


def test_underflowed_q_accepts_when_p_positive_and_never_when_p_zero() -> None:
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]], dtype=torch.float32).repeat(2, 1, 1)
    q = torch.tensor([[[0.0, 1.0, 0.0]]], dtype=torch.float32).repeat(2, 1, 1)  # q(x)=0 after underflow
    p[1, 0] = torch.tensor([0.0, 1.0, 0.0])
    drafts = torch.tensor([[0], [0]])
    out = rejection_verify(p, q, drafts, torch.tensor([1, 1]), torch.tensor([[0.999], [0.0]]),
                           torch.tensor([0.5, 0.5]))
    assert out.rows()[0][0] == 0 and int(out.n_accepted[0]) == 1  # p>0, q=0: accepted
    assert int(out.n_accepted[1]) == 0 and out.rows()[1] == [1]  # p=0: rejected even at u=0
    assert not torch.isnan(out.tokens.float()).any()


def test_zero_residual_falls_back_to_p() -> None:
    """q = p up to a rounding that makes p(x) < q(x) with no positive residual: the correction is
    drawn from p (hsd_core.laws.residual's rule), never NaN, and the reference agrees."""
    p = np.array([[0.5, 0.5], [0.5, 0.5]])
    q = np.array([[0.5 + 2**-40, 0.5 + 2**-40]])
    u = float(np.nextafter(1.0, 0.0))  # above p/q = 1 - 2^-39: the draft is rejected
    out = rejection_verify(t(p[None]), t(q[None]), torch.tensor([[0]]), torch.tensor([1]),
                           torch.tensor([[u]], dtype=torch.float64), torch.tensor([0.75], dtype=torch.float64))
    assert int(out.n_accepted[0]) == 0 and out.rows()[0] == [1]
    ref, used = ref_rejection(p, q, [0], 1, [u, 0.75], False, NO_BUDGET)
    assert list(ref.tokens) == [1] and used == 2


def test_zero_residual_rows_mixed_with_others_in_one_batch() -> None:
    """The residual is computed in place for the rejected rows only: a batch mixing a zero residual
    (falls back to p), a positive residual and a fully accepted row gives each row the reference's
    tokens, in float64 and float32 (rows alone and together agree)."""
    p = np.array([[[0.5, 0.5, 0], [0.5, 0.5, 0]], [[0.9, 0.1, 0], [0.3, 0.7, 0]], [[0.4, 0.6, 0], [0.2, 0.8, 0]]])
    # row 0: q above p at both ids by 2**-20 (a ratio below 1 in float32 too: 2**-40 rounded away and made it 1,
    # which accepts), so its residual is 0 everywhere; id 2: the reference's EOS
    q = np.array([[[0.5 + 2**-20, 0.5 + 2**-20, 0]], [[0.1, 0.9, 0]], [[0.4, 0.6, 0]]])
    drafts, n = np.array([[0], [1], [1]]), np.array([1, 1, 1])
    ua = np.array([[float(np.nextafter(1.0, 0.0))], [0.5], [0.1]])
    uf = np.array([0.75, 0.3, 0.9])
    for dtype in (torch.float64, torch.float32):
        rows = [rejection_verify(t(p[b:b + 1]).to(dtype), t(q[b:b + 1]).to(dtype), t(drafts[b:b + 1]), t(n[b:b + 1]),
                                 t(ua[b:b + 1]), t(uf[b:b + 1])).rows()[0] for b in range(3)]
        out = rejection_verify(t(p).to(dtype), t(q).to(dtype), t(drafts), t(n), t(ua), t(uf))
        assert_host_matches_tensors(out)
        assert out.rows() == rows
        for b in range(3):
            ref, _ = ref_rejection(p[b], q[b], drafts[b], 1, read_rejection(out, b, ua, uf, 1), False, NO_BUDGET)
            assert rows[b] == list(ref.tokens), (dtype, b, rows[b], ref)
    assert out.rows()[0] == [1] and out.accepted() == [0, 0, 1]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("batch", [1, 5])
def test_scaled_q_decides_as_the_normalized_one(dtype: torch.dtype, batch: int) -> None:
    """generate hands TLI's q over unnormalized (the pushed restriction, with the mass each draw
    read as ``q_scale``). With power-of-two scales the division is exact, so every decision (ratio
    tests, residuals, zero residuals falling back to p, bonus tokens) must equal the normalized q's,
    bit for bit, at batch 1 (the view path) and in a batch."""
    g = np.random.default_rng(7)
    for trial in range(40):
        c = random_batch(g, batch, 3, 12)
        c["n"] = g.integers(0, 4, size=batch)
        c["p"][0, 0] = c["q"][0, 0]  # a zero residual where the first draft is rejected
        scale = 2.0 ** g.integers(-3, 4, size=(batch, 3))
        drafts = c["drafts"].tolist()
        n = c["n"].tolist()
        ua = (c["ua"] if trial % 2 else np.maximum(c["ua"], 0.999)).tolist()  # rejections
        uf = c["uf"].tolist()
        pt, qt = t(c["p"]).to(dtype), t(c["q"]).to(dtype)
        plain = _rejection_host(pt, qt, drafts, n, ua, uf, eos_id=11, budget=None)
        scaled = _rejection_host(pt, qt * t(scale).to(dtype).unsqueeze(-1), drafts, n, ua, uf, eos_id=11,
                                 budget=None, q_scale=scale.tolist())
        assert scaled == plain, trial
        assert plain[2] is None


def test_padded_vocabulary_never_emits_a_padding_id() -> None:
    """Logits wider than the tokenizer: the padding columns have probability 0 and are never emitted,
    in any dtype, by any kernel."""
    g = np.random.default_rng(2)
    c = random_batch(g, 1000, 3, 40)
    pad = 24
    p = np.concatenate([c["p"], np.zeros(c["p"].shape[:-1] + (pad,))], -1)
    q = np.concatenate([c["q"], np.zeros(c["q"].shape[:-1] + (pad,))], -1)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        pt, qt = t(p).to(dtype), t(q).to(dtype)
        u1 = torch.tensor(g.random(1000) * 0 + np.nextafter(1.0, 0.0))  # the worst uniform for rounding
        assert int(sample(pt[:, 0], u1).max()) < 40
        for res in (rejection_verify(pt, qt, t(c["drafts"]), t(c["n"]), t(c["ua"]), u1),
                    exact_match_verify(pt, t(c["drafts"]), t(c["n"]), t(c["u"]))):
            assert int(res.tokens.max()) < 40


def test_check_false_skips_value_checks_only() -> None:
    """check=False: an invalid uniform is not looked at (no sync), but shapes are still checked."""
    p = torch.full((1, 2, 3), 1 / 3, dtype=torch.float64)
    q = torch.full((1, 1, 3), 1 / 3, dtype=torch.float64)
    d, n = torch.tensor([[0]]), torch.tensor([1])
    bad_u = torch.tensor([1.5], dtype=torch.float64)
    rejection_verify(p, q, d, n, torch.tensor([[0.5]], dtype=torch.float64), bad_u, check=False)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        rejection_verify(p, q, d, n, torch.tensor([[0.5]], dtype=torch.float64), bad_u)
    with pytest.raises(ValueError, match="shape"):
        rejection_verify(p, q[:, :, :2], d, n, torch.tensor([[0.5]], dtype=torch.float64), bad_u, check=False)


def test_invalid_inputs_raise_clear_errors() -> None:
    p = torch.full((1, 2, 3), 1 / 3, dtype=torch.float64)
    q = torch.full((1, 1, 3), 1 / 3, dtype=torch.float64)
    d, n = torch.tensor([[0]]), torch.tensor([1])
    ua, uf = torch.tensor([[0.5]], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64)
    bad = p.clone()
    bad[0, 0, 1] = float("nan")
    for bad_p in (bad, -p, p * float("inf")):
        with pytest.raises(ValueError, match="not a law"):
            rejection_verify(bad_p, q, d, n, ua, uf)
        with pytest.raises(ValueError, match="not a law"):
            rejection_verify(bad_p, q, d, n, ua, uf, greedy=True)
        with pytest.raises(ValueError, match="not a law"):
            exact_match_verify(bad_p, d, n, torch.rand(1, 2, dtype=torch.float64))
        with pytest.raises(ValueError, match="not a law"):
            rejection_verify(p, bad_p[:, :1], d, n, ua, uf)
    with pytest.raises(ValueError, match="not a law"):
        sample(torch.zeros(1, 3), torch.tensor([0.5]))
    with pytest.raises(ValueError, match="not a law"):
        sample(torch.tensor([[0.5, -0.1, 0.6]]), torch.tensor([0.5]))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        sample(torch.ones(1, 3), torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        rejection_verify(p, q, d, n, ua, torch.tensor([-0.1], dtype=torch.float64))
    with pytest.raises(ValueError, match="n_drafts"):
        rejection_verify(p, q, d, torch.tensor([2]), ua, uf)
    with pytest.raises(ValueError, match="shape"):
        rejection_verify(p, q[:, :, :2], d, n, ua, uf)
    with pytest.raises(ValueError, match="ids in"):
        rejection_verify(p, q, torch.tensor([[3]]), n, ua, uf)
    with pytest.raises(ValueError, match="budget"):
        rejection_verify(p, q, d, n, ua, uf, budget=torch.tensor([0]))
    with pytest.raises(ValueError, match="device"):
        rejection_verify(p, q.to("meta"), d, n, ua, uf)
    with pytest.raises(TypeError, match="floating"):
        sample(torch.ones(1, 3, dtype=torch.int64), torch.tensor([0.5]))
    with pytest.raises(ValueError, match="n_candidates"):
        exact_match_verify(p, d, torch.tensor([-1]), torch.rand(1, 2, dtype=torch.float64))


def test_zero_drafts_rows_emit_one_token_from_p() -> None:
    """n_drafts = 0 (and K = 0): the row is plain target decoding, one token from p[:, 0]."""
    p = torch.tensor([[[0.0, 1.0, 0.0]]], dtype=torch.float64)
    out = rejection_verify(p, torch.zeros(1, 0, 3, dtype=torch.float64), torch.zeros(1, 0, dtype=torch.int64),
                           torch.tensor([0]), torch.zeros(1, 0, dtype=torch.float64), torch.tensor([0.3], dtype=torch.float64))
    assert out.rows() == [[1]] and out.tokens.shape == (1, 1)
    em = exact_match_verify(p, torch.zeros(1, 0, dtype=torch.int64), torch.tensor([0]), torch.tensor([[0.3]], dtype=torch.float64))
    assert em.rows() == [[1]]


# ---------------------------------------------------------------------------------------------
# Sampled check with teeth
# ---------------------------------------------------------------------------------------------

ALPHA = 1e-6
POWER = 0.99
P_LAW = np.array([0.30, 0.25, 0.20, 0.15, 0.10, 0.0])
Q_RAW = np.array([0.05, 0.10, 0.15, 0.30, 0.10, 0.30])  # the drafter's law; id 5 is outside the intersection
Q_CAP = np.where(np.arange(6) < 5, Q_RAW, 0.0) / Q_RAW[:5].sum()  # what the drafts are drawn from


def first_token_law(q_drawn: np.ndarray, q_claimed: np.ndarray) -> np.ndarray:
    """Law of the first emitted token when drafts come from ``q_drawn`` but are verified with
    ``q_claimed`` (equals P_LAW exactly when they are equal)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(q_claimed > 0, np.minimum(1.0, P_LAW / q_claimed), 1.0)
    resid = np.maximum(P_LAW - q_claimed, 0.0)
    resid = resid / resid.sum() if resid.sum() > 0 else P_LAW
    reject = float((q_drawn * (1 - a)).sum())
    law: np.ndarray = q_drawn * a + reject * resid
    return law


def sampled_first_tokens(q_claimed: np.ndarray, n: int, seed: int) -> list[tuple[int]]:
    g = torch.Generator().manual_seed(seed)
    k = 2
    p = t(np.tile(P_LAW, (n, k + 1, 1)))
    qd = t(np.tile(Q_CAP, (n, k, 1)))
    drafts = torch.stack([sample(qd[:, j], torch.rand(n, generator=g, dtype=torch.float64)) for j in range(k)], 1)
    qc = t(np.tile(q_claimed, (n, k, 1)))
    out = rejection_verify(p, qc, drafts, torch.full((n,), k), torch.rand(n, k, generator=g, dtype=torch.float64),
                           torch.rand(n, generator=g, dtype=torch.float64))
    return [(int(x),) for x in out.tokens[:, 0].tolist()]


def test_first_token_law_is_p_and_the_wrong_q_is_rejected() -> None:
    """Sized like hsd_core's suite: alpha = 1e-6 (false-fail rate), power 0.99. The wrong-q kernel
    (drafts drawn from the renormalized q_cap, verified against the drafter's raw q) is at an exact
    TV ``tv_wrong`` from p; N is the chi-square sample size that detects TV >= tv_wrong / 2 on the
    k = 5 cells, so the correct kernel passing at that N also rules out any bias >= that TV."""
    wrong = first_token_law(Q_CAP, Q_RAW)
    assert np.allclose(first_token_law(Q_CAP, Q_CAP), P_LAW)
    tv_wrong = 0.5 * float(np.abs(wrong - P_LAW).sum())
    assert tv_wrong > 0.05
    k = int((P_LAW > 0).sum())
    n = min_num_samples_for_tv(k, tv_wrong / 2, ALPHA, POWER)
    assert n <= 20_000
    law = {(i,): float(x) for i, x in enumerate(P_LAW) if x > 0}
    detectable = min_tv_detectable(k, n, ALPHA, POWER)
    assert detectable <= tv_wrong / 2 + 1e-9
    assert_law_matches(law, sampled_first_tokens(Q_CAP, n, seed=0), alpha=ALPHA, eps=tv_wrong / 2)
    with pytest.raises(AssertionError, match="rejected"):
        assert_law_matches(law, sampled_first_tokens(Q_RAW, n, seed=1), alpha=ALPHA, eps=tv_wrong / 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scaled", [False, True])
def test_residual_on_the_support_is_the_dense_residual_bit_for_bit(dtype: torch.dtype, scaled: bool) -> None:
    """With top-k / top-p laws (``LazyLaw(..., sparse=True)``) a rejection's correction is drawn from
    the residual taken on the support of p alone: the same ids and totals as over all columns, for
    laws of a few kept ids among 4,096 columns, a q of full support, unnormalized q (``q_scale``),
    zero residuals (the fallback to p), supports too wide to take (a quarter of the columns) and
    uniforms next to 1 (the rounding past the last partial sum); and the sparse path is taken
    (counted) where it applies."""
    from hsd_torch.engine import kernels as km

    g = np.random.default_rng(11)
    v, k = 4096, 3
    taken = [0]
    real = km._residual_on_support

    def counted(*a: object, **kw: object) -> object:
        got = real(*a, **kw)  # type: ignore[arg-type]
        taken[0] += got is not None
        return got

    for trial in range(60):
        wide = trial % 10 == 9
        p = np.zeros((1, k + 1, v))
        for j in range(k + 1):
            m = v // 3 if wide else int(g.integers(1, 9))
            cols = g.choice(v, size=m, replace=False)
            p[0, j, cols] = g.random(m) ** 3 + 1e-3
            p[0, j] /= p[0, j].sum()
        q = g.random((1, k, v)) ** 6  # full support, and half its mass near p's (a residual that depends on q)
        q /= q.sum(-1, keepdims=True)
        near = p[:, :k] * g.uniform(0.2, 1.8, size=(1, k, v))
        q = 0.5 * q + 0.5 * near / near.sum(-1, keepdims=True)
        if trial % 7 == 3:  # q covers p at the first draft's position: a zero residual there
            q[0, 0] = np.maximum(q[0, 0], p[0, 0])
            q[0, 0] /= q[0, 0].sum()
            q[0, 0] = np.maximum(q[0, 0], p[0, 0] * (1 + 2**-20))
        drafts = [[int(g.choice(np.flatnonzero(q[0, j]))) for j in range(k)]]
        ua = [[float(np.nextafter(1.0, 0.0)) if trial % 2 else float(g.random()) for _ in range(k)]]
        uf = [float(np.nextafter(1.0, 0.0)) if trial % 5 == 0 else float(g.random())]
        scale = (2.0 ** g.integers(-3, 4, size=(1, k))).tolist() if scaled else None
        qt = t(q).to(dtype) * (t(np.array(scale)).to(dtype).unsqueeze(-1) if scaled else 1)
        pt = t(p).to(dtype)
        dense = _rejection_host(km.LazyLaw(pt), qt, drafts, [k], ua, uf, eos_id=None, budget=None, q_scale=scale)
        km._residual_on_support = counted  # type: ignore[assignment]
        try:
            sparse = _rejection_host(km.LazyLaw(pt, sparse=True), qt, drafts, [k], ua, uf, eos_id=None, budget=None,
                                     q_scale=scale)
        finally:
            km._residual_on_support = real  # type: ignore[assignment]
        assert sparse == dense, trial
    assert taken[0] >= 20  # the support path decided most rejections (not the wide or zero-residual ones)
