"""transformers' calling conventions: ``generate(input_ids=..., attention_mask=...)`` in
place of text prompts, and ``GenerateOutput.tensors()``, the padded tensors transformers returns.

- Given ids are the target's context exactly (a left-padded batch from the tokenizer, or ids with
  special tokens inside): greedy output is the target's own ``generate`` on them for every method,
  and ``tensors()["sequences"]`` equals transformers' own output tensor for the same batch.
- Bad ids and masks are refused before any forward pass, naming the row.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _torch_checks import own_greedy  # noqa: E402
from hsd_torch import generate  # noqa: E402

torch.set_num_threads(1)
PROMPTS = ["def foo(x):\n", "Hello", "import os\nimport sys\n"]
METHODS = [("ar", {}), ("tli", {}), ("slem", {}), ("slrs", {"lookahead": 1}),
           ("slrs", {"lookahead": 2, "proposal_map": "longest_prefix", "min_path_prob": 0.05})]


@pytest.fixture(scope="module")
def batch(llama_uni: dict[str, Any]) -> dict[str, Any]:
    tt = llama_uni["tt"]
    old = tt.padding_side
    tt.padding_side = "left"
    try:
        enc = tt(PROMPTS, return_tensors="pt", padding=True)
    finally:
        tt.padding_side = old
    assert enc["attention_mask"].min() == 0  # the batch is padded
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


@pytest.mark.parametrize("method,extra", METHODS, ids=[f"{m}-{len(e)}" for m, e in METHODS])
def test_given_ids_are_the_targets_context(llama_uni: dict[str, Any], batch: dict[str, Any], method: str,
                                          extra: dict[str, Any]) -> None:
    t, tt = llama_uni["target"], llama_uni["tt"]
    n = 10
    out = generate(t, llama_uni["drafter"], target_tokenizer=tt, drafter_tokenizer=llama_uni["dt"], method=method,
                   lookahead=extra.get("lookahead", 3), max_new_tokens=n, do_sample=False,
                   input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   **{k: v for k, v in extra.items() if k != "lookahead"})
    rows = [[int(v) for v, m in zip(r, mk) if m] for r, mk in zip(batch["input_ids"].tolist(),
                                                                 batch["attention_mask"].tolist())]
    assert out.prompt_ids == rows
    assert out.sequences == [own_greedy(t, r, n, tt.eos_token_id) for r in rows]
    # ids text cannot give: a special id inside the context (the tokenizer's BOS twice, then "<s>" as text)
    special = [tt.bos_token_id, tt.bos_token_id] + tt("<s>x", add_special_tokens=False)["input_ids"]
    one = generate(t, llama_uni["drafter"], target_tokenizer=tt, drafter_tokenizer=llama_uni["dt"], method=method,
                   lookahead=extra.get("lookahead", 3), max_new_tokens=n, do_sample=False, input_ids=[special],
                   **{k: v for k, v in extra.items() if k != "lookahead"})
    assert one.prompt_ids == [special] and one.sequences == [own_greedy(t, special, n, tt.eos_token_id)]


def test_tensors_are_what_transformers_returns(llama_uni: dict[str, Any], batch: dict[str, Any]) -> None:
    t, tt = llama_uni["target"], llama_uni["tt"]
    n = 8
    out = generate(t, llama_uni["drafter"], target_tokenizer=tt, drafter_tokenizer=llama_uni["dt"], method="slem",
                   max_new_tokens=n, do_sample=False, **batch)
    pad = tt.pad_token_id
    assert out.pad_token_id == pad
    ten = out.tensors()
    with torch.inference_mode():
        want = t.generate(**batch, do_sample=False, max_new_tokens=n, pad_token_id=pad)
    if all(len(s) == n for s in out.sequences):  # transformers pads after an early EOS as tensors() does
        assert torch.equal(ten["sequences"], want)
    p = batch["input_ids"].shape[1]
    assert torch.equal(ten["sequences"][:, :p], batch["input_ids"])
    assert torch.equal(ten["attention_mask"][:, :p], batch["attention_mask"])
    for i, s in enumerate(out.sequences):
        assert ten["new_tokens"][i, :len(s)].tolist() == s and ten["attention_mask"][i, p:].sum() == len(s)
        assert set(ten["new_tokens"][i, len(s):].tolist()) <= {pad}
    # text prompts too: prompts right-aligned, the prefix included
    txt = generate(t, None, PROMPTS, target_tokenizer=tt, method="ar", max_new_tokens=3, do_sample=False).tensors(
        pad_token_id=-1)
    for i, pr in enumerate(PROMPTS):
        ids = tt(pr)["input_ids"]
        assert txt["sequences"][i, p - len(ids):p].tolist() == ids and set(txt["sequences"][i, :p - len(ids)].tolist()) <= {-1}


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(prompts="x", input_ids=[[5, 6]]), ValueError, "not both"),
    (dict(prompts="x", attention_mask=[[1, 1]]), ValueError, "attention_mask goes with input_ids"),
    (dict(input_ids=[[5, 6, 7]], attention_mask=[[1, 0, 1]]), ValueError, "row 0 has a hole"),
    (dict(input_ids=[[5, 6], [7, 8]], attention_mask=[[1, 1], [0, 0]]), ValueError, "row 1 has no id"),
    (dict(input_ids=[[5, 6]], attention_mask=[[1, 2]]), ValueError, "other than 0 and 1"),
    (dict(input_ids=[[5, 6]], attention_mask=[[1, 1, 1]]), ValueError, "shape"),
    (dict(input_ids=[[5, 10**6]]), ValueError, "row 0 has id 1000000, outside"),
    (dict(input_ids=[[-1, 5]]), ValueError, "row 0 has id -1"),
    (dict(input_ids=torch.tensor([5, 6])), TypeError, "2-D integer tensor"),
    (dict(input_ids=torch.tensor([[5.0, 6.0]])), TypeError, "2-D integer tensor"),
    (dict(input_ids=[[5, True]]), TypeError, "must hold ints"),
    (dict(input_ids=[]), TypeError, "non-empty list of lists"),
    (dict(input_ids=7), TypeError, "input_ids must be"),
])
def test_bad_ids_are_refused(llama_uni: dict[str, Any], kwargs: dict[str, Any], err: type, match: str) -> None:
    from _torch_checks import counting_forwards

    with counting_forwards(llama_uni["target"]) as forwards, pytest.raises(err, match=match):
        generate(llama_uni["target"], None, target_tokenizer=llama_uni["tt"], method="ar", max_new_tokens=2, **kwargs)
    assert forwards == [0]
