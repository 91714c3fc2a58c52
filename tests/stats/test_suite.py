"""The statistical suite with teeth: every sampler is audited by :func:`hsd_core.audit.audit_sampler`.

Every test below states its family-wise false-fail rate ``alpha``, its sample size ``N`` and the
smallest TV it detects with power 0.99 (``audit_sampler`` splits ``alpha`` over its ``m`` tests;
the detectable TV is that of the joint chi-square test at level ``alpha / m``). All seeds are
fixed (``_rng(name)``), so the fast tier is deterministic.

Measured on the 2-core CI machine (pure-Python sampling): ``SD(2).generate`` on the built-in
world ~110 us per output, AR ~80 us, SLEM ~250 us, TLI ~180 us, SLRS ~300-340 us; the variants on
their pinned worlds 35-120 us. The fast tier of this file takes about a minute.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats as sps  # type: ignore[import-untyped]

from hsd_core import exact, variants
from hsd_core.audit import audit_sampler, min_num_samples_for_law
from hsd_core.methods import AR, SD, SLEM, SLRS, TLI, Method
from hsd_core.stats import min_num_samples_for_tv, min_tv_detectable
from hsd_core.worlds import builtin_world, from_spec

ALPHA = 1e-6
POWER = 0.99

N_BUILTIN = 22_000
"""Samples per correct method on the built-in world (259 outputs, 3 positions, text: m = 7 tests):
detects TV >= 0.053 with power 0.99 at family-wise alpha 1e-6 (see test_builtin_budget), the mass
pooled into one cell included (20 000 promised 0.052 while 0.0047 of the mass sat unseen in the
pooled cell: 0.0557 in truth)."""

N_CI = 54_000
"""The CI budget for laws of up to 16 cells: min_tv_detectable(16, N_CI, 1e-6 / 5, 0.99) <= 0.02
(5 = joint chi2, G, TV + 2 positions), so it holds a fortiori at alpha 1e-6 itself."""


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _correct_methods() -> list[tuple[str, Method]]:
    return [("AR", AR()), ("SD", SD(lookahead=2)), ("SLEM", SLEM(lookahead=2)), ("TLI", TLI(lookahead=2)),
            ("SLRS", SLRS(lookahead=2)), ("SLRS-multi", SLRS(lookahead=2, max_tokens=None))]


def test_builtin_budget() -> None:
    """alpha 1e-6 over m = 7 tests, N = 22000, k = 259 cells: detectable TV 0.053 (stated above),
    pooled mass included."""
    w = builtin_world()
    law = exact.target_law(w.target, w.prompt, w.max_new_tokens)
    k = len(law)
    assert k == 259
    assert min_tv_detectable(k, N_BUILTIN, ALPHA / 6, POWER) <= 0.053
    assert min_num_samples_for_law(law, 0.053, ALPHA / 7, POWER) <= N_BUILTIN


@pytest.mark.parametrize("name,method", _correct_methods(), ids=[n for n, _ in _correct_methods()])
def test_correct_method_passes_audit(name: str, method: Method) -> None:
    """Each correct numpy sampler passes against its exact law: alpha 1e-6 (family-wise, Holm over
    joint chi2 + G + TV + 3 positions + text), N = 22000, detectable TV 0.053 on 259 cells."""
    w = builtin_world()
    drafter = w.same_vocab_drafter if isinstance(method, SD) else w.drafter
    law = exact.output_law(method, w.target, drafter, w.prompt, w.max_new_tokens)
    assert law == exact.target_law(w.target, w.prompt, w.max_new_tokens)
    rng = _rng(name)
    report = audit_sampler(lambda: method.generate(w.target, drafter, w.prompt, w.max_new_tokens, rng), law,
                           n=N_BUILTIN, alpha=ALPHA, text=lambda s: w.target.tokenizer.decode(s),
                           rng_note=f"crc32({name!r})")
    assert report.verdict == "lossless-consistent", report.to_markdown()
    assert report.m == 7 and len(report.tests) == 7
    assert report.detectable_tv is not None and report.detectable_tv <= 0.053


def _variant_case(name: str) -> tuple[float, int, int]:
    """(exact TV of the variant from the target law, k, N) with N sized so the joint chi-square
    test detects that TV with power 0.99 at alpha 1e-6 / m (m = 3 joint tests + positions), the
    pooled mass included (the audit's own sizing, :func:`min_num_samples_for_law`)."""
    target, drafter, prompt = from_spec(variants.PINNED[name])
    mnt = variants.PINNED_MAX_NEW_TOKENS
    ref = exact.target_law(target, prompt, mnt)
    tv = float(exact.total_variation(exact.output_law(variants.VARIANTS[name](), target, drafter, prompt, mnt), ref))
    m = 3 + mnt
    k = len(ref)
    n = min_num_samples_for_law(ref, tv, ALPHA / m, POWER)
    assert n >= min_num_samples_for_tv(k, tv, ALPHA / m, POWER)
    return tv, k, n


# Stated sizes (alpha 1e-6, power 0.99; N from the exact TV): computed in _variant_case, e.g.
# accept_every_draft TV 0.80 k 13 (N 72: the table needs that many samples to run); residual_from_p 0.245; bonus_off_by_one 0.143; tli_raw_q 0.095;
# tli_outside_intersection 0.106; tli_scatter_assign 0.126 (k 21); slem_retokenized_context 0.075
# (k 21); slrs_concat_psi 0.069; slrs_unconditioned 0.059 (N ~ 5800, the largest); slrs_coin_stop
# 0.080 (k 21).
@pytest.mark.parametrize("name", sorted(variants.VARIANTS))
def test_variant_rejected_by_audit(name: str) -> None:
    """Each lossy variant, sampled with its own ``.generate`` on its pinned world, is rejected
    against the TARGET law: alpha 1e-6 (family-wise), N = min_num_samples_for_tv(k, TV, 1e-6/m,
    0.99) with TV the variant's exact distance (detectable TV = that TV by construction)."""
    tv, k, n = _variant_case(name)
    assert tv > 0.05 and n <= 20_000
    target, drafter, prompt = from_spec(variants.PINNED[name])
    mnt = variants.PINNED_MAX_NEW_TOKENS
    ref = exact.target_law(target, prompt, mnt)
    method = variants.VARIANTS[name]()
    rng = _rng(name)
    report = audit_sampler(lambda: method.generate(target, drafter, prompt, mnt, rng), ref,
                           n=n, alpha=ALPHA, eps=tv, rng_note=f"crc32({name!r})")
    assert report.detectable_tv is not None and report.detectable_tv <= tv + 1e-12
    assert report.verdict == "lossy", report.to_markdown()


def _abc_world() -> tuple[Callable[[np.random.Generator], Sequence[int]], dict[tuple[int, ...], Fraction | float]]:
    target, drafter, prompt = from_spec(variants.PINNED["slrs_unconditioned"])
    law = dict(exact.target_law(target, prompt, 2))
    return (lambda rng: AR().generate(target, drafter, prompt, 2, rng)), law


def test_ci_budget_detects_tv_002_on_16_cells() -> None:
    """The figure: at the CI budget N = 54000 the suite detects TV <= 0.02 on laws of up to 16
    cells (alpha 1e-6 family-wise, each of m = 5 tests at 2e-7, power 0.99). Runs the audit at that
    N on a 13-cell law: AR passes, and a sampler at TV exactly 0.02 (2% of outputs replaced by the
    least likely one) is rejected."""
    assert min_tv_detectable(16, N_CI, ALPHA, POWER) <= 0.02
    assert min_tv_detectable(16, N_CI, ALPHA / 5, POWER) <= 0.02
    sample, law = _abc_world()
    assert len(law) <= 16
    rng = _rng("ci-budget")
    ok = audit_sampler(lambda: sample(rng), law, n=N_CI, alpha=ALPHA, eps=0.02)
    assert ok.verdict == "lossless-consistent", ok.to_markdown()
    assert ok.detectable_tv is not None and ok.detectable_tv <= 0.02

    rare = min(law, key=lambda s: (law[s], s))
    bad_tv = 0.02 / (1.0 - float(law[rare]))  # TV of the mixture (1-c) law + c delta_rare is c (1 - p_rare)

    def corrupted() -> Sequence[int]:
        return rare if rng.random() < bad_tv else sample(rng)

    lossy = audit_sampler(corrupted, law, n=N_CI, alpha=ALPHA, eps=0.02)
    assert lossy.verdict == "lossy", lossy.to_markdown()


def test_two_sample_mode_catches_a_variant() -> None:
    """Two-sample mode: AR vs AR passes, AR vs accept_every_draft (TV 0.80) fails; alpha 1e-6,
    N = 2000 each (effective n 1000, detectable TV ~0.17 on 13 cells)."""
    name = "accept_every_draft"
    target, drafter, prompt = from_spec(variants.PINNED[name])
    rng = _rng("two-sample")
    ref = [tuple(AR().generate(target, drafter, prompt, 2, rng)) for _ in range(2000)]
    same = audit_sampler(lambda: AR().generate(target, drafter, prompt, 2, rng), ref, alpha=ALPHA)
    assert same.verdict == "lossless-consistent", same.to_markdown()
    bad = variants.VARIANTS[name]()
    diff = audit_sampler(lambda: bad.generate(target, drafter, prompt, 2, rng), ref, alpha=ALPHA)
    assert diff.verdict == "lossy", diff.to_markdown()


def test_sparse_is_inconclusive_not_a_pass() -> None:
    """An under-sized audit (N = 50 on 259 cells) says inconclusive; it never passes."""
    w = builtin_world()
    law = exact.target_law(w.target, w.prompt, w.max_new_tokens)
    rng = _rng("sparse")
    r = audit_sampler(lambda: AR().generate(w.target, w.drafter, w.prompt, 3, rng), law, n=50)
    assert r.verdict == "inconclusive"
    md = r.to_markdown()
    assert "inconclusive" in md and "Skipped tests" in md
    assert any(s.startswith("joint chi2") for s in r.skipped)


def test_default_sizing_and_report_fields() -> None:
    """n=None sizes from eps: alpha 1e-6 / 5, eps 0.05, k 13 gives N = min_num_samples_for_tv(13,
    0.05, 2e-7, 0.99) (~8200; above the pooling minimum), detectable TV 0.05."""
    sample, law = _abc_world()
    rng = _rng("default-sizing")
    r = audit_sampler(lambda: sample(rng), law, eps=0.05)
    assert r.n == min_num_samples_for_tv(13, 0.05, ALPHA / 5, POWER)
    assert r.verdict == "lossless-consistent"
    assert len(r.over) <= 5 and len(r.under) <= 5


def test_save_plot_is_optional(tmp_path: object) -> None:
    """save_plot writes a PNG with matplotlib, else returns False and writes nothing (alpha 1e-6,
    N = 500, k = 13: detectable TV ~0.31)."""
    import importlib.util
    import pathlib

    sample, law = _abc_world()
    rng = _rng("plot")
    r = audit_sampler(lambda: sample(rng), law, n=500)
    path = pathlib.Path(str(tmp_path)) / "law.png"
    has_mpl = importlib.util.find_spec("matplotlib") is not None
    assert r.save_plot(str(path)) is has_mpl
    assert path.exists() is has_mpl


@pytest.mark.slow
def test_false_fail_rate_under_the_null() -> None:
    """200 independent audits of AR on a 13-cell world, alpha 0.05 family-wise, N = 2000 each
    (detectable TV ~0.12): the number of family rejections is at most the 99.9% binomial quantile
    of Bin(200, 0.05) (Holm keeps it <= alpha), the joint chi-square test alone rejects at level
    0.05/5 within the two-sided 99.9% binomial interval, and its p-values look uniform (KS, p > 1e-3)."""
    sample, law = _abc_world()
    runs, n, a = 200, 2000, 0.05
    fam_rej = 0
    pvals: list[float] = []
    for seed in range(runs):
        rng = np.random.default_rng(10_000 + seed)
        r = audit_sampler(lambda: sample(rng), law, n=n, alpha=a)
        fam_rej += r.verdict == "lossy"
        joint = next(t for t in r.tests if t.name == "joint chi2")
        pvals.append(joint.p_value)
    assert fam_rej <= sps.binom.ppf(0.999, runs, a)
    level = a / 5
    chi_rej = sum(p <= level for p in pvals)
    assert sps.binom.ppf(0.0005, runs, level) <= chi_rej <= sps.binom.ppf(0.9995, runs, level)
    assert sps.kstest(pvals, "uniform").pvalue > 1e-3
