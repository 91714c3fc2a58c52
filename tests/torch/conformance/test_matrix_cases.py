"""The matrix's processing case ``ngram_repeat`` (hsd_torch.conformance.matrix.CASES): a prompt with a
repeated n-gram, so that a prompt-lookup drafter (vLLM's ``ngram``) proposes tokens the target may accept.

* its whole-draw law (hsd_core.conformance.sequence_law) equals hsd_core's exact engine's target law over
  the kit as explicit models, to 1e-12, as tests/exact/test_conformance_laws.py checks the other prompts;
* prompt lookup (longest suffix n-gram of 1-4 ids, its earliest earlier occurrence, up to 3 ids after it:
  vLLM 0.32's rule, written here; it agreed with vLLM's own function on 20,000 random contexts) drafts
  from the prompt alone and, as vLLM looks up (after each sampled id, the first one included), after
  the prompt and its likeliest first id `` cat``: `` sat the cat``, each with target probability of at
  least 1/4 along the chain, so both acceptances and rejections occur; no other case's prompt drafts;
* the case has teeth: draws of a sampler that trusts the lookup (emits the three drafts unverified, then
  the target's next id) are lossy at N = 600, family-wise alpha 1e-3 (the lossy law puts 1 on drafts the
  target emits with 0.113: a whole-draw TV of 0.89, against a detectable TV of about 0.2 at that N, so the
  rejection does not hold by luck of the seed);
* hsd_torch runs it (SD and TLI, N = 600, alpha 1e-3: a false fail at most 1e-3 a cell).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hsd_core import conformance as kc
from hsd_core.samples import Draw
from hsd_torch.conformance.audit import audit_draws
from hsd_torch.conformance.engines import Case
from hsd_torch.conformance.hsd_engine import HsdTorchEngine
from hsd_torch.conformance.matrix import CASES, MODE_SPECS, audit_case

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import suite_helpers  # noqa: E402

T = kc.kit_model("target")
I = T.id_of_text
CASE = next(c for c in CASES if c.name == "ngram_repeat")
N = 600
ALPHA = 1e-3


def prompt_lookup(ids: tuple[int, ...], min_n: int = 1, max_n: int = 4, k: int = 3) -> tuple[int, ...]:
    """What prompt lookup proposes after ``ids``: the longest n-gram (``min_n <= n <= max_n``) ending the
    context that also occurs earlier, at its earliest occurrence, and the up to ``k`` ids that follow it."""
    for n in range(min(max_n, len(ids) - 1), min_n - 1, -1):
        suffix = ids[-n:]
        for start in range(len(ids) - n):
            if ids[start:start + n] == suffix:
                return ids[start + n:start + n + k]
    return ()


def test_the_law_is_the_exact_engines_target_law() -> None:
    (prompt,) = CASE.prompts
    suite_helpers.assert_kit_law_is_exact(prompt, replace(CASE.sampling, order="vllm"))


def test_prompt_lookup_drafts_tokens_the_target_may_accept() -> None:
    (prompt,) = CASE.prompts
    assert prompt_lookup(prompt) == (I[" cat"], I[" sat"], I[" the"])
    first = kc.next_law(T, prompt)
    assert int(np.argmax(first)) == I[" cat"] and first[I[" cat"]] > 0.9
    after = prompt + (I[" cat"],)
    drafts = prompt_lookup(after)
    assert drafts == (I[" sat"], I[" the"], I[" cat"])
    ctx, chain = list(after), []
    for d in drafts:
        chain.append(float(kc.next_law(T, ctx)[d]))
        ctx.append(d)
    assert all(0.25 <= p < 1 for p in chain), chain  # accepted and rejected, at every draft position
    assert all(prompt_lookup(p) == () for c in CASES if c is not CASE for p in c.prompts)  # the only one that drafts


def test_a_sampler_that_trusts_the_lookup_is_lossy() -> None:
    (prompt,) = CASE.prompts
    s = replace(CASE.sampling, order="vllm")
    law = kc.sequence_law(T, prompt, s)
    drafts = prompt_lookup(prompt)
    rng = np.random.default_rng(47)
    draws = []
    for seed in range(N):
        ctx = list(prompt) + list(drafts)
        p = kc.next_law(T, ctx)
        draws.append(Draw(drafts + (int(rng.choice(len(p), p=p)),), seed=seed, prompt_ids=prompt))
    a = audit_draws(draws, law, ALPHA)
    assert a.verdict == "lossy", a.reason
    whole = next(t for t in a.tests if t.name == "whole draws")
    assert whole.detectable_tv is not None and whole.detectable_tv < 0.3


@pytest.mark.parametrize("mode", ["sd", "tli"])
def test_hsd_torch_conforms_on_the_repeated_ngram(kit: Path, mode: str) -> None:
    drafter, settings, _ = MODE_SPECS[mode]
    case = Case(kit, CASE.prompts[0], CASE.for_engine("transformers"), mode, drafter, settings, CASE.target)
    r = audit_case(HsdTorchEngine(kit), "hsd_torch", case, CASE.name, N, ALPHA, None)
    assert r.outcome == "conforms", r.reason
    assert r.acceptance is not None and r.acceptance["low"] <= r.acceptance["expected"] <= r.acceptance["high"]
