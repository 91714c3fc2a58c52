"""``hsd audit``'s subcommands (issue 49 item 1): ``hsd audit model|samples|endpoint|vllm`` each
parse only their own options and show their own examples; the old spellings (``hsd audit --impl
NAME``, ``--samples-file``, ``--endpoint``, ``--impl vllm``) give the same runs and the same refusals,
plus one notice line on stderr naming the new spelling.

The runs compared: hsd_torch's first-token audit on a tiny pair (300 draws, top-k 3, seed 0), an
endpoint audit of a stdlib fake server (12 draws of 4 tokens, its draws saved), and the samples-file
audit of those saved draws; stdout must be identical in both spellings (the verdicts, p-values and TVs
are deterministic functions of the seeds). Fast tier (about 20 s).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core import cli, extensions  # noqa: E402
from hsd_torch.commands import audit as cli_audit  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import suite_helpers  # noqa: E402

COMMON = {"--target", "--drafter", "--target-tokenizer", "--drafter-tokenizer", "--alpha", "--max-detectable-tv",
          "--seed", "--report"}
SAMPLING = {"--prompt", "--greedy", "--temperature", "--top-k", "--top-p", "--samples", "--max-new-tokens",
            "--context-bugs"}
KIND_OPTIONS = {
    "model": COMMON | SAMPLING | {"--impl", "--positions", "--sequences", "--method", "--min-path-prob",
                                  "--proposal-map", "--lookahead", "--max-minutes", "--threads", "--tree",
                                  "--tree-draws", "--min-confidence"},
    "samples": COMMON | {"--samples-file", "--baseline-file", "--dtype", "--reference", "--context-bugs"},
    "endpoint": COMMON | SAMPLING | {"--endpoint", "--baseline-endpoint", "--allow-remote", "--model", "--max-requests",
                                     "--request-timeout", "--time-budget", "--concurrency", "--server-kind",
                                     "--speculative", "--save-samples", "--resume", "--retries", "--dtype",
                                     "--reference"},
    "vllm": COMMON | SAMPLING | {"--vllm-python", "--spec", "--num-speculative-tokens", "--draft-sample-method",
                                 "--rejection-sample-method", "--vllm-dtype", "--samples-dir",
                                 "--patch-vllm-cpu-expand", "--no-null-control", "--reference", "--resume", "--dtype"},
}
IMPLS = extensions.names(extensions.AUDIT_IMPLS)


def kind_parser(kind: str) -> argparse.ArgumentParser:
    return cli.build_kind_parser(kind, IMPLS, cli_audit.VLLM if kind == "vllm" else cli_audit.AUDIT)


def options(p: argparse.ArgumentParser) -> set[str]:
    return {o for a in p._actions for o in a.option_strings if a.help != argparse.SUPPRESS} - {"-h", "--help"}


@pytest.mark.parametrize("kind", list(cli.AUDIT_KINDS))
def test_each_kind_lists_only_its_options_and_real_examples(kind: str) -> None:
    """The options a kind parses are exactly its list (an option of another kind leaking in fails);
    its help has 1-3 examples, each a command line of that kind that parses."""
    p = kind_parser(kind)
    assert options(p) == KIND_OPTIONS[kind]
    help_ = p.format_help()
    examples = [line.strip() for line in help_.split("examples:\n", 1)[1].splitlines() if line.strip()]
    assert 1 <= len(examples) <= 3
    for line in examples:
        argv = shlex.split(line)
        assert argv[:3] == ["hsd", "audit", kind], line
        p.parse_args(argv[3:])  # exits (SystemExit) on an option the kind does not have


def test_the_kinds_cover_the_old_spelling_with_the_same_defaults() -> None:
    """Every option of the old spelling is some kind's, and an option means the same (its default)
    in every kind that has it and in the old spelling; a kind's namespace holds every other option at
    its default, so the runners read the same names."""
    old = argparse.ArgumentParser()
    cli_audit.add_arguments(old)
    every = {a.dest: a.default for a in old._actions}
    assert set().union(*KIND_OPTIONS.values()) == options(old) | {"--impl", "--report"}
    for kind in cli.AUDIT_KINDS:
        p = kind_parser(kind)
        for a in p._actions:
            if a.dest in every and a.dest != "help":
                assert a.default == every[a.dest], (kind, a.dest)
        ns = p.parse_args({"model": ["--impl", "hsd_torch"], "samples": ["--samples-file", "f"],
                           "endpoint": ["--endpoint", "u"], "vllm": []}[kind])
        assert set(vars(ns)) >= set(every) - {"help"}, kind
        assert ns.impl == {"model": "hsd_torch", "vllm": "vllm"}.get(kind)


def test_bare_audit_is_the_toy_audit(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(cli, "run_audit", lambda: calls.append(1) or 0)
    assert cli.main(["audit"]) == 0 and calls == [1]


# --- the same runs in both spellings -----------------------------------------------------------------

NOTICE = "hsd audit: note: `{old}` is now `{new}`; the old spelling goes in the next release"


def both(old: list[str], new: list[str], capsys: pytest.CaptureFixture[str], notice: str) -> tuple[int, str, str]:
    """Run the new and the old spelling; assert the same exit status, the same stdout, and stderr
    that differs only by the notice line first; returns (status, stdout, stderr of the new)."""
    rc_new = cli.main(new)
    out_new, err_new = capsys.readouterr()
    rc_old = cli.main(old)
    out_old, err_old = capsys.readouterr()
    assert (rc_old, out_old) == (rc_new, out_new)
    first, _, rest = err_old.partition("\n")
    assert first == notice and notice not in err_new
    assert _errors(rest) == _errors(err_new)
    return rc_new, out_new, err_new


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if "error" in line]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return suite_helpers.save_tiny_pair(tmp_path_factory.mktemp("pair"))


def test_model_audit_in_both_spellings(pair: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rest = ["--impl", "hsd_torch", "--target", str(pair / "t"), "--drafter", str(pair / "d"), "--prompt", "def f(x):",
            "--samples", "300", "--top-k", "3", "--max-detectable-tv", "0.3"]
    rc, out, _ = both(["audit", *rest], ["audit", "model", *rest], capsys,
                      NOTICE.format(old="hsd audit --impl hsd_torch", new="hsd audit model --impl hsd_torch"))
    assert rc == 0 and "hsd_torch tli: lossless-consistent (n=300" in out


class _Server(suite_helpers.JsonHandler):
    """An OpenAI-compatible completions endpoint whose ids are a function of the request's seed."""

    def answer(self, req: dict[str, Any]) -> tuple[int, Any]:
        ids = [(req["seed"] * 17 + 5 * k) % 150 for k in range(req["max_tokens"])]
        return 200, {"choices": [{"token_ids": ids}]}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with suite_helpers.loopback_server(_Server) as url:
        yield url


