"""Conversations as prompts: a list of messages per prompt, rendered by each tokenizer's own chat
template where it has one.

- A conversation's target context is exactly ``apply_chat_template(messages,
  add_generation_prompt=True)``'s ids (one BOS, though the template writes ``<s>`` and the tokenizer
  adds one too), so greedy output is the target's own ``generate`` on those ids, for every method,
  alone and in a batch mixed with text prompts.
- The drafter reads the conversation through its own chat template (its special tokens parsed)
  where it has one, else the target's text as text; its context only shapes proposals: the law is
  the target's (greedy identity above; a sampled audit below).
- Bad conversations are refused before any forward pass, naming the prompt.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _torch_checks import own_greedy  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.auditing.first_tokens import audit_generate  # noqa: E402
from hsd_torch.methods import make  # noqa: E402
from hsd_torch.engine.prompts import check_prompts, render  # noqa: E402
from hsd_torch.engine.laws import Processing  # noqa: E402
from hsd_torch.engine.rounds import Generation  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402

torch.set_num_threads(1)
F64 = torch.float64
TARGET_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                   "{% if add_generation_prompt %}<|assistant|>{% endif %}")
DRAFTER_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                    "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def foo(x):"}]
CONV2 = [{"role": "user", "content": "naïve café?"}]
METHODS = [("ar", "none", {}), ("sd", "self", {}), ("tli", "drafter", {}), ("slem", "drafter", {}),
           ("slrs", "drafter", {"lookahead": 1}),
           ("slrs", "drafter", {"lookahead": 2, "proposal_map": "longest_prefix", "min_path_prob": 0.05})]


def _with_bos(tok: Any) -> Any:
    """A copy of ``tok`` that adds ``<s>`` before every text (as Llama's and Gemma's tokenizers do)."""
    from tokenizers.processors import TemplateProcessing

    t = copy.deepcopy(tok)
    t.backend_tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", t.bos_token_id)])
    return t


@pytest.fixture(scope="module")
def world() -> dict[str, Any]:
    tb, tu = tiny.tiny_tokenizer("byte_bpe"), tiny.tiny_tokenizer("unigram")
    tt = _with_bos(tb)
    tt.chat_template = TARGET_TEMPLATE
    dt_chat = copy.deepcopy(tu)
    dt_chat.chat_template = DRAFTER_TEMPLATE
    sd_tok = copy.deepcopy(tt)  # the SD drafter's tokenizer: the target's, template included
    return {"tt": tt, "plain_tt": tb, "dt": tu, "dt_chat": dt_chat, "sd_tok": sd_tok,
            "target": tiny.tiny_llama(tb, seed=0, dtype=F64),
            "self": tiny.tiny_llama(tb, seed=5, dtype=F64),
            "drafter": tiny.tiny_gpt2(tu, seed=1, vocab_size=len(tu) + 32, dtype=F64)}


def _chat_ids(tok: Any, conv: list[dict[str, Any]]) -> list[int]:
    out = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return [int(i) for i in ids]


def test_target_context_is_the_chat_templates_ids(world: dict[str, Any]) -> None:
    tt = world["tt"]
    ids = _chat_ids(tt, CONV)
    assert ids.count(tt.bos_token_id) == 1 and ids[0] == tt.bos_token_id  # the template's <s>, no second one
    text = TokenText(tt, len(tt))
    assert text.prefix == [tt.bos_token_id]
    rendered = render(check_prompts(CONV), tt)
    assert text.prompt_ids(rendered.target[0]) == ids
    # a text prompt without the prefix's text still gets the prefix; one that begins with it gets no second one
    assert text.prompt_ids("hi") == tt("hi")["input_ids"]
    assert text.prompt_ids("<s>hi") == tt("<s>hi", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("method,drafter,extra", METHODS, ids=[f"{m}-{d}-{len(e)}" for m, d, e in METHODS])
@pytest.mark.parametrize("drafter_template", [True, False], ids=["drafter-template", "no-drafter-template"])
def test_conversation_greedy_is_the_targets_own(world: dict[str, Any], method: str, drafter: str,
                                                extra: dict[str, Any], drafter_template: bool) -> None:
    tt = world["tt"]
    if method == "sd":
        d_model, d_tok = world["self"], world["sd_tok"] if drafter_template else world["plain_tt"]
    elif drafter == "none":
        d_model, d_tok = None, None
    else:
        d_model, d_tok = world["drafter"], world["dt_chat"] if drafter_template else world["dt"]
    prompts: list[Any] = [CONV, "x = 1\n", CONV2]
    n = 12
    got = generate(world["target"], d_model, prompts, target_tokenizer=tt, drafter_tokenizer=d_tok, method=method,
                   lookahead=extra.get("lookahead", 3), max_new_tokens=n, do_sample=False,
                   **{k: v for k, v in extra.items() if k != "lookahead"})
    want = [own_greedy(world["target"], _chat_ids(tt, CONV), n, tt.eos_token_id),
            own_greedy(world["target"], tt("x = 1\n")["input_ids"], n, tt.eos_token_id),
            own_greedy(world["target"], _chat_ids(tt, CONV2), n, tt.eos_token_id)]
    assert got.sequences == want
    alone = generate(world["target"], d_model, CONV2, target_tokenizer=tt, drafter_tokenizer=d_tok, method=method,
                     lookahead=extra.get("lookahead", 3), max_new_tokens=n, do_sample=False,
                     **{k: v for k, v in extra.items() if k != "lookahead"})
    assert alone.sequences == [want[2]]


def _generation(world: dict[str, Any], prompts: Any, dt: Any) -> Generation:
    m = make("slem", lookahead=3, greedy=True, lookbehind=None, min_path_prob=None, proposal_map=None, max_tokens=1)
    return Generation(m, world["target"], world["drafter"], render(check_prompts(prompts), world["tt"], dt),
                      world["tt"], dt, max_new_tokens=4, greedy=True, process=Processing(), d_process=Processing(),
                      seed=0, record_uniforms=False)


def test_drafter_reads_its_own_template_where_it_has_one(world: dict[str, Any]) -> None:
    dt_chat, dt = world["dt_chat"], world["dt"]
    g = _generation(world, [CONV, "plain"], dt_chat)
    assert g.d_ctx[0] == _chat_ids(dt_chat, CONV)  # its own template, its special tokens parsed
    assert dt_chat.bos_token_id in g.d_ctx[0] and g.d_start[0] == []  # <s> parsed; no prefix of its own to keep
    text = TokenText(dt_chat, len(dt_chat) + 32)
    assert g.d_ctx[1] == text.start("plain") + text.encode(b"plain", free=True)  # a text prompt: as before
    # without a template of its own, the drafter reads the target's rendering as text (no special id in it)
    g2 = _generation(world, [CONV], dt)
    t_text = render(check_prompts(CONV), world["tt"]).target[0]
    plain = TokenText(dt, len(dt) + 32)
    assert g2.d_ctx[0] == plain.start(t_text) + plain.encode(t_text.encode(), free=True)
    assert all(plain.bytes_of[i] is not None for i in g2.d_ctx[0][len(plain.start(t_text)):])
    # SLEM's re-sync keeps the drafter's template ids in front of the emitted text
    from hsd_core.methods import Resync
    from hsd_torch.engine.drafting import drafter_context_from_text

    g.emitted[0] = world["tt"]("ab", add_special_tokens=False)["input_ids"]
    drafter_context_from_text(g, [True, False], Resync())
    assert g.d_ctx[0] == _chat_ids(dt_chat, CONV) + text.encode(b"ab", free=True)


def test_sampled_law_with_the_drafters_template_is_the_targets(world: dict[str, Any]) -> None:
    """TLI with the drafter on its own template: the first two new tokens against the target's law of
    them after the chat template's ids. N = 3,000, top-k 8, alpha 1e-3; the audit states the TV it
    detects with power 0.99 (about 0.10 here)."""
    tt, dt = world["tt"], world["dt_chat"]
    n = 3000
    rows = generate(world["target"], world["drafter"], [CONV] * n, target_tokenizer=tt, drafter_tokenizer=dt,
                    method="tli", lookahead=3, max_new_tokens=2, top_k=8, seed=11).sequences
    it = iter(rows)
    rep = audit_generate(lambda _p, _s: next(it), world["target"], tt, "", n=n, top_k=8, alpha=1e-3, seed=3,
                         prompt_ids=_chat_ids(tt, CONV), max_detectable_tv=0.15)
    assert rep.detectable_tv is not None and rep.detectable_tv < 0.15
    assert rep.verdict == "lossless-consistent", rep.reason


def test_bad_conversations_are_refused(world: dict[str, Any]) -> None:
    tt, plain = world["tt"], world["plain_tt"]
    kw: dict[str, Any] = dict(target_tokenizer=tt, method="ar", max_new_tokens=2)
    with pytest.raises(ValueError, match="no chat template"):
        generate(world["target"], None, CONV, target_tokenizer=plain, method="ar", max_new_tokens=2)
    with pytest.raises(ValueError, match=r"prompt 1, message 0: a chat message needs a 'role' and a 'content'"):
        generate(world["target"], None, ["x", [{"role": "user"}]], **kw)
    with pytest.raises(TypeError, match="prompt 1 must be a str or a conversation"):
        generate(world["target"], None, ["x", 3], **kw)
    with pytest.raises(TypeError, match="prompt 0 must be a str or a conversation"):
        generate(world["target"], None, [[]], **kw)
    with pytest.raises(TypeError, match="'role' must be a str"):
        generate(world["target"], None, [{"role": 1, "content": "x"}], **kw)
    with pytest.raises(TypeError, match="empty list"):
        generate(world["target"], None, [], **kw)
    with pytest.raises(TypeError, match="got dict"):
        generate(world["target"], None, {"role": "user", "content": "x"}, **kw)
    with pytest.raises(ValueError, match="lone surrogate"):
        generate(world["target"], None, [{"role": "user", "content": "\ud800"}], **kw)
    broken = copy.deepcopy(tt)
    broken.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(ValueError, match="prompt 0: the target's chat template could not render"):
        generate(world["target"], None, CONV, target_tokenizer=broken, method="ar", max_new_tokens=2)
