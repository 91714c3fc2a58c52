"""Every bad input of ``generate`` and ``audit_generate`` is a clear
error before any work starts, and two inputs that used to give silently wrong results no longer do.

- **Silent wrong results**: a submodule left in training mode (only the top module was checked);
  a tokenizer changed in place after hsd had used it (its cached special prefix and first-target
  map were kept: the caches were keyed on the object alone); temperatures that are not finite or
  underflow float32 (``inf`` alone became the uniform law); options of one method passed to
  another (``method="tli", proposal_map="junk"`` ran).
- **Raw errors** turned into ``TypeError`` / ``ValueError`` naming the argument, before any forward
  pass (counted by a global forward pre-hook, so the models themselves are not touched): missing
  models or tokenizers, a raw ``tokenizers.Tokenizer``, models on the meta device or split over
  devices, numpy integers (now accepted wherever an int is asked; bool refused), a prompt with a
  lone surrogate; and ``audit_generate``'s ``top_p``, empty prompt and malformed sampler outputs.

Tiny float64 models of ``conftest.py``, a few new tokens per call: the file runs in seconds.
"""

from __future__ import annotations

import functools

import copy
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _torch_checks import counting_forwards  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.auditing.first_tokens import audit_generate  # noqa: E402
generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only: the mirror's setting

torch.set_num_threads(1)

PROMPTS = ["Hello", "def foo(x):\n"]


@contextmanager
def no_forward_pass(*mods: Any) -> Iterator[None]:
    """Fails if any of ``mods`` runs a forward pass inside the block."""
    with counting_forwards(*mods) as count:
        yield
    assert count[0] == 0, f"{count[0]} forward passes before the refusal"


@pytest.fixture(scope="module")
def pair(toks: dict[str, Any], models: dict[str, Any]) -> dict[str, Any]:
    """A tiny Llama target (byte-level BPE) and a tiny GPT-2 drafter (Unigram, padded embedding)."""
    return {"target": models["llama_bpe"], "drafter": models["gpt2_uni_pad"], "target_tokenizer": toks["byte_bpe"],
            "drafter_tokenizer": toks["unigram"]}


def run(pair: dict[str, Any], prompts: Any = "x", *, target: Any = "pair", drafter: Any = "pair",
        **kw: Any) -> Any:
    """``generate`` on the pair, with any argument replaced."""
    kw.setdefault("target_tokenizer", pair["target_tokenizer"])
    kw.setdefault("drafter_tokenizer", pair["drafter_tokenizer"])
    kw.setdefault("max_new_tokens", 2)
    return generate(pair["target"] if target == "pair" else target, pair["drafter"] if drafter == "pair" else drafter,
                    prompts, **kw)


def refused(pair: dict[str, Any], error: type[Exception], match: str, prompts: Any = "x", **kw: Any) -> str:
    """``generate`` refuses with ``error`` matching ``match``, before any forward pass."""
    with no_forward_pass(pair["target"], pair["drafter"]), pytest.raises(error, match=match) as info:
        run(pair, prompts, **kw)
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# silent wrong results


@pytest.mark.parametrize("role,path", [("target", "model.layers.0"), ("drafter", "transformer.h.1.attn")])
def test_a_submodule_in_training_mode_is_refused(role: str, path: str, pair: dict[str, Any]) -> None:
    """One block back in ``.train()`` (the GPT-2 drafter's dropout is 0.1: its law would be random);
    the refusal names the module, and the mode is left as it was."""
    sub = pair[role].get_submodule(path)
    sub.train()
    try:
        refused(pair, ValueError, f"the {role}'s module '{re.escape(path)}' is in training mode")
        assert sub.training and not pair[role].training
        if role == "target":
            with pytest.raises(ValueError, match=f"the target's module '{re.escape(path)}' is in training mode"):
                audit_generate(lambda p, s: [0], pair["target"], pair["target_tokenizer"], "x", n=10)
    finally:
        sub.eval()