def test_engine_audits_in_both_spellings(pair: Path, server: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The fake server's draws are no sampler's: both spellings give the same verdict lines (and
    exit status); its saved draws, audited as a samples file, likewise."""
    target = ["--target", str(pair / "t"), "--context-bugs", "none"]
    ep = ["--endpoint", server, "--model", "m", "--prompt", "def f(x):", "--samples", "12", "--max-new-tokens", "4",
          *target]
    rc, out, _ = both(["audit", *ep, "--save-samples", str(tmp_path / "old")],
                      ["audit", "endpoint", *ep, "--save-samples", str(tmp_path / "new")], capsys,
                      NOTICE.format(old="hsd audit --endpoint", new="hsd audit endpoint --endpoint"))
    assert out.startswith("engine audit: ") and rc in (0, 1)
    assert (tmp_path / "old" / "endpoint.jsonl").read_text() == (tmp_path / "new" / "endpoint.jsonl").read_text()
    sf = ["--samples-file", str(tmp_path / "new" / "endpoint.jsonl"), *target]
    rc, out, _ = both(["audit", *sf], ["audit", "samples", *sf], capsys,
                      NOTICE.format(old="hsd audit --samples-file", new="hsd audit samples --samples-file"))
    assert out.startswith("engine audit: ")


@pytest.mark.parametrize("kind, argv, says", [
    ("samples", ["--samples-file", "nofile.jsonl", "--target", "{t}"], "'nofile.jsonl' is not a file"),
    ("samples", ["--samples-file", "{f}"], "an engine audit needs --target DIR|NAME"),
    ("samples", ["--samples-file", "{f}", "--target", "{t}", "--reference", "x"], "--reference 'x': give"),
    ("endpoint", ["--endpoint", "http://192.0.2.1:8000/v1", "--target", "{t}", "--prompt", "p"], "loopback"),
    ("endpoint", ["--endpoint", "http://127.0.0.1:9/v1", "--target", "{t}"], "--endpoint needs --prompt"),
    ("endpoint", ["--endpoint", "http://127.0.0.1:9/v1", "--target", "{t}", "--prompt", "p", "--resume"],
     "--resume continues the run saved by --save-samples DIR"),
    ("endpoint", ["--endpoint", "http://127.0.0.1:9/v1", "--target", "{t}", "--prompt", "p", "--speculative", "[1,"],
     "is not JSON"),
    ("model", ["--impl", "hsd_torch", "--target", "{t}", "--prompt", "p"], "--method tli needs --drafter DIR"),
    ("model", ["--impl", "transformers", "--target", "{t}", "--drafter", "{t}", "--prompt", "p", "--method", "tli"],
     "options of --impl hsd_torch"),
    ("vllm", ["--vllm-python", "/no/such/python", "--target", "{t}", "--prompt", "p"], "is not an executable file"),
    ("vllm", ["--vllm-python", sys.executable, "--prompt", "p"], "hsd audit vllm needs --target DIR|NAME"),
    ("vllm", ["--vllm-python", sys.executable, "--target", "{t}"], "hsd audit vllm needs --prompt"),
])
def test_refusals_in_both_spellings(pair: Path, tmp_path: Path, kind: str, argv: list[str], says: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A bad combination is refused with the same one error line (exit status 2) in both spellings."""
    f = tmp_path / "s.jsonl"
    f.write_text("")
    argv = [a.format(t=pair / "t", f=f) for a in argv]
    old = ["audit", "--impl", "vllm", *argv] if kind == "vllm" else ["audit", *argv]
    new = ["audit", kind, *argv]
    spelled = {"model": ("hsd audit --impl " + argv[1], "hsd audit model --impl " + argv[1]),
               "samples": ("hsd audit --samples-file", "hsd audit samples --samples-file"),
               "endpoint": ("hsd audit --endpoint", "hsd audit endpoint --endpoint"),
               "vllm": ("hsd audit --impl vllm", "hsd audit vllm")}[kind]
    rc, _, err = both(old, new, capsys, NOTICE.format(old=spelled[0], new=spelled[1]))
    assert rc == 2 and len(_errors(err)) == 1 and says in err, err


@pytest.mark.parametrize("kind, argv, says", [
    ("samples", ["--samples-file", "f", "--prompt", "p"], "unrecognized arguments: --prompt p"),
    ("samples", ["--samples-file", "f", "--endpoint", "u"], "unrecognized arguments: --endpoint u"),
    ("endpoint", ["--endpoint", "u", "--positions", "3"], "unrecognized arguments: --positions 3"),
    ("model", ["--impl", "hsd_torch", "--samples-file", "f"], "unrecognized arguments: --samples-file f"),
    ("vllm", ["--sequences"], "unrecognized arguments: --sequences"),
    ("endpoint", ["--target", "t"], "the following arguments are required: --endpoint"),
    ("samples", ["--target", "t"], "the following arguments are required: --samples-file"),
])
def test_an_option_of_another_kind_is_refused_while_parsing(kind: str, argv: list[str], says: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """What the old spelling refused after parsing ("not with --samples-file", ...) a subcommand does not
    parse at all."""
    with pytest.raises(SystemExit) as e:
        cli.main(["audit", kind, *argv])
    assert e.value.code == 2 and f"hsd audit {kind}: error: {says}" in capsys.readouterr().err
