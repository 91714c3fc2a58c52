"""Audit a sampler against an exact law (or against reference samples): one call, one report.

:func:`audit_sampler` draws ``n`` outputs from a black-box sampler (``sample_fn()`` returns one
tuple of target ids per call), runs a family of sized tests from :mod:`hsd_core.stats`, corrects
them with Holm at the family-wise false-fail rate ``alpha``, and returns an :class:`AuditReport`.

The family (``m`` tests, each run at level ``alpha / m``; Holm then rejects at least what this
Bonferroni level rejects):

* the **joint law** of the whole output tuple: Pearson chi-square, G-test (both after pooling the
  cells of expected count < 5) and the distribution-free TV test;
* with ``positions=True``, for every emitted position ``j``, the law of the ``j``-th token
  **conditional on the output reaching position j** (i.e. on ``len(output) > j``), by chi-square.
  Conditionally on how many outputs reach ``j``, those outputs' ``j``-th tokens are i.i.d. from
  that conditional law, so the test is valid as it stands;
* with ``text`` (a decode callable ``tuple[int, ...] -> str``), the law of the decoded text, by
  chi-square.

Sizing: with ``n=None`` the sample size is ``min_num_samples_for_tv(k, eps, alpha / m, power)``
for the joint chi-square test, with ``k`` the support size of the law (raised, if needed, until
the pooled chi-square table keeps 90% of the mass). With ``eps=None`` too, ``eps`` is the larger of
:data:`DEFAULT_EPS` and the TV that :data:`DEFAULT_MAX_N` samples can detect, so the default
stays affordable. ``detectable_tv`` is ``min_tv_detectable(k, n, alpha / m, power)``: every law at
TV >= ``detectable_tv`` from the reference is caught by the joint chi-square test (hence by the
family) with probability >= ``power`` (asymptotically, for the k-cell test; see
:func:`hsd_core.stats.min_num_samples_for_tv`).

Verdicts: ``"lossy"`` when Holm rejects any test; else ``"inconclusive"`` when the joint
chi-square test cannot be run (:class:`~hsd_core.stats.InvalidTest`: too sparse) or when ``eps``
was given and ``n`` is too small to detect it; else ``"lossless-consistent"``. A position or text
test that cannot be run is listed in ``skipped`` and does not change the verdict.

Two-sample mode (``law_or_reference`` is a list of samples): the joint, positional and text laws
are compared with :func:`~hsd_core.stats.chi_square_two_sample` (and the joint law also with
:func:`~hsd_core.stats.tv_two_sample`); ``detectable_tv`` then uses the effective sample size
``n * n_ref / (n + n_ref)``, an approximation.
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal, Union

from .stats import (
    InvalidTest, TestFamily, TestResult, chi_square_two_sample, counts_of, gof_test,
    min_num_samples_for_tv, min_tv_detectable, tv_two_sample,
)

__all__ = ["AuditReport", "DEFAULT_EPS", "DEFAULT_MAX_N", "Deviation", "Verdict", "audit_sampler"]

Output = tuple[int, ...]
Prob = Union[float, Fraction]
Verdict = Literal["lossless-consistent", "lossy", "inconclusive"]

DEFAULT_EPS = 0.05
"""Default TV to detect when neither ``n`` nor ``eps`` is given (unless that would need more than
:data:`DEFAULT_MAX_N` samples)."""

DEFAULT_MAX_N = 50_000
"""Default cap on the sample size chosen when neither ``n`` nor ``eps`` is given."""

_MIN_EXPECTED = 5.0
_MIN_KEPT_MASS = 0.9


@dataclass(frozen=True)
class Deviation:
    """One output with its observed and expected counts (expected: ``n * p``)."""

    output: Hashable
    observed: int
    expected: float


@dataclass(frozen=True)
class AuditReport:
    """Result of :func:`audit_sampler`.

    ``tests`` holds each test that ran, each at level ``alpha / m`` (its own ``alpha`` field);
    ``holm_rejected[i]`` is the Holm-corrected verdict of ``tests[i]`` at the family-wise
    ``alpha``. ``m`` counts the planned tests (skipped ones count as not rejected, which is
    conservative). ``detectable_tv`` is None when it cannot be computed (n too small).
    """

    n: int
    alpha: float
    power: float
    eps: float | None
    m: int
    tests: tuple[TestResult, ...]
    holm_rejected: tuple[bool, ...]
    skipped: tuple[str, ...]
    k: int
    detectable_tv: float | None
    verdict: Verdict
    reason: str
    over: tuple[Deviation, ...]
    under: tuple[Deviation, ...]
    mode: Literal["exact", "two-sample"]
    rng_note: str = ""
    observed: Mapping[Any, int] = field(default_factory=dict, repr=False, compare=False)
    expected: Mapping[Any, float] = field(default_factory=dict, repr=False, compare=False)

    @property
    def per_test_alpha(self) -> float:
        """``alpha / m``: the level at which each test ran."""
        return self.alpha / self.m

    def to_markdown(self, title: str = "Sampler audit") -> str:
        """The report as a markdown section (verdict, sizing, test table, largest deviations)."""
        det = "n/a (n too small)" if self.detectable_tv is None else f"{self.detectable_tv:.4g}"
        lines = [
            f"## {title}", "",
            f"**Verdict: {self.verdict}** ({self.reason})", "",
            f"- mode: {self.mode}; n = {self.n} samples; support size k = {self.k}",
            f"- family-wise alpha = {self.alpha:.3g} (Holm over m = {self.m} tests, each at "
            f"{self.per_test_alpha:.3g}); power = {self.power}",
            f"- detectable TV (joint chi-square, power {self.power}): {det}"
            + ("" if self.eps is None else f"; requested eps = {self.eps:.4g}"),
        ]
        if self.rng_note:
            lines.append(f"- rng: {self.rng_note}")
        lines += ["", "| test | statistic | p-value | dof | n | Holm rejects |", "|---|---|---|---|---|---|"]
        for r, rej in zip(self.tests, self.holm_rejected):
            dof = "" if r.dof is None else str(r.dof)
            lines.append(f"| {r.name} | {r.statistic:.4g} | {r.p_value:.3g} | {dof} | {r.n} | "
                         f"{'**yes**' if rej else 'no'} |")
        if self.skipped:
            lines += ["", "Skipped tests:"] + [f"- {s}" for s in self.skipped]

        def table(title_: str, rows: Sequence[Deviation]) -> list[str]:
            out = ["", f"{title_} (observed vs expected count):", "",
                   "| output | observed | expected |", "|---|---|---|"]
            out += [f"| `{d.output!r}` | {d.observed} | {d.expected:.1f} |" for d in rows]
            if not rows:
                out.append("| (none) | | |")
            return out

        lines += table("Most over-represented outputs", self.over)
        lines += table("Most under-represented outputs", self.under)
        return "\n".join(lines) + "\n"

    def save_plot(self, path: str, max_bars: int = 40) -> bool:
        """Write a PNG bar chart of the empirical vs the reference law (the ``max_bars`` outputs
        of largest reference probability) to ``path``. matplotlib is optional (not a dependency
        of hsd): without it, print a message to stderr and return False. Returns True if written.
        """
        try:
            mpl: Any = importlib.import_module("matplotlib")
            mpl.use("Agg")
            plt: Any = importlib.import_module("matplotlib.pyplot")
        except ImportError:
            print(f"save_plot: matplotlib is not installed; skipped the plot {path!r} "
                  "(pip install matplotlib to get it)", file=sys.stderr)
            return False
        keys = sorted(set(self.expected) | set(self.observed),
                      key=lambda x: (-self.expected.get(x, 0.0), -self.observed.get(x, 0)))[:max_bars]
        emp = [self.observed.get(x, 0) / self.n for x in keys]
        ref = [self.expected.get(x, 0.0) / self.n for x in keys]
        xs = list(range(len(keys)))
        fig, ax = plt.subplots(figsize=(max(6.0, 0.3 * len(keys)), 4.0))
        ax.bar([x - 0.2 for x in xs], ref, width=0.4, label="reference" if self.mode == "two-sample" else "exact")
        ax.bar([x + 0.2 for x in xs], emp, width=0.4, label="empirical")
        ax.set_xticks(xs)
        ax.set_xticklabels([repr(x) for x in keys], rotation=90, fontsize=6)
        ax.set_ylabel("probability")
        ax.set_title(f"{self.verdict} (n={self.n})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return True


# ---------------------------------------------------------------------------------------------

def _pool_min_n(law: Mapping[Any, Prob]) -> int:
    """Smallest n at which the cells with expected count >= 5 carry >= 90% of the mass."""
    ps = sorted((float(p) for p in law.values() if p > 0), reverse=True)
    acc = 0.0
    for p in ps:
        acc += p
        if acc >= _MIN_KEPT_MASS - 1e-12:
            return math.ceil(_MIN_EXPECTED / p)
    return math.ceil(_MIN_EXPECTED / ps[-1])


def _gof(kind: str, label: str, law: Mapping[Any, Prob], counts: Mapping[Any, int], alpha: float) -> TestResult:
    res = gof_test(law, counts, alpha, {"g_test": "g"}.get(kind, kind))
    return TestResult(f"{label} {res.name}", res.statistic, res.p_value, res.alpha, res.n, res.dof,
                      res.rejected, res.detail)


def _two(kind: str, label: str, a: Mapping[Any, int], b: Mapping[Any, int], alpha: float) -> TestResult:
    if kind == "tv":
        res = tv_two_sample(a, b, alpha)
    elif len(set(a) | set(b)) == 1:
        res = TestResult("chi2_two_sample", 0.0, 1.0, alpha, sum(a.values()) + sum(b.values()), None, False,
                         "both samples are constant on the same outcome")
    else:
        res = chi_square_two_sample(a, b, alpha)
    return TestResult(f"{label} {res.name}", res.statistic, res.p_value, res.alpha, res.n, res.dof,
                      res.rejected, res.detail)


def _position_law(law: Mapping[Output, Prob], j: int) -> dict[int, Prob]:
    """Exact law of the j-th token given len(output) > j (empty if no output reaches j)."""
    raw: dict[int, Prob] = {}
    for s, p in law.items():
        if len(s) > j and p > 0:
            raw[s[j]] = raw.get(s[j], 0) + p
    total = sum(raw.values())
    return {t: p / total for t, p in raw.items()} if total > 0 else {}


def _position_counts(counts: Mapping[Output, int], j: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for s, c in counts.items():
        if len(s) > j:
            out[s[j]] = out.get(s[j], 0) + c
    return out


def _pushforward(law: Mapping[Output, Prob], f: Callable[[Output], str]) -> dict[str, Prob]:
    out: dict[str, Prob] = {}
    for s, p in law.items():
        if p > 0:
            key = f(s)
            out[key] = out.get(key, 0) + p
    return out


def _text_counts(counts: Mapping[Output, int], f: Callable[[Output], str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s, c in counts.items():
        key = f(s)
        out[key] = out.get(key, 0) + c
    return out


def _normalise_law(law: Mapping[Any, Any]) -> dict[Output, Prob]:
    out: dict[Output, Prob] = {}
    for s, p in law.items():
        key = tuple(int(t) for t in s)
        out[key] = out.get(key, 0) + p
    return out


def audit_sampler(
    sample_fn: Callable[[], Sequence[int]],
    law_or_reference: Mapping[Any, Prob] | Sequence[Sequence[int]],
    n: int | None = None,
    alpha: float = 1e-6,
    eps: float | None = None,
    power: float = 0.99,
    positions: bool = True,
    text: Callable[[Output], str] | None = None,
    rng_note: str = "",
) -> AuditReport:
    """Draw ``n`` outputs with ``sample_fn()`` and test them against an exact law or reference samples.

    ``law_or_reference``: a ``Mapping`` from output tuples to probabilities (exact ``Fraction``
    or float), or a sequence of reference outputs (two-sample mode). ``alpha`` is the family-wise
    false-fail rate (Holm over all tests); ``eps`` the TV to detect with probability ``power``
    (sizes ``n`` when ``n`` is None, and makes an under-sized ``n`` "inconclusive"); ``positions``
    adds one test per emitted position (law of the j-th token given that the output reaches j);
    ``text`` (a decode callable) adds a test of the law of the decoded text; ``rng_note`` is
    recorded in the report (say which seed you used). See the module docstring for the details.

    Raises :class:`~hsd_core.stats.InvalidTest` for out-of-range arguments (alpha, power, eps,
    n < 1) and ``ValueError`` for an empty law/reference.
    """
    if not (isinstance(alpha, (int, float)) and 0.0 < float(alpha) < 1.0):
        raise InvalidTest(f"alpha={alpha!r} must lie strictly between 0 and 1 (e.g. alpha=1e-6)")
    if not (isinstance(power, (int, float)) and 0.0 < float(power) < 1.0):
        raise InvalidTest(f"power={power!r} must lie strictly between 0 and 1 (e.g. power=0.99)")
    if eps is not None and not (isinstance(eps, (int, float)) and 0.0 < float(eps) <= 1.0):
        raise InvalidTest(f"eps={eps!r} must be a TV distance in (0, 1]")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InvalidTest(f"n={n!r} must be a positive integer (or None to size it from eps)")

    two_sample = not isinstance(law_or_reference, Mapping)
    law: dict[Output, Prob] = {}
    ref_counts: dict[Output, int] = {}
    n_ref = 0
    if two_sample:
        ref_counts = counts_of([tuple(int(t) for t in s) for s in law_or_reference])
        if not ref_counts:
            raise ValueError("the reference sample is empty")
        n_ref = sum(ref_counts.values())
        ref_law: dict[Output, Prob] = {s: c / n_ref for s, c in ref_counts.items()}
    else:
        law = _normalise_law(law_or_reference)  # type: ignore[arg-type]
        if not law:
            raise ValueError("the law is empty")
        ref_law = law
    k = max(2, sum(1 for p in ref_law.values() if p > 0))
    max_len = max(len(s) for s in ref_law)

    # the plan: how many tests (m) will run
    n_positions = max_len if positions else 0
    m = (2 if two_sample else 3) + n_positions + (1 if text is not None else 0)
    a_test = float(alpha) / m

    if n is None:
        if two_sample:
            n = sum(ref_counts.values())
        else:
            if eps is None:
                eps = max(DEFAULT_EPS, min_tv_detectable(k, DEFAULT_MAX_N, a_test, power))
            n = max(min_num_samples_for_tv(k, eps, a_test, power), _pool_min_n(law))

    samples = [tuple(int(t) for t in sample_fn()) for _ in range(n)]
    counts = counts_of(samples)

    family = TestFamily(float(alpha), m)
    skipped: list[str] = []
    joint_invalid: str | None = None

    def run(label: str, fn: Callable[[], TestResult], joint: bool = False) -> None:
        nonlocal joint_invalid
        try:
            family.add(fn())
        except InvalidTest as e:
            skipped.append(f"{label}: {e}")
            if joint and joint_invalid is None:
                joint_invalid = f"{label}: {e}"

    if two_sample:
        run("joint chi2", lambda: _two("chi2", "joint", counts, ref_counts, a_test), joint=True)
        run("joint tv", lambda: _two("tv", "joint", counts, ref_counts, a_test))
    else:
        for kind in ("chi2", "g_test", "tv"):
            run(f"joint {kind}", lambda kind=kind: _gof(kind, "joint", law, counts, a_test),  # type: ignore[misc]
                joint=kind == "chi2")
    for j in range(n_positions):
        pc = _position_counts(counts, j)
        label = f"position {j}"
        if not pc:
            skipped.append(f"{label}: no sample reaches position {j}")
            continue
        if two_sample:
            rc = _position_counts(ref_counts, j)
            if not rc:
                skipped.append(f"{label}: no reference sample reaches position {j}")
                continue
            run(label, lambda pc=pc, rc=rc, label=label: _two("chi2", label, pc, rc, a_test))  # type: ignore[misc]
        else:
            pl = _position_law(law, j)
            if not pl:  # samples reach a position the law never reaches
                pl = {-1: Fraction(1)}
            run(label, lambda pc=pc, pl=pl, label=label: _gof("chi2", label, pl, pc, a_test))  # type: ignore[misc]
    if text is not None:
        tc = _text_counts(counts, text)
        if two_sample:
            rt = _text_counts(ref_counts, text)
            run("text", lambda: _two("chi2", "text", tc, rt, a_test))
        else:
            tl = _pushforward(law, text)
            run("text", lambda: _gof("chi2", "text", tl, tc, a_test))

    tests = family.results
    holm_rej = tuple(family.verdicts())

    n_eff: float = n * n_ref / (n + n_ref) if two_sample else float(n)
    detectable: float | None
    try:
        detectable = min_tv_detectable(k, max(1, int(n_eff)), a_test, power)
    except InvalidTest:
        detectable = None

    verdict: Verdict
    if any(holm_rej):
        names = [t.name for t, r in zip(tests, holm_rej) if r]
        verdict, reason = "lossy", f"Holm rejects {', '.join(names)} at family-wise alpha {alpha:.3g}"
    elif joint_invalid is not None:
        verdict, reason = "inconclusive", f"the joint test cannot run: {joint_invalid}"
    elif eps is not None and (detectable is None or detectable > eps):
        need = min_num_samples_for_tv(k, eps, a_test, power)
        verdict, reason = "inconclusive", (f"under-powered: detecting TV {eps:.4g} with power {power} needs "
                                           f"n >= {need}, got n={n}")
    else:
        verdict = "lossless-consistent"
        reason = (f"no test rejects at family-wise alpha {alpha:.3g}" +
                  ("" if detectable is None else f"; any law at TV >= {detectable:.4g} would be caught "
                                                 f"with probability >= {power}"))

    expected = {s: n * float(p) for s, p in ref_law.items()}
    keys = list(expected) + [s for s in counts if s not in expected]
    dev = [Deviation(s, counts.get(s, 0), expected.get(s, 0.0)) for s in keys]
    over = tuple(sorted((d for d in dev if d.observed > d.expected), key=lambda d: d.expected - d.observed)[:5])
    under = tuple(sorted((d for d in dev if d.observed < d.expected), key=lambda d: d.observed - d.expected)[:5])

    return AuditReport(
        n=n, alpha=float(alpha), power=float(power), eps=None if eps is None else float(eps), m=m,
        tests=tests, holm_rejected=holm_rej, skipped=tuple(skipped), k=k, detectable_tv=detectable,
        verdict=verdict, reason=reason, over=over, under=under,
        mode="two-sample" if two_sample else "exact", rng_note=rng_note,
        observed=dict(counts), expected=expected,
    )


# ---------------------------------------------------------------------------------------------
# The sampled part of ``hsd audit`` (``--sampled N --report PATH.md``)
# ---------------------------------------------------------------------------------------------

def sampled_audit_all(
    methods: Sequence[tuple[str, Any]],
    n: int,
    report_path: str | None = None,
    progress: Any = None,
) -> int:
    """Audit, with ``n`` samples each, every ``(label, method)`` of ``methods`` on the built-in
    world (against the target law; greedy methods against the greedy one) and every variant of
    :data:`hsd_core.variants.VARIANTS` on its pinned world (against the target law).

    Prints one line per sampler (verdict and detectable TV) to stdout and ``[i/total] label ...``
    progress lines to ``progress`` (default stderr). With ``report_path``, writes the markdown
    report there and, when matplotlib is importable, one PNG per sampler next to it. Seeds are
    fixed: ``numpy.random.default_rng(crc32(label))``. Returns 1 if a correct method is found
    lossy, else 0.
    """
    import os
    import zlib

    import numpy as np

    from . import exact, variants
    from .methods import SD
    from .worlds import builtin_world, from_spec

    out = sys.stderr if progress is None else progress
    world = builtin_world()
    jobs: list[tuple[str, bool, Any, Any, Any, str, int]] = []
    for lab, m in methods:
        drafter = world.same_vocab_drafter if isinstance(m, SD) else world.drafter
        jobs.append((lab, True, m, world.target, drafter, world.prompt, world.max_new_tokens))
    for name, mk in variants.VARIANTS.items():
        target, drafter, prompt = from_spec(variants.PINNED[name])
        jobs.append(("variant:" + name, False, mk(), target, drafter, prompt, variants.PINNED_MAX_NEW_TOKENS))
    print()
    print(f"Sampled audit (hsd_core.audit.audit_sampler, n={n} samples each, family-wise alpha 1e-6, "
          "against the target law; variants on their pinned worlds):")
    reports: list[tuple[str, bool, AuditReport]] = []
    for i, (lab, correct, m, target, drafter, prompt, mnt) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] {lab} ...", file=out, flush=True)
        law = exact.target_law(target, prompt, mnt, greedy=m.greedy)
        rng = np.random.default_rng(zlib.crc32(lab.encode()))

        def draw(m: Any = m, target: Any = target, drafter: Any = drafter, prompt: str = prompt,
                 mnt: int = mnt, rng: Any = rng) -> Sequence[int]:
            return list(m.generate(target, drafter, prompt, mnt, rng))

        def decode(s: Output, t: Any = target) -> str:
            return str(t.tokenizer.decode(s))

        rep = audit_sampler(draw, law, n=n, alpha=1e-6, text=decode,
                            rng_note=f"numpy default_rng(crc32({lab!r}))")
        reports.append((lab, correct, rep))
        det = "n/a" if rep.detectable_tv is None else f"{rep.detectable_tv:.4f}"
        print(f"  {lab:34s} {rep.verdict:20s} detectable TV {det}")
    bad = [lab for lab, correct, rep in reports if correct and rep.verdict == "lossy"]
    missed = [lab for lab, correct, rep in reports if not correct and rep.verdict != "lossy"]
    if missed:
        print(f"  variants not rejected at n={n} (need more samples, or inconclusive): {missed}")
    if report_path is not None:
        stem, _ = os.path.splitext(report_path)
        parts = [f"# hsd sampled audit (n={n} per sampler)", "",
                 "| sampler | expected | verdict | detectable TV |", "|---|---|---|---|"]
        for lab, correct, rep in reports:
            det = "n/a" if rep.detectable_tv is None else f"{rep.detectable_tv:.4g}"
            parts.append(f"| {lab} | {'lossless' if correct else 'lossy'} | {rep.verdict} | {det} |")
        parts.append("")
        os.makedirs(os.path.dirname(os.path.abspath(report_path)), exist_ok=True)
        for lab, _correct, rep in reports:
            slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in lab)
            png = f"{stem}_{slug}.png"
            parts.append(rep.to_markdown(title=lab))
            if rep.save_plot(png):
                parts += [f"![{lab}]({os.path.basename(png)})", ""]
        with open(report_path, "w", encoding="utf-8") as f:
            f.write("\n".join(parts))
        print(f"  report written to {report_path}")
    if bad:
        print(f"ERROR: correct methods found lossy by sampling: {bad}")
        return 1
    return 0
