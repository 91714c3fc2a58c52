"""llama.cpp's ``llama-server`` on the conformance kit against exact laws (issue 47, llama.cpp's part).

    python bench/engines/llamacpp_conformance.py [--n 2000] [--modes none,draft-simple,...] [--json OUT]

Needs the binary (``bench/engines/setup_llamacpp.sh``). Writes the kit into a temporary folder, then:

1. **Raw law**: for each kit prompt, llama-server's post-sampling probabilities of every id
   (``n_probs`` = the vocabulary, ``post_sampling_probs``, temperature 1, every other stage neutral) at
   each generated position, against :func:`hsd_core.conformance.next_law` after the same prefix: the
   largest absolute difference (float32 engine against a float64 reference). The same on the positional
   ``target_pos`` (``gguf/target_pos.gguf``, its law :func:`hsd_core.conformance.forward64`) after
   ``pos_plain``'s prompt, and on an export of it with q and k left in Hugging Face's rotary layout,
   which must differ (:func:`raw_law_target_pos`).
2. **Batch invariance**: the same context's raw log-probabilities (``n_probs``) scored one position at a
   time (a greedy draw, one decode per id) and as one batch (the context sent as a prompt), largest
   difference: speculative verification scores its drafts as one batch. (The speculative path itself
   reports no per-token probabilities: ``tools/server/server-context.cpp``, "TODO: set result.probs".)
3. **Exact-law tests** per mode and processing case (:data:`CASES`): ``--n`` draws, one seed each, against
   :func:`hsd_core.conformance.sequence_law` in llama.cpp's order: whole draws (with their finish reasons),
   the first token, the length (where EOS comes) and each position alone, chi-square with low-count cells
   pooled (:func:`hsd_core.stats.gof_test`), Holm over the case's tests at family-wise alpha ``--alpha``;
   each test's detectable TV (power 0.99) is recorded. Greedy cases: every draw must be the one sequence.
   Draft modes also record the measured acceptance (the server's ``draft_n_accepted / draft_n``), and
   ``draft-simple`` its exact expectation where :func:`greedy_draft_acceptance` computes one. The case
   ``pos_plain`` runs on ``target_pos`` (:data:`TARGET_OF`), the others on ``target``.

The JSON (``--json``, through ``bench/bench_record.py``) holds every number the docs quote.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from functools import lru_cache
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
    "pos_plain": ([B, ID[" the"], ID[" cat"]], _s(max_new_tokens=4)),
}
"""The processing cases: name -> (prompt ids, sampling); rows of the kit each one reaches are in
docs/conformance.md. Their target is the kit's ``target`` but where :data:`TARGET_OF` names another."""

TARGET_OF: dict[str, str] = {"pos_plain": "target_pos"}
"""Cases run on another kit target than ``target``: ``pos_plain`` (the matrix's case of that name) on the
positional ``target_pos``, whose law depends on position ids and on the id two back."""


def target_of(name: str) -> kc.KitModel:
    """The kit model case ``name`` runs on (:data:`TARGET_OF`)."""
    return kc.kit_model(TARGET_OF.get(name, "target"))


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def raw_law(url: str, prompts: list[list[int]], seeds: int = 20, model: kc.KitModel = M,
            max_new_tokens: int = 3) -> dict[str, Any]:
    """Part 1 (module docstring): the largest |engine - reference| over prompts, seeds and positions, and
    the largest total variation between the two laws at one position; ``model`` the kit model the
    server runs (its law: :func:`hsd_core.conformance.next_law`), draws of ``max_new_tokens`` ids."""
    s = _s(max_new_tokens=max_new_tokens)
    worst, tv, n = 0.0, 0.0, 0
    for p in prompts:
        for seed in range(seeds):
            body = {"prompt": p, "n_predict": s.max_new_tokens, "seed": seed, "return_tokens": True,
                    "cache_prompt": False, "n_probs": model.vocab_size, "post_sampling_probs": True,
                    **request_settings("llama.cpp", s, len(p) + s.max_new_tokens)}
            ans = _post(url, body)
            toks = ans["tokens"]
            for j, cp in enumerate(ans["completion_probabilities"]):
                got = np.zeros(model.vocab_size)
                for e in cp["top_probs"]:
                    got[e["id"]] = e["prob"]
                ref = kc.next_law(model, p, toks[:j], s)
                worst = max(worst, float(np.abs(got - ref).max()))
                tv = max(tv, 0.5 * float(np.abs(got - ref).sum()))
                n += 1
    return {"positions": n, "max_abs_diff": worst, "max_tv": tv}


