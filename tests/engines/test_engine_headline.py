"""The headline of an engine audit (:func:`hsd_torch.auditing.samples.audit_samples`) is never
"lossless-consistent" without power (issue 48, item 6): 8 draws of the tiny Llama target's own law
(4 tokens each) with an 8-draw baseline could not have been found "lossy" at alpha 1e-3 by any test
(the two-sample family detects nothing; the sequence audit's promise is far above
max_detectable_tv), so the headline is "inconclusive" and names the number of draws that would
fit. Before the fix it read "lossless-consistent" (the two-sample test, none of whose tests had
any power, said "lossless-consistent", and that made the headline). Fast tier (a few seconds, a 2-layer model)."""

from __future__ import annotations

import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.samples import Draw, Sampling, write_samples  # noqa: E402
from hsd_core.seqaudit import sequence_seeds  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.auditing.samples import audit_samples  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402

PROMPT, L, N = "def foo(x):\n", 4, 8
SAMPLING = Sampling(True, 1.0, None, None, L)


def _file(path: Any, target: Any, tok: Any, seed: int, speculative: Any) -> Any:
    seeds = sequence_seeds(seed, N)
    out = generate(target, None, [PROMPT] * N, method="ar", target_tokenizer=tok, max_new_tokens=L,
                   seed=seeds[0]).sequences
    pid = tuple(tok(PROMPT)["input_ids"])
    return write_samples(path, [Draw(ids=tuple(o), seed=s, prompt=PROMPT, prompt_ids=pid) for o, s in zip(out, seeds)],
                         engine={"name": "e", "version": "1"}, sampling=SAMPLING, speculative=speculative)


def test_an_audit_without_power_is_inconclusive_and_says_what_would_fit(tmp_path: Any) -> None:
    torch.set_num_threads(1)
    tok = tiny.tiny_tokenizer("byte_bpe")
    target = tiny.tiny_llama(tok, seed=0)
    spec = _file(tmp_path / "spec.jsonl", target, tok, 0, {"method": "test"})
    base = _file(tmp_path / "base.jsonl", target, tok, 1, None)
    rep = audit_samples(spec, target, tok, baseline=base, context_bugs=None)
    assert rep.two_sample is not None and all(q.detectable is None for q in rep.two_sample.powers)
    assert rep.verdict == "inconclusive", rep.reason
    m = re.search(r"about (\d+) draws per file would reach max_detectable_tv", rep.reason)
    assert m is not None and int(m.group(1)) > N, rep.reason
    alone = audit_samples(spec, target, tok, context_bugs=None)
    assert alone.verdict == "inconclusive" and "draws per file would reach" in alone.reason


@pytest.mark.parametrize(("bad", "named"), [
    ((5, 6, 7, 10**9), "sequence 3: id 1000000000 outside the target's 384 ids"),
    ((5, 6, 7, 8) * 3, "sequence 3: 12 tokens, more than max_new_tokens 4"),
])
def test_a_lossy_headline_names_the_engine_error_first(tmp_path: Any, bad: tuple[int, ...], named: str) -> None:
    """Issue 48, item 4, for samples files: a draw that is no draw of the target (an id outside its
    vocabulary, more ids than max_new_tokens) makes the verdict "lossy" and the headline's first
    words name it, with its file."""
    tok = tiny.tiny_tokenizer("byte_bpe")
    target = tiny.tiny_llama(tok, seed=0)
    pid = tuple(tok(PROMPT)["input_ids"])
    draws = [Draw(ids=bad if i == 3 else (5, 6, 7, 8), seed=i, prompt=PROMPT, prompt_ids=pid) for i in range(8)]
    f = write_samples(tmp_path / "x.jsonl", draws, engine={"name": "e", "version": "1"}, sampling=SAMPLING,
                      speculative={"method": "test"})
    rep = audit_samples(f, target, tok, context_bugs=None)
    assert rep.verdict == "lossy" and rep.reason.startswith(f"engine error in x.jsonl: {named}"), rep.reason
