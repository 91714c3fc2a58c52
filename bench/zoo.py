"""The zoo of real-world SD bugs (hsd_torch.variants) against both audits, on the tiny pair.

For each variant: does it change the output at all (tokens that differ from the correct run over 6
seeds x 4 rows x 32 tokens, same seeds), the verdict of ``audit_generate`` (first two tokens,
``--generate-n`` draws, one ``generate`` call each) and of ``audit_sequences`` at 200 and at 1,000
sequences of 32 tokens (batched 16 per call), with the smallest p-value and the test that gave it.
Writes a JSON file and prints the markdown table recorded in ``docs/auditing.md``.

    python bench/zoo.py --json bench/zoo.json                  # about 10 minutes on one thread
    python bench/zoo.py --sharp --json bench/zoo_sharp.json    # the target sharpened (hsd_torch.tiny.sharpen)
    python bench/zoo.py --table bench/zoo.json bench/zoo_sharp.json bench/zoo_trained.json   # docs/auditing.md's table
    python bench/zoo.py --only cache_cropped_short --generate-n 200 --sizes 200
    python bench/zoo.py --trained --json bench/zoo_trained.json   # bench/pair.py's trained pair (built first)

``--trained``: the target and TLI drafter that ``bench/pair.py`` trains (GPT-2 4 x 256 and 2 x 192 on
two byte-level BPEs, the stdlib's codec tables; the target un-inflated; cached in
``.cache/bench_pair``, built first if missing: about an hour) and two of its held-out prompts. Its
law is peaked and depends on every position (a nearly deterministic domain, learnt position
embeddings), as a real model's does, where the random-init tiny target's barely does.

The exact first-token TV of a variant is not computed: hsd_torch's variants have no exact
enumerator (hsd_core's variants do: ``tests/exact/test_variants.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hsd_torch import generate, tiny
from hsd_torch.tiny import sharpen
from hsd_torch.audit import audit_generate, audit_sequences
from hsd_torch.variants import VARIANTS, Variant, generate_with

PROMPTS = ["def foo(x):\n", "The quick brown"]
L = 32


def doc_table(plain: str, sharp: str, trained: str | None = None) -> str:
    """The table of ``docs/auditing.md`` from the JSON files of a plain, a ``--sharp`` and (optional)
    a ``--trained`` run."""
    def cell(r: dict[str, Any]) -> str:
        why = f"{r['impossible']} draws of p = 0" if r["impossible"] else f"min p {r['min_p']:.1e}, {r['by']}"
        return f"**{r['verdict']}** ({why})" if r["verdict"] == "lossy" else f"{r['verdict']} ({why})"

    runs = [("plain", plain), ("sharpened", sharp)] + ([("trained pair", trained)] if trained else [])
    tables = []
    for label, path in runs:
        with open(path, encoding="utf-8") as f:
            tables.append((label, json.load(f)["rows"]))
    lines = ["| variant (bug class) | target | tokens changed | audit_generate, n = 1,000 | audit_sequences, n = 200 "
             "| audit_sequences, n = 1,000 |", "|---|---|---|---|---|---|"]
    for i, first in enumerate(tables[0][1]):
        for label, rows in tables:
            r = rows[i]
            assert r["variant"] == first["variant"], "the runs list the variants in different orders"
            g = r["generate"]
            gv = f"**{g['verdict']}**" if g["verdict"] == "lossy" else g["verdict"]
            name = (f"`{r['variant']}`" + (" (lossless on purpose)" if r["lossless"] else "") + f": {r['seen_in']}"
                    if label == "plain" else "")
            lines.append(f"| {name} | {label} | {r['tokens_changed']} | {gv} | {cell(r['sequences_200'])} | "
                         f"{cell(r['sequences_1000'])} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--table", nargs="+", metavar="RUN.json",
                    help="print the table of docs/auditing.md from the plain, the --sharp and (optional) the "
                         "--trained recorded runs, and stop")
    ap.add_argument("--only", default=None, help="comma-separated variant names")
    ap.add_argument("--generate-n", type=int, default=1000, help="draws of audit_generate (0: skip it)")
    ap.add_argument("--sizes", default="200,1000", help="numbers of sequences of audit_sequences")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trained", action="store_true", help="bench/pair.py's trained pair (module docstring)")
    ap.add_argument("--sharp", action="store_true",
                    help="sharpen the target (hsd_torch.tiny.sharpen): its law then depends on positions")
    a = ap.parse_args()
    if a.table:
        if len(a.table) not in (2, 3):
            ap.error("--table takes the plain, the --sharp and optionally the --trained run's JSON files")
        print(doc_table(*a.table))
        return
    torch.set_num_threads(1)
    prompts = PROMPTS
    if a.trained:
        import pair as pairmod

        built = pairmod.load_pair(pairmod.ensure_pair(), extra_layers=0)
        target, tt, drafter, dt = (built["target"], built["target_tokenizer"], built["drafter"],
                                   built["drafter_tokenizer"])
        prompts = pairmod.prompts(2)
    else:
        target, tt, drafter, dt = tiny.tiny_pair()
    if a.sharp:
        sharpen(target)
    names = a.only.split(",") if a.only else list(VARIANTS)
    rows: list[dict[str, Any]] = []
    for name in names:
        v = VARIANTS[name]
        kw: dict[str, Any] = {"target_tokenizer": tt, "drafter_tokenizer": dt, "method": v.methods[0], "lookahead": 3}
        top_p = v.needs.get("top_p")
        if top_p is not None:
            kw["top_p"] = top_p
        row: dict[str, Any] = {"variant": name, "bug": v.bug, "seen_in": v.seen_in, "lossless": v.lossless}
        diff = 0
        for s in range(6):
            base = generate(target, drafter, [prompts[0]] * 4, max_new_tokens=L, seed=s, **kw).sequences
            bug = generate_with(v, target, drafter, [prompts[0]] * 4, max_new_tokens=L, seed=s, **kw).sequences
            diff += sum(x != y for r1, r2 in zip(base, bug) for x, y in zip(r1, r2)) + sum(
                abs(len(r1) - len(r2)) for r1, r2 in zip(base, bug))
        row["tokens_changed"] = diff

        def batch(prompts: list[str], seeds: list[int], v: Variant = v) -> list[list[int]]:
            return [list(r) for r in generate_with(v, target, drafter, prompts, max_new_tokens=L, seed=seeds[0],
                                                   **kw).sequences]

        if a.generate_n:
            t0 = time.perf_counter()
            def first(p: str, s: int, v: Variant = v) -> list[int]:  # one token more than audited, as the CLI asks
                return list(generate_with(v, target, drafter, p, max_new_tokens=3, seed=s, **kw).sequences[0])
            g = audit_generate(first, target, tt, prompts[0], n=a.generate_n, max_detectable_tv=None,
                               positions=2, top_p=top_p, seed=a.seed)
            row["generate"] = {"n": a.generate_n, "verdict": g.verdict, "detectable_tv": g.detectable_tv,
                               "seconds": time.perf_counter() - t0}
        for n in (int(x) for x in a.sizes.split(",")):
            t0 = time.perf_counter()
            rep = audit_sequences(None, target, tt, prompts, n=n, max_new_tokens=L, top_p=top_p, drafter=drafter,
                                  drafter_tokenizer=dt, sample_batch_fn=batch, seed=a.seed)
            best = min(rep.tests, key=lambda t: t.p_value) if rep.tests else None
            row[f"sequences_{n}"] = {
                "verdict": rep.verdict, "tokens": rep.tokens, "impossible": len(rep.impossible),
                "min_p": None if best is None else best.p_value, "by": None if best is None else best.name,
                "detectable_tv": rep.detectable_tv, "seconds": time.perf_counter() - t0}
        rows.append(row)
        print(json.dumps(row), flush=True)
    sizes = [int(x) for x in a.sizes.split(",")]
    head = "| variant | models | tokens changed | audit_generate | " + " | ".join(
        f"audit_sequences n={n}" for n in sizes) + " |"
    print("\n" + head + "\n|" + "---|" * (4 + len(sizes)))
    for r in rows:
        g = r.get("generate")
        gen = "-" if g is None else f"{g['verdict']} (n={g['n']})"
        cells = []
        for n in sizes:
            s = r[f"sequences_{n}"]
            why = (f"{s['impossible']} draws of probability 0" if s["impossible"]
                   else f"min p {s['min_p']:.1e}, {s['by']}")
            cells.append(f"{s['verdict']} ({why})")
        print(f"| {r['variant']}{' (lossless)' if r['lossless'] else ''} | {r['seen_in']} | {r['tokens_changed']} "
              f"| {gen} | " + " | ".join(cells) + " |")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"prompts": prompts, "max_new_tokens": L, "seed": a.seed, "sharp": a.sharp,
                       "trained": a.trained, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
