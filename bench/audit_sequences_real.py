"""``audit_sequences`` on the real pair: SmolLM2-135M-Instruct target, Gemma-3-270M drafter (TLI).

Samples ``--n`` sequences of ``--max-new-tokens`` tokens with ``hsd_torch.generate`` (TLI,
lookahead 3, batched ``--batch`` per call, top-k 50 as a chat default would) and audits every token
against the target's teacher-forced law, with the drafter's law for the directional test; then the
same with a lossy control (the sampler at temperature 1.1 while the audit claims 1). Prints the
reports and writes a JSON file with the verdicts, the power statement and the cost of each part,
beside the cost of sampling the same number of tokens with plain AR (batched alike). One thread.

    python bench/audit_sequences_real.py --json bench/audit_sequences_real.json   # ~15 min on this CPU
    python bench/audit_sequences_real.py --n 32 --max-new-tokens 16 --top-k 0 --no-control \
        --json bench/audit_sequences_real_full.json                               # full vocabulary

``--top-k 0``: no top-k (the full vocabulary, as ``hsd audit model --impl ... --sequences`` samples by
default). Every run records where the audit's own time goes (``"parts"``): the target's
teacher-forced pass, the drafter's, the aimed test's second target pass, and the rest (laws,
pushforwards and statistics), measured by timing the library's own functions.

Needs the real models (README, "Real models"; converted on first load).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch
from bench_record import provenance, save

import hsd_torch.auditing.sequences as sq
from hsd_torch import generate
from hsd_torch.models import real as rm
from hsd_torch.auditing.sequences import audit_sequences


class Parts:
    """Seconds spent in the teacher-forced passes, by model (wraps the library's functions)."""

    def __init__(self, target: Any, drafter: Any) -> None:
        self.target, self.drafter = target, drafter
        self.s = {"target pass": 0.0, "drafter pass": 0.0, "aimed test's target pass": 0.0}
        self._forced, self._aimed, self._shared, self.in_aimed = (sq._forced_logits, sq._aimed_logits,
                                                                  sq._shared_logits, False)

    def __enter__(self) -> "Parts":
        def forced(model: Any, *a: Any) -> Any:
            t0 = time.perf_counter()
            out = self._forced(model, *a)
            if not self.in_aimed:
                self.s["drafter pass" if model is self.drafter else "target pass"] += time.perf_counter() - t0
            return out

        def aimed(*a: Any) -> Any:
            t0 = time.perf_counter()
            self.in_aimed = True
            try:
                return self._aimed(*a)
            finally:
                self.in_aimed = False
                self.s["aimed test's target pass"] += time.perf_counter() - t0

        def shared(model: Any, *a: Any) -> Any:  # the drafter's pass with its head on the shared ids only
            t0 = time.perf_counter()
            out = self._shared(model, *a)
            self.s["drafter pass"] += time.perf_counter() - t0
            return out

        sq._forced_logits, sq._aimed_logits, sq._shared_logits = forced, aimed, shared
        return self

    def __exit__(self, *exc: Any) -> None:
        sq._forced_logits, sq._aimed_logits, sq._shared_logits = self._forced, self._aimed, self._shared

PROMPTS = ["def fibonacci(n):\n", "The history of the printing press", "Question: why is the sky blue?\nAnswer:"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=50, help="0: none (the full vocabulary)")
    ap.add_argument("--no-control", action="store_true", help="skip the lossy control run")
    a = ap.parse_args()
    top_k = a.top_k or None
    torch.set_num_threads(1)
    target, tt = rm.load("smollm2-135m-instruct")
    drafter, dt = rm.load("gemma-3-270m")
    out: dict[str, Any] = {"target": "smollm2-135m-instruct", "drafter": "gemma-3-270m", "n": a.n,
                           "max_new_tokens": a.max_new_tokens, "top_k": a.top_k, "prompts": PROMPTS, "runs": {}}
    runs = [("tli", 1.0)] + ([] if a.no_control else [("tli at temperature 1.1 (lossy control)", 1.1)])
    for label, temperature in runs:
        def batch(prompts: list[str], seeds: list[int], temperature: float = temperature) -> list[list[int]]:
            return generate(target, drafter, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method="tli",
                            lookahead=3, max_new_tokens=a.max_new_tokens, top_k=top_k, temperature=temperature,
                            seed=seeds[0]).sequences

        t0 = time.perf_counter()
        with Parts(target, drafter) as parts:
            rep = audit_sequences(None, target, tt, PROMPTS, n=a.n, max_new_tokens=a.max_new_tokens, top_k=top_k,
                                  drafter=drafter, drafter_tokenizer=dt, sample_batch_fn=batch, batch_size=a.batch,
                                  name=label, progress=lambda line: print("  " + line, flush=True))
        own = rep.cost["teacher forcing"] + rep.cost["statistics"]
        split = dict(parts.s, **{"laws, pushforwards and statistics": own - sum(parts.s.values())})
        print("  the audit's own cost:", json.dumps({k: round(v, 2) for k, v in split.items()}), flush=True)
        print(rep.to_markdown(), flush=True)
        out["runs"][label] = {
            "verdict": rep.verdict, "reason": rep.reason, "tokens": rep.tokens, "cost": rep.cost, "parts": split,
            "wall": time.perf_counter() - t0,
            "tests": [{"name": t.name, "statistic": t.statistic, "p_value": t.p_value} for t in rep.tests],
            "families": [{"family": f.family, "detectable": f.detectable, "mean_tv": f.mean_tv, "caught": f.caught,
                          "by": f.by} for f in rep.families]}
    t0 = time.perf_counter()
    n_ar = 0
    for b0 in range(0, a.n, a.batch):
        rows = generate(target, None, [PROMPTS[i % len(PROMPTS)] for i in range(b0, min(a.n, b0 + a.batch))],
                        target_tokenizer=tt, method="ar", max_new_tokens=a.max_new_tokens, top_k=top_k,
                        seed=b0).sequences
        n_ar += sum(len(r) for r in rows)
    out["ar_sampling_seconds_per_token"] = (time.perf_counter() - t0) / n_ar
    run = out["runs"]["tli"]
    own = run["cost"]["teacher forcing"] + run["cost"]["statistics"]
    out["overhead_over_ar"] = own / (out["ar_sampling_seconds_per_token"] * run["tokens"])
    out["overhead_over_the_audited_sampler"] = own / run["cost"]["sampling"]
    out.update(provenance(), threads=1)
    print(json.dumps({k: out[k] for k in ("ar_sampling_seconds_per_token", "overhead_over_ar",
                                          "overhead_over_the_audited_sampler")}), flush=True)
    save(out, a.json)


if __name__ == "__main__":
    main()
