"""The HTTP side of :mod:`hsd_core.endpoint`: one bounded exchange, its retries, many in flight.

* :func:`request`: one HTTP exchange (a JSON POST, or a GET) that ends by a wall-clock deadline
  whatever the server does (a watchdog shuts the socket), answers of at most
  :data:`MAX_ANSWER_BYTES`, no redirect followed; its faults sorted into the ones worth retrying
  (:class:`Transient`), the deadline (:class:`RequestTimeout`) and the rest (:class:`EndpointError`).
* :class:`Caller`: :func:`request` with bounded exponential backoff on :class:`Transient` faults,
  within the run's deadline, counted in an :class:`EndpointStats`.
* :func:`run_all`: many calls with at most ``concurrency`` in flight, each result handed back in the
  caller's thread as it arrives; the first failure stops new calls and is raised once the calls in
  flight have ended (their results kept).

Standard library only (``http.client``, threads); no torch.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["BACKOFF_FIRST", "BACKOFF_MAX", "BudgetSpent", "Caller", "Connections", "EndpointError", "EndpointStats",
           "MAX_ANSWER_BYTES", "RETRY_STATUS", "RequestTimeout", "Transient", "check_endpoint", "request", "run_all"]

T = TypeVar("T")

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


class Transient(EndpointError):
    """A fault worth retrying (:data:`RETRY_STATUS`, a reset): ``kind`` names it for the count,
    ``retry_after`` is the server's ``Retry-After`` in seconds (None: not given)."""

    def __init__(self, message: str, kind: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind, self.retry_after = kind, retry_after


class RequestTimeout(EndpointError):
    """The request's deadline passed before its answer was whole."""


class BudgetSpent(Exception):
    """The time budget ran out before or during a request (turned into an :class:`EndpointError`
    that says how many draws were made)."""


@dataclass
class EndpointStats:
    """What a :func:`~hsd_core.endpoint.sample_endpoint` run did besides its draws (pass one in to read it, filled
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


class Connections:
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


def retry_after(value: str | None) -> float | None:
    try:
        return None if value is None else max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: the backoff decides


def _read(conn: http.client.HTTPConnection, url: str, body: dict[str, Any] | None, fired: threading.Event,
          sock: list[socket.socket], conns: Connections) -> tuple[http.client.HTTPResponse, bytearray]:
    """Send the request on ``conn`` and read its whole answer (at most :data:`MAX_ANSWER_BYTES`);
    :class:`RequestTimeout` as soon as the watchdog (``fired``) has shut the socket."""
    conn.connect()  # bounded by the socket's timeout, the time left
    assert conn.sock is not None
    sock.append(conn.sock)
    conns.add(conn.sock)
    if fired.is_set():
        raise RequestTimeout(url)
    u = urllib.parse.urlsplit(url)
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    if body is None:
        conn.request("GET", path)
    else:
        conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = bytearray()
    try:
        while True:
            chunk = resp.read1(1 << 16)
            if not chunk:
                return resp, data
            data += chunk
            if len(data) > MAX_ANSWER_BYTES:
                raise EndpointError(f"{url} answered more than {MAX_ANSWER_BYTES:,} bytes (MAX_ANSWER_BYTES): not one "
                                    "completion")
            if fired.is_set():
                raise RequestTimeout(url)
    except BaseException:
        resp.close()
        raise


def _decode(url: str, resp: http.client.HTTPResponse, data: bytearray) -> Any:
    """A whole answer as JSON, or the one-line error its status or body calls for."""
    status = resp.status
    if 300 <= status < 400:
        where = resp.getheader("Location")
        raise EndpointError(f"{url} answered HTTP {status}, a redirect to {where!r}: hsd follows no redirect (to "
                            "another host it could leak the prompts; give the final URL yourself)")
    if status >= 400:
        detail = " ".join(bytes(data[:400]).decode("utf-8", "replace").split())[:200]
        message = f"{url} answered HTTP {status}: {detail}"
        if status in RETRY_STATUS:
            raise Transient(message, f"HTTP {status}", retry_after(resp.getheader("Retry-After")))
        raise EndpointError(message)
    try:
        return json.loads(bytes(data).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise EndpointError(f"{url} answered something that is not JSON") from None
    except RecursionError:
        raise EndpointError(f"{url} answered JSON nested too deeply: not one completion") from None


def request(url: str, body: dict[str, Any] | None, deadline: float, conns: Connections) -> Any:
    """One HTTP exchange (POST ``body`` as JSON, or GET when None) that ends by ``deadline``
    (``time.monotonic()``) whatever the server does, and its answer as JSON. Raises
    :class:`RequestTimeout` past the deadline, :class:`Transient` for a fault worth retrying,
    :class:`EndpointError` (one line) for everything else: another HTTP error, a redirect (never
    followed), an answer too long, not JSON."""
    u = urllib.parse.urlsplit(url)
    left = deadline - time.monotonic()
    if left <= 0:
        raise RequestTimeout(url)
    netloc = u.netloc.rpartition("@")[2]
    conn: http.client.HTTPConnection = (http.client.HTTPSConnection if u.scheme == "https" else
                                        http.client.HTTPConnection)(netloc, timeout=left)
    fired = threading.Event()
    sock: list[socket.socket] = []

    def watchdog() -> None:
        fired.set()
        for s in sock:
            conns.shut(s)

    timer = threading.Timer(left, watchdog)
    timer.daemon = True
    timer.start()
    try:
        resp, data = _read(conn, url, body, fired, sock, conns)
    except (TimeoutError, OSError, http.client.HTTPException) as e:
        if fired.is_set() or conns.aborted.is_set() or isinstance(e, TimeoutError) or "timed out" in str(e):
            raise RequestTimeout(url) from None
        if isinstance(e, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError, http.client.HTTPException)):
            raise Transient(f"{url} closed the connection before a whole answer ({type(e).__name__})", "reset") \
                from None
        raise EndpointError(f"{url} cannot be reached: {getattr(e, 'strerror', None) or e}") from None
    finally:
        timer.cancel()
        for sk in sock:
            conns.discard(sk)
        conn.close()
    resp.close()
    if fired.is_set() or conns.aborted.is_set():
        raise RequestTimeout(url)
    return _decode(url, resp, data)


class Caller:
    """:func:`request` with the retries: ``caller(url, body)`` ends by the earlier of the request's
    ``timeout`` and the run's ``deadline`` (``time.monotonic()``); a :class:`Transient` fault is
    retried up to ``retries`` times after a backoff (:data:`BACKOFF_FIRST` doubling, or the server's
    ``Retry-After``, at most :data:`BACKOFF_MAX`), each retry counted in ``stats``. Raises
    :class:`BudgetSpent` when the run's deadline comes first (or the run is aborted),
    :class:`EndpointError` (one line) otherwise. Thread-safe."""

    def __init__(self, timeout: float, deadline: float, retries: int, stats: EndpointStats, conns: Connections) -> None:
        self.timeout, self.deadline, self.retries, self.stats, self.conns = timeout, deadline, retries, stats, conns
        self._lock = threading.Lock()

    def __call__(self, url: str, body: dict[str, Any] | None) -> Any:
        for attempt in range(self.retries + 1):
            now = time.monotonic()
            left = self.deadline - now
            if left <= 0:
                raise BudgetSpent
            with self._lock:
                self.stats.requests += 1
            try:
                return request(url, body, now + min(self.timeout, left), self.conns)
            except RequestTimeout:
                if left < self.timeout or self.conns.aborted.is_set():
                    raise BudgetSpent from None
                raise EndpointError(f"{url} did not answer within {self.timeout:g} s (timeout)") from None
            except Transient as e:
                self._pause(e, attempt)
        raise AssertionError("unreachable")

    def _pause(self, e: Transient, attempt: int) -> None:
        """Wait before retry ``attempt + 1`` of ``e``'s request, or raise: no retry left, or the wait
        would pass the run's deadline (:class:`BudgetSpent`)."""
        if attempt == self.retries:
            raise EndpointError(f"{e}" + (f" (still, after {self.retries} retries)" if self.retries else "")) from None
        pause = min(BACKOFF_MAX, e.retry_after if e.retry_after is not None else BACKOFF_FIRST * 2 ** attempt)
        if time.monotonic() + pause >= self.deadline:
            raise BudgetSpent from None
        with self._lock:
            self.stats.retries[e.kind] = self.stats.retries.get(e.kind, 0) + 1
        if self.conns.aborted.wait(pause):
            raise BudgetSpent from None


def run_all(one: Callable[[int], T], todo: Sequence[int], concurrency: int, keep: Callable[[int, T], None],
            conns: Connections) -> None:
    """``keep(i, one(i))`` for each ``i`` of ``todo``, ``keep`` called in this thread as each result
    arrives, with at most ``concurrency`` calls of ``one`` in flight (so at most that many results
    wait in memory). The first failure stops new calls; the calls in flight end (each within its
    deadline) and their draws are kept; then that failure is raised. An interrupt (Ctrl-C) shuts
    every connection in flight at once and is raised."""
    pending: dict[Future[T], int] = {}
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
                elif failure is None or isinstance(failure, BudgetSpent) and not isinstance(e, BudgetSpent):
                    failure = e
        if failure is not None:
            raise failure
    except BaseException:
        conns.abort()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)

