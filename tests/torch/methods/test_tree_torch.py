"""Token trees in ``hsd_torch.generate`` (``tree=``: SD-tree, TLI-tree, SLEM-tree) against
``hsd_core.methods.tree``.

- Mirror: the backend records the uniforms each row consumed; ``hsd_core``'s tree method over the
  same models (``hsd_torch.CoreModel``, float64), fed them through ``UniformRand``, emits the same ids
  and reads exactly those uniforms: sampled (RRS, ``"iid"`` and ``"distinct"`` draws) and greedy,
  Static and Dynamic shapes, a batch of one and batched rows.
- Greedy: equals the target's own ``model.generate(do_sample=False)``.
- Refusals: tree options that are not valid, or given to a method that has no tree.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.methods.tree import Dynamic, Static  # noqa: E402
from hsd_core.methods.tree import SDTree as CoreSDTree  # noqa: E402
from hsd_core.methods.tree import SLEMTree as CoreSLEMTree  # noqa: E402
from hsd_core.methods.tree import TLITree as CoreTLITree  # noqa: E402
from hsd_core.rand import UniformRand  # noqa: E402
from hsd_torch import CoreModel, generate  # noqa: E402
from hsd_torch.engine.validation import OptionNotTaken, OutOfRange  # noqa: E402
from hsd_torch.models.mirror import core_text, target_greedy  # noqa: E402

generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only
torch.set_num_threads(1)

PROMPTS = ["def foo(x):\n", "Hello", "import os\nimport sys\n", "x", "naïve café"]
MAX_NEW = 10
# (target, drafter, drafter temperature): the target as its own drafter at 1.5 (high acceptance, q != p:
# deep paths, compaction at every depth) and a GPT-2 drafter (low acceptance: early rejections)
PAIRS = {"bpe<-self": ("llama_bpe", "llama_bpe", 1.5), "bpe<-gpt2": ("llama_bpe", "gpt2_bpe", None)}
SHAPES = {"static": Static((2, 2, 1)), "dynamic": Dynamic(6, 2, 4), "wide": Static((3, 1)), "path": Static((1, 1, 1))}


def check_mirror(models: dict[str, Any], toks: dict[str, Any], pair: str, shape: Any, *, draws: str = "distinct",
                 greedy: bool = False, batched: bool = True, prompts: list[str] = PROMPTS, seed: int = 11) -> None:
    t, d, dtemp = PAIRS[pair]
    target, drafter, tt = models[t], models[d], toks["byte_bpe"]
    kw: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=tt, method="sd", tree=shape, tree_draws=draws,
                              max_new_tokens=MAX_NEW, seed=seed, record_uniforms=True, drafter_temperature=dtemp,
                              do_sample=not greedy)
    if batched:
        outs = [(generate(target, drafter, prompts, **kw), i) for i in range(len(prompts))]
    else:
        outs = [(generate(target, drafter, [p], **kw), 0) for p in prompts]
    ct = CoreModel(target, tt)
    cd = CoreModel(drafter, tt, temperature=1.0 if dtemp is None else dtemp)
    ref_method = CoreSDTree(shape, greedy=greedy, draws=draws)
    for prompt, (out, i) in zip(prompts, outs):
        assert out.uniforms is not None
        rand = UniformRand(out.uniforms[i])
        ref = ref_method.generate(ct, cd, core_text(prompt), MAX_NEW, rng=rand)
        assert ct.tokenizer.to_hf(ref) == out.sequences[i], (pair, shape, draws, greedy, prompt)
        assert rand.used == len(out.uniforms[i]), "the backend recorded a uniform the reference did not read"


SHAPE_CASES = [(p, s) for p in sorted(PAIRS) for s in ("static", "dynamic")] + [
    pytest.param("bpe<-self", "wide", marks=pytest.mark.slow), pytest.param("bpe<-gpt2", "path", marks=pytest.mark.slow)]


@pytest.mark.parametrize("pair,shape", SHAPE_CASES)
def test_mirror_sampled_rrs_distinct(models: dict[str, Any], toks: dict[str, Any], pair: str, shape: str) -> None:
    check_mirror(models, toks, pair, SHAPES[shape])


@pytest.mark.parametrize("shape", ["static", "dynamic"])
def test_mirror_sampled_rrs_iid_batch_of_one(models: dict[str, Any], toks: dict[str, Any], shape: str) -> None:
    check_mirror(models, toks, "bpe<-self", SHAPES[shape], draws="iid", batched=False, prompts=PROMPTS[:3])


@pytest.mark.parametrize("shape", ["static", "dynamic"])
def test_mirror_greedy(models: dict[str, Any], toks: dict[str, Any], shape: str) -> None:
    check_mirror(models, toks, "bpe<-self", SHAPES[shape], greedy=True)
    check_mirror(models, toks, "bpe<-gpt2", SHAPES[shape], greedy=True, batched=False, prompts=PROMPTS[:2])


def test_the_mirror_has_teeth(models: dict[str, Any], toks: dict[str, Any]) -> None:
    """The reference with another shape (or another seed's uniforms) does not reproduce the
    backend: the mirror compares something."""
    with pytest.raises(AssertionError):
        t, d, dtemp = PAIRS["bpe<-self"]
        tt = toks["byte_bpe"]
        out = generate(models[t], models[d], PROMPTS[:3], target_tokenizer=tt, drafter_tokenizer=tt, method="sd",
                       tree=SHAPES["static"], max_new_tokens=MAX_NEW, seed=3, record_uniforms=True,
                       drafter_temperature=dtemp)
        ct, cd = CoreModel(models[t], tt), CoreModel(models[d], tt, temperature=dtemp)
        for i, p in enumerate(PROMPTS[:3]):
            rand = UniformRand(out.uniforms[i])  # type: ignore[index]
            ref = CoreSDTree(SHAPES["wide"]).generate(ct, cd, core_text(p), MAX_NEW, rng=rand)
            assert ct.tokenizer.to_hf(ref) == out.sequences[i]
            assert rand.used == len(out.uniforms[i])  # type: ignore[index]


@pytest.mark.parametrize("shape", ["static", "dynamic", pytest.param("wide", marks=pytest.mark.slow)])
def test_greedy_equals_the_targets_own_generate(models: dict[str, Any], toks: dict[str, Any], shape: str) -> None:
    tt = toks["byte_bpe"]
    target = models["llama_bpe"]
    own = [target_greedy(target, tt, p, 16) for p in PROMPTS]
    for drafter, dtemp in ((target, 1.5), (models["gpt2_bpe"], None)):
        out = generate(target, drafter, PROMPTS, target_tokenizer=tt, drafter_tokenizer=tt, method="sd",
                       tree=SHAPES[shape], max_new_tokens=16, do_sample=False, drafter_temperature=dtemp)
        assert out.sequences == own
        one = generate(target, drafter, PROMPTS[0], target_tokenizer=tt, drafter_tokenizer=tt, method="sd",
                       tree=SHAPES[shape], max_new_tokens=16, do_sample=False, drafter_temperature=dtemp)
        assert one.sequences[0] == own[0]


def test_a_tree_round_verifies_the_whole_tree_in_one_target_pass(models: dict[str, Any], toks: dict[str, Any]) -> None:
    """Target calls are rounds (one pass each); with the target as its own greedy drafter at
    temperature 1.5 a round of a depth-3 tree emits several tokens."""
    tt = toks["byte_bpe"]
    target = models["llama_bpe"]
    out = generate(target, target, PROMPTS[:2], target_tokenizer=tt, drafter_tokenizer=tt, method="sd",
                   tree=Static((2, 2, 2)), max_new_tokens=12, do_sample=False, drafter_temperature=1.5)
    for st in out.stats:
        assert st.tokens_per_target_call > 1.5
        assert st.proposed > 0 and st.accepted <= st.new_tokens


def test_tree_options_are_checked(models: dict[str, Any], toks: dict[str, Any]) -> None:
    tt = toks["byte_bpe"]
    target = models["llama_bpe"]
    base: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=tt, max_new_tokens=2)
    with pytest.raises(OutOfRange, match="tree"):
        generate(target, target, "x", method="sd", tree=(2, 1), **base)
    with pytest.raises(OutOfRange, match="draws"):
        generate(target, target, "x", method="sd", tree=Static((2,)), tree_draws="some", **base)
    with pytest.raises(OutOfRange, match="give tree= too"):
        generate(target, target, "x", method="sd", tree_draws="iid", **base)
    with pytest.raises(OptionNotTaken, match="tree"):
        generate(target, None, "x", method="ar", tree=Static((2,)), target_tokenizer=tt, max_new_tokens=2)


# ---------------------------------------------------------------------------------------------
# TLI-tree and SLEM-tree: different tokenizers

HPAIRS = {  # (target, target tokenizer, drafter, drafter tokenizer, drafter temperature)
    "bpe<-unigram": ("llama_bpe", "byte_bpe", "gpt2_uni_pad", "unigram", None),
    "fallback<-bpe": ("gpt2_fb_pad", "bpe_fallback", "llama_bpe", "byte_bpe", None),
    "unigram<-fallback": ("gpt2_uni_pad", "unigram", "gpt2_fb_pad", "bpe_fallback", None),
    "bpe<-self": ("llama_bpe", "byte_bpe", "llama_bpe", "byte_bpe", 1.5),
}
CORE = {"tli": CoreTLITree, "slem": CoreSLEMTree}


def check_hetero_mirror(models: dict[str, Any], toks: dict[str, Any], method: str, pair: str, shape: Any, *,
                        greedy: bool = False, draws: str = "distinct", batched: bool = True) -> None:
    t, tk, d, dk, dtemp = HPAIRS[pair]
    kw: dict[str, Any] = dict(target_tokenizer=toks[tk], drafter_tokenizer=toks[dk], method=method, tree=shape,
                              tree_draws=draws, max_new_tokens=MAX_NEW, seed=7, record_uniforms=True,
                              drafter_temperature=dtemp, do_sample=not greedy)
    prompts = PROMPTS[:4]
    if batched:
        outs = [(generate(models[t], models[d], prompts, **kw), i) for i in range(len(prompts))]
    else:
        outs = [(generate(models[t], models[d], [p], **kw), 0) for p in prompts]
    ct = CoreModel(models[t], toks[tk])
    cd = CoreModel(models[d], toks[dk], temperature=1.0 if dtemp is None else dtemp)
    ref_method = CORE[method](shape, greedy=greedy, draws=draws)
    for prompt, (out, i) in zip(prompts, outs):
        assert out.uniforms is not None
        rand = UniformRand(out.uniforms[i])
        ref = ref_method.generate(ct, cd, core_text(prompt), MAX_NEW, rng=rand)
        assert ct.tokenizer.to_hf(ref) == out.sequences[i], (method, pair, shape, greedy, prompt)
        assert rand.used == len(out.uniforms[i]), "the backend recorded a uniform the reference did not read"


SLOW_PAIRS = ("bpe<-unigram", "unigram<-fallback")  # the fast tier: a high- and a low-acceptance pair


@pytest.mark.parametrize("method,pair", [pytest.param(m, p, marks=pytest.mark.slow) if p in SLOW_PAIRS else (m, p)
                                         for m in ("tli", "slem") for p in sorted(HPAIRS)])
def test_mirror_hetero_trees(models: dict[str, Any], toks: dict[str, Any], method: str, pair: str) -> None:
    check_hetero_mirror(models, toks, method, pair, SHAPES["static"])


@pytest.mark.parametrize("method", ["tli", "slem"])
def test_mirror_hetero_trees_dynamic_iid_greedy_batch_of_one(models: dict[str, Any], toks: dict[str, Any],
                                                              method: str) -> None:
    check_hetero_mirror(models, toks, method, "bpe<-self", SHAPES["dynamic"], draws="iid", batched=False)
    check_hetero_mirror(models, toks, method, "fallback<-bpe", SHAPES["dynamic"], greedy=True)


@pytest.mark.parametrize("method", ["tli", "slem"])
def test_hetero_greedy_equals_the_targets_own_generate(models: dict[str, Any], toks: dict[str, Any],
                                                       method: str) -> None:
    for pair in ("bpe<-self", "fallback<-bpe"):
        t, tk, d, dk, dtemp = HPAIRS[pair]
        own = [target_greedy(models[t], toks[tk], p, 16) for p in PROMPTS]
        out = generate(models[t], models[d], PROMPTS, target_tokenizer=toks[tk], drafter_tokenizer=toks[dk],
                       method=method, tree=SHAPES["static"], max_new_tokens=16, do_sample=False,
                       drafter_temperature=dtemp)
        assert out.sequences == own, (method, pair)


def test_what_trees_do_not_take_is_refused(models: dict[str, Any], toks: dict[str, Any]) -> None:
    """Logits processors and min_new_tokens act on one context per position; a tree node has its own:
    refused with a clear error rather than applied to the wrong context."""
    from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

    tt = toks["byte_bpe"]
    target = models["llama_bpe"]
    base: dict[str, Any] = dict(target_tokenizer=tt, drafter_tokenizer=tt, method="sd", tree=Static((2,)),
                                max_new_tokens=3)
    with pytest.raises(ValueError, match="logits processors or min_new_tokens"):
        generate(target, target, "x", logits_processor=LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.2)]),
                 **base)
    with pytest.raises(ValueError, match="logits processors or min_new_tokens"):
        generate(target, target, "x", min_new_tokens=2, **base)
