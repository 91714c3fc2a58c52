"""Fault injection for the endpoint client (:mod:`hsd_core.endpoint`): a stdlib HTTP server of our own
(127.0.0.1, port 0, threads) with one mode per fault, and what the client must do about each:

* no draw lost: draws appended to ``out`` as they arrive, kept after an HTTP 500, a reset, a server
  that goes away, the budget, SIGKILL; ``resume`` requests only the missing seeds and ends with the
  file an uninterrupted run writes;
* deadlines kept: a server that drips its answer a byte at a time cannot hold a request past its
  timeout, nor the run past its budget, at concurrency 1 and 8;
* transient faults (429/500/502/503/504, a reset) retried with backoff and counted; a 400 never;
* bad answers named: ids outside the vocabulary, more ids than ``max_tokens``, negative and boolean
  ids, no ``choices``, not JSON, JSON nested too deeply, an answer too long;
* redirects (302/307/308, to a non-loopback host) never followed, with and without ``allow_remote``;
* load: 256 draws at concurrency 64 from a server that answers out of order with latency spikes:
  seed order, at most 64 requests in flight, within the budget.

The fake engine's draw is a fixed function of (prompt, seed), so "the same draws" is an exact check.
No statistics here: every assertion is exact. Fast tier (about 15 s on a loaded machine).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hsd_core import endpoint as ep
from hsd_core import transport
from hsd_core.endpoint import EndpointError, EndpointStats, sample_endpoint
from hsd_core.samples import Sampling, read_samples
from hsd_core.seqaudit import sequence_seeds

V = 50
SAMPLING = Sampling(True, 1.0, None, None, 4)
PROMPTS, PIDS = ["x", "yz"], [[1, 2], [3, 4, 5]]


def draw_of(prompt: list[int], seed: int, n: int) -> list[int]:
    """The fake engine's draw: a fixed function of the prompt and the seed."""
    return [(seed * 31 + k * 7 + sum(prompt)) % V for k in range(n)]


class Fake:
    """The server's behaviour: ``mode`` from the request numbered ``after`` on (0-based, counted per
    server), ``flaky``: each seed's first request fails with ``mode`` and its retry succeeds."""

    def __init__(self) -> None:
        self.mode, self.after, self.flaky = "ok", 0, False
        self.lock = threading.Lock()
        self.count = 0
        self.seeds: list[int] = []
        self.failed: set[int] = set()
        self.inflight = self.max_inflight = 0
        self.server: Any = None


