"""The zoo of real-world SD bugs (hsd_torch.auditing.variants) against both audits, on the tiny pair.

For each variant: does it change the output at all (tokens that differ from the correct run over 6
seeds x 4 rows x 32 tokens, same seeds), the verdict of ``audit_generate`` (first two tokens,
``--generate-n`` draws, one ``generate`` call each) and of ``audit_sequences`` at 200 and at 1,000
sequences of 32 tokens (batched 16 per call), with the smallest p-value and the test that gave it.
Writes a JSON file and prints the markdown table recorded in ``docs/auditing.md``.

    python bench/zoo.py --json bench/zoo.json                  # about 10 minutes on one thread
    python bench/zoo.py --sharp --json bench/zoo_sharp.json    # the target sharpened (hsd_torch.models.tiny.sharpen)
    python bench/zoo.py --table bench/zoo.json bench/zoo_sharp.json bench/zoo_trained.json   # docs/auditing.md's table
    python bench/zoo.py --only cache_cropped_short --generate-n 200 --sizes 200
    python bench/zoo.py --trained --json bench/zoo_trained.json   # bench/pair.py's trained pair (built first)

``--trained``: the target and TLI drafter that ``bench/pair.py`` trains (GPT-2 4 x 256 and 2 x 192 on
two byte-level BPEs, the stdlib's codec tables; the target un-inflated; cached in
``.cache/bench_pair``, built first if missing: about an hour) and two of its held-out prompts. Its
law is peaked and depends on every position (a nearly deterministic domain, learnt position
embeddings), as a real model's does, where the random-init tiny target's barely does.

``--first-token-tv RUN.json``: adds to a recorded run's rows the exact first-token TV of each
variant (``first_token_tv``), computed, not sampled, from the laws the rejection kernel is given at
the first round (:func:`first_round_laws`: the target's law at the first position, from the
variant's own run, and the law the first draft is drawn from, from the correct run), through the
variant's first-round rule (:data:`FIRST_ROUND_RULES`: how it tests a draft and what it draws after
a rejection), and checked against the variant's own first tokens (a chi-square of ``--check-n``
first tokens against that law, recorded as ``first_token_check_p``): the rule is an analysis of
the variant, so the check ties it to the code. The variants that act only after a rejection, or on
the drafter's context, leave the first token's law exact (TV 0 up to rounding, computed the same way).

``--context-tv``: for ``prompt_token_twice`` (the one variant whose wrong context is known exactly:
the prompt with its last id twice, for the whole run), how far its law is from the target's at
every position it samples: ``--sizes``' first number of its sequences (half per prompt), each
teacher-forced through the target with the right and with the doubled context, the TV between the
two laws per token (mean, median, 90 % quantile, max), beside ``audit_sequences``' verdict, p-values
and promise (each family's detectable departure as mean per-token TV) on the same sequences, with
the test aimed at that bug (the default) and without it (``context_bugs=None``).

    python bench/zoo.py --trained --context-tv --sizes 200 --json bench/zoo_context_tv.json
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

from bench_record import provenance, save  # noqa: E402

from hsd_torch import generate
from hsd_torch.engine import kernels
from hsd_torch.models import tiny
from hsd_torch.models.tiny import sharpen
from hsd_torch.auditing.first_tokens import audit_generate, audit_sequences
from hsd_torch.auditing.variants import VARIANTS, Variant, generate_with, patch_seam

PROMPTS = ["def foo(x):\n", "The quick brown"]
L = 32


def first_round_laws(variant: Variant | None, target: Any, drafter: Any, prompt: str, kw: dict[str, Any],
                     rows: int = 1, seeds: range = range(1)) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """What ``kernels._rejection_host`` is given at the first round of ``generate`` (``variant``
    applied, None: the correct code) on ``rows`` copies of ``prompt``, ``max_new_tokens=1``: the
    target's law ``p`` and the law the first draft was drawn from ``q`` at row 0's first position,
    as float64 vectors over the target's text-space columns (``q`` divided by its ``q_scale``), and
    the first column each row emitted, over ``seeds`` (one ``generate`` call each). The recorder is
    installed beneath the variant's patch, so a variant that rewrites the kernel's inputs is
    recorded with them rewritten: ``q`` is recorded from the correct code only."""
    rec: dict[str, Any] = {}
    firsts: list[int] = []
    def make(orig: Any) -> Any:
        def recorder(p: Any, q: Any, drafts: Any, n_drafts: Any, u_accept: Any, u_final: Any, **kw2: Any) -> Any:
            out = orig(p, q, drafts, n_drafts, u_accept, u_final, **kw2)
            if "first" not in rec:
                rec["first"] = True
                rec.setdefault("p", p[0, 0].double().clone())
                if q is not None and q.shape[1] and n_drafts[0]:
                    qs = kw2.get("q_scale")
                    rec.setdefault("q", q[0, 0].double() / (qs[0][0] if qs is not None else 1.0))
                firsts.extend(r[0] for r in out[0])
            return out
        return recorder

    with patch_seam(kernels, "_rejection_host", make):  # a declared seam (kernels.ZOO_SEAMS)
        for s in seeds:
            rec.pop("first", None)
            if variant is None:
                generate(target, drafter, [prompt] * rows, max_new_tokens=1, seed=s, **kw)
            else:
                generate_with(variant, target, drafter, [prompt] * rows, max_new_tokens=1, seed=s, **kw)
    return rec["p"], rec.get("q", torch.zeros_like(rec["p"])), firsts


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(p - q, 0))``, ``p`` itself where that has no mass (the kernel's rule)."""
    d = (p - q).clamp(min=0)
    return d / d.sum() if d.sum() > 0 else p


