"""Reduced precision in ``generate``: the ``dtype`` argument, greedy near ties decided in float32
from the forward's hidden state (``hsd_torch.engine._precision.NearTies``), and float16's NaN error.

The re-check is tested on constructed heads, where the bfloat16 argmax and the float32 one are known
to differ (a deterministic construction, no seed decides it), on random heads (after the re-check
the argmax is the float32 head's at every position, a property that holds for any data because the
candidates' window is far wider than bfloat16's rounding), and end to end on the tiny models in
bfloat16: it runs where it should (greedy, reduced precision, with the hidden states of the very
forward that made the logits) and nowhere else.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_torch import generate  # noqa: E402
from hsd_torch.engine._precision import NearTies, as_dtype, check_model_dtype, nan_hint  # noqa: E402


class _Head:
    """What NearTies reads of a model: an output embedding and a config."""

    def __init__(self, weight: Any, bias: Any = None, softcap: float | None = None) -> None:
        self.head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype)
        with torch.no_grad():
            self.head.weight.copy_(weight)
            if bias is not None:
                self.head.bias.copy_(bias)
        self.config = type("C", (), {"final_logit_softcapping": softcap})()

    def get_output_embeddings(self) -> Any:
        return self.head


def test_a_bf16_tie_is_decided_in_float32() -> None:
    """Ids 3 and 5 have float32 logits 20 and 20.0078 (2**-7 apart): in bfloat16 both round to 20, and
    the argmax (ties to the lowest id) is 3; the float32 re-check from the same hidden state gives 5."""
    w = torch.zeros(8, 2)
    w[3] = torch.tensor([20.0, 0.0])
    w[5] = torch.tensor([20.0, 2.0 ** -7])
    w[1] = torch.tensor([18.0, 0.0])  # within tau of the top: a candidate that stays behind
    h = torch.ones(1, 1, 2, dtype=torch.bfloat16)
    wb = w.to(torch.bfloat16)
    logits = (h @ wb.T)  # bfloat16 logits as a bfloat16 model returns them
    assert logits[0, 0, 3] == logits[0, 0, 5] and int(logits[0, 0].argmax()) == 3
    x, checked, flips = NearTies(_Head(wb)).apply(logits, h)
    assert x.dtype == torch.float32 and int(x[0, 0].argmax()) == 5
    assert checked == [1] and flips == [1]
    assert x[0, 0, 1] == 18.0 and x[0, 0, 0] == 0.0  # a far id keeps its logit


def test_softcapping_and_bias_are_applied_as_the_model_does() -> None:
    w = torch.zeros(4, 2, dtype=torch.bfloat16)
    w[1] = torch.tensor([20.0, 0.0])
    w[2] = torch.tensor([20.0, 0.0])
    bias = torch.tensor([0.0, 0.0, 0.0078125, 0.0], dtype=torch.bfloat16)
    h = torch.ones(1, 1, 2, dtype=torch.bfloat16)
    head = _Head(w, bias=bias, softcap=30.0)
    raw = h.float() @ w.float().T + bias.float()
    capped = torch.tanh(raw / 30.0) * 30.0
    logits = capped.to(torch.bfloat16)
    x, _, _ = NearTies(head).apply(logits, h)
    assert torch.equal(x[0, 0, 1:3], capped[0, 0, 1:3]) and int(x[0, 0].argmax()) == 2


@pytest.mark.parametrize("seed", [0, 1])
def test_after_the_recheck_the_argmax_is_the_float32_heads(seed: int) -> None:
    """Random bf16 hidden states and a head with near-duplicate rows (so bf16 ties are frequent): at
    every one of 2x300 positions, the re-checked argmax equals the argmax of the float32 head over the
    same hidden state (candidates within ``tau`` hold it: bf16 rounds a logit by at most 2**-9 of it,
    ``tau`` is 2**-4 of the top). The raw bf16 argmax differs from it at some positions (the check's
    teeth; 2x300 positions with 64 near-duplicate pairs make that certain in practice, and it is
    asserted)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(64, 32, generator=g)
    w = torch.cat([base, base + 2.0 ** -6 * torch.randn(64, 32, generator=g)]).to(torch.bfloat16)
    h = (3 * torch.randn(2, 300, 32, generator=g)).to(torch.bfloat16)
    logits = h @ w.T
    want = (h.float() @ w.float().T).argmax(-1)
    x, checked, flips = NearTies(_Head(w)).apply(logits, h)
    assert torch.equal(x.argmax(-1), want)
    assert not torch.equal(logits.argmax(-1), want) and sum(flips) > 0 and sum(checked) >= sum(flips)


def test_flat_rows_are_not_rechecked() -> None:
    """A row not fed this round reads zero logits: all ids tie, which is no near tie of a few ids."""
    w = torch.randn(200, 4).to(torch.bfloat16)
    x, checked, flips = NearTies(_Head(w)).apply(torch.zeros(1, 2, 200, dtype=torch.bfloat16),
                                                 torch.zeros(1, 2, 4, dtype=torch.bfloat16))
    assert checked == [0] and flips == [0] and not x.any()


# ---------------------------------------------------------------------------------------------
# generate


