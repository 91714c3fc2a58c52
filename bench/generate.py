"""End-to-end generation speed: hsd_torch against transformers and autoregressive decoding.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/generate.py                      # full run (builds the pair if needed)
    HF_HUB_OFFLINE=1 .venv/bin/python bench/generate.py --quick --json out.json   # <= 3 minutes once built
    HF_HUB_OFFLINE=1 .venv/bin/python bench/generate.py --pair real --quick --json out.json   # the real pair
    HF_HUB_OFFLINE=1 .venv/bin/python bench/generate.py --pair distilled --quick   # Gemma <- a distilled drafter
    # the real pair in full (bench/RESULTS.md): batch 1 with transformers and the lookahead sweep; batch scaling
    HF_HUB_OFFLINE=1 .venv/bin/python bench/generate.py --pair real --prompts 4 --new 32 --repeats 2 --batches 1 \
        --sweep 1,2,6,8 --json bench/generate_real_lookahead.json --plots bench/generate_plots_real_full
    HF_HUB_OFFLINE=1 .venv/bin/python bench/generate.py --pair real --prompts 16 --b1-prompts 4 --new 32 --repeats 1 \
        --batches 1,4,16 --modes greedy,sample --no-transformers --json bench/generate_real_batch.json \
        --plots bench/generate_plots_real_batch

    # Qwen2.5-Coder-1.5B-Instruct <- SmolLM2-135M-Instruct (SD: <- Qwen2.5-Coder-0.5B-Instruct), HumanEval prompts
    HF_HUB_OFFLINE=1 .venv/bin/python bench/generate.py --pair qwen --dtype bfloat16 --prompts 4 --new 48 --repeats 2 \
        --batches 1 --modes greedy,sample --sweep 2,6 --json bench/generate_qwen_bf16.json --plots bench/generate_plots_qwen

A first run builds the synthetic pair (``bench/pair.py``: about 60 minutes on 2 quiet cores; cached
in ``.cache/bench_pair``, announced before it starts); ``--pair real`` needs no build: Gemma-3-270M
target, SmolLM2-135M-Instruct drafter (``hsd_torch.models.real``, the README's real-model extra; no
SD, as no drafter shares Gemma's vocabulary; ``--pair real-reverse``: the roles swapped), prompts
from HumanEval and English prose (``bench/acceptance_real.py``'s), mode ``chat`` (temperature 0.7,
top-p 0.9) beside greedy and sampling. ``--pair qwen``: Qwen2.5-Coder-1.5B-Instruct target (the
``real-qwen`` extra), SmolLM2-135M-Instruct drafter for the cross-tokenizer methods and
Qwen2.5-Coder-0.5B-Instruct (the target's tokenizer) for SD, HumanEval prompts only. ``--pair distilled``: the same target and prompts with the tiny drafter that
``bench/distill_drafter.py`` distils from Gemma's own samples (built first if missing: about an hour).

The pair is ``bench/pair.py``'s (its module doc says what it is: a narrow codec-table domain, a
distilled drafter with a smaller byte-level BPE, a target inflated with zero-branch blocks), the
prompts are held out from its training. One thread, one process, every configuration run once per
repeat on the same prompts, so each ratio below is taken inside one repeat; min and median over the
repeats are reported. The configurations run in a new random order each repeat (seeded), so that
the slow phases of a shared machine do not always hit the same ones.

Token trees (``--methods`` with ``sdtree``, ``slemtree``, ``tlitree``; not in the default set): SD, SLEM and
TLI with ``tree=`` the shape ``--tree`` names (static widths per depth, default ``2,2,1,1``, or
``dynamic:BUDGET:WIDTH:DEPTH``); the tree's depth is their lookahead (docs/trees.md).

The dynamic draft length (``--min-confidence C``, off by default): hsd's single-path SD, SLEM and TLI
run with ``min_confidence=C`` (each row stops drafting before a later draft whose drafter law's largest
probability is below C; docs/trees.md); the other methods and transformers' assistants (which keep
drafting exactly ``--lookahead`` tokens) run as without it. The JSON's ``setup`` records
``min_confidence`` and the methods it applied to.

Configurations (lookahead ``--lookahead``, 4 by default; SLRS is one-token, lookahead 1):

- ``hsd:<method>-<mode>@b<B>``: ``hsd_torch.generate`` with method AR, SD (the SD drafter, on the
  target's tokenizer), SLEM, TLI, SLRS (the paper's one-token SLRS), BSLRS and BSLRSM (bounded
  SLRS, proofs/slrs_bounded.md: ``proposal_map="longest_prefix"``, ``min_path_prob`` 0.05, the lookahead's drafter
  tokens; BSLRS proposes one target id a round, BSLRSM every target id its draft spells,
  ``max_tokens=None``); mode ``greedy`` or ``sample`` (temperature 1, full vocabulary);
  batch B (1: one call per prompt; 4, 16: prompts in groups). ``--methods`` picks a subset.
- ``--sweep 1,2,8``: the methods that take a lookahead (TLI, SLEM, BSLRS, BSLRSM; with transformers
  its UAG greedy and patched USD sampling) also at batch 1 at those lookaheads, in the modes of
  ``--sweep-modes`` (keys ``...@b1/k<K>``); ``"lookahead_sweep"`` in the JSON gathers speed-up, bound,
  acceptance and tokens per target call by lookahead (the main lookahead's from the batch-1 rows),
  ``"vs_transformers_by_lookahead"`` the ratios to transformers there, and ``--plots`` draws
  speed-up and bound against lookahead.
- ``hf:ar-<mode>@b1``: the target's own ``model.generate``;
  ``hf:sd-<mode>@b1``: transformers' assisted generation with the SD drafter (same tokenizer);
  ``hf:uag-<mode>@b1``: its assisted generation across tokenizers
  (``generate(assistant_model=d, tokenizer=tt, assistant_tokenizer=dt)``; greedy re-tokenizes text,
  sampling works over the vocabulary intersection; with fix 3 of ``bench/transformers_uag_patch.py``
  alone, the assistant's cache, without which transformers 5.25 crashes on some prompts). The
  assistants draft exactly ``--lookahead``
  tokens a round (``num_assistant_tokens_schedule="constant"``, ``assistant_confidence_threshold=0``)
  so both implementations run the same lookahead. transformers takes batch 1 only.
  ``hf:uagfix-sample@b1``: the same sampling across tokenizers with ``bench/transformers_uag_patch.py``
  installed for that configuration alone (the patch that makes it lossless), so that hsd's
  TLI is also compared with a *correct* version of the sampler users would otherwise run
  (``vs_transformers_patched``).

Figures per configuration: tokens/s, ms per token, acceptance per drafted token (hsd: its stats'
accepted / proposed; transformers: (new tokens - target calls) / drafter forward calls, i.e. accepted
target tokens per drafter token, every round emitting its accepted drafts plus one), tokens per
target call, target and drafter forward passes (counted by forward hooks, as is the time inside
them), ``speedup`` = tokens/s over the same implementation's AR at the same batch (hsd methods over
hsd AR, transformers' over its plain ``generate``), and ``bound`` = the speed-up the method's measured
acceptance and measured forward costs allow: its tokens per second of forward-pass time, over AR's
tokens per second of wall time (what the method would reach if its rounds cost nothing beyond their
forward passes). ``speedup / bound`` is then the share of the method's wall time spent inside the
forward passes.

``vs_transformers`` (batch 1): transformers' time per token / hsd_torch's, same mode and lookahead:
``ar-<mode>`` (plain generate vs hsd AR), ``sd-<mode>`` (same-tokenizer assisted vs hsd SD),
``tli-sample`` (UAG sampling, which works over the intersection, vs hsd TLI), ``slem-greedy`` and
``tli-greedy`` (UAG greedy vs hsd SLEM and TLI: greedy output is the target's greedy output for all).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import pair as pairmod  # noqa: E402
from bench_record import save  # noqa: E402

HSD_METHODS = ("ar", "sd", "slem", "tli", "slrs", "bslrs", "bslrsm")
TREE_METHODS = ("sdtree", "slemtree", "tlitree")  # the token-tree methods (--methods, --tree; not in the default set)
BOUNDED = {"proposal_map": "longest_prefix", "min_path_prob": 0.05}  # bounded SLRS, as bench/acceptance_real.py
# hsd_torch.generate's options per benchmark method (lookahead: the run's unless given)
METHOD_OPTIONS: dict[str, dict[str, Any]] = {
    "ar": {"method": "ar"}, "sd": {"method": "sd"}, "slem": {"method": "slem"}, "tli": {"method": "tli"},
    "slrs": {"method": "slrs", "lookahead": 1},
    "bslrs": {"method": "slrs", **BOUNDED}, "bslrsm": {"method": "slrs", **BOUNDED, "max_tokens": None},
    "sdtree": {"method": "sd"}, "slemtree": {"method": "slem"}, "tlitree": {"method": "tli"}}  # + tree (--tree)
DYNAMIC_LENGTH = ("sd", "slem", "tli")  # the single-path methods that take --min-confidence
SWEPT = ("tli", "slem", "bslrs", "bslrsm")  # the methods whose rounds take a lookahead
HF_SWEPT = (("uag", "greedy"), ("uagfix", "sample"))
MODES = ("greedy", "sample")
CHAT = {"temperature": 0.7, "top_p": 0.9}  # the chat-style sampling of mode "chat" (--modes)
VS = {"ar-greedy": "ar-greedy", "ar-sample": "ar-sample", "sd-greedy": "sd-greedy", "sd-sample": "sd-sample",
      "tli-sample": "uag-sample", "slem-greedy": "uag-greedy", "tli-greedy": "uag-greedy"}
# hsd TLI against transformers' universal speculative decoding made lossless by bench/transformers_uag_patch.py
VS_PATCHED = {"tli-sample": "uagfix-sample"}
# at every lookahead of the sweep: hsd's configuration -> transformers' on the same prompts and lookahead
VS_SWEEP = {"slem-greedy": "uag-greedy", "tli-greedy": "uag-greedy", "bslrs-greedy": "uag-greedy",
            "bslrsm-greedy": "uag-greedy", "tli-sample": "uagfix-sample", "bslrs-sample": "uagfix-sample",
            "bslrsm-sample": "uagfix-sample"}


def hsd_options(method: str, lookahead: int, tree: Any = None, min_confidence: float | None = None) -> dict[str, Any]:
    """``hsd_torch.generate``'s options for benchmark method ``method`` (:data:`METHOD_OPTIONS`):
    ``lookahead`` unless the method fixes its own, a tree method's ``tree`` in its place, and
    ``min_confidence`` for the single-path methods of :data:`DYNAMIC_LENGTH` when given."""
    opts = dict({"lookahead": lookahead}, **METHOD_OPTIONS[method])
    if method in TREE_METHODS:  # the tree's depth is its lookahead
        opts.pop("lookahead")
        opts["tree"] = tree
    if min_confidence is not None and method in DYNAMIC_LENGTH:
        opts["min_confidence"] = min_confidence
    return opts


class FwdTimer:
    """Forward hooks: number of calls of a module and the time inside them."""

    def __init__(self, model: Any, cuda: bool) -> None:
        self.calls = 0
        self.total = 0.0
        self._t0 = 0.0
        self._cuda = cuda
        self._handles = [model.register_forward_pre_hook(self._pre), model.register_forward_hook(self._post)]

    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()

    def _pre(self, *_: Any) -> None:
        self._sync()
        self._t0 = time.perf_counter()

    def _post(self, *_: Any) -> None:
        self._sync()
        self.total += time.perf_counter() - self._t0
        self.calls += 1

    def reset(self) -> None:
        self.calls, self.total = 0, 0.0

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def greedy_comparison(greedy: dict[str, list[list[int]]]) -> dict[str, Any]:
    """Greedy output is the target's greedy output for every lossless method: per configuration, the
    number of prompts whose tokens differ from hsd AR's at batch 1 (``greedy_mismatches``; batched float
    rounding may flip a near tie) and where: (prompt, first differing position) (``greedy_divergences``,
    to set beside the near ties counted)."""
    ref = greedy.get("hsd:ar-greedy@b1", [])
    return {
        "greedy_mismatches": {k: sum(a != b for a, b in zip(ref, v)) for k, v in greedy.items()},
        "greedy_divergences": {
            k: [(i, next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
                for i, (a, b) in enumerate(zip(ref, v)) if a != b]
            for k, v in greedy.items() if any(a != b for a, b in zip(ref, v))},
    }


class Bench:
    def __init__(self, pair: dict[str, Any], prompts: list[str], new: int, lookahead: int, device: str,
                 hf: bool = True) -> None:
        self.p = pair
        self.prompts = prompts
        self.new = new
        self.k = lookahead
        self.tree: Any = None  # the tree methods' shape (--tree)
        self.min_confidence: float | None = None  # the single-path methods' dynamic draft length (--min-confidence)
        self.device = device
        cuda = device.startswith("cuda")
        self.tt, self.dt = pair["target_tokenizer"], pair["drafter_tokenizer"]
        # transformers' assistants: own copies (UAG sampling prunes its assistant's head in place, and
        # its translator cache is keyed by the tokenizers: one assistant per mode, kept for the run);
        # none without transformers' runs (``hf=False``: on the Qwen pair the copies cost about 3 GB)
        self.hf_assist: dict[str, Any] = {}
        if hf:
            self.hf_assist = {"uag-greedy": copy.deepcopy(pair["drafter"]),
                              "uag-sample": copy.deepcopy(pair["drafter"]),
                              "uagfix-sample": copy.deepcopy(pair["drafter"])}
        if hf and pair.get("sd_drafter") is not None:
            self.hf_assist.update({"sd-greedy": copy.deepcopy(pair["sd_drafter"]),
                                   "sd-sample": copy.deepcopy(pair["sd_drafter"])})
        for m in self.hf_assist.values():
            gc = m.generation_config
            gc.num_assistant_tokens = lookahead
            gc.num_assistant_tokens_schedule = "constant"
            gc.assistant_confidence_threshold = 0.0
        models = [m for m in (pair["target"], pair["drafter"], pair.get("sd_drafter"), *self.hf_assist.values())
                  if m is not None]
        self.timers = {id(m): FwdTimer(m, cuda) for m in models}
        self.b1 = len(prompts)
        self.enc = [self.tt(p, return_tensors="pt")["input_ids"].to(device) for p in prompts]

    def _timer(self, m: Any) -> FwdTimer:
        return self.timers[id(m)]

    def run_hsd(self, method: str, mode: str, batch: int, seed: int, n: int | None = None,
                new: int | None = None, k: int | None = None) -> dict[str, Any]:
        import hsd_torch as ht

        p = self.p
        opts = hsd_options(method, k or self.k, self.tree, self.min_confidence)
        same_vocab = opts["method"] == "sd"
        drafter = None if method == "ar" else (p["sd_drafter"] if same_vocab else p["drafter"])
        dtok = None if drafter is None else (self.tt if same_vocab else self.dt)
        prompts = self.prompts[:n] if n else (self.prompts[:self.b1] if batch == 1 else self.prompts)
        tm, dm = self._timer(p["target"]), (self._timer(drafter) if drafter is not None else None)
        tm.reset()
        if dm:
            dm.reset()
        new_tok = proposed = accepted = rounds = near = flips = 0
        seqs: list[list[int]] = []
        _sync(self.device)
        t0 = time.perf_counter()
        for i in range(0, len(prompts), batch):
            out = ht.generate(p["target"], drafter, prompts[i:i + batch], target_tokenizer=self.tt,
                              drafter_tokenizer=dtok, max_new_tokens=new or self.new, do_sample=mode != "greedy",
                              seed=seed * 1000 + i, **opts, **(CHAT if mode == "chat" else {}))
            seqs += [list(x) for x in out.sequences]
            near += sum(out.near_ties or [])
            flips += sum(out.tie_flips or [])
            for s in out.stats:
                new_tok += s.new_tokens
                proposed += s.proposed
                accepted += s.accepted
                rounds += s.target_calls
        _sync(self.device)
        wall = time.perf_counter() - t0
        self.last_sequences = seqs
        return dict(self._figures(wall, new_tok, tm, dm, rounds=rounds, proposed=proposed, accepted=accepted),
                    near_ties=near, tie_flips=flips)

    def run_hf(self, kind: str, mode: str, seed: int, n: int | None = None, new: int | None = None,
               k: int | None = None) -> dict[str, Any]:
        p = self.p
        target = p["target"]
        assistant = None if kind == "ar" else self.hf_assist[f"{kind}-{mode}"]
        if assistant is not None:  # the assistant drafts exactly k tokens a round (constant schedule)
            assistant.generation_config.num_assistant_tokens = k or self.k
        kw: dict[str, Any] = dict(max_new_tokens=new or self.new, do_sample=mode != "greedy",
                                  pad_token_id=self.tt.pad_token_id, eos_token_id=self.tt.eos_token_id)
        if mode == "sample":
            kw.update(temperature=1.0, top_k=0, top_p=1.0)
        if mode == "chat":
            kw.update(top_k=0, **CHAT)
        if assistant is not None:
            kw["assistant_model"] = assistant
        if kind in ("uag", "uagfix"):
            kw.update(tokenizer=self.tt, assistant_tokenizer=self.dt)
        import transformers_uag_patch as fix

        # uagfix: bench/transformers_uag_patch.py, installed for this configuration only; uag: its fix 3
        # alone (the assistant's cache, which transformers 5.25 crops by a target length and then
        # crashes on), so that transformers' own law runs
        if kind in ("uag", "uagfix"):
            fix.apply_patch(cache_only=kind == "uag")
        try:
            return self._run_hf(target, assistant, kw, seed, n)
        finally:
            if kind in ("uag", "uagfix"):
                fix.remove_patch()

    def _run_hf(self, target: Any, assistant: Any, kw: dict[str, Any], seed: int, n: int | None) -> dict[str, Any]:
        tm, dm = self._timer(target), (self._timer(assistant) if assistant is not None else None)
        tm.reset()
        if dm:
            dm.reset()
        enc = self.enc[:n] if n else self.enc[:self.b1]
        new_tok = 0
        seqs: list[list[int]] = []
        _sync(self.device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            for i, ids in enumerate(enc):
                torch.manual_seed(seed * 1000 + i)
                out = target.generate(ids, attention_mask=torch.ones_like(ids), **kw)
                new_tok += out.shape[1] - ids.shape[1]
                seqs.append(out[0, ids.shape[1]:].tolist())
        _sync(self.device)
        wall = time.perf_counter() - t0
        self.last_sequences = seqs
        rounds = tm.calls
        proposed = dm.calls if dm else 0
        accepted = max(0, new_tok - rounds) if dm else 0
        return self._figures(wall, new_tok, tm, dm, rounds=rounds, proposed=proposed, accepted=accepted)

    @staticmethod
    def _figures(wall: float, new_tok: int, tm: FwdTimer, dm: FwdTimer | None, *, rounds: int, proposed: int,
                 accepted: int) -> dict[str, Any]:
        fwd = tm.total + (dm.total if dm else 0.0)
        return {"wall_s": wall, "new_tokens": new_tok, "tokens_per_s": new_tok / wall, "ms_per_token": 1e3 * wall / new_tok,
                "acceptance": (accepted / proposed) if proposed else None, "proposed": proposed, "accepted": accepted,
                "rounds": rounds, "tokens_per_target_call": new_tok / max(1, tm.calls),
                "target_forwards": tm.calls, "drafter_forwards": dm.calls if dm else 0,
                "target_forward_ms": 1e3 * tm.total / max(1, tm.calls),
                "drafter_forward_ms": (1e3 * dm.total / max(1, dm.calls)) if dm else None,
                "forward_s": fwd, "forward_share": fwd / wall, "tokens_per_forward_s": new_tok / fwd}


def configs(batches: list[int], hf: bool, sd: bool = True, modes: tuple[str, ...] = MODES,
            methods: tuple[str, ...] = HSD_METHODS) -> list[tuple[str, str, str, int]]:
    """The configurations: hsd's ``methods`` (SD only with an SD drafter) in ``modes`` at every batch;
    with ``hf``, transformers' at batch 1 (its UAG and patched USD in greedy and sampling only:
    the chat mode's top-p is not what the patch was checked for)."""
    out = [("hsd", m, mode, b) for b in batches for m in methods if sd or m not in ("sd", "sdtree") for mode in modes]
    if hf:
        out += [("hf", k, mode, 1) for k in ("ar", "sd", "uag") if sd or k != "sd" for mode in modes
                if k == "ar" or mode != "chat"]
        if "sample" in modes:
            out.append(("hf", "uagfix", "sample", 1))
    return out


