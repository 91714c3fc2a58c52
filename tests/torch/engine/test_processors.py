"""transformers' calling conventions: ``logits_processor``, ``min_new_tokens`` and
``stop_strings`` (``hsd_torch.engine.processors``).

- Greedy output equals the target's own ``generate`` with the same processors / minimum / stop
  strings, for every method (the processors are applied at every verified position with that
  position's context; a processor that depends on the context, transformers' repetition penalty and
  n-gram ban, shows it), and the generation config's ``min_new_tokens`` / ``stop_strings`` apply.
- Sampled: with a processor that halves the logits and top-k 8, the first two new tokens of SD and
  TLI follow the target's law at temperature 2 (N = 3,000, alpha 1e-3, detectable TV stated by the
  audit, 0.09); a variant that processes only a round's first position (TV about 0.14) is caught.
- Stop strings follow transformers' ``StopStringCriteria`` (its docstring's overhang cases).
- Stateful processors and bad values are refused before any forward pass.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import GenerationConfig, LogitsProcessorList  # noqa: E402
from transformers.generation.logits_process import (NoRepeatNGramLogitsProcessor,  # noqa: E402
                                                    RepetitionPenaltyLogitsProcessor,
                                                    UnbatchedClassifierFreeGuidanceLogitsProcessor)

from _torch_checks import own_greedy  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.auditing.first_tokens import audit_generate  # noqa: E402
from hsd_torch.engine.processors import StopStrings  # noqa: E402

torch.set_num_threads(1)
PROMPTS = ["def foo(x):\n", "Hello", "import os\n"]
BOUNDED = {"lookahead": 2, "proposal_map": "longest_prefix", "min_path_prob": 0.05}
METHODS = [("ar", None, {}), ("sd", "self", {}), ("tli", "d", {}), ("slem", "d", {}), ("slrs", "d", {"lookahead": 1}),
           ("slrs", "d", BOUNDED)]


class EosBoost:
    """Adds 50 to the EOS score: the target ends at once unless something forbids it."""

    def __init__(self, eos: int) -> None:
        self.eos = eos

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        out = scores.clone()
        out[:, self.eos] += 50.0
        return out


def _halve(input_ids: Any, scores: Any) -> Any:
    return scores / 2


@pytest.fixture(scope="module")
def world(llama_uni: dict[str, Any], models: dict[str, Any]) -> dict[str, Any]:
    return dict(llama_uni, self=models["gpt2_bpe"])


def _run(world: dict[str, Any], method: str, d: str | None, extra: dict[str, Any], prompts: Any, **kw: Any) -> Any:
    drafter = world["drafter"] if d == "d" else world["self"] if d == "self" else None
    dt = world["dt"] if d == "d" else world["tt"] if d == "self" else None
    args: dict[str, Any] = dict(target_tokenizer=world["tt"], drafter_tokenizer=dt, method=method, lookahead=3,
                                max_new_tokens=16, do_sample=False)
    args.update(extra)
    args.update(kw)
    return generate(world["target"], drafter, prompts, **args)


def _own(world: dict[str, Any], prompt: str, n: int = 16, **kw: Any) -> list[int]:
    tt = world["tt"]
    return own_greedy(world["target"], tt(prompt)["input_ids"], n, tt.eos_token_id, **kw)


@pytest.mark.parametrize("method,d,extra", METHODS, ids=[f"{m}-{len(e)}" for m, _, e in METHODS])
def test_context_dependent_processors_greedy_is_transformers(world: dict[str, Any], method: str, d: str | None,
                                                             extra: dict[str, Any]) -> None:
    def procs() -> LogitsProcessorList:
        return LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.8), NoRepeatNGramLogitsProcessor(2)])

    want = [_own(world, p, logits_processor=procs()) for p in PROMPTS]
    assert want != [_own(world, p) for p in PROMPTS]  # the processors change the greedy output here
    got = _run(world, method, d, extra, PROMPTS, logits_processor=procs())
    assert got.sequences == want


@pytest.mark.parametrize("method,d,extra", METHODS, ids=[f"{m}-{len(e)}" for m, _, e in METHODS])
def test_min_new_tokens_greedy_is_transformers(world: dict[str, Any], method: str, d: str | None,
                                               extra: dict[str, Any]) -> None:
    eos = world["tt"].eos_token_id
    boost = LogitsProcessorList([EosBoost(eos)])
    assert _own(world, PROMPTS[0], logits_processor=boost) == [eos]  # without a minimum the row ends at once
    want = [_own(world, p, logits_processor=LogitsProcessorList([EosBoost(eos)]), min_new_tokens=5) for p in PROMPTS]
    assert all(len(w) == 6 and w[-1] == eos for w in want)
    got = _run(world, method, d, extra, PROMPTS, logits_processor=[EosBoost(eos)], min_new_tokens=5)
    assert got.sequences == want
    via_config = _run(world, method, d, extra, PROMPTS, logits_processor=[EosBoost(eos)],
                      generation_config=GenerationConfig(min_new_tokens=5))
    assert via_config.sequences == want


@pytest.mark.parametrize("method,d,extra", METHODS, ids=[f"{m}-{len(e)}" for m, _, e in METHODS])
def test_stop_strings_greedy_is_transformers(world: dict[str, Any], method: str, d: str | None,
                                             extra: dict[str, Any]) -> None:
    tt = world["tt"]
    plain = [_own(world, p) for p in PROMPTS]
    stops = [" ", "\n"]
    want = [_own(world, p, stop_strings=stops, tokenizer=tt) for p in PROMPTS]
    assert any(len(w) < len(q) for w, q in zip(want, plain))  # a stop string cut some row short here
    assert _run(world, method, d, extra, PROMPTS, stop_strings=stops).sequences == want
    assert _run(world, method, d, extra, PROMPTS,
                generation_config=GenerationConfig(stop_strings=stops)).sequences == want


@pytest.mark.parametrize("method", ["sd", "tli"])
def test_processed_sampled_law_is_the_targets(world: dict[str, Any], method: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The target drafts for itself (same tokenizer), so most rows' second token is verified at a
    round's second position (1.6 accepted drafts per row here), where the lossy variant differs."""
    tt, prompt, n = world["tt"], PROMPTS[0], 3000

    def audit() -> Any:
        rows = generate(world["target"], world["target"], [prompt] * n, target_tokenizer=tt, drafter_tokenizer=tt,
                        method=method, lookahead=3, max_new_tokens=2, top_k=8, seed=5,
                        logits_processor=[_halve]).sequences
        it = iter(rows)
        return audit_generate(lambda _p, _s: next(it), world["target"], tt, prompt, n=n, temperature=2.0, top_k=8,
                              alpha=1e-3, seed=1, max_detectable_tv=0.15)

    rep = audit()
    assert rep.detectable_tv is not None and rep.detectable_tv < 0.15
    assert rep.verdict == "lossless-consistent", rep.reason
    # a lossy variant: the processors applied at a round's first verified position only (TV about 0.14)
    import hsd_torch.engine.processors as hp
    import hsd_torch.engine.verification as hv

    real = hp.process_target_logits

    def first_only(logits: Any, contexts: Any, positions: Any, *a: Any) -> Any:
        return real(logits, contexts, [min(p, 1) for p in positions], *a)

    monkeypatch.setattr(hv, "process_target_logits", first_only)
    assert audit().verdict == "lossy"


