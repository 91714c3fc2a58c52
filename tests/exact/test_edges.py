"""Tests for the edges that mutation testing found unguarded."""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hsd_core as hc
from hsd_core.exact import LossyError, assert_laws_equal
from hsd_core.methods import AR, SD, SLEM, SLRS, TLI, Resync, State
from hsd_core.methods.base import check_lookbehind, truncate
from hsd_core.worlds import builtin_world

ROOT = Path(__file__).resolve().parents[2]


def test_check_lookbehind() -> None:
    assert check_lookbehind(0) == 0 and check_lookbehind(np.int64(3)) == 3
    for bad in (-1, 1.5, True, None, "2"):
        with pytest.raises(ValueError, match="lookbehind"):
            check_lookbehind(bad)  # type: ignore[arg-type]
    for cls in (SLEM, SLRS):
        with pytest.raises(ValueError, match="lookbehind"):
            cls(lookbehind=-1)
        assert cls(lookbehind=0).lookbehind == 0


@pytest.mark.parametrize("prompt", [b"ab", 12, ["a"], None])
def test_prompt_must_be_a_str(prompt: Any) -> None:
    w = builtin_world()
    with pytest.raises(TypeError, match="prompt must be a str"):
        AR().generate(w.target, None, prompt, 2, rng=0)
    with pytest.raises(TypeError, match="prompt must be a str"):
        hc.exact.output_law(TLI(lookahead=2), w.target, w.drafter, prompt, 2)
    with pytest.raises(TypeError, match="prompt must be a str"):
        hc.exact.target_law(w.target, prompt, 2)


