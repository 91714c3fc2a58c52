"""The ``hsd`` command's extensions: ``hsd_core`` finds ``hsd generate`` and ``hsd audit
--impl`` through entry points (``hsd_core.extensions``) and imports them only when a command line
needs them; without torch they say what to install, and ``hsd audit`` runs without them.

"Without torch" is a subprocess whose first import finder refuses ``torch``, so that ``import
torch`` fails there as it does where torch is not installed (``sys.modules["torch"] = None`` would
do it too, but scipy reads that entry and fails on it).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from importlib.metadata import EntryPoint

import pytest

from hsd_core import cli, extensions
from hsd_core.pytest_plugin import assert_lossless

HINT = 'pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install -e ".[torch]"'
PRELUDE = """if True:
    import sys
    if NO_TORCH:  # import torch fails, as without torch
        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "torch":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, NoTorch())
    from hsd_core import cli
    cli.run_audit = lambda: 0  # the exact audit itself is tests/cli/test_cli.py's
    try:
        rc = cli.main(sys.argv[1:])
    except SystemExit as e:  # argparse's help and errors
        rc = e.code
    imported = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "hsd_torch", "transformers"})
    print("IMPORTED", imported, file=sys.stderr)
    sys.exit(rc)
"""


def hsd(*args: str, no_torch: bool = False) -> subprocess.CompletedProcess[str]:
    code = f"NO_TORCH = {no_torch}\n" + PRELUDE
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


def test_the_backend_registers_its_extensions() -> None:
    """The names come from the installed metadata (``pip install -e .`` after editing pyproject.toml)."""
    assert "generate" in extensions.names(extensions.COMMANDS)
    assert set(extensions.names(extensions.AUDIT_IMPLS)) >= {"transformers", "hsd_torch"}
    assert extensions.names(extensions.MODEL_AUDITS)


def test_the_extensions_load_with_torch() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from hsd_torch.auditing import first_tokens as audit
    from hsd_torch.commands import generate as torch_cli, audit as cli_audit

    assert extensions.load_command("generate") is torch_cli.COMMAND
    assert extensions.load_audit_impl("hsd_torch") is extensions.load_audit_impl("transformers") is cli_audit.AUDIT
    assert extensions.load_model_audit() is audit.audit_generate


@pytest.mark.parametrize("args", [["audit"], [], ["audit", "--sampled", "0"]])
def test_audit_imports_no_extension(args: list[str]) -> None:
    res = hsd(*args)
    assert res.returncode == 0, res.stderr
    assert "IMPORTED []" in res.stderr


def test_audit_runs_without_torch() -> None:
    res = hsd("audit", no_torch=True)
    assert res.returncode == 0 and "IMPORTED []" in res.stderr, res.stderr


@pytest.mark.parametrize("args, needs", [
    (["generate", "--target", "x", "--prompt", "p"], "hsd generate needs torch"),
    (["generate", "-h"], "hsd generate needs torch"),
    (["audit", "--impl", "hsd_torch", "--target", "x"], "hsd audit --impl hsd_torch needs torch"),
    (["audit", "--impl", "transformers", "-h"], "hsd audit --impl transformers needs torch"),
    (["audit", "--imp", "hsd_torch"], "hsd audit --impl hsd_torch needs torch"),
    (["audit", "model", "--impl", "hsd_torch", "--target", "x"], "hsd audit model --impl hsd_torch needs torch"),
    (["audit", "model", "-h"], "hsd audit model needs torch"),
    (["audit", "samples", "--samples-file", "f"], "hsd audit samples needs torch"),
    (["audit", "endpoint", "-h"], "hsd audit endpoint needs torch"),
    (["audit", "vllm", "--target", "x"], "hsd audit vllm needs torch"),
])
def test_without_torch_the_extensions_say_what_to_install(args: list[str], needs: str) -> None:
    res = hsd(*args, no_torch=True)
    assert res.returncode == 2, res.stderr
    assert needs in res.stderr and HINT in res.stderr and "Traceback" not in res.stderr


def test_help_without_torch_lists_the_extensions_and_what_they_need() -> None:
    res = hsd("-h", no_torch=True)
    assert res.returncode == 0, res.stderr
    assert "generate" in res.stdout and "unavailable: hsd generate needs torch" in res.stdout
    res = hsd("audit", "-h", no_torch=True)
    assert res.returncode == 0 and "IMPORTED []" in res.stderr, res.stderr
    assert "--sampled N" in res.stdout and "--target DIR" not in res.stdout and "--impl {" not in res.stdout
    for kind in cli.AUDIT_KINDS:
        assert f"\n  {kind} " in res.stdout, kind


def test_help_with_torch() -> None:
    """``hsd audit -h`` lists the toy audit's options and the subcommands, imports nothing, and none
    of the old spelling's options; ``hsd -h`` lists the registered commands."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    res = hsd("audit", "-h")
    assert res.returncode == 0 and "IMPORTED []" in res.stderr, res.stderr
    for opt in ("--sampled", "--report", "hsd audit {model,samples,endpoint,vllm}", "examples:"):
        assert opt in res.stdout
    for opt in ("--impl {", "--target DIR", "--method {", "--seed SEED", "--samples-file F", "--endpoint URL",
                "--vllm-python"):  # the options' own lines (the subcommands' help lines name some)
        assert opt not in res.stdout
    res = hsd("-h")
    assert res.returncode == 0 and "speculative generation over local checkpoints" in res.stdout