def _accept(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The probability that the ratio test keeps each draft: ``min(1, p / q)`` (``q = 0``: 1 where
    ``p > 0``, else 0), as ``kernels._ratio_test`` decides for a uniform ``u``."""
    return torch.where(q > 0, torch.clamp(p / torch.where(q > 0, q, 1.0), max=1.0), (p > 0).double())


def _emitted(q: torch.Tensor, a: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The first token's law when the draft ``x ~ q`` is kept with probability ``a(x)`` and the
    token is otherwise drawn from ``r``: ``sum_x q(x) (a(x) e_x + (1 - a(x)) r)``."""
    return q * a + (q * (1 - a)).sum() * r


def _standard(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The first token's law when the draft ``x ~ q`` is tested and corrected against ``p`` as
    ``hsd_torch.engine.kernels`` does (the residual ``r`` after a rejection)."""
    return _emitted(q, _accept(p, q), _residual(p, q))


def _q_permuted(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    qr = q.roll(1, dims=-1)  # the kernel tests and corrects against q read one column off
    return _emitted(q, _accept(p, qr), _residual(p, qr))


def _first_draft_accepted(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    # u = 0 < min(1, p / q) wherever p > 0
    return _emitted(q, (p > 0).double(), _residual(p, q))


def _residual_minus_qx(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    a = _accept(p, q)
    law = q * a
    for x in torch.nonzero(q * (1 - a) > 0).flatten().tolist():  # after rejecting x: norm((p - q(x) e_x)+)
        qx = torch.zeros_like(q)
        qx[x] = q[x]
        law = law + q[x] * (1 - a[x]) * _residual(p, qx)
    return law


FIRST_ROUND_RULES = {"q_columns_permuted": _q_permuted, "first_draft_accepted": _first_draft_accepted,
                     "residual_minus_qx": _residual_minus_qx}
"""The variants whose first round tests or corrects a draft otherwise than the kernel: their
first-token law from ``(p, q)``; every other variant's is :func:`_standard` with its own ``p``
(a wrong context or processing changes ``p`` itself, which the recorder reads)."""


def first_token_tv(variant: Variant, target: Any, drafter: Any, prompt: str, kw: dict[str, Any],
                   check_n: int = 2000) -> dict[str, Any]:
    """The exact (float64, from float32 laws) first-token TV of ``variant`` from the correct code's
    first-token law (the same rule's arithmetic on the correct run's laws; its own distance from the
    target's law, ``formula_vs_target_law``, is rounding: ~1e-7), and the
    chi-square p-value of ``check_n`` of its sampled first tokens against the law it is computed to
    have (:func:`law_check`)."""
    p0, q0, _ = first_round_laws(None, target, drafter, prompt, kw, rows=16)  # batched as the variant's runs
    pv, _, firsts = first_round_laws(variant, target, drafter, prompt, kw, rows=16, seeds=range(100, 100 + check_n // 16))
    correct = _standard(p0, q0)
    law = FIRST_ROUND_RULES.get(variant.name, _standard)(pv, q0)
    chi_p, impossible = law_check(law, firsts)
    # TV against the correct code's law through the same arithmetic (which is the target's law to ~1e-7)
    return {"first_token_tv": 0.5 * float((law - correct).abs().sum()),
            "formula_vs_target_law": 0.5 * float((correct - p0).abs().sum()),
            "first_token_check_n": len(firsts), "first_token_check_p": chi_p,
            "first_token_check_impossible": impossible}


def law_check(law: torch.Tensor, draws: list[int]) -> tuple[float | None, int]:
    """Pearson's chi-square p-value of ``draws`` (columns) against ``law``
    (:func:`hsd_core.stats.chi_square_gof`: cells of expectation below 5 pooled, whatever mass they
    carry; 0 with a draw of probability 0; None where fewer than two cells remain) and the number
    of draws where ``law`` is 0."""
    from hsd_core.stats import InvalidTest, chi_square_gof

    lw = (law / law.sum()).tolist()  # the float32 laws sum to 1 within ~1e-7
    cells = {i: x for i, x in enumerate(lw) if x > 0}
    impossible = sum(1 for d in draws if d not in cells)
    try:
        return chi_square_gof(cells, draws, alpha=1e-3, min_kept_mass=0.0).p_value, impossible
    except InvalidTest:  # a nearly certain first token: one cell, nothing to test
        return None, impossible


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
    lines = ["| variant (bug class) | target | tokens changed | exact first-token TV | audit_generate, n = 1,000 "
             "| audit_sequences, n = 200 | audit_sequences, n = 1,000 |", "|---|---|---|---|---|---|---|"]
    for i, first in enumerate(tables[0][1]):
        for label, rows in tables:
            r = rows[i]
            assert r["variant"] == first["variant"], "the runs list the variants in different orders"
            g = r["generate"]
            gv = f"**{g['verdict']}**" if g["verdict"] == "lossy" else g["verdict"]
            name = (f"`{r['variant']}`" + (" (lossless on purpose)" if r["lossless"] else "") + f": {r['seen_in']}"
                    if label == "plain" else "")
            tv = "-" if r.get("first_token_tv") is None else f"{r['first_token_tv']:.2g}"
            lines.append(f"| {name} | {label} | {r['tokens_changed']} | {tv} | {gv} | {cell(r['sequences_200'])} | "
                         f"{cell(r['sequences_1000'])} |")
    return "\n".join(lines)


def models(trained: bool, sharp: bool) -> tuple[Any, Any, Any, Any, list[str]]:
    """``(target, target_tokenizer, drafter, drafter_tokenizer, prompts)`` of a run: the tiny pair
    (``sharp``: its target sharpened) or ``bench/pair.py``'s trained pair with two held-out prompts."""
    prompts = PROMPTS
    if trained:
        import pair as pairmod

        built = pairmod.load_pair(pairmod.ensure_pair(), extra_layers=0)
        target, tt, drafter, dt = (built["target"], built["target_tokenizer"], built["drafter"],
                                   built["drafter_tokenizer"])
        prompts = pairmod.prompts(2)
    else:
        target, tt, drafter, dt = tiny.tiny_pair()
    if sharp:
        sharpen(target)
    return target, tt, drafter, dt, list(prompts)


def variant_kw(v: Variant, tt: Any, dt: Any) -> dict[str, Any]:
    """``generate``'s keyword arguments for a variant's runs: its first method, lookahead 3, the
    processing it needs."""
    kw: dict[str, Any] = {"target_tokenizer": tt, "drafter_tokenizer": dt, "method": v.methods[0], "lookahead": 3}
    if v.needs.get("top_p") is not None:
        kw["top_p"] = v.needs["top_p"]
    return kw


def context_tv(target: Any, tt: Any, drafter: Any, dt: Any, prompts: list[str], n: int, seed: int) -> dict[str, Any]:
    """``--context-tv`` (module docstring): the per-token TV between the target's law after the right
    context and after the prompt's last id doubled, along ``n`` sequences of ``prompt_token_twice``."""
    from hsd_torch.engine.runner import logit_width
    from hsd_torch.vocab.text import TokenText

    v = VARIANTS["prompt_token_twice"]
    kw = variant_kw(v, tt, dt)
    text = TokenText.get(tt, logit_width(target))
    seqs: list[tuple[str, list[int]]] = []  # (prompt, new ids), batches of 20 alternating between the prompts
    for i in range(0, n, 20):
        prompt = prompts[(i // 20) % len(prompts)]
        out = generate_with(v, target, drafter, [prompt] * min(20, n - i), max_new_tokens=L, seed=seed + i, **kw)
        seqs += [(prompt, list(r)) for r in out.sequences]
    tvs: list[float] = []
    with torch.inference_mode():
        for prompt, seq in seqs:
            ids = text.prompt_ids(prompt)
            right = target(torch.tensor([ids + seq])).logits[0, len(ids) - 1:len(ids) - 1 + len(seq)].double()
            twice = target(torch.tensor([ids + ids[-1:] + seq])).logits[0, len(ids):len(ids) + len(seq)].double()
            tvs += (0.5 * (right.softmax(-1) - twice.softmax(-1)).abs().sum(-1)).tolist()
    audits: dict[str, Any] = {}
    for label, bugs in (("audit", ("prompt_last_twice",)), ("audit_without_aimed_test", None)):
        it = iter(seqs)

        def recorded(prompt: str, _seed: int) -> list[int]:  # the audit asks for the sequences in order
            p, seq = next(it)
            assert p == prompt, "the audit's prompts are the recorded ones, in order"
            return seq

        rep = audit_sequences(recorded, target, tt, [p for p, _ in seqs], n=n, max_new_tokens=L, drafter=drafter,
                              drafter_tokenizer=dt, seed=seed, max_detectable_tv=None, context_bugs=bugs)
        audits[label] = {"verdict": rep.verdict, "p_values": {r.name: r.p_value for r in rep.tests},
                         "promise_mean_tv": {f.family: f.mean_tv for f in rep.families},
                         "caught_with_probability": {f.family: f.caught for f in rep.families}}
    t = torch.tensor(tvs, dtype=torch.float64)
    return {"variant": v.name, "sequences": n, "tokens": len(tvs), "mean_tv": float(t.mean()),
            "median_tv": float(t.median()), "q90_tv": float(t.quantile(0.9)), "max_tv": float(t.max()), **audits}


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
    ap.add_argument("--first-token-tv", default=None, metavar="RUN.json",
                    help="add the exact first-token TV of each variant to a recorded run (module docstring), and stop")
    ap.add_argument("--check-n", type=int, default=2000, help="sampled first tokens that check each first-token law")
    ap.add_argument("--context-tv", action="store_true",
                    help="prompt_token_twice's per-token TV against the audit's promise (module docstring), and stop")
    ap.add_argument("--sharp", action="store_true",
                    help="sharpen the target (hsd_torch.models.tiny.sharpen): its law then depends on positions")
    a = ap.parse_args()
    if a.table:
        if len(a.table) not in (2, 3):
            ap.error("--table takes the plain, the --sharp and optionally the --trained run's JSON files")
        print(doc_table(*a.table))
        return
    torch.set_num_threads(1)
    if a.first_token_tv:
        with open(a.first_token_tv, encoding="utf-8") as f:
            run = json.load(f)
        target, tt, drafter, dt, prompts = models(run.get("trained", False), run["sharp"])  # older runs: no "trained"
        assert prompts == run["prompts"], "the recorded run's prompts are not these models' prompts"
        for row in run["rows"]:
            v = VARIANTS[row["variant"]]
            t0 = time.perf_counter()
            row.update(first_token_tv(v, target, drafter, prompts[0], variant_kw(v, tt, dt), check_n=a.check_n))
            print(row["variant"], {k: row[k] for k in row if k.startswith(("first_token", "formula"))},
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
        run["first_token_tv_record"] = provenance()  # the run's own commit, date and machine stay as they were
        save(run, a.first_token_tv)
        return
    target, tt, drafter, dt, prompts = models(a.trained, a.sharp)
    if a.context_tv:
        res = {"trained": a.trained, "sharp": a.sharp, "prompts": prompts,
               **context_tv(target, tt, drafter, dt, prompts, int(a.sizes.split(",")[0]), a.seed)}
        print(json.dumps(res, indent=1))
        save(res, a.json)
        return
    names = a.only.split(",") if a.only else list(VARIANTS)
    rows: list[dict[str, Any]] = []
    for name in names:
        v = VARIANTS[name]
        kw = variant_kw(v, tt, dt)
        top_p = v.needs.get("top_p")
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
    save({"prompts": prompts, "max_new_tokens": L, "seed": a.seed, "sharp": a.sharp, "trained": a.trained,
          "rows": rows}, a.json)


if __name__ == "__main__":
    main()
