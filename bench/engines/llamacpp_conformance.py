"""llama.cpp's ``llama-server`` on the conformance kit against exact laws (issue 47, llama.cpp's part).

    python bench/engines/llamacpp_conformance.py [--n 2000] [--modes none,draft-simple,...] [--json OUT]

Needs the binary (``bench/engines/setup_llamacpp.sh``). Writes the kit into a temporary folder, then:

1. **Raw law**: for each kit prompt, llama-server's post-sampling probabilities of every id
   (``n_probs`` = the vocabulary, ``post_sampling_probs``, temperature 1, every other stage neutral) at
   each generated position, against :func:`hsd_core.conformance.next_law` after the same prefix: the
   largest absolute difference (float32 engine against a float64 reference).
2. **Batch invariance**: the same context's raw log-probabilities (``n_probs``) scored one position at a
   time (a greedy draw, one decode per id) and as one batch (the context sent as a prompt), largest
   difference: speculative verification scores its drafts as one batch. (The speculative path itself
   reports no per-token probabilities: ``tools/server/server-context.cpp``, "TODO: set result.probs".)
3. **Exact-law tests** per mode and processing case (:data:`CASES`): ``--n`` draws, one seed each, against
   :func:`hsd_core.conformance.sequence_law` in llama.cpp's order: whole draws (with their finish reasons),
   the first token, the length (where EOS comes) and each position alone, chi-square with low-count cells
   pooled (:func:`hsd_core.stats.gof_test`), Holm over the case's tests at family-wise alpha ``--alpha``;
   each test's detectable TV (power 0.99) is recorded. Greedy cases: every draw must be the one sequence.
   Draft modes also record the measured acceptance (the server's ``draft_n_accepted / draft_n``).

The JSON (``--json``, through ``bench/bench_record.py``) holds every number the docs quote.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from hsd_core import conformance as kc  # noqa: E402
from hsd_core.endpoint import request_settings  # noqa: E402
from hsd_core.samples import Sampling  # noqa: E402
from hsd_core.stats import InvalidTest, gof_test, holm, min_tv_detectable  # noqa: E402

M = kc.kit_model("target")
ID = M.id_of_text
B = kc.BOS


def _s(**kw: Any) -> Sampling:
    base: dict[str, Any] = dict(do_sample=True, temperature=1.0, top_k=None, top_p=None, max_new_tokens=3,
                                order="llama.cpp")
    base.update(kw)
    return Sampling(**base)


NGRAM_SETTINGS: dict[str, dict[str, Any]] = {
    "ngram-mod": {"args": ["--spec-ngram-mod-n-match", "2", "--spec-ngram-mod-n-min", "1",
                           "--spec-ngram-mod-n-max", "4"]},
    "ngram-simple": {"args": ["--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m", "4"]},
}
"""Settings under which the n-gram modes draft on the kit's short contexts (their defaults look up 24
and 12 ids, and ngram-mod drafts at least 48: nothing on a ten-id context)."""

REPEAT = [B] + [ID[t] for t in (" the", " cat", " sat", "\n") * 2] + [ID[" the"]]
"""A prompt that repeats itself, so that the n-gram modes find drafts in it."""

CASES: dict[str, tuple[list[int], Sampling]] = {
    "plain": ([B], _s()),
    "temperature 0.6": ([B, ID[" the"]], _s(temperature=0.6)),
    "top-k 2": ([B, ID[" the"]], _s(top_k=2, max_new_tokens=2)),
    "top-p 0.8 inside": ([B, ID[" cat"]], _s(top_p=kc.TOP_P)),
    "top-p 0.8 outside": ([B, ID[" dog"]], _s(top_p=kc.TOP_P)),
    "temperature 0.6 + top-p 0.8": ([B, ID[" cat"]], _s(temperature=0.6, top_p=kc.TOP_P)),
    "min-p 0.3": ([B], _s(min_p=0.3)),
    "penalties": ([B, ID["b"]], _s(repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.3)),
    "logit bias": ([B, ID[" on"]], _s(logit_bias=((ID["b"], 1.0), (kc.EOS, -1.0)))),
    "plain, 8 tokens": ([B], _s(max_new_tokens=8)),
    "temperature 0.6 + top-p 0.8, 8 tokens": ([B, ID[" the"]], _s(temperature=0.6, top_p=kc.TOP_P, max_new_tokens=8)),
    "penalties, 8 tokens": ([B, ID["b"]], _s(repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.3,
                                             max_new_tokens=8)),
    "greedy": ([B], _s(do_sample=False, max_new_tokens=4)),
    "greedy, 8 tokens": ([B], _s(do_sample=False, max_new_tokens=8)),
    "repetitive prompt, 8 tokens": (REPEAT, _s(max_new_tokens=8)),
    "greedy, repetitive prompt, 8 tokens": (REPEAT, _s(do_sample=False, max_new_tokens=8)),
    "greedy near tie": ([B, ID[" on"]], _s(do_sample=False, max_new_tokens=4)),
}
"""The processing cases: name -> (prompt ids, sampling); rows of the kit each one reaches are in
docs/conformance.md."""


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def raw_law(url: str, prompts: list[list[int]], seeds: int = 20) -> dict[str, Any]:
    """Part 1 (module docstring): the largest |engine - reference| over prompts, seeds and positions."""
    s = _s()
    worst, n = 0.0, 0
    for p in prompts:
        for seed in range(seeds):
            body = {"prompt": p, "n_predict": s.max_new_tokens, "seed": seed, "return_tokens": True,
                    "cache_prompt": False, "n_probs": M.vocab_size, "post_sampling_probs": True,
                    **request_settings("llama.cpp", s, len(p) + s.max_new_tokens)}
            ans = _post(url, body)
            toks = ans["tokens"]
            for j, cp in enumerate(ans["completion_probabilities"]):
                got = np.zeros(M.vocab_size)
                for e in cp["top_probs"]:
                    got[e["id"]] = e["prob"]
                ref = kc.next_law(M, p, toks[:j], s)
                worst = max(worst, float(np.abs(got - ref).max()))
                n += 1
    return {"positions": n, "max_abs_diff": worst}


def _top(url: str, prompt: list[int], n: int) -> tuple[list[int], list[dict[int, float]]]:
    s = _s(do_sample=False, max_new_tokens=n)
    body = {"prompt": prompt, "n_predict": n, "seed": 0, "return_tokens": True, "cache_prompt": False, "n_probs": 8,
            **request_settings("llama.cpp", s, len(prompt) + n)}
    ans = _post(url, body)
    return ans["tokens"], [{e["id"]: e["logprob"] for e in cp["top_logprobs"]} for cp in ans["completion_probabilities"]]


def batch_invariance(url: str, prompt: list[int], n: int) -> dict[str, Any]:
    """Part 2: a greedy draw of ``n`` ids with the raw log-probabilities of the top ids at each position
    (each position scored alone, one decode per id), then each context ``prompt + ids[:j]`` sent as a
    prompt (scored as one batch): the largest |difference| of the same context's log-probabilities."""
    ids, per = _top(url, prompt, n)
    worst, compared = 0.0, 0
    for j in range(1, len(ids)):
        _, batched = _top(url, prompt + ids[:j], 1)
        for t in set(per[j]) & set(batched[0]):
            worst = max(worst, abs(per[j][t] - batched[0][t]))
            compared += 1
    return {"ids": ids, "compared": compared, "max_abs_logprob_diff": worst}


