"""TLI's drafter step with its head on the shared ids only, against the full head (one process).

    HF_HUB_OFFLINE=1 python bench/tli_head.py [--target gemma-3-270m --drafter smollm2-135m-instruct]
        [--repeats 200] [--context 64] [--temperature 1.0] [--json bench/tli_head.json]

One drafting step of TLI at batch 1, as ``hsd_torch.engine.drafting.draft_tokens`` runs it: the drafter
(``hsd_torch.models.real``, float32) fed one id after a cached context of ``--context`` ids, then its
law on the intersection's columns: with the whole head and ``laws.space_law`` sliced to those
columns (what TLI ran before), and with the head computing the shared ids' logits alone and
``laws.restricted_law`` of them (what it runs now). The two are timed interleaved in one process
(the next id cycles through a text's ids; the cache is cropped back after each step, in both), and
their laws compared (max absolute difference after renormalizing the sliced one). Prints the
medians, their ratio, the intersection's size; ``--json`` writes them with the commit, date and
machine. One thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from bench_record import provenance, save  # noqa: E402

from hsd_torch.models import real as real_models  # noqa: E402
from hsd_torch.engine.laws import TextSpace, restricted_law, space_law  # noqa: E402
from hsd_torch.methods.tli import tli_columns  # noqa: E402
from hsd_torch.engine.runner import Runner, logit_width  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402
from hsd_torch.vocab import VocabBridge  # noqa: E402

TEXT = ("def day_of_week(date):\n    year, month, day = map(int, date.split('-'))\n    return (day + 13 * (month + 1) "
        "// 5 + year % 100 + year % 100 // 4) % 7\n\nThe quick brown fox jumps over the lazy dog. It was a bright "
        "cold day in April, and the clocks were striking thirteen. Shall I compare thee to a summer's day?")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="gemma-3-270m")
    ap.add_argument("--drafter", default="smollm2-135m-instruct")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tt = real_models.load_tokenizer(args.target)
    drafter, dt = real_models.load(args.drafter)
    target_cfg_vocab = len(tt)
    vd = logit_width(drafter)
    dev = torch.device("cpu")
    ttext, dtext = TokenText.get(tt, max(target_cfg_vocab, len(tt))), TokenText.get(dt, vd)
    bridge = VocabBridge(tt, dt, target_vocab_size=ttext.vocab_size, drafter_vocab_size=vd,
                         target_eos_id=ttext.eos_id, drafter_eos_id=dtext.eos_id, device=dev)
    d_space = TextSpace.text(dtext, dev)
    t_space = TextSpace.law(ttext, dev, keep_all=True)
    space, n_draw, *_ = tli_columns(bridge, ttext, dtext, t_space, d_space, dev)
    head = space.cols[:n_draw]
    drop = ~dtext.text_mask
    ids = dt(TEXT)["input_ids"]
    assert len(ids) > args.context + 8, "the text is shorter than the context asked for"
    ctx = ids[:args.context]
    nexts = ids[args.context:]
    runners = {"full": Runner(drafter, 1, dtext.eos_id, "drafter"), "shared": Runner(drafter, 1, dtext.eos_id, "drafter")}
    times: dict[str, list[float]] = {"full": [], "shared": []}
    diff = 0.0
    with torch.inference_mode():
        for r in runners.values():
            r.feed([r.sync(0, ctx)], [args.context - 1], None)
        for i in range(args.repeats):
            x = nexts[i % len(nexts)]
            laws = {}
            for name in (("full", "shared") if i % 2 == 0 else ("shared", "full")):
                r = runners[name]
                t0 = time.perf_counter()
                blk = r.sync(0, ctx + [x])
                if name == "full":
                    law = space_law(r.feed([blk], [0], None), space, drop, args.temperature, None, None)[:, :n_draw]
                else:
                    law = restricted_law(r.feed([blk], [0], None, head), args.temperature)
                times[name].append(time.perf_counter() - t0)
                laws[name] = law
                r.sync(0, ctx)  # crop back: the next step starts from the same cache
            full = laws["full"].double()
            diff = max(diff, float((full / full.sum(-1, keepdim=True) - laws["shared"].double()).abs().max()))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    ratios = [f / s for f, s in zip(times["full"], times["shared"])]
    res = {
        "target": args.target, "drafter": args.drafter, "drafter_ids": vd, "shared_ids": n_draw,
        "context": args.context, "repeats": args.repeats, "temperature": args.temperature,
        "full_ms_median": round(med["full"], 3), "shared_ms_median": round(med["shared"], 3),
        "full_over_shared_median": round(statistics.median(ratios), 3),
        "max_abs_law_difference": diff,
        **provenance(),
        "torch": torch.__version__, "threads": 1,
    }
    print(f"{args.drafter} drafting for {args.target}: {n_draw} of {vd} ids shared; context {args.context}, "
          f"{args.repeats} steps, 1 thread")
    print(f"one drafting step (forward of one id + law), median ms: full head {med['full']:.2f}, "
          f"shared ids only {med['shared']:.2f}; full / shared per step: median {res['full_over_shared_median']:.2f}x; "
          f"laws differ by at most {diff:.2e}")
    save(res, args.json)


if __name__ == "__main__":
    main()