def test_the_plugin_without_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hsd_lossless`` with a model target reaches the backend only through its entry point."""
    for name in ("hsd_torch.auditing.first_tokens", "hsd_torch.audit"):  # an install made before the move names the old
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if torch were missing
    with pytest.raises(ImportError, match=r"hsd_lossless with a model .*needs torch.*pip install torch==2\.13\.0"):
        assert_lossless(lambda prompt, seed: [0], object(), n=10, tokenizer=object(), prompt="x")
    with pytest.raises(TypeError, match="needs tokenizer= and prompt="):
        assert_lossless(lambda prompt, seed: [0], object(), n=10)


# --- the mechanism itself, on extensions registered by this test ------------------------------------

CALLS: list[object] = []


def _hello(argv: Sequence[str]) -> int:
    CALLS.append(list(argv))
    return 7


def _add_flavour(p: argparse.ArgumentParser) -> None:
    p.add_argument("--flavour", default="plain", help="the fake implementation's option")


def _run_fake(args: argparse.Namespace) -> int:
    CALLS.append((args.impl, args.flavour))
    return 5


HELLO = extensions.Command(help="say hello (a test's extension)", main=_hello)
FAKE = extensions.AuditImpl(add_arguments=_add_flavour, run=_run_fake)
NOT_A_COMMAND = 42


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    eps = {extensions.COMMANDS: [EntryPoint("hello", f"{__name__}:HELLO", extensions.COMMANDS),
                                 EntryPoint("bad", f"{__name__}:NOT_A_COMMAND", extensions.COMMANDS),
                                 EntryPoint("gone", "hsd_no_such_module:X", extensions.COMMANDS)],
           extensions.AUDIT_IMPLS: [EntryPoint("fake", f"{__name__}:FAKE", extensions.AUDIT_IMPLS),
                                    EntryPoint("fake2", f"{__name__}:FAKE", extensions.AUDIT_IMPLS)]}
    monkeypatch.setattr(extensions, "_entry_points", lambda group: eps.get(group, []))
    CALLS.clear()


def test_a_registered_command_gets_its_arguments(registered: None) -> None:
    assert cli.main(["hello", "a", "--b"]) == 7 and CALLS == [["a", "--b"]]
    with pytest.raises(TypeError, match="must name a Command"):
        cli.main(["bad"])


def test_a_command_that_does_not_import(registered: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["gone", "x"]) == 2
    err = capsys.readouterr().err
    assert "hsd gone needs torch" in err and "hsd_no_such_module" in err and HINT in err


def test_a_registered_audit_impl_gets_its_options(registered: None, capsys: pytest.CaptureFixture[str]) -> None:
    """An extension without kinds is ``hsd audit model --impl NAME`` with all its options; the old
    spelling runs it the same, with one line naming the new one."""
    assert cli.main(["audit", "model", "--impl", "fake2", "--flav", "salty"]) == 5 and CALLS == [("fake2", "salty")]
    assert capsys.readouterr().err == ""
    assert cli.main(["audit", "--impl", "fake2", "--flav", "salty"]) == 5 and CALLS == [("fake2", "salty")] * 2
    assert capsys.readouterr().err.splitlines() == [
        "hsd audit: note: `hsd audit --impl fake2` is now `hsd audit model --impl fake2`; the old spelling goes in the "
        "next release"]
    for argv in (["audit", "--impl", "nope"], ["audit", "model", "--impl", "nope"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert "invalid choice: 'nope' (choose from 'fake', 'fake2')" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["audit", "model", "-h"])
    out = capsys.readouterr().out
    assert out.count("--flavour FLAVOUR") == 2, "added once, though registered twice (usage and options)"
    assert "--impl {fake,fake2}" in out
    with pytest.raises(SystemExit):
        cli.main(["audit", "-h"])
    out = capsys.readouterr().out
    assert "--flavour" not in out and "--impl {" not in out
    assert cli.main(["audit", "samples", "--flavour", "x"]) == 2  # no extension serves that kind
    assert "hsd audit samples needs torch and transformers (hsd.audit_impls has fake, fake2, none of which " \
           "serves it)" in capsys.readouterr().err


def _add_kind(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True)


def _run_kind(args: argparse.Namespace) -> int:
    CALLS.append((args.impl, args.url, args.flavour))
    return 3


KINDS = extensions.AuditImpl(add_arguments=lambda p: (_add_flavour(p), p.add_argument("--url")) and None,
                             run=_run_kind, kinds={"endpoint": _add_kind, "vllm": _add_flavour})


def test_an_extension_serves_kinds(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``hsd audit KIND`` parses the kind's options alone and gives the extension's other options
    their defaults; a kind registered under its own name gets ``args.impl`` set to it."""
    eps = {extensions.AUDIT_IMPLS: [EntryPoint("other", f"{__name__}:FAKE", extensions.AUDIT_IMPLS),
                                    EntryPoint("vllm", f"{__name__}:KINDS", extensions.AUDIT_IMPLS)]}
    monkeypatch.setattr(extensions, "_entry_points", lambda group: eps.get(group, []))
    CALLS.clear()
    assert cli.main(["audit", "endpoint", "--url", "u"]) == 3 and CALLS == [(None, "u", "plain")]
    with pytest.raises(SystemExit):
        cli.main(["audit", "endpoint", "--url", "u", "--flavour", "x"])  # not the endpoint kind's
    assert "unrecognized arguments: --flavour x" in capsys.readouterr().err
    assert cli.main(["audit", "vllm", "--flavour", "x"]) == 3 and CALLS[-1] == ("vllm", None, "x")
    with pytest.raises(SystemExit):
        cli.main(["audit", "model", "--impl", "vllm"])
    assert "--impl vllm is its own subcommand: hsd audit vllm" in capsys.readouterr().err


def test_audit_without_impl_does_not_load_extensions(registered: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "run_audit", lambda: 0)

    def boom(name: str) -> extensions.AuditImpl:
        raise AssertionError(f"loaded {name}")

    monkeypatch.setattr(extensions, "load_audit_impl", boom)
    monkeypatch.setattr(extensions, "load_command", boom)
    assert cli.main(["audit"]) == 0 and cli.main([]) == 0 and CALLS == []


def test_nothing_registered(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Without any registration (a source tree that is not installed) --impl still parses and the
    run says what to install."""
    monkeypatch.setattr(extensions, "_entry_points", lambda group: [])
    for argv in (["audit", "--impl", "hsd_torch", "--target", "x"], ["audit", "model", "--impl", "hsd_torch"],
                 ["audit", "samples", "--samples-file", "f"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "nothing is registered under the entry-point group hsd.audit_impls" in err and HINT in err