@pytest.fixture(scope="module")
def bf16(llama_uni: dict[str, Any], models: dict[str, Any]) -> dict[str, Any]:
    """The tiny Llama target and, as an SD drafter on its tokenizer, the tiny GPT-2 over the same
    byte-level BPE, both in bfloat16 (copies)."""
    import copy

    return dict(llama_uni, target=copy.deepcopy(llama_uni["target"]).to(torch.bfloat16),
                drafter=copy.deepcopy(models["gpt2_bpe"]).to(torch.bfloat16), dt=llama_uni["tt"])


def test_dtype_names_and_refusals(llama_uni: dict[str, Any]) -> None:
    assert as_dtype("bf16") is torch.bfloat16 and as_dtype("fp32") is torch.float32 and as_dtype(None) is None
    assert as_dtype(torch.float16) is torch.float16
    for bad in ["int8", 16, torch.int64, "bf"]:
        with pytest.raises(ValueError, match="dtype must be None"):
            as_dtype(bad)
    with pytest.raises(ValueError, match=r"the target's weights are torch.float64, not the dtype=torch.bfloat16 asked"):
        generate(llama_uni["target"], None, ["ab"], target_tokenizer=llama_uni["tt"], method="ar", dtype="bf16")
    check_model_dtype(llama_uni["target"], "target", torch.float64)  # as asked: no error


def test_greedy_bf16_rechecks_with_the_forwards_own_hidden_states(bf16: dict[str, Any], llama_uni: dict[str, Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy with a bfloat16 target passes every target forward's logits and the hidden states of
    that same forward (same rows and columns) to the re-check, and reports its counts in the stats;
    sampling, and a float64 target, never call it."""
    calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    real = NearTies.apply

    def spy(self: NearTies, logits: Any, hidden: Any) -> Any:
        calls.append((tuple(logits.shape), tuple(hidden.shape)))
        assert logits.dtype == hidden.dtype == torch.bfloat16
        # the hidden states are the head's input: the head reproduces the logits from them
        assert torch.equal(hidden @ self.weight.T, logits)
        return real(self, logits, hidden)

    monkeypatch.setattr(NearTies, "apply", spy)
    kw = dict(target_tokenizer=bf16["tt"], drafter_tokenizer=bf16["dt"], max_new_tokens=3)
    out = generate(bf16["target"], bf16["drafter"], ["def f(x):", "hello"], method="sd", lookahead=2,
                   do_sample=False, dtype="bf16", **kw)  # two rows: one may finish first (a dropped row)
    assert calls and all(lg[:2] == hd[:2] and hd[2] == bf16["target"].config.hidden_size for lg, hd in calls)
    assert len(calls) == max(s.target_calls for s in out.stats)
    assert out.near_ties is not None and out.tie_flips is not None
    assert all(0 <= f <= n for f, n in zip(out.tie_flips, out.near_ties))
    n = len(calls)
    generate(bf16["target"], None, ["def f(x):"], method="ar", do_sample=True, target_tokenizer=bf16["tt"],
             max_new_tokens=2)
    generate(llama_uni["target"], None, ["def f(x):"], method="ar", do_sample=False, target_tokenizer=bf16["tt"],
             max_new_tokens=2)
    assert len(calls) == n


def test_float16_overflow_says_to_use_bfloat16(llama_uni: dict[str, Any]) -> None:
    """A float16 model whose activations pass 65504 (here its embeddings scaled past it; Gemma's residual
    stream does so on its own) yields NaN logits: the error says float16 is the cause and what to use."""
    import copy

    model = copy.deepcopy(llama_uni["target"]).to(torch.float16)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(1e7)
    assert "torch.bfloat16 or torch.float32" in nan_hint(model) and nan_hint(llama_uni["target"]) == ""
    with pytest.raises(ValueError, match=r"NaN.*float16, whose range ends at 65504.*load it in torch.bfloat16 or "
                                         r"torch.float32"):
        generate(model, None, ["def f(x):"], target_tokenizer=llama_uni["tt"], method="ar", max_new_tokens=2)


def test_the_command_line_casts_on_load_and_refuses_a_damaged_checkpoint(
        bf16: dict[str, Any], tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``hsd generate --dtype bf16`` loads the checkpoint in bfloat16 (its greedy text is the bf16
    model's); a truncated ``model.safetensors`` is one ``error:`` line naming the file, exit status 2."""
    from hsd_torch.commands.generate import main

    folder = tmp_path / "target"
    bf16["target"].save_pretrained(folder)
    bf16["tt"].save_pretrained(folder)
    args = ["--target", str(folder), "--method", "ar", "--greedy", "--prompt", "def f(x):", "--max-new-tokens", "2"]
    assert main(args + ["--dtype", "bf16"]) == 0
    want = generate(bf16["target"], None, ["def f(x):"], target_tokenizer=bf16["tt"], method="ar", do_sample=False,
                    max_new_tokens=2).texts[0]
    assert want in capsys.readouterr().out
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error: cannot load the target" in err[0] and "model.safetensors (" in err[0]
    assert err[0].endswith(f"replace {folder} with a good copy (save_pretrained)")