def test_modules_whose_forward_ignores_the_mode_may_be_in_training_mode(pair: dict[str, Any]) -> None:
    """A head replaced by a fresh ``nn.Linear`` (created in training mode) changes nothing and is
    accepted; a fresh ``nn.Dropout`` is refused by name; the whole model in training mode is named
    as the model."""
    tt = pair["target_tokenizer"]
    model = tiny.tiny_gpt2(tt, seed=9, dtype=torch.float64)
    want = generate(model, None, PROMPTS, target_tokenizer=tt, method="ar", max_new_tokens=3, seed=1).sequences
    head = model.get_output_embeddings()
    fresh = torch.nn.Linear(head.in_features, head.out_features, bias=False, dtype=torch.float64)
    fresh.weight.data.copy_(head.weight.data)
    model.set_output_embeddings(fresh)
    assert fresh.training and not model.training
    assert generate(model, None, PROMPTS, target_tokenizer=tt, method="ar", max_new_tokens=3, seed=1).sequences == want
    model.transformer.drop = torch.nn.Dropout(0.5)
    with pytest.raises(ValueError, match="the target's module 'transformer.drop' is in training mode"):
        generate(model, None, PROMPTS, target_tokenizer=tt, method="ar", max_new_tokens=3)
    model.train()
    with pytest.raises(ValueError, match="the target is in training mode"):
        generate(model, None, PROMPTS, target_tokenizer=tt, method="ar", max_new_tokens=3)


def _with_bos(tok: Any) -> Any:
    from tokenizers.processors import TemplateProcessing

    tok.backend_tokenizer.post_processor = TemplateProcessing(single="<s> $A",
                                                              special_tokens=[("<s>", tok.bos_token_id)])
    return tok


def test_a_target_tokenizer_changed_in_place_is_read_again(pair: dict[str, Any]) -> None:
    """A BOS post-processor added to a target tokenizer that hsd has used: the output equals that of a
    fresh object with the same state (it used to keep conditioning on the old, empty prefix)."""
    tok = copy.deepcopy(pair["target_tokenizer"])
    kw: dict[str, Any] = dict(method="ar", max_new_tokens=4, do_sample=False, drafter=None, drafter_tokenizer=None)
    before = run(pair, PROMPTS, target_tokenizer=tok, **kw).sequences
    _with_bos(tok)
    changed = run(pair, PROMPTS, target_tokenizer=tok, **kw).sequences
    fresh = run(pair, PROMPTS, target_tokenizer=_with_bos(copy.deepcopy(pair["target_tokenizer"])), **kw).sequences
    assert fresh != before  # the BOS changes the greedy output: the test can fail
    assert changed == fresh


def test_a_drafter_tokenizer_changed_in_place_is_read_again(pair: dict[str, Any]) -> None:
    """The same for the drafter's tokenizer (SLEM, sampled): ids, statistics and uniforms."""
    tok = copy.deepcopy(pair["drafter_tokenizer"])
    kw: dict[str, Any] = dict(method="slem", max_new_tokens=6, seed=3, record_uniforms=True)
    before = run(pair, PROMPTS, drafter_tokenizer=tok, **kw)
    _with_bos(tok)
    changed = run(pair, PROMPTS, drafter_tokenizer=tok, **kw)
    fresh = run(pair, PROMPTS, drafter_tokenizer=_with_bos(copy.deepcopy(pair["drafter_tokenizer"])), **kw)
    assert [s.drafter_positions for s in fresh.stats] != [s.drafter_positions for s in before.stats]
    assert (changed.sequences, changed.uniforms) == (fresh.sequences, fresh.uniforms)
    assert [s.drafter_positions for s in changed.stats] == [s.drafter_positions for s in fresh.stats]


