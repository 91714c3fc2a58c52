"""Models with sliding-window attention layers (Gemma's) past their window.

transformers' own cache for such a layer keeps only the last ``sliding_window - 1`` columns and
cannot be cropped once full, so every speculative method crashed on its first rejected draft past
the window; and in a batch, transformers' sliding mask counts the batch's columns (padding and
holes) instead of a row's positions, so a short row beside a long one lost its prompt from view.
``hsd_torch.engine.runner.new_cache`` keeps the full history of those layers (the mask applies the
window) and ``layer_masks`` counts each row's window in its own positions.

Models: a random-init tiny Gemma3 (4 layers, sliding window 8, float64, ``hsd_torch.models.tiny``) as the
target, and as the drafter (another tokenizer) where the drafter's cache must be cropped past its
window too. Contexts reach 25-70 positions, 3-9 windows.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.methods import AR, SD, SLEM, SLRS, TLI  # noqa: E402
from hsd_core.methods.base import Method  # noqa: E402
from hsd_core.rand import UniformRand  # noqa: E402

from hsd_torch import CoreModel, generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.models.mirror import core_text, target_greedy  # noqa: E402
from hsd_torch.engine.runner import Runner, new_cache  # noqa: E402

generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only

WINDOW = 8
SHORT = "def foo(x):\n"
LONG = "import os\nimport sys\n\nclass Foo(object):\n    def __init__(self, x):\n        self.x = x\n"  # > 2 windows
NEW = 24


@pytest.fixture(scope="module")
def world() -> dict[str, Any]:
    torch.set_num_threads(1)
    tt, dt = tiny.tiny_tokenizer("byte_bpe"), tiny.tiny_tokenizer("unigram")
    return {
        "tt": tt, "dt": dt,
        "target": tiny.tiny_gemma3(tt, sliding_window=WINDOW, dtype=torch.float64),
        "self": tiny.tiny_gemma3(tt, seed=3, sliding_window=WINDOW, dtype=torch.float64),  # SD's drafter
        "drafter": tiny.tiny_gemma3(dt, seed=1, sliding_window=WINDOW, dtype=torch.float64),
        "gpt2": tiny.tiny_gpt2(dt, seed=1, dtype=torch.float64),
    }


def test_the_tiny_model_has_sliding_layers_that_transformers_cannot_crop(world: dict[str, Any]) -> None:
    """The premise: transformers' cache for this model refuses a crop past the window, and
    ``new_cache`` replaces exactly the sliding layers (the full ones are left as they are)."""
    from transformers import DynamicCache

    target = world["target"]
    ids = torch.tensor([list(range(4, 4 + 2 * WINDOW))])
    own = DynamicCache(config=target.config)
    target(input_ids=ids, cache=own)
    with pytest.raises(RuntimeError, match="sliding window"):
        own.crop(-1)
    cache, sliding = new_cache(target)
    assert sliding and target.config.sliding_window == WINDOW
    assert [type(x).__name__ for x in cache.layers] == ["DynamicLayer"] * 4
    target(input_ids=ids, cache=cache)
    cache.crop(-3)
    assert cache.get_seq_length() == 2 * WINDOW - 3


SLOW = pytest.mark.slow
GREEDY = [("ar", "target", 4), ("tli", "drafter", 3), ("slrs", "drafter", 1),
          pytest.param("slem", "drafter", 3, marks=SLOW), pytest.param("sd", "self", 4, marks=SLOW), pytest.param("tli", "gpt2", 4, marks=SLOW),
          pytest.param("slem", "gpt2", 4, marks=SLOW), pytest.param("slrs", "gpt2", 1, marks=SLOW)]


@pytest.mark.parametrize("method,drafter,lookahead", GREEDY)
def test_greedy_past_the_window_is_the_targets_own(method: str, drafter: str, lookahead: int,
                                                   world: dict[str, Any]) -> None:
    """Greedy, every method, one prompt alone and both in a batch (ragged: the short row is padded
    past a window), equals transformers' own greedy ``generate`` of the target for each prompt
    (``target_greedy``, textless ids suppressed as ``mask_textless`` does),
    ``NEW`` tokens after a prompt of 9 or 47 ids (window 8). The drafter is a GPT-2 or a
    Gemma3 with its own window (its cache is cropped past the window at every re-sync)."""
    tt = world["tt"]
    target, d = world["target"], world[drafter]
    dt = tt if drafter in ("self", "target") else world["dt"]
    kw = dict(target_tokenizer=tt, drafter_tokenizer=dt if method != "ar" else None, method=method,
              lookahead=lookahead, max_new_tokens=NEW, do_sample=False)
    d = d if method != "ar" else None
    want = [target_greedy(target, tt, p, NEW) for p in (SHORT, LONG)]
    assert all(len(tt(p).input_ids) + len(w) > 3 * WINDOW for p, w in zip((SHORT, LONG), want))
    assert generate(target, d, [LONG], **kw).sequences == [want[1]]
    assert generate(target, d, [SHORT, LONG], **kw).sequences == want


def _reference(method: str, lookahead: int) -> Method:
    if method == "slrs":
        return SLRS(lookahead=lookahead, lookbehind=0) if lookahead == 1 else SLRS(
            lookahead=lookahead, min_path_prob=0.1, proposal_map="longest_prefix")
    return {"ar": AR, "sd": SD, "tli": TLI, "slem": SLEM}[method](lookahead=lookahead)  # type: ignore[no-any-return]


BOUNDED = {"top_k": 8, "proposal_map": "longest_prefix", "min_path_prob": 0.1}
MIRROR = [pytest.param("tli", "gpt2", 3, {}, id="tli"), pytest.param("slem", "drafter", 3, {}, id="slem"),
          pytest.param("slrs", "drafter", 2, BOUNDED, id="slrs-bounded"),
          pytest.param("sd", "self", 3, {}, id="sd", marks=SLOW),
          pytest.param("slrs", "drafter", 1, {"top_k": 8}, id="slrs", marks=SLOW)]


@pytest.mark.parametrize("method,drafter,lookahead,options", MIRROR)
def test_sampled_mirror_past_the_window(method: str, drafter: str, lookahead: int, options: dict[str, Any],
                                        world: dict[str, Any]) -> None:
    """Sampled, a batch of a short and a long prompt: the uniforms each row consumed, replayed
    into ``hsd_core``'s method over ``CoreModel`` views of the same models (uncached passes over the
    full context: the models' own sliding masks), give the same tokens, and the reference reads
    every uniform: the sampled law past the window is the reference's, draw for draw. Bounded
    SLRS runs its draft tree on a copy of the (Gemma) drafter's batched cache."""
    tt = world["tt"]
    target, d = world["target"], world[drafter]
    dt = tt if drafter == "self" else world["dt"]
    prompts = [SHORT, LONG]
    new = 16
    out = generate(target, d, prompts, target_tokenizer=tt, drafter_tokenizer=dt, method=method, lookahead=lookahead,
                   max_new_tokens=new, seed=7, record_uniforms=True, **options)
    assert out.uniforms is not None
    process = {"top_k": options["top_k"]} if "top_k" in options else {}
    ct, cd = CoreModel(target, tt, **process), CoreModel(d, dt, **process)
    for i, prompt in enumerate(prompts):
        assert len(out.prompt_ids[i]) + len(out.sequences[i]) > 2 * WINDOW if out.prompt_ids else True
        rand = UniformRand(out.uniforms[i])
        got = _reference(method, lookahead).generate(ct, cd, core_text(prompt), new, rng=rand)
        assert ct.tokenizer.to_hf(got) == out.sequences[i], (method, prompt)
        assert rand.used == len(out.uniforms[i])


