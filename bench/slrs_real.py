"""Is SLRS practical on real vocabularies? (docs/slrs.md, "On real tokenizer pairs")

    nice .venv/bin/python bench/slrs_real.py [--quick] > /tmp/slrs_real.md

Prints the Markdown tables of docs/slrs.md ("On real tokenizer pairs") and bench/RESULTS.md.
Models are tiny random-init GPT-2s with peaked heads (``hsd_torch.models.tiny``, float32, CPU, one
thread) over real tokenizers (``hsd_torch.models.real_tokenizers``) and the locally trained ones, so
acceptance is that of two *unrelated* random models: low, and not a forecast for trained models.
The costs (drafter rows, wall time) do not depend on training.

1. psi cost per round of the bounded procedure (``hsd_torch.slrs``, proposal map
   ``longest_prefix``) at the first state of each prompt: drafter rows (contexts evaluated, the
   root included), levels (batched forward passes) and wall time of psi alone (the tree after the
   root pass), against one drafter forward pass at the root, as the lookahead grows.
2. The paper's all-segmentations psi (definition A): the drafter contexts it needs for psi(t),
   the number of drafter-token sequences that segment a proper prefix of t's bytes (exact counts by
   dynamic programming; every byte is a drafter token here, so every prefix extends), by target
   token length; and for the whole psi vector (every target token: prefixes shared). Its time is
   estimated from the measured cost of one drafter row in a large batch.
3. Acceptance per round: SLRS (paper's one-token at lookahead 1, and bounded at lookahead 4) vs
   SLEM and TLI at lookahead 4, from ``hsd_torch.generate`` runs (sampled, temperature 1): accepted
   drafts per proposed, tokens per target call, drafter rows per round.
4. The curve over min_path_prob at lookahead 4: rows, psi time, and the exact first-position
   acceptance sum_t min(p(t), psi(t)) (from the target's own law; no sampling noise).
5. Multi-token proposals (``max_tokens=None``: every target id read off the drafted text, each
   verified against psi given the ones before) against one token per round, bounded SLRS at
   lookahead 4 and min_path_prob 0.05, on the aligned pairs: tokens per target pass, drafter rows
   and time per round. ``--multi`` runs this section alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)

from hsd_torch import generate  # noqa: E402
from hsd_torch.models import real_tokenizers, tiny  # noqa: E402
from hsd_torch.engine.laws import process_with_drop  # noqa: E402
from hsd_torch.engine.runner import Runner, logit_width  # noqa: E402
from hsd_torch.slrs import BoundedSLRS, TargetTrie, TreeCache  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402

PROMPTS = [
    "def fibonacci(n):\n    ", "import numpy as np\n\n", "The quick brown fox", "class Stack:\n    def push(self, x):\n",
    "for i in range(10):\n    print(", "Once upon a time, there was", "# compute the mean\nmean = sum(xs) /",
    "SELECT name FROM users WHERE", "Hello, world! This is", "    return self._cache[key]\n",
    "if __name__ == '__main__':\n", "def parse(text: str) -> list[str]:\n    \"\"\"",
]

HEAD_STD = 6.0  # a peaked random head: the drafter's top token carries a real share of the mass


def tokenizer(name: str) -> Any:
    if name in ("byte_bpe", "unigram", "bpe_fallback"):
        return tiny.tiny_tokenizer(name)
    return real_tokenizers.load(name)


def model(tok: Any, seed: int) -> Any:
    width = max(len(tok), max(tok.get_vocab().values()) + 1)  # o200k: ids up to 200018, len() says 200000
    return tiny.tiny_gpt2(tok, seed=seed, head_std=HEAD_STD, vocab_size=width)


def align(target: Any, ttok: Any, drafter: Any, dtok: Any, seed: int, std: float = 4.0) -> None:
    """Make a synthetic *aligned* pair (in place): both heads get a large context-free bias, the
    target's random (std ``std``), the drafter's equal to the target's on ids whose bytes are a
    target token's and far below it elsewhere; the random head weights are scaled by 0.1 (some
    context dependence stays). The drafter then approximates the target's law through shared
    strings, which unrelated random models never do. Not a trained pair: a stand-in that shows how
    the methods rank when the drafter is good."""
    tt = TokenText.get(ttok, logit_width(target))
    dt = TokenText.get(dtok, logit_width(drafter))
    g = torch.Generator().manual_seed(seed)
    bias_t = torch.randn(tt.vocab_size, generator=g) * std
    low = float(bias_t.min()) - 10.0
    t_of = {}
    for i, b in enumerate(tt.bytes_of):
        if b is not None and b not in t_of:
            t_of[b] = i
    bias_d = torch.full((dt.vocab_size,), low)
    for i, b in enumerate(dt.bytes_of):
        if b is not None and b in t_of:
            bias_d[i] = bias_t[t_of[b]]
    for m, bias in ((target, bias_t), (drafter, bias_d)):
        head = m.get_output_embeddings()
        new = torch.nn.Linear(head.weight.shape[1], head.weight.shape[0], bias=True)
        with torch.no_grad():
            new.weight.copy_(head.weight * 0.1)
            new.bias.copy_(bias)
        new.requires_grad_(False)
        m.set_output_embeddings(new)


def timed_round(target_tok: Any, tvs: int, drafter: Any, dtok: Any, prompt: str, k: int,
                tau: float | None, repeats: int = 3) -> tuple[float, float, int, int, torch.Tensor]:
    """(root ms, psi ms, rows, levels, psi) of the first bounded round for one prompt (times: the
    minimum over ``repeats`` runs)."""
    runs = [_timed_round(target_tok, tvs, drafter, dtok, prompt, k, tau) for _ in range(repeats)]
    return (min(r[0] for r in runs), min(r[1] for r in runs)) + runs[0][2:]  # type: ignore[return-value]


def _timed_round(target_tok: Any, tvs: int, drafter: Any, dtok: Any, prompt: str, k: int,
                 tau: float | None) -> tuple[float, float, int, int, torch.Tensor]:
    tt = TokenText.get(target_tok, tvs)
    dt = TokenText.get(dtok, logit_width(drafter))
    dev = torch.device("cpu")
    b = BoundedSLRS(tt, dt, k, tau, False, dev)
    ctx = dt.start(prompt) + dt.encode(prompt.encode("utf-8"))
    drop = ~dt.text_mask

    def probs(x: torch.Tensor) -> torch.Tensor:
        return process_with_drop(x, drop, 1.0, None, None)

    with torch.inference_mode():
        runner = Runner(drafter, 1, dt.eos_id, "drafter", window=True, n_prefix=[len(dt.start(prompt))])
        blocks = [runner.sync(0, ctx[:-1])]
        runner.feed(blocks, [len(blocks[0]) - 1], 1)  # prefill all but the last id (not timed)
        t0 = time.perf_counter()
        blocks = [runner.sync(0, ctx)]
        root = probs(runner.feed(blocks, [len(blocks[0]) - 1], 1)[:, 0])
        t1 = time.perf_counter()
        tree = TreeCache(runner, [0], [ctx], k)
        res = b.round(root, [[0.5] * k], lambda p, t, r: probs(tree.extend(p, t, r)))
        t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, res.evaluations[0], res.levels, res.psi[0]


def target_law(target: Any, ttok: Any, prompt: str) -> torch.Tensor:
    tt = TokenText.get(ttok, logit_width(target))
    ids = tt.prompt_ids(prompt)
    with torch.inference_mode():
        return process_with_drop(target(torch.tensor([ids])).logits[0, -1], ~tt.text_mask, 1.0, None, None).double()


def seg_counts(ttok: Any, tvs: int, dtok: Any, dvs: int, max_len: int) -> tuple[dict[int, list[int]], int]:
    """Per target token byte length L (<= max_len): the all-segmentations psi(t) context counts of
    its tokens; and the whole-vocabulary count (distinct drafter contexts over every target token)."""
    tt = TokenText.get(ttok, tvs)
    dt = TokenText.get(dtok, dvs)
    dset = {b for b in dt.bytes_of if b is not None}
    dmax = max(len(b) for b in dset)
    trie = TargetTrie.get(tt, torch.device("cpu"))
    del trie
    seg: dict[bytes, int] = {b"": 1}

    def count(x: bytes) -> int:
        hit = seg.get(x)
        if hit is not None:
            return hit
        n = 0
        for j in range(1, min(len(x), dmax) + 1):
            if x[-j:] in dset:
                n += count(x[:-j])
        seg[x] = n
        return n

    by_len: dict[int, list[int]] = {}
    prefixes: set[bytes] = set()
    for b in tt.bytes_of:
        if b is None:
            continue
        for i in range(len(b)):
            prefixes.add(b[:i])
        if len(b) <= max_len:
            by_len.setdefault(len(b), []).append(sum(count(b[:i]) for i in range(len(b))))
    sys.setrecursionlimit(10000)
    total = sum(count(p) for p in sorted(prefixes, key=len))
    return by_len, total


def row_cost_ms(drafter: Any, batch: int = 512) -> float:
    """ms per drafter row: one new token for ``batch`` rows over a 16-token cached context."""
    from transformers import DynamicCache

    with torch.inference_mode():
        cache = DynamicCache(config=drafter.config)
        ids = torch.randint(0, 200, (batch, 16))
        drafter(input_ids=ids, cache=cache, use_cache=True)
        best = float("inf")
        for _ in range(3):
            c2 = DynamicCache(config=drafter.config)
            for li, layer in enumerate(cache.layers):
                c2.layers[li].update(layer.keys.clone(), layer.values.clone())  # type: ignore[union-attr]
            t0 = time.perf_counter()
            drafter(input_ids=torch.randint(0, 200, (batch, 1)), cache=c2, use_cache=True,
                    position_ids=torch.full((batch, 1), 16))
            best = min(best, time.perf_counter() - t0)
    return best * 1e3 / batch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer prompts and pairs (a smoke run)")
    ap.add_argument("--multi", action="store_true", help="section 5 only (multi-token proposals)")
    ap.add_argument("--prompts", type=int, default=None, metavar="N", help="the first N prompts only")
    args = ap.parse_args()
    prompts = PROMPTS[:4] if args.quick else PROMPTS
    if args.prompts is not None:
        prompts = prompts[:args.prompts]
    pairs = [("qwen", "gpt2"), ("gpt2", "llama"), ("o200k", "cl100k"), ("byte_bpe", "unigram")]
    if args.quick:
        pairs = pairs[-1:] + pairs[:1]
    toks: dict[str, Any] = {}
    mods: dict[str, Any] = {}
    for i, (a, b) in enumerate(pairs):
        for name, seed in ((a, 10 + i), (b, 20 + i)):
            if name not in toks:
                toks[name] = tokenizer(name)
        mods[f"t:{a}:{i}"] = model(toks[a], 10 + i)
        mods[f"d:{b}:{i}"] = model(toks[b], 20 + i)
    print(f"tiny GPT-2 (2 layers, d=64, random init, head_std {HEAD_STD}), float32, 1 thread; {len(prompts)} prompts; "
          f"torch {torch.__version__}\n")
    if args.multi:
        multi_section(pairs, toks, prompts)
        return

    print("## 1. psi cost per round (bounded, longest_prefix, min_path_prob 0.05; first state of each prompt)\n")
    print("| pair (target <- drafter) | k | rows mean / max | levels max | root pass ms | psi ms (median / max) "
          "| psi / root pass | bound 1+(k-1)/tau |")
    print("|---|---|---|---|---|---|---|---|")
    tau = 0.05
    for i, (a, b) in enumerate(pairs):
        t, d = mods[f"t:{a}:{i}"], mods[f"d:{b}:{i}"]
        tvs = logit_width(t)
        for k in (1, 2, 4, 8):
            roots, psis, rows, levels = [], [], [], []
            for p in prompts:
                r_ms, p_ms, n, lv, _ = timed_round(toks[a], tvs, d, toks[b], p, k, tau)
                roots.append(r_ms)
                psis.append(p_ms)
                rows.append(n)
                levels.append(lv)
            print(f"| {a} <- {b} | {k} | {statistics.mean(rows):.1f} / {max(rows)} | {max(levels)} "
                  f"| {statistics.median(roots):.1f} | {statistics.median(psis):.1f} / {max(psis):.1f} "
                  f"| {statistics.median(psis) / statistics.median(roots):.1f} | {1 + (k - 1) / tau:.0f} |")

    print("\n## 2. the paper's all-segmentations psi: drafter contexts by target token length\n")
    print("Contexts for psi(t) = sum over proper prefixes x of t of the number of drafter segmentations of x "
          "(exact; every byte is a drafter token). 'whole psi' = distinct contexts for every target token at once. "
          "Time: contexts x the measured ms per row of a 512-row batched drafter step (an estimate, not run).\n")
    lens = (1, 2, 3, 4, 6, 8, 10, 12, 16)
    print("| pair | " + " | ".join(f"L={n}" for n in lens) + " | whole psi | est. time whole psi | ms / row |")
    print("|---|" + "---|" * (len(lens) + 3))
    for i, (a, b) in enumerate(pairs):
        t, d = mods[f"t:{a}:{i}"], mods[f"d:{b}:{i}"]
        by_len, total = seg_counts(toks[a], logit_width(t), toks[b], logit_width(d), max(lens))
        per_row = row_cost_ms(d)
        cells = []
        for n in lens:
            v = by_len.get(n)
            cells.append(f"{statistics.mean(v):.3g} (max {max(v):.3g})" if v else "-")
        print(f"| {a} <- {b} | " + " | ".join(cells) + f" | {total:.3g} | {total * per_row / 1e3:.3g} s "
              f"| {per_row:.3f} |")

    print("\n## 3. acceptance per round: SLRS vs SLEM vs TLI (generate, sampled, 32 new tokens per prompt)\n")
    print("'random': the unrelated random models above. 'aligned': the same models with the synthetic aligned "
          "heads of align() (drafter law = target law through shared strings, plus 0.1 x the random heads).\n")
    print("| pair | models | method | lookahead | accepted / proposed | tokens / target call | drafter rows / round "
          "| ms / round |")
    print("|---|---|---|---|---|---|---|---|")
    cases = [(i, a, b, "random") for i, (a, b) in enumerate(pairs)] + \
        [(i, a, b, "aligned") for i, (a, b) in enumerate(pairs)]
    for i, a, b, kind in cases:
        t, d = mods[f"t:{a}:{i}"], mods[f"d:{b}:{i}"]
        if kind == "aligned":
            t, d = model(toks[a], 10 + i), model(toks[b], 20 + i)
            align(t, toks[a], d, toks[b], seed=i)
            mods[f"ta:{a}:{i}"], mods[f"da:{b}:{i}"] = t, d
        runs: list[tuple[str, int, dict[str, Any]]] = [
            ("slrs (paper, one token)", 1, {"method": "slrs"}),
            ("slrs bounded tau=0.05", 4, {"method": "slrs", "min_path_prob": 0.05, "proposal_map": "longest_prefix"}),
            ("slem", 4, {"method": "slem"}),
            ("tli", 4, {"method": "tli"}),
        ]
        for name, k, kw in runs:
            out = generate(t, d, prompts, target_tokenizer=toks[a], drafter_tokenizer=toks[b], lookahead=k,
                           max_new_tokens=32, seed=1, **kw)
            acc = sum(s.accepted for s in out.stats)
            prop = sum(s.proposed for s in out.stats)
            calls = sum(s.target_calls for s in out.stats)
            new = sum(s.new_tokens for s in out.stats)
            rows = sum(s.drafter_positions for s in out.stats)
            wall = out.stats[0].wall_time
            print(f"| {a} <- {b} | {kind} | {name} | {k} | {acc / max(prop, 1):.3f} ({acc}/{prop}) | {new / calls:.3f} "
                  f"| {rows / calls:.1f} | {wall * 1e3 / max(calls / len(prompts), 1):.1f} |")

    print("\n## 4. cost against acceptance over min_path_prob (lookahead 4; exact first-position acceptance)\n")
    print("| pair | models | min_path_prob | rows mean / max | psi ms median | acceptance sum min(p, psi) |")
    print("|---|---|---|---|---|---|")
    for i, a, b, kind in cases:
        t, d = (mods[f"t:{a}:{i}"], mods[f"d:{b}:{i}"]) if kind == "random" else \
            (mods[f"ta:{a}:{i}"], mods[f"da:{b}:{i}"])
        tvs = logit_width(t)
        laws = [target_law(t, toks[a], p) for p in prompts]
        for tau_ in (1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01):
            rows, psis, accs = [], [], []
            for p, law in zip(prompts, laws):
                _, p_ms, n, _, psi = timed_round(toks[a], tvs, d, toks[b], p, 4, tau_)
                rows.append(n)
                psis.append(p_ms)
                accs.append(float(torch.minimum(law, psi).sum()))
            print(f"| {a} <- {b} | {kind} | {tau_} | {statistics.mean(rows):.1f} / {max(rows)} | {statistics.median(psis):.1f} "
                  f"| {statistics.mean(accs):.4f} |")
    multi_section(pairs, toks, prompts)


def multi_section(pairs: list[tuple[str, str]], toks: dict[str, Any], prompts: list[str]) -> None:
    """Section 5: bounded SLRS (lookahead 4, min_path_prob 0.05) with max_tokens=None vs 1 on the
    aligned pairs (the models of section 3's 'aligned' rows, rebuilt with the same seeds)."""
    print("\n## 5. multi-token proposals: max_tokens=None vs 1 (bounded, lookahead 4, min_path_prob 0.05, "
          "aligned models, 32 new tokens per prompt)\n")
    print("| pair | max_tokens | proposed / round | accepted / proposed | tokens / target call "
          "| drafter rows / round | ms / round |")
    print("|---|---|---|---|---|---|---|")
    for i, (a, b) in enumerate(pairs):
        t, d = model(toks[a], 10 + i), model(toks[b], 20 + i)
        align(t, toks[a], d, toks[b], seed=i)
        for mt in (1, None):
            out = generate(t, d, prompts, target_tokenizer=toks[a], drafter_tokenizer=toks[b], method="slrs",
                           lookahead=4, min_path_prob=0.05, proposal_map="longest_prefix", max_tokens=mt,
                           max_new_tokens=32, seed=1)
            acc = sum(s.accepted for s in out.stats)
            prop = sum(s.proposed for s in out.stats)
            calls = sum(s.target_calls for s in out.stats)
            new = sum(s.new_tokens for s in out.stats)
            rows = sum(s.drafter_positions for s in out.stats)
            wall = out.stats[0].wall_time
            print(f"| {a} <- {b} | {mt} | {prop / calls:.2f} | {acc / max(prop, 1):.3f} ({acc}/{prop}) "
                  f"| {new / calls:.3f} | {rows / calls:.1f} | {wall * 1e3 / max(calls / len(prompts), 1):.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
