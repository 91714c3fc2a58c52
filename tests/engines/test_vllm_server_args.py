"""The server side of the vLLM adapter without vLLM (fast tier): the api_server's options and
environment, the ``/metrics`` parser, the launcher's hand-over to the api_server module, and
:class:`VllmServer`'s life cycle (ready, stopped with every process of its group, a death or a
timeout reported with the log's tail) against fake servers: small scripts standing in for vLLM's
Python. The real server is tests/engines/test_vllm_server.py's (slow, engines)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from hsd_torch.engines import vllm_server as vs
from hsd_torch.engines import vllm_server_launch as launch


def test_server_args() -> None:
    a = vs.server_args("/m", 8123, served_model_name="smol", extra=["--max-num-seqs", "8"])
    assert a[:2] == ["--model", "/m"] and a[a.index("--host") + 1] == "127.0.0.1" and a[a.index("--port") + 1] == "8123"
    assert a[a.index("--dtype") + 1] == "float32" and "--enforce-eager" in a and "--no-enable-prefix-caching" in a
    assert a[a.index("--served-model-name") + 1] == "smol" and a[-2:] == ["--max-num-seqs", "8"]
    assert "--speculative-config" not in a and "--disable-hybrid-kv-cache-manager" not in a
    t = vs.server_args("/m", 1, speculative={"method": "tli", "model": "/d", "drafter": "gemma"}, dtype="bfloat16")
    cfg = json.loads(t[t.index("--speculative-config") + 1])
    assert cfg == {"method": "draft_model", "model": "/d", "use_heterogeneous_vocab": True, "num_speculative_tokens": 4}
    assert "--disable-hybrid-kv-cache-manager" in t and t[t.index("--dtype") + 1] == "bfloat16"


def test_server_env() -> None:
    env = vs.server_env({"OMP_NUM_THREADS": "3", vs.PATCH_ENV: "1", "X": "y"})
    assert env["OMP_NUM_THREADS"] == "3" and env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["X"] == "y"
    assert vs.PATCH_ENV not in env  # only when asked for, whatever the caller's environment says
    assert vs.server_env({}, patch_vllm_cpu_expand=True)[vs.PATCH_ENV] == "1" == vs.server_env({})["OMP_NUM_THREADS"]
    assert vs.PATCH_ENV == launch.PATCH_ENV


def test_parse_spec_metrics() -> None:
    text = "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="smol"} 41.0',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="smol"} 160.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="smol"} 8.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smol",position="1"} 2.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smol",position="0"} 6.0',
        'vllm:num_requests_running{engine="0"} 0.0'])
    m = vs.parse_spec_metrics(text)
    assert m == {"scope": "server", "num_drafts": 41, "num_draft_tokens": 160, "num_accepted_tokens": 8,
                 "num_accepted_tokens_per_pos": [6, 2], "acceptance_rate": 0.05}
    assert vs.parse_spec_metrics("") == {"scope": "server"}


def test_launcher_runs_the_api_server_module_as_main(monkeypatch: pytest.MonkeyPatch) -> None:
    import runpy

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(runpy, "run_module", lambda *a, **kw: calls.append((a, kw, list(sys.argv))))
    monkeypatch.setattr(sys, "argv", ["x"])
    assert launch.main(["--model", "/m", "--port", "1"]) == 0
    (args, kw, argv), = calls
    assert args == (launch.SERVER_MODULE,) and kw == {"run_name": "__main__", "alter_sys": False}
    assert argv == [launch.SERVER_MODULE, "--model", "/m", "--port", "1"]


FAKE = '''#!{python}
import http.server, json, subprocess, sys, time
args = sys.argv[2:]  # argv[1] is the launcher
mode = {mode!r}
if mode == "die":
    print("boom: no such model", flush=True)
    sys.exit(3)
if mode == "hang":
    time.sleep(60)
port, name = int(args[args.index("--port") + 1]), args[args.index("--served-model-name") + 1]
child = subprocess.Popen(["sleep", "60"])  # an engine process of the same group
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        body = {{"/health": b"", "/v1/models": json.dumps({{"data": [{{"id": name}}]}}).encode(),
                 "/metrics": b"vllm:spec_decode_num_draft_tokens_total 4.0\\nvllm:spec_decode_num_accepted_tokens_total 1.0\\n"}}.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"")
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def _fake(tmp_path: Path, mode: str) -> str:
    p = tmp_path / f"fake-{mode}"
    p.write_text(FAKE.format(python=sys.executable, mode=mode))
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def _children(pgid: int) -> int:
    n = 0
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{d}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        n += int(fields[2]) == pgid and fields[0] != "Z"
    return n


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="counts a process group's members in /proc")
def test_server_life_cycle_against_a_fake(tmp_path: Path) -> None:
    srv = vs.VllmServer(_fake(tmp_path, "serve"), "/m", served_model_name="smol", log=str(tmp_path / "s.log"),
                        poll_s=0.05, stop_timeout=5)
    with srv:
        assert srv.running() and srv.url == f"http://127.0.0.1:{srv.port}/v1" and srv.startup_s > 0
        assert _children(srv.pid) == 3 and vs.group_alive(srv.pid)  # the guard, the server, its engine
        assert srv.spec_stats() == {"scope": "server", "num_draft_tokens": 4, "num_accepted_tokens": 1,
                                    "acceptance_rate": 0.25}
    assert not srv.running() and not vs.group_alive(srv.pid) and _children(srv.pid) == 0
    srv.stop()  # twice is fine


def test_a_server_that_dies_or_hangs_is_reported_and_stopped(tmp_path: Path) -> None:
    dead = vs.VllmServer(_fake(tmp_path, "die"), "/m", log=str(tmp_path / "d.log"), poll_s=0.05)
    with pytest.raises(vs.VllmServerError, match=r"exited with status 3 before it was ready \(log .*d\.log: boom: no "
                                                 r"such model\)"):
        dead.start()
    hung = vs.VllmServer(_fake(tmp_path, "hang"), "/m", log=str(tmp_path / "h.log"), poll_s=0.05, startup_timeout=0.3)
    with pytest.raises(vs.VllmServerError, match=r"was not ready within 0.3 s"):
        with hung:
            pass
    assert not vs.group_alive(hung.pid) and not vs.group_alive(dead.pid)


def test_an_interrupted_start_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(url: str, timeout: float) -> tuple[int, bytes]:
        raise KeyboardInterrupt

    monkeypatch.setattr(vs, "_get", interrupt)
    srv = vs.VllmServer(_fake(tmp_path, "hang"), "/m", log=str(tmp_path / "i.log"), poll_s=0.05)
    with pytest.raises(KeyboardInterrupt):
        srv.start()
    assert srv.pid > 0 and not srv.running() and not vs.group_alive(srv.pid)