def test_eager_attention_reads_the_same_windows(world: dict[str, Any]) -> None:
    """With ``attn_implementation="eager"`` the batch's masks are additive (0 or the dtype's
    minimum): a short and a long prompt in one batch decode greedily as the target alone does."""
    tt = world["tt"]
    target = tiny.tiny_gemma3(tt, sliding_window=WINDOW, dtype=torch.float64)
    target.set_attn_implementation("eager")
    want = [target_greedy(target, tt, p, 20) for p in (SHORT, LONG)]
    got = generate(target, None, [SHORT, LONG], target_tokenizer=tt, method="ar", max_new_tokens=20, do_sample=False)
    assert got.sequences == want


def test_a_batch_of_a_model_whose_forward_takes_no_masks_per_layer_type_is_refused(
        world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch needs masks per layer type (each row's own window); a model that takes none is
    refused with one line before any forward pass, and one row alone still runs."""
    import hsd_torch.engine.runner as runner

    monkeypatch.setattr(runner.inspect, "getsource", lambda obj: "def forward(self, attention_mask): ...")
    with pytest.raises(ValueError, match="sliding-window attention layers .* generate one prompt at a time"):
        Runner(world["target"], 2, 0, "target")
    Runner(world["target"], 1, 0, "target")


def test_a_batch_with_an_attention_that_reads_no_mask_is_refused(world: dict[str, Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Flash attention reads no 4D mask, so a batch of a sliding-window model is refused with the
    fix (sdpa or eager, or one prompt at a time) before any forward pass."""
    config = world["target"].config
    monkeypatch.setattr(config, "_attn_implementation_internal", "flash_attention_2", raising=False)
    assert config._attn_implementation == "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='flash_attention_2'.*'sdpa' or 'eager'"):
        Runner(world["target"], 2, 0, "target")


# ---------------------------------------------------------------------------------------------
# the real pair: Gemma-3-270M (sliding window 512) <- SmolLM2-135M-Instruct


LONG_CODE = "".join(f"def f{i}(x):\n    return x * {i} + {i * i % 7}\n\n" for i in range(40)) + "def f40(x):\n    return x *"


@pytest.mark.slow
def test_real_pair_greedy_past_the_window() -> None:
    """Gemma-3-270M's sliding layers attend to the last 512 positions: with a prompt of over 640
    ids (code that asks to be continued), every rejected draft is cropped past the window (it
    used to raise transformers' ``RuntimeError`` on the first one). Greedy TLI, SLEM and
    one-token SLRS with the SmolLM2 drafter, and hsd's AR, equal the target's own ``generate``
    (float32, CPU), 16 new ids, and each speculative method both kept and rejected drafts."""
    from hsd_torch.models import real as rm

    for name in rm.names():
        if name not in rm.available():
            pytest.skip(f"{name}'s package is not installed (README, 'Real models')")
    torch.set_num_threads(2)
    target, tt = rm.load("gemma-3-270m")
    drafter, dt = rm.load("smollm2-135m-instruct")
    assert target.config.sliding_window == 512
    n_prompt = len(tt(LONG_CODE, add_special_tokens=True).input_ids)
    assert n_prompt > 512 + 128, n_prompt
    want = target_greedy(target, tt, LONG_CODE, 16, mask_textless=False)
    assert len(want) == 16, tt.decode(want)
    for method, lookahead in [("ar", 4), ("tli", 4), ("slem", 4), ("slrs", 1)]:
        out = generate(target, drafter if method != "ar" else None, [LONG_CODE], target_tokenizer=tt,
                       drafter_tokenizer=dt if method != "ar" else None, method=method, lookahead=lookahead,
                       max_new_tokens=16, do_sample=False, mask_textless=False)
        assert out.sequences == [want], (method, tt.decode(out.sequences[0]), tt.decode(want))
        s = out.stats[0]
        assert method == "ar" or s.proposed > s.accepted > 0, (method, s)  # drafts kept and drafts cropped off
