"""SLEM's verification draws from top-p's kept heads against the dense laws, inside ``generate`` (issue 50, item 5).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/head_draws.py [--repeats 6] [--calls 2] [--json out.json]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/head_draws.py --kernel [--repeats 40] [--json out.json]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/head_draws.py --drafter [--repeats 40] [--json out.json]

Under top-p, where only a draw reads a target law (SLEM's exact-match verification), ``generate`` keeps
the law as its kept head (``hsd_torch.engine.kernels.HeadLaw``: the kept columns in increasing order and
their values) and draws from it alone (``LazyLaw.draw``), the same bits as the dense draw
(tests/torch/engine/test_head_draws.py). This script runs SLEM on the real pair (Gemma-3-270M <-
SmolLM2-135M-Instruct, float32, temperature 0.7, top-p 0.9, lookahead 4, 48 new tokens, one thread)
in two arms, alternating within one process (the order flips every repeat): ``heads`` (as shipped) and
``dense`` (the target's law built by ``laws.space_law``: written out over every column and drawn
by a cumulative sum over all of them, the path before the change). Per arm it reports the time per
call of ``kernels._exact_match_host`` (the verification's laws, processed lazily, and its draws) and
per position drawn, the ratio heads / dense, and checks that both arms generate the same ids for the
same seeds.

``--kernel``: the same two arms on Gemma's logits at the positions of a fixed text (one forward pass),
without ``generate``, alternating position by position (so that both see the same instant of a shared
machine's load): per position, the law processed lazily and one draw (SLEM's work a position), and per
round of five positions TLI's ``_rejection_host`` (batch 1; drafts the text's next ids, q the target's
own untempered law, as ``bench/lazy_law.py``); medians of the per-sample times and of the paired
differences and ratios; asserts the same draws and decisions in both arms.

``--drafter``: the drafter's side (SLEM's drafts, ``hsd_torch.engine.drafting``): SmolLM2-135M-Instruct's
logits (49,152 ids) at the positions of the same text, temperature 0.7, top-p 0.9, two arms
alternating position by position: ``heads`` (``_step_law`` with ``heads=True``, as SLEM drafts: the law
kept as top-p's kept head, the draw's cumulative sum over it) and ``dense`` (``heads=False``, as SD,
TLI and SLRS draft: the law written out over every column of the drafter's text space and drawn by a
cumulative sum over all of them), each followed by the draw (``_pick``); per position the thread's
CPU time (``time.thread_time``) and the wall time, medians of the paired differences and ratios;
asserts the same column and mass in both arms.
"""

from __future__ import annotations

import argparse
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
from hsd_torch import generate  # noqa: E402
from hsd_torch.engine import kernels, laws, verification  # noqa: E402


TEXT = ("def day_of_week(date):\n    year, month, day = map(int, date.split('-'))\n    import datetime\n"
        "    return datetime.date(year, month, day).strftime('%A')\n\nprint(day_of_week('2024-02-29'))\n")


def kernel_ab(repeats: int) -> dict[str, Any]:
    """The ``--kernel`` mode (module docstring): per-sample times of both arms, paired."""
    import numpy as np

    from hsd_torch.engine.laws import TextSpace
    from hsd_torch.models import real as real_models
    from hsd_torch.vocab.text import TokenText

    model, tok = real_models.load("gemma-3-270m")
    v = model.get_output_embeddings().weight.shape[0]
    space = TextSpace.law(TokenText.get(tok, v), torch.device("cpu"), keep_all=True)
    drop = space.drop_mask()
    with torch.inference_mode():
        enc = tok(TEXT, return_tensors="pt")
        logits = model(**enc).logits.float()  # [1, L, V]
    ids = enc["input_ids"][0].tolist()
    arms = {"heads": lambda x: laws.space_head_law(x, space, drop, 0.7, None, 0.9),
            "dense": lambda x: laws.space_law(x, space, drop, 0.7, None, 0.9)}
    g = np.random.default_rng(0)
    pos: dict[str, list[float]] = {"heads": [], "dense": []}
    rnd: dict[str, list[float]] = {"heads": [], "dense": []}
    starts = list(range(0, len(ids) - 5, 5))
    qs = [laws.space_law(logits[:, s:s + 4], space, drop, 1.0, None, None) for s in starts]
    with torch.inference_mode():
        for r in range(repeats):
            order = ("heads", "dense") if r % 2 == 0 else ("dense", "heads")
            for j in range(logits.shape[1]):
                u = [float(g.random())]
                got = {}
                for arm in order:
                    t0 = time.perf_counter()
                    got[arm] = kernels.LazyLaw(logits[:, j:j + 1], arms[arm], sparse=True).draw([(0, 0)], u)
                    pos[arm].append(time.perf_counter() - t0)
                assert got["heads"] == got["dense"], (j, u)
            for s, q in zip(starts, qs):
                drafts = [[space.pos[i] for i in ids[s + 1:s + 5]]]
                ua, uf = [g.random(4).tolist()], [float(g.random())]
                dec = {}
                for arm in order:
                    t0 = time.perf_counter()
                    lz = kernels.LazyLaw(logits[:, s:s + 5], arms[arm], sparse=True)
                    dec[arm] = kernels._rejection_host(lz, q, drafts, [4], ua, uf, eos_id=space.n - 1, budget=None)
                    rnd[arm].append(time.perf_counter() - t0)
                assert dec["heads"] == dec["dense"], s
    out: dict[str, Any] = {"positions": logits.shape[1], "rounds": len(starts), "repeats": repeats}
    for name, t in (("slem_position", pos), ("tli_round", rnd)):
        diff = [d - h for h, d in zip(t["heads"], t["dense"])]
        ratio = [h / d for h, d in zip(t["heads"], t["dense"])]
        out[name] = {"median_ms": {a: statistics.median(x) * 1e3 for a, x in t.items()},
                     "median_saved_ms": statistics.median(diff) * 1e3, "median_ratio": statistics.median(ratio),
                     "samples": len(diff)}
        m = out[name]
        print(f"{name}: heads {m['median_ms']['heads']:.3f} ms, dense {m['median_ms']['dense']:.3f} ms (medians of "
              f"{len(diff)}); paired: saved {m['median_saved_ms']:.3f} ms, heads / dense {m['median_ratio']:.3f}")
    return out