def raw_law_target_pos(kit: Path, binary: str, seeds: int = 20) -> dict[str, Any]:
    """Part 1 on the positional target: the raw law of ``kit/gguf/target_pos.gguf`` (q and k in llama.cpp's
    rotary layout) after the prompts of the cases on ``target_pos`` and each prefix their draws reach
    (:func:`raw_law`), batch invariance there, and the same raw law of an export that leaves q and k in
    Hugging Face's layout (written beside it as ``target_pos_hf_layout.gguf``): the check's teeth, a
    wrong reordering moves the law by a large total variation (the previous-token head misses)."""
    from hsd_torch.conformance.kit import write_gguf
    from hsd_torch.conformance.llama_server import LlamaServer

    tp = kc.kit_model("target_pos")
    cases = [CASES[name] for name, role in TARGET_OF.items() if role == "target_pos"]
    prompts = [p for p, _ in cases]
    budget = max(s.max_new_tokens for _, s in cases)
    out: dict[str, Any] = {}
    with LlamaServer(str(kit / "gguf" / "target_pos.gguf"), binary=binary) as srv:
        out["llama.cpp layout"] = raw_law(srv.url, prompts, seeds, tp, budget)
        out["batch_invariance"] = batch_invariance(srv.url, prompts[0], 6)
    wrong = write_gguf(tp, kit / "gguf" / "target_pos_hf_layout.gguf", rope_layout="hf")
    with LlamaServer(str(wrong), binary=binary) as srv:
        out["hf layout (wrong)"] = raw_law(srv.url, prompts, seeds, tp, budget)
    return out


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
                alpha: float, model: kc.KitModel = M) -> dict[str, Any]:
    """Part 3 for one case: each test's statistic, p-value, detectable TV and the Holm verdict, against
    ``model``'s exact law."""
    law = kc.sequence_law(model, prompt, s)
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


ACCEPTANCE_BUDGET = 4
"""The largest budget (``max_new_tokens``) :func:`greedy_draft_acceptance` enumerates."""


@lru_cache(maxsize=None)
def drafter_argmax(last: int) -> tuple[int, ...]:
    """The ids of the kit drafter's largest logit after ``last`` (several where they tie; the drafter's
    law depends on its last id only: it has no clock and no attention)."""
    q = kc.kit_model("drafter").logits([B, int(last)])
    return tuple(int(t) for t in np.flatnonzero(q == q.max()))


def greedy_draft_expectation(prompt: list[int], s: Sampling, model: kc.KitModel = M, choice: dict[int, int] | None = None,
                             n_max: int = 3, reached: set[int] | None = None) -> tuple[float, float]:
    """``(E drafted, E accepted)`` per draw of ``draft-simple`` with greedy drafts as llama-server runs it
    (``tools/server/server-context.cpp``, ``get_n_draft_max``; ``common/sampling.cpp``,
    ``common_sampler_sample_and_accept_n``), enumerated exactly over every draw of ``model`` under
    ``s``: the server samples the first id from the prompt; then, while ``r`` ids are left to generate,
    it drafts ``k = min(n_max, r - 1)`` ids, the drafter's argmax chain after the last id (none where
    ``k`` is 0: a plain sample), and samples the target at each draft position in turn, keeping the
    draft while the sample equals it and adding the target's sample after the last kept one (after
    every draft, the bonus id); a sampled end id ends the draw, and a matched end id before the draft's
    last position counts as not accepted. ``choice``: at a context ``last`` whose drafter argmax ties
    (:func:`drafter_argmax`), the draft is the ``choice.get(last, 0)``-th tied id; ``reached`` (if
    given) collects every ``last`` a draft was made after."""
    pick = choice or {}
    budget = s.max_new_tokens

    def draft(last: int) -> int:
        c = drafter_argmax(last)
        if reached is not None:
            reached.add(last)
        return c[pick.get(last, 0) % len(c)]

    def law(out: list[int]) -> list[tuple[int, float]]:
        p = kc.next_law(model, prompt, out, s)
        return [(int(t), float(p[t])) for t in np.flatnonzero(p > 0)]

    def rounds(out: list[int]) -> tuple[float, float]:  # the slot holds out[-1], not ended
        r = budget - len(out)
        if r <= 0:
            return 0.0, 0.0
        k = min(n_max, r - 1)
        if k <= 0:  # no room for a draft: a plain sample
            dn = da = 0.0
            for t, p in law(out):
                if t != kc.EOS:
                    sub = rounds(out + [t])
                    dn += p * sub[0]
                    da += p * sub[1]
            return dn, da
        ds = [draft(out[-1])]
        for _ in range(k - 1):
            ds.append(draft(ds[-1]))
        dn, da = verify(out, ds, 0)
        return k + dn, da

    def verify(out: list[int], ds: list[int], i: int) -> tuple[float, float]:
        dn = da = 0.0
        for t, p in law(out):
            if i == len(ds) or t != ds[i]:  # the bonus id after every draft, or a rejection: i kept
                sub = (0.0, float(i)) if t == kc.EOS else _plus(rounds(out + [t]), i)
            elif t == kc.EOS:  # a matched end id ends the draw; it is counted only at the draft's end
                sub = (0.0, float(i + 1 if i + 1 == len(ds) else i))
            else:
                sub = verify(out + [t], ds, i + 1)
            dn += p * sub[0]
            da += p * sub[1]
        return dn, da

    dn = da = 0.0
    for t, p in law([]):
        if t != kc.EOS:
            sub = rounds([t])
            dn += p * sub[0]
            da += p * sub[1]
    return dn, da


