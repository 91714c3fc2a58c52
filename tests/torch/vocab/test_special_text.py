"""Special-token text in chat prompts and inside generated text.

- Generated text is text: ``TokenText.encode`` reads ``</s>`` written as ordinary bytes as text
  (it raised ``encoding 'x</s>' gave id 2, which has no text`` before), on both sides: SLEM's and
  SLRS's re-encoding for the target, a drafter's context.
- Prompts are what transformers feeds: ``TokenText.encode_prompt`` is
  ``tokenizer(prompt, add_special_tokens=False)``, special tokens parsed, so a chat template's
  special tokens are their ids in the target's context (prompts with them were refused before);
  greedy output is then the target's own ``generate`` on those ids, for every method.
"""

from __future__ import annotations

import functools

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_torch import generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.models.mirror import target_greedy  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402
generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only: the mirror's setting

torch.set_num_threads(1)
F64 = torch.float64
PROMPT = "<s>user: hi</s>\n<s>assistant:"  # the tiny tokenizers' BOS and EOS as text, a chat-like prompt
METHODS = [("ar", {}), ("sd", {}), ("tli", {}), ("slem", {}), ("slrs", {"lookahead": 1}),
           ("slrs", {"lookahead": 2, "proposal_map": "longest_prefix", "min_path_prob": 0.05})]


@pytest.fixture(scope="module")
def toks() -> dict[str, Any]:
    return {k: tiny.tiny_tokenizer(k) for k in ("byte_bpe", "unigram")}


@pytest.fixture(scope="module")
def models(toks: dict[str, Any]) -> dict[str, Any]:
    return {"target": tiny.tiny_llama(toks["byte_bpe"], seed=0, dtype=F64),
            "self": tiny.tiny_llama(toks["byte_bpe"], seed=5, dtype=F64),
            "drafter": tiny.tiny_gpt2(toks["unigram"], seed=1, vocab_size=len(toks["unigram"]) + 32, dtype=F64)}


@pytest.mark.parametrize("kind", ["byte_bpe", "unigram"])
def test_generated_text_is_text(kind: str, toks: dict[str, Any]) -> None:
    tok = toks[kind]
    text = TokenText(tok, len(tok))
    # a SentencePiece-style tokenizer (unigram) prepends its "▁" to a text it encodes (TokenText.encode's
    # rule); where its own segmentation picks a special piece ("</s>" is a top-scored piece of this Unigram
    # vocabulary), the text around the special text is encoded piece by piece, each with that "▁"
    for s in [b" x</s>", b" </s>", b" a<s>b<unk>c<pad>", b" <|im_end|></s", b" </s></s>x"]:
        ids = text.encode(s)
        got = text.decode(ids)
        assert got == s if kind == "byte_bpe" else got.replace(b" ", b"") == s.replace(b" ", b""), (s, got)
        assert all(text.bytes_of[i] is not None for i in ids), s  # no special id
    special = tok("x</s>", add_special_tokens=False)["input_ids"]
    assert tok.eos_token_id in special  # what the tokenizer itself does with it (and still does)
    assert text.encode(b"plain text") == tok("plain text", add_special_tokens=False)["input_ids"]


def test_prompts_are_what_transformers_feeds(toks: dict[str, Any]) -> None:
    tok = toks["byte_bpe"]
    text = TokenText(tok, len(tok))
    assert text.encode_prompt(PROMPT) == tok(PROMPT, add_special_tokens=False)["input_ids"]
    assert text.prompt_ids(PROMPT) == tok(PROMPT)["input_ids"]
    assert tok.eos_token_id in text.prompt_ids(PROMPT) and tok.bos_token_id in text.encode_prompt(PROMPT)
    text.vocab_size = 2  # a model narrower than the tokenizer (a private TokenText)
    with pytest.raises(ValueError, match="outside the model's 2 logit columns"):
        text.encode_prompt(PROMPT)


@pytest.mark.parametrize("method,kw", METHODS, ids=[m + str(kw.get("lookahead", "")) for m, kw in METHODS])
def test_special_tokens_in_the_prompt_greedy_is_the_targets(method: str, kw: dict[str, Any], toks: dict[str, Any],
                                                            models: dict[str, Any]) -> None:
    """A prompt holding the special tokens' text: the target's context holds their ids (as
    transformers would feed it) and every method's greedy output is the target's own."""
    tt = toks["byte_bpe"]
    drafter, dt = (models["self"], tt) if method == "sd" else (models["drafter"], toks["unigram"])
    want = target_greedy(models["target"], tt, PROMPT, 8)
    enc = tt(PROMPT, return_tensors="pt")
    assert enc.input_ids[0].tolist() == TokenText.get(tt, len(tt)).prompt_ids(PROMPT)
    out = generate(models["target"], None if method == "ar" else drafter, PROMPT, target_tokenizer=tt,
                   drafter_tokenizer=None if method == "ar" else dt, method=method, max_new_tokens=8, do_sample=False,
                   **kw)
    assert out.sequences[0] == want