def drafter_ab(repeats: int) -> dict[str, Any]:
    """The ``--drafter`` mode (module docstring): per-position CPU and wall times of both arms, paired."""
    from types import SimpleNamespace

    import numpy as np

    from hsd_torch.engine import drafting
    from hsd_torch.engine.laws import Processing, TextSpace
    from hsd_torch.engine.round_state import DraftColumns
    from hsd_torch.models import real as real_models
    from hsd_torch.vocab.text import TokenText

    model, tok = real_models.load("smollm2-135m-instruct")
    text = TokenText.get(tok, model.get_output_embeddings().weight.shape[0])
    space = TextSpace.text(text, torch.device("cpu"))
    gen = SimpleNamespace(d_process=Processing(0.7, None, 0.9), d_drop=~text.text_mask)
    cols = DraftColumns(space, space.n, None, stop_on_empty=True, laws_read=False)
    with torch.inference_mode():
        logits = model(**tok(TEXT, return_tensors="pt")).logits.float()[0]  # [L, V]
    g = np.random.default_rng(0)
    cpu: dict[str, list[float]] = {"heads": [], "dense": []}
    wall: dict[str, list[float]] = {"heads": [], "dense": []}
    kept: list[int] = []
    with torch.inference_mode():
        for r in range(repeats):
            order = (True, False) if r % 2 == 0 else (False, True)
            for j in range(logits.shape[0]):
                row = logits[j:j + 1]
                u = torch.tensor([[float(g.random())]], dtype=torch.float32)
                got = {}
                for heads in order:
                    arm = "heads" if heads else "dense"
                    c0, t0 = time.thread_time(), time.perf_counter()
                    law, _ = drafting._step_law(gen, row, cols, [0], heads)  # type: ignore[arg-type]
                    got[arm] = drafting._pick(law, [0], u)
                    wall[arm].append(time.perf_counter() - t0)
                    cpu[arm].append(time.thread_time() - c0)
                    if heads and r == 0:
                        kept.append(int((law.vals > 0).sum()) if isinstance(law, kernels.HeadLaw) else -1)
                assert got["heads"] == got["dense"], (j, u)
    out: dict[str, Any] = {"positions": logits.shape[0], "repeats": repeats, "width": space.n,
                           "kept_head_sizes": kept}
    for name, t in (("cpu", cpu), ("wall", wall)):
        diff = [d - h for h, d in zip(t["heads"], t["dense"])]
        ratio = [h / d for h, d in zip(t["heads"], t["dense"]) if d > 0]
        out[name] = {"median_ms": {a: statistics.median(x) * 1e3 for a, x in t.items()},
                     "median_saved_ms": statistics.median(diff) * 1e3, "median_ratio": statistics.median(ratio),
                     "samples": len(diff)}
        m = out[name]
        print(f"drafter position, {name} time: heads {m['median_ms']['heads']:.3f} ms, dense "
              f"{m['median_ms']['dense']:.3f} ms (medians of {len(diff)}); paired: saved {m['median_saved_ms']:.3f} "
              f"ms, heads / dense {m['median_ratio']:.3f}")
    heads_used = [h for h in kept if h >= 0]
    print(f"{len(heads_used)} of {len(kept)} positions drawn on a head (kept sizes: median "
          f"{statistics.median(heads_used) if heads_used else 'n/a'}, max {max(heads_used, default=0)})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=6, help="rounds of both arms (the order flips each repeat)")
    ap.add_argument("--calls", type=int, default=2, help="generate calls (seeds) per arm and repeat")
    ap.add_argument("--json", default=None)
    ap.add_argument("--kernel", action="store_true", help="the two arms on Gemma's logits, without generate")
    ap.add_argument("--drafter", action="store_true", help="the drafter's draws (SmolLM2's logits), without generate")
    args = ap.parse_args()
    import overhead

    torch.set_num_threads(1)
    if args.kernel or args.drafter:
        load = os.getloadavg()[0]
        rec = drafter_ab(args.repeats) if args.drafter else kernel_ab(args.repeats)
        rec["load_average"] = [load, os.getloadavg()[0]]
        print(f"load average {min(rec['load_average']):.2f} to {max(rec['load_average']):.2f}")
        save(rec, args.json)
        return
    tt, dt, target, drafter, _ = overhead.setup_real(torch.float32, "real")
    heads_law = verification.space_head_law
    host = kernels._exact_match_host
    draw = kernels.LazyLaw.draw
    spent = {"s": 0.0, "calls": 0, "positions": 0}

    def timed_host(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return host(*a, **kw)
        finally:
            spent["s"] += time.perf_counter() - t0
            spent["calls"] += 1

    def counted_draw(self: kernels.LazyLaw, pairs: Any, u: list[float]) -> Any:
        spent["positions"] += len(pairs)
        return draw(self, pairs, u)

    kernels._exact_match_host = timed_host  # type: ignore[assignment]
    kernels.LazyLaw.draw = counted_draw  # type: ignore[method-assign]
    kw = dict(target_tokenizer=tt, drafter_tokenizer=dt, method="slem", lookahead=4, max_new_tokens=48,
              temperature=0.7, top_p=0.9)
    generate(target, drafter, overhead.REAL_PROMPT, seed=0, **kw)  # warm-up
    per_call: dict[str, list[float]] = {"heads": [], "dense": []}
    per_pos: dict[str, list[float]] = {"heads": [], "dense": []}
    outputs: dict[tuple[str, int], list[list[int]]] = {}
    load = [os.getloadavg()[0]]
    try:
        for r in range(args.repeats):
            for arm in (("heads", "dense") if r % 2 == 0 else ("dense", "heads")):
                verification.space_head_law = heads_law if arm == "heads" else laws.space_law  # type: ignore[assignment]
                spent.update(s=0.0, calls=0, positions=0)
                for s in range(args.calls):
                    got = generate(target, drafter, overhead.REAL_PROMPT, seed=s + 1, **kw).sequences
                    if outputs.setdefault((arm, s), got) != got:
                        raise SystemExit(f"arm {arm}, seed {s + 1}: another output than its first run")
                per_call[arm].append(spent["s"] / spent["calls"] * 1e3)
                per_pos[arm].append(spent["s"] / spent["positions"] * 1e3)
            load.append(os.getloadavg()[0])
    finally:
        verification.space_head_law = heads_law  # type: ignore[assignment]
        kernels._exact_match_host = host  # type: ignore[assignment]
        kernels.LazyLaw.draw = draw  # type: ignore[method-assign]
    same = all(outputs["heads", s] == outputs["dense", s] for s in range(args.calls))
    med_call = {a: statistics.median(v) for a, v in per_call.items()}
    med_pos = {a: statistics.median(v) for a, v in per_pos.items()}
    ratios = [h / d for h, d in zip(per_pos["heads"], per_pos["dense"])]
    print(f"_exact_match_host ms per call (median of {args.repeats} repeats): heads {med_call['heads']:.3f}, "
          f"dense {med_call['dense']:.3f}; per position drawn: heads {med_pos['heads']:.3f}, dense "
          f"{med_pos['dense']:.3f}, saved {med_pos['dense'] - med_pos['heads']:.3f} ms; heads / dense per position: "
          f"median {statistics.median(ratios):.3f} (repeats {min(ratios):.3f} to {max(ratios):.3f}); "
          f"load average {min(load):.2f} to {max(load):.2f}; same ids: {same}")
    if not same:
        raise SystemExit("the two arms generated different ids: the head draws are not the dense draws' bits")
    save({"per_call_ms": per_call, "per_position_ms": per_pos, "median_per_call_ms": med_call,
          "median_per_position_ms": med_pos, "ratio_heads_over_dense_per_position": ratios, "load_average": load,
          "same_ids": same, "repeats": args.repeats, "calls": args.calls}, args.json)


if __name__ == "__main__":
    main()
