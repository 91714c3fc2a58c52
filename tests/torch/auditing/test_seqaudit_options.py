"""What ``audit_sequences`` and ``audit_generate`` take as users plug them in: one prompt-to-ids
rule shared with ``generate`` (a prompt whose text starts with the BOS's text gets no second BOS),
``prompt_ids``, length mismatches, and a drafter the sampler changes. Small runs on the tiny pair:
these are exact checks (contexts, refusals, identical reports), not statistical ones.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_torch import generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.auditing.first_tokens import audit_generate, audit_sequences  # noqa: E402
from hsd_torch.engine.prompts import target_context  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any, Any, Any]:
    return tiny.tiny_pair()


@pytest.fixture(scope="module")
def bos_world(pair: Any) -> tuple[Any, Any]:
    """The tiny target with a copy of its tokenizer that puts ``<s>`` before every text (as Gemma's
    and Llama's do)."""
    from tokenizers.processors import TemplateProcessing

    target, tt, *_ = pair
    t = copy.deepcopy(tt)
    t.backend_tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", t.bos_token_id)])
    return target, t


def _first_rows(model: Any) -> tuple[list[list[int]], Any]:
    """Records the first row of every forward pass of ``model`` (its input ids)."""
    seen: list[list[int]] = []

    def hook(_m: Any, args: Any, kwargs: Any) -> None:
        x = kwargs.get("input_ids", args[0] if args else None)
        if x is not None:
            seen.append([int(v) for v in x[0].tolist()])
    return seen, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("prompt", ["<s>Hello", "Hello", ""])
def test_generate_and_both_audits_feed_the_target_one_context(bos_world: Any, prompt: str) -> None:
    """A chat template's text starts with the BOS's text: generate feeds one BOS, and so must both
    audits (audit_generate used to feed ``tokenizer(prompt)``, a second BOS, and called hsd's own
    lossless AR "lossy" on every Gemma chat prompt). The context each audit's first forward pass
    reads is generate's ``prompt_ids``; an empty prompt starts from the BOS in all three."""
    target, tt = bos_world
    out = generate(target, None, prompt, target_tokenizer=tt, method="ar", max_new_tokens=2, seed=0)
    want = out.prompt_ids[0]
    assert want == target_context(TokenText.get(tt, target.config.vocab_size), prompt)
    assert want.count(tt.bos_token_id) == 1 and want[0] == tt.bos_token_id

    def sample(p: str, s: int) -> list[int]:
        return generate(target, None, p, target_tokenizer=tt, method="ar", max_new_tokens=2, seed=s).sequences[0]

    seen, h = _first_rows(target)
    try:
        audit_generate(sample, target, tt, prompt, n=5, positions=1, do_sample=False)
        first = seen[0][:len(want)]
        seen.clear()
        audit_sequences(sample, target, tt, prompt, n=2, max_new_tokens=2, do_sample=False)
        forced = [r for r in seen if r[:len(want)] == want]
    finally:
        h.remove()
    assert first == want
    assert forced, "the sequence audit's teacher forcing did not start from generate's context"


def test_audit_generate_passes_hsds_own_ar_on_a_bos_text_prompt(bos_world: Any) -> None:
    """The false "lossy": greedy AR audited at a prompt starting with ``<s>`` must equal the
    target's greedy output under the same context (exact point-mass check, 5 draws)."""
    target, tt = bos_world
    rep = audit_generate(lambda p, s: generate(target, None, p, target_tokenizer=tt, method="ar", max_new_tokens=3,
                                               do_sample=False).sequences[0],
                         target, tt, "<s>def foo(x):\n", n=5, positions=3, do_sample=False, max_detectable_tv=None)
    assert rep.verdict == "lossless-consistent", rep.reason


def test_prompt_ids_mean_what_they_mean_in_audit_generate(pair: Any) -> None:
    """``prompt_ids`` (one list, or one per prompt) is the target's context; without prompts the
    sampler gets each context's decoded text; the report equals the one with the prompts' own ids."""
    target, tt, *_ = pair
    plist = ["def foo(x):\n", "The quick brown"]
    ids = [target_context(TokenText.get(tt, target.config.vocab_size), p) for p in plist]
    got: list[str] = []

    def sample(p: str, s: int) -> list[int]:
        got.append(p)
        return generate(target, None, plist[[tt.decode(i) for i in ids].index(p)], target_tokenizer=tt,
                        method="ar", max_new_tokens=4, seed=s).sequences[0]

    by_ids = audit_sequences(sample, target, tt, None, n=6, max_new_tokens=4, prompt_ids=ids, context_bugs=None)
    assert set(got) == {tt.decode(i) for i in ids}
    by_text = audit_sequences(sample, target, tt, plist, n=6, max_new_tokens=4, context_bugs=None)
    assert by_ids.tests == by_text.tests and by_ids.tokens == by_text.tokens
    one = audit_sequences(sample, target, tt, None, n=2, max_new_tokens=4, prompt_ids=ids[0], context_bugs=None)
    assert one.n == 2
    with pytest.raises(ValueError, match="2 rows for 1 prompts"):
        audit_sequences(sample, target, tt, ["x"], n=2, prompt_ids=ids)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        audit_sequences(sample, target, tt, None, n=2, prompt_ids=[])


def test_length_mismatch_in_the_torch_audit(pair: Any) -> None:
    """Two tokens more than asked: an error naming it by default, the prefix audited and said with
    ``length_mismatch="prefix"``."""
    target, tt, *_ = pair

    def long(p: str, s: int) -> list[int]:
        out = generate(target, None, p, target_tokenizer=tt, method="ar", max_new_tokens=4, seed=s).sequences[0]
        return out + [5, 6]

    with pytest.raises(ValueError, match="more than max_new_tokens 4.*length_mismatch='prefix'"):
        audit_sequences(long, target, tt, "def", n=3, max_new_tokens=4)
    rep = audit_sequences(long, target, tt, "def", n=3, max_new_tokens=4, length_mismatch="prefix",
                          max_detectable_tv=None)
    assert rep.prefix_cut and "prefix only" in rep.reason and rep.verdict != "lossy"


def test_a_sampler_that_changes_the_drafter_is_refused(pair: Any) -> None:
    """transformers' sampled UAG swaps its assistant's head in place; any sampler that changes the
    drafter the directional test reads (a module replaced, a weight written) is refused, with the
    fix; a sampler given its own copy is audited."""
    target, tt, drafter, dt = pair
    d = copy.deepcopy(drafter)

    def ar(p: str, s: int) -> list[int]:
        return generate(target, None, p, target_tokenizer=tt, method="ar", max_new_tokens=3, seed=s).sequences[0]

    def swap(p: str, s: int) -> list[int]:
        d.lm_head = torch.nn.Linear(d.lm_head.in_features, 7, bias=False)
        return ar(p, s)

    with pytest.raises(ValueError, match=r"changed the drafter.*lm_head.*copy.deepcopy\(drafter\)"):
        audit_sequences(swap, target, tt, "def", n=2, max_new_tokens=3, drafter=d, drafter_tokenizer=dt)
    d2 = copy.deepcopy(drafter)

    def write(p: str, s: int) -> list[int]:
        with torch.no_grad():
            d2.transformer.wte.weight.mul_(1.0)
        return ar(p, s)

    with pytest.raises(ValueError, match="written in place"):
        audit_sequences(write, target, tt, "def", n=2, max_new_tokens=3, drafter=d2, drafter_tokenizer=dt)
    rep = audit_sequences(ar, target, tt, "def", n=2, max_new_tokens=3, drafter=drafter, drafter_tokenizer=dt,
                          max_detectable_tv=None)
    assert rep.n == 2


def test_the_drafter_head_on_the_shared_ids_gives_the_full_heads_statistics(pair: Any,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Untruncated sampling reads the drafter's law on the shared ids only, so the audit runs its
    head on those rows alone; the statistics equal the full head's (float32 rounding), and the
    shortcut is taken (checked against the full head on its first use)."""
    import numpy as np

    import hsd_torch.auditing.sequences as sq

    target, tt, drafter, dt = pair
    used: list[bool] = []
    real = sq._shared_logits

    def spy(*a: Any) -> Any:
        used.append(True)
        return real(*a)

    def ar(p: str, s: int) -> list[int]:
        return generate(target, None, p, target_tokenizer=tt, method="ar", max_new_tokens=8, seed=s).sequences[0]

    full_rows: list[int] = []
    forced = sq._forced_logits

    def forced_spy(model: Any, rows: Any, at: Any) -> Any:
        if model is drafter:
            full_rows.append(len(rows))
        return forced(model, rows, at)

    kw = dict(n=16, max_new_tokens=8, drafter=drafter, drafter_tokenizer=dt, max_detectable_tv=None)
    monkeypatch.setattr(sq, "_shared_logits", spy)
    monkeypatch.setattr(sq, "_forced_logits", forced_spy)
    fast = audit_sequences(ar, target, tt, "def foo(x):\n", **kw)
    assert used and full_rows == [1]  # the full head ran once, on one row, to check the shortcut
    monkeypatch.setattr(sq, "_shared_logits", lambda *a: None)
    full = audit_sequences(ar, target, tt, "def foo(x):\n", **kw)
    got = {t.name: t.statistic for t in fast.tests}
    want = {t.name: t.statistic for t in full.tests}
    assert got.keys() == want.keys() and "directional (toward the drafter)" in got
    assert np.allclose([got[k] for k in want], list(want.values()), rtol=1e-6, atol=1e-9), (got, want)
