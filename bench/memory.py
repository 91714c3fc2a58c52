"""Peak memory of a batched ``generate`` call on a real target (issue 19, "Memory on a large vocabulary").

Each measurement runs in a fresh subprocess: load the pair (``hsd_torch.real_models``), note the
resident set, run one batched call (``--rows`` copies of a prompt of about ``--prompt-tokens``
target tokens, ``--method``, ``--max-new-tokens``) after a one-row warm-up call (which pages the
memory-mapped weights in), and report the peak resident set
(``ru_maxrss``) above the loaded baseline, in total and per row. ``--compare`` runs it twice:
with logits computed only at the positions a round reads (``logits_to_keep``, what ``generate``
does) and with the head at every fed position (the runner's ``_keep_kw`` switched off), which is
what a prefill cost before. Rerun::

    python bench/memory.py --compare                      # Gemma-3-270M target, AR, 200 rows
    python bench/memory.py --target smollm2-135m-instruct --drafter gemma-3-270m --method tli

Figures are machine-dependent (allocator, threads); the ratio of the two runs is what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from typing import Any


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in this process (the child)."""
    import torch

    from hsd_torch import generate, real_models
    from hsd_torch.runner import Runner

    torch.set_num_threads(args.threads)
    target, tt = real_models.load(args.target)
    drafter, dt = real_models.load(args.drafter) if args.method != "ar" else (None, None)
    if args.full_logits:
        Runner._keep_kw = False  # type: ignore[assignment]  # the head at every fed position (the old cost)
        orig = Runner.__init__

        def init(self: Any, *a: Any, **k: Any) -> None:
            orig(self, *a, **k)
            self._keep_kw = False

        Runner.__init__ = init  # type: ignore[method-assign]
    words = "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun".split()
    prompt = " ".join(words[: max(1, args.prompt_tokens)])
    n_tok = len(tt(prompt, add_special_tokens=True)["input_ids"])
    # one row first: the weights (memory-mapped from the safetensors cache) are paged in by it
    generate(target, drafter, [prompt], target_tokenizer=tt, drafter_tokenizer=dt, method=args.method,
             max_new_tokens=args.max_new_tokens, do_sample=True, seed=0)
    base = _rss_mb()
    peak0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    generate(target, drafter, [prompt] * args.rows, target_tokenizer=tt, drafter_tokenizer=dt, method=args.method,
             max_new_tokens=args.max_new_tokens, do_sample=True, seed=0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"target": args.target, "method": args.method, "rows": args.rows, "prompt_tokens": n_tok,
            "full_logits": args.full_logits, "baseline_mb": round(base, 1), "peak_mb": round(peak, 1),
            "peak_before_call_mb": round(peak0, 1), "above_baseline_mb": round(peak - base, 1),
            "per_row_mb": round((peak - base) / args.rows, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="gemma-3-270m")
    ap.add_argument("--drafter", default="smollm2-135m-instruct")
    ap.add_argument("--method", default="ar")
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--prompt-tokens", type=int, default=12, help="words in the prompt (about one token each)")
    ap.add_argument("--max-new-tokens", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--full-logits", action="store_true", help="compute the head at every fed position")
    ap.add_argument("--compare", action="store_true", help="run with and without --full-logits, each in a child")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args)))
        return 0
    runs = [False, True] if args.compare else [args.full_logits]
    results = []
    for full in runs:
        cmd = [sys.executable, __file__, "--child", "--target", args.target, "--drafter", args.drafter, "--method",
               args.method, "--rows", str(args.rows), "--prompt-tokens", str(args.prompt_tokens), "--max-new-tokens",
               str(args.max_new_tokens), "--threads", str(args.threads)] + (["--full-logits"] if full else [])
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        res = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(res)
        print(json.dumps(res))
    if len(results) == 2:
        a, b = results
        print(f"peak above baseline: {a['above_baseline_mb']} MB with logits only where read, "
              f"{b['above_baseline_mb']} MB with the head at every position "
              f"({a['per_row_mb']} vs {b['per_row_mb']} MB per row)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
