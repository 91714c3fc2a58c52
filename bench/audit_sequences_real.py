"""``audit_sequences`` on the real pair: SmolLM2-135M-Instruct target, Gemma-3-270M drafter (TLI).

Samples ``--n`` sequences of ``--max-new-tokens`` tokens with ``hsd_torch.generate`` (TLI,
lookahead 3, batched ``--batch`` per call, top-k 50 as a chat default would) and audits every token
against the target's teacher-forced law, with the drafter's law for the directional test; then the
same with a lossy control (the sampler at temperature 1.1 while the audit claims 1). Prints the
reports and writes a JSON file with the verdicts, the power statement and the cost of each part,
beside the cost of sampling the same number of tokens with plain AR (batched alike). One thread.

    python bench/audit_sequences_real.py --json bench/audit_sequences_real.json   # ~15 min on this CPU

Needs the real models (README, "Real models"; converted on first load).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from hsd_torch import generate
from hsd_torch import real_models as rm
from hsd_torch.audit import audit_sequences

PROMPTS = ["def fibonacci(n):\n", "The history of the printing press", "Question: why is the sky blue?\nAnswer:"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=50)
    a = ap.parse_args()
    torch.set_num_threads(1)
    target, tt = rm.load("smollm2-135m-instruct")
    drafter, dt = rm.load("gemma-3-270m")
    out: dict[str, Any] = {"target": "smollm2-135m-instruct", "drafter": "gemma-3-270m", "n": a.n,
                           "max_new_tokens": a.max_new_tokens, "top_k": a.top_k, "prompts": PROMPTS, "runs": {}}
    for label, temperature in (("tli", 1.0), ("tli at temperature 1.1 (lossy control)", 1.1)):
        def batch(prompts: list[str], seeds: list[int], temperature: float = temperature) -> list[list[int]]:
            return generate(target, drafter, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method="tli",
                            lookahead=3, max_new_tokens=a.max_new_tokens, top_k=a.top_k, temperature=temperature,
                            seed=seeds[0]).sequences

        t0 = time.perf_counter()
        rep = audit_sequences(None, target, tt, PROMPTS, n=a.n, max_new_tokens=a.max_new_tokens, top_k=a.top_k,
                              drafter=drafter, drafter_tokenizer=dt, sample_batch_fn=batch, batch_size=a.batch,
                              name=label, progress=lambda line: print("  " + line, flush=True))
        print(rep.to_markdown(), flush=True)
        out["runs"][label] = {
            "verdict": rep.verdict, "reason": rep.reason, "tokens": rep.tokens, "cost": rep.cost,
            "wall": time.perf_counter() - t0,
            "tests": [{"name": t.name, "statistic": t.statistic, "p_value": t.p_value} for t in rep.tests],
            "families": [{"family": f.family, "detectable": f.detectable, "mean_tv": f.mean_tv, "caught": f.caught,
                          "by": f.by} for f in rep.families]}
    t0 = time.perf_counter()
    n_ar = 0
    for b0 in range(0, a.n, a.batch):
        rows = generate(target, None, [PROMPTS[i % len(PROMPTS)] for i in range(b0, min(a.n, b0 + a.batch))],
                        target_tokenizer=tt, method="ar", max_new_tokens=a.max_new_tokens, top_k=a.top_k,
                        seed=b0).sequences
        n_ar += sum(len(r) for r in rows)
    out["ar_sampling_seconds_per_token"] = (time.perf_counter() - t0) / n_ar
    run = out["runs"]["tli"]
    own = run["cost"]["teacher forcing"] + run["cost"]["statistics"]
    out["overhead_over_ar"] = own / (out["ar_sampling_seconds_per_token"] * run["tokens"])
    print(json.dumps({k: out[k] for k in ("ar_sampling_seconds_per_token", "overhead_over_ar")}), flush=True)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
