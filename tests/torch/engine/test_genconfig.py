"""What ``generate`` takes from a generation config (docs/generate.md, "What generate
takes from a generation config"):
``hsd_torch.engine.genconfig``. The end ids are honoured (the target's own config, or the caller's
``generation_config=``); fields that change the law are refused before any forward pass, naming the
field, unless set to their neutral value; the models are never modified."""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import GenerationConfig  # noqa: E402

from _torch_checks import counting_forwards, fingerprint  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.engine.genconfig import REFUSED, check_generation_config  # noqa: E402

torch.set_num_threads(1)
PROMPT = "def foo(x):\n"


def run(llama_uni: dict[str, Any], target: Any = None, **kw: Any) -> Any:
    return generate(llama_uni["target"] if target is None else target, llama_uni["drafter"], PROMPT, target_tokenizer=llama_uni["tt"],
                    drafter_tokenizer=llama_uni["dt"], method="tli", max_new_tokens=6, do_sample=False, **kw)


def test_every_refused_field_is_a_generation_config_field() -> None:
    fresh = GenerationConfig()
    for name in REFUSED:
        assert hasattr(fresh, name), name
        check_generation_config(GenerationConfig(**{name: None}), "x")  # unset: accepted


SET = [("repetition_penalty", 1.3), ("no_repeat_ngram_size", 2), ("min_length", 3), ("num_beams", 2),
       ("suppress_tokens", [5]), ("typical_p", 0.9), ("min_p", 0.1)]
# min_new_tokens and stop_strings were refused here until generate honoured them:
# tests/torch/engine/test_processors.py checks the config's values are applied


@pytest.mark.parametrize("name,value", SET, ids=[n for n, _ in SET])
def test_the_targets_config_that_changes_the_law_is_refused_before_any_work(name: str, value: Any,
                                                                           llama_uni: dict[str, Any]) -> None:
    target = copy.deepcopy(llama_uni["target"])
    setattr(target.generation_config, name, value)
    before = fingerprint(target)
    with counting_forwards(target, llama_uni["drafter"]) as forwards:
        with pytest.raises(ValueError, match=f"the target's generation_config sets {name}="):
            run(llama_uni, target)
    assert forwards[0] == 0 and fingerprint(target) == before
    with pytest.raises(ValueError, match=f"generation_config sets {name}="):  # the caller's config: the same
        run(llama_uni, generation_config=GenerationConfig(**{name: value}))
    # a clean config of the caller's replaces the model's
    assert run(llama_uni, target, generation_config=GenerationConfig()).sequences == run(llama_uni).sequences


@pytest.mark.parametrize("name,value", [("repetition_penalty", 1.0), ("num_beams", 1), ("min_length", 0),
                                        ("suppress_tokens", []), ("typical_p", 1.0)])
def test_neutral_values_are_accepted(name: str, value: Any, llama_uni: dict[str, Any]) -> None:
    assert run(llama_uni, generation_config=GenerationConfig(**{name: value})).sequences == run(llama_uni).sequences


def test_the_callers_end_ids_end_the_row(llama_uni: dict[str, Any]) -> None:
    """``generation_config=GenerationConfig(eos_token_id=[...])``: the row ends at the first of those
    ids, as ``target.generate`` with that config does; the model's own config is not touched."""
    tok, target = llama_uni["tt"], llama_uni["target"]
    plain = run(llama_uni).sequences[0]
    stop = plain[2]
    cfg = GenerationConfig(eos_token_id=[tok.eos_token_id, stop])
    out = run(llama_uni, generation_config=cfg).sequences[0]
    assert out == plain[:plain.index(stop) + 1]
    enc = tok(PROMPT, return_tensors="pt")
    want = target.generate(**enc, generation_config=GenerationConfig(eos_token_id=[tok.eos_token_id, stop],
                                                                     max_new_tokens=6, do_sample=False,
                                                                     pad_token_id=tok.eos_token_id))
    assert out == want[0, enc.input_ids.shape[1]:].tolist()
    assert target.generation_config.eos_token_id != cfg.eos_token_id


def test_a_config_that_is_not_a_generation_config_is_a_type_error(llama_uni: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match="generation_config must be None or a transformers.GenerationConfig"):
        run(llama_uni, generation_config={"eos_token_id": 2})
