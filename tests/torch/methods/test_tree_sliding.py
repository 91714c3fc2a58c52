"""Token trees on a model with sliding-window attention layers (tiny Gemma3, window 8, float64) past
its window: the tree mask keeps, on the sliding layers, only the keys within the window of each
node's own position (positions, not cache columns: the tree's columns are not its positions).

- greedy, one prompt and a ragged batch of a short and a long prompt (9 and 47 ids, 3-9 windows
  reached): equals transformers' own greedy ``generate`` of the target;
- sampled: the mirror against ``hsd_core.methods.tree`` over ``CoreModel`` views (uncached passes
  over the full context: the models' own sliding masks) on recorded uniforms;
- eager attention (additive masks per layer type) emits what sdpa emits, greedily.
The node-by-node logit check of the tree pass on Gemma3 is in ``test_tree_cache.py``.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.methods.tree import Dynamic, Static  # noqa: E402
from hsd_core.methods.tree import SDTree as CoreSDTree  # noqa: E402
from hsd_core.methods.tree import SLEMTree as CoreSLEMTree  # noqa: E402
from hsd_core.methods.tree import TLITree as CoreTLITree  # noqa: E402
from hsd_core.rand import UniformRand  # noqa: E402
from hsd_torch import CoreModel, generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.models.mirror import core_text, target_greedy  # noqa: E402

generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only
torch.set_num_threads(1)

WINDOW = 8
SHORT = "def foo(x):\n"
LONG = "import os\nimport sys\n\nclass Foo(object):\n    def __init__(self, x):\n        self.x = x\n"  # > 2 windows
NEW = 20


@pytest.fixture(scope="module")
def world() -> dict[str, Any]:
    tt, dt = tiny.tiny_tokenizer("byte_bpe"), tiny.tiny_tokenizer("unigram")
    return {
        "tt": tt, "dt": dt,
        "target": tiny.tiny_gemma3(tt, sliding_window=WINDOW, dtype=torch.float64),
        "self": tiny.tiny_gemma3(tt, seed=3, sliding_window=WINDOW, dtype=torch.float64),
        "drafter": tiny.tiny_gemma3(dt, seed=1, sliding_window=WINDOW, dtype=torch.float64),
    }


CASES = [("sd", "self", Static((2, 2, 1))), ("tli", "drafter", Dynamic(6, 2, 3)), ("slem", "drafter", Static((2, 1, 1)))]


@pytest.mark.parametrize("method,drafter,shape", CASES, ids=[c[0] for c in CASES])
def test_greedy_trees_past_the_window_are_the_targets_own(world: dict[str, Any], method: str, drafter: str,
                                                          shape: Any) -> None:
    tt, target = world["tt"], world["target"]
    dt = tt if drafter == "self" else world["dt"]
    kw: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=dt, method=method, tree=shape,
                              max_new_tokens=NEW, do_sample=False)
    want = [target_greedy(target, tt, p, NEW) for p in (SHORT, LONG)]
    assert all(len(tt(p).input_ids) + len(w) > 3 * WINDOW for p, w in zip((SHORT, LONG), want))
    assert generate(target, world[drafter], [LONG], **kw).sequences == [want[1]]
    assert generate(target, world[drafter], [SHORT, LONG], **kw).sequences == want


@pytest.mark.parametrize("method,drafter,shape", CASES, ids=[c[0] for c in CASES])
def test_sampled_tree_mirror_past_the_window(world: dict[str, Any], method: str, drafter: str, shape: Any) -> None:
    tt, target, d = world["tt"], world["target"], world[drafter]
    dt = tt if drafter == "self" else world["dt"]
    prompts = [SHORT, LONG]
    out = generate(target, d, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method=method, tree=shape,
                   max_new_tokens=16, seed=7, record_uniforms=True)
    assert out.uniforms is not None
    ct, cd = CoreModel(target, tt), CoreModel(d, dt)
    ref = {"sd": CoreSDTree, "tli": CoreTLITree, "slem": CoreSLEMTree}[method](shape)
    for i, prompt in enumerate(prompts):
        rand = UniformRand(out.uniforms[i])
        got = ref.generate(ct, cd, core_text(prompt), 16, rng=rand)
        assert ct.tokenizer.to_hf(got) == out.sequences[i], (method, prompt)
        assert rand.used == len(out.uniforms[i])


def test_eager_attention_gives_the_same_greedy_trees(world: dict[str, Any]) -> None:
    tt, target, d = world["tt"], world["target"], world["self"]
    kw: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=tt, method="sd", tree=Static((2, 2)),
                              max_new_tokens=NEW, do_sample=False)
    want = generate(target, d, [SHORT, LONG], **kw).sequences
    for m in (target, d):
        m.set_attn_implementation("eager")
    try:
        assert generate(target, d, [SHORT, LONG], **kw).sequences == want
    finally:
        for m in (target, d):
            m.set_attn_implementation("sdpa")
