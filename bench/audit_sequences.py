"""Power and cost of ``hsd_torch.auditing.sequences.audit_sequences`` on the tiny pair.

For n = 25 .. 800 sequences of 32 tokens sampled by ``hsd_torch.generate`` (TLI, batched 16 per
call, temperature 1), the audit's stated power: the smallest mixture toward the drafter caught
with probability 0.99 (lambda and the mean per-token TV it amounts to) and the smallest temperature
factor; then how many tokens would bring the mixture's promise to a
mean per-token TV of 0.05 and of 0.01 (the report's ``n_needed`` from the smallest run). Cost: the audit's own work
(teacher forcing + statistics) against sampling the same number of tokens with plain AR decoding
(``generate(method="ar")``, batched alike), measured in the same run, one thread, min and median of
``--repeat`` runs.

    python bench/audit_sequences.py --json bench/audit_sequences.json     # about 3 minutes

Goals (bench/RESULTS.md, "Sequence audits: power and cost"): mixture toward the drafter at mean
per-token TV 0.05 detected with <= 10,000 tokens, 0.01 with <= 250,000 tokens; the audit's overhead <=
the cost of AR sampling.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
from bench_record import save

from hsd_torch import generate
from hsd_torch.models import tiny
from hsd_torch.auditing.sequences import audit_sequences

PROMPTS = ["def foo(x):\n", "The quick brown"]
L = 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--sizes", default="25,50,100,200,400,800")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    target, tt, drafter, dt = tiny.tiny_pair()

    def tli(prompts: list[str], seeds: list[int]) -> list[list[int]]:
        return generate(target, drafter, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method="tli",
                        lookahead=3, max_new_tokens=L, seed=seeds[0]).sequences

    def ar(prompts: list[str], seeds: list[int]) -> list[list[int]]:
        return generate(target, None, prompts, target_tokenizer=tt, method="ar", max_new_tokens=L,
                        seed=seeds[0]).sequences

    out: dict[str, Any] = {"prompts": PROMPTS, "max_new_tokens": L, "power": []}
    for n in (int(x) for x in a.sizes.split(",")):
        rep = audit_sequences(None, target, tt, PROMPTS, n=n, max_new_tokens=L, drafter=drafter, drafter_tokenizer=dt,
                              sample_batch_fn=tli, max_detectable_tv=None)
        fam = {f.family: f for f in rep.families}
        mix, temp = fam["mixture toward the drafter"], fam["temperature off by a factor"]
        row = {"n": n, "tokens": rep.tokens, "verdict": rep.verdict, "mixture_lambda": mix.detectable,
               "mixture_mean_tv": mix.mean_tv, "temperature_factor": temp.detectable, "cost": rep.cost}
        out["power"].append(row)
        print(json.dumps(row), flush=True)
    small = out["power"][0]
    for goal in (0.05, 0.01):  # from the smallest run: the report's estimate of the sequences needed
        r = audit_sequences(None, target, tt, PROMPTS, n=small["n"], max_new_tokens=L, drafter=drafter,
                            drafter_tokenizer=dt, sample_batch_fn=tli, max_detectable_tv=goal)
        tokens = small["tokens"] if r.n_needed is None else round(r.n_needed * r.tokens / small["n"])
        out[f"tokens_for_tv_{goal}"] = {"tokens": tokens, "already_at_smallest_n": r.n_needed is None,
                                        "verdict": r.verdict}
        print(f"mixture at mean per-token TV {goal}: {'<= ' if r.n_needed is None else 'about '}{tokens} tokens",
              flush=True)
    # cost: AR sampling vs the audit's own work on the same 200 x 32 tokens
    costs: dict[str, list[float]] = {"ar_sampling": [], "teacher_forcing_and_statistics": [], "tokens": []}
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        rows = sum((ar(PROMPTS[:1] * 16, [s]) for s in range(200 // 16 + 1)), [])
        t_ar = time.perf_counter() - t0
        n_ar = sum(len(r) for r in rows)
        rep = audit_sequences(None, target, tt, PROMPTS, n=200, max_new_tokens=L, drafter=drafter,
                              drafter_tokenizer=dt, sample_batch_fn=tli)
        own = rep.cost["teacher forcing"] + rep.cost["statistics"]
        costs["ar_sampling"].append(t_ar / n_ar * rep.tokens)  # AR's time for the audit's number of tokens
        costs["teacher_forcing_and_statistics"].append(own)
        costs["tokens"].append(rep.tokens)
    ratios = [o / s for o, s in zip(costs["teacher_forcing_and_statistics"], costs["ar_sampling"])]
    out["cost"] = {k: {"min": min(v), "median": statistics.median(v)} for k, v in costs.items()}
    out["cost"]["overhead_over_ar"] = {"min": min(ratios), "median": statistics.median(ratios)}
    print(json.dumps(out["cost"]), flush=True)
    save(out, a.json)


if __name__ == "__main__":
    main()
