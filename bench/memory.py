"""Peak memory of a batched ``generate`` call on a real target (docs/generate.md, "How it runs").

Each measurement runs in a fresh subprocess: load the pair (``hsd_torch.models.real``), note the
resident set, run one batched call (``--rows`` copies of a prompt of about ``--prompt-tokens``
target tokens, ``--method``, ``--max-new-tokens``) after a one-row warm-up call (which pages the
memory-mapped weights in), and report the peak resident set of that
call (``VmHWM`` after resetting it through ``/proc/self/clear_refs``; ``ru_maxrss``, the process's
peak, where that is not possible) above the loaded baseline, in total and per row. ``--compare`` runs it twice:
with logits computed only at the positions a round reads (``logits_to_keep``, what ``generate``
does) and with the head at every fed position (the runner's ``_keep_kw`` switched off), which is
what a prefill cost before. Rerun::

    python bench/memory.py --compare                      # Gemma-3-270M target, AR, 200 rows
    python bench/memory.py --target smollm2-135m-instruct --drafter gemma-3-270m --method tli

Figures are machine-dependent (allocator, threads); the ratio of the two runs is what to read.

Prompts of several lengths (``--mixed``: row ``i`` gets the first ``--prompt-tokens + i`` words) are
the case where keeping the union of the rows' read columns for every row grew as rows x distinct
lengths x vocabulary; ``--batches 1,8,32`` sweeps the batch size, each with ``--compare``'s two runs,
where the second now means that union (``--union``: the head at every row's read columns for every
row, ``logits_to_keep`` alone, what ``generate`` did before ``hsd_torch.engine._head`` steered it per row).
``--tiny-vocab N`` runs a tiny random Llama with an ``N``-id head (hidden size 64) instead of the
real models, AR, in seconds::

    python bench/memory.py --tiny-vocab 262144 --mixed --batches 1,8,16,32 --compare --json bench/memory_mixed_tiny.json
    python bench/memory.py --mixed --batches 1,8,32 --compare --json bench/memory_mixed_real.json   # Gemma, slow
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


def _reset_peak() -> bool:
    """Reset this process's peak resident set (Linux: ``5`` to ``/proc/self/clear_refs``), so that
    :func:`_peak_mb` reads the peak of what runs next, not of the model's loading; False if it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_mb(reset: bool) -> float:
    """The peak resident set since :func:`_reset_peak` (``VmHWM``), else since the process began."""
    if reset:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in this process (the child)."""
    import torch

    from hsd_torch import generate
    from hsd_torch.models import real as real_models
    from hsd_torch.engine.runner import Runner

    torch.set_num_threads(args.threads)
    if args.tiny_vocab:
        from hsd_torch.models import tiny

        tt = tiny.tiny_tokenizer("byte_bpe")
        target = tiny.tiny_llama(tt, vocab_size=args.tiny_vocab, max_position_embeddings=4096, dtype=torch.float32)
        drafter, dt = (target, tt) if args.method != "ar" else (None, None)
    else:
        target, tt = real_models.load(args.target)
        drafter, dt = real_models.load(args.drafter) if args.method != "ar" else (None, None)
    if args.union:
        from hsd_torch.engine._head import HeadTap

        HeadTap.usable = property(lambda self: False)  # type: ignore[method-assign,assignment]
    if args.full_logits:
        Runner._keep_kw = False  # type: ignore[assignment]  # the head at every fed position (the old cost)
        orig = Runner.__init__

        def init(self: Any, *a: Any, **k: Any) -> None:
            orig(self, *a, **k)
            self._keep_kw = False

        Runner.__init__ = init  # type: ignore[method-assign]
    words = "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun".split()
    def text(n: int) -> str:
        return " ".join(words[i % len(words)] for i in range(max(1, n)))

    prompt = text(args.prompt_tokens)
    prompts = [text(args.prompt_tokens + i) if args.mixed else prompt for i in range(args.rows)]
    n_tok = len(tt(prompt, add_special_tokens=True)["input_ids"])
    # one row first: the weights (memory-mapped from the safetensors cache) are paged in by it
    generate(target, drafter, [prompt], target_tokenizer=tt, drafter_tokenizer=dt, method=args.method,
             max_new_tokens=args.max_new_tokens, do_sample=True, seed=0)
    base = _rss_mb()
    peak0 = _peak_mb(False)
    reset = _reset_peak()
    generate(target, drafter, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method=args.method,
             max_new_tokens=args.max_new_tokens, do_sample=True, seed=0)
    peak = _peak_mb(reset)
    return {"target": f"tiny-llama-{args.tiny_vocab}" if args.tiny_vocab else args.target, "method": args.method,
            "rows": args.rows, "prompt_tokens": n_tok, "mixed": args.mixed, "union": args.union,
            "full_logits": args.full_logits, "baseline_mb": round(base, 1), "peak_mb": round(peak, 1),
            "peak_before_call_mb": round(peak0, 1), "peak_reset": reset, "above_baseline_mb": round(peak - base, 1),
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
    ap.add_argument("--compare", action="store_true",
                    help="run with and without --full-logits (with --mixed: --union), each in a child")
    ap.add_argument("--mixed", action="store_true", help="prompts of distinct lengths (row i: prompt-tokens + i words)")
    ap.add_argument("--union", action="store_true",
                    help="keep the union of the rows' read columns for every row (the head not steered per row)")
    ap.add_argument("--batches", help="comma-separated row counts to sweep (overrides --rows)")
    ap.add_argument("--tiny-vocab", type=int, default=0, help="a tiny random Llama with this many ids, AR")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args)))
        return 0
    old_flag = "--union" if args.mixed else "--full-logits"
    runs = [False, True] if args.compare else [args.full_logits or args.union]
    results = []
    for rows in ([int(b) for b in args.batches.split(",")] if args.batches else [args.rows]):
        pair = []
        for old in runs:
            cmd = [sys.executable, __file__, "--child", "--target", args.target, "--drafter", args.drafter, "--method",
                   args.method, "--rows", str(rows), "--prompt-tokens", str(args.prompt_tokens), "--max-new-tokens",
                   str(args.max_new_tokens), "--threads", str(args.threads), "--tiny-vocab", str(args.tiny_vocab)]
            cmd += (["--mixed"] if args.mixed else []) + ([old_flag] if old else [])
            out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                                 env={**os.environ, "HF_HUB_OFFLINE": "1"})
            res = json.loads(out.stdout.strip().splitlines()[-1])
            pair.append(res)
            results.append(res)
            print(json.dumps(res))
        if len(pair) == 2:
            a, b = pair
            what = "the union of the rows' columns for every row" if args.mixed else "the head at every position"
            print(f"{rows} rows: peak above baseline {a['above_baseline_mb']} MB with logits only where read, "
                  f"{b['above_baseline_mb']} MB with {what} ({a['per_row_mb']} vs {b['per_row_mb']} MB per row)")
    if args.json:
        from bench_record import provenance, save

        save({**provenance(), "runs": results}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
