"""How much do position ids move a target's law? The measure behind the zoo's one miss at any size.

``positions_not_reset`` (``hsd_torch.auditing.variants``) gives the target's new tokens position ids that run
ahead of their place by the number of drafts rejected so far. On a target whose law barely depends
on positions, no audit can see it: this script measures by how much. For ``--n`` sequences of the
variant (TLI, lookahead 3, the zoo's two prompts, 32 new tokens), each new token's law is read by
teacher forcing with the right position ids and with the new tokens' ids shifted by ``k`` (1, 4, 16:
a few rejections to many), and reports per ``k`` the mean, median and max per-token TV, and the
probability that the most powerful directional test aimed at exactly that law (the sequence
audit's aimed-test statistic, ``hsd_core.context_bugs``, given the shifted laws: no black-box
audit knows more) would catch a sampler drawing from it, at the zoo's per-test level 1e-3 / 11 and
at the same number of tokens.

    python bench/position_tv.py --json bench/position_tv.json             # the plain tiny target
    python bench/position_tv.py --sharp --json bench/position_tv_sharp.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_record import save  # noqa: E402
from zoo import L, models, variant_kw  # noqa: E402

from hsd_core.context_bugs import AimedStats  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402
from hsd_torch.engine.runner import logit_width  # noqa: E402
from hsd_torch.auditing.variants import VARIANTS, generate_with  # noqa: E402

SHIFTS = (1, 4, 16)
LEVEL = 1e-3 / 11


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--sharp", action="store_true")
    ap.add_argument("--trained", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    target, tt, drafter, dt, prompts = models(a.trained, a.sharp)
    v = VARIANTS["positions_not_reset"]
    kw = variant_kw(v, tt, dt)
    text = TokenText.get(tt, logit_width(target))
    seqs: list[tuple[list[int], list[int]]] = []
    for i in range(0, a.n, 16):
        prompt = prompts[(i // 16) % len(prompts)]
        out = generate_with(v, target, drafter, [prompt] * min(16, a.n - i), max_new_tokens=L, seed=a.seed + i, **kw)
        seqs += [(text.prompt_ids(prompt), list(r)) for r in out.sequences]
    tvs: dict[int, list[float]] = {k: [] for k in SHIFTS}
    stats = {k: AimedStats([f"positions + {k}"]) for k in SHIFTS}
    with torch.inference_mode():
        for ids, seq in seqs:
            x = torch.tensor([ids + seq])
            n0, span = len(ids), slice(len(ids) - 1, len(ids) - 1 + len(seq))
            right = target(x).logits[0, span].double().softmax(-1).numpy()
            for k in SHIFTS:
                pos = torch.arange(x.shape[1]) + torch.where(torch.arange(x.shape[1]) >= n0, k, 0)
                moved = target(x, position_ids=pos[None]).logits[0, span].double().softmax(-1).numpy()
                tvs[k] += (0.5 * np.abs(moved - right).sum(1)).tolist()
                stats[k].add(right, np.array(seq), [moved])
    rows: list[dict[str, Any]] = []
    for k in SHIFTS:
        t = np.array(tvs[k])
        caught, by = stats[k].caught(0, LEVEL)
        rows.append({"shift": k, "tokens": int(t.size), "mean_tv": float(t.mean()), "median_tv": float(np.median(t)),
                     "max_tv": float(t.max()), "aimed_test_caught": caught, "by": by})
        print(json.dumps(rows[-1]), flush=True)
    save({"sharp": a.sharp, "trained": a.trained, "sequences": a.n, "level": LEVEL, "rows": rows}, a.json)


if __name__ == "__main__":
    main()
