"""The target's law is processed only where a round reads it (``hsd_torch.kernels.LazyLaw``): the
positions up to each row's first rejection or mismatch, and the final token's, not every one of
``rows x (lookahead + 1)``; with the same tokens (bit for bit: the golden outputs, and here the
outputs with the law processed at every position, the code before, on the same seeds).

Counted by wrapping the law ``hsd_torch.verification`` computes (``space_law``): a row-round reads
at most ``accepted + 1`` positions (its accepted drafts, then the rejected one or the bonus), so
over a run the rows processed are at most ``sum(accepted) + sum(target_calls)``."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_torch import generate, kernels, verification  # noqa: E402

PROMPTS = ["def foo(x):\n", "Hello there", "for i in range(10):\n    "]


@pytest.mark.parametrize("method", ["tli", "slem"])
@pytest.mark.parametrize("sample", [True, False])
def test_the_target_law_is_processed_only_where_read(method: str, sample: bool, llama_uni: dict[str, Any],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    t, tt, d, dt = llama_uni["target"], llama_uni["tt"], llama_uni["drafter"], llama_uni["dt"]
    kw: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=dt, method=method, lookahead=4, max_new_tokens=10,
                              do_sample=sample, seed=5, top_p=0.9 if sample else None, temperature=0.8 if sample else 1.0)
    real = verification.space_law
    rows: list[int] = []

    def counted(logits: Any, *a: Any, **k: Any) -> Any:
        rows.append(logits.numel() // logits.shape[-1])
        return real(logits, *a, **k)

    monkeypatch.setattr(verification, "space_law", counted)
    out = generate(t, d, PROMPTS, **kw)
    processed = sum(rows)
    bound = sum(st.accepted + st.target_calls for st in out.stats)
    dense = sum(st.target_calls for st in out.stats) * (kw["lookahead"] + 1)
    assert processed <= bound < dense, (processed, bound, dense)

    # the same run with the whole [B, kmax + 1] processed at once (the law before): the same output
    lazy_rows = kernels.LazyLaw.rows

    def whole(self: kernels.LazyLaw, pairs: Any) -> Any:
        every = [(b, j) for b in range(self.batch) for j in range(self.positions)]
        lazy_rows(self, every)
        return lazy_rows(self, pairs)

    monkeypatch.setattr(kernels.LazyLaw, "rows", whole)
    again = generate(t, d, PROMPTS, **kw)
    assert again.sequences == out.sequences
    assert [s.accepted for s in again.stats] == [s.accepted for s in out.stats]