def exact_tests(draws: list[tuple[tuple[int, ...], str | None]], prompt: list[int], s: Sampling,
                alpha: float) -> dict[str, Any]:
    """Part 3 for one case: each test's statistic, p-value, detectable TV and the Holm verdict."""
    law = kc.sequence_law(M, prompt, s)
    n = len(draws)
    if not s.do_sample:
        (only,) = law
        bad = [d for d in draws if d[0] != only]
        return {"n": n, "expected": list(only), "verdict": "lossless" if not bad else "lossy",
                "mismatches": len(bad), "example": list(bad[0][0]) if bad else None}
    parts: dict[str, tuple[dict[Any, float], list[Any]]] = {
        "whole draw": ({(k, fr): p for k, (p, fr) in law.items()}, [(d, "stop" if fr == "stop" else "length")
                                                                      for d, fr in draws]),
        "length": (kc.length_law(law), [len(d) for d, _ in draws]),
    }
    for j, pl in enumerate(kc.position_laws(law)):
        parts[f"position {j + 1}"] = (pl, [d[j] if j < len(d) else -1 for d, _ in draws])
    each = alpha / len(parts)
    rows: dict[str, Any] = {}
    pv = []
    for name, (lw, obs) in parts.items():
        live = {k: v for k, v in lw.items() if v > 0}
        k = max(2, len(live))
        test: Literal["chi2", "tv"] = "chi2"
        try:
            try:
                r = gof_test(live, obs, each)
            except InvalidTest:  # too little mass left after pooling: the distribution-free TV test
                test = "tv"
                r = gof_test(live, obs, each, test=test)
            tv = min_tv_detectable(k, n, each, test=test)
        except InvalidTest as e:  # no test of this part has power at this n (e.g. 3,000 whole draws)
            rows[name] = {"skipped": str(e), "cells": len(live)}
            continue
        rows[name] = {"test": test, "statistic": r.statistic, "p_value": r.p_value, "cells": len(live),
                      "detectable_tv": tv, "outside_support": sum(o not in live for o in obs)}
        pv.append(r.p_value)
    rejected = holm(pv, alpha)
    for (name, row), rej in zip([(k, v) for k, v in rows.items() if "skipped" not in v], rejected):
        row["rejected"] = bool(rej)
    return {"n": n, "alpha": alpha, "tests": rows, "verdict": "lossy" if any(rejected) else "lossless"}


