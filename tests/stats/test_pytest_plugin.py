"""The ``hsd_lossless`` pytest plugin (docs/auditing.md, "The pytest plugin"), self-tested with ``pytester``.

Sizes: family-wise alpha 1e-6, n = 5000 draws over a 4-cell law: detectable TV about 0.08 at
power 0.99; the lossy sampler is at TV 0.15 and fails with the TV, the worst cells and the seed.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TEST_FILE = '''
from fractions import Fraction
LAW = {(0,): Fraction(1, 2), (1,): Fraction(1, 4), (2, 0): Fraction(1, 8), (2, 1): Fraction(1, 8)}
KEYS = list(LAW)

def test_lossless(hsd_lossless):
    hsd_lossless(lambda rng: KEYS[rng.choice(4, p=[.5, .25, .125, .125])], LAW, n=5000)

def test_lossy(hsd_lossless):
    hsd_lossless(lambda rng: KEYS[rng.choice(4, p=[.35, .25, .275, .125])], LAW, n=5000, seed=3)
'''


def test_plugin_passes_lossless_and_fails_lossy(pytester: pytest.Pytester) -> None:
    # No ``-p``: the fixture must come from the installed ``pytest11`` entry point, as it does
    # in another project's CI (passing ``-p hsd_core.pytest_plugin`` as well would register the
    # module twice, which pytest refuses).
    pytester.makepyfile(TEST_FILE)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, failed=1)
    res.stdout.fnmatch_lines(["*test_lossy*", "*hsd_lossless: sampler lossy: estimated TV 0.1*"
                              "worst cells: (2, 0)*reproduce with seed=3"])
    assert "test_lossless FAILED" not in res.stdout.str()


def test_fixture_comes_from_the_entry_point(pytester: pytest.Pytester) -> None:
    """With the ``hsd`` entry point blocked the fixture is gone: the registration is what serves it."""
    pytester.makepyfile(TEST_FILE)
    res = pytester.runpytest_subprocess("-p", "no:hsd", "-p", "no:cacheprovider")
    res.assert_outcomes(errors=2)
    res.stdout.fnmatch_lines(["*fixture 'hsd_lossless' not found*"])


def test_detectable_tv_is_stated() -> None:
    from hsd_core.stats import min_tv_detectable

    assert min_tv_detectable(4, 5000, 1e-6 / 6, 0.99) < 0.1


SEQ_FILE = '''
from hsd_core.methods import TLI
from hsd_core.variants import VARIANTS
from hsd_core.worlds import builtin_world

W = builtin_world()

def test_sequences_lossless(hsd_lossless):
    hsd_lossless(lambda p, s: TLI().generate(W.target, W.drafter, p, 24, rng=s), W.target, sequences=True,
                 prompts=W.prompt, n=300, max_new_tokens=24, drafter=W.drafter, alpha=1e-3)

def test_sequences_lossy(hsd_lossless):
    m = VARIANTS["tli_raw_q"]()
    hsd_lossless(lambda p, s: m.generate(W.target, W.drafter, p, 24, rng=s), W.target, sequences=True,
                 prompts=W.prompt, n=1000, max_new_tokens=24, drafter=W.drafter, alpha=1e-3, seed=2)

def test_sequences_needs_prompts(hsd_lossless):
    hsd_lossless(lambda p, s: [0], W.target, sequences=True)
'''


def test_plugin_sequences(pytester: pytest.Pytester) -> None:
    """``sequences=True`` over an hsd_core model: TLI passes (300 sequences, alpha 1e-3); the tli_raw_q
    variant (1,000 sequences: caught at seeds 0-5 off-line at n = 2,000 on its pinned world, and here
    on the built-in world by the directional test) fails naming the rejected tests and the seed; no
    prompts is a TypeError."""
    pytester.makepyfile(SEQ_FILE)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, failed=2)
    res.stdout.fnmatch_lines(["*hsd_lossless (sequences): sampler lossy*tests rejected: *directional*seed=2*"])
    res.stdout.fnmatch_lines(["*needs prompts=*"])
