"""How long the exact SD law takes: prefix dynamic programming vs brute-force enumeration.

Brute force enumerates every path of random choices of a whole generation (``Enumerator`` over
``SD.generate``); the engine (``hsd_core.exact.output_law``) enumerates each round once per
emitted prefix and merges equal prefixes. Both give the same Fractions (checked). Times are
measured in one run, so the ratio is what to read. Run: ``python bench/exact_vs_bruteforce.py``.
"""

from __future__ import annotations

import time

import hsd_core as hc
from hsd_core.rand import Enumerator, Rand

ALPH = ["a", "b", "c"]
EXTRA = ["ab", "bc", "ca", "abc", "cab"]


def world(n_extra: int) -> tuple[hc.toy.RandomModel, hc.toy.RandomModel]:
    v = hc.Vocabulary(ALPH + EXTRA[:n_extra])
    tok = hc.LongestMatchTokenizer(v)
    return hc.toy.random_model(v, tok, seed=1), hc.toy.random_model(v, tok, seed=2)


def main() -> None:
    print(f"{'|V|':>4} {'k':>2} {'N':>2} {'DP s':>8} {'brute s':>9} {'ratio':>7} {'paths':>8}")
    for n_extra, k, n in [(1, 2, 3), (1, 3, 3), (2, 2, 3), (2, 3, 3), (3, 2, 3), (2, 2, 4)]:
        target, drafter = world(n_extra)
        m = hc.methods.SD(lookahead=k)
        t0 = time.perf_counter()
        law = hc.exact.output_law(m, target, drafter, "a", n)
        t_dp = time.perf_counter() - t0
        e = Enumerator()

        def run(r: Rand) -> tuple[int, ...]:
            return tuple(m.generate(target, drafter, "a", n, r))

        t0 = time.perf_counter()
        brute = e.law(run)
        t_bf = time.perf_counter() - t0
        assert brute == law, "brute force and the engine disagree"
        print(f"{len(target.vocab):>4} {k:>2} {n:>2} {t_dp:>8.3f} {t_bf:>9.3f} {t_bf / t_dp:>7.1f} {e.paths:>8}")


if __name__ == "__main__":
    main()