@pytest.mark.parametrize("pieces,prompt,want", [
    ([b"st", b"op"], b"", 1), ([b"stop"], b"", 0), ([b"st", b"opera"], b"", 1), ([b"sto", b"pper"], b"", 1),
    ([b"las", b"topper"], b"", 1), ([b"s", b"to", b"pped"], b"", 2), ([b"stop", b"at"], b"", 0),
    ([b"op"], b"xst", 0), ([b"x", b"y"], b"a stop", None), ([b"", b"sto", b"", b"p"], b"", 3),
])
def test_stop_strings_match_transformers_overhang_rules(pieces: list[bytes], prompt: bytes, want: int | None) -> None:
    s = StopStrings([b"stop"], [prompt])
    assert s.first_stop(0, pieces) == want
    split = StopStrings([b"stop"], [prompt])  # the same text fed over two rounds
    k = len(pieces) // 2
    first = split.first_stop(0, pieces[:k])
    second = split.first_stop(0, pieces[k:]) if first is None else None
    got = first if first is not None else (None if second is None else k + second)
    assert got == want


@pytest.mark.parametrize("kwargs,err,match", [
    (dict(logits_processor=[UnbatchedClassifierFreeGuidanceLogitsProcessor(1.5, None)]), ValueError,
     "keeps state between calls"),
    (dict(logits_processor=[3]), TypeError, r"logits_processor\[0\] is not callable"),
    (dict(logits_processor="x"), TypeError, "logits_processor must be"),
    (dict(stop_strings=""), ValueError, "empty string"),
    (dict(stop_strings=[1]), TypeError, "stop_strings must be"),
    (dict(min_new_tokens=-1), ValueError, "min_new_tokens"),
])
def test_bad_processing_is_refused_before_any_work(world: dict[str, Any], kwargs: dict[str, Any], err: type,
                                                   match: str) -> None:
    from _torch_checks import counting_forwards

    with counting_forwards(world["target"]) as forwards, pytest.raises(err, match=match):
        _run(world, "ar", None, {}, "x", **kwargs)
    assert forwards == [0]


def test_a_processor_returning_the_wrong_shape_is_named(world: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"returned torch.Size\(\[3\]\), not scores of shape"):
        _run(world, "ar", None, {}, "x", logits_processor=[lambda ids, s: s[0, :3]])
