"""The law is the target's own by default (README.md, "Real models"; docs/generate.md, "What it
promises"), and the end of generation.

- ``generate(mask_textless=False)`` (the default) keeps every id of the target's logits in its law:
  a special token without text (``<unk>``) or a padded embedding's id is emitted where the target
  puts its argmax there, exactly as ``target.generate(do_sample=False)`` does, for every method;
  ``mask_textless=True`` (the previous behaviour, ``hsd_core``'s setting) removes them.
- A row ends at any id of the target's ``generation_config.eos_token_id`` (a list, as Llama-3 and
  instruct models ship), also when that id is accepted inside a round of drafts.
- Sampled: the first new token of each method against the target's whole processed law (top-k 6)
  at a state where ids without text hold most of the mass, N = 4,000 per method (chi-square at
  alpha 1e-6: power 0.99 at the TV ``EPS`` asserted below), and the masked law is rejected there.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.stats import assert_law_matches, min_num_samples_for_tv, min_tv_detectable  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402
from hsd_torch.generate import process_logits  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402

torch.set_num_threads(1)
F64 = torch.float64
PROMPT = "def foo(x):\n"
METHODS = [("ar", {}), ("sd", {}), ("tli", {}), ("slem", {}), ("slrs", {"lookahead": 1}),
           ("slrs", {"lookahead": 2, "proposal_map": "longest_prefix", "min_path_prob": 0.05})]
IDS = [m + str(kw.get("lookahead", "")) for m, kw in METHODS]
TOP_K, ALPHA, POWER, N = 6, 1e-6, 0.99, 4_000
EPS = 0.09  # detectable TV at N on <= 6 cells (asserted)


def width(model: Any) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def with_bias(model: Any, bias: dict[int, float]) -> Any:
    """``model`` with an output head that adds ``bias`` (modifies it: pass a fresh model)."""
    head = model.get_output_embeddings()
    new = torch.nn.Linear(head.weight.shape[1], head.weight.shape[0], bias=True, dtype=head.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(head.weight)
        new.bias.zero_()
        for i, v in bias.items():
            new.bias[i] = v
    model.set_output_embeddings(new)
    return model


@pytest.fixture(scope="module")
def world() -> dict[str, Any]:
    """A tiny Llama target whose head favours ``<unk>`` and a padded embedding id (no text), its
    same-tokenizer drafter for SD (the same bias), a Unigram GPT-2 drafter for the others."""
    bpe, uni = tiny.tiny_tokenizer("byte_bpe"), tiny.tiny_tokenizer("unigram")
    pad = len(bpe) + 3  # an id of the padded embedding
    bias = {bpe.unk_token_id: 10.0, pad: 9.0}  # about half the first new token's mass at PROMPT
    target = with_bias(tiny.tiny_llama(bpe, seed=0, vocab_size=len(bpe) + 8, dtype=F64), bias)
    same = with_bias(tiny.tiny_llama(bpe, seed=5, vocab_size=len(bpe) + 8, dtype=F64), bias)
    drafter = tiny.tiny_gpt2(uni, seed=1, vocab_size=len(uni) + 32, dtype=F64)
    return {"target": target, "tt": bpe, "same": same, "drafter": drafter, "dt": uni, "textless": set(bias)}


def run(world: dict[str, Any], method: str, kw: dict[str, Any], target: Any = None, **more: Any) -> Any:
    sd = method == "sd"
    drafter = None if method == "ar" else world["same"] if sd else world["drafter"]
    return generate(world["target"] if target is None else target, drafter, PROMPT, target_tokenizer=world["tt"],
                    drafter_tokenizer=None if drafter is None else world["tt"] if sd else world["dt"], method=method,
                    **kw, **more)


def own_greedy(target: Any, tok: Any, n: int) -> list[int]:
    enc = tok(PROMPT, return_tensors="pt")
    out = target.generate(**enc, max_new_tokens=n, do_sample=False, pad_token_id=tok.eos_token_id)
    return [int(t) for t in out[0, enc.input_ids.shape[1]:]]


@pytest.mark.parametrize("method,kw", METHODS, ids=IDS)
def test_greedy_is_the_targets_own_generate_with_ids_without_text(method: str, kw: dict[str, Any],
                                                                  world: dict[str, Any]) -> None:
    want = own_greedy(world["target"], world["tt"], 8)
    assert world["textless"] & set(want)  # the target's own greedy emits ids without text here
    out = run(world, method, kw, max_new_tokens=8, do_sample=False)
    assert out.sequences[0] == want
    masked = run(world, method, kw, max_new_tokens=8, do_sample=False, mask_textless=True)
    assert not world["textless"] & set(masked.sequences[0])  # the option removes them


@pytest.mark.parametrize("method,kw", METHODS, ids=IDS)
def test_a_row_ends_at_any_end_id_of_the_generation_config(method: str, kw: dict[str, Any],
                                                           world: dict[str, Any]) -> None:
    """The generation config's end ids: [EOS, the target's third greedy id]; every method stops
    there, as ``target.generate`` does (lookahead 4: often inside a round of accepted drafts)."""
    third = own_greedy(world["target"], world["tt"], 3)[2]
    target = copy.deepcopy(world["target"])
    target.generation_config.eos_token_id = [world["tt"].eos_token_id, third]
    want = own_greedy(target, world["tt"], 8)
    assert want[-1] == third and len(want) <= 3
    out = run(world, method, kw, target=target, max_new_tokens=8, do_sample=False)
    assert out.sequences[0] == want


def test_the_sampled_test_is_sized() -> None:
    assert min_num_samples_for_tv(TOP_K, EPS, ALPHA, POWER) <= N
    assert min_tv_detectable(TOP_K, N, ALPHA, POWER) <= EPS


def first_token_law(world: dict[str, Any], mask_textless: bool) -> dict[tuple[int, ...], float]:
    target, tok = world["target"], world["tt"]
    text = TokenText(tok, width(target))
    mask = text.text_mask if mask_textless else torch.ones(width(target), dtype=torch.bool)
    with torch.inference_mode():
        logits = target(torch.tensor([text.prompt_ids(PROMPT)])).logits[0, -1]
    p = process_logits(logits, mask, top_k=TOP_K)
    return {(int(i),): float(p[i]) for i in torch.nonzero(p).flatten()}


@pytest.mark.parametrize("method,kw", METHODS[1:], ids=IDS[1:])
def test_first_token_follows_the_targets_whole_law(method: str, kw: dict[str, Any], world: dict[str, Any]) -> None:
    law = first_token_law(world, mask_textless=False)
    assert sum(v for (t,), v in law.items() if t in world["textless"]) > 0.3  # the point of the state
    out = generate(world["target"], world["same"] if method == "sd" else world["drafter"], [PROMPT] * N,
                   target_tokenizer=world["tt"], drafter_tokenizer=world["tt"] if method == "sd" else world["dt"],
                   method=method, max_new_tokens=1, top_k=TOP_K, seed=11, **kw)
    samples = [tuple(s) for s in out.sequences]
    assert_law_matches(law, samples, alpha=ALPHA, eps=EPS, power=POWER)
    with pytest.raises(AssertionError, match="rejected"):  # the masked law is not what was sampled
        assert_law_matches(first_token_law(world, mask_textless=True), samples, alpha=ALPHA)
