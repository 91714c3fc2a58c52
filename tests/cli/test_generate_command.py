"""``hsd generate`` end to end (subprocess) on a tiny pair written by ``python -m hsd_torch.models.tiny``,
and the torch-free dispatch of ``hsd_core.cli``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hsd_core import cli

ENV = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV, timeout=300)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("pair")
    res = run("-m", "hsd_torch.models.tiny", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert (out / "target" / "config.json").exists() and (out / "drafter" / "tokenizer.json").exists()
    return out


def test_generate_end_to_end(pair: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello\nimport os\\n\n", encoding="utf-8")
    code = ("import sys; from hsd_core.cli import main; sys.exit(main(sys.argv[1:]))")
    res = run("-c", code, "generate", "--target", str(pair / "target"), "--drafter", str(pair / "drafter"),
              "--method", "tli", "--prompt", "def foo(x):", "--prompts-file", str(prompts), "--max-new-tokens", "6",
              "--greedy", "--stats")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "=== [0] 'def foo(x):' ===" in out and "=== [2] 'import os\\n' ===" in out
    assert "tok/call" in out and "method tli" in out
    assert "3/3" in res.stderr, "the progress bar counts finished prompts"
    # greedy output equals the target's own greedy decoding (method ar)
    ar = run("-m", "hsd_torch.commands.generate", "--target", str(pair / "target"), "--method", "ar",
             "--prompt", "def foo(x):", "--prompt", "Hello", "--prompt", "import os\n", "--max-new-tokens", "6",
             "--greedy")
    assert ar.returncode == 0, ar.stderr
    texts = out[:out.index("\n#  ")]  # the continuations, before the blank line and the stats table
    assert ar.stdout == texts


def test_generate_bounded_slrs(pair: Path) -> None:
    """Bounded SLRS from the command line (proofs/slrs_bounded.md), multi-token proposals (``--max-tokens all``):
    greedy, it is the target's greedy decoding."""
    args = ("--target", str(pair / "target"), "--prompt", "def foo(x):", "--max-new-tokens", "6", "--greedy")
    res = run("-m", "hsd_torch.commands.generate", *args, "--drafter", str(pair / "drafter"), "--method", "slrs",
              "--lookahead", "3", "--proposal-map", "longest_prefix", "--min-path-prob", "0.05", "--max-tokens", "all")
    assert res.returncode == 0, res.stderr
    ar = run("-m", "hsd_torch.commands.generate", *args, "--method", "ar")
    assert ar.returncode == 0, ar.stderr
    assert res.stdout == ar.stdout


def test_generate_token_trees(pair: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--tree`` runs a method's token-tree twin (docs/trees.md): greedy, SLEM-tree with a static and TLI-tree
    with a dynamic shape are the target's greedy decoding; sampled, the same seed gives the same output; bad
    shapes and combinations are one-line refusals naming the fix."""
    args = ("--target", str(pair / "target"), "--prompt", "def foo(x):", "--prompt", "Hello", "--max-new-tokens", "6")
    ar = run("-m", "hsd_torch.commands.generate", *args, "--greedy", "--method", "ar")
    assert ar.returncode == 0, ar.stderr
    for method, shape in (("slem", "2,2,1"), ("tli", "dynamic:6:2:3")):
        res = run("-m", "hsd_torch.commands.generate", *args, "--greedy", "--drafter", str(pair / "drafter"),
                  "--method", method, "--tree", shape, "--stats")
        assert res.returncode == 0, res.stderr
        assert res.stdout.startswith(ar.stdout), (method, res.stdout)
    sampled = [run("-m", "hsd_torch.commands.generate", *args, "--drafter", str(pair / "drafter"), "--method", "tli",
                   "--tree", "2,1", "--tree-draws", "iid", "--seed", "5") for _ in range(2)]
    assert all(r.returncode == 0 for r in sampled), sampled[0].stderr
    assert sampled[0].stdout == sampled[1].stdout
    from hsd_torch.commands import generate as gen_cmd  # the refusals come before any model loads: in process

    base = [a for a in args if a != "--greedy"] + ["--drafter", str(pair / "drafter")]
    for extra, message in ((("--method", "tli", "--tree", "2,x"), "not a tree shape: '2,x'"),
                           (("--method", "tli", "--tree", "dynamic:2:6"), "dynamic:BUDGET:WIDTH:DEPTH"),
                           (("--method", "tli", "--tree", "0,1"), "integer >= 1"),
                           (("--method", "tli", "--tree", "2,1", "--lookahead", "3"), "a tree's depth is its lookahead"),
                           (("--method", "slrs", "--tree", "2,1"), "--tree is for --method sd, tli or slem"),
                           (("--method", "tli", "--tree-draws", "iid"), "give tree= too")):
        try:
            code = gen_cmd.main([*base, *extra])  # a refusal after parsing returns 2
        except SystemExit as e:  # argparse's refusal exits with 2
            code = e.code
        err = capsys.readouterr().err
        said = [ln for ln in err.strip().splitlines() if not ln.startswith(("usage:", " "))]
        assert code == 2 and "Traceback" not in err and message in err, (extra, err)
        assert len(said) == 1, err  # argparse's usage lines (if any), then one line


def test_generate_errors_are_one_line(pair: Path) -> None:
    res = run("-m", "hsd_torch.commands.generate", "--target", str(pair / "target"), "--drafter", str(pair / "drafter"),
              "--method", "slrs", "--lookahead", "3", "--prompt", "x")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "--proposal-map longest_prefix --min-path-prob TAU" in res.stderr and "issue" not in res.stderr
    res = run("-m", "hsd_torch.commands.generate", "--target", str(pair / "nope"), "--method", "ar", "--prompt", "x")
    assert res.returncode == 2 and "is not a folder" in res.stderr


def test_dispatch_without_torch(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("hsd_torch.commands.generate", "hsd_torch.cli"):  # an install made before the move names the old
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if torch were missing
    assert cli.main(["generate", "--target", "x"]) == 2
    assert "hsd generate needs torch" in capsys.readouterr().err
