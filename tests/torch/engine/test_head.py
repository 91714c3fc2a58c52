"""The models' output heads run only where ``generate`` reads them (``hsd_torch.engine._head``):

* a batch of prompts of several lengths computes, at its prefill, one row of logits per prompt
  (not prompts x distinct lengths), and every call computes at most rows x (lookahead + 1);
* TLI's drafter computes the logits of the ids it shares with the target only, and the law it
  draws from equals the full head's processed law restricted to those ids and renormalized;
* the target's law is processed only where a round reads it (``hsd_torch.engine.kernels.LazyLaw``): the
  positions up to each row's first rejection or mismatch, and the final token's, not every one of
  ``rows x (lookahead + 1)``, with the same tokens as with the law processed at every position.

Counted through a forward hook on each model's head module (its output's rows and columns), and by
wrapping the law ``hsd_torch.engine.verification`` computes (``space_head_law``): a row-round reads at most
``accepted + 1`` positions (its accepted drafts, then the rejected one or the bonus), so over a run
the rows processed are at most ``sum(accepted) + sum(target_calls)``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_torch import generate  # noqa: E402
from hsd_torch.engine import kernels, verification  # noqa: E402
from hsd_torch.engine.laws import TextSpace, restricted_law, space_law  # noqa: E402
from hsd_torch.methods.tli import tli_columns  # noqa: E402
from hsd_torch.engine.runner import Runner  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402
from hsd_torch.vocab import VocabBridge  # noqa: E402

PROMPTS = ["def foo(x):\n", "Hi", "naïve café au lait", "for i in range(10):\n    print(i)", "x"]


@contextmanager
def head_shapes(model: Any) -> Iterator[list[tuple[int, ...]]]:
    """The shapes of every output of ``model``'s head module while the block runs."""
    shapes: list[tuple[int, ...]] = []
    h = model.get_output_embeddings().register_forward_hook(lambda _m, _a, out: shapes.append(tuple(out.shape)))
    try:
        yield shapes
    finally:
        h.remove()


@pytest.mark.parametrize("method", ["ar", "tli"])
def test_a_mixed_length_batch_computes_logits_only_where_read(method: str, llama_uni: dict[str, Any]) -> None:
    """Five prompts of five lengths: AR's prefill computes five rows of logits (before: 25, every
    row at every prompt's last column), no call of either method more than rows x (lookahead + 1)
    (TLI's first target call verifies the prompts' drafts: before, 5 rows x the union of the rows'
    read columns); and every row's greedy output is the one it has alone."""
    torch.set_num_threads(1)
    t, tt = llama_uni["target"], llama_uni["tt"]
    d, dt = (None, None) if method == "ar" else (llama_uni["drafter"], llama_uni["dt"])
    lens = {len(tt(p)["input_ids"]) for p in PROMPTS}
    assert len(lens) == len(PROMPTS)  # distinct lengths: the case that grew as rows x lengths
    k = 3
    with head_shapes(t) as shapes:
        out = generate(t, d, PROMPTS, target_tokenizer=tt, drafter_tokenizer=dt, method=method, lookahead=k,
                       max_new_tokens=4, do_sample=False)
    rows = [s[0] * s[1] for s in shapes]
    if method == "ar":
        assert rows[0] == len(PROMPTS), shapes[0]
    assert max(rows) <= len(PROMPTS) * (k + 1), shapes
    for i, p in enumerate(PROMPTS):
        alone = generate(t, d, [p], target_tokenizer=tt, drafter_tokenizer=dt, method=method, lookahead=k,
                         max_new_tokens=4, do_sample=False)
        assert alone.sequences[0] == out.sequences[i]


