"""The tree attention of ``hsd_torch.engine.tree``: one forward over a token tree gives, at every
node, the logits of the node's path fed alone; compacted to a path, the cache continues as if the
path had been fed token by token. Checked in float64 (to 1e-9; eager to 1e-5, its softmax being float32) on tiny Llama, Qwen2, GPT-2 and
Gemma3 (sliding-window layers, contexts past the window) under ``sdpa`` and ``eager``, for a batch of
one (no mask between rounds) and of two rows with different context lengths (masked, with holes),
in one pass and in one pass per depth (the drafter's), and with the zoo's tree bugs that each breaks
it (so the check can fail)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_torch.auditing.variants import TREE_VARIANTS  # noqa: E402
from hsd_torch.engine.runner import Runner  # noqa: E402
from hsd_torch.engine.tree_cache import TreeCache, check_tree_model  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402

torch.set_num_threads(1)

# node -> (token, parent): two children of the root, two of node 1, one of node 2, one of node 4
TREE = {1: (5, 0), 2: (9, 0), 3: (17, 1), 4: (5, 1), 5: (33, 2), 6: (40, 4)}
TOL = {"sdpa": 1e-9, "eager": 1e-5}  # eager attention takes its softmax in float32 even for float64 models
CTX = [[1, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170], [1, 20, 30]]  # past Gemma's window of 8


def _models() -> dict[str, Any]:
    tok = tiny.tiny_tokenizer("byte_bpe")
    f64 = torch.float64
    return {"llama": tiny.tiny_llama(tok, seed=0, dtype=f64), "qwen2": tiny.tiny_qwen2(tok, seed=1, dtype=f64),
            "gpt2": tiny.tiny_gpt2(tok, seed=2, dtype=f64), "gemma3": tiny.tiny_gemma3(tok, seed=3, dtype=f64)}


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    return _models()


def _path(v: int) -> list[int]:
    out = []
    while v:
        out.append(TREE[v][0])
        v = TREE[v][1]
    return out[::-1]


def _alone(model: Any, ids: list[int]) -> Any:
    return model(input_ids=torch.tensor([ids])).logits[0, -1]


def _run(model: Any, rows: int, per_depth: bool, keep: int = 6) -> list[tuple[str, float]]:
    """Feed the tree to ``rows`` rows (contexts CTX[:rows]), compare every node's logits with the
    path fed alone, compact each row to the path to node ``keep`` and compare the next token's logits."""
    run = Runner(model, rows, 0, "target")
    errs: list[tuple[str, float]] = []
    with torch.inference_mode():
        # a first round of plain decoding, so the cache is not empty (and, with two rows, has padding)
        run.feed([run.sync(i, CTX[i][:-1]) for i in range(rows)], [len(CTX[i]) - 2 for i in range(rows)], None)
        run.trim()
        tc = TreeCache(run)
        pend = [run.sync(i, CTX[i]) for i in range(rows)]
        depth = {v: len(_path(v)) for v in TREE}
        if per_depth:
            got: dict[tuple[int, int], Any] = {}
            logits, at, _ = tc.feed(pend, [[] for _ in range(rows)])
            for i in range(rows):
                got[i, 0] = logits[i, at[i][0]]
            for d in (1, 2, 3):
                nodes = [[(v, t, p) for v, (t, p) in TREE.items() if depth[v] == d] for _ in range(rows)]
                logits, at, _ = tc.feed([[] for _ in range(rows)], nodes)
                for i in range(rows):
                    for v, _, _ in nodes[i]:
                        got[i, v] = logits[i, at[i][v]]
        else:
            nodes = [[(v, t, p) for v, (t, p) in TREE.items()] for _ in range(rows)]
            logits, at, _ = tc.feed(pend, nodes)
            got = {(i, v): logits[i, at[i][v]] for i in range(rows) for v in [0, *TREE]}
        for (i, v), lg in got.items():
            errs.append((f"row {i} node {v}", float((lg - _alone(model, CTX[i] + _path(v))).abs().max())))
        path = []
        v = keep
        while v:
            path.append(v)
            v = TREE[v][1]
        for i in range(rows):
            tc.compact(i, path[::-1])
        run.trim()
        nxt = [CTX[i] + _path(keep) + [77] for i in range(rows)]
        blocks = [run.sync(i, nxt[i]) for i in range(rows)]
        assert all(b == [77] for b in blocks), "the compacted cache holds the path: only the next id is fed"
        out = run.feed(blocks, [0] * rows, None)
        for i in range(rows):
            errs.append((f"row {i} after compaction", float((out[i] - _alone(model, nxt[i])).abs().max())))
    return errs


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("name", ["llama", "qwen2", "gpt2", "gemma3"])
def test_tree_pass_equals_each_path_alone(models: dict[str, Any], name: str, impl: str) -> None:
    model = models[name]
    model.set_attn_implementation(impl)
    try:
        for rows in (1, 2):
            for per_depth in (False, True):
                bad = [(w, e) for w, e in _run(model, rows, per_depth) if not e < TOL[impl]]
                assert not bad, (name, impl, rows, per_depth, bad)
    finally:
        model.set_attn_implementation("sdpa")


@pytest.mark.parametrize("variant", ["tree_siblings_see_each_other", "tree_position_off_by_one",
                                     "tree_cache_not_compacted"])
def test_each_tree_bug_breaks_the_check(models: dict[str, Any], variant: str) -> None:
    """The check above has teeth: under each of the zoo's tree bugs some node or the compacted
    cache differs from the path alone by far more than rounding."""
    v = TREE_VARIANTS[variant]
    for name in ("llama", "gemma3"):
        with v.patch():
            errs = _run(models[name], 2, False)
        assert max(e for _, e in errs) > 1e-3, (variant, name, errs)


def test_models_without_a_4d_mask_are_refused(models: dict[str, Any]) -> None:
    model = tiny.tiny_llama(tiny.tiny_tokenizer("byte_bpe"), seed=0)
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="explicit 4D attention mask"):
        check_tree_model(model, "target")
