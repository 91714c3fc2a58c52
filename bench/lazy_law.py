"""The target's law processed only where a verification reads it, against all positions at once (one process).

    HF_HUB_OFFLINE=1 python bench/lazy_law.py [--repeats 10] [--top-p 0.9] [--temperature 0.7] [--json F]

Gemma-3-270M's own logits (``hsd_torch.models.real``, float32) at every position of a few
teacher-forced texts, in rounds of lookahead 4 (five positions), as ``generate`` verifies them:
the drafts are the texts' next ids, their proposal law the target's own unprocessed law at
temperature 1 (so a draft passes about as often as a good drafter's), the uniforms fixed.
Timed interleaved in one process, per round: the verification (``kernels._rejection_host``, TLI's
and SD's kernel; ``--exact-match``: ``kernels._exact_match_host``, SLEM's) given the laws of all
five positions processed at once (``laws.space_law``, the code before) and given a
``kernels.LazyLaw`` over the logits (what ``generate`` runs now). Asserts equal decisions on every
round; prints the medians per round, their ratio, and the positions the lazy law processed. One
thread. The yardstick is a target forward of one token with a KV cache (about 92 ms on a
quiet machine, ``bench/overhead.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_record import provenance, save  # noqa: E402
from top_p import TEXTS  # noqa: E402

from hsd_torch.engine import kernels  # noqa: E402
from hsd_torch.models import real as real_models  # noqa: E402
from hsd_torch.engine.laws import TextSpace, space_law  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402



def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--exact-match", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = real_models.load("gemma-3-270m")
    v = model.get_output_embeddings().weight.shape[0]
    text = TokenText.get(tok, v)
    space = TextSpace.law(text, torch.device("cpu"), keep_all=True)
    drop = space.drop_mask()
    proc = {"temperature": args.temperature, "top_k": None, "top_p": args.top_p}
    rounds = []  # (logits [1, 5, V], drafts [[4 columns]], q [1, 4, N])
    with torch.inference_mode():
        for t in TEXTS:
            enc = tok(t, return_tensors="pt")
            logits = model(**enc).logits[0]
            ids = enc["input_ids"][0].tolist()
            for s in range(0, len(ids) - 5, 5):
                block = logits[s:s + 5].unsqueeze(0).contiguous()
                drafts = [[space.pos[i] for i in ids[s + 1:s + 5]]]
                q = space_law(block[:, :4], space, drop, 1.0, None, None)
                rounds.append((block, drafts, q))
    g = np.random.default_rng(0)
    uni = [(g.random((1, 4)).tolist(), g.random(1).tolist(), g.random((1, 5)).tolist()) for _ in rounds]

    def law(x: torch.Tensor) -> torch.Tensor:
        return space_law(x, space, drop, **proc)

    def verify(p: torch.Tensor | kernels.LazyLaw, r: int) -> tuple[list[list[int]], list[int]]:
        block, drafts, q = rounds[r]
        ua, uf, ue = uni[r]
        if args.exact_match:
            rows, n_acc, _ = kernels._exact_match_host(p, drafts, [4], ue, eos_id=space.n - 1, budget=None)
        else:
            rows, n_acc, _ = kernels._rejection_host(p, q, drafts, [4], ua, uf, eos_id=space.n - 1, budget=None)
        return rows, n_acc

    times: dict[str, list[float]] = {"all positions": [], "lazy": []}
    processed: list[int] = []
    with torch.inference_mode():
        for rep in range(args.repeats):
            for name in (("all positions", "lazy") if rep % 2 == 0 else ("lazy", "all positions")):
                t0 = time.perf_counter()
                outs = []
                for r, (block, _, _) in enumerate(rounds):
                    if name == "lazy":
                        lz = kernels.LazyLaw(block, law)
                        outs.append(verify(lz, r))
                        if rep == 0:
                            processed.append(len(lz._at))
                    else:
                        outs.append(verify(law(block), r))
                times[name].append((time.perf_counter() - t0) / len(rounds))
                if name == "lazy":
                    lazy_out = outs
                else:
                    dense_out = outs
            assert lazy_out == dense_out, "the lazy law changed a decision"
    med = {k: statistics.median(x) * 1e3 for k, x in times.items()}
    ratio = statistics.median([a / b for a, b in zip(times["all positions"], times["lazy"])])
    res = {"kernel": "exact_match" if args.exact_match else "rejection", "rounds": len(rounds), "repeats": args.repeats,
           "temperature": args.temperature, "top_p": args.top_p, "vocabulary": v,
           "all_positions_ms_per_round": round(med["all positions"], 3), "lazy_ms_per_round": round(med["lazy"], 3),
           "all_over_lazy_median": round(ratio, 3), "positions_processed_mean": round(float(np.mean(processed)), 3),
           **provenance(), "torch": torch.__version__, "threads": 1}
    print(f"Gemma-3-270M, {len(rounds)} rounds of 5 positions ({v} ids), {res['kernel']} verification, temperature "
          f"{args.temperature}, top-p {args.top_p}, {args.repeats} repeats, 1 thread")
    print(f"ms per round: all positions {med['all positions']:.2f}, lazy {med['lazy']:.2f} (positions processed: "
          f"{res['positions_processed_mean']:.2f} of 5); all / lazy median {ratio:.2f}x; the same decisions")
    save(res, args.json)


if __name__ == "__main__":
    main()
