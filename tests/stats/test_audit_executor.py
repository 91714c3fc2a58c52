"""Seeded, chunked and distributed sampling in ``hsd_core.audit.audit_sampler``
(docs/auditing.md, "Scale-out: seeds, chunks and executors").

The draws are split into chunks of ``chunk_size`` with independent ``SeedSequence(seed).spawn``
children, so the report for a seed is identical serially, on a ``ProcessPoolExecutor`` and (when
``distributed`` is installed) on Dask's executor.

Sizes: family-wise alpha 1e-6, N = 6000 draws over the 6-cell law ``LAW``; the report states the
detectable TV (about 0.09 at power 0.99, asserted below), and the lossy sampler (the second token's
law replaced, TV 0.2) is rejected.
"""

from __future__ import annotations

import functools
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from hsd_core.audit import audit_sampler, draw_chunks

ALPHA = 1e-6
N = 6000
LAW = {(0, 0): Fraction(3, 10), (0, 1): Fraction(2, 10), (1, 0): Fraction(1, 10), (1, 1): Fraction(1, 10),
       (2,): Fraction(2, 10), (1, 2): Fraction(1, 10)}
KEYS = list(LAW)
PROBS = [float(p) for p in LAW.values()]
LOSSY = [0.5, 0.0, 0.1, 0.1, 0.2, 0.1]  # TV 0.2 from LAW


def sample(rng: np.random.Generator, probs: tuple[float, ...] = tuple(PROBS)) -> tuple[int, ...]:
    """A module-level (picklable) sampler of ``LAW``: one output per call from ``rng``."""
    return KEYS[int(rng.choice(len(KEYS), p=probs))]


def _key(rep: Any) -> tuple[Any, ...]:
    return (dict(rep.observed), [(t.name, t.statistic, t.p_value) for t in rep.tests], rep.verdict)


def test_seeded_serial_run_is_sized_and_lossless_consistent() -> None:
    rep = audit_sampler(sample, LAW, n=N, alpha=ALPHA, seed=7)
    assert rep.verdict == "lossless-consistent", rep.reason
    assert rep.detectable_tv is not None and rep.detectable_tv < 0.1


def test_lossy_sampler_is_rejected_with_the_same_size() -> None:
    rep = audit_sampler(functools.partial(sample, probs=tuple(LOSSY)), LAW, n=N, alpha=ALPHA, seed=7)
    assert rep.verdict == "lossy"


def test_result_does_not_depend_on_the_executor() -> None:
    serial = audit_sampler(sample, LAW, n=N, alpha=ALPHA, seed=11, chunk_size=700)
    with ThreadPoolExecutor(3) as ex:
        threads = audit_sampler(sample, LAW, n=N, alpha=ALPHA, seed=11, chunk_size=700, executor=ex)
    with ProcessPoolExecutor(2) as ex:
        procs = audit_sampler(sample, LAW, n=N, alpha=ALPHA, seed=11, chunk_size=700, executor=ex)
    assert _key(serial) == _key(threads) == _key(procs)
    other = audit_sampler(sample, LAW, n=N, alpha=ALPHA, seed=12, chunk_size=700)
    assert dict(other.observed) != dict(serial.observed)


def test_chunks_are_independent_spawns() -> None:
    a = draw_chunks(lambda rng: float(rng.random()), 10, seed=3, chunk_size=5)
    ss = np.random.SeedSequence(3).spawn(2)
    want = [float(np.random.default_rng(s).random()) for s in ss for _ in range(1)]
    assert a[0] == want[0] and a[5] == want[1]
    assert len(set(a)) == 10


def test_unpicklable_sampler_says_so() -> None:
    with ProcessPoolExecutor(1) as ex, pytest.raises(TypeError, match="must be picklable"):
        audit_sampler(lambda rng: (0, 0), LAW, n=10, alpha=ALPHA, executor=ex)


def test_prefix_tests_are_added_and_catch_a_conditional_bug() -> None:
    rep = audit_sampler(sample, LAW, n=N, alpha=ALPHA, seed=5, prefixes=[(0,), (1,)])
    assert rep.m == 3 + 2 + 2 and rep.verdict == "lossless-consistent"
    assert any(t.name.startswith("after (0,)") for t in rep.tests)
    # the two continuations of (0,) swapped: TV 0.1 from LAW
    swapped = [0.2, 0.3, 0.1, 0.1, 0.2, 0.1]
    bad = audit_sampler(functools.partial(sample, probs=tuple(swapped)), LAW, n=N, alpha=ALPHA, seed=5,
                        prefixes=[(0,)])
    assert bad.verdict == "lossy"


def test_dask_executor_gives_the_serial_result() -> None:
    distributed = pytest.importorskip("distributed")
    serial = audit_sampler(sample, LAW, n=2000, alpha=ALPHA, seed=13, chunk_size=500)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as lc, \
            distributed.Client(lc) as client:
        rep = audit_sampler(sample, LAW, n=2000, alpha=ALPHA, seed=13, chunk_size=500,
                            executor=client.get_executor())
    assert _key(rep) == _key(serial)
