"""The drafter's incremental re-sync in hsd_torch (``hsd_torch.engine.drafting.drafter_context_from_text``)
is ``hsd_core``'s rule over bytes: the same ids as the reference's over the mirror's latin-1 text,
carried across rounds by a memo that gives what a fresh computation gives."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hsd_core.methods import Resync  # noqa: E402
from hsd_core.methods.resync import ResyncMemo, drafter_context_ids  # noqa: E402
from hsd_torch.engine.drafting import drafter_context_from_text  # noqa: E402
from hsd_torch.models.mirror import CoreTokenizer, core_text  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402

TEXTS = ["def foo(x):\n    return x + 1\n", "naïve café 日本語 😀 " * 3, "aaaaaaaaaaaaaaaaaaaa", "\t\tindent\n\n  x",
         "import os\nimport sys\nprint(os.getcwd())"]
RULES = [Resync(None), Resync(1, 0), Resync(2, 0), Resync(3, 1), Resync(7, 2), Resync(64, 4)]


def text_of(tok: Any) -> TokenText:
    return TokenText.get(tok, len(tok))


@pytest.mark.parametrize("kind", ["byte_bpe", "unigram", "bpe_fallback"])
def test_rule_over_bytes_is_the_references(kind: str, toks: dict[str, Any]) -> None:
    """For every rule and text, hsd_torch's ids (bytes, ``TokenText.encode(free=True)``) are the
    reference's ids (latin-1 core text, :class:`CoreTokenizer`) mapped back. A cut after every byte
    gives another segmentation than the whole text's (the rule is not a no-op), except with the
    SentencePiece tokenizers (Unigram, BPE with byte fallback), which prepend a space to every
    encoding: no block spells its text, nothing is committed and every rule gives the whole
    text's encoding."""
    tt = text_of(toks[kind])
    core = CoreTokenizer(tt)
    differs = False
    prepends = tt.decode(tt.encode(b"x")) != b"x"
    assert prepends == (kind != "byte_bpe")
    for text in TEXTS:
        data = text.encode("utf-8")
        whole = tt.encode(data, free=True)
        for rule in RULES:
            ids = drafter_context_ids(data, lambda b: tt.encode(b, free=True), tt.decode, rule)
            ref = drafter_context_ids(core_text(text), core.encode, core.decode, rule)
            assert ids == core.to_hf(ref), (kind, text, rule)
            assert tt.decode(ids) == tt.decode(whole), "the context spells the text"
            differs |= rule == Resync(1, 0) and ids != whole
            if prepends:
                assert ids == whole
    assert differs != prepends


@pytest.mark.parametrize("rule", RULES[1:])
def test_context_across_rounds_equals_a_fresh_one(rule: Resync, toks: dict[str, Any]) -> None:
    """Rows whose emitted ids grow round by round (by 0-5 ids, one row inactive in some rounds) get
    the same drafter context from the memoized, incrementally decoded path as from the rule
    applied to the whole text afresh."""
    tt, dt = text_of(toks["bpe_fallback"]), text_of(toks["byte_bpe"])
    targets = [tt.encode(t.encode("utf-8")) for t in TEXTS[:3]]
    gen = SimpleNamespace(dt=dt, tt=tt, batch=3, d_memos=[ResyncMemo(b"") for _ in range(3)], e_text=[(0, b"")] * 3,
                          d_ctx=[[], [], []],
                          d_start=[[], [7], []], d_head=[[], [], [5, 6]], prompt_bytes=[b"p: ", b"", "é ".encode()],
                          emitted=[[], [], []])
    for r in range(12):
        active = [True, r % 3 != 1, r % 2 == 0]
        for i in range(3):
            if active[i]:
                gen.emitted[i] = targets[i][:len(gen.emitted[i]) + (r * 7 + i) % 6]
        drafter_context_from_text(gen, active, rule)  # type: ignore[arg-type]
        for i in range(3):
            if active[i]:
                text = gen.prompt_bytes[i] + tt.decode(gen.emitted[i])
                fresh = drafter_context_ids(text, lambda b: dt.encode(b, free=True), dt.decode, rule)
                assert gen.d_ctx[i] == gen.d_start[i] + gen.d_head[i] + fresh, (r, i)


def test_generate_refuses_resync_where_unused_and_bad_values(toks: dict[str, Any], models: dict[str, Any]) -> None:
    """``resync`` is SLEM's and SLRS's option: refused with TLI (naming the methods that take it),
    a value that is not a ``Resync`` is a ``TypeError``, and SLEM runs with a given rule."""
    from hsd_torch import generate

    kw = dict(target_tokenizer=toks["byte_bpe"], drafter_tokenizer=toks["unigram"], max_new_tokens=3)
    target, drafter = models["llama_bpe"], models["gpt2_uni_pad"]
    with pytest.raises(ValueError, match="resync is an option of method 'slem' or 'slrs' only"):
        generate(target, drafter, "x", method="tli", resync=Resync(8, 1), **kw)
    with pytest.raises(TypeError, match="Resync"):
        generate(target, drafter, "x", method="slem", resync=(8, 1), **kw)
    out = generate(target, drafter, "def foo(x):\n", method="slem", resync=Resync(2, 1), **kw)
    assert len(out.sequences[0]) == 3
