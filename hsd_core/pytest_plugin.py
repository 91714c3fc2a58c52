"""pytest plugin: assert in a few lines that a sampler is lossless (docs/auditing.md, "The pytest plugin").

Registered under the ``pytest11`` entry point (``hsd = "hsd_core.pytest_plugin"``), so any project
that installs hsd gets the ``hsd_lossless`` fixture::

    def test_my_sampler_is_lossless(hsd_lossless):
        hsd_lossless(lambda rng: my_sample(rng), law, n=20_000)

``hsd_lossless(sample_fn, law_or_target, n=..., alpha=1e-6, seed=0, **kw)``:

* ``law_or_target`` a ``Mapping`` (output tuple -> probability): ``sample_fn(rng)`` draws one
  output from a ``numpy.random.Generator``; :func:`hsd_core.audit.audit_sampler` runs with
  ``seed`` (chunked ``SeedSequence`` spawns, so the failure is reproducible from the seed);
* otherwise a Hugging Face target model: ``sample_fn(prompt, seed)`` returns new target ids, and
  ``tokenizer=`` and ``prompt=`` are required; :func:`hsd_torch.auditing.first_tokens.audit_generate` runs (other
  keywords pass through: ``positions``, ``do_sample``, ``temperature``, ``top_k``, ...). It is
  found through the ``hsd.model_audits`` entry point (:mod:`hsd_core.extensions`), so this module
  imports nothing from hsd_torch; without torch, an ``ImportError`` says what to install.

With ``sequences=True`` every token of whole sequences is audited against its conditional law
instead (:mod:`hsd_core.seqaudit`): ``sample_fn(prompt, seed)`` returns new target ids; for an
``hsd_core`` model (it has ``next_probs``) :func:`hsd_core.seqaudit.audit_sequences` runs with
``prompts=`` (a str or a list); for a Hugging Face target the ``hsd.sequence_audits`` entry point
(:func:`hsd_torch.auditing.sequences.audit_sequences`) runs with ``tokenizer=`` and ``prompts=`` (``n``
defaults to 200 sequences there, ``max_new_tokens`` 32; ``drafter=`` adds the directional test).

The test fails unless the verdict is "lossless-consistent" ("inconclusive" fails too: an audit
never passes without a promise), with a message naming the verdict, the estimated TV, the TV the
test could detect, the worst cells and the seed that reproduces the run. ``alpha`` defaults to
1e-6, the suite's family-wise false-fail rate. Importing this module never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest

from .audit import AuditReport, audit_sampler
from .extensions import load_model_audit, load_sequence_audit

__all__ = ["assert_lossless", "hsd_lossless"]


def _tv(rep: AuditReport) -> float:
    keys = set(rep.expected) | set(rep.observed)
    return 0.5 * sum(abs(rep.observed.get(k, 0) - rep.expected.get(k, 0.0)) for k in keys) / rep.n


def _assert_sequences(sample_fn: Callable[..., Any], target: Any, n: int | None, alpha: float, seed: int,
                      kw: dict[str, Any]) -> Any:
    try:
        prompts = kw.pop("prompts")
    except KeyError:
        raise TypeError("hsd_lossless(..., sequences=True) needs prompts= (a str or a list of str)") from None
    n = 200 if n is None else n
    if callable(getattr(target, "next_probs", None)):
        from .seqaudit import audit_sequences

        rep = audit_sequences(sample_fn, target, prompts, n=n, alpha=alpha, seed=seed, **kw)
    else:
        try:
            tokenizer = kw.pop("tokenizer")
        except KeyError:
            raise TypeError("hsd_lossless(sample_fn, target, sequences=True, ...) needs tokenizer= and prompts=") from None
        rep = load_sequence_audit()(sample_fn, target, tokenizer, prompts, n=n, alpha=alpha, seed=seed, **kw)
    if rep.verdict != "lossless-consistent":
        det = "n/a" if rep.detectable_tv is None else f"{rep.detectable_tv:.4g}"
        failed = ", ".join(t.name for t, r in zip(rep.tests, rep.holm_rejected) if r) or "none"
        pytest.fail(f"hsd_lossless (sequences): sampler {rep.verdict}: {rep.reason}; tests rejected: {failed}; "
                    f"{rep.n} sequences, {rep.tokens} tokens, detectable mean per-token TV {det} "
                    f"({rep.detectable_by}); reproduce with seed={seed}", pytrace=False)
    return rep


def assert_lossless(sample_fn: Callable[..., Any], law_or_target: Any, n: int | None = None, *, alpha: float = 1e-6,
                    seed: int = 0, sequences: bool = False, **kw: Any) -> Any:
    """Audit ``sample_fn`` (module docstring); ``pytest.fail`` unless lossless-consistent.
    ``n`` defaults to 20,000 draws (200 sequences with ``sequences=True``). Returns the report."""
    if sequences:
        return _assert_sequences(sample_fn, law_or_target, n, alpha, seed, kw)
    n = 20_000 if n is None else n
    rep: Any
    if isinstance(law_or_target, Mapping):
        rep = audit_sampler(sample_fn, law_or_target, n=n, alpha=alpha, seed=seed, **kw)
        core, tv, det = rep, _tv(rep), rep.detectable_tv
        over = [(d.output, d.observed, d.expected) for d in rep.over[:3]]
        under = [(d.output, d.observed, d.expected) for d in rep.under[:3]]
    else:
        try:
            tokenizer, prompt = kw.pop("tokenizer"), kw.pop("prompt")
        except KeyError:
            raise TypeError("hsd_lossless(sample_fn, target, ...) needs tokenizer= and prompt= "
                            "(or pass an exact law as a Mapping)") from None
        audit_generate = load_model_audit()  # the backend's, through its entry point (imports torch)
        g = audit_generate(sample_fn, law_or_target, tokenizer, prompt, n=n, alpha=alpha, seed=seed, **kw)
        core, tv, det = g.core, g.tv_estimate, g.detectable_tv
        over = [(f"{d.output} {d.text!r}", d.observed, d.expected) for d in g.over[:3]]
        under = [(f"{d.output} {d.text!r}", d.observed, d.expected) for d in g.under[:3]]
        rep = g
    if rep.verdict != "lossless-consistent":
        det_s = "n/a" if det is None else f"{det:.4g}"
        fmt = "; ".join(f"{o}: {ob} observed vs {ex:.1f} expected" for o, ob, ex in over + under)
        pytest.fail(f"hsd_lossless: sampler {rep.verdict}: estimated TV {tv:.4g} (detectable TV {det_s} at "
                    f"family-wise alpha {alpha:.3g}, n={core.n}); {rep.reason}; worst cells: {fmt}; "
                    f"reproduce with seed={seed}", pytrace=False)
    return rep


@pytest.fixture
def hsd_lossless() -> Callable[..., Any]:
    """``hsd_lossless(sample_fn, law_or_target, n=..., ...)``: :func:`assert_lossless`."""
    return assert_lossless
