"""The aimed tests' stated probability against their rate, on synthetic laws (``hsd_core.context_bugs``).

The synthetic worlds of ``tests/stats/test_audit_sequences.py`` (200 sequences of at most 32 steps,
Gamma laws over 50 ids, EOS 0.04, alpha 1e-3): each run aims a test at a named bug whose law is

* ``tilt``: ``p_t * exp(eps Z)`` renormalized, ``Z`` i.i.d. N(0, 1) per id (each law moved in its
  own direction, as a wrong context does), or
* ``mixture``: ``(1 - eps) p_t + eps g_t`` with ``g_t`` another Gamma law (heavy-tailed evidence: the
  departure puts mass where ``p_t`` has almost none),

the tokens are drawn from the bug's law, and the script compares the mean stated probability (the
report's ``context bug`` family) with the fraction of runs whose aimed test rejects at ``alpha / m``.

    python bench/aimed_power.py --json bench/aimed_power.json     # about 2 minutes
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from bench_record import save

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "stats"))

from test_audit_sequences import L, N, V, _laws  # noqa: E402

from hsd_core.seqaudit import SequenceEvidence, pit_uniforms  # noqa: E402


def run(seed: int, kind: str, eps: float) -> tuple[float, bool]:
    """One audit of tokens drawn from the bug's law: (stated probability, aimed test rejected)."""
    rng = np.random.default_rng([seed, 99])
    p, q = _laws(rng, N * L)
    other = np.random.default_rng([seed, 98])
    if kind == "tilt":
        r = p * np.exp(eps * other.standard_normal(p.shape))
        r /= r.sum(1, keepdims=True)
    else:
        r = (1 - eps) * p + eps * _laws(other, N * L)[0]
    x = np.minimum((rng.random(len(r))[:, None] > np.cumsum(r, 1)).sum(1), V - 1).reshape(N, L)
    ev = SequenceEvidence(seed=seed, drafter=True, power_steps=20, expected_steps=N * L, aimed=["bug"])
    P, Q, R = p.reshape(N, L, V), q.reshape(N, L, V), r.reshape(N, L, V)
    for i in range(N):
        ends = np.flatnonzero(x[i] == 0)
        n_i = int(ends[0]) + 1 if ends.size else L
        ev.add_steps(P[i, :n_i], x[i, :n_i], np.arange(n_i), pit_uniforms(seed, i, n_i), np.full(n_i, i),
                     q=Q[i, :n_i], aimed=[R[i, :n_i]])
    rep = ev.report(n=N, max_new_tokens=L)
    stated = {f.family: f for f in rep.families}["context bug: bug"].caught
    test = next(t for t in rep.tests if t.name == "directional (toward bug)")
    return stated, test.p_value <= rep.per_test_alpha


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--runs", type=int, default=200)
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for kind, eps in [("tilt", 0.07), ("tilt", 0.08), ("mixture", 0.002), ("mixture", 0.005), ("mixture", 0.01)]:
        res = [run(s, kind, eps) for s in range(a.runs)]
        row = {"kind": kind, "eps": eps, "runs": a.runs, "stated": float(np.mean([r[0] for r in res])),
               "caught": float(np.mean([r[1] for r in res]))}
        rows.append(row)
        print(json.dumps(row), flush=True)
    save({"sequences": N, "max_new_tokens": L, "ids": V, "rows": rows}, a.json)


if __name__ == "__main__":
    main()
