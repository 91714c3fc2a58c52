"""hsd_torch.generate on its edge cases.

Each case runs the mirror (the reference method over the same models, fed the uniforms the
backend consumed, must emit the same ids: ``hsd_torch.CoreModel``, float64) and, where it says
more, greedy against the target's own ``model.generate``:

- a prompt that encodes to no tokens (the context starts with the tokenizer's BOS);
- EOS at the first position (targets and drafters whose EOS logit is boosted, so EOS is drawn
  first, drafted, accepted and rejected);
- ``max_new_tokens=1``;
- a drafter with no mass on the intersection (TLI falls back to plain target decoding);
- drafter tokens that decode to partial UTF-8 (a byte-fallback drafter boosted on ``<0xE6>``);
- models on different devices (``meta``: a clear error before any work);
- a batch where rows finish early (dropped from the caches; the others go on);
- a drafter whose context outgrows its position embeddings (the sliding drafter window).
"""

from __future__ import annotations

import functools

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.methods import AR, SD, SLEM, SLRS, TLI, Method  # noqa: E402
from hsd_core.rand import UniformRand  # noqa: E402
from hsd_torch import CoreModel, generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.engine.runner import window_view  # noqa: E402
from hsd_torch.models.mirror import core_text, target_greedy  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402
from hsd_torch.vocab import VocabBridge  # noqa: E402
generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only: the mirror's setting

torch.set_num_threads(1)
F64 = torch.float64
PROMPTS = ["def foo(x):\n", "Hello", "x", "naïve café", "import os\n", "    "]
ALL = ("ar", "sd", "tli", "slem", "slrs")
# SLRS's reference computes psi in pure Python over the drafter's whole vocabulary at every state
# (seconds per case): its costlier edge cases run in the slow tier.
SLRS_SLOW = pytest.param("slrs", marks=pytest.mark.slow)
ALL_FAST_SLRS_SLOW = ("ar", "sd", "tli", "slem", SLRS_SLOW)


@pytest.fixture(scope="module")
def toks() -> dict[str, Any]:
    return {k: tiny.tiny_tokenizer(k) for k in ("byte_bpe", "unigram")}


@pytest.fixture(scope="module")
def base(toks: dict[str, Any]) -> dict[str, Any]:
    return {
        "target": tiny.tiny_llama(toks["byte_bpe"], seed=0, dtype=F64),
        "self": tiny.tiny_llama(toks["byte_bpe"], seed=5, dtype=F64),
        "drafter": tiny.tiny_gpt2(toks["unigram"], seed=1, vocab_size=len(toks["unigram"]) + 32, dtype=F64),
    }


