"""A batch's shared prompt prefix fed once (``hsd_torch.engine.runner.shared_prefix``): the first feed of a batch
whose rows' blocks start with the same ids runs those ids as one row and copies that row's cache to every row.
What each row computes, what the runner records for it, and what ``generate`` draws are those of the
feed without it (float64 tiny models: equal to 1e-12, draws identical)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hsd_torch.engine import runner as runner_mod  # noqa: E402
from hsd_torch.engine.runner import Runner  # noqa: E402
from hsd_torch.generate import generate  # noqa: E402

PREFIX = [5, 9, 14, 3, 22]
TAILS = [[7, 8], [7], [30, 31, 32], [2, 7, 11]]


def _unshared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_mod, "shared_prefix", lambda run, blocks, starts, width, head_rows: (0, []))


def _record(run: Runner) -> tuple[Any, ...]:
    return (run.ids, run.cols, run.positions, run.calls, run.high, run.recomputed, run.columns.width,
            run.columns.mask.tolist())


def _two_feeds(model: Any, tails: list[list[int]], starts: list[int], width: int | None,
               monkeypatch: pytest.MonkeyPatch) -> tuple[Runner, list[Any], tuple[int, bool]]:
    """A runner of 4 rows fed ``PREFIX + tail`` (reading ``width`` columns from ``starts``), then one id
    more per row (a ragged second feed: row 1 feeds nothing); the logits of both feeds, and the ids shared
    with whether their logits were read from the one row (what ``shared_prefix`` answered first)."""
    run = Runner(model, len(tails), 0, "target")
    shared: list[tuple[int, bool]] = []
    spy = runner_mod.shared_prefix

    def seen(r: Runner, blocks: Any, st: Any, w: int, head_rows: Any) -> tuple[int, list[int]]:
        n, read = spy(r, blocks, st, w, head_rows)
        shared.append((n, bool(read)))
        return n, read

    with monkeypatch.context() as m, torch.inference_mode():
        m.setattr(runner_mod, "shared_prefix", seen)
        first = run.feed([PREFIX + t for t in tails], starts, width)
        second = run.feed([[40 + i] if i != 1 else [] for i in range(len(tails))], [0] * len(tails), None)
    return run, [first, second], shared[0]


SAME = [[7]] * 4


@pytest.mark.parametrize("tails,starts,width,n,whole", [
    (TAILS, [4, 5, 6, 5], 2, 4, False), (TAILS, [0, 0, 0, 0], 1, 0, False), (TAILS, [6, 5, 7, 8], None, 5, False),
    (TAILS, [3, 5, 7, 8], None, 3, False), (TAILS, [4] * 4, 2, 5, True), (TAILS, [5] * 4, 2, 5, True),
    (SAME, [5] * 4, None, 6, True), (SAME, [3] * 4, 3, 6, True)])
def test_the_shared_prefix_computes_and_records_what_the_whole_blocks_do(
        llama_uni: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tails: list[list[int]], starts: list[int],
        width: int | None, n: int, whole: bool) -> None:
    """Shared: with the same reads in every row (within the blocks), the whole common prefix (``n``), its
    logits read from the one row (``whole``; all of it when every block is the prefix: no other forward);
    else the ids before the first column any row reads and before every row's last id. The logits of the
    first feed and of a ragged second one, and every count and column the runner records, are those of the
    blocks fed whole (``n = 0``: nothing shared when a row reads column 0)."""
    torch.set_num_threads(1)
    model = llama_uni["target"]
    run, logits, got = _two_feeds(model, tails, starts, width, monkeypatch)
    assert got == (n, whole)
    _unshared(monkeypatch)
    ref, ref_logits, none = _two_feeds(model, tails, starts, width, monkeypatch)
    assert none == (0, False)
    for a, b in zip(logits, ref_logits):
        assert a.shape == b.shape
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
