"""The cost of one target pass over a token tree against the tree's size (issue 50, item 4).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/tree_pass_cost.py [--models gemma-3-270m,qwen2.5-coder-1.5b-instruct]
        [--sizes 1,2,4,8,16,32,64] [--dtypes bfloat16,float32] [--context 120] [--repeats 7] [--json out.json]

A verification pass of a tree method feeds every node of the tree at once after the round's context:
``n`` new positions, each attending to the context and to its own ancestors only (a boolean 4D mask
``[1, 1, n, context + n]``), at position ids ``context + depth - 1``. This script times exactly such a
pass for trees of ``n`` nodes (a binary tree in breadth-first order: node ``i``'s parent is
``(i - 1) // 2``; the shape does not change the arithmetic, only the mask) over a cached context of
``--context`` ids, and reports each size's cost as a ratio to the one-node pass (a decode step with
the same custom mask), measured in one process with the sizes interleaved, so the ratios hold on a
noisy machine where the milliseconds do not. The KV cache of the context is made once and copied
(outside the timing) before every pass. One thread (``torch.set_num_threads(1)``); the CPU's
bfloat16 support (AMX-BF16 or only AVX-512-BF16) is recorded, since it decides what bf16 costs.
Real models (README, "Real models"; Qwen: the ``real-qwen`` extra).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench_record import save  # noqa: E402
from hsd_torch.models import real as real_models  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def cpu_bf16() -> str:
    """Which bfloat16 instructions the CPU has (Linux /proc/cpuinfo): ``amx_bf16``, ``avx512_bf16`` or none."""
    try:
        flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError:
        return "unknown"
    have = [f for f in ("amx_bf16", "avx512_bf16") if f in flags]
    return ", ".join(have) or "none"


def tree_inputs(n: int, context: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The 4D mask ``[1, 1, n, context + n]`` (True: may attend) and the position ids ``[1, n]`` of a
    binary tree of ``n`` nodes in breadth-first order after ``context`` cached ids."""
    parent = [-1] + [(i - 1) // 2 for i in range(1, n)]
    depth = [0] * n
    mask = torch.zeros(1, 1, n, context + n, dtype=torch.bool)
    mask[..., :context] = True
    for i in range(n):
        depth[i] = 0 if parent[i] < 0 else depth[parent[i]] + 1
        j = i
        while j >= 0:  # the node and its ancestors
            mask[0, 0, i, context + j] = True
            j = parent[j]
    return mask, torch.tensor([[context + d for d in depth]])


def check_mask(model: Any, cache_kw: str, cache: Any, ctx: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor,
               pos: torch.Tensor) -> None:
    """The tree pass computes what it should: the last node's logits equal those of a plain causal pass
    over the context and that node's path (so the mask is honoured, not ignored); AssertionError if not."""
    n, context = ids.shape[1], ctx.shape[1]
    path = [j for j in range(n) if bool(mask[0, 0, n - 1, context + j])]
    with torch.inference_mode():
        tree = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                     cache_position=torch.arange(context, context + n), **{cache_kw: copy.deepcopy(cache)}).logits
        plain = model(input_ids=torch.cat([ctx, ids[:, path]], dim=1)).logits
    a, b = tree[0, -1].float(), plain[0, -1].float()
    err = float((a - b).abs().max() / b.abs().max())
    tol = 2e-2 if tree.dtype == torch.bfloat16 else 1e-4
    assert err < tol, f"tree pass and path pass differ by {err:.2e} (relative), above {tol}: the mask is not honoured"


def time_model(name: str, dtype_name: str, sizes: list[int], context: int, repeats: int) -> dict[str, Any]:
    """Min and median seconds of a tree pass of each size, and their ratios to the one-node pass."""
    model, tok = real_models.load(name, dtype=DTYPES[dtype_name])
    model.eval()
    out = time_loaded(model, DTYPES[dtype_name], sizes, context, repeats)
    del model, tok
    return {"model": name, "dtype": dtype_name, **out}


def time_loaded(model: Any, dtype: torch.dtype, sizes: list[int], context: int, repeats: int) -> dict[str, Any]:
    """:func:`time_model` on a model already loaded (in ``dtype``): ``context``, ``repeats`` and the
    rows of ``sizes`` (the first size is the ratios' base)."""
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    ctx = torch.randint(1000, min(vocab, 20000), (1, context), generator=gen)
    import inspect

    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.inference_mode():
        prefill = model(input_ids=ctx, use_cache=True)
    cache = getattr(prefill, cache_kw, None) or prefill.past_key_values
    inputs = {n: (torch.randint(1000, min(vocab, 20000), (1, n), generator=gen), *tree_inputs(n, context, dtype))
              for n in sizes}
    check_mask(model, cache_kw, cache, ctx, *inputs[sizes[-1]])
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for r in range(repeats + 1):  # the first round warms up and is not kept
        order = sizes if r % 2 == 0 else sizes[::-1]
        for n in order:
            ids, mask, pos = inputs[n]
            kv = copy.deepcopy(cache)
            with torch.inference_mode():
                t0 = time.perf_counter()
                out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_kw: kv},
                            cache_position=torch.arange(context, context + n))
                dt = time.perf_counter() - t0
            assert out.logits.shape[1] == n
            if r:
                times[n].append(dt)
    base = statistics.median(times[sizes[0]])
    rows = [{"nodes": n, "min_ms": min(times[n]) * 1e3, "median_ms": statistics.median(times[n]) * 1e3,
             "ratio_to_one_node": statistics.median(times[n]) / base} for n in sizes]
    del cache
    return {"context": context, "repeats": repeats, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gemma-3-270m,qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--sizes", default="1,2,4,8,16,32,64")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--context", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",")})
    if sizes[0] != 1:
        sizes = [1] + sizes  # every ratio is to the one-node pass
    torch.set_num_threads(1)
    bf16 = cpu_bf16()
    print(f"tree pass cost: context {args.context}, sizes {sizes}, {args.repeats} repeats, 1 thread, torch "
          f"{torch.__version__}, CPU bf16: {bf16}")
    results = []
    for name in args.models.split(","):
        for dt in args.dtypes.split(","):
            res = time_model(name, dt, sizes, args.context, args.repeats)
            results.append(res)
            print(f"{name} {dt}: " + "  ".join(f"{r['nodes']}: {r['ratio_to_one_node']:.2f}x ({r['median_ms']:.1f} ms)"
                                                for r in res["rows"]))
    save({"cpu_bf16": bf16, "results": results}, args.json)


if __name__ == "__main__":
    main()
