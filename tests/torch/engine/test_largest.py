"""``laws.largest`` (the k largest entries through the chunks of the largest maxima) against
``torch.topk``, and ``laws.fixed_drop`` (a generation's masks written by index) against the mask.

Exact checks, no sampling: values bit for bit, ids that hold those values, every id above the
k-th value present."""

from __future__ import annotations

import pytest
import torch

from hsd_torch.engine import laws

C = laws.LARGEST_CHUNK


def _check(x: torch.Tensor, k: int) -> None:
    vals, ids = laws.largest(x, k)
    want = torch.topk(x, k, dim=-1, sorted=True).values
    assert vals.shape == want.shape and ids.shape == want.shape and ids.dtype == torch.int64
    assert torch.equal(vals, want), k
    assert torch.equal(x.gather(-1, ids), vals), k  # each id holds its value
    flat, fids = x.reshape(-1, x.shape[-1]), ids.reshape(-1, k)
    kth = want.reshape(-1, k)[:, -1]
    for r in range(flat.shape[0]):  # every id strictly above the k-th value is returned, each once
        above = set(torch.nonzero(flat[r] > kth[r]).flatten().tolist())
        got = fids[r].tolist()
        assert len(set(got)) == k and above <= set(got), r


def _chunked(v: int, k: int) -> bool:
    return 8 * k * C <= v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("v", [64 * C, 64 * C + 77, 50_000])  # whole chunks, a tail, another tail
def test_largest_is_topk(dtype: torch.dtype, v: int) -> None:
    g = torch.Generator().manual_seed(v)
    cont = torch.randn((3, v), generator=g, dtype=torch.float64) * 3
    tied = (cont * 2).round() / 2  # many equal values: ties at the k-th value
    for x in (cont, tied, torch.softmax(cont / 0.7, dim=-1)):
        x = x.to(dtype)
        for k in (1, 2, 5, 8):
            assert _chunked(v, k)
            _check(x, k)
        _check(x, v // (8 * C) + 1)  # past the chunked range: torch.topk itself


def test_largest_finds_values_crowded_in_one_chunk_or_the_tail() -> None:
    """The k largest all in one chunk (one maximum a chunk would miss all but one), or all in the
    ids past the last whole chunk (no chunk maximum sees them): found, bit for bit."""
    v, k = 40 * C + 100, 4
    x = torch.zeros((2, v))
    x[0, 7 * C: 7 * C + k] = torch.tensor([5.0, 4.0, 3.0, 2.0])  # crowded in chunk 7
    x[0, 20 * C] = 1.5  # the next chunk's maximum, below every one of them
    x[1, 40 * C + 10: 40 * C + 10 + k] = torch.tensor([9.0, 8.0, 7.0, 6.0])  # in the tail
    vals, ids = laws.largest(x, k)
    assert vals.tolist() == [[5.0, 4.0, 3.0, 2.0], [9.0, 8.0, 7.0, 6.0]]
    assert ids.tolist() == [[7 * C, 7 * C + 1, 7 * C + 2, 7 * C + 3], [40 * C + 10 + i for i in range(4)]]
    _check(x, k)


def test_largest_keeps_shapes_minus_infinity_and_nan_as_topk() -> None:
    g = torch.Generator().manual_seed(3)
    v = 32 * C
    x = torch.randn((2, 3, v), generator=g)
    x[0, 0] = float("-inf")  # a row with every id removed
    x[0, 1, ::5] = float("-inf")
    x[1, 2, 1000] = float("nan")  # NaN first, as in torch.topk
    vals, _ = laws.largest(x, 3)
    want = torch.topk(x, 3, dim=-1).values
    assert vals.shape == (2, 3, 3)
    assert torch.equal(torch.nan_to_num(vals, nan=7.0), torch.nan_to_num(want, nan=7.0))
    one = torch.randn(v, generator=g)
    _check(one, 3)  # a single row, 1-D


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fixed_drop_writes_the_same_law_as_the_mask(dtype: torch.dtype) -> None:
    """A mask noted by ``fixed_drop`` gives the laws of the unnoted mask bit for bit (with and
    without top-k and top-p); an empty mask the target's own law; an unnoted copy is read whole."""
    g = torch.Generator().manual_seed(5)
    v = 24 * C + 9
    logits = torch.randn((4, v), generator=g, dtype=dtype) * 4
    mask = torch.rand(v, generator=g) < 0.1
    fixed = laws.fixed_drop(mask.clone())
    assert laws._REMOVED.peek((fixed,), None) is not None
    assert laws._REMOVED.peek((mask,), None) is None
    none = laws.fixed_drop(torch.zeros(v, dtype=torch.bool))
    for t, k, p in ((1.0, None, None), (0.7, 20, None), (0.7, None, 0.9), (1.3, 50, 0.5)):
        want = laws.process_with_drop(logits, mask, t, k, p)
        assert torch.equal(laws.process_with_drop(logits, fixed, t, k, p), want)
        assert bool((want[:, mask] == 0).all())
        assert torch.equal(laws.process_with_drop(logits, none, t, k, p),
                           laws.process_with_drop(logits, torch.zeros(v, dtype=torch.bool), t, k, p))