def test_tli_drafter_head_computes_the_shared_ids_only(llama_uni: dict[str, Any]) -> None:
    """In TLI without drafter top-k / top-p, the drafter's head module (all its ids) computes
    logits at no position (the shared ids' logits are computed from its weight rows instead:
    their shape is checked below); with top-k the whole head runs (its kept set reads every
    logit)."""
    torch.set_num_threads(1)
    t, tt, d, dt = llama_uni["target"], llama_uni["tt"], llama_uni["drafter"], llama_uni["dt"]
    vd = d.get_output_embeddings().weight.shape[0]
    kw: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=dt, method="tli", lookahead=3, max_new_tokens=6,
                              do_sample=True, seed=1)
    with head_shapes(d) as shapes:
        generate(t, d, PROMPTS[:2], drafter_temperature=0.8, **kw)
    assert shapes and all(s[1] == 0 for s in shapes), shapes
    with head_shapes(d) as shapes:
        generate(t, d, PROMPTS[:2], top_k=20, **kw)
    assert shapes and all(s[1] > 0 and s[-1] == vd for s in shapes), shapes


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_ids_law_equals_the_full_heads_restricted_law(dtype: torch.dtype, tol: float, temperature: float,
                                                             llama_uni: dict[str, Any]) -> None:
    """The drafter fed the same contexts through two runners, one computing its head on the shared
    ids only: those logits equal the full head's at those ids, and ``restricted_law`` of them equals
    the full processed law (``space_law``) restricted to the shared ids and renormalized, to float
    tolerance, at every position of two ragged rows."""
    torch.set_num_threads(1)
    tt, d0, dt = llama_uni["tt"], llama_uni["drafter"], llama_uni["dt"]
    d = d0 if dtype == torch.float64 else type(d0)(d0.config).to(dtype).eval()
    if dtype != torch.float64:
        d.load_state_dict({k: v.to(dtype) for k, v in d0.state_dict().items()})
    dev = torch.device("cpu")
    vt, vd = llama_uni["target"].get_output_embeddings().weight.shape[0], d.get_output_embeddings().weight.shape[0]
    ttext, dtext = TokenText.get(tt, vt), TokenText.get(dt, vd)
    bridge = VocabBridge(tt, dt, target_vocab_size=vt, drafter_vocab_size=vd, target_eos_id=ttext.eos_id,
                         drafter_eos_id=dtext.eos_id, device=dev)
    d_space = TextSpace.text(dtext, dev)
    space, n_draw, *_ = tli_columns(bridge, ttext, dtext, TextSpace.law(ttext, dev, keep_all=True), d_space, dev)
    assert 0 < n_draw < vd
    head = space.cols[:n_draw]
    ctx = [dt(p)["input_ids"] for p in PROMPTS[:2]]
    width = max(len(c) for c in ctx)
    starts = [0] * 2
    with torch.inference_mode():
        full = Runner(d, 2, dtext.eos_id, "drafter").feed(ctx, starts, width)
        part = Runner(d, 2, dtext.eos_id, "drafter").feed(ctx, starts, width, head)
    assert part.shape == (2, width, n_draw)
    torch.testing.assert_close(part, full[..., head], rtol=tol, atol=tol)
    q_full = space_law(full, space, ~dtext.text_mask, temperature, None, None)[..., :n_draw].double()
    q_full = q_full / q_full.sum(-1, keepdim=True)
    q_part = restricted_law(part, temperature).double()
    torch.testing.assert_close(q_part, q_full, rtol=0, atol=tol)


@pytest.mark.parametrize("method", ["tli", "slem"])
@pytest.mark.parametrize("sample", [True, False])
def test_the_target_law_is_processed_only_where_read(method: str, sample: bool, llama_uni: dict[str, Any],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    t, tt, d, dt = llama_uni["target"], llama_uni["tt"], llama_uni["drafter"], llama_uni["dt"]
    kw: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=dt, method=method, lookahead=4, max_new_tokens=10,
                              do_sample=sample, seed=5, top_p=0.9 if sample else None, temperature=0.8 if sample else 1.0)
    real = verification.space_head_law
    rows: list[int] = []

    def counted(logits: Any, *a: Any, **k: Any) -> Any:
        rows.append(logits.numel() // logits.shape[-1])
        return real(logits, *a, **k)

    monkeypatch.setattr(verification, "space_head_law", counted)
    out = generate(t, d, PROMPTS[:3], **kw)
    processed = sum(rows)
    bound = sum(st.accepted + st.target_calls for st in out.stats)
    dense = sum(st.target_calls for st in out.stats) * (kw["lookahead"] + 1)
    assert processed <= bound < dense, (processed, bound, dense)

    # the same run with the whole [B, kmax + 1] processed at once (the law before): the same output
    lazy_load = kernels.LazyLaw._load  # what rows() and draw() both read through

    def whole(self: kernels.LazyLaw, pairs: Any) -> Any:
        every = [(b, j) for b in range(self.batch) for j in range(self.positions)]
        lazy_load(self, every)
        return lazy_load(self, pairs)

    monkeypatch.setattr(kernels.LazyLaw, "_load", whole)
    again = generate(t, d, PROMPTS[:3], **kw)
    assert again.sequences == out.sequences
    assert [s.accepted for s in again.stats] == [s.accepted for s in out.stats]
