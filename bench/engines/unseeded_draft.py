"""vLLM's draft_model (SmolLM2-135M-Instruct drafting for itself), temperature 1, 40 draws **without
per-request seeds**, audited with :func:`hsd_torch.auditing.samples.audit_samples` (transformers'
law, no aimed test): whether the sampled-speculation loss of docs/auditing-engines.md needs the
seeded generators. Writes bench/engines/samples/smol-draft-t1-unseeded.jsonl.

    HSD_VLLM_PYTHON=~/.cache/hsd/vllm-venv/bin/python python bench/engines/unseeded_draft.py
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from hsd_core.seqaudit import sequence_seeds  # noqa: E402
from hsd_torch.models import real as real_models  # noqa: E402
from hsd_torch.auditing.samples import audit_samples  # noqa: E402
from hsd_torch.engines import vllm_audit as va  # noqa: E402

SMOL = "smollm2-135m-instruct"
PROMPTS = ["def fibonacci(n):", "The capital of France is", "Once upon a time, there was",
           "the cat sat on the mat. the cat sat on the"]


def main() -> None:
    torch.set_num_threads(1)
    model, tok = real_models.load(SMOL)
    ids = [[int(x) for x in tok(p)["input_ids"]] for p in PROMPTS]
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "samples", "smol-draft-t1-unseeded.jsonl")
    entry = va.file_entry(ids, PROMPTS, sequence_seeds(7, 40), out, do_sample=True, max_new_tokens=32)
    for r in entry["requests"]:
        r["seed"] = None  # vLLM draws from its engine-wide generator
    spec = va.spec_entry("draft_model", va.model_folder(SMOL), SMOL)
    summary = va.sample(va.find_python(None), va.build_job(va.model_folder(SMOL), [entry], spec, target_name=SMOL),
                        log=out + ".log")[0]
    print("vLLM counters:", summary["spec_stats"], flush=True)
    rep = audit_samples(out, model, tok, alpha=1e-3, context_bugs=())
    print(rep.verdict, "|", rep.audited.sequence.reason)


if __name__ == "__main__":
    main()