def sweep_configs(lookaheads: list[int], hf: bool, modes: tuple[str, ...],
                  methods: tuple[str, ...] = HSD_METHODS) -> list[tuple[str, str, str, int, int]]:
    """The lookahead sweep's configurations, batch 1: hsd's methods of :data:`SWEPT` among ``methods``
    and, with ``hf``, transformers' UAG greedy and patched USD sampling, in ``modes``, at each lookahead."""
    out = [("hsd", m, mode, 1, k) for k in lookaheads for m in SWEPT if m in methods for mode in modes]
    if hf:
        out += [("hf", kind, mode, 1, k) for k in lookaheads for kind, mode in HF_SWEPT if mode in modes]
    return out


REAL_PAIRS = {"real": ("gemma-3-270m", "smollm2-135m-instruct"), "real-reverse": ("smollm2-135m-instruct", "gemma-3-270m"),
              "distilled": ("gemma-3-270m", "distilled"), "qwen": ("qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct")}
SD_DRAFTERS = {"qwen": "qwen2.5-coder-0.5b-instruct"}
"""``--pair`` -> the SD drafter (the target's tokenizer), where the pair has one."""
CODE_ONLY = ("qwen",)
"""Pairs benchmarked on HumanEval prompts alone (a code model)."""
"""``--pair`` -> (target, drafter): ``hsd_torch.models.real`` names, or bench/distill_drafter.py's build."""


