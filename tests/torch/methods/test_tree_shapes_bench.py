"""bench/tree_shapes.py's model of greedy SD-tree against hsd_torch's SD-tree itself.

The benchmark chooses static tree shapes from one greedy target run and one teacher-forced drafter
pass (the drafter's rank of each of the target's tokens): its ``tokens_per_call`` must give exactly
the number of target calls that ``hsd_torch.generate(method="sd", tree=Static(widths), do_sample=False)``
makes, for every row and shape, or the shapes it ranks are ranked on a wrong count.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import tree_shapes  # noqa: E402

from hsd_core.methods.tree import Static  # noqa: E402
from hsd_torch import generate  # noqa: E402

PROMPTS = ["def foo(x):\n", "Hello", "import os\nimport sys\n", "x", "naïve café"]


def test_tokens_per_call_by_hand() -> None:
    # widths (2, 1): round 1 keeps rank 0 (< 2) then stops at rank 1 (not < 1): 2 tokens; round 2 the
    # same; round 3 keeps the last draft and meets the path's end: 1 token
    assert tree_shapes.tokens_per_call([np.array([0, 1, 0, 5, 0])], (2, 1)) == (5 / 3, 3)
    assert tree_shapes.tokens_per_call([np.array([3, 3, 3])], (1, 1, 1)) == (1.0, 3)  # AR's count
    assert tree_shapes.tokens_per_call([np.array([0, 0, 0, 0])], (1, 1, 1)) == (4 / 1, 1)


def test_shapes_and_nodes() -> None:
    assert tree_shapes.shape_nodes((2, 2, 1)) == [1, 2, 4, 4]
    got = tree_shapes.shapes(max_depth=2, max_width=2, max_nodes=6)  # (2, 2): 6 nodes
    assert got == [(2,), (1,), (2, 2), (2, 1), (1, 1)]  # (1, 2) widens: not non-increasing


@pytest.fixture(scope="module")
def noisy_self(models: dict[str, Any]) -> Any:
    """The tiny Llama target with seeded noise on every weight: a drafter that ranks the target's
    greedy token first often but not always (the tiny GPT-2 drafter never does, the target itself always)."""
    import copy

    drafter = copy.deepcopy(models["llama_bpe"])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5 * float(p.std() if p.numel() > 1 else 0.0))
    return drafter


@pytest.mark.parametrize("widths", [(2, 1), (3, 2, 1), pytest.param((1, 1, 1), marks=pytest.mark.slow),
                                    pytest.param((2, 2, 2, 1), marks=pytest.mark.slow)])
def test_the_model_counts_hsd_torchs_target_calls(models: dict[str, Any], toks: dict[str, Any], noisy_self: Any,
                                                  widths: tuple[int, ...]) -> None:
    target, drafter, tt = models["llama_bpe"], noisy_self, toks["byte_bpe"]
    out = generate(target, drafter, PROMPTS, target_tokenizer=tt, drafter_tokenizer=tt, method="sd",
                   tree=Static(widths), max_new_tokens=12, do_sample=False)
    assert out.prompt_ids is not None
    kept = missed = 0
    for i, seq in enumerate(out.sequences):
        ctx = list(out.prompt_ids[i])
        ranks, _ = tree_shapes.drafter_ranks(drafter, ctx + seq, len(ctx))
        _, calls = tree_shapes.tokens_per_call([ranks], widths)
        assert calls == out.stats[i].target_calls, (widths, PROMPTS[i])
        kept += int(out.stats[i].accepted)
        missed += int(np.sum(ranks >= widths[0]))
    assert kept > 0 and missed > 0, "drafts were all kept or all missed: the count was not tested on both"
