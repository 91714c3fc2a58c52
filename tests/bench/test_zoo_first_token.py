"""bench/zoo.py's exact first-token TV: the first-round rules describe the variants' code.

Each rule turns the laws the rejection kernel is given at the first round into the first token's
law; the check samples the variant's own first tokens (320 draws: 20 calls of 16 rows, seeded)
and tests them against that law (Pearson chi-square, alpha 1e-3 per check). At 320 draws the
chi-square detects a departure of TV ~0.15-0.2 on the tiny pair's first-token law with high power;
the teeth below are far larger (the correct law against the sampled tokens of a variant whose
computed first-token TV is 0.9), so a rule that described the correct code instead of the variant
would be rejected.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("scipy")

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _zoo():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("zoo", BENCH / "zoo.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules["zoo"] = mod
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def test_first_token_laws_of_the_variants(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import torch

    from hsd_torch.models import tiny
    from hsd_torch.auditing.variants import VARIANTS

    zoo = _zoo()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target, tt, drafter, dt = tiny.tiny_pair()
        got = {}
        for name in ("first_draft_accepted", "q_columns_permuted", "resync_drops_token"):
            v = VARIANTS[name]
            got[name] = r = zoo.first_token_tv(v, target, drafter, zoo.PROMPTS[0], zoo.variant_kw(v, tt, dt),
                                               check_n=320)
            assert r["first_token_check_n"] == 320
            assert r["formula_vs_target_law"] < 1e-6  # the correct kernel's rule gives the target's own law
            assert r["first_token_check_impossible"] == 0 and r["first_token_check_p"] > 1e-3, (name, r)
        # the first round untouched (the drafter's context only): TV 0 up to float32 rounding (the target's
        # batched pass differs from call to call in its drafts, so its laws may differ by ~1e-7)
        assert got["resync_drops_token"]["first_token_tv"] < 1e-6
        assert got["first_draft_accepted"]["first_token_tv"] > 0.5 and got["q_columns_permuted"]["first_token_tv"] > 0.2
        # teeth: the variant's sampled first tokens against the correct law (the rule of the correct code)
        v = VARIANTS["first_draft_accepted"]
        kw = zoo.variant_kw(v, tt, dt)
        p0, q0, _ = zoo.first_round_laws(None, target, drafter, zoo.PROMPTS[0], kw, rows=16)
        _, _, firsts = zoo.first_round_laws(v, target, drafter, zoo.PROMPTS[0], kw, rows=16, seeds=range(100, 120))
        p_value, _ = zoo.law_check(zoo._standard(p0, q0), firsts)
        assert p_value is not None and p_value < 1e-6
    finally:
        torch.set_num_threads(threads)