def greedy_draft_acceptance(prompt: list[int], s: Sampling, model: kc.KitModel = M,
                            n_max: int = 3) -> tuple[float, float] | None:
    """The exact expected acceptance rate (accepted drafts per drafted id, pooled over draws) of
    ``draft-simple`` with greedy drafts (:func:`greedy_draft_expectation`'s ratio). With
    ``max_new_tokens`` 3 this is one draft after the first id, ``sum_t1 P(t1) p(d(t1) | t1) / P(t1 is
    no end id)``. Where the drafter's largest logits tie, its sort picks the draft: returned as
    ``(lowest, highest)`` over every choice among the tied ids of the contexts reached (a draft after
    EOS is never compared: a matched EOS ends the verification). ``model`` the target; None for a
    greedy case, where nothing is drafted, and for a budget over :data:`ACCEPTANCE_BUDGET` ids (the
    enumeration over every draw grows as the live ids to that power)."""
    if not s.do_sample or s.max_new_tokens > ACCEPTANCE_BUDGET:
        return None
    rates: list[float] = []
    seen: set[tuple[tuple[int, int], ...]] = set()
    pending: list[dict[int, int]] = [{}]
    while pending:  # every choice at every tied context reached (a choice may reach new contexts)
        choice = pending.pop()
        key = tuple(sorted(choice.items()))
        if key in seen:
            continue
        seen.add(key)
        reached: set[int] = set()
        dn, da = greedy_draft_expectation(prompt, s, model, choice, n_max, reached)
        if dn > 0:
            rates.append(da / dn)
        for last in sorted(reached):
            c = drafter_argmax(last)
            if len(c) > 1 and last not in choice and last != kc.EOS:
                pending += [{**choice, last: j} for j in range(len(c))]
    if not rates:
        return None
    return min(rates), max(rates)


def _plus(sub: tuple[float, float], accepted: int) -> tuple[float, float]:
    return sub[0], sub[1] + accepted


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
        prompts = [p for name, (p, _) in CASES.items() if name not in TARGET_OF]
        record["raw_law"] = raw_law(srv.url, prompts)
        print("raw law:", record["raw_law"], flush=True)
        record["batch_invariance"] = {name: batch_invariance(srv.url, CASES[name][0], 6)
                                      for name in ("greedy", "greedy near tie")}
        print("batch invariance:", record["batch_invariance"], flush=True)
    record["raw_law_target_pos"] = raw_law_target_pos(kit, eng.binary)
    print("raw law of target_pos:", record["raw_law_target_pos"], flush=True)
    for mode in modes:
        res: dict[str, Any] = {}
        for name in args.cases.split(";"):
            prompt, s = CASES[name]
            case = Case(kit=kit, prompt_ids=tuple(prompt), sampling=s, mode=mode,
                        drafter="drafter" if mode.startswith("draft") else None, settings=NGRAM_SETTINGS.get(mode, {}),
                        target=TARGET_OF.get(name, "target"))
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
            out = exact_tests([(d.ids, d.finish_reason) for d in f.draws], prompt, s, args.alpha, target_of(name))
            out["seconds"] = round(dt, 2)
            dn = sum(int(d.extra.get("draft_n", 0)) for d in f.draws)
            da = sum(int(d.extra.get("draft_n_accepted", 0)) for d in f.draws)
            if dn:
                out["drafted"], out["accepted"], out["acceptance"] = dn, da, da / dn
                exp = greedy_draft_acceptance(prompt, s, target_of(name)) if mode == "draft-simple" else None
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