def load_real(dtype: Any, device: str, n_prompts: int, drafter_kind: str = "real"
              ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The real target with a drafter as ``Bench`` takes them (an SD drafter where :data:`SD_DRAFTERS`
    has one), their description, and ``n_prompts`` prompts, half HumanEval code and half prose
    (``bench/acceptance_real.py``'s; HumanEval alone for :data:`CODE_ONLY`).
    ``drafter_kind``: ``"real"`` (SmolLM2-135M-Instruct), ``"distilled"`` (the build of
    ``bench/distill_drafter.py``, made first if missing: about an hour) or ``"real-reverse"`` (the
    real pair the other way round: SmolLM2-135M-Instruct target, Gemma-3-270M drafter)."""
    import acceptance_real

    from hsd_torch.models import real as real_models

    target_name, drafter_name = REAL_PAIRS[drafter_kind]
    target, tt = real_models.load(target_name, dtype=dtype)
    build: dict[str, Any] = {}
    if drafter_name == "distilled":
        import distill_drafter

        if not (distill_drafter.DEFAULT_OUT / "build.json").exists():
            print(f"no distilled drafter at {distill_drafter.DEFAULT_OUT}: building it first "
                  "(bench/distill_drafter.py, about an hour on 2 cores)", flush=True)
            distill_drafter.main([])
        drafter, dt, build = distill_drafter.load()
        drafter = drafter.to(dtype)
    else:
        drafter, dt = real_models.load(drafter_name, dtype=dtype)
    target, drafter = target.to(device), drafter.to(device)
    sd_name = SD_DRAFTERS.get(drafter_kind)
    sd_drafter = real_models.load(sd_name, dtype=dtype)[0].to(device) if sd_name else None
    if drafter_kind in CODE_ONLY:
        prompts = acceptance_real.prompts(n_prompts, 0)["code"]
    elif n_prompts > 2 * len(acceptance_real.PROSE_MODULES):
        raise SystemExit(f"--prompts {n_prompts}: the real pairs have {2 * len(acceptance_real.PROSE_MODULES)} prompts "
                         "(half HumanEval, half prose paragraphs)")
    else:
        got = acceptance_real.prompts((n_prompts + 1) // 2, n_prompts // 2)
        prompts = [got["code" if i % 2 == 0 else "prose"][i // 2] for i in range(n_prompts)]  # code, prose, ...
    desc = {"target": target_name, "drafter": drafter_name, "sd_drafter": sd_name,
            "target_params": sum(p.numel() for p in target.parameters()),
            "drafter_params": sum(p.numel() for p in drafter.parameters()),
            "target_vocab": len(tt), "drafter_vocab": len(dt)}
    return ({"target": target, "drafter": drafter, "sd_drafter": sd_drafter, "target_tokenizer": tt, "drafter_tokenizer": dt,
             "build": build}, desc, prompts)


def key(impl: str, m: str, mode: str, b: int, k: int | None = None) -> str:
    """``impl:method-mode@bB``, with ``/kK`` for a configuration of the lookahead sweep."""
    return f"{impl}:{m}-{mode}@b{b}" + ("" if k is None else f"/k{k}")


def parse_key(k: str) -> tuple[str, str, str, int, int | None]:
    """:func:`key`'s parts: implementation, method, mode, batch, sweep lookahead (None: the run's)."""
    impl, rest = k.split(":")
    name, tail = rest.split("@b")
    m, mode = name.rsplit("-", 1)
    b, _, la = tail.partition("/k")
    return impl, m, mode, int(b), (int(la) if la else None)


def summarize(runs: list[dict[str, dict[str, Any]]], lookahead: int | None = None) -> dict[str, Any]:
    """Per configuration: median of each figure over the repeats, plus min/median of the ratios that
    are taken inside each repeat (speedup over AR, bound, speedup/bound, vs transformers)."""
    methods: dict[str, Any] = {}
    for k in runs[0]:
        impl, _, mode, b, _ = parse_key(k)
        ar = f"{impl}:ar-{mode}@b{b}"
        row: dict[str, Any] = {}
        for f in runs[0][k]:
            vals = [r[k][f] for r in runs if r[k][f] is not None]
            row[f] = statistics.median(vals) if vals else None
        sp = [r[k]["tokens_per_s"] / r[ar]["tokens_per_s"] for r in runs]
        bound = [r[k]["tokens_per_forward_s"] / r[ar]["tokens_per_s"] for r in runs]
        eff = [s / bd for s, bd in zip(sp, bound)]
        row.update(speedup_min=min(sp), speedup_median=statistics.median(sp), bound_min=min(bound),
                   bound_median=statistics.median(bound), of_bound_min=min(eff), of_bound_median=statistics.median(eff))
        methods[k] = row
    vs: dict[str, float] = {}
    vs_min: dict[str, float] = {}
    vs_fix: dict[str, float] = {}
    for table_, pairs in ((vs, VS), (vs_fix, VS_PATCHED)):
        for ours, theirs in pairs.items():
            a, b_ = f"hsd:{ours}@b1", f"hf:{theirs}@b1"
            if a in runs[0] and b_ in runs[0]:
                rs = [r[b_]["ms_per_token"] / r[a]["ms_per_token"] for r in runs]
                table_[ours] = round(statistics.median(rs), 3)
                if pairs is VS:
                    vs_min[ours] = round(min(rs), 3)
    batch: dict[str, Any] = {}
    for k, row in methods.items():
        impl, m, mode, b, la = parse_key(k)
        if impl == "hsd" and la is None:
            batch.setdefault(f"{m}-{mode}", {})[b] = row["tokens_per_s"]
    out = {"methods": methods, "vs_transformers": vs, "vs_transformers_min": vs_min,
           "vs_transformers_patched": vs_fix, "throughput_by_batch": batch}
    if lookahead is not None and any(parse_key(k)[4] is not None for k in runs[0]):
        out.update(sweep_summary(runs, methods, lookahead))
    return out


def sweep_summary(runs: list[dict[str, dict[str, Any]]], methods: dict[str, Any], lookahead: int) -> dict[str, Any]:
    """The lookahead sweep: per ``impl:method-mode``, per lookahead (the run's own from its batch-1
    row), median speed-up over AR, bound, their ratio, acceptance and tokens per target call; and
    transformers' time per token / hsd's (:data:`VS_SWEEP`, median over the repeats) per lookahead."""
    def at(impl: str, name: str, k: int) -> str | None:
        for cand in (f"{impl}:{name}@b1/k{k}",) + ((f"{impl}:{name}@b1",) if k == lookahead else ()):
            if cand in runs[0]:
                return cand
        return None

    swept = [parse_key(k) for k in runs[0] if parse_key(k)[4] is not None]
    ks = sorted({la for *_, la in swept if la is not None} | {lookahead})
    names = sorted({f"{impl}:{m}-{mode}" for impl, m, mode, _, _ in swept})
    sweep: dict[str, Any] = {}
    for full in names:
        impl, name = full.split(":")
        for k in ks:
            c = at(impl, name, k)
            if c is not None:
                r = methods[c]
                sweep.setdefault(full, {})[k] = {f: r[f] for f in ("speedup_median", "speedup_min", "bound_median",
                                                                  "of_bound_median", "acceptance",
                                                                  "tokens_per_target_call", "ms_per_token")}
    vs: dict[int, dict[str, float]] = {}
    for k in ks:
        for ours, theirs in VS_SWEEP.items():
            a, b_ = at("hsd", ours, k), at("hf", theirs, k)
            if a is not None and b_ is not None:
                vs.setdefault(k, {})[ours] = round(statistics.median(
                    r[b_]["ms_per_token"] / r[a]["ms_per_token"] for r in runs), 3)
    return {"lookahead_sweep": sweep, "vs_transformers_by_lookahead": vs}


def table(summary: dict[str, Any]) -> str:
    cols = ("tok/s", "ms/tok", "accept", "tok/tcall", "t fwd", "d fwd", "t ms", "d ms", "speedup min/med",
            "bound med", "of bound med")
    lines = ["config | " + " | ".join(cols), "---|" + "---|" * len(cols)]
    for k, r in summary["methods"].items():
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.3f}"
        dms = "-" if r["drafter_forward_ms"] is None else f"{r['drafter_forward_ms']:.2f}"
        lines.append(f"{k} | {r['tokens_per_s']:.1f} | {r['ms_per_token']:.2f} | {acc} | {r['tokens_per_target_call']:.2f} | "
                     f"{r['target_forwards']:.0f} | {r['drafter_forwards']:.0f} | {r['target_forward_ms']:.2f} | {dms} | "
                     f"{r['speedup_min']:.2f}/{r['speedup_median']:.2f} | {r['bound_median']:.2f} | {r['of_bound_median']:.2f}")
    return "\n".join(lines)


LOSSY = ("hf:uag-sample",)
"""Samplers measured for speed that are lossy (transformers' sampled UAG as installed,
docs/auditing-transformers.md): every chart marks them, so that none reads as the fastest lossless
method."""

_COLORS = {"hsd_torch": "tab:blue", "transformers": "tab:orange", "lossy": "tab:red"}


def _kind(key: str) -> str:
    """``lossy``, ``hsd_torch`` or ``transformers``: how a method key is coloured."""
    if key.startswith(LOSSY):
        return "lossy"
    return "hsd_torch" if key.startswith("hsd") else "transformers"


def _legend(ax: Any, kinds: set[str], **where: Any) -> None:
    from matplotlib.patches import Patch

    names = {"hsd_torch": "hsd_torch (lossless)", "transformers": "transformers (lossless)",
             "lossy": "transformers' sampled UAG as installed: LOSSY"}
    ax.legend(handles=[Patch(color=_COLORS[k], label=names[k]) for k in _COLORS if k in kinds], fontsize=7, **where)


def tokens_per_s_figure(plt: Any, m: dict[str, Any], modes: Any) -> Any:
    """Batch-1 tokens/s per method and mode, bars coloured by kind (legend), lossy bars hatched
    and labelled LOSSY."""
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 5.2), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        names, vals, kinds = [], [], []
        for k, r in m.items():
            if k.endswith(f"-{mode}@b1"):  # the sweep's keys end in /kK
                kinds.append(_kind(k))
                names.append(k.replace(f"-{mode}@b1", "") + (" (LOSSY)" if kinds[-1] == "lossy" else ""))
                vals.append(r["tokens_per_s"])
        bars = ax.barh(names, vals, color=[_COLORS[k] for k in kinds])
        for b, k in zip(bars, kinds):
            if k == "lossy":
                b.set_hatch("//")
        ax.set_title(f"batch 1, {mode}: tokens/s")
        ax.set_xlabel("new tokens per second")
        ax.invert_yaxis()
        _legend(ax, set(kinds), loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    fig.tight_layout()
    return fig


def bound_figure(plt: Any, m: dict[str, Any]) -> Any:
    """Measured speed-up against its bound at batch 1, one point per method coloured by kind
    (legend); each point's name sits in a column right of the plot, in the points' order, joined
    to its point by a line, so that no two names overlap."""
    fig, ax = plt.subplots(figsize=(9, 5))
    ks = [k for k in m if k.endswith("@b1") and ":ar-" not in k]  # not the sweep's
    xs = [m[k]["bound_median"] for k in ks]
    ys = [m[k]["speedup_median"] for k in ks]
    ax.scatter(xs, ys, c=[_COLORS[_kind(k)] for k in ks], zorder=3)
    lim = max(xs + ys + [1.0]) * 1.1
    ax.plot([0, lim], [0, lim], "k--", lw=0.8)
    ax.plot([0, lim], [0, 0.9 * lim], "k:", lw=0.8)
    ax.set_xlim(0, lim)
    ax.set_ylim(0, lim)
    order = sorted(range(len(ks)), key=lambda i: -ys[i])
    for slot, i in enumerate(order):
        y_text = lim * (1 - (slot + 0.5) / max(1, len(ks)))
        name = ks[i].replace("@b1", "") + (" (LOSSY)" if _kind(ks[i]) == "lossy" else "")
        ax.annotate(name, (xs[i], ys[i]), xytext=(1.03, y_text / lim), textcoords="axes fraction", fontsize=7,
                    va="center", arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "0.5"})
    ax.set_xlabel("bound (speed-up acceptance and forward costs allow)")
    ax.set_ylabel("measured speed-up over AR")
    ax.set_title("batch 1: measured vs allowed (dashed: equal, dotted: 90 %)")
    _legend(ax, {_kind(k) for k in ks}, loc="upper left")  # above the diagonal: no point can be there
    fig.tight_layout(rect=(0.0, 0.0, 0.72, 1.0))
    return fig


def plots(summary: dict[str, Any], folder: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return []
    folder.mkdir(parents=True, exist_ok=True)
    m = summary["methods"]
    modes = summary.get("setup", {}).get("modes", MODES)
    written = []
    fig = tokens_per_s_figure(plt, m, modes)
    fig.savefig(folder / "generate_tokens_per_s.png", dpi=110)
    written.append(str(folder / "generate_tokens_per_s.png"))
    plt.close(fig)
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4.5), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for name, by_b in summary["throughput_by_batch"].items():
            if name.endswith(mode):
                bs = sorted(by_b)
                ax.plot(bs, [by_b[b] for b in bs], marker="o", label=name.rsplit("-", 1)[0])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"hsd_torch throughput by batch ({mode})")
        ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "generate_batch.png", dpi=110)
    written.append(str(folder / "generate_batch.png"))
    plt.close(fig)
    fig = bound_figure(plt, m)
    fig.savefig(folder / "generate_bound.png", dpi=110)
    written.append(str(folder / "generate_bound.png"))
    plt.close(fig)
    sweep = summary.get("lookahead_sweep")
    if sweep:
        smodes = [md for md in modes if any(n.endswith(f"-{md}") for n in sweep)]
        fig, axes = plt.subplots(1, len(smodes), figsize=(6 * len(smodes), 4.5), squeeze=False)
        for ax, mode in zip(axes[0], smodes):
            for i, (name, by_k) in enumerate(sorted((n, v) for n, v in sweep.items() if n.endswith(f"-{mode}"))):
                ks = sorted(by_k, key=int)
                color = f"C{i}"
                label = name.rsplit("-", 1)[0].replace("hsd:", "").replace("hf:", "transformers ")
                ax.plot([int(k) for k in ks], [by_k[k]["speedup_median"] for k in ks], marker="o", color=color, label=label)
                ax.plot([int(k) for k in ks], [by_k[k]["bound_median"] for k in ks], ls="--", color=color, lw=0.9)
            ax.axhline(1.0, color="k", lw=0.6)
            ax.set_xlabel("lookahead (drafter tokens a round)")
            ax.set_ylabel("speed-up over AR (solid); bound (dashed)")
            ax.set_title(f"batch 1, {mode}: speed-up vs lookahead")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(folder / "generate_lookahead.png", dpi=110)
        written.append(str(folder / "generate_lookahead.png"))
        plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="hsd_torch vs transformers and AR on bench/pair.py's pair")
    ap.add_argument("--quick", action="store_true", help="3 prompts, 24 new tokens, batches 1 and 3, 2 repeats")
    ap.add_argument("--pair", default=str(pairmod.DEFAULT_OUT),
                    help="a bench/pair.py build (built if missing), 'real' (Gemma-3-270M <- SmolLM2-135M-Instruct), "
                         "'qwen' (Qwen2.5-Coder-1.5B-Instruct <- SmolLM2-135M-Instruct; SD <- Qwen2.5-Coder-0.5B), "
                         "'real-reverse' (SmolLM2-135M-Instruct <- Gemma-3-270M) "
                         "or 'distilled' (Gemma-3-270M <- bench/distill_drafter.py's drafter)")
    ap.add_argument("--modes", default=None, help="greedy,sample[,chat] (default greedy,sample; real pair: all three)")
    ap.add_argument("--fast-pair", action="store_true", help="build a barely trained pair if missing (tests)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--b1-prompts", type=int, default=None, help="batch-1 configurations use only the first N prompts")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--lookahead", type=int, default=4)
    ap.add_argument("--methods", default=",".join(HSD_METHODS),
                    help=f"hsd's methods, of {','.join(HSD_METHODS + TREE_METHODS)}")
    ap.add_argument("--tree", default="2,2,1,1", metavar="W,W,... | dynamic:BUDGET:WIDTH:DEPTH",
                    help="the tree methods' shape: static widths per depth, or a dynamic shape (default 2,2,1,1)")
    ap.add_argument("--min-confidence", default=None, metavar="C",
                    help="the dynamic draft length of SD, SLEM and TLI (single paths): stop drafting before a later "
                         "draft whose drafter law's largest probability is below C, in (0, 1] (default: off)")
    ap.add_argument("--sweep", default=None, metavar="K,K,...",
                    help="also run the lookahead-taking methods at batch 1 at these lookaheads")
    ap.add_argument("--sweep-modes", default="greedy,sample", help="the sweep's modes (of --modes)")
    ap.add_argument("--extra-layers", type=int, default=36)
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, metavar="PATH")
    ap.add_argument("--plots", default=None, metavar="DIR", help="write PNG plots there")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.new, args.repeats = min(args.prompts, 3), min(args.new, 24), min(args.repeats, 2)
        args.batches = ",".join(sorted({str(min(int(b), args.prompts)) for b in args.batches.split(",")}, key=int))
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    real = args.pair in REAL_PAIRS
    modes = tuple((args.modes or ("greedy,sample,chat" if real else "greedy,sample")).split(","))
    if any(m not in MODES + ("chat",) for m in modes):
        ap.error(f"--modes takes greedy, sample, chat; got {args.modes!r}")
    methods = tuple(args.methods.split(","))
    if not methods or any(m not in HSD_METHODS + TREE_METHODS for m in methods) or "ar" not in methods:
        ap.error(f"--methods takes {', '.join(HSD_METHODS + TREE_METHODS)}, AR among them (the speed-ups' reference); "
                 f"got {args.methods!r}")
    from hsd_torch.commands.args import min_confidence as confidence_arg, tree_shape

    try:
        tree = tree_shape(args.tree)
    except argparse.ArgumentTypeError as e:
        ap.error(f"--tree: {e}")
    try:
        min_confidence = None if args.min_confidence is None else confidence_arg(args.min_confidence)
    except argparse.ArgumentTypeError as e:
        ap.error(f"--min-confidence: {e}")
    sweep = [int(k) for k in args.sweep.split(",")] if args.sweep else []
    sweep_modes = tuple(md for md in args.sweep_modes.split(",") if md in modes)
    if any(k < 1 for k in sweep) or (sweep and not sweep_modes):
        ap.error(f"--sweep takes lookaheads >= 1 and --sweep-modes some of {modes}; got {args.sweep!r}, {args.sweep_modes!r}")
    sweep = [k for k in sweep if k != args.lookahead]  # the run's own lookahead is in the batch-1 rows
    dtype = getattr(torch, args.dtype)
    if real:
        p, desc, prompts = load_real(dtype, args.device, args.prompts, args.pair)
        root: Path | str = args.pair
    else:
        if not (Path(args.pair) / "build.json").exists():
            print(f"no pair at {args.pair}: building it first (bench/pair.py; about 60 minutes on 2 quiet cores, "
                  "cached there for later runs; --pair real needs no build)", flush=True)
        root = pairmod.ensure_pair(args.pair, fast=args.fast_pair)
        p = pairmod.load_pair(root, extra_layers=args.extra_layers, dtype=dtype, device=args.device)
        desc = pairmod.describe(p)
        prompts = pairmod.prompts(args.prompts)
    batches = [int(b) for b in args.batches.split(",")]
    bench = Bench(p, prompts, args.new, args.lookahead, args.device, hf=not args.no_transformers)
    bench.tree = tree
    bench.min_confidence = min_confidence
    if args.b1_prompts:
        bench.b1 = min(args.b1_prompts, len(prompts))
    cfgs: list[tuple[str, str, str, int, int | None]] = [
        (*c, None) for c in configs(batches, not args.no_transformers, sd=p.get("sd_drafter") is not None,
                                    modes=modes, methods=methods)]
    cfgs += sweep_configs(sweep, not args.no_transformers, sweep_modes, methods)
    print(f"pair {root} ({json.dumps(desc)}); {len(prompts)} held-out prompts, {args.new} new tokens, "
          f"lookahead {args.lookahead}, {args.repeats} repeats, torch {torch.__version__} {args.device} {args.dtype}, "
          f"{torch.get_num_threads()} thread(s)", flush=True)
    for impl, m, mode, b, k in cfgs:  # warm-up: bridges, translators, allocator
        if impl == "hsd":
            bench.run_hsd(m, mode, b, seed=99, n=min(b, len(prompts)), new=4, k=k)
        else:
            bench.run_hf(m, mode, seed=99, n=1, new=4, k=k)
    runs: list[dict[str, dict[str, Any]]] = []
    greedy: dict[str, list[list[int]]] = {}
    for r in range(args.repeats):
        t1 = time.perf_counter()
        res: dict[str, dict[str, Any]] = {}
        order = list(cfgs)
        random.Random(r).shuffle(order)  # a new order each repeat: slow phases of a shared machine hit all alike
        for impl, m, mode, b, k in order:
            res[key(impl, m, mode, b, k)] = (bench.run_hsd(m, mode, b, seed=r, k=k) if impl == "hsd"
                                             else bench.run_hf(m, mode, seed=r, k=k))
            if r == 0 and mode == "greedy":
                greedy[key(impl, m, mode, b, k)] = bench.last_sequences
        runs.append({key(*c): res[key(*c)] for c in cfgs})
        print(f"repeat {r + 1}/{args.repeats}: {time.perf_counter() - t1:.0f} s", flush=True)
        if args.json and r + 1 < args.repeats:  # a run cut short (a device's time limit) keeps its finished repeats
            part = summarize(runs, args.lookahead)
            part["partial"] = {"repeats_done": r + 1, "repeats_asked": args.repeats}
            part.update(greedy_comparison(greedy))  # from the first repeat: a cut run keeps it too
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            save(part, args.json)
    summary = summarize(runs, args.lookahead)
    summary.update(greedy_comparison(greedy))
    summary["setup"] = {"pair": desc, "pair_kind": args.pair if real else "synthetic", "modes": list(modes),
                        "build": p["build"] if args.pair == "distilled" else
                        {k: p["build"].get(k) for k in ("build_seconds", "steps", "fast")},
                        "prompts": len(prompts), "batch1_prompts": bench.b1, "new_tokens": args.new, "lookahead": args.lookahead,
                        "methods": list(methods), "min_confidence": min_confidence,
                        "min_confidence_methods": [m for m in methods if m in DYNAMIC_LENGTH] if min_confidence else [],
                        "sweep": sweep, "sweep_modes": list(sweep_modes), "bounded_slrs": BOUNDED,
                        "repeats": args.repeats, "batches": batches, "device": args.device, "dtype": args.dtype,
                        "threads": torch.get_num_threads(), "torch": torch.__version__,
                        "transformers": __import__("transformers").__version__,
                        "wall_s": round(time.perf_counter() - t_start, 1)}
    print(table(summary))
    print("greedy outputs differing from hsd AR (prompts):", json.dumps(summary["greedy_mismatches"]))
    print("  first differing positions (prompt, position):", json.dumps(summary["greedy_divergences"]))
    print("  near ties re-decided in float32 / flipped (hsd greedy, median over repeats):",
          json.dumps({k: (r.get("near_ties"), r.get("tie_flips")) for k, r in summary["methods"].items()
                      if k.startswith("hsd:") and "-greedy@" in k}))
    print("vs_transformers (median / min over repeats):", json.dumps(summary["vs_transformers"]),
          json.dumps(summary["vs_transformers_min"]))
    print("vs transformers' UAG sampling with bench/transformers_uag_patch.py (lossless):", json.dumps(summary["vs_transformers_patched"]))
    for name, by_k in summary.get("lookahead_sweep", {}).items():
        print(f"lookahead sweep {name}: " + "; ".join(
            f"k{k} {r['speedup_median']:.2f}x (bound {r['bound_median']:.2f}, {r['tokens_per_target_call']:.2f} tok/call)"
            for k, r in sorted(by_k.items())))
    if summary.get("vs_transformers_by_lookahead"):
        print("vs transformers by lookahead:", json.dumps(summary["vs_transformers_by_lookahead"]))
    if args.plots:
        summary["plots"] = plots(summary, Path(args.plots))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        save(summary, args.json)
    print(f"total {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
