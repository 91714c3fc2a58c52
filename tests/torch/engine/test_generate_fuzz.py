"""A Hypothesis fuzz of ``hsd_torch.generate``'s arguments and prompts (what it found stays found).

The output invariants a previous fuzz found to hold, as properties over the tiny pairs of
``conftest.py`` (float64, random init) and every method:

- **ids in range**: every emitted id is below the target's logit width and is an id with text or
  EOS (the processed law removes every other id);
- **EOS only last**: an id of the target's end set appears only as a row's last id, and a row
  shorter than ``max_new_tokens`` ends with one (rows stop at EOS or at the budget);
- **budget**: at most ``max_new_tokens`` ids per row, at least one;
- **same seed, same output**: the same call twice gives the same ids;
- **rows independent**: row ``i`` is a function of ``(seed, i, its prompt)`` alone (its stream is
  ``SeedSequence(seed).spawn(n)[i]``): replacing another row's prompt, or the batch size, leaves it;
- **greedy**: ``do_sample=False`` equals the target's own greedy decoding
  (:func:`hsd_torch.models.mirror.target_greedy`) for every method, drafter and processing;
- **models never mutated**: state dict, ``requires_grad``, config, generation config and mode
  hash the same after every call, including one that raised.

On arguments drawn from a wider space (invalid values, odd types, special-token strings, prompts
too long for the target's positions, options a method does not take), the only acceptable outcomes
are an output with the invariants above, or a **clean refusal**: ``ValueError``, ``TypeError`` or
``NotImplementedError`` with a message, raised before any forward pass of either model (counted by
a global forward pre-hook, so the models themselves are not touched). Anything else, including a
hang (``HANG_S``), fails.

Profiles: the fast tier runs ``FAST`` valid calls and ``FAST_GREEDY`` greedy ones per method and
``FAST_BAD`` calls from the wide space (about 20 s on an idle 2-core machine, 55-85 s loaded); the
slow tier (``-m slow``) about 1,000 of each (``LONG_PER_METHOD``, ``LONG``; 5-16 min). Both inherit ``derandomize=True`` and ``database=None`` from the ``ci`` profile of
``tests/conftest.py``, so every clean clone runs the same examples (``HSD_HYPOTHESIS_PROFILE=explore``
randomizes them for bug hunting).

The two violations the first run of this suite found (a prompt with a lone surrogate,
a temperature that overflows ``logits / T``) are refused up front now; their minimal reproducers
stay as explicit examples of the bad-input property (``found_examples``).
"""

from __future__ import annotations

import functools

import math
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, example, given, note, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _torch_checks import counting_forwards, fingerprint  # noqa: E402
from hsd_torch import generate  # noqa: E402
from hsd_torch.models.mirror import target_greedy  # noqa: E402
from hsd_torch.engine.runner import logit_width  # noqa: E402
from hsd_torch.vocab.text import TokenText  # noqa: E402
generate = functools.partial(generate, mask_textless=True)  # hsd_core's laws hold ids with text only: the mirror's setting

torch.set_num_threads(1)

