"""Token trees on the real pair (Gemma-3-270m with its sliding-window layers, SmolLM2-135M), greedy:
every tree method equals the target's own ``generate(do_sample=False)`` (Gemma as the target: SD-tree
drafting for itself, TLI-tree and SLEM-tree with SmolLM2 as the drafter). Slow tier (about 45 s with
the models converted); skipped when their packages are missing, failed instead under
``HSD_REQUIRE_REAL_MODELS=1`` (as ``tests/torch/models/test_real_models.py``)."""

from __future__ import annotations

import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.methods.tree import Dynamic, Static  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.models import real as rm  # noqa: E402
from hsd_torch.models.mirror import target_greedy  # noqa: E402

PAIR = ["gemma-3-270m", "smollm2-135m-instruct"]


@pytest.fixture(scope="module")
def pair() -> dict[str, tuple[Any, Any]]:
    for name in PAIR:
        if name not in rm.available():
            msg = f"{name}'s package is not installed (README, 'Real models')"
            if os.environ.get("HSD_REQUIRE_REAL_MODELS") == "1":
                pytest.fail(msg + " and HSD_REQUIRE_REAL_MODELS=1")
            pytest.skip(msg)
    return {name: rm.load(name) for name in PAIR}


@pytest.mark.slow
@pytest.mark.parametrize("method,shape", [("sd", Static((2, 2, 1))), ("tli", Dynamic(6, 2, 3)),
                                          ("slem", Static((2, 1, 1)))], ids=["sd", "tli", "slem"])
def test_greedy_trees_on_gemma_are_its_own_generate(pair: dict[str, tuple[Any, Any]], method: str, shape: Any) -> None:
    torch.set_num_threads(1)
    g, gt = pair["gemma-3-270m"]
    d, dt = (g, gt) if method == "sd" else pair["smollm2-135m-instruct"]
    prompt = "def fibonacci(n):\n    "
    want = target_greedy(g, gt, prompt, 24, mask_textless=False)
    out = generate(g, d, [prompt], target_tokenizer=gt, drafter_tokenizer=dt, method=method, tree=shape,
                   max_new_tokens=24, do_sample=False)
    assert out.sequences[0] == want
    assert out.stats[0].accepted > 0
