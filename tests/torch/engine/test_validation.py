"""``generate``'s boundary: each kind of mistake raises its own type from
:mod:`hsd_torch.engine.validation` (each a subclass of the built-in type it has always been, and of
``InvalidArgument``), before anything reads a model or a tokenizer: the models and tokenizers here
are objects that fail the test on any attribute access."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hsd_torch import generate, methods  # noqa: E402
from hsd_torch.commands import args as cli_args  # noqa: E402
from hsd_torch.engine import validation  # noqa: E402
from hsd_torch.methods.slrs import psi  # noqa: E402
from hsd_torch.engine.rounds import seed_sequence  # noqa: E402
from hsd_torch.engine.validation import (ConflictingArguments, InvalidArgument, NotSupported, OptionNotTaken,  # noqa: E402
                                  OutOfRange, UnknownChoice, WrongType)


class Untouchable:
    """A model or tokenizer that must not be looked at: any attribute read fails the test."""

    def __getattr__(self, name: str) -> Any:
        pytest.fail(f"a model or tokenizer was read ({name!r}) before the arguments were checked")


def call(**kw: Any) -> None:
    prompts = kw.pop("prompts", "x")
    generate(Untouchable(), Untouchable(), prompts, target_tokenizer=Untouchable(),
             drafter_tokenizer=Untouchable(), **kw)


CASES: list[tuple[type[Exception], type[Exception], str, dict[str, Any]]] = [
    (WrongType, TypeError, "do_sample must be True or False", {"do_sample": "yes"}),
    (WrongType, TypeError, "temperature must be a number", {"temperature": "hot"}),
    (WrongType, TypeError, "top_p must be None or a number", {"top_p": "most"}),
    (WrongType, TypeError, "progress must be None or a callable", {"progress": 3}),
    (WrongType, TypeError, "streamer must be None or a transformers streamer", {"streamer": object()}),
    (OutOfRange, ValueError, "lookahead must be an int >= 1", {"lookahead": 0}),
    (OutOfRange, ValueError, "lookahead must be an int >= 1", {"lookahead": True}),
    (OutOfRange, ValueError, "max_new_tokens must be an int >= 1", {"max_new_tokens": 0}),
    (OutOfRange, ValueError, "temperature must be a number in", {"temperature": 0.0}),
    (OutOfRange, ValueError, "drafter_temperature must be a number in", {"drafter_temperature": float("inf")}),
    (OutOfRange, ValueError, "top_k must be None, 0", {"top_k": -1}),
    (OutOfRange, ValueError, "top_p must be None or a number in", {"top_p": 1.5}),
    (OutOfRange, ValueError, "seed must be an int >= 0", {"seed": -1}),
    (OutOfRange, ValueError, "seed must be an int >= 0", {"seed": 1.5}),
    (OutOfRange, ValueError, "lookbehind must be an int >= 0", {"method": "slem", "lookbehind": -1}),
    (OutOfRange, ValueError, "min_path_prob must be", {"method": "slrs", "lookahead": 2, "min_path_prob": 0.0,
                                                      "proposal_map": "longest_prefix"}),
    (OutOfRange, ValueError, "max_tokens must be", {"method": "slrs", "lookahead": 2, "min_path_prob": 0.1,
                                                   "proposal_map": "longest_prefix", "max_tokens": 0}),
    (UnknownChoice, ValueError, "method must be one of", {"method": "bogus"}),
    (UnknownChoice, ValueError, "proposal_map must be", {"method": "slrs", "lookahead": 2, "min_path_prob": 0.1,
                                                        "proposal_map": "bytes"}),
    (OptionNotTaken, ValueError, "lookbehind is an option of method 'slem' only", {"method": "tli", "lookbehind": 2}),
    (OptionNotTaken, ValueError, "max_tokens is an option of method 'slrs'", {"method": "sd", "max_tokens": None}),
    (OptionNotTaken, ValueError, "min_path_prob is an option of bounded SLRS", {"method": "slrs", "lookahead": 1,
                                                                                 "min_path_prob": 0.5}),
    (ConflictingArguments, ValueError, "give prompts or input_ids, not both", {"input_ids": [[1, 2]]}),
    (ConflictingArguments, ValueError, "attention_mask goes with input_ids", {"attention_mask": [[1]]}),
    (ConflictingArguments, ValueError, "a streamer takes one sequence",
     {"prompts": ["a", "b"], "streamer": type("S", (), {"put": lambda s, x: None, "end": lambda s: None})()}),
    (NotSupported, NotImplementedError, "supports lookahead=1 only", {"method": "slrs", "lookahead": 2}),
    (NotSupported, NotImplementedError, "no min_path_prob", {"method": "slrs", "lookahead": 3,
                                                            "proposal_map": "longest_prefix"}),
]


@pytest.mark.parametrize(("kind", "builtin", "match", "kw"), CASES,
                         ids=[f"{c[0].__name__}-{'-'.join(c[3])}" for c in CASES])
def test_each_kind_of_mistake_has_its_type_and_comes_before_any_model_work(
        kind: type[Exception], builtin: type[Exception], match: str, kw: dict[str, Any]) -> None:
    with pytest.raises(kind, match=match) as info:
        call(**kw)
    assert type(info.value) is kind  # the kind itself, not another subclass of the built-in type
    assert isinstance(info.value, builtin) and isinstance(info.value, InvalidArgument)


def test_the_kinds_are_distinct_and_keep_their_builtin_bases() -> None:
    kinds = [WrongType, OutOfRange, UnknownChoice, OptionNotTaken, ConflictingArguments, NotSupported]
    assert len(set(kinds)) == len(kinds) == len({c for c, *_ in CASES})
    assert issubclass(WrongType, TypeError) and issubclass(NotSupported, NotImplementedError)
    assert all(issubclass(k, ValueError) for k in (OutOfRange, UnknownChoice, OptionNotTaken, ConflictingArguments))
    assert not issubclass(OutOfRange, TypeError) and not issubclass(WrongType, ValueError)


def test_a_valid_seed_passes_the_boundary_and_methods_are_defined_once() -> None:
    validation.check_seed(np.int64(3))
    g = torch.Generator().manual_seed(1)
    state = g.get_state().clone()
    validation.check_seed(g)
    with pytest.raises(UnknownChoice):
        call(method="bogus", seed=g)
    assert torch.equal(g.get_state(), state)  # a checked or refused call draws nothing from the caller's generator
    validation.check_seed(None)
    ss = np.random.SeedSequence(5)
    assert seed_sequence(ss) is ss  # converted once at the boundary, passed on as it is
    assert methods.METHODS is validation.METHODS and cli_args.METHODS is validation.METHODS
    assert methods.OPTIONS is validation.OPTIONS


def test_the_public_bounded_procedure_checks_with_the_same_rules() -> None:
    dev = torch.device("cpu")
    with pytest.raises(OutOfRange, match="lookahead must be an int >= 1"):
        psi.BoundedSLRS(Untouchable(), Untouchable(), 0, 0.1, False, dev)  # type: ignore[arg-type]
    with pytest.raises(OutOfRange, match="min_path_prob must be"):
        psi.BoundedSLRS(Untouchable(), Untouchable(), 2, 1.5, False, dev)  # type: ignore[arg-type]
    with pytest.raises(OutOfRange, match="max_tokens must be"):
        psi.BoundedSLRS(Untouchable(), Untouchable(), 2, 0.1, False, dev, max_tokens=0)  # type: ignore[arg-type]
    with pytest.raises(NotSupported, match="bounded SLRS needs min_path_prob"):
        psi.BoundedSLRS(Untouchable(), Untouchable(), 2, None, False, dev)  # type: ignore[arg-type]
