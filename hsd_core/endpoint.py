"""Draws from an OpenAI-compatible completions endpoint, recorded in the samples format.

:func:`sample_endpoint` posts ``n`` requests to ``{base}/completions`` (vLLM's
``python -m vllm.entrypoints.openai.api_server``, SGLang, llama.cpp's server, ...), one draw per
request, each with its own ``seed``, the prompt as the target's ids (``prompt`` takes a list of ids
in the OpenAI API) and ``return_tokens_as_token_ids`` with ``logprobs`` so that the generated ids
come back as ids: a decoded string cannot be mapped back to ids (several id sequences decode to one
text). The ids are read from ``choices[0].token_ids`` where the server returns them, else from
``choices[0].logprobs.tokens`` written ``"token_id:N"``; a server that returns neither is refused
(:class:`EndpointError`) rather than guessed. The draws come back as a
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

__all__ = ["BACKOFF_FIRST", "BACKOFF_MAX", "EndpointError", "EndpointStats", "MAX_ANSWER_BYTES", "RETRY_STATUS",
           "check_endpoint", "sample_endpoint"]

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


def _body(model: str, prompt_ids: list[int], seed: int, sampling: Sampling) -> dict[str, Any]:
    """The completions request of one draw: the prompt as ids, the seed, the ids asked back
    (``return_tokens_as_token_ids`` with ``logprobs``, and ``return_token_ids``), greedy as
    temperature 0, top-k / top-p only when set, and the other processing keys of the samples format that
    are set, under the same names (vLLM's OpenAI server reads them; ``bad_words_ids``: ``ValueError``)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt_ids, "max_tokens": sampling.max_new_tokens, "n": 1,
                            "seed": seed, "logprobs": 1, "return_tokens_as_token_ids": True,
                            "return_token_ids": True, "stream": False}
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


def _ids_of(ans: Any, url: str) -> tuple[list[int], str | None]:
    try:
        choice = ans["choices"][0]
        fr = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise EndpointError(f"{url} answered without choices[0]: not an OpenAI completions answer") from None
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        return list(ids), fr if isinstance(fr, str) else None
    toks = (choice.get("logprobs") or {}).get("tokens") if isinstance(choice.get("logprobs"), dict) else None
    if isinstance(toks, list) and all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
        try:
            return [int(t[len("token_id:"):]) for t in toks], fr if isinstance(fr, str) else None
        except ValueError:
            pass
    raise EndpointError(f"{url} returned no token ids (neither choices[0].token_ids nor logprobs.tokens as "
                        "'token_id:N'): a server that cannot return ids (return_tokens_as_token_ids) cannot be audited")


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
    ``stats``: an :class:`EndpointStats` to fill in (requests, retries, resumed draws)."""
    base = check_endpoint(url, allow_remote)
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

    if model is None:
        try:
            model = str(call("/models", None)["data"][0]["id"])
        except _BudgetSpent:
            raise EndpointError(f"the time budget of {time_budget:g} s ran out before {base}/models answered") \
                from None
        except (KeyError, IndexError, TypeError) as e:
            raise EndpointError(f"{base}/models did not name a model ({' '.join(str(e).split())[:120]}): give the "
                                "model's name") from None
    eng = engine or {"name": f"openai-compatible endpoint {base}", "version": f"model {model}"}

    def pid_of(i: int) -> tuple[int, ...]:
        return tuple(int(t) for t in prompt_ids[i % len(prompt_ids)])

    def line(d: Draw) -> str:
        return format_draw(d, engine=eng, sampling=sampling, speculative=speculative, target=target)

    def one(i: int) -> Draw:
        pid = pid_of(i)
        ans = call("/completions", _body(str(model), list(pid), int(seeds[i]), sampling))
        ids, fr = _ids_of(ans, base + "/completions")
        _check_ids(ids, i, int(seeds[i]), sampling.max_new_tokens, vocab_size, base + "/completions")
        return Draw(ids=tuple(ids), seed=int(seeds[i]), prompt=prompts[i % len(prompts)], prompt_ids=pid,
                    finish_reason=fr)

    draws: dict[int, Draw] = {}
    if out_path is not None and resume:
        draws = _resume(out_path, line, {int(s): i for i, s in enumerate(seeds)}, pid_of)
        st.resumed = len(draws)
    appender = None if out_path is None else SamplesAppender(out_path, engine=eng, sampling=sampling,
                                                             speculative=speculative, target=target)

    def keep(i: int, d: Draw) -> None:
        if appender is not None:
            appender.append(d)
        draws[i] = d

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