def test_a_normalizer_set_in_place_renews_slrs_first_target_map(pair: dict[str, Any]) -> None:
    """One-token SLRS's first-target map (drafter id -> first target id of its text) follows the
    target tokenizer's normalizer: ``Lowercase`` set in place gives what a fresh object gives (the
    map was cached per tokenizer object). The target drafts for itself, so drafts are accepted."""
    from tokenizers import normalizers

    tok = copy.deepcopy(pair["target_tokenizer"])
    dtok = copy.deepcopy(pair["target_tokenizer"])
    kw: dict[str, Any] = dict(method="slrs", lookahead=1, max_new_tokens=12, seed=3, record_uniforms=True,
                              drafter=pair["target"], drafter_tokenizer=dtok)
    prompts = ["Hello World", "Def Foo(X):\n", "ABC", "The"]
    run(pair, prompts, target_tokenizer=tok, **kw)
    tok.backend_tokenizer.normalizer = normalizers.Lowercase()
    changed = run(pair, prompts, target_tokenizer=tok, **kw)
    ftok = copy.deepcopy(pair["target_tokenizer"])
    ftok.backend_tokenizer.normalizer = normalizers.Lowercase()
    fresh = run(pair, prompts, target_tokenizer=ftok, **kw)
    assert (changed.sequences, changed.uniforms) == (fresh.sequences, fresh.uniforms)


def _trade_ids(tok: Any, a: str, b: str) -> Any:
    """``tok`` with its BPE model replaced in place by one of the same kind, size and options in
    which the strings ``a`` and ``b`` (in the model's alphabet) trade ids."""
    import json

    from tokenizers import models

    state = json.loads(tok.backend_tokenizer.model.__getstate__())
    vocab = dict(state["vocab"])
    vocab[a], vocab[b] = vocab[b], vocab[a]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in state["merges"]]
    options = {k: state[k] for k in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                                     "fuse_unk", "byte_fallback", "ignore_merges") if state.get(k) is not None}
    tok.backend_tokenizer.model = models.BPE(vocab=vocab, merges=merges, **options)
    return tok


def test_a_tokenizer_model_swapped_in_place_is_read_again(pair: dict[str, Any]) -> None:
    """The target tokenizer's model replaced in place by one of the same kind and size (two ids
    trade their strings): the texts hsd caches per tokenizer are read again (they are keyed on a
    digest of the model's content, not only on its kind and size) and TLI's output (sampled, its
    uniforms) equals that of a fresh object with the same model."""
    from hsd_torch.engine.runner import logit_width
    from hsd_torch.vocab.text import TokenText
    from hsd_torch.vocab import tokenizer_state

    tok = copy.deepcopy(pair["target_tokenizer"])
    width = logit_width(pair["target"])
    kw: dict[str, Any] = dict(method="tli", lookahead=3, max_new_tokens=8, seed=3, record_uniforms=True)
    prompts = PROMPTS + ["return self.x", "e = t + 1"]
    old = list(TokenText.get(tok, width).bytes_of)
    before = run(pair, prompts, target_tokenizer=tok, **kw)
    state = tokenizer_state(tok)
    _trade_ids(tok, "e", "t")
    assert tokenizer_state(tok)[:-1] == state[:-1]  # the same kind, size and options: only the digest differs
    fresh_tok = _trade_ids(copy.deepcopy(pair["target_tokenizer"]), "e", "t")
    texts = TokenText.get(tok, width).bytes_of
    assert texts == TokenText.get(fresh_tok, width).bytes_of != old
    changed = run(pair, prompts, target_tokenizer=tok, **kw)
    fresh = run(pair, prompts, target_tokenizer=fresh_tok, **kw)
    assert (changed.sequences, changed.uniforms) == (fresh.sequences, fresh.uniforms)
    assert (changed.sequences, changed.uniforms) != (before.sequences, before.uniforms)