def test_target_law_checks_its_arguments() -> None:
    w = builtin_world()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_new_tokens"):
            hc.exact.target_law(w.target, w.prompt, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not in the vocabulary"):
        hc.exact.target_law(w.target, "xyz!", 2)


@pytest.mark.parametrize("method", [SD(lookahead=2), SLEM(lookahead=2), TLI(lookahead=2), SLRS(lookahead=2)],
                         ids=["SD", "SLEM", "TLI", "SLRS"])
def test_missing_drafter_is_a_value_error(method: Any) -> None:
    """check_models(target, drafter) with drafter=None is the documented ValueError, in generate and
    in the exact engine (with the arguments swapped it would be an AttributeError)."""
    w = builtin_world()
    with pytest.raises(ValueError, match="needs a drafter"):
        method.generate(w.target, None, w.prompt, 2, rng=0)
    with pytest.raises(ValueError, match="needs a drafter"):
        hc.exact.analyze(method, w.target, None, w.prompt, 2)
    with pytest.raises(ValueError, match="needs a drafter"):
        method.check_models(w.target, None)


def test_lossy_error_names_method_then_target_probability() -> None:
    law = {(0,): Fraction(1, 3), (1,): Fraction(2, 3)}
    ref = {(0,): Fraction(1, 2), (1,): Fraction(1, 2)}
    with pytest.raises(LossyError) as e:
        assert_laws_equal(law, ref, what="M")
    msg = str(e.value)
    assert msg.startswith("M is lossy: TV = 1/6")
    assert msg.endswith("first differing sequence (0,): method gives 1/3, target gives 1/2")


def test_truncate_stops_at_eos_and_budget() -> None:
    eos = 9
    assert truncate([1, eos, 2, 3], 10, eos) == (1, eos)
    assert truncate([eos, 1], 10, eos) == (eos,)
    assert truncate([1, 2, 3], 2, eos) == (1, 2)
    assert truncate([1, 2, eos], 2, eos) == (1, 2)
    assert truncate([np.int64(1), eos], 5, eos) == (1, eos)
    assert all(type(t) is int for t in truncate([np.int64(1), np.int64(eos)], 5, eos))


DEFAULTS: dict[type, dict[str, Any]] = {
    AR: {"greedy": False},
    SD: {"lookahead": 3, "greedy": False, "min_confidence": None},
    SLEM: {"lookahead": 3, "greedy": False, "lookbehind": 4, "resync": Resync(), "min_confidence": None},
    TLI: {"lookahead": 3, "greedy": False, "min_confidence": None},
    SLRS: {"lookahead": 2, "max_tokens": 1, "greedy": False, "lookbehind": 4, "max_psi_calls": 200_000,
           "min_path_prob": None, "proposal_map": "retokenize", "resync": Resync()},
}


@pytest.mark.parametrize("cls", list(DEFAULTS), ids=[c.__name__ for c in DEFAULTS])
def test_documented_defaults(cls: type) -> None:
    """The defaults are the documented ones: in the signature, on the instance, in the class
    docstring and in docs/slrs.md's table."""
    want = DEFAULTS[cls]
    sig = {k: p.default for k, p in inspect.signature(cls).parameters.items()}
    assert sig == want
    inst = cls()
    assert {k: getattr(inst, k) for k in want} == want
    doc_row = next(line for line in (ROOT / "docs" / "slrs.md").read_text().splitlines()
                   if line.startswith(f"| `{cls.__name__}` |"))
    stated = dict(re.findall(r"`(\w+)=([^`]+)`", doc_row))
    assert {k: eval(v) for k, v in stated.items()} == want
    if cls is not AR:
        doc = inspect.getdoc(cls) or ""
        for k, v in want.items():
            assert re.search(rf"``{k}={re.escape(repr(v) if k != 'max_psi_calls' else '200_000')}``", doc), (k, doc)


class _CountingDrafter:
    """A protocol model that counts its calls (no cache of its own)."""

    def __init__(self, base: Any) -> None:
        self.base, self.calls = base, 0

    @property
    def vocab(self) -> hc.Vocabulary:
        return self.base.vocab  # type: ignore[no-any-return]

    @property
    def tokenizer(self) -> hc.Tokenizer:
        return self.base.tokenizer  # type: ignore[no-any-return]

    def next_probs(self, ctx: Sequence[int]) -> Any:
        self.calls += 1
        return self.base.next_probs(ctx)


def test_psi_cache_is_used() -> None:
    """A second psi for the same state is the cached object and costs no drafter call;
    another instance or other settings compute their own."""
    w = builtin_world()
    d = _CountingDrafter(w.drafter)
    m = SLRS(lookahead=2)
    state = State(w.prompt, (), 3)
    first = m.psi(w.target, d, state)
    used = d.calls
    assert used > 0
    again = m.psi(w.target, d, state)
    assert again is first and d.calls == used
    other = SLRS(lookahead=2).psi(w.target, d, state)  # another instance: its own cache
    assert other is not first and other.law == first.law and d.calls == 2 * used
    # same settings, different lookahead: a different key
    assert SLRS(lookahead=3).psi(w.target, d, state).law != first.law or d.calls > 2 * used


# --------------------------------------------------------------------------------------------
# SLEM's and SLRS's drafting is capped at the budget (no round drafts more drafter
# tokens than it can emit target tokens)

@pytest.mark.parametrize("method", ["slem", "slrs-retokenize", "slrs-bounded", "slrs-multi"])
def test_drafting_is_capped_at_the_budget(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round with budget b drafts at most min(lookahead, b) drafter tokens: with lookahead 40 and
    one token left, the drafter is only ever evaluated at the round's root context (psi's
    enumeration included), and the method stays lossless with budgets below the lookahead (exact
    engine)."""
    from hsd_core import exact
    from hsd_core.rand import NumpyRand

    world = builtin_world()
    make = {
        "slem": lambda k: SLEM(lookahead=k),
        "slrs-retokenize": lambda k: SLRS(lookahead=k),
        "slrs-bounded": lambda k: SLRS(lookahead=k, min_path_prob=0.05, proposal_map="longest_prefix"),
        "slrs-multi": lambda k: SLRS(lookahead=k, max_tokens=None, min_path_prob=0.05,
                                     proposal_map="longest_prefix"),
    }[method]
    seen: list[int] = []
    cls = type(world.drafter)
    real = cls.next_probs

    def counted(self: Any, ctx: Any) -> Any:
        if self is world.drafter:
            seen.append(len(ctx))
        return real(self, ctx)

    monkeypatch.setattr(cls, "next_probs", counted)
    root = len(world.drafter.tokenizer.encode(world.prompt))
    for seed in range(20):
        make(40).step(world.target, world.drafter, State(world.prompt, (), 1), NumpyRand(np.random.default_rng(seed)))
    assert seen and set(seen) == {root}, sorted(set(seen))
    monkeypatch.undo()
    for budget in (1, 2):
        exact.assert_lossless(make(3), world.target, world.drafter, prompt=world.prompt, max_new_tokens=budget)
