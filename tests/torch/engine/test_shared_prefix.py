"""A batch's shared prompt prefix fed once (``Runner._prefill_shared``): the first feed of a batch whose
rows' blocks start with the same ids runs those ids as one row and copies that row's cache to every row.
What each row computes, what the runner records for it, and what ``generate`` draws are those of the
feed without it (float64 tiny models: equal to 1e-12, draws identical)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hsd_torch.engine.runner import Runner  # noqa: E402
from hsd_torch.generate import generate  # noqa: E402

PREFIX = [5, 9, 14, 3, 22]
TAILS = [[7, 8], [7], [30, 31, 32], [2, 7, 11]]


def _unshared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Runner, "_prefill_shared", lambda self, blocks, starts: 0)


def _record(run: Runner) -> tuple[Any, ...]:
    return (run.ids, run.cols, run.positions, run.calls, run.high, run.recomputed, run.columns.width,
            run.columns.mask.tolist())


def _two_feeds(model: Any, starts: list[int], width: int | None) -> tuple[Runner, list[Any], int]:
    """A runner of 4 rows fed ``PREFIX + tail`` (reading ``width`` columns from ``starts``), then one id
    more per row (a ragged second feed: row 1 feeds nothing); the logits of both feeds and the ids shared."""
    run = Runner(model, len(TAILS), 0, "target")
    shared: list[int] = []
    spy = run._prefill_shared

    def seen(blocks: Any, st: Any) -> int:
        shared.append(spy(blocks, st))
        return shared[-1]

    run._prefill_shared = seen  # type: ignore[method-assign]
    with torch.inference_mode():
        first = run.feed([PREFIX + t for t in TAILS], starts, width)
        second = run.feed([[40 + i] if i != 1 else [] for i in range(len(TAILS))], [0] * len(TAILS), None)
    return run, [first, second], shared[0]


@pytest.mark.parametrize("starts,width,n", [([4, 5, 6, 5], 2, 4), ([0, 0, 0, 0], 1, 0), ([6, 5, 7, 8], None, 5),
                                            ([3, 5, 7, 8], None, 3)])
def test_the_shared_prefix_computes_and_records_what_the_whole_blocks_do(
        llama_uni: dict[str, Any], monkeypatch: pytest.MonkeyPatch, starts: list[int], width: int | None,
        n: int) -> None:
    """Shared: the ids before the first column any row reads and before every row's last id (``n``);
    the logits of the first feed and of a ragged second one, and every count and column the runner
    records, are those of the blocks fed whole (``n = 0``: nothing shared when a row reads column 0)."""
    torch.set_num_threads(1)
    model = llama_uni["target"]
    run, logits, got = _two_feeds(model, starts, width)
    assert got == n
    _unshared(monkeypatch)
    ref, ref_logits, none = _two_feeds(model, starts, width)
    assert none == 0
    for a, b in zip(logits, ref_logits):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert _record(run) == _record(ref)


def test_generate_draws_the_same_with_a_shared_prompt(llama_uni: dict[str, Any],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Six rows of one prompt, SD and AR sampled: the sequences and each row's counts are those drawn
    with the prefix fed by every row."""
    torch.set_num_threads(1)
    t, tt = llama_uni["target"], llama_uni["tt"]
    ids = [tt("the cat sat on")["input_ids"]] * 6
    assert len(ids[0]) >= 3

    def draw() -> list[Any]:
        outs = []
        for method, drafter in (("sd", t), ("ar", None)):
            o = generate(t, drafter, input_ids=ids, target_tokenizer=tt, drafter_tokenizer=tt if drafter else None,
                         method=method, lookahead=3, max_new_tokens=5, seed=3)
            outs.append((o.sequences, [(s.new_tokens, s.target_calls, s.proposed, s.accepted) for s in o.stats]))
        return outs

    shared = draw()
    _unshared(monkeypatch)
    assert shared == draw()
