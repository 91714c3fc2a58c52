"""What the bounded SLRS procedure (proofs/slrs_bounded.md) costs and what it pays.

    .venv/bin/python bench/slrs_cost.py > /tmp/slrs_cost.md

Prints the Markdown tables of docs/slrs.md, all exact (Fractions, hsd_core only, CPU):

1. psi's drafter evaluations (distinct drafter contexts, PsiLaw.evaluations) on the built-in world
   at the first round, as the lookahead k grows: the unbounded procedure (re-tokenize, no stop;
   k <= 5, past that it is refused by the default cost guard) against the bounded ones;
2. first-position acceptance sum_t min(p, psi) (hsd_core.acceptance.closed_form_acceptance) at
   the same state, and expected emitted tokens per target call (hsd_core.exact.analyze,
   max_new_tokens 3) where that is cheap;
3. acceptance and evaluations against min_path_prob, averaged over the built-in world and 20
   induced toy worlds (target and drafter induced from one random character source, so the drafter
   approximates the target), at k = 4, for both proposal maps;
4. the same over 20 induced worlds whose target tokenizer is BPE, where the longest-prefix map
   differs from the target's own tokenization of the text.
"""

from __future__ import annotations

import time
from fractions import Fraction

from hsd_core.acceptance import closed_form_acceptance
from hsd_core.exact import analyze
from hsd_core.methods import SLRS, State
from hsd_core.models import CharSource, Model, induced_model
from hsd_core.tokenizers import BPETokenizer, LongestMatchTokenizer
from hsd_core.vocab import Vocabulary
from hsd_core.worlds import builtin_world

F = Fraction


def settings(k: int, tau: Fraction | None) -> dict[str, SLRS]:
    return {
        "retokenize": SLRS(k, min_path_prob=tau),
        "longest_prefix": SLRS(k, min_path_prob=tau, proposal_map="longest_prefix"),
    }


def induced_worlds(n: int, bpe_target: bool = False) -> list[tuple[str, Model, Model, str]]:
    out = []
    tv = Vocabulary(["a", "b", "c", "ab", "bc", "abc", "ca"])
    dv = Vocabulary(["a", "b", "c", "ca", "ab", "cab", "bb"])
    t_tok = (BPETokenizer(tv, [("b", "c"), ("c", "a"), ("a", "b"), ("ab", "c")]) if bpe_target
             else LongestMatchTokenizer(tv))
    for seed in range(n):
        src = CharSource.random(["a", "b", "c"], seed)
        t = induced_model(tv, t_tok, src)
        d = induced_model(dv, BPETokenizer(dv, [("c", "a"), ("a", "b"), ("ca", "b"), ("b", "b")]), src)
        out.append((f"induced-{seed}", t, d, "ab"[seed % 2]))
    return out


def main() -> None:
    w = builtin_world()
    st = State(w.prompt, (), 3)
    n = len(w.target.vocab)
    p = w.target.next_probs(st.target_context(w.target))

    print("## 1. psi evaluations and acceptance vs lookahead (built-in world, first round)\n")
    print("| k | unbounded evals | unbounded acc | longest_prefix (tau none) evals / acc "
          "| longest_prefix tau=1/20 evals / acc | retokenize tau=1/20 evals / acc "
          "| multi longest_prefix tau=1/20 evals | bound 1+(k-1)*20 |")
    print("|---|---|---|---|---|---|---|---|")
    for k in (1, 2, 3, 4, 5, 6, 8, 12, 16):
        cells = []
        if k <= 5:
            m = SLRS(k)
            ps = m.psi(w.target, w.drafter, st)
            cells += [str(ps.evaluations), f"{float(closed_form_acceptance(m, w.target, w.drafter, st) or 0):.4f}"]
        else:
            cells += ["refused (> 200 000 calls)", "-"]
        for m in (SLRS(k, proposal_map="longest_prefix"),
                  SLRS(k, min_path_prob=F(1, 20), proposal_map="longest_prefix"),
                  SLRS(k, min_path_prob=F(1, 20))):
            ps = m.psi(w.target, w.drafter, st)
            acc = closed_form_acceptance(m, w.target, w.drafter, st)
            cells.append(f"{ps.evaluations} / {float(acc or 0):.4f}")
        mm = SLRS(k, min_path_prob=F(1, 20), proposal_map="longest_prefix", max_tokens=None)
        cells.append(str(mm.psi(w.target, w.drafter, st).evaluations))
        cells.append(str(1 + (k - 1) * 20))
        print(f"| {k} | " + " | ".join(cells) + " |")
    del p, n

    print("\n## 2. tokens per target call (built-in world, max_new_tokens 3, exact)\n")
    print("| setting | k=2 | k=3 |")
    print("|---|---|---|")
    rows = {
        "SLRS (unbounded, re-tokenize)": lambda k: SLRS(k),
        "SLRS longest_prefix": lambda k: SLRS(k, proposal_map="longest_prefix"),
        "SLRS longest_prefix tau=1/20": lambda k: SLRS(k, min_path_prob=F(1, 20), proposal_map="longest_prefix"),
        "SLRS-multi (unbounded)": lambda k: SLRS(k, max_tokens=None),
        "SLRS-multi longest_prefix tau=1/20": lambda k: SLRS(k, max_tokens=None, min_path_prob=F(1, 20),
                                                            proposal_map="longest_prefix"),
    }
    for name, make in rows.items():
        vals = [f"{float(analyze(make(k), w.target, w.drafter, w.prompt, 3).tokens_per_call):.4f}" for k in (2, 3)]
        print(f"| {name} | " + " | ".join(vals) + " |")

    print("\n## 3. acceptance and evaluations vs min_path_prob (k = 4; mean over the built-in world "
          "and 20 induced worlds)\n")
    table3([("builtin", w.target, w.drafter, w.prompt)] + induced_worlds(20),
           (None, F(1, 100), F(1, 50), F(1, 20), F(1, 10), F(1, 5), F(1, 2), F(1)))
    print("\n## 4. the same with a BPE target (merges b+c, c+a, a+b, ab+c: the longest match of the text "
          "is often not the target's tokenization; 20 induced worlds)\n")
    table3(induced_worlds(20, bpe_target=True), (None, F(1, 20), F(1, 5), F(1)))


def table3(worlds: list[tuple[str, Model, Model, str]], taus: tuple[Fraction | None, ...]) -> None:
    print("| min_path_prob | retokenize acc | retokenize evals (max) | longest_prefix acc "
          "| longest_prefix evals (max) | bound 1+3/tau | seconds |")
    print("|---|---|---|---|---|---|---|")
    for tau in taus:
        t0 = time.perf_counter()
        acc: dict[str, float] = {"retokenize": 0.0, "longest_prefix": 0.0}
        ev: dict[str, list[int]] = {"retokenize": [], "longest_prefix": []}
        for _, t, d, prompt in worlds:
            s = State(prompt, (), 3)
            for key, m in settings(4, tau).items():
                acc[key] += float(closed_form_acceptance(m, t, d, s) or 0) / len(worlds)
                ev[key].append(m.psi(t, d, s).evaluations)
        bound = "-" if tau is None else str(1 + 3 / tau)
        row = [f"{acc['retokenize']:.4f}", f"{sum(ev['retokenize']) / len(worlds):.1f} ({max(ev['retokenize'])})",
               f"{acc['longest_prefix']:.4f}",
               f"{sum(ev['longest_prefix']) / len(worlds):.1f} ({max(ev['longest_prefix'])})",
               bound, f"{time.perf_counter() - t0:.1f}"]
        print(f"| {tau if tau is not None else 'none'} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
