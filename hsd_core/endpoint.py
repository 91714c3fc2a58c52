"""Draws from an OpenAI-compatible completions endpoint, recorded in the samples format.

:func:`sample_endpoint` posts ``n`` requests to ``{base}/completions`` (vLLM's
``python -m vllm.entrypoints.openai.api_server``, SGLang, llama.cpp's server, ...), one draw per
request, each with its own ``seed``, the prompt as the target's ids (``prompt`` takes a list of ids
in the OpenAI API) and ``return_tokens_as_token_ids`` with ``logprobs`` so that the generated ids
come back as ids: a decoded string cannot be mapped back to ids (several id sequences decode to one
text). **Id shapes**: the ids are read from whichever of these the answer holds (a server that returns
none is refused, :class:`EndpointError`, rather than guessed):

* ``choices[0].token_ids`` (vLLM's and SGLang's ``return_token_ids``);
* ``choices[0].logprobs.tokens`` written ``"token_id:N"`` (vLLM's ``return_tokens_as_token_ids``);
* ``choices[0].logprobs.content[i].id`` (llama.cpp's server on ``/v1/completions``: its chat-logprobs
  shape; it ignores ``return_tokens_as_token_ids``);
* ``tokens`` with ``stop_type`` (llama.cpp's native ``/completion`` with ``return_tokens``; ``eos`` and
  ``word`` read as finish reason ``"stop"``, ``limit`` as ``"length"``);
* ``output_ids`` with ``meta_info.finish_reason.type`` (SGLang's native ``/generate``).

**Neutral values** (``server_kind``): a server applies its own defaults to every stage a request does
not name (llama.cpp: top-k 40, top-p 0.95, min-p 0.05, a repetition window, DRY, XTC, typical-p; vLLM
and SGLang: the model's generation config). Told the server's kind, the client sends the neutral value
of every stage the request's processing does not name (:func:`request_settings`) and records what it
sent in the samples file (``engine.server_kind``, ``engine.request``). The draws come back as a
:class:`~hsd_core.samples.SamplesFile` (and can be written with :func:`hsd_core.samples.write_samples`),
so the audit of a samples file runs on them unchanged.

**Bad answers are engine errors, never draws**: a negative id, an id outside the target's
vocabulary (``vocab_size``) or more ids than ``max_tokens`` is refused with one line naming the
draw (its index and seed) and the id and the vocabulary size, or the count and ``max_tokens``.

**No draw lost** (``out``): every draw is appended to the samples file ``out`` as it arrives
(:class:`~hsd_core.samples.SamplesAppender`: one whole line per ``write``, so the file is a valid
samples file at every moment) and stays there whatever ends the run (an error, the budget, Ctrl-C,
SIGKILL); a finished run rewrites the file in seed order, atomically. ``resume=True`` continues
such a file: the draws it holds (the same settings, seeds of this run, each with its own prompt)
are kept and only the missing seeds are requested, so a resumed run ends with the file that an
uninterrupted one writes.

**Deadlines**: each request ends within ``timeout`` seconds of wall-clock time whatever the server
sends (a watchdog shuts the socket at the deadline: a server that drips its answer a byte at a time
cannot hold a request), and the whole run within ``time_budget`` seconds, at every ``concurrency``.

**Transient faults** (HTTP 429, 500, 502, 503, 504; a connection reset or closed before a whole
answer) are retried up to ``retries`` times per draw with bounded exponential backoff (0.25 s,
doubling, at most 8 s; the server's ``Retry-After`` when it gives one, at most 8 s; never past the
run's deadline); the same request goes again (the same seed: the same draw). Every other 4xx says
the request is wrong and is never retried. Retries are counted (:class:`EndpointStats`).

**Bounded and local**: at most ``max_requests`` draws (``n`` must fit), answers of at most
:data:`MAX_ANSWER_BYTES`, at most ``concurrency`` requests in flight; loopback hosts only
(``localhost``, 127.0.0.0/8, ``::1``) unless ``allow_remote=True``; a redirect (3xx) is never
followed, to any host: it is refused with the place it points to. Standard library only
(``http.client``); no new dependency and no torch, so an engine's own test suite can use it.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from .samples import Draw, Sampling, SamplesAppender, SamplesFile, format_draw, parse_samples, recover_samples, \
    write_samples

__all__ = ["APIS", "BACKOFF_FIRST", "BACKOFF_MAX", "EndpointError", "EndpointStats", "LLAMA_CPP_SAMPLERS",
           "MAX_ANSWER_BYTES", "RETRY_STATUS", "SERVER_KINDS", "check_endpoint", "request_settings", "sample_endpoint"]

MAX_ANSWER_BYTES = 32 << 20
"""The largest answer read from a server (32 MiB); a longer one is refused before it is read whole."""
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
"""The HTTP statuses that are retried (the server is busy or failed for a moment); no other is."""
BACKOFF_FIRST = 0.25
"""Seconds before the first retry of a draw; each next retry waits twice as long, up to :data:`BACKOFF_MAX`."""
BACKOFF_MAX = 8.0
"""The longest wait before a retry (a ``Retry-After`` above it is cut to it)."""


class EndpointError(ValueError):
    """The endpoint cannot be audited (not loopback, no ids, a timeout, a bad answer): one line."""


class _Transient(EndpointError):
    """A fault worth retrying (:data:`RETRY_STATUS`, a reset): ``kind`` names it for the count,
    ``retry_after`` is the server's ``Retry-After`` in seconds (None: not given)."""

    def __init__(self, message: str, kind: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind, self.retry_after = kind, retry_after


class _Timeout(EndpointError):
    """The request's deadline passed before its answer was whole."""


class _BudgetSpent(Exception):
    """The time budget ran out before or during a request (turned into an :class:`EndpointError`
    that says how many draws were made)."""


@dataclass
class EndpointStats:
    """What a :func:`sample_endpoint` run did besides its draws (pass one in to read it, filled
    in even when the run ends with an error): ``requests`` sent (retries included), ``retries``
    by kind (``"HTTP 503"``, ``"reset"``, ...), ``resumed``: draws read back from ``out``."""

    requests: int = 0
    retries: dict[str, int] = field(default_factory=dict)
    resumed: int = 0

    @property
    def total_retries(self) -> int:
        return sum(self.retries.values())

    def describe(self) -> str:
        """One phrase: ``3 retries (HTTP 503 x2, reset x1)`` or ``no retries``; the resumed draws too."""
        r = "no retries" if not self.retries else (
            f"{self.total_retries} retr{'y' if self.total_retries == 1 else 'ies'} ("
            + ", ".join(f"{k} x{v}" for k, v in sorted(self.retries.items())) + ")")
        return r + (f", {self.resumed} draws resumed from the saved file" if self.resumed else "")


SERVER_KINDS = ("vllm", "llama.cpp", "sglang")
"""The servers whose neutral values :func:`request_settings` knows (``--server-kind``)."""
APIS = ("openai", "llama.cpp")
"""The request shapes :func:`sample_endpoint` speaks: the OpenAI ``/completions`` API under the
``/v1`` base, or llama.cpp's native ``/completion`` at the server's root."""
LLAMA_CPP_SAMPLERS = ("penalties", "top_k", "top_p", "min_p", "temperature")
"""The sampler chain hsd asks llama.cpp's server for (its ``samplers`` key): the stages
:mod:`hsd_core.processing` models, in its ``"llama.cpp"`` order (a logit bias is applied before the
chain, ``dist`` after it)."""

# Each kind's neutral value of every stage it has (the value that switches the stage off), under its names.
_NEUTRAL: dict[str, dict[str, Any]] = {
    "vllm": {"top_k": -1, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
             "frequency_penalty": 0.0},
    "sglang": {"top_k": -1, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
               "frequency_penalty": 0.0},
    # common/common.h, common_params_sampling: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8, a penalty
    # window of 64, DRY, XTC, typical-p, top-n-sigma, mirostat, dynamic temperature, adaptive-p
    "llama.cpp": {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "top_n_sigma": -1.0, "xtc_probability": 0.0,
                  "dry_multiplier": 0.0, "mirostat": 0, "dynatemp_range": 0.0, "adaptive_target": -1.0, "min_keep": 0,
                  "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repeat_last_n": 0,
                  "samplers": list(LLAMA_CPP_SAMPLERS)},
}
# The samples format's name of a stage -> each kind's name (absent: the kind has no such stage).
_NAMES: dict[str, dict[str, str]] = {
    "vllm": {k: k for k in ("top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                            "logit_bias", "allowed_token_ids", "min_tokens", "stop")},
    "sglang": {"top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
               "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
               "logit_bias": "logit_bias", "min_tokens": "min_tokens", "stop": "stop"},
    "llama.cpp": {"top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "repetition_penalty": "repeat_penalty",
                  "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                  "penalty_last_n": "repeat_last_n", "logit_bias": "logit_bias", "stop": "stop"},
}


def request_settings(kind: str, sampling: Sampling, context: int) -> dict[str, Any]:
    """The processing keys of a request to a ``kind`` server (:data:`SERVER_KINDS`): every stage
    ``sampling`` sets, under the server's name, and **every other stage the server has at its
    neutral value**, so that no server default acts unseen (llama.cpp's top-k 40, top-p 0.95, min-p 0.05,
    penalty window 64, DRY, XTC, ...; vLLM's and SGLang's defaults from the model's generation
    config). Greedy: temperature 0 (top-k / top-p / min-p then neutral). ``context``: the longest
    prompt plus ``max_new_tokens``, llama.cpp's penalty window when ``sampling`` penalizes every id
    (``penalty_last_n`` None or -1; the server takes no -1). For llama.cpp the ``samplers`` chain is
    :data:`LLAMA_CPP_SAMPLERS`. A stage ``sampling`` sets that the server does not have (llama.cpp:
    allowed token ids, min_tokens; SGLang: allowed token ids; any: bad words as ids) raises
    ``ValueError`` naming it. ``order`` is not sent (it is the file's word on which order applies)."""
    if kind not in SERVER_KINDS:
        raise ValueError(f"unknown server kind {kind!r}; one of {', '.join(SERVER_KINDS)}")
    names = _NAMES[kind]
    out: dict[str, Any] = dict(_NEUTRAL[kind])
    out["temperature"] = float(sampling.temperature) if sampling.do_sample else 0.0
    named: dict[str, Any] = dict(sampling.processing())
    named.pop("order", None)
    if sampling.do_sample:
        if sampling.top_k is not None:
            named["top_k"] = sampling.top_k
        if sampling.top_p is not None:
            named["top_p"] = sampling.top_p
    else:
        named.pop("min_p", None)
    if "bad_words_ids" in named:
        raise ValueError("bad_words_ids cannot be sent: the servers' APIs take bad words as text")
    penalizes = any(named.get(k, off) != off for k, off in (("repetition_penalty", 1.0), ("presence_penalty", 0.0),
                                                             ("frequency_penalty", 0.0)))
    if kind == "llama.cpp":
        window = named.pop("penalty_last_n", None)
        if penalizes:
            named["penalty_last_n"] = int(context) if window is None or window < 0 else int(window)
    for key, value in named.items():
        if key not in names:
            raise ValueError(f"{key} is not a {kind} sampling parameter: such draws cannot be asked of this server")
        out[names[key]] = value
    return out


def _body(model: str, prompt_ids: list[int], seed: int, sampling: Sampling, kind: str | None = None,
          context: int = 0, api: str = "openai") -> dict[str, Any]:
    """The request of one draw. ``api="openai"``: the completions request, the prompt as ids, the
    seed, the ids asked back (``return_tokens_as_token_ids`` with ``logprobs``, and
    ``return_token_ids``); ``api="llama.cpp"``: llama.cpp's native ``/completion`` request
    (``n_predict``, ``return_tokens``, no prompt cache). Without ``kind``: greedy as temperature 0,
    top-k / top-p only when set, and the other processing keys of the samples format that are set,
    under the same names (vLLM's OpenAI server reads them; ``bad_words_ids``: ``ValueError``); with
    ``kind``: :func:`request_settings` (every stage, the unnamed ones neutral)."""
    if api == "llama.cpp":
        body: dict[str, Any] = {"prompt": prompt_ids, "n_predict": sampling.max_new_tokens, "seed": seed,
                                "return_tokens": True, "cache_prompt": False, "stream": False}
        body.update(request_settings(kind or "llama.cpp", sampling, context))
        return body
    body = {"model": model, "prompt": prompt_ids, "max_tokens": sampling.max_new_tokens, "n": 1,
            "seed": seed, "logprobs": 1, "return_tokens_as_token_ids": True,
            "return_token_ids": True, "stream": False}
    if kind is not None:
        body.update(request_settings(kind, sampling, context))
        return body
    if sampling.do_sample:
        body["temperature"] = sampling.temperature
        if sampling.top_k is not None:
            body["top_k"] = sampling.top_k
        if sampling.top_p is not None:
            body["top_p"] = sampling.top_p
    else:
        body["temperature"] = 0.0
    extra = sampling.processing()
    extra.pop("order", None)  # which engine's order applies: the file's word, not a request setting
    if "bad_words_ids" in extra:
        raise ValueError("bad_words_ids cannot be sent: the OpenAI-compatible API takes bad words as text")
    if "min_p" in extra and not sampling.do_sample:
        extra.pop("min_p")
    body.update(extra)  # min_p, the penalties, logit_bias, allowed_token_ids, min_tokens, stop: vLLM's names
    return body


def check_endpoint(url: str, allow_remote: bool = False) -> str:
    """``url`` without a trailing slash, checked: http or https, a host, and a loopback host unless
    ``allow_remote``; :class:`EndpointError` otherwise."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise EndpointError(f"endpoint {url!r} is not an http(s) URL such as http://127.0.0.1:8000/v1")
    host = u.hostname
    loop = host == "localhost"
    if not loop:
        try:
            loop = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loop = False
    if not loop and not allow_remote:
        raise EndpointError(f"endpoint host {host!r} is not loopback (localhost, 127.0.0.1, ::1): hsd samples only local "
                            "servers unless told otherwise (allow_remote=True, --allow-remote)")
    return url.rstrip("/")


class _Connections:
    """The sockets in flight, so that a watchdog (a request's deadline) or an abort (Ctrl-C, the
    run's end) can shut them and wake whatever read blocks on them. Sockets, not connections:
    ``http.client`` drops its connection's socket (keeping it open for the response) when the
    answer ends with the connection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.aborted = threading.Event()

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            if self.aborted.is_set():
                self.shut(sock)
            self._open.add(sock)

    def discard(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)

    @staticmethod
    def shut(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def abort(self) -> None:
        with self._lock:
            self.aborted.set()
            for s in self._open:
                self.shut(s)


def _retry_after(value: str | None) -> float | None:
    try:
        return None if value is None else max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: the backoff decides


def _request(url: str, body: dict[str, Any] | None, deadline: float, conns: _Connections) -> Any:
    """One HTTP exchange (POST ``body`` as JSON, or GET when None) that ends by ``deadline``
    (``time.monotonic()``) whatever the server does, and its answer as JSON. Raises
    :class:`_Timeout` past the deadline, :class:`_Transient` for a fault worth retrying,
    :class:`EndpointError` (one line) for everything else: another HTTP error, a redirect (never
    followed), an answer too long, not JSON."""
    u = urllib.parse.urlsplit(url)
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Timeout(url)
    netloc = u.netloc.rpartition("@")[2]
    conn: http.client.HTTPConnection = (http.client.HTTPSConnection if u.scheme == "https" else
                                        http.client.HTTPConnection)(netloc, timeout=left)
    fired = threading.Event()
    sock: list[socket.socket] = []
    resp: http.client.HTTPResponse | None = None

    def watchdog() -> None:
        fired.set()
        for s in sock:
            conns.shut(s)

    timer = threading.Timer(left, watchdog)
    timer.daemon = True
    timer.start()
    try:
        conn.connect()  # bounded by the socket's timeout, the time left
        assert conn.sock is not None
        sock.append(conn.sock)
        conns.add(conn.sock)
        if fired.is_set():
            raise _Timeout(url)
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        if body is None:
            conn.request("GET", path)
        else:
            conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = bytearray()
        while True:
            chunk = resp.read1(1 << 16)
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_ANSWER_BYTES:
                raise EndpointError(f"{url} answered more than {MAX_ANSWER_BYTES:,} bytes (MAX_ANSWER_BYTES): not one "
                                    "completion")
            if fired.is_set():
                raise _Timeout(url)
    except (TimeoutError, OSError, http.client.HTTPException) as e:
        if fired.is_set() or conns.aborted.is_set() or isinstance(e, TimeoutError) or "timed out" in str(e):
            raise _Timeout(url) from None
        if isinstance(e, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, http.client.HTTPException)):
            raise _Transient(f"{url} closed the connection before a whole answer ({type(e).__name__})", "reset") \
                from None
        raise EndpointError(f"{url} cannot be reached: {getattr(e, 'strerror', None) or e}") from None
    finally:
        timer.cancel()
        for sk in sock:
            conns.discard(sk)
        conn.close()
        if resp is not None:
            resp.close()
    if fired.is_set() or conns.aborted.is_set() or resp is None:
        raise _Timeout(url)
    status = resp.status
    if 300 <= status < 400:
        where = resp.getheader("Location")
        raise EndpointError(f"{url} answered HTTP {status}, a redirect to {where!r}: hsd follows no redirect (to "
                            "another host it could leak the prompts; give the final URL yourself)")
    if status >= 400:
        detail = " ".join(bytes(data[:400]).decode("utf-8", "replace").split())[:200]
        message = f"{url} answered HTTP {status}: {detail}"
        if status in RETRY_STATUS:
            raise _Transient(message, f"HTTP {status}", _retry_after(resp.getheader("Retry-After")))
        raise EndpointError(message)
    try:
        return json.loads(bytes(data).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise EndpointError(f"{url} answered something that is not JSON") from None
    except RecursionError:
        raise EndpointError(f"{url} answered JSON nested too deeply: not one completion") from None


def _int_list(x: Any) -> list[int] | None:
    if isinstance(x, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in x):
        return list(x)
    return None


def _finish(x: Any) -> str | None:
    return x if isinstance(x, str) else None


def _ids_of(ans: Any, url: str) -> tuple[list[int], str | None]:
    """The generated ids and the finish reason of one answer, in every shape the common servers use
    (module docstring, "Id shapes"); :class:`EndpointError` when none holds ids."""
    if isinstance(ans, dict) and "choices" not in ans:
        ids = _int_list(ans.get("tokens"))
        if ids is not None and isinstance(ans.get("stop_type"), str):  # llama.cpp's native /completion
            st = ans["stop_type"]
            return ids, "stop" if st in ("eos", "word") else "length" if st == "limit" else st
        ids = _int_list(ans.get("output_ids"))
        if ids is not None:  # SGLang's native /generate
            fr = (ans.get("meta_info") or {}).get("finish_reason") if isinstance(ans.get("meta_info"), dict) else None
            return ids, _finish(fr.get("type") if isinstance(fr, dict) else fr)
        raise EndpointError(f"{url} answered without choices[0] (and without llama.cpp's tokens with stop_type or "
                            "SGLang's output_ids): not a completions answer")
    try:
        choice = ans["choices"][0]
        fr = _finish(choice.get("finish_reason"))
    except (KeyError, IndexError, TypeError, AttributeError):
        raise EndpointError(f"{url} answered without choices[0]: not an OpenAI completions answer") from None
    ids = _int_list(choice.get("token_ids"))  # vLLM's and SGLang's return_token_ids
    if ids is not None:
        return ids, fr
    lp = choice.get("logprobs")
    toks = lp.get("tokens") if isinstance(lp, dict) else None
    if isinstance(toks, list) and all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
        try:  # vLLM's return_tokens_as_token_ids
            return [int(t[len("token_id:"):]) for t in toks], fr
        except ValueError:
            pass
    content = lp.get("content") if isinstance(lp, dict) else None
    if isinstance(content, list) and all(isinstance(c, dict) for c in content):
        ids = _int_list([c.get("id") for c in content])  # llama.cpp's OpenAI answer: logprobs.content[i].id
        if ids is not None:
            return ids, fr
    raise EndpointError(f"{url} returned no token ids (neither choices[0].token_ids, logprobs.tokens as 'token_id:N' "
                        "nor logprobs.content[i].id): a server that cannot return ids cannot be audited")


def _check_ids(ids: list[int], i: int, seed: int, max_tokens: int, vocab_size: int | None, url: str) -> None:
    """Refuse an answer that is not a draw of the target: more ids than asked, or an id that the
    target's vocabulary does not have (an engine error, named; never audited as a draw)."""
    if len(ids) > max_tokens:
        raise EndpointError(f"{url}: draw {i} (seed {seed}) returned {len(ids)} ids, more than max_tokens={max_tokens}: "
                            "an engine error, not a draw")
    for t in ids:
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            size = "" if vocab_size is None else f" of {vocab_size} ids"
            raise EndpointError(f"{url}: draw {i} (seed {seed}) returned id {t}, outside the target's vocabulary{size}: "
                                "an engine error, not a draw")


def _run_all(one: Callable[[int], Draw], todo: Sequence[int], concurrency: int, keep: Callable[[int, Draw], None],
             conns: _Connections) -> None:
    """``keep(i, one(i))`` for each ``i`` of ``todo``, ``keep`` called in this thread as each draw
    arrives, with at most ``concurrency`` calls of ``one`` in flight (so at most that many draws
    wait in memory). The first failure stops new calls; the calls in flight end (each within its
    deadline) and their draws are kept; then that failure is raised. An interrupt (Ctrl-C) shuts
    every connection in flight at once and is raised."""
    pending: dict[Future[Draw], int] = {}
    queue = iter(todo)
    failure: BaseException | None = None
    pool = ThreadPoolExecutor(max_workers=max(1, int(concurrency)))
    try:
        while True:
            while failure is None and len(pending) < concurrency:
                i = next(queue, None)
                if i is None:
                    break
                pending[pool.submit(one, i)] = i
            if not pending:
                break
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=lambda f: pending[f]):
                i = pending.pop(f)
                e = f.exception()
                if e is None:
                    keep(i, f.result())
                elif failure is None or isinstance(failure, _BudgetSpent) and not isinstance(e, _BudgetSpent):
                    failure = e
        if failure is not None:
            raise failure
    except BaseException:
        conns.abort()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _resume(out: str, lines_of: Callable[[Draw], str], seed_index: dict[int, int],
            prompt_of: Callable[[int], tuple[int, ...]]) -> dict[int, Draw]:
    """The draws of the interrupted run saved at ``out``, by index: refused (one line) when the file
    was written with other settings, or holds a seed this run does not draw or a draw with another
    prompt."""
    f = recover_samples(out)
    if f is None:
        return {}
    got: dict[int, Draw] = {}
    for d in f.draws:
        mine = json.loads(lines_of(d))
        theirs = json.loads(format_draw(d, engine=f.engine, sampling=f.sampling, speculative=f.speculative,
                                        target=f.target))
        for k in ("engine", "target", "speculative", "sampling"):
            if mine.get(k) != theirs.get(k):
                raise EndpointError(f"{out}: key {k!r} is {json.dumps(theirs.get(k))}, this run's is "
                                    f"{json.dumps(mine.get(k))}: resume only the run that wrote the file (or write "
                                    "to another file)")
        i = seed_index.get(d.seed) if d.seed is not None else None
        if i is None:
            raise EndpointError(f"{out}:{d.line}: seed {d.seed} is not one of this run's seeds: resume with the seed "
                                "and number of draws of the run that wrote the file")
        if d.prompt_ids != prompt_of(i):
            raise EndpointError(f"{out}:{d.line}: the draw of seed {d.seed} has other prompt ids than this run gives "
                                "it: resume with the prompts of the run that wrote the file")
        got[i] = d
    return got


def sample_endpoint(
    url: str,
    prompts: Sequence[str],
    prompt_ids: Sequence[Sequence[int]],
    seeds: Sequence[int],
    sampling: Sampling,
    *,
    model: str | None = None,
    allow_remote: bool = False,
    max_requests: int = 10_000,
    timeout: float = 60.0,
    time_budget: float = 3600.0,
    speculative: dict[str, Any] | None = None,
    engine: dict[str, str] | None = None,
    target: str | None = None,
    concurrency: int = 1,
    retries: int = 3,
    vocab_size: int | None = None,
    out: str | os.PathLike[str] | None = None,
    resume: bool = False,
    stats: EndpointStats | None = None,
    server_kind: str | None = None,
    api: str = "openai",
    extra_of: Callable[[Any], dict[str, Any]] | None = None,
    on_draw: Callable[[int], None] | None = None,
) -> SamplesFile:
    """Draw one completion per seed from the OpenAI-compatible server at ``url`` (its ``/v1`` base):
    draw ``i`` conditions on ``prompt_ids[i % len(prompt_ids)]`` (recorded with the text
    ``prompts[i % len(prompts)]``) with seed ``seeds[i]`` and ``sampling`` (greedy: temperature 0;
    top-k / top-p sent when set; ``max_tokens`` the budget). ``model``: the served model's name
    (default: the first of ``GET {url}/models``). Returns the draws, in seed order, as a
    :class:`~hsd_core.samples.SamplesFile` whose ``engine`` says the endpoint (and ``speculative``
    is what the caller says the server runs: None for a server without speculation). Raises
    :class:`EndpointError` (one line) for a non-loopback host without ``allow_remote``, more seeds
    than ``max_requests``, a request past ``timeout`` seconds (wall clock), the time budget spent, a
    fault still there after ``retries`` retries, a redirect, or an answer that is not a draw (no
    ids, an id outside ``vocab_size`` or negative, more ids than ``max_tokens``).

    ``concurrency``: how many requests are in flight at once (default 1: one after another). A
    server that batches requests (vLLM) draws much faster with more; each draw keeps its own seed
    and prompt, and the draws come back in seed order whatever order they finish in.
    ``out``: the samples file every draw is appended to as it arrives (module docstring; an
    existing file is refused unless ``resume``); ``resume``: continue the run saved in ``out``.
    ``stats``: an :class:`EndpointStats` to fill in (requests, retries, resumed draws).
    ``server_kind`` (:data:`SERVER_KINDS`): send every stage of that server, the ones ``sampling``
    does not name at their neutral values (:func:`request_settings`), and record what was sent in the
    file's ``engine`` object (``server_kind`` and ``request``: the processing keys of every request);
    None: only the stages ``sampling`` names (the server's defaults act on the others).
    ``api`` (:data:`APIS`): ``"openai"``, or ``"llama.cpp"`` for llama.cpp's native ``/completion``
    at the server's root (``url`` with or without its ``/v1``; ``server_kind`` then ``"llama.cpp"``).
    ``extra_of``: a function of an answer (its JSON) whose keys are kept with its draw (written on the
    draw's line, the draw's ``extra``), e.g. a server's draft counters. ``on_draw(k)``: called with
    the number of draws each time some arrive (the resumed ones first), e.g. a progress bar's
    ``update`` (:mod:`hsd_core.progress`)."""
    base = check_endpoint(url, allow_remote)
    if api not in APIS:
        raise ValueError(f"unknown api {api!r}; one of {', '.join(APIS)}")
    if api == "llama.cpp":
        if server_kind not in (None, "llama.cpp"):
            raise ValueError(f"api 'llama.cpp' is llama.cpp's server, not server_kind {server_kind!r}")
        server_kind = "llama.cpp"
    context = max((len(p) for p in prompt_ids), default=0) + sampling.max_new_tokens
    sent = None if server_kind is None else request_settings(server_kind, sampling, context)
    if len(seeds) > max_requests:
        raise EndpointError(f"{len(seeds)} draws need {len(seeds)} requests, more than max_requests={max_requests}")
    if not prompts or len(prompts) != len(prompt_ids):
        raise ValueError("give one prompt text per prompt_ids entry (at least one)")
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    if resume and out is None:
        raise ValueError("resume needs out (the samples file of the run to continue)")
    if len(set(int(s) for s in seeds)) != len(seeds):
        raise ValueError("the seeds must be distinct (a repeated seed is not an independent draw)")
    st = stats if stats is not None else EndpointStats()
    conns = _Connections()
    count_lock = threading.Lock()
    start = time.monotonic()
    run_deadline = start + time_budget
    out_path = None if out is None else os.fspath(out)
    if out_path is not None and not resume and os.path.exists(out_path) and os.path.getsize(out_path) > 0:
        raise EndpointError(f"{out_path} exists: resume it (resume=True, --resume) or write to another file")

    def call(what: str, body: dict[str, Any] | None) -> Any:
        """``_request`` with the retries; the deadline is the request's or the run's, the earlier."""
        for attempt in range(retries + 1):
            now = time.monotonic()
            left = run_deadline - now
            if left <= 0:
                raise _BudgetSpent
            with count_lock:
                st.requests += 1
            try:
                return _request(base + what, body, now + min(timeout, left), conns)
            except _Timeout:
                if left < timeout or conns.aborted.is_set():
                    raise _BudgetSpent from None
                raise EndpointError(f"{base + what} did not answer within {timeout:g} s (timeout)") from None
            except _Transient as e:
                if attempt == retries:
                    raise EndpointError(f"{e}" + (f" (still, after {retries} retries)" if retries else "")) from None
                pause = min(BACKOFF_MAX, e.retry_after if e.retry_after is not None else BACKOFF_FIRST * 2 ** attempt)
                if time.monotonic() + pause >= run_deadline:
                    raise _BudgetSpent from None
                with count_lock:
                    st.retries[e.kind] = st.retries.get(e.kind, 0) + 1
                if conns.aborted.wait(pause):
                    raise _BudgetSpent from None
        raise AssertionError("unreachable")

    if model is None and api == "llama.cpp":
        model = "llama.cpp server"
    if model is None:
        try:
            model = str(call("/models", None)["data"][0]["id"])
        except _BudgetSpent:
            raise EndpointError(f"the time budget of {time_budget:g} s ran out before {base}/models answered") \
                from None
        except (KeyError, IndexError, TypeError) as e:
            raise EndpointError(f"{base}/models did not name a model ({' '.join(str(e).split())[:120]}): give the "
                                "model's name") from None
    eng: dict[str, Any] = dict(engine or {"name": f"openai-compatible endpoint {base}", "version": f"model {model}"})
    if sent is not None:
        eng.update(server_kind=server_kind, request=sent)
    path = "/completions" if api == "openai" else "/completion"
    if api == "llama.cpp":
        base = base.removesuffix("/v1")

    def pid_of(i: int) -> tuple[int, ...]:
        return tuple(int(t) for t in prompt_ids[i % len(prompt_ids)])

    def line(d: Draw) -> str:
        return format_draw(d, engine=eng, sampling=sampling, speculative=speculative, target=target)

    def one(i: int) -> Draw:
        pid = pid_of(i)
        ans = call(path, _body(str(model), list(pid), int(seeds[i]), sampling, server_kind, context, api))
        ids, fr = _ids_of(ans, base + path)
        _check_ids(ids, i, int(seeds[i]), sampling.max_new_tokens, vocab_size, base + path)
        return Draw(ids=tuple(ids), seed=int(seeds[i]), prompt=prompts[i % len(prompts)], prompt_ids=pid,
                    finish_reason=fr, extra={} if extra_of is None else dict(extra_of(ans)))

    draws: dict[int, Draw] = {}
    if out_path is not None and resume:
        draws = _resume(out_path, line, {int(s): i for i, s in enumerate(seeds)}, pid_of)
        st.resumed = len(draws)
        if on_draw is not None and draws:
            on_draw(len(draws))
    appender = None if out_path is None else SamplesAppender(out_path, engine=eng, sampling=sampling,
                                                             speculative=speculative, target=target)

    def keep(i: int, d: Draw) -> None:
        if appender is not None:
            appender.append(d)
        draws[i] = d
        if on_draw is not None:
            on_draw(1)

    saved = "" if out_path is None else f"; they are saved in {out_path} (resume: resume=True, --resume)"
    try:
        _run_all(one, [i for i in range(len(seeds)) if i not in draws], concurrency, keep, conns)
    except _BudgetSpent:
        raise EndpointError(f"the time budget of {time_budget:g} s ran out after {len(draws)} of {len(seeds)} draws"
                            + (saved if draws else "")) from None
    except EndpointError as e:
        raise EndpointError(f"{e}" + (f" ({len(draws)} of {len(seeds)} draws made{saved})" if draws and out_path
                                      else "")) from None
    finally:
        if appender is not None:
            appender.close()
    ordered = [draws[i] for i in range(len(seeds))]
    if out_path is not None:
        return write_samples(out_path, ordered, engine=eng, sampling=sampling, speculative=speculative, target=target)
    host = urllib.parse.urlsplit(base).netloc
    return parse_samples([line(d) for d in ordered], f"endpoint {host}")
