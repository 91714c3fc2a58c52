"""How often the audits call a law provider (:mod:`hsd_torch.auditing.reference`), counted by a fake
provider that records each call: the sequence audit forces a draw with **one** call for all its
positions (one more per named context bug), the first-token audit calls once per prefix it expands,
the two-sample scores of draws a sequence audit forced cost no call, and every report states the
counts it made (the sequence report's ``calls``, the first-token report's ``provider_calls``, the
engine audit's note). Tiny Llama target (byte-level BPE), 60 draws of 6 tokens a file; these are
counting tests (no statistical claim): the verdicts are not asserted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.samples import Draw, Sampling, write_samples  # noqa: E402
from hsd_core.seqaudit import sequence_seeds  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.auditing.first_tokens import audit_generate  # noqa: E402
from hsd_torch.auditing.reference import ProvidedLaw  # noqa: E402
from hsd_torch.auditing.samples import audit_samples  # noqa: E402
from hsd_torch.auditing.sequences import audit_sequences  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402

torch.set_num_threads(1)

PROMPT, L, N = "def foo(x):\n", 6, 60


class Counting:
    """The target's raw log-probabilities as a law provider, recording each call's ``(len(prompt_ids),
    len(ids))``."""

    def __init__(self, target: Any) -> None:
        self.target, self.calls = target, []  # type: list[tuple[int, int]]

    @torch.inference_mode()
    def __call__(self, prompt_ids: list[int], ids: list[int]) -> np.ndarray:
        self.calls.append((len(prompt_ids), len(ids)))
        lg = self.target(input_ids=torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1:-1].double()
        out: np.ndarray = torch.log_softmax(lg, -1).numpy()
        return out


class CountingMany(Counting):
    """:class:`Counting` with ``many(pairs)``, as :class:`hsd_torch.engines.vllm_audit.VllmLaws` has:
    every pair is recorded as a call, and each ``many`` as one request."""

    def __init__(self, target: Any) -> None:
        super().__init__(target)
        self.requests = 0

    def many(self, pairs: list[tuple[list[int], list[int]]]) -> list[np.ndarray]:
        self.requests += 1
        return [self(p, ids) for p, ids in pairs]


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any]:
    tok = tiny.tiny_tokenizer("byte_bpe")
    return tiny.tiny_llama(tok, seed=0), tok


@pytest.fixture(scope="module")
def draws(pair: Any) -> list[list[int]]:
    """N draws of L new ids (AR, seeded as the sequence audit seeds sequence i); none ends early
    (the tiny target's EOS is unlikely, and a draw that ends is still forced in one call)."""
    target, tok = pair
    seeds = sequence_seeds(0, N)
    return [list(generate(target, None, [PROMPT], target_tokenizer=tok, max_new_tokens=L, method="ar",
                          seed=seeds[i]).sequences[0]) for i in range(N)]


def _replay(draws: list[list[int]]) -> Any:
    it = iter(draws)
    return lambda prompts, seeds: [next(it) for _ in prompts]


@pytest.mark.parametrize("bugs", [None, ("prompt_last_twice",)])
def test_the_sequence_audit_forces_a_draw_in_one_call(pair: Any, draws: list[list[int]], bugs: Any) -> None:
    target, tok = pair
    fake = Counting(target)
    rep = audit_sequences(None, target, tok, PROMPT, n=N, max_new_tokens=L, sample_batch_fn=_replay(draws),
                          reference=fake, context_bugs=bugs, batch_size=16)
    per_draw = 1 + (len(bugs) if bugs else 0)
    assert len(fake.calls) == per_draw * N  # not one per position: N * L would be 360 (x2 with the bug)
    assert sorted(k for _, k in fake.calls) == sorted(len(d) for d in draws for _ in range(per_draw))
    positions = sum(k for _, k in fake.calls)
    assert rep.calls == {"provider calls": per_draw * N, "provider positions": positions}
    assert f"teacher forcing: provider calls {per_draw * N}, provider positions {positions}" in rep.to_markdown()


def test_a_provider_with_many_gets_each_forced_batch_as_one_request(pair: Any, draws: list[list[int]]) -> None:
    target, tok = pair
    fake = CountingMany(target)
    law = ProvidedLaw(fake, target.config.vocab_size, "batched")
    rep = audit_sequences(None, target, tok, PROMPT, n=N, max_new_tokens=L, sample_batch_fn=_replay(draws),
                          reference=law, context_bugs=None, batch_size=16)
    assert len(fake.calls) == law.calls == N and fake.requests == law.requests == -(-N // 16)  # 4 chunks of 16
    assert rep.calls["provider calls"] == N
    assert law.usage() == f"{N} calls ({law.positions} positions) in 4 requests"


def test_the_first_token_audit_calls_once_per_expanded_prefix(pair: Any, draws: list[list[int]]) -> None:
    target, tok = pair
    fake = Counting(target)
    law = ProvidedLaw(fake, target.config.vocab_size, "counting")
    rep = audit_generate(None, target, tok, PROMPT, n=N, positions=2, sample_batch_fn=_replay(draws),
                         reference=law)
    assert rep.provider_calls == law.calls == len(fake.calls) >= rep.forward_passes >= 1
    assert all(k == 1 for _, k in fake.calls)  # the law after one context each
    assert f"reference: {rep.provider_calls} calls of the law provider" in rep.to_markdown()


def test_two_sample_scores_reuse_the_forced_draws_and_the_report_counts(pair: Any, draws: list[list[int]],
                                                                       tmp_path: Path) -> None:
    target, tok = pair
    seeds = sequence_seeds(0, N)
    files = []
    for name, spec, half in (("spec", {"method": "sd"}, draws[:N // 2]), ("plain", None, draws[N // 2:])):
        ds = [Draw(tuple(d), seed=seeds[i] + (0 if spec else 10_000), prompt=PROMPT) for i, d in enumerate(half)]
        files.append(write_samples(tmp_path / f"{name}.jsonl", ds, engine={"name": "e", "version": "1"},
                                   sampling=Sampling(True, 1.0, None, None, L), speculative=spec).path)
    fake = Counting(target)
    law = ProvidedLaw(fake, target.config.vocab_size, "counting")
    rep = audit_samples(files[0], target, tok, baseline=files[1], reference=law, context_bugs=None)
    seq = rep.audited.sequence.calls["provider calls"] + rep.null_control.sequence.calls["provider calls"]
    first = sum(r.provider_calls or 0 for f in (rep.audited, rep.null_control) for r in f.first_token)
    assert seq == N and len(fake.calls) == law.calls == seq + first  # the two-sample scores made no call
    note = next(x for x in rep.notes if x.startswith("the law provider counting"))
    assert f"was called {law.calls} times ({law.positions} positions): {seq} for the sequence audits" in note
    assert "0 for the two-sample scores" in note


def test_token_logprobs_are_the_providers_and_cost_no_call_once_forced(pair: Any, draws: list[list[int]]) -> None:
    target, tok = pair
    fake = Counting(target)
    law = ProvidedLaw(fake, target.config.vocab_size)
    ctx = tok(PROMPT)["input_ids"]
    rows = [ctx + d for d in draws[:3]]
    at = [range(len(ctx), len(r)) for r in rows]
    got = law.token_logprobs(rows, at)  # not forced yet: one call per row
    assert law.calls == 3 and law.positions == sum(len(d) for d in draws[:3])
    want = [fake(ctx, d)[np.arange(len(d)), d] for d in draws[:3]]
    assert all(np.abs(g - w).max() < 1e-12 for g, w in zip(got, want))
    law.forced(rows[:1], at[:1])
    assert law.calls == 4
    assert all(np.array_equal(g, h) for g, h in zip(law.token_logprobs(rows, at), got)) and law.calls == 4
    assert law.usage() == f"4 calls ({law.positions} positions)"