class Handler(BaseHTTPRequestHandler):
    fake: Fake

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, obj: Any, code: int = 200, raw: bytes | None = None, headers: dict[str, str] | None = None) -> None:
        body = raw if raw is not None else json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send({"data": [{"id": "fake"}]})

    def do_POST(self) -> None:
        f = self.fake
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with f.lock:
            no = f.count
            f.count += 1
            f.seeds.append(req["seed"])
            f.inflight += 1
            f.max_inflight = max(f.max_inflight, f.inflight)
            first = req["seed"] not in f.failed
            f.failed.add(req["seed"])
        try:
            mode = f.mode if (no >= f.after and (not f.flaky or first)) else "ok"
            self._answer(mode, req)
        finally:
            with f.lock:
                f.inflight -= 1

    def _answer(self, mode: str, req: dict[str, Any]) -> None:
        ids: Any = draw_of(req["prompt"], req["seed"], req["max_tokens"])
        if mode.startswith("http"):
            code = int(mode[4:])
            return self._send({"error": "fault"}, code, headers={"Retry-After": "0"} if code == 429 else None)
        if mode.startswith("redirect"):
            self.send_response(int(mode[8:]))
            self.send_header("Location", "http://203.0.113.7/v1/completions")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if mode == "reset":
            self.close_connection = True
            return None  # no answer at all: the client sees the connection closed
        if mode == "exit":
            threading.Thread(target=self.fake.server.shutdown).start()
            self.fake.server.socket.close()
            self.close_connection = True
            return None
        if mode == "drip":
            body = json.dumps({"choices": [{"token_ids": ids}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                for b in body:
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass
            return None
        if mode == "spiky":  # latency from the seed: out of order, some spikes of 0.6 s
            time.sleep(0.6 if req["seed"] % 13 == 0 else (req["seed"] % 7) * 0.02)
        answers: dict[str, Any] = {
            "huge_id": {"choices": [{"token_ids": ids[:-1] + [10 ** 9]}]},
            "too_many": {"choices": [{"token_ids": ids * 3}]},
            "negative": {"choices": [{"token_ids": [-3] + ids[1:]}]},
            "bools": {"choices": [{"token_ids": [True, False]}]},
            "no_choices": {"object": "text_completion"},
        }
        if mode in answers:
            return self._send(answers[mode])
        if mode == "not_json":
            return self._send(None, raw=b"<html>busy</html>")
        if mode == "nested":
            return self._send(None, raw=b"[" * 100_000 + b"]" * 100_000)
        if mode == "long":
            return self._send(None, raw=b" " * 5000 + json.dumps({"choices": [{"token_ids": ids}]}).encode())
        return self._send({"choices": [{"token_ids": ids, "finish_reason": "length"}]})


@pytest.fixture()
def fake() -> Iterator[tuple[Fake, str]]:
    f = Fake()
    handler = type("H", (Handler,), {"fake": f})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    f.server = srv
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f, f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()


def _sample(url: str, n: int = 20, seed: int = 0, **kw: Any) -> Any:
    kw.setdefault("vocab_size", V)
    kw.setdefault("timeout", 3.0)
    kw.setdefault("time_budget", 40.0)
    return sample_endpoint(url, PROMPTS, PIDS, sequence_seeds(seed, n), SAMPLING, model="fake", **kw)


def _expected(n: int, seed: int = 0) -> list[tuple[int, ...]]:
    return [tuple(draw_of(PIDS[i % 2], s, 4)) for i, s in enumerate(sequence_seeds(seed, n))]


@pytest.mark.parametrize("mode", ["http500", "reset", "exit"])
def test_draws_made_before_a_fault_are_kept_and_resumed(fake: tuple[Fake, str], tmp_path: Path, mode: str) -> None:
    """10 good draws, then a fault that stays (no retry left): the run ends with an error naming the
    saved file, which holds the 10 draws as a valid samples file; resuming requests only the 10
    missing seeds and ends with the file of an uninterrupted run (checked draw by draw)."""
    f, url = fake
    f.mode, f.after = mode, 10
    out = tmp_path / "endpoint.jsonl"
    with pytest.raises(EndpointError, match=r"\(10 of 20 draws made; they are saved in .*endpoint\.jsonl"):
        _sample(url, out=out, retries=0)
    kept = read_samples(out)
    assert [d.ids for d in kept.draws] == _expected(20)[:10]
    with pytest.raises(EndpointError, match="exists: resume it"):
        _sample(url, out=out)
    if mode == "exit":
        return  # the server is gone; the resume below is checked with the other two faults
    f.mode, f.seeds = "ok", []
    stats = EndpointStats()
    done = _sample(url, out=out, resume=True, stats=stats)
    assert sorted(f.seeds) == sorted(sequence_seeds(0, 20)[10:]) and stats.resumed == 10
    assert [d.ids for d in done.draws] == _expected(20) and [d.ids for d in read_samples(out).draws] == _expected(20)
    assert [d.seed for d in read_samples(out).draws] == sequence_seeds(0, 20)


def test_resume_refuses_another_run(fake: tuple[Fake, str], tmp_path: Path) -> None:
    f, url = fake
    out = tmp_path / "e.jsonl"
    f.mode, f.after = "http500", 3
    with pytest.raises(EndpointError, match="3 of 8 draws made"):
        _sample(url, n=8, out=out, retries=0)
    f.mode = "ok"
    with pytest.raises(EndpointError, match="seed .* is not one of this run's seeds"):
        _sample(url, n=8, seed=5, out=out, resume=True)
    with pytest.raises(EndpointError, match="key 'sampling'"):
        sample_endpoint(url, PROMPTS, PIDS, sequence_seeds(0, 8), Sampling(True, 0.5, None, None, 4), model="fake",
                        out=out, resume=True)
    with pytest.raises(EndpointError, match="other prompt ids"):
        sample_endpoint(url, PROMPTS, [[9], [8]], sequence_seeds(0, 8), SAMPLING, model="fake", out=out, resume=True)
    assert len(_sample(url, n=8, out=out, resume=True).draws) == 8


def test_a_torn_last_line_is_cut_on_resume(fake: tuple[Fake, str], tmp_path: Path) -> None:
    f, url = fake
    out = tmp_path / "e.jsonl"
    f.mode, f.after = "http500", 4
    with pytest.raises(EndpointError):
        _sample(url, n=6, out=out, retries=0)
    with open(out, "a", encoding="utf-8") as fh:
        fh.write('{"format": "hsd-samples/1", "ids": [1,')  # a write cut short by a crash
    f.mode = "ok"
    assert [d.ids for d in _sample(url, n=6, out=out, resume=True).draws] == _expected(6)


def test_sigkill_keeps_every_draw_written(fake: tuple[Fake, str], tmp_path: Path) -> None:
    """A client process killed with SIGKILL mid-run (the server answers slowly) leaves a valid
    samples file holding the draws it had received; resuming completes it."""
    f, url = fake
    f.mode = "spiky"
    out = tmp_path / "e.jsonl"
    code = ("import sys; from hsd_core.endpoint import sample_endpoint; from hsd_core.samples import Sampling; "
            "from hsd_core.seqaudit import sequence_seeds; "
            f"sample_endpoint({url!r}, ['x', 'yz'], [[1, 2], [3, 4, 5]], sequence_seeds(0, 200), "
            f"Sampling(True, 1.0, None, None, 4), model='fake', out={str(out)!r}, concurrency=2)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 60
        while (not out.exists() or out.read_text().count("\n") < 5) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    kept = read_samples(out)
    assert 5 <= len(kept.draws) < 200
    expected = dict(zip(sequence_seeds(0, 200), _expected(200)))
    assert all(d.seed is not None and d.ids == expected[d.seed] for d in kept.draws)
    f.mode = "ok"
    assert [d.ids for d in _sample(url, n=200, out=out, resume=True, concurrency=8).draws] == _expected(200)


@pytest.mark.parametrize("concurrency", [1, 8])
def test_a_dripping_server_cannot_hold_a_request_or_the_run(fake: tuple[Fake, str], concurrency: int) -> None:
    """The answer (about 60 bytes) comes a byte every 0.2 s: each read returns within the socket
    timeout, but the request must end at its 1 s deadline, and the run at its budget."""
    f, url = fake
    f.mode = "drip"
    t0 = time.monotonic()
    with pytest.raises(EndpointError, match=r"did not answer within 1 s \(timeout\)"):
        _sample(url, n=8, timeout=1.0, concurrency=concurrency)
    assert time.monotonic() - t0 < 3.0
    t0 = time.monotonic()
    with pytest.raises(EndpointError, match=r"time budget of 1\.5 s ran out after 0 of 8 draws"):
        _sample(url, n=8, timeout=30.0, time_budget=1.5, concurrency=concurrency)
    assert time.monotonic() - t0 < 3.5


@pytest.mark.parametrize("mode", ["http429", "http500", "http502", "http503", "http504", "reset"])
def test_transient_faults_are_retried_and_counted(fake: tuple[Fake, str], mode: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ep, "BACKOFF_FIRST", 0.01)
    f, url = fake
    f.mode, f.flaky = mode, True
    stats = EndpointStats()
    got = _sample(url, n=6, stats=stats, concurrency=3)
    assert [d.ids for d in got.draws] == _expected(6)
    kind = "reset" if mode == "reset" else f"HTTP {mode[4:]}"
    assert stats.retries == {kind: 6} and stats.requests == 12 and f"6 retries ({kind} x6)" in stats.describe()
    f.failed = set()  # each seed fails once more, and no retry is allowed
    with pytest.raises(EndpointError, match="HTTP 5|HTTP 4|closed the connection"):
        _sample(url, n=6, retries=0)


def test_retries_are_bounded_and_a_wrong_request_is_never_retried(fake: tuple[Fake, str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ep, "BACKOFF_FIRST", 0.01)
    f, url = fake
    f.mode = "http503"
    with pytest.raises(EndpointError, match=r"answered HTTP 503: .* \(still, after 2 retries\)"):
        _sample(url, n=1, retries=2)
    assert f.count == 3
    for code in (400, 404, 422):
        f.mode, f.count = f"http{code}", 0
        with pytest.raises(EndpointError, match=f"answered HTTP {code}"):
            _sample(url, n=1, retries=5)
        assert f.count == 1


def test_backoff_stays_within_the_run_budget(fake: tuple[Fake, str]) -> None:
    f, url = fake
    f.mode = "http503"  # backoff 0.25, 0.5, 1, 2, 4 s: the budget of 1 s ends it
    t0 = time.monotonic()
    with pytest.raises(EndpointError, match="time budget of 1 s ran out after 0 of 2 draws"):
        _sample(url, n=2, retries=10, time_budget=1.0)
    assert time.monotonic() - t0 < 1.5


@pytest.mark.parametrize(("mode", "message"), [
    ("huge_id", r"draw 0 \(seed \d+\) returned id 1000000000, outside the target's vocabulary of 50 ids"),
    ("too_many", r"draw 0 \(seed \d+\) returned 12 ids, more than max_tokens=4"),
    ("negative", r"draw 0 \(seed \d+\) returned id -3, outside the target's vocabulary"),
    ("bools", "returned no token ids"),
    ("no_choices", r"without choices\[0\]"),
    ("not_json", "not JSON"),
    ("nested", "nested too deeply"),
])
def test_bad_answers_are_named_engine_errors(fake: tuple[Fake, str], mode: str, message: str) -> None:
    f, url = fake
    f.mode = mode
    with pytest.raises(EndpointError, match=message):
        _sample(url, n=3)


def test_an_answer_too_long_is_refused(fake: tuple[Fake, str], monkeypatch: pytest.MonkeyPatch) -> None:
    f, url = fake
    f.mode = "long"
    assert len(_sample(url, n=1).draws) == 1
    monkeypatch.setattr(transport, "MAX_ANSWER_BYTES", 1000)  # where the bound is read
    with pytest.raises(EndpointError, match="more than 1,000 bytes"):
        _sample(url, n=1)


@pytest.mark.parametrize("code", [302, 307, 308])
@pytest.mark.parametrize("allow_remote", [False, True])
def test_redirects_are_never_followed(fake: tuple[Fake, str], code: int, allow_remote: bool) -> None:
    f, url = fake
    f.mode = f"redirect{code}"
    with pytest.raises(EndpointError, match=f"HTTP {code}, a redirect to 'http://203.0.113.7/v1/completions': hsd "
                                            "follows no redirect"):
        _sample(url, n=2, allow_remote=allow_remote, retries=3)
    assert f.count == 1  # refused at once, never retried


def test_load_out_of_order_with_spikes(fake: tuple[Fake, str], tmp_path: Path) -> None:
    """256 draws at concurrency 64, answers delayed by 0-0.12 s by seed and 0.6 s for one seed in
    13: the draws (and the file) in seed order, never more than 64 requests in flight, the run
    within its budget."""
    f, url = fake
    f.mode = "spiky"
    t0 = time.monotonic()
    got = _sample(url, n=256, concurrency=64, out=tmp_path / "load.jsonl", time_budget=30.0)
    assert time.monotonic() - t0 < 30.0
    assert [d.ids for d in got.draws] == _expected(256) and [d.seed for d in got.draws] == sequence_seeds(0, 256)
    assert [d.ids for d in read_samples(tmp_path / "load.jsonl").draws] == _expected(256)
    assert 1 < f.max_inflight <= 64


def test_the_samples_label_is_the_host(fake: tuple[Fake, str]) -> None:
    _, url = fake
    got = _sample(url, n=1)
    assert got.path == f"endpoint {url.split('//')[1].split('/')[0]}" and "v1>" not in got.describe()


def test_ctrl_c_ends_at_once_and_keeps_the_draws(fake: tuple[Fake, str], tmp_path: Path) -> None:
    """SIGINT to a client whose 4 requests in flight hang on a dripping server (request timeout 30 s,
    each answer takes 12 s): it ends within 5 s (the sockets in flight are shut), with the draws it
    had (5) in a valid file."""
    f, url = fake
    f.mode, f.after = "drip", 5
    out = tmp_path / "e.jsonl"
    code = ("from hsd_core.endpoint import sample_endpoint; from hsd_core.samples import Sampling; "
            "from hsd_core.seqaudit import sequence_seeds; "
            f"sample_endpoint({url!r}, ['x', 'yz'], [[1, 2], [3, 4, 5]], sequence_seeds(0, 50), "
            f"Sampling(True, 1.0, None, None, 4), model='fake', out={str(out)!r}, concurrency=4, timeout=30)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while (not out.exists() or out.read_text().count("\n") < 5 or f.count < 9) and time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
        assert time.monotonic() - t0 < 5.0
    finally:
        proc.kill()
        proc.wait()
    assert b"KeyboardInterrupt" in err and proc.returncode != 0
    kept = read_samples(out)  # in the order the draws arrived
    expected = dict(zip(sequence_seeds(0, 50), _expected(50)))
    assert len(kept.draws) >= 5 and all(d.seed is not None and d.ids == expected[d.seed] for d in kept.draws)