_COMMON: dict[str, Any] = dict(deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
# fast tier (about a minute on two loaded cores, fixtures included): per method 7 valid calls (each
# run three times) and 6 greedy ones; 100 calls from the wide space, many of them refusals
FAST = settings(max_examples=7, **_COMMON)
FAST_GREEDY = settings(max_examples=6, **_COMMON)
FAST_BAD = settings(max_examples=100, **_COMMON)
# slow tier: 1,000 examples per property (per method for the first two)
LONG_PER_METHOD = settings(max_examples=170, **_COMMON)
LONG = settings(max_examples=1000, **_COMMON)
HANG_S = 120.0  # one generate call of these sizes takes well under a second; past this it hangs

# name: (target model, target tokenizer, drafter model, drafter tokenizer) from conftest.py
PAIRS = {
    "bpe<-unigram": ("llama_bpe", "byte_bpe", "gpt2_uni_pad", "unigram"),
    "bpe<-fallback": ("llama_bpe", "byte_bpe", "gpt2_fb_pad", "bpe_fallback"),
    "fallback<-bpe": ("gpt2_fb_pad", "bpe_fallback", "llama_bpe", "byte_bpe"),  # padded target embedding
    "bpe<-gpt2": ("llama_bpe", "byte_bpe", "gpt2_bpe", "byte_bpe"),  # one tokenizer: SD
}
SAME_TOKENIZER = ["bpe<-gpt2"]
SPECIAL_STRINGS = ["<s>", "</s>", "<unk>", "<pad>"]  # the tiny tokenizers' special tokens
KINDS = ["ar", "sd", "tli", "slem", "slrs", "bslrs"]  # bslrs: bounded SLRS (proposal_map="longest_prefix")


# ---------------------------------------------------------------------------------------------
# the call


@dataclass(frozen=True)
class GenSeed:
    """``seed=torch.Generator().manual_seed(k)``, built fresh for every call."""

    k: int


@dataclass
class Call:
    """One call of ``generate``: the pair, whether the drafter is passed, the prompts (a str or a
    list, or anything for the bad-input property) and the keyword arguments."""

    pair: str
    with_drafter: bool
    prompts: Any
    kw: dict[str, Any] = field(default_factory=dict)
    bad: tuple[str, ...] = ()  # the names of BAD's changes made to a valid call

    def models(self, toks: dict[str, Any], models: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
        t, tt, d, dt = PAIRS[self.pair]
        return models[t], toks[tt], models[d], toks[dt]

    def prompt_list(self) -> list[str]:
        return [self.prompts] if isinstance(self.prompts, str) else list(self.prompts)

    def run(self, toks: dict[str, Any], models: dict[str, Any], **over: Any) -> Any:
        target, tt, drafter, dt = self.models(toks, models)
        prompts = over.pop("prompts", self.prompts)
        kw = dict(self.kw, **over)
        if isinstance(kw.get("seed"), GenSeed):
            kw["seed"] = torch.Generator().manual_seed(kw["seed"].k)
        with time_limit(HANG_S):
            return generate(target, drafter if self.with_drafter else None, prompts, target_tokenizer=tt,
                            drafter_tokenizer=dt if self.with_drafter else None, **kw)


class Hang(AssertionError):
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Fail a call that runs past ``seconds`` (SIGALRM; a no-op off the main thread)."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise Hang(f"generate ran past {seconds} s: a hang")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def fingerprints(call: Call, toks: dict[str, Any], models: dict[str, Any]) -> tuple[str, str]:
    target, _, drafter, _ = call.models(toks, models)
    return fingerprint(target), fingerprint(drafter)


def kind(call: Call) -> str:
    """The method as the strategies name it (bounded SLRS: ``bslrs``), for Hypothesis' statistics."""
    m = call.kw.get("method", "tli")
    return "bslrs" if m == "slrs" and call.kw.get("proposal_map") == "longest_prefix" else str(m)


# ---------------------------------------------------------------------------------------------
# the invariants


def end_ids(target: Any, text: TokenText) -> set[int]:
    """The target's end set: its tokenizer's EOS and its generation config's ``eos_token_id``."""
    ends = {text.eos_id}
    e = getattr(target.generation_config, "eos_token_id", None)
    ends.update([] if e is None else [e] if isinstance(e, int) else list(e))
    return ends


def check_output(out: Any, call: Call, toks: dict[str, Any], models: dict[str, Any]) -> None:
    """ids in range, EOS only last, the budget, and the texts and statistics that go with them."""
    target, tt, _, _ = call.models(toks, models)
    width = logit_width(target)
    text = TokenText.get(tt, width)
    ends = end_ids(target, text)
    budget = call.kw.get("max_new_tokens", 64)
    n = len(call.prompt_list())
    assert len(out.sequences) == len(out.texts) == len(out.stats) == n
    for i, seq in enumerate(out.sequences):
        where = f"row {i} of {n}: {seq}"
        assert 1 <= len(seq) <= budget, f"{where}: {len(seq)} ids, max_new_tokens={budget}"
        for t in seq:
            assert isinstance(t, int) and 0 <= t < width, f"{where}: id {t!r} outside [0, {width})"
            assert bool(text.text_mask[t]), f"{where}: id {t} has no text and is not EOS"
        assert not ends.intersection(seq[:-1]), f"{where}: EOS before the last id"
        assert len(seq) == budget or seq[-1] in ends, f"{where}: stopped before the budget without EOS"
        assert out.texts[i] == text.decode(seq).decode("utf-8", errors="replace"), where
        assert out.stats[i].new_tokens == len(seq), where
    if out.uniforms is not None:
        assert len(out.uniforms) == n
        assert all(0.0 <= u < 1.0 for row in out.uniforms for u in row)


REFUSALS = (ValueError, TypeError, NotImplementedError)
# ValueError subclasses that are accidents, not refusals (UnicodeEncodeError is a ValueError)
NOT_REFUSALS = (UnicodeError,)


def check_any_call(call: Call, toks: dict[str, Any], models: dict[str, Any]) -> Any:
    """The bad-input contract: an output with the invariants, or a clean refusal before any forward
    pass; the models unchanged either way. Returns the output or the refusal."""
    target, _, drafter, _ = call.models(toks, models)
    before = fingerprints(call, toks, models)
    with counting_forwards(target, drafter) as forwards:
        try:
            out = call.run(toks, models)
        except Hang:
            raise
        except Exception as e:  # noqa: BLE001 - classified below
            if currently_in_test_context():
                note(f"raised {type(e).__name__}: {e} after {forwards[0]} forward passes")
            assert isinstance(e, REFUSALS) and not isinstance(e, NOT_REFUSALS), \
                f"not a clean refusal: {type(e).__name__}: {e}"
            assert str(e).strip(), f"{type(e).__name__} without a message"
            assert forwards[0] == 0, (f"{type(e).__name__} raised after {forwards[0]} forward passes, not before "
                                      f"any: {e}")
            out = e
    assert fingerprints(call, toks, models) == before, "generate modified a model"
    if not isinstance(out, BaseException):
        check_output(out, call, toks, models)
    if currently_in_test_context():
        what = "+".join(call.bad) or "valid"
        event(f"{what} -> " + (f"refused: {type(out).__name__}" if isinstance(out, BaseException)
                               else f"generated: {kind(call)}"))
    return out


# ---------------------------------------------------------------------------------------------
# strategies

NASTY = [
    "", " ", "  ", "\n", "\n\n", "\t\t", "\r\n", "   \t \n ", "😀", "👍🏽", "👨‍👩‍👧", "🇫🇷", "e\u0301",
    "\u0301", "\u200d", "\u200b", "\ufeff", "\x00", "\x7f", "\x1b[0m", "\u2028", "日本語", "naïve café",
    "\U0010ffff", "\ufffd", "ﬁ", "Ω", "x", "def foo(x):\n", "<", "</", "s>", "<s", "< /s>",
]


def prompt_text(max_pieces: int = 4) -> st.SearchStrategy[str]:
    """Prompts: unicode (no surrogates), control characters and whitespace runs, combining marks
    and symbols, nasty fixed strings, joined; and long ASCII (<= 400 characters, within the
    targets' 512 positions at max_new_tokens <= 8). Without the special-token strings, which
    the current code refuses (``test_special_token_strings_in_a_prompt_are_refused_before_any_work``;
    the bad-input property puts them in)."""
    piece = st.one_of(
        st.text(max_size=10),
        st.text(st.characters(categories=["Cc", "Zs", "Zl", "Zp"]), max_size=6),
        st.text(st.characters(categories=["Mn", "Me", "So", "Sk", "Cf"]), max_size=5),
        st.sampled_from(NASTY),
    )
    short = st.lists(piece, max_size=max_pieces).map("".join)
    long = st.tuples(st.text("ab \n_=1(", min_size=1, max_size=8), st.integers(20, 400)).map(
        lambda t: (t[0] * (t[1] // len(t[0]) + 1))[:t[1]])
    return st.one_of(short, short, short, long).filter(lambda s: not any(sp in s for sp in SPECIAL_STRINGS))


def prompt_lists(max_rows: int = 4) -> st.SearchStrategy[Any]:
    rows = st.lists(prompt_text(), min_size=1, max_size=max_rows)
    return st.one_of(rows, prompt_text())  # a list, or a bare str


@st.composite
def method_options(draw: st.DrawFn, kind: str | None = None) -> tuple[str, bool, dict[str, Any]]:
    """(pair, drafter passed, method kwargs) for a valid method of ``KINDS`` (``kind``, or any):
    ar (with or without the drafter passed), sd (same tokenizer), tli, slem, slrs at lookahead 1,
    and bounded slrs (``bslrs``)."""
    kind = kind if kind is not None else draw(st.sampled_from(KINDS))
    pair = draw(st.sampled_from(SAME_TOKENIZER if kind == "sd" else list(PAIRS)))
    lookahead = st.integers(1, 6)
    if kind == "ar":
        return pair, draw(st.booleans()), {"method": "ar"}
    if kind == "slrs":
        return pair, True, {"method": "slrs", "lookahead": 1}
    if kind == "bslrs":
        kw = {"method": "slrs", "lookahead": draw(lookahead), "proposal_map": "longest_prefix",
              "min_path_prob": draw(st.one_of(st.floats(0.02, 1.0), st.sampled_from([0.02, 1.0]))),
              "max_tokens": draw(st.sampled_from([1, 2, None]))}
        return pair, True, kw
    kw = {"method": kind, "lookahead": draw(lookahead)}
    if kind == "slem" and draw(st.booleans()):
        kw["lookbehind"] = draw(st.integers(0, 6))
    return pair, True, kw


temperatures = st.one_of(st.just(1.0), st.floats(0.05, 5.0))
top_ks = st.one_of(st.none(), st.integers(1, 50))
top_ps = st.one_of(st.none(), st.floats(0.0, 1.0, exclude_min=True))
seeds = st.one_of(st.integers(0, 2**64), st.integers(0, 2**20).map(GenSeed))


@st.composite
def valid_calls(draw: st.DrawFn, kind: str | None = None, greedy: bool | None = None) -> Call:
    pair, with_drafter, kw = draw(method_options(kind))
    kw.update(
        max_new_tokens=draw(st.integers(1, 8)),
        do_sample=draw(st.booleans()) if greedy is None else not greedy,
        temperature=draw(temperatures), top_k=draw(top_ks), top_p=draw(top_ps),
        drafter_temperature=draw(st.one_of(st.none(), temperatures)), seed=draw(seeds),
        record_uniforms=draw(st.booleans()),
    )
    return Call(pair, with_drafter, draw(prompt_lists()), kw)


def _in_prompt(s: str) -> st.SearchStrategy[Any]:
    return st.tuples(prompt_text(2), prompt_text(2)).map(lambda t: [t[0] + s + t[1]])


def _bad_temperatures() -> st.SearchStrategy[Any]:
    """Invalid temperatures, odd types, and valid extremes (which must then generate)."""
    values: list[Any] = [0, 0.0, -0.0, -1.0, -math.inf, math.nan, math.inf, 1e-45, 1e-300, 1e6, 1e300, None, "1.0",
                         np.float32(0.7), np.float64(2.0), 2, True]
    return st.one_of(st.sampled_from(values), st.floats(5e-324, 1e-307), st.just(5e-324))


# name -> strategy of changes to a valid call: {"kw": {...}} / {"prompts": ...} / {"pair", "with_drafter"}
BAD: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "temperature": _bad_temperatures().map(lambda v: {"kw": {"temperature": v}}),
    "drafter_temperature": _bad_temperatures().map(lambda v: {"kw": {"drafter_temperature": v}}),
    "top_k": st.sampled_from([0, -1, 10**6, 2**63, 2**70, 2.0, True, np.int64(5), "5"]).map(
        lambda v: {"kw": {"top_k": v}}),
    "top_p": st.sampled_from([0, 0.0, -0.5, 1.0000001, 1.5, math.nan, math.inf, 1e-300, 5e-324, True, "0.5",
                              np.float32(0.9)]).map(lambda v: {"kw": {"top_p": v}}),
    # (not seed=None: fresh entropy would make the fast tier's outcome depend on the run)
    "seed": st.sampled_from([-1, 1.5, "0", 2**200, np.int64(3), np.uint8(7), True]).map(
        lambda v: {"kw": {"seed": v}}),
    "lookahead": st.sampled_from([0, -1, 1.5, True, 10**6, None, "2"]).map(lambda v: {"kw": {"lookahead": v}}),
    "max_new_tokens": st.sampled_from([0, -1, True, 2.0, None, 10**9]).map(lambda v: {"kw": {"max_new_tokens": v}}),
    "lookbehind": st.sampled_from([-1, True, 1.5, 10**6, None]).map(lambda v: {"kw": {"lookbehind": v}}),
    "do_sample": st.sampled_from([0, 1, None, "yes", np.bool_(True)]).map(lambda v: {"kw": {"do_sample": v}}),
    "method": st.sampled_from(["medusa", "SD", "", None, "slrs"]).map(lambda v: {"kw": {"method": v}}),
    "sd_other_tokenizer": st.sampled_from(["bpe<-unigram", "fallback<-bpe"]).map(
        lambda p: {"pair": p, "with_drafter": True, "kw": {"method": "sd"}}),
    "no_drafter": st.sampled_from(["sd", "tli", "slem", "slrs"]).map(
        lambda m: {"with_drafter": False, "kw": {"method": m}}),
    "slrs_options": st.fixed_dictionaries({
        "lookahead": st.sampled_from([1, 2, 6, 100]),
        "proposal_map": st.sampled_from([None, "retokenize", "longest_prefix", "bogus"]),
        "min_path_prob": st.sampled_from([None, 0.02, 1.0, 0, -0.1, 1.5, math.nan, math.inf, True, 1e-9]),
        "max_tokens": st.sampled_from([1, 2, None, 0, -1, True, 1.5]),
    }).map(lambda kw: {"pair": "bpe<-unigram", "with_drafter": True, "kw": dict(kw, method="slrs")}),
    "options_of_another_method": st.sampled_from([
        {"max_tokens": 2}, {"max_tokens": None}, {"min_path_prob": 0.5}, {"proposal_map": "longest_prefix"},
        {"proposal_map": "bogus"}]).map(lambda kw: {"kw": kw}),
    "prompts_type": st.sampled_from([[], (), [1], ["a", None], b"x", [b"x"], None, ("a", "b")]).map(
        lambda p: {"prompts": p}),
    "special_token_in_prompt": st.sampled_from(SPECIAL_STRINGS).flatmap(_in_prompt).map(lambda p: {"prompts": p}),
    "prompt_too_long": st.sampled_from(["😀", "ab", "日本", "\x00"]).flatmap(
        lambda s: st.integers(200, 700).map(lambda k: [s * k])).map(lambda p: {"prompts": p}),
    "lone_surrogate": st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"]).flatmap(
        _in_prompt).map(lambda p: {"prompts": p}),
}


@st.composite
def any_calls(draw: st.DrawFn) -> Call:
    """A valid call with up to two arguments replaced from ``BAD``."""
    call = draw(valid_calls())
    for name in draw(st.lists(st.sampled_from(sorted(BAD)), max_size=2, unique=True)):
        change = draw(BAD[name])
        call.bad += (name,)
        call.pair = change.get("pair", call.pair)
        call.with_drafter = change.get("with_drafter", call.with_drafter)
        call.prompts = change.get("prompts", call.prompts)
        call.kw.update(change.get("kw", {}))
    return call


# ---------------------------------------------------------------------------------------------
# the properties


def prop_valid_call(call: Call, other: str, toks: dict[str, Any], models: dict[str, Any]) -> None:
    """A valid call generates, with the output invariants, the same ids twice, and each row
    independent of the others; the models unchanged."""
    event(f"method: {kind(call)}")
    before = fingerprints(call, toks, models)
    finished: list[int] = []
    out = call.run(toks, models, progress=finished.append)
    check_output(out, call, toks, models)
    n = len(call.prompt_list())
    assert sum(finished) == n, f"progress reported {sum(finished)} finished rows of {n}"
    again = call.run(toks, models)
    assert again.sequences == out.sequences, "same seed, same arguments: another output"
    # rows independent: row i is a function of (seed, i, its prompt); change the last row's prompt
    # (or, for one row, add a second)
    prompts = call.prompt_list()
    changed, keep = (prompts[:-1] + [other], n - 1) if n > 1 else (prompts + [other], 1)
    third = call.run(toks, models, prompts=changed)
    assert third.sequences[:keep] == out.sequences[:keep], \
        f"rows 0..{keep - 1} changed when the batch became {changed!r}"
    assert fingerprints(call, toks, models) == before, "generate modified a model"


def prop_greedy(call: Call, toks: dict[str, Any], models: dict[str, Any]) -> None:
    """``do_sample=False``: every row equals the target's own greedy decoding."""
    event(f"method: {kind(call)}")
    target, tt, _, _ = call.models(toks, models)
    before = fingerprints(call, toks, models)
    out = call.run(toks, models)
    assert fingerprints(call, toks, models) == before, "generate modified a model"
    check_output(out, call, toks, models)
    for i, prompt in enumerate(call.prompt_list()):
        want = target_greedy(target, tt, prompt, call.kw["max_new_tokens"])
        assert out.sequences[i] == want, f"row {i} ({prompt!r}): {out.sequences[i]} != target's greedy {want}"


# Valid calls and greedy run per method (so the fast tier covers each one whatever Hypothesis
# draws); the bad-input property draws the method with the rest.


@pytest.mark.parametrize("kind", KINDS)
@FAST
@given(data=st.data())
def test_valid_calls_keep_the_invariants(kind: str, data: st.DataObject, toks: dict[str, Any],
                                         models: dict[str, Any]) -> None:
    prop_valid_call(data.draw(valid_calls(kind), label="call"), data.draw(prompt_text(), label="other"), toks, models)


@pytest.mark.parametrize("kind", KINDS)
@FAST_GREEDY
@given(data=st.data())
def test_greedy_is_the_targets_own_greedy(kind: str, data: st.DataObject, toks: dict[str, Any],
                                          models: dict[str, Any]) -> None:
    prop_greedy(data.draw(valid_calls(kind, greedy=True), label="call"), toks, models)


def found_examples(test: Any) -> Any:
    """The minimal reproducers of the violations this suite found, as explicit examples of the
    bad-input property (so they are checked whatever Hypothesis draws)."""
    for prompt in ["a\ud800b", "\udfff", "\udc80"]:
        test = example(call=Call("bpe<-unigram", True, [prompt], {"method": "tli", "max_new_tokens": 2}))(test)
    for pair, kw in [("bpe<-unigram", {"method": "ar", "temperature": 1e-308}),
                     ("bpe<-unigram", {"method": "tli", "temperature": 5e-324, "do_sample": False}),
                     ("bpe<-gpt2", {"method": "sd", "drafter_temperature": 5e-324}),
                     ("bpe<-unigram", {"method": "slrs", "lookahead": 1, "drafter_temperature": 1e-310})]:
        test = example(call=Call(pair, True, ["Hello"], dict(kw, max_new_tokens=2)))(test)
    return test


@FAST_BAD
@given(call=any_calls())
@found_examples
def test_any_call_generates_or_refuses_cleanly(call: Call, toks: dict[str, Any], models: dict[str, Any]) -> None:
    check_any_call(call, toks, models)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@LONG_PER_METHOD
@given(data=st.data())
def test_valid_calls_keep_the_invariants_long(kind: str, data: st.DataObject, toks: dict[str, Any],
                                              models: dict[str, Any]) -> None:
    prop_valid_call(data.draw(valid_calls(kind), label="call"), data.draw(prompt_text(), label="other"), toks, models)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@LONG_PER_METHOD
@given(data=st.data())
def test_greedy_is_the_targets_own_greedy_long(kind: str, data: st.DataObject, toks: dict[str, Any],
                                               models: dict[str, Any]) -> None:
    prop_greedy(data.draw(valid_calls(kind, greedy=True), label="call"), toks, models)


@pytest.mark.slow
@LONG
@given(call=any_calls())
def test_any_call_generates_or_refuses_cleanly_long(call: Call, toks: dict[str, Any],
                                                    models: dict[str, Any]) -> None:
    check_any_call(call, toks, models)


# ---------------------------------------------------------------------------------------------
# what the current code refuses (pinned, so a change of policy shows here)


@pytest.mark.parametrize("special", SPECIAL_STRINGS)
def test_special_token_strings_in_a_prompt_are_the_tokenizers_own_ids(special: str, toks: dict[str, Any],
                                                                      models: dict[str, Any]) -> None:
    """Chat prompts: a prompt with a special token's text is encoded as transformers
    feeds it (``tokenizer(text, add_special_tokens=False)``, the special id in the target's
    context), no longer refused; the output keeps every invariant."""
    call = Call("bpe<-unigram", True, [f"a{special}b"], {"method": "tli", "max_new_tokens": 2})
    out = check_any_call(call, toks, models)
    assert not isinstance(out, BaseException), out
    tt = call.models(toks, models)[1]
    ids = TokenText.get(tt, logit_width(call.models(toks, models)[0])).prompt_ids(f"a{special}b")
    assert tt.convert_tokens_to_ids(special) in ids