def greedy_draft_acceptance(prompt: list[int], s: Sampling) -> tuple[float, float] | None:
    """The exact expected acceptance of ``draft-simple`` with greedy drafts on a 3-id case: the server
    samples the first id from the prompt, drafts one id (the budget leaves room for one), the drafter's
    argmax after ``prompt + [t1]``, and keeps it iff the target's sample there equals it; so the rate
    per draft is ``sum_t1 P(t1) p(d(t1) | prompt, t1) / P(t1 is no end id)``. Where the drafter's
    largest logits tie, its sort picks the draft: returned as ``(lowest, highest)`` over the tied
    choices; None for another budget."""
    if s.max_new_tokens != 3 or not s.do_sample:
        return None
    dm = kc.kit_model("drafter")
    first = kc.next_law(M, prompt, (), s)
    lo = hi = mass = 0.0
    for t1 in np.flatnonzero(first > 0):
        if int(t1) == kc.EOS:
            continue
        q = dm.logits(list(prompt) + [int(t1)])
        tied = np.flatnonzero(q == q.max())
        p2 = kc.next_law(M, prompt, (int(t1),), s)
        lo += float(first[t1]) * float(min(p2[tied]))
        hi += float(first[t1]) * float(max(p2[tied]))
        mass += float(first[t1])
    return lo / mass, hi / mass


