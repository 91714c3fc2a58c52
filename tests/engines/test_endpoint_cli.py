"""``hsd audit endpoint`` under faults, end to end (issue 48, items 1, 3, 4): the tiny Llama target
(byte-level BPE, saved as a checkpoint folder), 20 draws of 4 tokens from a stdlib fake server that
fails with HTTP 500 after 10 draws: the command ends with one error line naming the saved file, which
holds the 10 draws; the same command again is refused unless ``--resume``, which requests only the
10 missing seeds and states the resumed draws and the retries in the report. An id outside the
target's vocabulary is an engine error naming the draw. Fast tier (about 10 s)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hsd_core.cli import main as hsd_main  # noqa: E402
from hsd_core.samples import read_samples  # noqa: E402
from hsd_core.seqaudit import sequence_seeds  # noqa: E402
from hsd_torch.models import tiny  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import suite_helpers  # noqa: E402


class _Handler(suite_helpers.JsonHandler):
    mode = "ok"
    fail_from = 10**9
    seeds: list[int] = []
    last: dict[str, Any] = {}

    def answer(self, req: dict[str, Any]) -> tuple[int, Any]:
        cls = type(self)
        cls.seeds.append(req["seed"])
        cls.last = req
        ids = [(req["seed"] * 31 + 7 * k) % 200 for k in range(req["max_tokens"])]
        code = 200
        obj: dict[str, Any] = {"choices": [{"token_ids": ids}]}
        if len(cls.seeds) > cls.fail_from:
            code, obj = 500, {"error": "engine crashed"}
        elif cls.mode == "huge_id":
            obj = {"choices": [{"token_ids": ids[:-1] + [10**9]}]}
        elif cls.mode == "llama_oai":  # llama.cpp's /v1/completions: ids only in logprobs.content[i].id
            obj = {"choices": [{"text": "", "finish_reason": "length",
                                "logprobs": {"content": [{"id": t, "token": "", "logprob": -1.0} for t in ids]}}]}
        return code, obj


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with suite_helpers.loopback_server(_Handler) as url:
        yield url


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    tok = tiny.tiny_tokenizer("byte_bpe")
    d = tmp_path_factory.mktemp("target")
    tiny.tiny_llama(tok, seed=0).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _audit(server: str, folder: Path, out: Path, *extra: str) -> list[str]:
    return ["audit", "endpoint", "--endpoint", server, "--model", "tiny", "--target", str(folder), "--prompt", "def f(x):",
            "--samples", "20", "--max-new-tokens", "4", "--request-timeout", "3", "--time-budget", "40",
            "--context-bugs", "none", "--save-samples", str(out), *extra]


def test_a_failing_server_loses_no_draw_and_the_run_resumes(server: str, folder: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    _Handler.mode, _Handler.fail_from, _Handler.seeds = "ok", 10, []
    assert hsd_main(_audit(server, folder, tmp_path, "--retries", "0")) == 2
    err = capsys.readouterr().err
    assert "answered HTTP 500" in err and f"(10 of 20 draws made; they are saved in {tmp_path}" in err, err
    # progress in a log: a line per 5 % of the 20 draws (each draw is 5 %), the last at the tenth
    bar = [ln.split(", ")[0] for ln in err.splitlines() if ln.startswith("hsd audit: drawing from the endpoint")]
    assert bar == [f"hsd audit: drawing from the endpoint {server} {k}/20 ({5 * k}%)" for k in range(1, 11)], err
    assert len(read_samples(tmp_path / "endpoint.jsonl").draws) == 10
    assert hsd_main(_audit(server, folder, tmp_path)) == 2
    assert "exists: resume it" in capsys.readouterr().err
    _Handler.fail_from, _Handler.seeds = 10**9, []
    rc = hsd_main(_audit(server, folder, tmp_path, "--resume", "--report", str(tmp_path / "r.md")))
    cap = capsys.readouterr()
    out = cap.out
    assert f"hsd audit: drawing from the endpoint {server} 10/20 (50%)" in cap.err  # the resumed draws count
    assert f"hsd audit: drawing from the endpoint {server} 20/20 (100%)" in cap.err
    assert rc in (0, 1) and len(_Handler.seeds) == 10, out
    assert "10 requests, no retries, 10 draws resumed from the saved file" in out and "v1>" not in out
    assert "10 draws resumed" in (tmp_path / "r.md").read_text()
    assert [d.seed for d in read_samples(tmp_path / "endpoint.jsonl").draws] == sequence_seeds(0, 20)


def test_an_id_outside_the_vocabulary_is_an_engine_error(server: str, folder: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    _Handler.mode, _Handler.fail_from, _Handler.seeds = "huge_id", 10**9, []
    assert hsd_main(_audit(server, folder, tmp_path)) == 2
    err = capsys.readouterr().err
    assert "draw 0 (seed" in err and "returned id 1000000000, outside the target's vocabulary of" in err, err


def test_resume_needs_the_folder(server: str, folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [a for a in _audit(server, folder, Path("x")) if a not in ("--save-samples", "x")] + ["--resume"]
    assert hsd_main(args) == 2
    assert "--resume continues the run saved by --save-samples DIR" in capsys.readouterr().err


def test_llama_cpp_server_is_read_and_told_every_stage(server: str, folder: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 49 item 2: llama.cpp's OpenAI answer (ids in ``logprobs.content[i].id``) is audited, not refused
    with "returned no token ids"; ``--server-kind llama.cpp`` sends its neutral values (top-k 0, top-p 1,
    min-p 0, ...) and the samples file records them with llama.cpp's order."""
    _Handler.mode, _Handler.fail_from, _Handler.seeds = "llama_oai", 10**9, []
    rc = hsd_main(_audit(server, folder, tmp_path, "--server-kind", "llama.cpp"))
    out = capsys.readouterr()
    assert rc in (0, 1) and "returned no token ids" not in out.err, out.err
    assert _Handler.last["top_k"] == 0 and _Handler.last["min_p"] == 0.0 and _Handler.last["top_p"] == 1.0
    assert _Handler.last["samplers"] == ["penalties", "top_k", "top_p", "min_p", "temperature"]
    f = read_samples(tmp_path / "endpoint.jsonl")
    assert f.engine["server_kind"] == "llama.cpp" and f.engine["request"]["typical_p"] == 1.0
    assert f.sampling.order == "llama.cpp" and len(f.draws) == 20
