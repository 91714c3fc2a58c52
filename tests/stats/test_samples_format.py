"""The recorded-samples format (:mod:`hsd_core.samples`): round trip, every refusal (one line naming
the file, the line and the key), and the examples of docs/auditing.md (the JSONL parses; in the slow
tier the C++ and Rust snippets compile, run and print lines the reader accepts)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hsd_core.samples import FORMAT, Draw, Sampling, SamplesFormatError, parse_samples, read_samples, write_samples

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "auditing.md").read_text(encoding="utf-8")
SECTION = DOC[DOC.index("## Audit your own engine"):DOC.index("## Scale-out")]


def _line(**over: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"format": FORMAT, "engine": {"name": "e", "version": "1"}, "speculative": None,
                           "sampling": {"do_sample": True, "temperature": 1.0, "top_k": None, "top_p": None,
                                        "max_new_tokens": 4},
                           "seed": 1, "prompt": "hi", "ids": [1, 2]}
    for k, v in over.items():
        if v is _DROP:
            obj.pop(k)
        else:
            obj[k] = v
    return obj


_DROP = object()


def _parse(*objs: Any) -> Any:
    return parse_samples([o if isinstance(o, str) else json.dumps(o) for o in objs], "f.jsonl")


def test_round_trip(tmp_path: Path) -> None:
    draws = [Draw(ids=(5, 6, 7), seed=11, prompt="a b", prompt_ids=(1, 2), finish_reason="length",
                  extra={"spec_stats": {"accepted": 2}}),
             Draw(ids=(), seed=12, prompt="é\n\"x\""), Draw(ids=(3,), seed=None, prompt_ids=(9,))]
    sm = Sampling(True, 0.7, 50, 0.9, 3)
    f = write_samples(tmp_path / "s.jsonl", draws, engine={"name": "vllm", "version": "0.32.0"}, sampling=sm,
                      speculative={"method": "ngram", "num_speculative_tokens": 4}, target="gemma-3-270m")
    back = read_samples(tmp_path / "s.jsonl")
    assert back.sampling == sm and back.target == "gemma-3-270m" and back.is_speculative
    assert [(d.ids, d.seed, d.prompt, d.prompt_ids, d.finish_reason) for d in back.draws] == \
        [(d.ids, d.seed, d.prompt, d.prompt_ids, d.finish_reason) for d in draws]
    assert back.draws[0].extra == {"spec_stats": {"accepted": 2}} and back.draws[0].line == 1
    assert back.seeds() == {11, 12} and f.draws == back.draws
    assert "3 draws of vllm 0.32.0, speculation" in back.describe()
    assert back.draws[2].prompt_key() == ("ids", 9) and back.draws[1].prompt_key() == ("text", "é\n\"x\"")


def test_greedy_ignores_temperature_and_blank_lines_are_skipped() -> None:
    s = _parse(_line(sampling={"do_sample": False, "max_new_tokens": 2, "temperature": 0}), "",
               _line(sampling={"do_sample": False, "max_new_tokens": 2, "temperature": 0}, seed=2))
    assert s.sampling == Sampling(False, 1.0, None, None, 2) and len(s.draws) == 2 and s.draws[1].line == 3
    assert s.sampling.describe() == "greedy"


REFUSALS: list[tuple[Any, str]] = [
    ("{not json", r"f\.jsonl:1: not valid JSON"),
    ("[1, 2]", r"f\.jsonl:1: a line must be a JSON object"),
    (_line(format=_DROP), r"f\.jsonl:1: key 'format': missing"),
    (_line(format="hsd-samples/2"), r"key 'format': is 'hsd-samples/2'; this hsd reads 'hsd-samples/1'"),
    (_line(engine=_DROP), r"key 'engine': missing"),
    (_line(engine="vllm"), r"key 'engine': must be an object"),
    (_line(engine={"name": "x"}), r"key 'engine.version': missing or not a string"),
    (_line(speculative=_DROP), r"key 'speculative': missing \(null: no speculation\)"),
    (_line(speculative="ngram"), r"key 'speculative': must be null \(no speculation\) or an object"),
    (_line(speculative={"method": 3}), r"key 'speculative.method': must be a string"),
    (_line(sampling=_DROP), r"key 'sampling': missing"),
    (_line(sampling=[]), r"key 'sampling': must be an object"),
    (_line(sampling={"max_new_tokens": 3}), r"key 'sampling.do_sample': missing"),
    (_line(sampling={"do_sample": 1, "max_new_tokens": 3}), r"key 'sampling.do_sample': must be true or false"),
    (_line(sampling={"do_sample": False, "max_new_tokens": 0}), r"key 'sampling.max_new_tokens': must be an int >= 1"),
    (_line(sampling={"do_sample": True, "max_new_tokens": 3, "top_k": None, "top_p": None}),
     r"key 'sampling.temperature': missing"),
    (_line(sampling={"do_sample": True, "max_new_tokens": 3, "temperature": 0, "top_k": None, "top_p": None}),
     r"key 'sampling.temperature': must be a number > 0 when do_sample is true"),
    (_line(sampling={"do_sample": True, "max_new_tokens": 3, "temperature": 1, "top_k": 0, "top_p": None}),
     r"key 'sampling.top_k': must be null \(off\) or an int >= 1"),
    (_line(sampling={"do_sample": True, "max_new_tokens": 3, "temperature": 1, "top_k": None, "top_p": 1.5}),
     r"key 'sampling.top_p': must be null \(off\) or a number in \(0, 1\]"),
    (_line(seed=_DROP), r"key 'seed': missing \(null where the engine cannot seed\)"),
    (_line(seed=1.5), r"key 'seed': must be an int or null"),
    (_line(prompt=_DROP), r"key 'prompt': missing: give 'prompt' \(text\) and / or 'prompt_ids'"),
    (_line(prompt=3), r"key 'prompt': must be a string"),
    (_line(prompt_ids=[]), r"key 'prompt_ids': is empty"),
    (_line(prompt_ids=[1, "2"]), r"key 'prompt_ids': holds '2': every id must be an int >= 0"),
    (_line(ids=_DROP), r"key 'ids': missing"),
    (_line(ids="1 2"), r"key 'ids': must be a list of int ids"),
    (_line(ids=[1, True]), r"key 'ids': holds True"),
    (_line(ids=[1, -1]), r"key 'ids': holds -1"),
    (_line(ids=[1.0]), r"key 'ids': holds 1.0"),
    (_line(target=3), r"key 'target': must be a string"),
    (_line(finish_reason=1), r"key 'finish_reason': must be a string or null"),
]


@pytest.mark.parametrize("line, message", REFUSALS, ids=[m[:40] for _, m in REFUSALS])
def test_each_refusal_is_one_line(line: Any, message: str) -> None:
    with pytest.raises(SamplesFormatError, match=message) as e:
        _parse(line)
    assert "\n" not in str(e.value) and str(e.value).startswith("f.jsonl:1: ")


@pytest.mark.parametrize("key, value", [("engine", {"name": "e", "version": "2"}), ("speculative", {"method": "x"}),
                                        ("target", "other"), ("sampling", {"do_sample": False, "max_new_tokens": 4})])
def test_mixed_settings_are_refused(key: str, value: Any) -> None:
    with pytest.raises(SamplesFormatError, match=rf"f\.jsonl:2: key '{key}': mixed settings: .* on line 1; "
                                                 "write one file per setting"):
        _parse(_line(), _line(seed=2, **{key: value}))


def test_repeated_seed_and_empty_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SamplesFormatError, match=r"f\.jsonl:3: key 'seed': 1 repeats line 1: a repeated seed"):
        _parse(_line(), _line(seed=None), _line())
    assert len(_parse(_line(seed=None), _line(seed=None)).draws) == 2  # seeds that are not given cannot repeat
    with pytest.raises(SamplesFormatError, match=r"^f\.jsonl: holds no draws"):
        _parse("", "  ")
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"prompt": "\xe9"}\n')
    with pytest.raises(SamplesFormatError, match=r"latin1\.jsonl: is not UTF-8"):
        read_samples(bad)
    with pytest.raises(SamplesFormatError, match=r"nothere\.jsonl: cannot be read"):
        read_samples(tmp_path / "nothere.jsonl")
    with pytest.raises(SamplesFormatError, match=r"key 'sampling.top_k'"):  # the writer refuses what the reader would
        write_samples(tmp_path / "w.jsonl", [Draw(ids=(1,), seed=1, prompt="x")], engine={"name": "e", "version": "1"},
                      sampling={"do_sample": True, "temperature": 1.0, "top_k": -1, "top_p": None,
                                "max_new_tokens": 2}, speculative=None)
    assert not (tmp_path / "w.jsonl").exists()


def test_doc_jsonl_example_parses() -> None:
    block = re.search(r"```jsonl\n(.*?)```", SECTION, re.S)
    assert block is not None
    s = parse_samples(block.group(1).splitlines(), "docs/auditing.md")
    assert len(s.draws) == 2 and s.is_speculative and s.sampling.top_p == 0.9
    assert s.draws[1].extra == {"spec_stats": {"accepted": 0}} and s.draws[1].prompt is None
    # every required key of the format is in the doc's table
    for key in ("format", "engine", "speculative", "sampling", "seed", "prompt", "prompt_ids", "ids"):
        assert f"`{key}`" in SECTION


def _run_snippet(tmp_path: Path, lang: str, main: str, compiler: list[str]) -> Any:
    """The doc's ``lang`` snippet with ``main`` appended, compiled by ``compiler + [-o exe, source]``,
    run, and its output read back as a samples file."""
    m = re.search(rf"```{lang}\n(.*?)```", SECTION, re.S)
    assert m is not None, lang
    src = tmp_path / f"w.{lang}"
    src.write_text(m.group(1) + main)
    subprocess.run([*compiler, "-o", str(tmp_path / "w"), str(src)], check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / "w")], check=True, capture_output=True, text=True).stdout
    return parse_samples(out.splitlines(), lang)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_doc_cpp_snippet_writes_lines_the_reader_accepts(tmp_path: Path) -> None:
    s = _run_snippet(tmp_path, "cpp", "\nint main() { write_draw(stdout, 7, {2, 10}, {5, 1}); "
                     "write_draw(stdout, 8, {2, 10}, {}); return 0; }\n", ["g++", "-std=c++17"])
    assert [d.ids for d in s.draws] == [(5, 1), ()] and s.speculative == {"method": "draft_model",
                                                                          "num_speculative_tokens": 4}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("rustc") is None, reason="no Rust compiler")
def test_doc_rust_snippet_writes_lines_the_reader_accepts(tmp_path: Path) -> None:
    s = _run_snippet(tmp_path, "rust", '\nfn main() { println!("{}", draw_line(7, &[2, 10], &[5, 1])); '
                     'println!("{}", draw_line(8, &[2], &[])); }\n', ["rustc"])
    assert [d.ids for d in s.draws] == [(5, 1), ()] and s.speculative is None and s.seeds() == {7, 8}


# --- processing keys (issue 47 item 3, issue 48 item 5) --------------------------------------------

_FULL = {"do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "max_new_tokens": 4, "min_p": 0.05,
         "repetition_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": -0.25, "penalty_last_n": 16,
         "logit_bias": {"30": 5.0, "7": -1.5}, "bad_words_ids": [[3], [4, 5]], "allowed_token_ids": [1, 2, 3, 30],
         "min_tokens": 2, "stop": ["\n\n", "."], "order": "vllm"}


def _sampled(sampling: dict[str, Any]) -> Sampling:
    return parse_samples([json.dumps(_line(sampling=sampling))]).sampling


def test_every_processing_key_is_written_and_read_back(tmp_path: Path) -> None:
    s = _sampled(_FULL)
    assert (s.min_p, s.repetition_penalty, s.presence_penalty, s.frequency_penalty, s.penalty_last_n) == \
        (0.05, 1.2, 0.5, -0.25, 16)
    assert s.logit_bias == ((7, -1.5), (30, 5.0)) and s.bad_words_ids == ((3,), (4, 5))
    assert s.allowed_token_ids == (1, 2, 3, 30) and s.min_tokens == 2 and s.stop == ("\n\n", ".") and s.order == "vllm"
    back = write_samples(tmp_path / "s.jsonl", [Draw(ids=(1, 2), seed=3, prompt="hi")], engine={"name": "e",
                         "version": "1"}, sampling=s, speculative=None)
    assert back.sampling == s
    assert json.loads((tmp_path / "s.jsonl").read_text().splitlines()[0])["sampling"] == _FULL
    assert "min_tokens 2" in back.describe() and 'order "vllm"' in back.describe()


def test_plain_sampling_writes_no_processing_keys() -> None:
    s = Sampling(True, 1.0, None, None, 4)
    assert set(s.to_json()) == {"do_sample", "temperature", "top_k", "top_p", "max_new_tokens"}
    assert _sampled(s.to_json()) == s


def test_issue_48_min_tokens_and_logit_bias_are_modelled_not_dropped() -> None:
    """Issue 48 item 5: ``"min_tokens": 24, "logit_bias": {"30": 5}`` parsed as plain temperature 1 before."""
    s = _sampled({**_line()["sampling"], "min_tokens": 24, "logit_bias": {"30": 5}, "order": "vllm"})
    assert s.min_tokens == 24 and s.logit_bias == ((30, 5.0),)
    assert s != Sampling(True, 1.0, None, None, 4)


@pytest.mark.parametrize("key, value", [("typical_p", 0.9), ("dry_multiplier", 0.8), ("mirostat", 2),
                                        ("ignore_eos", True)])
def test_a_sampling_key_hsd_does_not_model_is_refused_by_name(key: str, value: Any) -> None:
    with pytest.raises(SamplesFormatError, match=rf"^<samples>:1: key 'sampling\.{key}': is not a setting hsd models"):
        _sampled({**_line()["sampling"], key: value})


def test_processing_without_its_order_is_refused() -> None:
    with pytest.raises(SamplesFormatError, match=r"key 'sampling\.order': missing: min_tokens set"):
        _sampled({**_line()["sampling"], "min_tokens": 24})


@pytest.mark.parametrize("key, value, what", [
    ("min_p", 1.5, "in \\[0, 1\\]"), ("repetition_penalty", 0, "> 0"), ("logit_bias", {"x": 1}, "decimal strings"),
    ("logit_bias", [1], "an object"), ("bad_words_ids", [[]], "non-empty list"), ("allowed_token_ids", [], "non-empty"),
    ("min_tokens", -1, "int >= 0"), ("stop", [""], "non-empty string"), ("order", "sglang", "one of"),
    ("penalty_last_n", -2, "int >= -1")])
def test_bad_processing_values_are_refused(key: str, value: Any, what: str) -> None:
    with pytest.raises(SamplesFormatError, match=rf"key 'sampling\.{key}': .*{what}"):
        _sampled({**_line()["sampling"], key: value, "order": "vllm"} if key != "order" else
                 {**_line()["sampling"], key: value})