def with_bias(model: Any, bias: dict[int, float] | torch.Tensor) -> Any:
    """``model`` (modified in place: build a fresh one) with an output head that adds ``bias``."""
    head = model.get_output_embeddings()
    new = torch.nn.Linear(head.weight.shape[1], head.weight.shape[0], bias=True, dtype=head.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(head.weight)
        if isinstance(bias, dict):
            new.bias.zero_()
            for i, v in bias.items():
                new.bias[i] = v
        else:
            new.bias.copy_(bias)
    model.set_output_embeddings(new)
    return model


def core_method(method: str, lookahead: int) -> Method:
    if method == "ar":
        return AR()
    if method == "slrs":
        return SLRS(lookahead=1, lookbehind=0)
    cls = {"sd": SD, "tli": TLI, "slem": SLEM}[method]
    return cls(lookahead=lookahead)  # type: ignore[no-any-return]


def mirror(method: str, target: Any, tt: Any, drafter: Any, dt: Any, prompts: list[str], *, max_new: int = 8,
           lookahead: int = 3, seed: int = 3, window: bool = False) -> Any:
    """Run the backend, then the reference on every row with the uniforms it consumed; returns
    the backend's output."""
    use_d = method != "ar"
    la = 1 if method == "slrs" else lookahead
    out = generate(target, drafter if use_d else None, prompts, target_tokenizer=tt,
                   drafter_tokenizer=dt if use_d else None, method=method, lookahead=la, max_new_tokens=max_new,
                   seed=seed, record_uniforms=True)
    assert out.uniforms is not None
    ref_m = core_method(method, la)
    for i, prompt in enumerate(prompts):
        ct = CoreModel(target, tt, prompt=prompt)
        cd = CoreModel(drafter, dt, prompt=prompt, window=window) if use_d else None
        rand = UniformRand(out.uniforms[i])
        ref = ref_m.generate(ct, cd, core_text(prompt), max_new, rng=rand)
        assert ct.tokenizer.to_hf(ref) == out.sequences[i], (method, prompt)
        assert rand.used == len(out.uniforms[i])
    return out


def greedy_all(methods: tuple[str, ...], target: Any, tt: Any, drafter: Any, dt: Any, prompts: list[str],
               max_new: int, lookahead: int = 3) -> list[list[int]]:
    want = [target_greedy(target, tt, p, max_new) for p in prompts]
    for m in methods:
        use_d = m != "ar"
        out = generate(target, drafter if use_d else None, prompts, target_tokenizer=tt,
                       drafter_tokenizer=dt if use_d else None, method=m, lookahead=1 if m == "slrs" else lookahead,
                       max_new_tokens=max_new, do_sample=False)
        assert out.sequences == want, m
    return want


def hetero(method: str, toks: dict[str, Any], base: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """(target, tt, drafter, dt): the same-tokenizer drafter for SD, the Unigram one otherwise."""
    if method == "sd":
        return base["target"], toks["byte_bpe"], base["self"], toks["byte_bpe"]
    return base["target"], toks["byte_bpe"], base["drafter"], toks["unigram"]


# ---------------------------------------------------------------------------------------------
# a prompt that encodes to no tokens


@pytest.mark.parametrize("method", ALL)
def test_empty_prompt_starts_from_bos(method: str, toks: dict[str, Any], base: dict[str, Any]) -> None:
    target, tt, drafter, dt = hetero(method, toks, base)
    text = TokenText(tt, len(tt))
    assert text.prefix == [] and text.start("") == [tt.bos_token_id] and text.start("x") == []
    mirror(method, target, tt, drafter, dt, ["", "x", ""], max_new=6)


def test_empty_prompt_greedy_equals_generate_from_bos(toks: dict[str, Any], base: dict[str, Any]) -> None:
    target, tt, drafter, dt = hetero("tli", toks, base)
    want = greedy_all(("ar", "tli", "slem", "slrs"), target, tt, drafter, dt, ["", "Hello"], 6)
    ids = torch.tensor([[tt.bos_token_id]])
    with torch.inference_mode():
        direct = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=6,
                                 suppress_tokens=[0, 1, 3], pad_token_id=tt.eos_token_id)
    assert want[0] == direct[0, 1:].tolist()


def test_empty_prompt_without_bos_is_a_clear_error(toks: dict[str, Any], base: dict[str, Any]) -> None:
    class NoBos:
        """The byte-level tokenizer without a BOS (a proxy; the tokenizer itself is untouched)."""

        def __init__(self, tok: Any) -> None:
            self._tok = tok

        bos_token_id = None

        def __getattr__(self, name: str) -> Any:
            return getattr(self._tok, name)

        def __call__(self, *a: Any, **kw: Any) -> Any:
            return self._tok(*a, **kw)

        def __len__(self) -> int:
            return len(self._tok)

    tt = toks["byte_bpe"]
    with pytest.raises(ValueError, match="encodes to no tokens.*neither"):
        TokenText(NoBos(tt), len(tt)).start("")


# ---------------------------------------------------------------------------------------------
# EOS at the first position


@pytest.fixture(scope="module")
def eos_models(toks: dict[str, Any]) -> dict[str, Any]:
    """Targets and drafters with a boosted EOS: EOS is often first (about 0.1-0.7 of the mass)."""
    tt, dt = toks["byte_bpe"], toks["unigram"]
    return {
        "target": with_bias(tiny.tiny_llama(tt, seed=0, dtype=F64), {tt.eos_token_id: 9.0}),
        "self": with_bias(tiny.tiny_llama(tt, seed=0, dtype=F64), {tt.eos_token_id: 10.0}),
        "drafter": with_bias(tiny.tiny_gpt2(dt, seed=1, vocab_size=len(dt) + 32, dtype=F64),
                             {dt.eos_token_id: 11.0}),
        "greedy_eos": with_bias(tiny.tiny_llama(tt, seed=0, dtype=F64), {tt.eos_token_id: 50.0}),
    }


@pytest.mark.parametrize("method", ALL_FAST_SLRS_SLOW)
def test_eos_at_the_first_position(method: str, toks: dict[str, Any], eos_models: dict[str, Any]) -> None:
    tt = toks["byte_bpe"]
    target = eos_models["target"]
    drafter, dt = (eos_models["self"], tt) if method == "sd" else (eos_models["drafter"], toks["unigram"])
    prompts = ["x"] * 8 + PROMPTS[:2]
    out = mirror(method, target, tt, drafter, dt, prompts, max_new=4)
    first = [s[0] for s in out.sequences]
    assert tt.eos_token_id in first, "the boosted EOS must come first in some rows"
    for s in out.sequences:
        assert tt.eos_token_id not in s[:-1]


def test_eos_first_greedy(toks: dict[str, Any], eos_models: dict[str, Any]) -> None:
    tt = toks["byte_bpe"]
    want = greedy_all(("ar", "tli", "slem", "slrs"), eos_models["greedy_eos"], tt, eos_models["drafter"],
                      toks["unigram"], PROMPTS[:3], 5)
    assert want == [[tt.eos_token_id]] * 3
    out = generate(eos_models["greedy_eos"], eos_models["drafter"], PROMPTS[:3], target_tokenizer=tt,
                   drafter_tokenizer=toks["unigram"], method="tli", max_new_tokens=5, do_sample=False)
    assert [st.target_calls for st in out.stats] == [1, 1, 1]
    assert [st.new_tokens for st in out.stats] == [1, 1, 1]


# ---------------------------------------------------------------------------------------------
# max_new_tokens=1


@pytest.mark.parametrize("method", ALL)
def test_max_new_tokens_one(method: str, toks: dict[str, Any], base: dict[str, Any]) -> None:
    target, tt, drafter, dt = hetero(method, toks, base)
    out = mirror(method, target, tt, drafter, dt, PROMPTS, max_new=1)
    assert all(len(s) == 1 for s in out.sequences)
    assert all(st.target_calls == 1 for st in out.stats)


def test_max_new_tokens_one_greedy(toks: dict[str, Any], base: dict[str, Any]) -> None:
    target, tt, drafter, dt = hetero("tli", toks, base)
    greedy_all(("ar", "tli", "slem", "slrs"), target, tt, drafter, dt, PROMPTS, 1)


# ---------------------------------------------------------------------------------------------
# a drafter with no mass on the intersection


@pytest.mark.parametrize("shift", [float("-inf"), -1e4])
def test_tli_drafter_without_mass_on_the_intersection(shift: float, toks: dict[str, Any]) -> None:
    """Every shared id's logit at -inf: q_cap has no mass, TLI falls back to target decoding (the
    reference, fed the same uniforms, does too). At -1e4 below the others the full law's restriction
    underflows to 0 in float64, but q_cap, the softmax of the shared ids' logits alone (what TLI's
    drafter head computes), is a law: TLI drafts from it and stays exact (greedy equals AR)."""
    tt, dt = toks["byte_bpe"], toks["unigram"]
    target = tiny.tiny_llama(tt, seed=0, dtype=F64)
    vd = len(dt) + 32
    bridge = VocabBridge(tt, dt, target_vocab_size=len(tt), drafter_vocab_size=vd)
    inside = bridge.to_target >= 0
    assert 0 < int(inside.sum()) < int(TokenText(dt, vd).text_mask.sum())
    bias = torch.where(inside, torch.tensor(shift, dtype=F64), torch.tensor(0.0, dtype=F64))
    drafter = with_bias(tiny.tiny_gpt2(dt, seed=1, vocab_size=vd, dtype=F64), bias)
    if shift == float("-inf"):
        out = mirror("tli", target, tt, drafter, dt, PROMPTS, max_new=6)
        assert all(st.proposed == 0 and st.accepted == 0 for st in out.stats)
        assert all(st.target_calls == len(s) for st, s in zip(out.stats, out.sequences))
    else:
        out = generate(target, drafter, PROMPTS, target_tokenizer=tt, drafter_tokenizer=dt, method="tli",
                       lookahead=3, max_new_tokens=6, seed=3)
        assert sum(st.proposed for st in out.stats) > 0
    greedy_all(("tli", "slem"), target, tt, drafter, dt, PROMPTS[:3], 6)


# ---------------------------------------------------------------------------------------------
# drafter tokens that decode to partial UTF-8


@pytest.mark.parametrize("method", ["tli", "slem", SLRS_SLOW])
def test_drafts_of_partial_utf8(method: str, toks: dict[str, Any]) -> None:
    tt, dt = toks["byte_bpe"], toks["unigram"]
    lead = dt.convert_tokens_to_ids("<0xE6>")  # the first byte of 日本 (3-byte characters)
    assert TokenText(dt, len(dt)).bytes_of[lead] == b"\xe6"
    drafter = with_bias(tiny.tiny_gpt2(dt, seed=1, dtype=F64), {lead: 6.0})
    target = with_bias(tiny.tiny_llama(tt, seed=0, dtype=F64), {TokenText(tt, len(tt)).byte_id[0xE6]: 3.0})
    out = mirror(method, target, tt, drafter, dt, PROMPTS[:4], max_new=6)
    assert sum(st.proposed for st in out.stats) > 0
    assert any("\ufffd" in t for t in out.texts), "some output ends inside a character"
    greedy_all((method,), target, tt, drafter, dt, PROMPTS[:3], 6)


# ---------------------------------------------------------------------------------------------
# models on different devices


def test_models_on_different_devices_are_refused(toks: dict[str, Any], base: dict[str, Any]) -> None:
    tt, dt = toks["byte_bpe"], toks["unigram"]
    on_meta = tiny.tiny_gpt2(dt, seed=1).to("meta")
    with pytest.raises(ValueError, match="target is on cpu and the drafter on meta: put both models on one device"):
        generate(base["target"], on_meta, "x", target_tokenizer=tt, drafter_tokenizer=dt, method="tli")


# ---------------------------------------------------------------------------------------------
# a batch where rows finish early


def test_finished_rows_are_dropped_and_the_others_go_on(toks: dict[str, Any], eos_models: dict[str, Any],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import DynamicCache

    calls: list[int] = []
    real = DynamicCache.batch_select_indices

    def counting(self: Any, indices: Any) -> None:
        calls.append(len(indices))
        real(self, indices)

    monkeypatch.setattr(DynamicCache, "batch_select_indices", counting)
    tt, dt = toks["byte_bpe"], toks["unigram"]
    for method in ("tli", "slem"):
        calls.clear()
        out = mirror(method, eos_models["target"], tt, eos_models["drafter"], dt, ["x"] * 6 + PROMPTS[:2],
                     max_new=10, seed=8)
        lengths = [len(s) for s in out.sequences]
        assert min(lengths) < max(lengths), lengths
        assert calls, "finished rows must be dropped from the caches"
    want = greedy_all(("ar", "tli"), tiny.tiny_llama(tt, seed=0, dtype=F64), tt, eos_models["drafter"], dt,
                      PROMPTS[:3], 8)
    assert want


def test_ragged_budgets_with_a_row_finishing_at_once(toks: dict[str, Any], eos_models: dict[str, Any]) -> None:
    tt, dt = toks["byte_bpe"], toks["unigram"]
    out = generate(eos_models["greedy_eos"], eos_models["drafter"], ["x", "Hello"], target_tokenizer=tt,
                   drafter_tokenizer=dt, method="tli", max_new_tokens=4, seed=0)
    assert out.sequences == [[tt.eos_token_id]] * 2


# ---------------------------------------------------------------------------------------------
# a drafter whose context outgrows its positions


def test_window_view() -> None:
    ctx = list(range(20))
    assert window_view(ctx, 1, 32) == ctx
    w = window_view(ctx, 1, 8)  # room 7, step 3: 19 body ids, drop 12
    assert w == [0] + list(range(13, 20)) and len(w) <= 8
    assert window_view(ctx[:19], 1, 8) == [0] + list(range(10, 19))[-7:] or len(window_view(ctx[:19], 1, 8)) <= 8
    for n in range(1, 40):
        v = window_view(list(range(n)), 1, 8)
        assert len(v) <= 8 and v[-1] == n - 1 and v[0] == 0
    with pytest.raises(ValueError, match="cannot hold"):
        window_view([1, 2, 3], 2, 2)


@pytest.mark.parametrize("method", ["tli", "slem", SLRS_SLOW])
def test_drafter_with_few_positions_slides(method: str, toks: dict[str, Any], base: dict[str, Any]) -> None:
    tt, dt = toks["byte_bpe"], toks["unigram"]
    drafter = tiny.tiny_gpt2(dt, seed=1, n_positions=10, dtype=F64)
    prompts = ["def foo(x):\n    return x + 1\n", "Hello", "import os\nimport sys\n"]
    assert max(len(TokenText(dt, len(dt)).prompt_ids(p)) for p in prompts) > 10
    if method == "slrs":  # its reference's psi is slow (pure Python over the drafter's vocabulary)
        prompts = prompts[:1]
    out = mirror(method, base["target"], tt, drafter, dt, prompts, max_new=14, window=True)
    assert sum(st.proposed for st in out.stats) > 0
    greedy_all((method,), base["target"], tt, drafter, dt, prompts, 14)


def test_target_context_beyond_its_positions_is_refused_up_front(toks: dict[str, Any]) -> None:
    tt = toks["byte_bpe"]
    short = tiny.tiny_gpt2(tt, seed=2, n_positions=12)
    with pytest.raises(ValueError, match="beyond its 12 positions"):
        generate(short, None, "def foo(x):\n    return", target_tokenizer=tt, method="ar", max_new_tokens=8)


# ---------------------------------------------------------------------------------------------
# NaN logits: generate runs its kernels unchecked and checks the laws that decide what is emitted
# (the target's p, and the law each draft was drawn from) once per round.


@pytest.mark.parametrize("method, who", [(m, w) for m in ALL for w in ("target", "drafter")
                                          if not (m == "ar" and w == "drafter")])  # ar has no drafter
def test_nan_logits_are_a_clear_error(method: str, who: str, toks: dict[str, Any]) -> None:
    tt, dt = toks["byte_bpe"], toks["byte_bpe" if method == "sd" else "unigram"]
    target = tiny.tiny_llama(tt, seed=0, dtype=F64)
    drafter = tiny.tiny_gpt2(dt, seed=1, dtype=F64) if method != "ar" else None
    sick = target if who == "target" else drafter
    assert sick is not None
    width = sick.get_output_embeddings().weight.shape[0]
    with_bias(sick, torch.full((width,), float("nan"), dtype=F64))
    kw: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=dt if drafter is not None else None,
                              method=method, lookahead=1 if method == "slrs" else 3, max_new_tokens=4, seed=0)
    if method == "slem" and who == "drafter":
        # SLEM's verification never reads the drafter's law: drafts are only candidates that the
        # target's own draws must match, so the output is still the target's (and finite)
        out = generate(target, drafter, "Hello", **kw)
        assert all(0 <= t < len(tt) + 8 for t in out.sequences[0])
        return
    if method == "tli" and who == "drafter":
        # a NaN law has no (finite) mass on the intersection: TLI drafts nothing, plain decoding
        out = generate(target, drafter, "Hello", **kw)
        assert out.stats[0].proposed == 0 and out.stats[0].new_tokens == 4
        return
    with pytest.raises(ValueError, match=f"the {who}'s law .* NaN, infinite or no mass"):
        generate(target, drafter, "Hello", **kw)


def test_token_text_fast_encode_is_the_tokenizers_own(toks: dict[str, Any]) -> None:
    """TokenText encodes through the tokenizers backend (one Rust call, without offsets where the
    backend has ``encode_batch_fast``): the same ids as ``tokenizer(s, add_special_tokens=False)``,
    on source text with spaces, tabs and non-ASCII, long and short, for the tiny tokenizers of three
    kinds and the real ones available here (GPT-2, cl100k, o200k, Qwen, LLaMA)."""
    import random

    from hsd_torch.models import real_tokenizers

    text = open(__file__, encoding="utf-8").read() + "  héllo 世界 ✓ naïve\n\tx  \r\n"
    rnd = random.Random(0)
    samples = [text[a:a + rnd.randint(0, 40)] for a in (rnd.randrange(len(text)) for _ in range(400))]
    samples += [text[a:a + 3000] for a in (0, len(text) // 2)]
    samples += [" ", "  a", "\n\n", "ab  ", "é", " 世"]
    kinds: list[tuple[str, Any]] = [(k, toks.get(k) or tiny.tiny_tokenizer(k)) for k in ("byte_bpe", "unigram",
                                                                                      "bpe_fallback")]
    kinds += [(n, real_tokenizers.load(n)) for n, why in real_tokenizers.available().items() if why is None]
    for kind, tok in kinds:
        tx = TokenText(tok, max(tok.get_vocab().values()) + 1)  # cl100k has holes: its width, not its length
        assert tx._backend is not None and tx._fast is not None, kind
        for s in samples:
            assert tx._encode_str(s) == list(tok(s, add_special_tokens=False)["input_ids"]), (kind, s)
    assert TokenText.get(toks["byte_bpe"], len(toks["byte_bpe"])) is TokenText.get(toks["byte_bpe"], len(toks["byte_bpe"]))


@pytest.mark.parametrize("method", ["ar", "tli", "slem", "slrs"])
def test_qwen2_target(method: str, toks: dict[str, Any], base: dict[str, Any]) -> None:
    """A Qwen2-style target (q/k/v biases, grouped-query attention): mirror and greedy identity."""
    target = tiny.tiny_qwen2(toks["byte_bpe"], seed=4, dtype=F64)
    prompts = ["def foo(x):\n", "Hello"]
    mirror(method, target, toks["byte_bpe"], base["drafter"], toks["unigram"], prompts, max_new=6)
    greedy_all((method,), target, toks["byte_bpe"], base["drafter"], toks["unigram"], prompts, max_new=6)


@pytest.mark.parametrize("kw", [
    {"method": "slem", "lookahead": 2000},
    {"method": "slrs", "lookahead": 40, "proposal_map": "longest_prefix", "min_path_prob": 0.05},
    {"method": "slrs", "lookahead": 40, "proposal_map": "longest_prefix", "min_path_prob": 0.05, "max_tokens": None},
], ids=["slem", "slrs-bounded", "slrs-multi"])
@pytest.mark.parametrize("do_sample", [True, False])
def test_drafting_is_capped_at_the_budget(kw: dict[str, Any], do_sample: bool, toks: dict[str, Any],
                                          base: dict[str, Any]) -> None:
    """No round drafts more drafter tokens than it can emit target tokens (``min(lookahead,
    budget)``, as ``hsd_core``'s SLEM and SLRS). With one new token, lookahead 2000 (SLEM) or 40
    (bounded SLRS) costs one drafter pass per prompt: the root context's (counted, not timed; it was
    2,000 drafter calls)."""
    out = generate(base["target"], base["drafter"], PROMPTS[:3], target_tokenizer=toks["byte_bpe"],
                   drafter_tokenizer=toks["unigram"], max_new_tokens=1, do_sample=do_sample, seed=0, **kw)
    assert [len(s) for s in out.sequences] == [1, 1, 1]
    assert [st.drafter_calls for st in out.stats] == [1, 1, 1]
    two = generate(base["target"], base["drafter"], PROMPTS[:3], target_tokenizer=toks["byte_bpe"],
                   drafter_tokenizer=toks["unigram"], max_new_tokens=2, do_sample=do_sample, seed=0, **kw)
    # two tokens: at most two drafter tokens in the first round (a root pass and one more), then one
    assert all(st.drafter_calls <= 2 * st.target_calls for st in two.stats)


@pytest.mark.parametrize("batch", [1, 3])
def test_the_head_runs_only_where_a_round_reads(batch: int, toks: dict[str, Any], base: dict[str, Any]) -> None:
    """Logits only at the positions a round reads (``logits_to_keep``: memory on a large
    vocabulary): a long prompt's prefill runs the head at one position per row, its own prompt's
    end (prompts of distinct lengths included: ``hsd_torch.engine._head``), not at every prompt position
    nor at every row's end for every row; and the tokens are the target's own greedy ones all the
    same."""
    target, tok = base["target"], toks["byte_bpe"]
    prompts = ["def foo(x):\n    return x + 1\n\nclass A:\n    pass\n", "import os\nimport sys\n", "x = 1"][:batch]
    widths: list[int] = []
    hook = target.get_output_embeddings().register_forward_hook(lambda m, i, o: widths.append(int(i[0].shape[1])))
    try:
        out = generate(target, None, prompts, target_tokenizer=tok, method="ar", max_new_tokens=4, do_sample=False)
    finally:
        hook.remove()
    longest = max(len(TokenText.get(tok, len(tok)).prompt_ids(p)) for p in prompts)
    assert longest >= 10
    assert widths[0] == 1 < longest  # the prefill: one column per row, its prompt's end (distinct lengths)
    assert all(w == 1 for w in widths[1:])  # AR: one position per row and round, the same column
    for p, seq in zip(prompts, out.sequences):
        assert seq == target_greedy(target, tok, p, 4)
