"""The OpenAI-compatible endpoint client (:mod:`hsd_core.endpoint`) against a stdlib HTTP server of
our own (127.0.0.1, port 0, a thread) serving toy engines over the hsd_core toy world: lossless
speculation (SD), lossy speculation (SD that accepts every draft), a server that returns text only,
and a slow one; the draws come back in the samples format and the same audits run on them."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

import hsd_core as hc
from hsd_core.endpoint import EndpointError, check_endpoint, sample_endpoint
from hsd_core.samples import Sampling
from hsd_core.seqaudit import audit_sequences, sequence_seeds
from hsd_core.variants import AcceptEveryDraft

V = hc.Vocabulary(["a", "b", "c", "d", "ab", "ba", "cd"])
TOK = hc.LongestMatchTokenizer(V)
TARGET = hc.toy.random_model(V, TOK, seed=1, exact=False)
DRAFTER = hc.toy.random_model(V, TOK, seed=2, exact=False)
PROMPTS = ["ab", "ba"]
L = 8
ENGINES = {"lossless": hc.methods.SD(lookahead=3), "lossy": AcceptEveryDraft(lookahead=3), "plain": hc.methods.AR()}


class _Handler(BaseHTTPRequestHandler):
    mode = "lossless"
    requests: list[dict[str, Any]] = []

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, obj: Any, code: int = 200) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send({"data": [{"id": "toy"}]})
        else:
            self._send({"error": "no"}, 404)

    def do_POST(self) -> None:
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(req)
        mode = type(self).mode
        if mode == "slow":
            time.sleep(1.0)  # the budget test below leaves 0.5 s for one request's overhead
        native = self.path == "/completion"  # llama.cpp's native API, at the server's root
        if self.path != "/v1/completions" and not native:
            return self._send({"error": "no"}, 404)
        prompt = TOK.decode(req["prompt"])
        engine = ENGINES["lossless" if mode in ("slow", "text", "token_ids", "llama_oai") else mode]
        budget = req["n_predict"] if native else req["max_tokens"]
        ids = engine.generate(TARGET, None if mode == "plain" else DRAFTER, prompt, budget, rng=req["seed"])
        if native:  # llama.cpp's /completion with return_tokens: tokens and stop_type, no choices
            return self._send({"content": TOK.decode(ids), "tokens": ids, "stop": True,
                               "stop_type": "limit" if len(ids) == budget else "eos"})
        choice: dict[str, Any] = {"text": TOK.decode(ids), "finish_reason": "length" if len(ids) == budget
                                  else "stop"}
        if mode == "token_ids":
            choice["token_ids"] = ids
        elif mode == "llama_oai":  # llama.cpp's /v1/completions: chat-logprobs shape, token_id:N ignored
            choice["logprobs"] = {"content": [{"id": t, "token": TOK.decode([t]), "bytes": [], "logprob": -0.5,
                                               "top_logprobs": []} for t in ids]}
        elif mode != "text":
            choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in ids]}
        self._send({"choices": [choice]})


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:  # a client that timed out: nothing to say
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()


SAMPLING = Sampling(True, 1.0, None, None, L)


def _sample(url: str, mode: str, n: int, seed: int = 0, **kw: Any) -> Any:
    _Handler.mode = mode
    return sample_endpoint(url, PROMPTS, [TOK.encode(p) for p in PROMPTS], sequence_seeds(seed, n), SAMPLING, **kw)


def _replay_audit(f: Any, n: int, seed: int) -> Any:
    draws = iter(f.draws)

    def replay(prompt: str, seed: int) -> list[int]:
        d = next(draws)
        assert d.prompt == prompt and d.seed == seed  # the audit reads the draws in the order they were made
        return list(d.ids)

    return audit_sequences(replay, TARGET, PROMPTS, n=n, max_new_tokens=L, drafter=DRAFTER, context_bugs=None, seed=seed)


def test_requests_carry_seeds_ids_and_settings(server: str) -> None:
    _Handler.requests = []
    f = _sample(server, "lossless", 4)
    assert [d.seed for d in f.draws] == sequence_seeds(0, 4)
    r = _Handler.requests[0]
    assert r["prompt"] == TOK.encode("ab") and r["return_tokens_as_token_ids"] is True and r["logprobs"] == 1
    assert r["seed"] == sequence_seeds(0, 4)[0] and r["max_tokens"] == L and r["model"] == "toy"
    assert "top_k" not in r and r["temperature"] == 1.0
    assert f.engine["name"].startswith("openai-compatible endpoint http://127.0.0.1:") and not f.is_speculative
    # the same draw comes back for the same seed (the server's sampler is seeded), as token ids
    assert _sample(server, "lossless", 4).draws == f.draws
    assert _sample(server, "token_ids", 4).draws[0].ids == f.draws[0].ids
    # requests in flight together: the same draws, in seed order
    assert _sample(server, "lossless", 4, concurrency=3).draws == f.draws
    greedy = sample_endpoint(server, PROMPTS, [TOK.encode(p) for p in PROMPTS], [1], Sampling(False, 1.0, None, None, 3),
                             model="m", speculative={"method": "sd"})
    assert _Handler.requests[-1]["temperature"] == 0.0 and _Handler.requests[-1]["model"] == "m"
    assert greedy.is_speculative


def test_lossless_endpoint_passes_and_lossy_is_caught(server: str) -> None:
    """200 sequences x 8 tokens through the sequence audit (alpha 1e-3): the server that accepts every
    draft is caught (over seeds 0-3: more than 200 draws of probability 0 under the target, and the
    tests' smallest p-value 0), lossless speculation is lossless-consistent (smallest p 0.01-0.08)."""
    good = _replay_audit(_sample(server, "lossless", 200), 200, 0)
    assert good.verdict == "lossless-consistent", good.reason
    bad = _replay_audit(_sample(server, "lossy", 200, seed=1), 200, 1)
    assert bad.verdict == "lossy", bad.reason


def test_refusals(server: str) -> None:
    for url in ("http://10.0.0.1:8000/v1", "http://example.com/v1", "http://192.168.1.2/v1"):
        with pytest.raises(EndpointError, match="is not loopback .* --allow-remote"):
            _sample(url, "lossless", 1)
    assert check_endpoint("http://example.com/v1/", allow_remote=True) == "http://example.com/v1"
    assert check_endpoint("http://[::1]:9/v1") == "http://[::1]:9/v1" and check_endpoint("http://localhost:1")
    with pytest.raises(EndpointError, match="not an http"):
        check_endpoint("ftp://127.0.0.1/v1")
    with pytest.raises(EndpointError, match="returned no token ids .* cannot be audited"):
        _sample(server, "text", 1)
    with pytest.raises(EndpointError, match=r"did not answer within 0\.1 s \(timeout\)"):
        _sample(server, "slow", 1, timeout=0.1)
    # the first draw ends at 1 s plus overhead (0.5 s of margin on a loaded machine), the second
    # cannot end before 2 s: the budget runs out after exactly one draw
    with pytest.raises(EndpointError, match="time budget of 1.5 s ran out after 1 of 3 draws"):
        _sample(server, "slow", 3, time_budget=1.5)
    with pytest.raises(EndpointError, match="time budget of 0.5 s ran out after 0 of 4 draws"):
        _sample(server, "slow", 4, time_budget=0.5, concurrency=2)  # two in flight, neither can end before 1 s
    with pytest.raises(EndpointError, match="more than max_requests=2"):
        _sample(server, "lossless", 3, max_requests=2)
    with pytest.raises(EndpointError, match="answered HTTP 404"):
        _sample(server.rsplit("/v1", 1)[0] + "/v2", "lossless", 1, model="toy")
    with pytest.raises(EndpointError, match="cannot be reached"):
        _sample("http://127.0.0.1:9/v1", "lossless", 1, model="toy", timeout=2)


def test_the_request_carries_the_processing_keys() -> None:
    """Issue 47 item 3: the client sends every processing key a file's sampling sets (vLLM's OpenAI names),
    not the order (the file's word about the engine), and refuses bad words given as ids."""
    from dataclasses import replace

    from hsd_core.dialects import request_body as _body

    s = replace(Sampling(True, 0.5, 3, 0.9, 4), min_p=0.1, repetition_penalty=1.2, logit_bias=((30, 5.0),),
                min_tokens=2, stop=("\n",), allowed_token_ids=(1, 30), order="vllm")
    body = _body("m", [1, 2], 7, s)
    assert body["min_tokens"] == 2 and body["logit_bias"] == {"30": 5.0} and body["stop"] == ["\n"]
    assert body["min_p"] == 0.1 and body["repetition_penalty"] == 1.2 and body["allowed_token_ids"] == [1, 30]
    assert "order" not in body and body["temperature"] == 0.5 and body["top_k"] == 3
    with pytest.raises(ValueError, match="bad_words_ids cannot be sent"):
        _body("m", [1], 7, replace(s, bad_words_ids=((3,),)))


def test_every_id_shape_is_read(server: str) -> None:
    """Issue 49 item 2: the same draws come back whatever shape the server answers in: vLLM's
    ``token_id:N`` and ``token_ids`` (SGLang's OpenAI answer too), llama.cpp's OpenAI chat-logprobs
    shape (``logprobs.content[i].id``) and its native ``/completion`` (``tokens``, ``stop_type``)."""
    ref = _sample(server, "lossless", 6)
    assert _sample(server, "token_ids", 6).draws == ref.draws
    assert _sample(server, "llama_oai", 6).draws == ref.draws
    _Handler.mode = "lossless"
    native = sample_endpoint(server, PROMPTS, [TOK.encode(p) for p in PROMPTS], sequence_seeds(0, 6), SAMPLING,
                             api="llama.cpp")
    assert [d.ids for d in native.draws] == [d.ids for d in ref.draws]
    assert [d.finish_reason for d in native.draws] == [d.finish_reason for d in ref.draws]
    assert _Handler.requests[-1]["return_tokens"] is True and _Handler.requests[-1]["n_predict"] == L
    assert native.engine["server_kind"] == "llama.cpp"


def test_native_shapes_and_refusals() -> None:
    """The parser alone: SGLang's native ``/generate`` answer, llama.cpp's stop types, and an answer
    whose ``logprobs.content`` has no ids (text only) refused, not guessed."""
    from hsd_core.dialects import ids_of as _ids_of

    assert _ids_of({"text": "ab", "output_ids": [4, 5], "meta_info": {"finish_reason": {"type": "length"}}}, "u") \
        == ([4, 5], "length")
    assert _ids_of({"tokens": [4, 2], "stop_type": "eos"}, "u") == ([4, 2], "stop")
    assert _ids_of({"tokens": [4, 7], "stop_type": "word"}, "u") == ([4, 7], "stop")
    assert _ids_of({"tokens": [4], "stop_type": "limit"}, "u") == ([4], "length")
    with pytest.raises(EndpointError, match="returned no token ids"):
        _ids_of({"choices": [{"logprobs": {"content": [{"token": "a", "logprob": -1.0}]}}]}, "u")
    with pytest.raises(EndpointError, match=r"without choices\[0\]"):
        _ids_of({"content": "ab", "tokens": [], "stop": True}, "u")  # no stop_type: return_tokens not honoured?


@pytest.mark.parametrize("kind", ["vllm", "llama.cpp", "sglang"])
def test_neutral_values_are_sent_and_recorded(server: str, kind: str, tmp_path: Any) -> None:
    """Issue 49 item 2: with a server kind, every stage the processing does not name goes out at its
    neutral value (llama.cpp: top-k 0, top-p 1, min-p 0, no penalty window, DRY / XTC / typical-p /
    top-n-sigma / mirostat off, the sampler chain hsd models), the named ones under the server's names,
    and the samples file records what was sent."""
    from hsd_core.endpoint import LLAMA_CPP_SAMPLERS
    from hsd_core.samples import read_samples

    s = Sampling(True, 0.7, None, 0.9, L, repetition_penalty=1.3, order="llama.cpp" if kind == "llama.cpp" else "vllm")
    _Handler.mode = "lossless"
    out = tmp_path / "draws.jsonl"
    sample_endpoint(server, PROMPTS, [TOK.encode(p) for p in PROMPTS], sequence_seeds(0, 2), s, server_kind=kind,
                    out=out)
    r = _Handler.requests[-1]
    assert r["temperature"] == 0.7 and r["top_p"] == 0.9 and "order" not in r
    if kind == "llama.cpp":
        assert r["top_k"] == 0 and r["min_p"] == 0.0 and r["typical_p"] == 1.0 and r["xtc_probability"] == 0.0
        assert r["dry_multiplier"] == 0.0 and r["mirostat"] == 0 and r["top_n_sigma"] == -1.0
        assert r["repeat_penalty"] == 1.3 and "repetition_penalty" not in r
        assert r["repeat_last_n"] == max(len(TOK.encode(p)) for p in PROMPTS) + L  # every id, not the default 64
        assert r["samplers"] == list(LLAMA_CPP_SAMPLERS)
    else:
        assert r["top_k"] == -1 and r["min_p"] == 0.0 and r["repetition_penalty"] == 1.3
        assert r["presence_penalty"] == 0.0 and r["frequency_penalty"] == 0.0
    f = read_samples(out)
    assert f.engine["server_kind"] == kind
    sent = {k: v for k, v in r.items() if k in f.engine["request"]}
    assert sent == f.engine["request"]  # what the file says was sent is what the server received


def test_stages_a_server_lacks_are_refused() -> None:
    from dataclasses import replace

    from hsd_core.endpoint import request_settings

    base = Sampling(True, 1.0, None, None, 4, order="llama.cpp")
    for key, value in (("allowed_token_ids", (1, 2)), ("min_tokens", 2)):
        with pytest.raises(ValueError, match=f"{key} is not a llama.cpp sampling parameter"):
            request_settings("llama.cpp", replace(base, **{key: value}), 8)
    with pytest.raises(ValueError, match="allowed_token_ids is not a sglang sampling parameter"):
        request_settings("sglang", replace(base, allowed_token_ids=(1,), order="vllm"), 8)
    with pytest.raises(ValueError, match="unknown server kind"):
        request_settings("tgi", base, 8)
    greedy = request_settings("llama.cpp", Sampling(False, 1.0, None, None, 4, min_p=0.2, order="llama.cpp"), 8)
    assert greedy["temperature"] == 0.0 and greedy["min_p"] == 0.0  # greedy: min-p carries no meaning
    assert request_settings("llama.cpp", replace(base, repetition_penalty=1.1, penalty_last_n=3), 8)["repeat_last_n"] == 3