def test_a_call_reads_the_whole_tokenizer_state_only_when_its_fingerprint_moves(
        pair: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """``generate`` keys what it caches per tokenizer on the tokenizer's whole state (a digest of its
    model: 150-600 ms on 262,144 ids), read in full only when the per-call fingerprint moves
    (``tokenizer_fingerprint``: a few ms): a second call on unchanged tokenizers serializes no model; a
    token added in place is seen and read again; two ids that the fingerprint neither samples nor
    meets in its probe text trading strings is not seen (its documented limit), and after
    ``forget_tokenizer`` it is: the output is then a fresh object's."""
    from hsd_torch.engine.runner import logit_width
    from hsd_torch.vocab import forget_tokenizer
    from hsd_torch.vocab import tokenizer_identity as ts

    digests: list[int] = []
    digest = ts.model_digest
    monkeypatch.setattr(ts, "model_digest", lambda m: digests.append(1) or digest(m))
    # a sample of 16 + 32 ids, so that the tiny vocabulary has ids outside it (real ones: 256 + 512)
    monkeypatch.setattr(ts, "_FIRST_IDS", 16)
    monkeypatch.setattr(ts, "_SAMPLED_IDS", 32)
    tok, dtok = copy.deepcopy(pair["target_tokenizer"]), copy.deepcopy(pair["drafter_tokenizer"])
    kw: dict[str, Any] = dict(method="tli", lookahead=3, max_new_tokens=6, seed=3, record_uniforms=True,
                              target_tokenizer=tok, drafter_tokenizer=dtok)
    run(pair, PROMPTS, **kw)
    assert len(digests) == 2  # each new tokenizer object read in full once
    digests.clear()
    run(pair, PROMPTS, **kw)
    assert digests == []  # unchanged: the fingerprint only

    # two ids outside the fingerprint's sample, neither met when it encodes its probe text
    fp = ts.tokenizer_fingerprint(tok)
    model = tok.backend_tokenizer.model
    seen_strings, probe_ids = set(fp[-2]), set(fp[-1])
    hidden = [model.id_to_token(i) for i in range(tok.backend_tokenizer.get_vocab_size(False))
              if model.id_to_token(i) not in seen_strings and i not in probe_ids
              and model.id_to_token(i) not in tok.backend_tokenizer.get_added_tokens_decoder()]
    a, b = hidden[0], hidden[len(hidden) // 2]
    _trade_ids(tok, a, b)
    assert ts.tokenizer_fingerprint(tok) == fp and ts.tokenizer_state(tok) != \
        ts.tokenizer_state(pair["target_tokenizer"])
    digests.clear()
    run(pair, PROMPTS, **kw)
    assert digests == []  # not seen
    forget_tokenizer(tok)
    width = logit_width(pair["target"])
    from hsd_torch.vocab.text import TokenText

    fresh_tok = _trade_ids(copy.deepcopy(pair["target_tokenizer"]), a, b)
    assert TokenText.get(tok, width).bytes_of == TokenText.get(fresh_tok, width).bytes_of
    assert len(digests) == 2  # tok read again after forget_tokenizer, and the fresh object
    changed = run(pair, PROMPTS, **kw)
    fresh = run(pair, PROMPTS, **{**kw, "target_tokenizer": fresh_tok})
    assert (changed.sequences, changed.uniforms) == (fresh.sequences, fresh.uniforms)

    from tokenizers import normalizers

    digests.clear()
    tok.backend_tokenizer.normalizer = normalizers.Lowercase()  # seen: the state is read again
    run(pair, PROMPTS, **kw)
    assert digests == [1]
    before = ts.tokenizer_fingerprint(tok)
    tok.add_tokens(["zq zq"])  # an added token moves it too (generate then refuses the width)
    assert ts.tokenizer_fingerprint(tok) != before


BAD_TEMPERATURES = [math.inf, -math.inf, math.nan, 0.0, -1.0, 5e-324, 1e-300, 1e-45, 1e-4, 1e4, 1e300]


@pytest.mark.parametrize("arg", ["temperature", "drafter_temperature"])
@pytest.mark.parametrize("value", BAD_TEMPERATURES)
@pytest.mark.parametrize("top_p", [None, 0.9])
def test_temperatures_outside_the_range_are_refused(arg: str, value: float, top_p: float | None,
                                                    pair: dict[str, Any]) -> None:
    """Not finite, not positive, or outside [1e-3, 1e3] (``inf`` alone used to become the uniform law,
    with top_p a mid-generation "NaN or infinite logits?"; 1e-45 overflows float32 logits)."""
    msg = refused(pair, ValueError, rf"{arg} must be a number in \[0\.001, 1000(\.0)?\]",
                  **{arg: value, "top_p": top_p})
    assert repr(value) in msg
    # temperature 0 (transformers' users' spelling of greedy) and tiny ones point to do_sample=False
    assert ("use do_sample=False" in msg) == (0 <= value < 1e-3)


@pytest.mark.parametrize("value", [True, "1.0", [1.0]])
def test_temperatures_of_another_type_are_refused(value: Any, pair: dict[str, Any]) -> None:
    refused(pair, TypeError, r"temperature must be a number", temperature=value)
    refused(pair, TypeError, r"drafter_temperature must be a number", drafter_temperature=value)


def test_generate_and_audit_share_one_temperature_check(pair: dict[str, Any]) -> None:
    """The same validator (``hsd_torch.engine.laws.check_temperature``, which the CLI can call too) and so
    the same message; its bounds generate on a float32 model with top-p, where the law is computable."""
    from hsd_torch.engine.laws import TEMPERATURE_RANGE, check_temperature

    assert TEMPERATURE_RANGE == (1e-3, 1e3)
    with pytest.raises(ValueError) as gen:
        run(pair, temperature=math.inf)
    with no_forward_pass(pair["target"]), pytest.raises(ValueError) as aud:
        audit_generate(lambda p, s: [0], pair["target"], pair["target_tokenizer"], "x", n=10, temperature=math.inf)
    with pytest.raises(ValueError) as direct:
        check_temperature(math.inf)
    assert str(gen.value) == str(aud.value) == str(direct.value)
    assert check_temperature(np.float32(0.5)) == 0.5 and isinstance(check_temperature(2), float)
    tt = pair["target_tokenizer"]
    f32 = tiny.tiny_gpt2(tt, seed=9)
    assert next(f32.parameters()).dtype == torch.float32
    for t in TEMPERATURE_RANGE:
        out = generate(f32, None, PROMPTS, target_tokenizer=tt, method="ar", max_new_tokens=3, temperature=t,
                       top_p=0.9, seed=1)
        assert all(len(s) >= 1 for s in out.sequences)


def test_a_top_p_below_float32s_range_keeps_the_top_id(pair: dict[str, Any]) -> None:
    """``top_p`` in (0, 1] is valid, but in float32 ``1e-300`` rounds to 0, and "keep the ids whose
    preceding mass is below top_p" kept none: a NaN law, a mid-generation ``ValueError``. The top id's
    preceding mass is 0, so it is kept: the law is the top id's point mass, as in float64."""
    from hsd_torch.engine.laws import process_logits

    logits = torch.tensor([[0.5, 2.0, -1.0, 1.9]])
    mask = torch.ones(4, dtype=torch.bool)
    for dtype in (torch.float32, torch.float64):
        assert process_logits(logits.to(dtype), mask, top_p=1e-300).tolist() == [[0.0, 1.0, 0.0, 0.0]]
    tt = pair["target_tokenizer"]
    f32 = tiny.tiny_gpt2(tt, seed=9)
    out = generate(f32, None, PROMPTS, target_tokenizer=tt, method="ar", max_new_tokens=3, top_p=5e-324, seed=1)
    assert out.sequences == generate(f32, None, PROMPTS, target_tokenizer=tt, method="ar", max_new_tokens=3,
                                     do_sample=False).sequences


OPTIONS_OF_ANOTHER_METHOD = [
    ("tli", {"proposal_map": "junk"}, "proposal_map", "method 'tli'"),
    ("tli", {"min_path_prob": -5}, "min_path_prob", "method 'tli'"),
    ("slem", {"proposal_map": "longest_prefix"}, "proposal_map", "method 'slem'"),
    ("ar", {"min_path_prob": 0.5}, "min_path_prob", "method 'ar'"),
    ("tli", {"lookbehind": 2}, "lookbehind", "method 'tli'"),
    ("slrs", {"lookbehind": 0}, "lookbehind", "method 'slrs'"),
    ("ar", {"lookbehind": 4}, "lookbehind", "method 'ar'"),
    ("slrs", {"lookahead": 1, "min_path_prob": 0.1}, "min_path_prob", "one-token SLRS"),
    ("slrs", {"lookahead": 1, "proposal_map": "retokenize", "min_path_prob": 0.1}, "min_path_prob", "one-token SLRS"),
    ("tli", {"max_tokens": 2}, "max_tokens", "method 'tli'"),
]


@pytest.mark.parametrize("method,kw,option,user", OPTIONS_OF_ANOTHER_METHOD,
                         ids=[f"{m}-{o}" for m, kw, o, _ in OPTIONS_OF_ANOTHER_METHOD])
def test_an_option_the_method_does_not_use_is_refused(method: str, kw: dict[str, Any], option: str, user: str,
                                                      pair: dict[str, Any]) -> None:
    msg = refused(pair, ValueError, rf"{option} is an option of .* only; {re.escape(user)}.* does not use it",
                  method=method, **kw)
    assert f"{option}={kw[option]!r}" in msg


def test_the_defaults_of_the_methods_that_take_them_are_unchanged(pair: dict[str, Any]) -> None:
    """``lookbehind`` defaults to 4 for SLEM; ``lookahead`` is accepted (and checked) with AR, which
    drafts nothing (the CLI and the benches pass one lookahead to every method); ``max_tokens=1``,
    its default, with every method (the CLI passes it always)."""
    kw: dict[str, Any] = dict(max_new_tokens=4, seed=2, record_uniforms=True)
    a, b = run(pair, PROMPTS, method="slem", **kw), run(pair, PROMPTS, method="slem", lookbehind=4, **kw)
    assert (a.sequences, a.uniforms) == (b.sequences, b.uniforms)
    ar = dict(kw, method="ar", drafter=None, drafter_tokenizer=None)
    assert run(pair, PROMPTS, lookahead=7, **ar).sequences == run(pair, PROMPTS, **ar).sequences
    refused(pair, ValueError, "lookahead must be an int >= 1", lookahead=0, **ar)
    assert run(pair, PROMPTS, method="tli", max_tokens=1, **kw).sequences == run(pair, PROMPTS, method="tli",
                                                                                 **kw).sequences


# ---------------------------------------------------------------------------------------------
# raw errors, now clear ones


def test_missing_models_and_tokenizers(pair: dict[str, Any]) -> None:
    refused(pair, TypeError, r"target must be a Hugging Face causal LM .*got None", target=None)
    refused(pair, TypeError, r"target must be a Hugging Face causal LM .*got str", target="gpt2")
    refused(pair, TypeError, r"drafter must be a Hugging Face causal LM .*got str", drafter="gpt2")
    refused(pair, TypeError, r"target_tokenizer must be a Hugging Face tokenizer.*got None", target_tokenizer=None)
    refused(pair, TypeError, r"drafter_tokenizer must be a Hugging Face tokenizer.*got str", drafter_tokenizer="gpt2")
    refused(pair, TypeError, r"target_tokenizer must be a Hugging Face tokenizer.*got None", method="ar",
            drafter=None, drafter_tokenizer=None, target_tokenizer=None)


@pytest.mark.parametrize("role", ["target_tokenizer", "drafter_tokenizer"])
def test_a_raw_tokenizers_tokenizer_is_refused_with_the_fix(role: str, pair: dict[str, Any]) -> None:
    raw = pair[role].backend_tokenizer
    refused(pair, TypeError, rf"{role} is a raw tokenizers\.Tokenizer.*PreTrainedTokenizerFast\(tokenizer_object=",
            **{role: raw})


def test_models_on_the_meta_device_or_split_over_devices(pair: dict[str, Any]) -> None:
    tt = pair["target_tokenizer"]
    meta = tiny.tiny_gpt2(tt, seed=9).to("meta")
    refused(pair, ValueError, r"the target's parameters are on the meta device", target=meta, method="ar",
            drafter=None, drafter_tokenizer=None, target_tokenizer=tt)
    split = tiny.tiny_gpt2(pair["drafter_tokenizer"], seed=9, dtype=torch.float64)
    split.lm_head.to("meta")
    refused(pair, ValueError, r"the drafter's parameters are on more than one device \(cpu, meta\)", drafter=split)


def test_numpy_integers_are_accepted_wherever_an_int_is_asked(pair: dict[str, Any]) -> None:
    kw: dict[str, Any] = dict(method="tli", seed=4, record_uniforms=True)
    want = run(pair, PROMPTS, lookahead=2, max_new_tokens=3, top_k=5, **kw)
    got = run(pair, PROMPTS, lookahead=np.int64(2), max_new_tokens=np.int32(3), top_k=np.uint8(5), **kw)
    assert (got.sequences, got.uniforms) == (want.sequences, want.uniforms)
    slem = dict(kw, method="slem", max_new_tokens=3)
    assert run(pair, PROMPTS, lookbehind=np.int16(2), **slem).sequences == run(pair, PROMPTS, lookbehind=2,
                                                                               **slem).sequences
    bounded = dict(kw, method="slrs", lookahead=2, proposal_map="longest_prefix", min_path_prob=0.2,
                   max_new_tokens=3)
    assert (run(pair, PROMPTS, max_tokens=np.int64(2), **bounded).sequences
            == run(pair, PROMPTS, max_tokens=2, **bounded).sequences)


@pytest.mark.parametrize("arg", ["lookahead", "max_new_tokens", "top_k", "lookbehind", "max_tokens"])
@pytest.mark.parametrize("value", [True, np.bool_(True)])
def test_bools_are_refused_where_an_int_is_asked(arg: str, value: Any, pair: dict[str, Any]) -> None:
    kw: dict[str, Any] = {arg: value}
    if arg == "lookbehind":
        kw["method"] = "slem"
    if arg == "max_tokens":
        kw.update(method="slrs", lookahead=2, proposal_map="longest_prefix", min_path_prob=0.2)
    refused(pair, ValueError, rf"{arg} must be (None or |None, 0 \(off\) or )?an int >= ", **kw)


def test_a_lone_surrogate_in_a_prompt_names_the_prompt(pair: dict[str, Any]) -> None:
    msg = refused(pair, ValueError, r"prompt 1 .*lone surrogate", ["ok", "a\ud800b"])
    assert "UTF-8" in msg


# ---------------------------------------------------------------------------------------------
# audit_generate


def _audit(pair: dict[str, Any], sample_fn: Any, prompt: str = "def foo(x):\n", **kw: Any) -> Any:
    """``audit_generate`` of ``sample_fn`` at a small size (50 draws of the first token, top-k 3)."""
    kw = {"n": 50, "positions": 1, "top_k": 3, **kw}
    return audit_generate(sample_fn, pair["target"], pair["target_tokenizer"], prompt, **kw)


@pytest.mark.parametrize("kw,error,match", [
    ({"top_p": 1.5}, ValueError, r"top_p must be None or a number in \(0, 1\]"),
    ({"top_p": math.nan}, ValueError, r"top_p must be"),
    ({"top_p": 0.0}, ValueError, r"top_p must be"),
    ({"top_p": "0.5"}, TypeError, r"top_p must be"),
    ({"top_k": -1}, ValueError, r"top_k must be None, 0 \(off\) or an int >= 1"),  # 0 is off, as in transformers
    ({"top_k": 2.0}, ValueError, r"top_k must be None, 0 \(off\) or an int >= 1"),  # as generate (ints: ValueError)
    ({"temperature": 1e-45}, ValueError, r"temperature must be a number in"),
], ids=["top_p-1.5", "top_p-nan", "top_p-0", "top_p-str", "top_k-negative", "top_k-float", "temperature-1e-45"])
def test_audit_refuses_processing_out_of_range(kw: dict[str, Any], error: type[Exception], match: str,
                                              pair: dict[str, Any]) -> None:
    with no_forward_pass(pair["target"]), pytest.raises(error, match=match):
        _audit(pair, lambda p, s: [0], **kw)


def test_top_k_zero_is_off(pair: dict[str, Any]) -> None:
    """``top_k=0`` is transformers' spelling of "no top-k" (it once crashed inside torch in the
    audit): the same draws as ``top_k=None`` in generate, the same reference law in the audit."""
    assert run(pair, PROMPTS, max_new_tokens=4, top_k=0, seed=3).sequences == \
        run(pair, PROMPTS, max_new_tokens=4, top_k=None, seed=3).sequences
    draws = [[5], [7], [5], [9]] * 5
    reps = [_audit(pair, lambda p, s, it=iter(draws): next(it), n=20, top_k=k) for k in (0, None)]
    assert reps[0].core.expected == reps[1].core.expected and reps[0].verdict == reps[1].verdict


def test_audit_takes_prompt_ids_without_a_prompt(pair: dict[str, Any]) -> None:
    """``prompt`` may be left out when ``prompt_ids`` is given: the sampler gets the ids'
    text, the reference conditions on the ids; with neither, a TypeError before any forward pass."""
    tt = pair["target_tokenizer"]
    ids = tt("def foo(x):\n")["input_ids"]
    seen: list[str] = []

    def sampler(p: str, s: int) -> list[int]:
        seen.append(p)
        return [5]

    rep = audit_generate(sampler, pair["target"], tt, prompt_ids=ids, n=20, positions=1, top_k=3)
    named = audit_generate(lambda p, s: [5], pair["target"], tt, "def foo(x):\n", n=20, positions=1, top_k=3)
    assert set(seen) == {tt.decode(ids)} and rep.core.expected == named.core.expected
    with no_forward_pass(pair["target"]), pytest.raises(TypeError, match="give a prompt"):
        audit_generate(sampler, pair["target"], tt, n=20)


def test_audit_takes_an_empty_prompt_as_generate_does(pair: dict[str, Any]) -> None:
    """The byte-level tokenizer adds no BOS: an empty prompt conditions on its BOS, as generate's
    context does (one prompt-to-ids rule; it used to be refused), and the audit's reference is the
    law after exactly that context; empty prompt_ids are refused."""
    from hsd_torch import generate

    target, tt = pair["target"], pair["target_tokenizer"]
    ctx = generate(target, None, "", target_tokenizer=tt, method="ar", max_new_tokens=1, seed=0).prompt_ids[0]
    assert ctx == [tt.bos_token_id]
    empty = _audit(pair, lambda p, s: [0], prompt="")
    by_ids = _audit(pair, lambda p, s: [0], prompt_ids=ctx)
    assert empty.core.expected == by_ids.core.expected
    with no_forward_pass(pair["target"]), pytest.raises(ValueError, match=r"prompt_ids is empty"):
        _audit(pair, lambda p, s: [0], prompt_ids=[])


@pytest.mark.parametrize("returned,error,match", [
    (None, TypeError, r"returned None"),
    ("hello", TypeError, r"returned a str"),
    ([1.7, 2.0], TypeError, r"returned 1\.7 .*not an integer"),
    (np.array([1.0]), TypeError, r"not an integer"),
    ([3, -1], ValueError, r"returned id -1, outside"),
    ([10**6], ValueError, r"returned id 1000000, outside"),
], ids=["None", "str", "float-ids", "float-array", "negative-id", "id-past-the-vocabulary"])
def test_audit_names_the_draw_whose_output_is_malformed(returned: Any, error: type[Exception], match: str,
                                                        pair: dict[str, Any]) -> None:
    with pytest.raises(error, match=rf"sample_fn\('def foo\(x\):\\n', \d+\) .*{match}"):
        _audit(pair, lambda p, s: returned)


def test_audit_accepts_integer_arrays_and_tensors(pair: dict[str, Any]) -> None:
    for ids in ([5], np.array([5], dtype=np.int32), torch.tensor([[5]]), (np.int64(5),)):
        rep = _audit(pair, lambda p, s, ids=ids: ids)
        assert rep.n == 50