def main(argv: list[str] | None = None) -> int:
    from bench_record import save

    from hsd_torch.conformance.engines import Case, EngineRefused
    from hsd_torch.conformance.kit import build_kit
    from hsd_torch.conformance.llama_server import LlamaServer, LlamaServerEngine, MODES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="draws per sampled case (default 2000)")
    ap.add_argument("--greedy-n", type=int, default=30, help="draws per greedy case (default 30)")
    ap.add_argument("--alpha", type=float, default=1e-3, help="family-wise false-fail rate per case (default 1e-3)")
    ap.add_argument("--modes", default="none,draft-simple,draft-simple-probabilistic,ngram-mod")
    ap.add_argument("--cases", default=";".join(CASES), help="case names separated by ';' (default: all)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--update", action="store_true", help="keep the other rows of an existing --json file (a run "
                                                          "of some cases updates theirs)")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            ap.error(f"unknown mode {m}; one of {', '.join(MODES)}")
    kit = Path(tempfile.mkdtemp(prefix="hsd-kit-"))
    build_kit(kit)
    eng = LlamaServerEngine()
    record: dict[str, Any] = {"engine": eng.name, "build": eng.info, "n": args.n, "alpha": args.alpha, "modes": {}}
    print(eng.name, flush=True)
    with LlamaServer(str(kit / "gguf" / "target.gguf"), binary=eng.binary) as srv:
        prompts = [p for p, _ in CASES.values()]
        record["raw_law"] = raw_law(srv.url, prompts)
        print("raw law:", record["raw_law"], flush=True)
        record["batch_invariance"] = {name: batch_invariance(srv.url, CASES[name][0], 6)
                                      for name in ("greedy", "greedy near tie")}
        print("batch invariance:", record["batch_invariance"], flush=True)
    for mode in modes:
        res: dict[str, Any] = {}
        for name in args.cases.split(";"):
            prompt, s = CASES[name]
            case = Case(kit=kit, prompt_ids=tuple(prompt), sampling=s, mode=mode,
                        drafter="drafter" if mode.startswith("draft") else None, settings=NGRAM_SETTINGS.get(mode, {}))
            n = args.n if s.do_sample else args.greedy_n
            t0 = time.perf_counter()
            try:
                f = eng.sample(case, list(range(1, n + 1)))
            except EngineRefused as e:
                res[name] = {"refused": str(e)}
                continue
            except Exception as e:  # a crash is a result of its own
                res[name] = {"crash": f"{type(e).__name__}: {e}"}
                print(f"{mode} / {name}: crash {e}", flush=True)
                continue
            dt = time.perf_counter() - t0
            out = exact_tests([(d.ids, d.finish_reason) for d in f.draws], prompt, s, args.alpha)
            out["seconds"] = round(dt, 2)
            dn = sum(int(d.extra.get("draft_n", 0)) for d in f.draws)
            da = sum(int(d.extra.get("draft_n_accepted", 0)) for d in f.draws)
            if dn:
                out["drafted"], out["accepted"], out["acceptance"] = dn, da, da / dn
                exp = greedy_draft_acceptance(prompt, s) if mode == "draft-simple" else None
                if exp is not None:  # a 99.9% normal interval around the measured rate
                    half = 3.29 * (out["acceptance"] * (1 - out["acceptance"]) / dn) ** 0.5
                    out["expected_acceptance"] = list(exp)
                    out["acceptance_interval"] = [out["acceptance"] - half, out["acceptance"] + half]
                    out["acceptance_as_expected"] = bool(exp[0] - 1e-9 <= out["acceptance"] + half
                                                         and out["acceptance"] - half <= exp[1] + 1e-9)
            res[name] = out
            print(f"{mode} / {name}: {out['verdict']} ({n} draws, {dt:.1f} s"
                  + (f", acceptance {da}/{dn}" if dn else "") + ")", flush=True)
        record["modes"][mode] = res
    eng.close()
    if args.update and args.json and Path(args.json).exists():
        old = json.loads(Path(args.json).read_text(encoding="utf-8"))
        for mode, res in record["modes"].items():
            old.setdefault("modes", {}).setdefault(mode, {}).update(res)
        record["modes"] = old["modes"]
        for k in ("commit", "date", "machine"):
            record.pop(k, None)
    save(record, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
