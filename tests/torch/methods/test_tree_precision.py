"""Token trees under reduced precision: the greedy contract as ``generate`` keeps it for single
paths (docs/generate.md, "Reduced precision"). Greedy with a bfloat16 target re-decides near ties in
float32 at every node of the tree pass, from that same forward's final hidden states (the head's
input: the head reproduces the logits from them), and reports the counts; a float64 target and
sampling never call the re-check."""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.methods.tree import Static  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.engine._precision import NearTies  # noqa: E402

torch.set_num_threads(1)


def test_greedy_bf16_trees_recheck_every_node_with_the_forwards_own_hidden_states(
        models: dict[str, Any], toks: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    tt = toks["byte_bpe"]
    target = copy.deepcopy(models["llama_bpe"]).to(torch.bfloat16)
    drafter = copy.deepcopy(models["gpt2_bpe"]).to(torch.bfloat16)
    calls: list[tuple[int, ...]] = []
    real = NearTies.apply

    def spy(self: NearTies, logits: Any, hidden: Any) -> Any:
        calls.append(tuple(logits.shape))
        assert logits.dtype == torch.float32 and hidden.dtype == torch.bfloat16
        assert torch.equal((hidden @ self.weight.T).float(), logits)  # the same forward's head input
        return real(self, logits, hidden)

    monkeypatch.setattr(NearTies, "apply", spy)
    shape = Static((2, 2, 1))
    kw: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=tt, method="sd", tree=shape, max_new_tokens=8)
    out = generate(target, drafter, ["def f(x):", "hello"], do_sample=False, dtype="bf16", **kw)
    # one call per active row and round, over the row's root and nodes (at most 1 + 2 + 4 + 4 of them)
    assert calls and all(c[0] == 1 and 1 <= c[1] <= 11 for c in calls)
    assert len(calls) == sum(s.target_calls for s in out.stats)
    assert out.near_ties is not None and out.tie_flips is not None
    assert all(0 <= f <= n for f, n in zip(out.tie_flips, out.near_ties))
    n = len(calls)
    generate(target, drafter, ["def f(x):"], do_sample=True, **kw)
    generate(models["llama_bpe"], models["gpt2_bpe"], ["def f(x):"], do_sample=False, **kw)
    assert len(calls) == n
