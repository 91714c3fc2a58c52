"""Sized statistical tests for samplers: goodness of fit, two-sample tests, sizing, multiple testing.

``hsd_core`` proves losslessness exactly, on ``fractions.Fraction`` laws. The tests here check the
*sampler implementations* (indexing, RNG use, float paths) against those exact laws, so every test
is a designed experiment, as in TFP's ``statistical_testing``:

* pick a false-fail rate ``alpha`` (the probability that a correct sampler fails the test),
* pick a discrepancy to detect, as a total-variation distance ``eps``, and a ``power``
  (1 - false-pass rate against any law at TV >= eps),
* derive the sample size with :func:`min_num_samples_for_tv` (or, for a given sample size, the
  smallest detectable TV with :func:`min_tv_detectable`), and run the test.

Glossary
--------
law
    A ``Mapping[K, float | Fraction]`` from hashable outcomes (typically tuples of token ids) to
    probabilities. Exact laws (all entries ``Fraction``/``int``) must sum to exactly 1; float laws
    to 1 within ``FLOAT_TOL``. Outcomes absent from the mapping have probability 0.
samples
    A ``Sequence[K]`` of outcomes, or a ``Mapping[K, int]`` of counts (see :func:`counts_of`).
cell
    One outcome of the law in a chi-square table. Cells whose expected count ``n*p`` is below
    ``min_expected`` are pooled into one ``"other"`` cell (:func:`pool_cells`).
false fail / false pass
    Rejecting a correct sampler / accepting a wrong one. Families of tests share one false-fail
    budget through :class:`TestFamily` (Holm or Bonferroni).

Two kinds of tests are offered. The chi-square and G tests (:func:`chi_square_gof`,
:func:`g_test_gof`, :func:`chi_square_two_sample`) rely on the usual asymptotics (every pooled
cell has an expected count >= 5). The TV tests (:func:`tv_test`, :func:`tv_two_sample`) are
distribution-free: their false-fail rate is at most ``alpha`` for every n, by the L1 deviation
bound of Weissman, Ordentlich, Seroussi, Verdu and Weinberger (2003),
``P(||p_hat - p||_1 >= e) <= (2^k - 2) exp(-n e^2 / 2)``, but they need about 2-3 times more
samples. A sample on an outcome of probability 0 rejects every one-sample test outright.

Errors: :class:`InvalidTest` (a ``ValueError``) means "this configuration cannot give a meaningful
answer" (too few samples, too sparse a law, unreachable power, bad alpha); its message says what
to change. ``AssertionError`` (from :func:`assert_law_matches`) means "the sampler is wrong".

Where things are
----------------
The package holds every statistic of hsd's audits, one concept per module:

* the tests and their sizing: :mod:`~hsd_core.stats.checks` (:class:`TestResult`,
  :class:`InvalidTest`, argument checks), :mod:`~hsd_core.stats.counts` (counts, empirical laws,
  TV), :mod:`~hsd_core.stats.pooling`, :mod:`~hsd_core.stats.gof` (one-sample tests and
  :func:`assert_law_matches`), :mod:`~hsd_core.stats.homogeneity` (two-sample tests),
  :mod:`~hsd_core.stats.sizing`;
* how an audit combines its tests and reaches its verdict, the same for every audit:
  :mod:`~hsd_core.stats.family` (:class:`TestFamily`, Holm / Bonferroni, :func:`decide`); an
  audit made of audits (an engine's file, its null control and the two-sample test) combines their
  verdicts by :mod:`~hsd_core.stats.combine` (:func:`combine_parts`, :func:`combine_with_control`);
* the audit of a sampler against an exact law or reference samples (:mod:`hsd_core.audit`): its
  outputs and cells (:mod:`~hsd_core.stats.outputs`), its sizing and promise
  (:mod:`~hsd_core.stats.promise`), its report (:mod:`~hsd_core.stats.report`);
* the sequence audit (:mod:`hsd_core.seqaudit`): the evidence accumulated token by token
  (:mod:`~hsd_core.stats.evidence`), the power statement (:mod:`~hsd_core.stats.seqpower`), the
  tests run on the evidence (:mod:`~hsd_core.stats.seqtests`), the report
  (:mod:`~hsd_core.stats.seqreport`).

This module re-exports the names of the sized tests, as ``hsd_core.stats`` always did.
"""

from __future__ import annotations

from .checks import FLOAT_TOL, InvalidTest, TestResult
from .checks import K as K
from .checks import Law as Law
from .checks import Prob as Prob
from .checks import Samples as Samples
from .checks import TestName as TestName
from .combine import combine_parts, combine_with_control
from .counts import counts_of, empirical_law, total_variation
from .family import TestFamily, Verdict, bonferroni, decide, holm
from .gof import assert_law_matches, chi_square_gof, g_test_gof, gof_test, tv_test
from .homogeneity import chi_square_two_sample, tv_two_sample
from .pooling import OTHER, pool_cells
from .sizing import min_num_samples_for_tv, min_tv_detectable, power_chi2

__all__ = [
    "FLOAT_TOL", "OTHER", "InvalidTest", "TestFamily", "TestResult", "Verdict", "decide", "gof_test",
    "assert_law_matches", "bonferroni", "chi_square_gof", "chi_square_two_sample", "combine_parts",
    "combine_with_control", "counts_of",
    "empirical_law", "g_test_gof", "holm", "min_num_samples_for_tv", "min_tv_detectable",
    "pool_cells", "power_chi2", "total_variation", "tv_test", "tv_two_sample",
]
